"""`--sweep` on an envpool task: every (setting, seed) a lane of the vmapped learner.

Lane k trains as the single run with its setting and seed (its own environments, keys and
hyper-parameters, in its updates and in how it acts), writes the directory a compiled
sweep's lane writes, loads back with `load_run`, and a stopped and resumed sweep logs
exactly what the straight one logs.
"""

import dataclasses
import json
import re

import jax
import numpy as np
import pytest

from offpolicy_ac import presets
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import load_run
from offpolicy_ac.training import read_metrics

WALL_CLOCK = ("wall_time_s", "env_steps_per_s")


def _main(script, run_dir, resume=False, agent=None, **fields):
  module = getattr(presets, script)
  args = module.Args()
  args = dataclasses.replace(args, run_dir=str(run_dir), resume=resume,
                             train=args.train.replace(**fields), agent=agent or args.agent)  # fmt: skip
  return module.run(args)


def _lines(run_dir):
  return [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in read_metrics(run_dir)]


def _assert_same_run(single, lane, loss_keys):
  """Episodes exactly, losses to float tolerance (vmapped against unvmapped updates)."""
  assert len(single) == len(lane) > 0
  for a, b in zip(single, lane):
    assert a["env_steps"] == b["env_steps"] and a["episodes"] == b["episodes"]
    assert (a["episode_return"] is None) == (b["episode_return"] is None)
    if a["episode_return"] is not None:
      assert a["episode_return"] == pytest.approx(b["episode_return"], rel=1e-9)
    assert a.get("eval_return") == b.get("eval_return")
    for key in loss_keys:
      assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


IMPALA = dict(seed=3, num_seeds=2, sweep=("learning_rate=0.001,0.01",), total_env_steps=1536,
              log_every=512, checkpoint_every=768, eval_every=768, eval_episodes=2)  # fmt: skip
LANES = [(lr, seed) for lr in ("0.001", "0.01") for seed in (3, 4)]  # settings slowest


@pytest.fixture(scope="module")
def impala_sweep(tmp_path_factory):
  """An IMPALA sweep of 2 learning rates x 2 seeds, 4 lanes of one vmapped learner."""
  root = tmp_path_factory.mktemp("impala") / "sweep"
  results = _main("impala", root, **IMPALA)
  assert len(results) == 4 and all(r.env_steps == 1536 for r in results)
  return root


def test_an_impala_sweep_lane_is_the_single_run_of_its_setting_and_seed(impala_sweep, tmp_path):
  agent = dataclasses.replace(presets.impala.Args().agent, learning_rate=0.01)
  single = dict(IMPALA, seed=4, num_seeds=1, sweep=())
  _main("impala", tmp_path / "single", agent=agent, **single)
  lane = impala_sweep / "learning_rate=0.01" / "seed4"
  _assert_same_run(_lines(tmp_path / "single"), _lines(lane), ["loss", "grad_norm", "entropy"])


def test_a_sweep_writes_a_compiled_sweeps_directories_and_loads_back(impala_sweep):
  root = impala_sweep
  # The root: the whole config, the learners' checkpoints, the comparison.
  whole = json.loads((root / "config.json").read_text())["config"]["train"]["budget"]
  assert whole["sweep"] == ["learning_rate=0.001,0.01"] and whole["num_seeds"] == 2
  assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["1536", "768"]
  assert (root / "CartPole-v1.png").is_file()
  summary = (root / "sweep_summary.txt").read_text()
  assert "learning_rate=0.001" in summary and "learning_rate=0.01" in summary
  finals = set()
  for k, (lr, seed) in enumerate(LANES):
    run_dir = root / f"learning_rate={lr}" / f"seed{seed}"
    record = json.loads((run_dir / "config.json").read_text())
    assert (record["learner"], record["learners"], record["learners_of"]) == (k, 4, str(root))
    config = record["config"]
    assert config["agent"]["learning_rate"] == float(lr)
    budget = config["train"]["budget"]
    assert (budget["seed"], budget["num_seeds"], budget["sweep"]) == (seed, 1, [])
    for name in ("metrics.jsonl", "final_params.msgpack", "summary.json", "learning_curve.png"):
      assert (run_dir / name).is_file(), name
    # load_run: the final parameters, and the lane's own in the shared checkpoints.
    run = load_run(run_dir)
    assert run.agent.config.learning_rate == float(lr) and run.checkpoints == (768, 1536)
    last = load_run(run_dir, checkpoint=1536)
    for a, b in zip(jax.tree.leaves(last.params), jax.tree.leaves(run.params)):
      np.testing.assert_array_equal(a, b)
    finals.add(jax.tree.leaves(run.params)[0].tobytes())
  assert len(finals) == 4
  with pytest.raises(ValueError, match="root of a sweep"):
    load_run(root)


