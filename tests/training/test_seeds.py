"""`--num-seeds N` with one vmapped learner: each seed is the single run of that seed.

Seed k of a vmapped run gets the keys, env seeds and evaluation pools of a single
run with seed k, so its metrics match that run's (losses to float tolerance, the
episodes exactly, over a short horizon where float differences cannot yet flip an
action); a resumed vmapped run logs exactly what the uninterrupted one logs.
"""

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

from offpolicy_ac import presets
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import read_metrics

WALL_CLOCK = ("wall_time_s", "env_steps_per_s")


def _script(name):
  return getattr(presets, name)


def _main(name, run_dir, resume=False, **loop):
  module = _script(name)
  args = module.Args()
  args = dataclasses.replace(
      args, run_dir=str(run_dir), resume=resume, train=args.train.replace(**loop)
  )
  return module.run(args)


def _lines(run_dir):
  return [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in read_metrics(run_dir)]


def _assert_same_run(single, vmapped, loss_keys):
  assert len(single) == len(vmapped) > 0
  for a, b in zip(single, vmapped):
    assert a["env_steps"] == b["env_steps"]
    assert a["episodes"] == b["episodes"]
    if a["episode_return"] is None:
      assert b["episode_return"] is None
    else:
      assert a["episode_return"] == pytest.approx(b["episode_return"], rel=1e-9)
    for key in loss_keys:
      assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    "script,steps,keys",
    [
        ("impala", 5120, ["loss", "grad_norm", "entropy", "value_loss"]),
        ("sql", 3000, ["loss", "grad_norm"]),
        ("acer", 3072, ["loss", "grad_norm"]),
    ],
)
def test_each_vmapped_seed_is_the_single_run_of_that_seed(tmp_path, script, steps, keys):
  common = dict(total_env_steps=steps, checkpoint_every=0)
  module = _script(script)
  common["log_every"] = max(steps // 4, module.Args().train.steps_per_unroll)
  _main(script, tmp_path / "single", seed=4, **common)
  results = _main(script, tmp_path / "vmapped", seed=3, num_seeds=2, **common)
  assert isinstance(results, list) and len(results) == 2
  _assert_same_run(_lines(tmp_path / "single"), _lines(tmp_path / "vmapped" / "seed4"), keys)
  first = [l["episode_return"] for l in _lines(tmp_path / "vmapped" / "seed3")]
  second = [l["episode_return"] for l in _lines(tmp_path / "vmapped" / "seed4")]
  assert first != second  # the seeds really differ


def test_vmapped_seeds_with_the_xla_rollout_are_the_single_host_loop_runs(tmp_path):
  common = dict(total_env_steps=3072, checkpoint_every=1536, log_every=768)
  _main("impala", tmp_path / "single", seed=4, **common)
  _main("impala", tmp_path / "vmapped", seed=3, num_seeds=2, rollout="compiled", **common)
  _assert_same_run(
      _lines(tmp_path / "single"),
      _lines(tmp_path / "vmapped" / "seed4"),
      ["loss", "grad_norm", "entropy", "value_loss"],
  )


def test_vmapped_seeds_resume_exactly(tmp_path):
  flags = dict(num_seeds=2, log_every=1280, checkpoint_every=2560, eval_every=2560, eval_episodes=2)
  _main("impala", tmp_path / "straight", total_env_steps=7680, **flags)
  _main("impala", tmp_path / "resumed", total_env_steps=5120, **flags)
  configs = ("config.json", "seed0/config.json", "seed1/config.json")
  started = [json.loads((tmp_path / "resumed" / c).read_text()) for c in configs]
  _main("impala", tmp_path / "resumed", resume=True, total_env_steps=7680, **flags)
  for before, config in zip(started, configs):  # the root's and each seed's keep their start
    after = json.loads((tmp_path / "resumed" / config).read_text())
    assert after["created"] == before["created"] and "resumed" not in before, config
    assert [sorted(r) for r in after["resumed"]] == [
        ["command", "created", "git_revision", "versions"]
    ]  # fmt: skip
  for seed in (0, 1):
    straight = _lines(tmp_path / "straight" / f"seed{seed}")
    assert straight[-1]["env_steps"] == 7680 and "eval_return" in straight[-1]
    assert _lines(tmp_path / "resumed" / f"seed{seed}") == straight
  summary = json.loads((tmp_path / "resumed" / "seed1" / "summary.json").read_text())
  assert summary["env_steps"] == 7680


def test_vmapped_seeds_resume_from_an_older_checkpoint(tmp_path):
  flags = dict(num_seeds=2, log_every=1280, checkpoint_every=2560)
  _main("impala", tmp_path / "straight", total_env_steps=7680, **flags)
  _main("impala", tmp_path / "run", total_env_steps=7680, **flags)
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "7680")  # back to 5120
  _main("impala", tmp_path / "run", resume=True, total_env_steps=7680, **flags)
  for seed in (0, 1):
    assert _lines(tmp_path / "run" / f"seed{seed}") == _lines(tmp_path / "straight" / f"seed{seed}")


def test_a_resume_missing_a_learners_directory_is_refused_and_changes_nothing(tmp_path):
  """seed1/ deleted: --resume names it before anything is written (it made seed1/ again,
  with a config.json and an empty metrics.jsonl, and only then refused the resume)."""
  flags = dict(num_seeds=2, log_every=512, checkpoint_every=512, eval_every=0)
  _main("impala", tmp_path, total_env_steps=1024, **flags)
  shutil.rmtree(tmp_path / "seed1")
  files = lambda: {
      p: p.read_bytes()
      for p in tmp_path.rglob("*")  # noqa: E731
      if p.is_file() and p.name != ".lock"
  }  # a lock records its holder
  before = files()
  with pytest.raises(FileNotFoundError, match=re.escape(
      f"--resume: {tmp_path / 'seed1'}, a learner of the run in {tmp_path}, is gone")):  # fmt: skip
    _main("impala", tmp_path, resume=True, total_env_steps=2048, **flags)
  assert not (tmp_path / "seed1").exists()
  assert files() == before


def test_vmapped_seeds_refuse_to_overwrite_and_a_changed_config(tmp_path):
  _main(
      "impala",
      tmp_path / "run",
      num_seeds=2,
      total_env_steps=512,
      log_every=256,
      checkpoint_every=512,
  )
  with pytest.raises(FileExistsError):
    _main("impala", tmp_path / "run", num_seeds=2, total_env_steps=512)
  with pytest.raises(ValueError, match="num_envs"):
    _main(
        "impala",
        tmp_path / "run",
        resume=True,
        num_seeds=2,
        total_env_steps=1024,
        log_every=256,
        checkpoint_every=512,
        num_envs=8,
    )
  # Aimed at one seed's directory: refused, and the learners' folders it would have made
  # (seed0/seed0, seed0/seed1) are not left behind, nor a new run directory's.
  held = sorted(p.name for p in (tmp_path / "run" / "seed0").iterdir())
  with pytest.raises(ValueError, match="seed0 is one learner of the run in"):
    _main("impala", tmp_path / "run" / "seed0", resume=True, num_seeds=2, total_env_steps=1024,
          log_every=256, checkpoint_every=512)  # fmt: skip
  assert sorted(p.name for p in (tmp_path / "run" / "seed0").iterdir()) == held
  # A copy names its own root, not the one its learners' config.json files record.
  shutil.copytree(tmp_path / "run", tmp_path / "copy")
  copy = tmp_path / "copy"
  with pytest.raises(
      ValueError,
      match=re.escape(
          f"seed0 is one learner of the run in {copy}: "
          f"resume that run (--run-dir {copy} --resume)"
      ),
  ):
    _main("impala", tmp_path / "copy" / "seed0", resume=True, num_seeds=2, total_env_steps=1024,
          log_every=256, checkpoint_every=512)  # fmt: skip