def test_a_stopped_and_resumed_sweep_logs_what_the_straight_one_logs(impala_sweep, tmp_path):
  _main("impala", tmp_path / "resumed", **dict(IMPALA, total_env_steps=768))
  _main("impala", tmp_path / "resumed", resume=True, **IMPALA)
  for lr, seed in LANES:
    lane = f"learning_rate={lr}/seed{seed}"
    straight = _lines(impala_sweep / lane)
    assert [l["env_steps"] for l in straight] == [512, 768, 1024, 1536]
    assert "eval_return" in straight[-1]
    assert _lines(tmp_path / "resumed" / lane) == straight
    summary = json.loads((tmp_path / "resumed" / lane / "summary.json").read_text())
    assert summary["env_steps"] == 1536


def test_a_sweep_is_kept_one_way_so_that_either_spelling_resumes_it(tmp_path):
  steps = dict(total_env_steps=512, log_every=256, checkpoint_every=256, eval_every=0)
  _main("impala", tmp_path, sweep=("lambda=0.9,0.95", "learning-rate=1e-3"), **steps)
  config = json.loads((tmp_path / "config.json").read_text())["config"]
  assert config["train"]["budget"]["sweep"] == ["lambda_=0.9,0.95", "learning_rate=0.001"]
  sweep = ("lambda_=0.90,0.95", "learning_rate=0.001")
  _main("impala", tmp_path, resume=True, sweep=sweep, **dict(steps, total_env_steps=768))
  for lambda_ in ("0.9", "0.95"):
    lines = _lines(tmp_path / f"lambda_={lambda_},learning_rate=0.001" / "seed0")
    assert [l["env_steps"] for l in lines] == [256, 512, 768]


def test_a_sweep_written_as_typed_resumes(tmp_path):
  # Runs written before the sweep was kept one way hold it as typed.
  steps = dict(total_env_steps=512, log_every=256, checkpoint_every=256, eval_every=0)
  _main("impala", tmp_path, sweep=("lambda=0.9,0.95",), **steps)
  path = tmp_path / "config.json"
  written = json.loads(path.read_text())
  written["config"]["train"]["budget"]["sweep"] = ["lambda=0.90,0.95"]
  path.write_text(json.dumps(written))
  _main("impala", tmp_path, resume=True, sweep=("lambda=0.90,0.95",),
        **dict(steps, total_env_steps=768))  # fmt: skip
  with pytest.raises(ValueError, match=re.escape(
      """differs from the run's in sweep (the run's ["lambda_=0.9,0.95"], given """
      """["lambda_=0.9,0.99"]); only the step budget""")):  # fmt: skip
    _main("impala", tmp_path, resume=True, sweep=("lambda=0.9,0.99",),
          **dict(steps, total_env_steps=1024))  # fmt: skip