def test_configs_a_vmapped_learner_cannot_serve_run_seeds_one_after_the_other(tmp_path):
  assert TrainConfig().vmap_unsupported_reason() is None
  config = TrainConfig.of(actors="async", num_actors=2)
  assert "actor threads" in config.vmap_unsupported_reason()
  config = TrainConfig.of(learner_devices=2)
  assert "several devices" in config.vmap_unsupported_reason()
  results = _main(
      "impala",
      tmp_path / "run",
      num_seeds=2,
      vmap_seeds=False,
      total_env_steps=512,
      log_every=256,
      checkpoint_every=0,
  )
  assert len(results) == 2
  config = json.loads((tmp_path / "run" / "seed1" / "config.json").read_text())
  assert "learners_of" not in config
  assert (tmp_path / "run" / "learning_curves.png").exists()
  assert np.isfinite([l["loss"] for l in read_metrics(tmp_path / "run" / "seed0")]).all()


def test_a_compiled_run_honours_no_vmap_seeds_and_each_seed_is_the_vmapped_lane(tmp_path):
  pytest.importorskip("gymnax")
  loop = dict(env_id="gymnax:CartPole-v1", num_seeds=2, total_env_steps=2048, log_every=512,
              checkpoint_every=1024)  # fmt: skip
  one_by_one = _main("impala", tmp_path / "seq", vmap_seeds=False, **loop)
  _main("impala", tmp_path / "vmapped", **loop)
  assert len(one_by_one) == 2 and (tmp_path / "seq" / "seed1" / "checkpoints").is_dir()
  for seed in ("seed0", "seed1"):
    _assert_same_run(_lines(tmp_path / "vmapped" / seed), _lines(tmp_path / "seq" / seed),
                     ["loss", "grad_norm", "entropy"])  # fmt: skip
  # Each resumes only in the shape it was run in: the other is refused by name.
  longer = dict(loop, total_env_steps=4096)
  with pytest.raises(ValueError, match=r"runs one after the other \(run with --no-vmap-seeds\)"):
    _main("impala", tmp_path / "seq", resume=True, **longer)
  with pytest.raises(ValueError, match=r"one learner of 2 seed\(s\), .* \(--no-vmap-seeds\)"):
    _main("impala", tmp_path / "vmapped", resume=True, vmap_seeds=False, **longer)


def test_seeds_one_after_the_other_resume_only_with_their_seeds(tmp_path):
  # Each seed's config.json records its seed alone: a resume with more seeds started a new
  # seed2 from scratch, and one from another --seed went on past the run's seeds.
  loop = dict(num_seeds=2, vmap_seeds=False, total_env_steps=512, log_every=256,
              checkpoint_every=256)  # fmt: skip
  run = tmp_path / "run"
  _main("impala", run, **loop)
  assert json.loads((run / "seeds.json").read_text()) == {"seeds": [0, 1]}
  message = r"holds a run of the seeds \[0, 1\] one after the other, and these settings train "
  for changed, seeds in [(dict(num_seeds=3), "[0, 1, 2]"), (dict(seed=1), "[1, 2]"),
                         (dict(num_seeds=1), "[0]"), (dict(seed=5), "[5, 6]")]:  # fmt: skip
    with pytest.raises(ValueError, match=message + re.escape(seeds)):
      _main("impala", run, resume=True, **{**loop, **changed, "total_env_steps": 768})
  assert sorted(p.name for p in run.glob("seed?")) == ["seed0", "seed1"]
  # One seed's folder: its run is the root's (its own config says --no-vmap-seeds, which
  # the scripts refuse for one seed), so the root is named, not a differing --vmap-seeds;
  # and so it is when the settings are the seed's own.
  held = sorted(p.name for p in (run / "seed1").iterdir())
  for vmap_seeds in (True, False):
    with pytest.raises(ValueError, match=re.escape(
        f"--resume: {run / 'seed1'} is seed1 of the run in {run}, whose seeds run one after "
        f"the other: resume that run (--run-dir {run} --resume")):  # fmt: skip
      _main("impala", run / "seed1", resume=True, seed=1, total_env_steps=768, log_every=256,
            checkpoint_every=256, vmap_seeds=vmap_seeds)  # fmt: skip
  assert sorted(p.name for p in (run / "seed1").iterdir()) == held
  results = _main("impala", run, resume=True, **dict(loop, total_env_steps=768))
  assert [r.env_steps for r in results] == [768, 768]
  # A run without the record (an earlier version's): the seeds it started must be among
  # the resumed run's.
  (run / "seeds.json").unlink()
  with pytest.raises(ValueError, match=message + re.escape("[1, 2]")):
    _main("impala", run, resume=True, **dict(loop, seed=1, total_env_steps=1024))
  _main("impala", run, resume=True, **dict(loop, total_env_steps=1024))
  assert json.loads((run / "seeds.json").read_text()) == {"seeds": [0, 1]}