def test_a_sweep_of_one_setting_and_one_seed_is_laid_out_as_any_sweep(tmp_path):
  """The root keeps the whole config, the learner its own below it: it loads, resumes and
  is refused by name like any other learner (its directory held the whole run's config,
  which `load_run` took for a sweep's root and named no learner of)."""
  steps = dict(total_env_steps=512, log_every=256, checkpoint_every=256, eval_every=0)
  _main("impala", tmp_path, sweep=("learning_rate=0.003",), **steps)
  learner = tmp_path / "learning_rate=0.003" / "seed0"
  record = json.loads((learner / "config.json").read_text())
  assert record["config"]["train"]["budget"]["sweep"] == []
  assert record["learners"] == 1 and record["config"]["agent"]["learning_rate"] == 0.003
  run = load_run(learner)
  assert run.env_steps == 512 and run.agent.config.learning_rate == 0.003
  with pytest.raises(ValueError, match=r"root of a sweep .*learning_rate=0\.003/seed0"):
    load_run(tmp_path)
  # Its one setting labels its row (nothing differs between groups: it read "impala").
  assert "impala learning_rate=0.003 " in (tmp_path / "sweep_summary.txt").read_text()
  # Aimed at the setting's folder, which holds no run of its own: the sweep is named.
  setting = tmp_path / "learning_rate=0.003"
  with pytest.raises(FileNotFoundError, match=re.escape(
      f"{setting} holds no run (no config.json); it lies inside the run in {tmp_path}: "
      f"resume that run (--run-dir {tmp_path} --resume)")):  # fmt: skip
    _main("impala", setting, resume=True, **dict(steps, total_env_steps=768))
  assert sorted(p.name for p in setting.iterdir()) == ["seed0"]
  _main("impala", tmp_path, resume=True, sweep=("learning_rate=0.003",),
        **dict(steps, total_env_steps=768))  # fmt: skip
  assert [l["env_steps"] for l in _lines(learner)] == [256, 512, 768]


def test_a_sweep_too_short_for_an_episode_finishes_without_a_figure(tmp_path, capsys):
  """512 steps of Pendulum (200-step episodes) over 8 environments end no episode: the
  sweep finishes, says why it draws nothing (it ended in NothingLogged's traceback, exit 1,
  after training)."""
  results = _main("impala", tmp_path, env_id="Pendulum-v1", sweep=("learning_rate=1e-3,3e-3",),
                  total_env_steps=512, log_every=256, eval_every=0, checkpoint_every=0)  # fmt: skip
  assert [r.env_steps for r in results] == [512, 512]
  assert "no run logged episode_return" in capsys.readouterr().out
  assert not (tmp_path / "sweep_summary.txt").exists()
  assert (tmp_path / "learning_rate=0.003" / "seed0" / "summary.json").exists()


def test_a_sql_sweep_lane_acts_with_its_own_epsilon(tmp_path):
  """SQL's epsilon changes only how it acts: a lane acting with the default's would not
  repeat the single run's episodes."""
  steps = dict(total_env_steps=768, log_every=256, checkpoint_every=0, eval_every=0)
  _main("sql", tmp_path / "sweep", seed=2, sweep=("epsilon=0.01,0.5",), **steps)
  agent = dataclasses.replace(presets.sql.Args().agent, epsilon=0.5)
  _main("sql", tmp_path / "single", seed=2, agent=agent, **steps)
  lanes = [_lines(tmp_path / "sweep" / f"epsilon={e}" / "seed2") for e in ("0.01", "0.5")]
  _assert_same_run(_lines(tmp_path / "single"), lanes[1], ["loss", "grad_norm"])
  assert [l["episodes"] for l in lanes[0]] != [l["episodes"] for l in lanes[1]]


@pytest.mark.parametrize(
    "sweep, message",
    [
        (("learning_rat=0.1",), "no field 'learning_rat'"),
        (("hidden_sizes=32",), "static field"),
        (("gamma=1.5",), "gamma must lie in"),
    ],
)
def test_a_bad_sweep_fails_before_anything_is_written(tmp_path, sweep, message):
  with pytest.raises(ValueError, match=message):
    _main("impala", tmp_path / "bad", sweep=sweep, total_env_steps=512)
  assert not (tmp_path / "bad").exists()


def test_a_sweep_is_refused_where_seeds_cannot_be_vmapped(tmp_path):
  sweep = ("learning_rate=0.001,0.01",)
  TrainConfig.of(env_id="CartPole-v1", sweep=sweep).validate()  # envpool: allowed
  with pytest.raises(ValueError, match=r"one vmapped learner, which cannot use actor threads"):
    _main("impala", tmp_path / "async", sweep=sweep, actors="async", num_actors=2)
  assert not (tmp_path / "async").exists()
  with pytest.raises(ValueError, match="several devices"):
    TrainConfig.of(sweep=sweep, learner_devices=2, num_envs=16).validate()
  with pytest.raises(ValueError, match="drop --no-vmap-seeds"):
    TrainConfig.of(sweep=sweep, vmap_seeds=False).validate()