@pytest.mark.parametrize("shape", [dict(actors="async", num_actors=1), dict(actors="pools")])
def test_seeds_one_after_the_other_for_want_of_a_vmapped_learner_resume(tmp_path, shape):
  """Seeds that run one after the other because one vmapped learner cannot take them
  (actor threads, actor pools) while --vmap-seeds stays on: each seed's folder is
  resumed by the root's run, as with --no-vmap-seeds (it was refused as a seed's folder
  resumed on its own)."""
  loop = dict(num_seeds=2, total_env_steps=512, log_every=256, checkpoint_every=256, **shape)
  run = tmp_path / "run"
  _main("impala", run, **loop)
  assert json.loads((run / "seeds.json").read_text()) == {"seeds": [0, 1]}
  results = _main("impala", run, resume=True, **dict(loop, total_env_steps=768))
  assert [r.env_steps for r in results] == [768, 768]
  for seed in ("seed0", "seed1"):
    assert [l["env_steps"] for l in read_metrics(run / seed)] == [256, 512, 768]
  with pytest.raises(ValueError, match=re.escape(
      f"--resume: {run / 'seed1'} is seed1 of the run in {run}, whose seeds run one after "
      f"the other: resume that run (--run-dir {run} --resume")):  # fmt: skip
    _main("impala", run / "seed1", resume=True, **dict(loop, seed=1, num_seeds=1,
                                                       total_env_steps=1024))  # fmt: skip


def test_a_seeds_record_never_stands_for_a_run_it_does_not_hold(tmp_path):
  loop = dict(num_seeds=2, vmap_seeds=False, total_env_steps=512, log_every=256,
              checkpoint_every=256)  # fmt: skip
  # A record that a refused start left: a later run of other seeds starts and resumes.
  left = tmp_path / "left"
  left.mkdir()
  (left / "seeds.json").write_text('{"seeds": [0, 1]}')
  _main("impala", left, **dict(loop, num_seeds=3, vmap_seeds=True))
  _main("impala", left, resume=True, **dict(loop, num_seeds=3, vmap_seeds=True,
                                             total_env_steps=768))  # fmt: skip
  # A new start in a run of seeds one after the other is refused, whatever its seeds (it
  # replaced the run's record, and the run could not be resumed).
  run = tmp_path / "run"
  _main("impala", run, **loop)
  for other in (dict(seed=2), dict(num_seeds=1), dict(vmap_seeds=True)):
    with pytest.raises(ValueError, match=r"holds a run of the seeds \[0, 1\] one after the other: "
                       r"--resume it"):  # fmt: skip
      _main("impala", run, **{**loop, **other})
  assert json.loads((run / "seeds.json").read_text()) == {"seeds": [0, 1]}
  _main("impala", run, resume=True, **dict(loop, total_env_steps=768))


def test_vmapped_seeds_non_finite_loss_names_the_seed(tmp_path):
  module = _script("impala")
  args = module.Args()
  args = dataclasses.replace(
      args,
      run_dir=str(tmp_path / "run"),
      train=args.train.replace(num_seeds=2, total_env_steps=100_000, checkpoint_every=2560),
      agent=dataclasses.replace(args.agent, learning_rate=1e30, max_grad_norm=1e30),
  )
  from offpolicy_ac.training.driver import NonFiniteError

  with pytest.raises(NonFiniteError, match=r"for seed [01] at env step"):
    module.run(args)
