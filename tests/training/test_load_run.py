"""`load_run`: a run directory's agent, parameters, transformer state and task.

Short CartPole runs of each experiment script; `load_run` must give back exactly what
the run saved, and its greedy policy must repeat the run's own evaluations.
"""

import dataclasses
import json
import pathlib
import re
import shutil

import jax
import numpy as np
from old_runs import as_written_by_0_2
import pytest
from scripts import load_script

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.analysis.metrics_file import jsonable
from offpolicy_ac.training import DamagedCheckpointError
from offpolicy_ac.training import EvalConfig
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import evaluate
from offpolicy_ac.training import load_params
from offpolicy_ac.training import load_run
from offpolicy_ac.training import pool_seed
from offpolicy_ac.training import read_metrics
from offpolicy_ac.training import rundir
from offpolicy_ac.training import save_params
from offpolicy_ac.training.driver import WALL_CLOCK_FIELDS

# Env steps of a few unrolls of each script's default CartPole config.
BUDGETS = {"impala": 1024, "acer": 1024, "sql": 256, "sqil": 256}
# Settings of a script's run beyond those (SQL: the policy acts on normalised observations).
EXTRA = {"sql": dict(normalize_observations=True)}


def _equal_trees(a, b):
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


@pytest.fixture(scope="module")
def demos_path(tmp_path_factory):
  env = envs.make("CartPole-v1", 4, 7)
  policy = lambda obs: (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int32)
  demos = demos_lib.record_episodes(env, policy, 4)
  env.close()
  path = tmp_path_factory.mktemp("demos") / "cartpole.npz"
  demos_lib.save_demos(path, demos, env_id="CartPole-v1")
  return str(path)


def _run(script, run_dir, demos=None, resume=False, **train):
  module = getattr(presets, script)
  args = module.Args() if script != "sqil" else module.Args(demos=demos)
  args = dataclasses.replace(args, run_dir=str(run_dir), resume=resume,
                             train=args.train.replace(**train))  # fmt: skip
  module.run(args, progress=False)
  return run_dir


class _Runs:
  """One short run per script, made when first asked for: a checkpoint at every log
  line, evaluation left at its default (a log line each at these budgets)."""

  def __init__(self, root, demos):
    self.root, self.demos, self.dirs = root, demos, {}

  def __getitem__(self, script):
    if script not in self.dirs:
      budget = BUDGETS[script]
      self.dirs[script] = _run(script, self.root / script, demos=self.demos,
                               total_env_steps=budget, log_every=budget // 4,
                               checkpoint_every=budget // 4, keep_checkpoints=4,
                               **EXTRA.get(script, {}))  # fmt: skip
    return self.dirs[script]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demos_path):
  return _Runs(tmp_path_factory.mktemp("runs"), demos_path)


@pytest.mark.parametrize("script", sorted(BUDGETS))
def test_load_run_returns_the_runs_agent_parameters_and_task(runs, script):
  run_dir = runs[script]
  run = load_run(run_dir)
  saved = json.loads((run_dir / "config.json").read_text())
  assert run.algorithm == script and run.source == "final"
  assert run.config == TrainConfig.from_dict(saved["config"]["train"])
  assert json.loads(json.dumps(jsonable(run.agent.config))) == saved["config"]["agent"]
  template = run.agent.init(jax.random.PRNGKey(1)).params
  assert _equal_trees(run.params, load_params(run_dir / "final_params.msgpack", template))
  summary = json.loads((run_dir / "summary.json").read_text())
  assert run.env_steps == summary["env_steps"] == run.checkpoints[-1]
  # The last checkpoint holds the final parameters.
  last = load_run(run_dir, checkpoint=run.checkpoints[-1])
  assert last.source == "checkpoint" and last.env_steps == run.checkpoints[-1]
  assert _equal_trees(last.params, run.params)
  # The environment factory makes the run's task.
  with run.make_env(3, seed=0) as env:
    assert env.spec.task_id == run.config.env.env_id == "CartPole-v1"
    assert env.num_envs == 3
    assert env.spec._replace(num_envs=1, batch_size=1) == run.agent.spec._replace(
        num_envs=1, batch_size=1
    )
    obs = env.reset().observation
  action = run.greedy_policy()(obs)
  assert action.shape == (3,) and action.dtype == np.int32
  assert ((action >= 0) & (action < 2)).all()
  # Observations as lists, and a bad seed named (errors from inside JAX and Flax before).
  np.testing.assert_array_equal(run.greedy_policy()(obs.tolist()), action)
  assert run.behaviour_policy(np.int64(3))(obs.tolist()).shape == (3,)
  for seed in ("x", -1, 2**32, True):
    with pytest.raises(
        ValueError, match=r"behaviour_policy: seed must be an int in \[0, 2\*\*32\)"
    ):
      run.behaviour_policy(seed)


@pytest.mark.parametrize(
    "group, field, value, message",
    [
        ("budget", None, [], "config.train.budget is [], not an object of fields"),
        ("budget", "num_seeds", "2", "num_seeds must be a positive int, got '2'"),
        ("budget", "sweep", 5, "sweep must be a tuple or list of strs, got 5"),
        ("budget", "seed", None, "seed must be an int >= 0, got None"),
        ("transform", "normalize_observations", "no", "normalize_observations must be True or"),
        ("transform", "reward_scale", "1", "reward_scale must be a number, got '1'"),
        ("env", "env_id", 3, "env_id must be a task id (a non-empty str), got 3"),
        ("budget", "total_env_steps", "abc", "total_env_steps must be a positive int"),
    ],
)
def test_a_hand_edited_config_is_refused_naming_the_field(runs, tmp_path, group, field, value,
                                                          message):  # fmt: skip
  """Each of these loaded with a traceback (a TypeError reading the seeds, the sweep) or,
  worse, silently (a seed of None)."""
  edited = shutil.copytree(runs["impala"], tmp_path / "edited")
  config = json.loads((edited / "config.json").read_text())
  train = config["config"]["train"]
  if field is None:
    train[group] = value
  else:
    train[group][field] = value
  (edited / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError) as e:
    load_run(edited)
  assert str(e.value).startswith(f"{edited / 'config.json'}: {message}")
  # --resume too: refused by name before the configs are compared (a TypeError comparing
  # an edited budget), and the run is left as it was.
  args = dataclasses.replace(presets.impala.Args(), run_dir=str(edited), resume=True)
  with pytest.raises(ValueError) as e:
    presets.impala.run(args)
  assert f"{edited / 'config.json'}: {message}" in str(e.value)
  assert json.loads((edited / "config.json").read_text()) == config


@pytest.mark.parametrize(
    "summary, message",
    [
        ([], "summary.json is [], not a run's summary"),
        ({"env_steps": "abc"}, 'summary.json: env_steps is "abc", not a count of env steps'),
        (
            {"env_steps": 10, "best_env_steps": True},
            "summary.json: best_env_steps is true, not a count of env steps",
        ),
    ],
)
def test_a_hand_edited_summary_is_refused_and_without_one_the_newest_checkpoint_loads(
    runs, tmp_path, summary, message):  # fmt: skip
  edited = shutil.copytree(runs["impala"], tmp_path / "edited")
  (edited / "summary.json").write_text(json.dumps(summary))
  fix = r" \(the file was edited or damaged\): restore it, or delete it to load the newest"
  with pytest.raises(ValueError, match=re.escape(message) + fix):
    load_run(edited)
  (edited / "summary.json").unlink()
  run = load_run(edited)
  assert run.source == "checkpoint" and run.env_steps == run.checkpoints[-1]


def test_a_run_with_a_setting_the_task_does_not_use_still_loads(runs, tmp_path):
  """Training refuses such settings (`agents.base.check_settings_used`); a run that holds one
  (an earlier version's) trained as it was, and loads."""
  edited = shutil.copytree(runs["impala"], tmp_path / "edited")
  config = json.loads((edited / "config.json").read_text())
  config["config"]["agent"]["init_log_std"] = 0.5  # continuous actions only; CartPole
  (edited / "config.json").write_text(json.dumps(config))
  assert load_run(edited).agent.config.init_log_std == 0.5


@pytest.mark.parametrize("script", ["impala", "sql"])
def test_evaluation_is_on_by_default(runs, script):
  lines = read_metrics(runs[script])
  assert len(lines) == 4 and all("eval_return" in line for line in lines)


def test_greedy_evaluation_repeats_the_runs_own_evaluations(runs):
  # Each evaluation was the first on its segment's fresh pool (a checkpoint, so a new
  # segment, at every log line), seeded pool_seed(seed, "evaluation", segment=...): the
  # loaded parameters of that step, on a pool with that seed, play the same episodes.
  run_dir = runs["impala"]
  config = load_run(run_dir).config
  lines = [l for l in read_metrics(run_dir) if "eval_return" in l]
  assert len(lines) == 4
  for segment, line in enumerate(lines):
    run = load_run(run_dir, checkpoint=line["env_steps"])
    seed = pool_seed(config.budget.seed, "evaluation", segment=segment)
    with run.make_env(config.eval.eval_episodes, seed) as env:
      returns = evaluate(env, run.greedy, run.acting, config.eval.eval_episodes)
    assert np.mean(returns) == line["eval_return"]
    assert np.min(returns) == line["eval_return_min"]


def test_the_runs_policies_refuse_its_parameters_alone(runs):
  """`run.greedy(run.params, obs)` (the notebook's `agent.greedy_act` takes the parameters)
  was an AttributeError: 'dict' object has no attribute 'hyperparams'."""
  run = load_run(runs["impala"])
  obs = np.zeros((1, 4), np.float32)
  message = r"the run's act and greedy take an Acting \(a LoadedRun's `acting`.*got dict"
  with pytest.raises(TypeError, match=message):
    run.greedy(run.params, obs)
  with pytest.raises(TypeError, match=message):
    run.act(run.params, obs, jax.random.key(0))
  assert run.greedy(run.acting, obs).shape == (1,)


def test_the_transformer_statistics_are_loaded(runs):
  run_dir = runs["sql"]
  run = load_run(run_dir)
  stats = run.acting.transform.obs_stats
  assert stats is not None and float(np.asarray(stats.count)) > 0
  template = run.acting.transform
  saved = load_params(run_dir / "final_transform.msgpack", template)
  assert _equal_trees(run.acting.transform, saved)
  last = load_run(run_dir, checkpoint=run.checkpoints[-1])
  assert _equal_trees(last.acting.transform, saved)
  first = load_run(run_dir, checkpoint=run.checkpoints[0])
  assert not _equal_trees(first.acting.transform, saved)


@pytest.mark.parametrize("which", ["final", "best"])
def test_parameters_without_their_transformer_statistics_are_refused(runs, tmp_path, which):
  """Normalised observations: parameters whose statistics file is gone are refused, not
  given fresh statistics (zero mean, unit variance) that they were never trained on."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["sql"], run_dir)
  (run_dir / f"{which}_transform.msgpack").unlink()
  with pytest.raises(ValueError, match=f"{which}_transform.msgpack is missing"):
    load_run(run_dir, best=which == "best")


def test_best_parameters_beside_another_best_s_statistics_are_refused(runs, tmp_path):
  """A kill between the writes of the best parameters and of their statistics leaves a
  pair best.json does not record: refused, not played."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["sql"], run_dir)
  best = load_run(run_dir, best=True)
  other = jax.tree.map(lambda x: x + 1, best.params)
  save_params(run_dir / "best_params.msgpack", other)  # the kill comes here
  with pytest.raises(ValueError, match="are not the pair best.json records"):
    load_run(run_dir, best=True)


def test_a_seed_of_a_vmapped_run_loads_from_the_shared_checkpoints(tmp_path):
  root = _run("sql", tmp_path / "run", total_env_steps=128, log_every=64,
              checkpoint_every=64, num_seeds=2, seed=3, min_replay_size=16)  # fmt: skip
  with pytest.raises(ValueError, match="holds 2 seeds.*seed3"):
    load_run(root)
  for seed in (3, 4):
    final = load_run(root / f"seed{seed}")
    assert final.config.budget.seed == seed
    last = load_run(root / f"seed{seed}", checkpoint=final.checkpoints[-1])
    assert _equal_trees(last.params, final.params)
  assert not _equal_trees(load_run(root / "seed3").params, load_run(root / "seed4").params)


def test_a_copied_run_of_seeds_loads_its_own_checkpoints(tmp_path, monkeypatch):
  """The copy's seed directories read the copy's checkpoints, not those at the root the
  original recorded (relative to the directory it was started from), which go on."""
  monkeypatch.chdir(tmp_path)
  short = dict(log_every=64, checkpoint_every=64, num_seeds=2, min_replay_size=16)
  _run("sql", "run", total_env_steps=128, **short)
  shutil.copytree(tmp_path / "run", tmp_path / "copy")
  _run("sql", "run", resume=True, total_env_steps=256, **short)
  assert load_run("run/seed0").checkpoints[-1] == 256
  copy = load_run(tmp_path / "copy" / "seed0")
  assert copy.checkpoints[-1] == 128 and copy.env_steps == 128


def test_without_final_parameters_the_newest_checkpoint_is_loaded(runs, tmp_path):
  run_dir = tmp_path / "run"
  shutil.copytree(runs["sql"], run_dir)
  final = load_run(run_dir)
  (run_dir / "final_params.msgpack").unlink()
  newest = load_run(run_dir)
  assert newest.source == "checkpoint" and newest.env_steps == final.checkpoints[-1]
  assert _equal_trees(newest.params, final.params)
  # The newest checkpoint incomplete (no checksums: being written, or damaged): the one
  # before is loaded, and said to be (it was passed over silently).
  last, before = final.checkpoints[-1], final.checkpoints[-2]
  (run_dir / "checkpoints" / str(last) / "checksums.json").unlink()
  with pytest.warns(RuntimeWarning, match=rf"checkpoint at env step {last:,} is incomplete .*"
                                          rf"at {before:,}, is loaded"):  # fmt: skip
    assert load_run(run_dir).env_steps == before
  # The newest complete checkpoint damaged: passed over with a warning, as --resume does;
  # asked for by its step, refused.
  (run_dir / "checkpoints" / str(last)).rename(run_dir / "aside")
  arrays = run_dir / "checkpoints" / str(before) / "arrays"
  for data in arrays.glob("ocdbt.process_0/d/*"):
    data.write_bytes(data.read_bytes()[:8])
  first = final.checkpoints[-3]
  with pytest.warns(RuntimeWarning, match=rf"checkpoint {before} in .* could not be read: .*: "
                                          rf"loaded the newest intact checkpoint, at env step "
                                          rf"{first:,}"):  # fmt: skip
    loaded = load_run(run_dir)
  assert loaded.env_steps == first
  assert _equal_trees(loaded.params, load_run(run_dir, checkpoint=first).params)
  with pytest.raises(DamagedCheckpointError, match=rf"checkpoint {before} .* could not be read"):
    load_run(run_dir, checkpoint=before)
  for step in final.checkpoints[:-2]:  # all damaged: the newest one's error
    shutil.rmtree(run_dir / "checkpoints" / str(step))
  with pytest.raises(DamagedCheckpointError, match=rf"checkpoint {before} .* could not be read"):
    load_run(run_dir)
  shutil.rmtree(run_dir / "checkpoints")
  with pytest.raises(ValueError, match="holds no parameters"):
    load_run(run_dir)


def test_a_resumed_run_killed_before_its_end_loads_its_newest_checkpoint(runs, tmp_path):
  """Its final parameters and summary are the first run's; the resumed run's checkpoints
  and best parameters are newer."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["impala"], run_dir)
  before = {name: (run_dir / name).read_bytes() for name in ("final_params.msgpack",
            "final_params.msgpack.crc32", "summary.json")}  # fmt: skip
  _run("impala", run_dir, total_env_steps=2048, log_every=256, checkpoint_every=256,
       keep_checkpoints=4, resume=True)  # fmt: skip
  best_steps = json.loads((run_dir / "summary.json").read_text())["best_env_steps"]
  for name, data in before.items():  # as if killed before its end
    (run_dir / name).write_bytes(data)
  loaded = load_run(run_dir)
  assert loaded.source == "checkpoint" and loaded.env_steps == loaded.checkpoints[-1] == 2048
  assert load_run(run_dir, best=True).env_steps == best_steps  # best.json's, not the summary's
  (run_dir / "best_params.msgpack").write_bytes(before["final_params.msgpack"])
  (run_dir / "best_params.msgpack.crc32").write_bytes(before["final_params.msgpack.crc32"])
  assert load_run(run_dir, best=True).env_steps is None  # best.json is of other parameters


def test_parameters_a_kill_left_unpaired_are_not_given_anothers_steps(runs, tmp_path):
  """Killed between the final parameters and summary.json (a resumed segment stopped by a
  signal), or between best_params.msgpack and best.json: the parameters written are not
  reported with the steps of those before them."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["impala"], run_dir)
  final, best = load_run(run_dir), load_run(run_dir, best=True)
  assert (final.source, final.env_steps) == ("final", final.checkpoints[-1])
  assert best.env_steps is not None
  files = {name: (run_dir / name).read_bytes() for name in ("final_params.msgpack",
           "final_params.msgpack.crc32", "best_params.msgpack", "best_params.msgpack.crc32")}  # fmt: skip
  newer = jax.tree.map(lambda x: x + 1, final.params)
  save_params(run_dir / "final_params.msgpack", newer)  # and killed before the summary
  with pytest.warns(RuntimeWarning, match="final_params.msgpack is not of the run summary.json "
                                          r"describes .*; loading the newest checkpoint"):  # fmt: skip
    loaded = load_run(run_dir)
  assert (loaded.source, loaded.env_steps) == ("checkpoint", final.checkpoints[-1])
  assert _equal_trees(loaded.params, final.params)
  save_params(run_dir / "best_params.msgpack", newer)  # and killed before best.json
  assert load_run(run_dir, best=True).env_steps is None
  for name, data in files.items():
    (run_dir / name).write_bytes(data)
  assert load_run(run_dir).source == "final"
  # A resumed segment killed before its results: its summary is the one before.
  before = rundir.mark_summary_resumed(run_dir)
  assert load_run(run_dir).source == "checkpoint"
  rundir.unmark_summary_resumed(run_dir, before)
  (run_dir / "best_params.msgpack").unlink()
  with pytest.raises(ValueError, match=rf"evaluated a best at {best.env_steps} env steps, and "
                                       r"the file is gone\): no best_params.msgpack"):  # fmt: skip
    load_run(run_dir, best=True)
  step = final.checkpoints[-2]
  (run_dir / "checkpoints" / str(step) / "checksums.json").unlink()
  with pytest.raises(DamagedCheckpointError, match=rf"checkpoint at env step {step} is "
                                                   r"incomplete"):  # fmt: skip
    load_run(run_dir, checkpoint=step)


def test_bad_run_directories_are_refused_clearly(runs, tmp_path):
  with pytest.raises(FileNotFoundError, match="not a directory"):
    load_run(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="no config.json"):
    load_run(tmp_path)
  with pytest.raises(ValueError, match="no checkpoint at env step 7"):
    load_run(runs["sql"], checkpoint=7)
  newest = load_run(runs["sql"]).checkpoints[-1]
  for not_an_int in (float(newest), str(newest), True):
    with pytest.raises(TypeError, match="checkpoint must be an int .*, got"):
      load_run(runs["sql"], checkpoint=not_an_int)
  assert load_run(runs["sql"], checkpoint=np.int64(newest)).env_steps == newest
  old = tmp_path / "old"
  old.mkdir()
  (old / "config.json").write_text(json.dumps({"algorithm": "sql", "config": {"loop": {}}}))
  with pytest.raises(ValueError, match="offpolicy_ac 0.1"):
    load_run(old)
  other = tmp_path / "other"
  other.mkdir()
  (other / "config.json").write_text(json.dumps({"algorithm": "sql", "config": {"train": {}}}))
  with pytest.raises(ValueError, match="no `train` and `agent` configs"):
    load_run(other)
  (other / "config.json").write_text(
      json.dumps({"algorithm": "ppo", "config": {"train": {}, "agent": {}}})
  )
  with pytest.raises(ValueError, match="'ppo'"):
    load_run(other)
  (other / "config.json").write_text(json.dumps({"lr": 1}))
  with pytest.raises(ValueError, match="not written by an experiment script"):
    load_run(other)
  edited = shutil.copytree(runs["sql"], tmp_path / "edited")  # other network sizes
  config = json.loads((edited / "config.json").read_text())
  config["config"]["agent"]["hidden_sizes"] = [7]
  (edited / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=r"final_params.msgpack holds parameters of other shapes"):
    load_run(edited)
  with pytest.raises(ValueError, match=r"checkpoint \d+ in .* holds arrays of other shapes .*"
                                       r"config.json no longer describes"):  # fmt: skip
    load_run(edited, checkpoint=load_run(runs["sql"]).checkpoints[-1])
  (edited / "final_params.msgpack").write_bytes(b"\x85")  # cut short, its checksum gone
  (edited / "final_params.msgpack.crc32").unlink()
  with pytest.warns(RuntimeWarning, match=r"final_params.msgpack is not of the run summary"):
    with pytest.raises(ValueError, match=r"checkpoint \d+ in .* holds arrays of other shapes"):
      load_run(edited)  # summary.json's CRC-32 catches it
  summary = json.loads((edited / "summary.json").read_text())
  del summary["final_params_crc32"]  # as earlier versions wrote it
  (edited / "summary.json").write_text(json.dumps(summary))
  with pytest.warns(RuntimeWarning, match=r"final_params.msgpack has no checksum beside it"):
    with pytest.raises(ValueError, match="final_params.msgpack could not be read as the run's"):
      load_run(edited)
  (edited / "final_params.msgpack.crc32").write_bytes(b"\x92\xff\x00")  # not text: damaged
  shutil.rmtree(edited / "checkpoints")  # none to fall back to
  with pytest.raises(DamagedCheckpointError, match="does not match its checksum"):
    load_run(edited)


def test_damaged_final_parameters_give_way_to_the_newest_intact_checkpoint(runs, tmp_path):
  """As --resume would go on from it; with no checkpoint, the damage is the error."""
  run_dir = shutil.copytree(runs["impala"], tmp_path / "run")
  intact = load_run(run_dir)
  final = run_dir / "final_params.msgpack"
  final.write_bytes(final.read_bytes()[:100])
  with pytest.warns(
      RuntimeWarning, match=r"does not match its checksum .*: loading the newest intact checkpoint"
  ):
    run = load_run(run_dir)
  assert (run.source, run.env_steps) == ("checkpoint", intact.checkpoints[-1])
  assert intact.env_steps == intact.checkpoints[-1] and _equal_trees(run.params, intact.params)


def test_record_demos_records_the_runs_greedy_policy(runs, tmp_path):
  module = load_script("record_demos")
  out = tmp_path / "demos.npz"
  demos = module.main(module.Args(run_dir=str(runs["sql"]), out=str(out), episodes=3, seed=5))
  assert demos_lib.load_demos(out)["env_id"] == "CartPole-v1"
  run = load_run(runs["sql"])
  first = demos["observation"][: demos["episode_lengths"][0]]
  np.testing.assert_array_equal(
      demos["action"][: demos["episode_lengths"][0]], run.greedy_policy()(first)
  )


def test_record_demos_refuses_an_out_folder_before_recording(runs, tmp_path, capsys):
  """--out demos/ wrote a file named `demos`; a folder, spelt so or existing, is refused
  before the run is loaded, and one episode is reported as one."""
  module = load_script("record_demos")
  run_dir = runs["sql"]
  capsys.readouterr()  # the run's
  record = lambda out: module.main(module.Args(run_dir=str(run_dir), out=out, episodes=1))
  for out, message in ((f"{tmp_path}/demos/", "names a folder: give a file's path, e.g. "
                        f"{tmp_path}/demos/demos.npz"),
                       (f"{tmp_path}/demos/.", "names a folder"),
                       (str(tmp_path), "is a directory: give a file path")):  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(message)):
      record(out)
  assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""
  record(f"{tmp_path}/one.npz")
  assert capsys.readouterr().out.startswith("recorded 1 episode of CartPole-v1 (greedy")


def test_record_demos_behaviour_policy_samples_as_the_run_trained(runs, tmp_path):
  module = load_script("record_demos")

  def record(name):
    args = module.Args(run_dir=str(runs["impala"]), out=str(tmp_path / name), episodes=3,
                       seed=5, policy="behaviour")  # fmt: skip
    return module.main(args)

  demos, again = record("a.npz"), record("b.npz")
  assert all(np.array_equal(demos[k], again[k]) for k in demos)  # same seed, same demos
  run = load_run(runs["impala"])
  starts = np.cumsum(demos["episode_lengths"]) - demos["episode_lengths"]
  # The first actions: the run's `act` on the reset observations, with the policy's first key.
  first_key = jax.random.split(jax.random.PRNGKey(5))[1]
  expected, _ = run.act(run.acting, demos["observation"][starts], first_key)
  np.testing.assert_array_equal(demos["action"][starts], expected)
  # A policy barely trained (a few unrolls) is far from deterministic: sampled actions
  # differ from the greedy ones.
  assert (demos["action"] != run.greedy_policy()(demos["observation"])).any()


@pytest.mark.parametrize(
    "fields, interval",
    [
        (dict(total_env_steps=500_000, log_every=5_000), 25_000),
        (dict(total_env_steps=3_000, log_every=1_000), 1_000),
        (dict(total_env_steps=100_000, log_every=20_000), 20_000),
        (dict(total_env_steps=100_000, log_every=1_000, eval_every=1_500), 1_500),
        (dict(total_env_steps=100_000, eval_every=0), 0),
    ],
)
def test_the_evaluation_interval_scales_with_the_budget(fields, interval):
  config = TrainConfig.of(**fields)
  config.validate()
  assert config.eval_interval == interval
  assert config.eval_interval % config.budget.log_every == 0 or "eval_every" in fields


def test_a_negative_eval_every_is_refused():
  with pytest.raises(ValueError, match="eval_every"):
    TrainConfig(eval=EvalConfig(eval_every=-1)).validate()


@pytest.mark.parametrize("num_episodes", [0, -4, 4.0, True])
def test_evaluate_refuses_a_number_of_episodes_that_is_not_a_positive_int(num_episodes):
  pool = type("Pool", (), {"num_envs": 4})()
  with pytest.raises(ValueError, match=f"num_episodes must be a positive int, got {num_episodes}"):
    evaluate(pool, None, None, num_episodes)


def test_evaluating_changes_nothing_of_the_training(runs, tmp_path):
  # The fixture's SQL run evaluates at every log line; the same run without evaluations
  # logs the same training numbers and ends with the same parameters.
  budget = BUDGETS["sql"]
  quiet = _run("sql", tmp_path / "quiet", total_env_steps=budget, log_every=budget // 4,
               checkpoint_every=budget // 4, keep_checkpoints=4, eval_every=0,
               **EXTRA["sql"])  # fmt: skip
  drop = {"eval_return", "eval_return_min", *WALL_CLOCK_FIELDS}
  strip = lambda lines: [{k: v for k, v in l.items() if k not in drop} for l in lines]
  quiet_lines = read_metrics(quiet)
  assert not any("eval_return" in l for l in quiet_lines)
  assert strip(quiet_lines) == strip(read_metrics(runs["sql"]))
  assert _equal_trees(load_run(quiet).params, load_run(runs["sql"]).params)


def test_a_run_keeps_its_best_evaluated_parameters_beside_its_final_ones(tmp_path):
  """best_params.msgpack holds the parameters of the evaluation with the highest mean
  return (those of the checkpoint taken there); load_run(best=True) gives them back;
  summary.json says which scored what."""
  run_dir = _run("impala", tmp_path / "run", total_env_steps=6144, log_every=1024,
                 eval_every=1024, checkpoint_every=1024, keep_checkpoints=6)  # fmt: skip
  summary = json.loads((run_dir / "summary.json").read_text())
  evals = [(l["env_steps"], l["eval_return"]) for l in read_metrics(run_dir) if "eval_return" in l]
  # Of equal scores, the latest.
  best_steps, best_return = max(evals, key=lambda e: (e[1], e[0]))
  assert (summary["best_env_steps"], summary["best_eval_return"]) == (best_steps, best_return)
  assert summary["last_eval_return"] == evals[-1][1] and summary["target_reached_at"] is None
  best = load_run(run_dir, best=True)
  assert best.source == "best" and best.env_steps == best_steps
  assert best.checkpoints == load_run(run_dir).checkpoints and len(best.checkpoints) > 1
  assert _equal_trees(best.params, load_run(run_dir, checkpoint=best_steps).params)
  with pytest.raises(ValueError, match="not both"):
    load_run(run_dir, best=True, checkpoint=1024)


def test_the_final_policys_score_counts_as_an_evaluation(tmp_path):
  """A budget that ends between evaluation points: the final policy is scored (no metrics
  line), and when that score is the best, the final parameters are the best ones; a run
  too short for any evaluation still has best parameters, its final ones."""
  run_dir = _run("impala", tmp_path / "run", total_env_steps=2560, log_every=512,
                 eval_every=2048, checkpoint_every=512)  # fmt: skip
  summary = json.loads((run_dir / "summary.json").read_text())
  logged = [(l["env_steps"], l["eval_return"]) for l in read_metrics(run_dir) if "eval_return" in l]
  assert [steps for steps, _ in logged] == [2048]
  final, best = load_run(run_dir), load_run(run_dir, best=True)
  # The environments of the fifth segment's first evaluation (a segment per checkpoint).
  seed = pool_seed(final.config.budget.seed, "evaluation", segment=4)
  with final.make_env(5, seed) as env:
    final_score = float(np.mean(evaluate(env, final.greedy, final.acting, 5)))
  assert summary["last_eval_return"] == pytest.approx(final_score)
  assert summary["best_eval_return"] == max(logged[0][1], summary["last_eval_return"])
  if summary["last_eval_return"] > logged[0][1]:
    assert summary["best_env_steps"] == summary["env_steps"] == best.env_steps
    assert _equal_trees(best.params, final.params)
  else:
    assert summary["best_env_steps"] == 2048

  short = _run("impala", tmp_path / "short", total_env_steps=512, log_every=512,
               eval_every=2048, checkpoint_every=512)  # fmt: skip
  assert _equal_trees(load_run(short, best=True).params, load_run(short).params)
  # Without evaluation there is no best, and the refusal says why (not "yet").
  none = _run("impala", tmp_path / "none", total_env_steps=512, log_every=512, eval_every=0)
  with pytest.raises(ValueError, match=r"holds no best parameters \(it trained with "
                     r"--eval-every 0: no greedy evaluation, so no best\)"):  # fmt: skip
    load_run(none, best=True)


@pytest.mark.parametrize("path_type", [str, pathlib.Path])
def test_a_tilde_in_a_run_directory_is_the_home_directory(tmp_path, monkeypatch, path_type):
  """`--run-dir=~/x` and a quoted "~/x" reach the script unexpanded by the shell; from
  Python, the run directory may be a pathlib.Path."""
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  args = presets.sql.Args(run_dir=path_type("~/run"))
  args = dataclasses.replace(args, train=args.train.replace(
      total_env_steps=128, log_every=64, checkpoint_every=64, min_replay_size=16))  # fmt: skip
  presets.sql.run(args, progress=False)
  assert (tmp_path / "home" / "run" / "summary.json").exists()
  assert not (tmp_path / "~").exists()
  assert load_run("~/run").run_dir == tmp_path / "home" / "run"


def test_a_run_directory_that_is_not_a_path_is_refused(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(TypeError, match=r"run_dir must be a path \(a str or pathlib.Path\), got 3"):
    presets.sql.run(presets.sql.Args(run_dir=3), progress=False)
  assert not list(tmp_path.iterdir())


def test_the_root_of_seeds_run_one_after_the_other_names_its_seed_directories(tmp_path):
  for k in (0, 1):  # `--no-vmap-seeds` (or actor threads): no config.json at the root
    (tmp_path / f"seed{k}").mkdir()
    (tmp_path / f"seed{k}" / "config.json").write_text("{}")
  with pytest.raises(
      FileNotFoundError, match=r"holds the seeds of one: load one of them \(.*seed0"
  ):
    load_run(tmp_path)


def test_a_0_2_run_loads_its_final_parameters_and_refuses_its_checkpoints(runs, tmp_path):
  """0.2 wrote `whole_replay_buffer_training` (removed since; false, it trained as this
  version does) and checkpoints of record format 2 without checksums, which are named as
  0.2's rather than taken for none."""
  run_dir = shutil.copytree(runs["impala"], tmp_path / "run")
  current = load_run(run_dir)
  as_written_by_0_2(run_dir)
  with pytest.warns(RuntimeWarning, match="no checksum beside it"):
    loaded = load_run(run_dir)
  assert loaded.source == "final" and _equal_trees(loaded.params, current.params)
  with pytest.raises(ValueError, match=r"0.2 and earlier kept none"):
    load_run(run_dir, best=True)
  step = current.checkpoints[-2]
  for asked in (step, 7):
    with pytest.raises(ValueError, match=r"record format 2; .* offpolicy_ac 0.2\): load its "
                                         r"checkpoints with that version \(this version loads "
                                         r"its final parameters"):  # fmt: skip
      load_run(run_dir, checkpoint=asked)
  (run_dir / "final_params.msgpack").unlink()  # killed before its end
  with pytest.raises(ValueError, match=rf"at step {current.checkpoints[-1]} has record format 2"):
    load_run(run_dir)
  config = json.loads((run_dir / "config.json").read_text())
  config["config"]["train"]["replay"]["whole_replay_buffer_training"] = True
  (run_dir / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=r"whole_replay_buffer_training = True, which this "
                                       r"version removed: load or resume it with offpolicy_ac "
                                       r"0.2"):  # fmt: skip
    load_run(run_dir)


def test_a_vmapped_seed_of_offpolicy_ac_0_2_finds_the_roots_checkpoints(tmp_path):
  root = _run("sql", tmp_path / "run", total_env_steps=128, log_every=64,
              checkpoint_every=64, num_seeds=2, min_replay_size=16)  # fmt: skip
  as_written_by_0_2(root)
  with pytest.warns(RuntimeWarning, match="no checksum beside it"):
    assert load_run(root / "seed1").source == "final"
  with pytest.raises(ValueError, match=rf"{root / 'checkpoints'} at step 64 has record format 2"):
    load_run(root / "seed1", checkpoint=64)


def test_a_run_with_infinite_settings_loads_and_resumes(tmp_path):
  # config.json held inf as null: the run trained, then neither loaded nor resumed.
  args = presets.impala.Args()
  agent = dataclasses.replace(args.agent, max_grad_norm=float("inf"),
                              clip_rho_threshold=float("inf"))  # fmt: skip
  train = args.train.replace(total_env_steps=512, log_every=256, checkpoint_every=256)
  args = dataclasses.replace(args, run_dir=str(tmp_path / "run"), agent=agent, train=train)
  presets.impala.run(args, progress=False)
  saved = json.loads((tmp_path / "run" / "config.json").read_text())["config"]["agent"]
  assert saved["max_grad_norm"] == saved["clip_rho_threshold"] == "inf"
  assert load_run(tmp_path / "run").agent.config == agent
  longer = dataclasses.replace(args, resume=True, train=train.replace(total_env_steps=768))
  assert presets.impala.run(longer, progress=False).env_steps == 768


def _edit_checksums(path):
  """A param array's shape changed in checksums.json: the file is damaged."""
  checksums = json.loads(path.read_text())
  name = next(k for k in sorted(checksums) if "agent/params" in k)
  checksums[name] = "<f4[1, 3]:" + checksums[name].rpartition(":")[2]
  path.write_text(json.dumps(checksums))


DAMAGES = {
    "a shape in checksums.json": lambda step: _edit_checksums(step / "checksums.json"),
    "checksums.json not an object": lambda step: (step / "checksums.json").write_text("[]"),
    "the record's format": lambda step: (step / "record" / "metadata").write_text(
        (step / "record" / "metadata").read_text().replace('"format": 3', '"format": 2')),
    "the record's program": lambda step: (step / "record" / "metadata").write_text(
        (step / "record" / "metadata").read_text().replace('"envpool"', '"envpoom"')),
}  # fmt: skip


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_newest_checkpoint_damaged_in_its_checksums_or_record_is_passed_over(
    runs, tmp_path, damage
):
  """Damage that reads as another configuration or format (a shape in checksums.json, the
  record's fields) is damage where the run's other checkpoints read: passed over with a
  warning, as --resume passes it over; asked for by its step, refused as damaged (it was
  refused as a checkpoint of another configuration or version, and nothing was loaded)."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["impala"], run_dir)
  final = load_run(run_dir)
  last, before = final.checkpoints[-1], final.checkpoints[-2]
  DAMAGES[damage](run_dir / "checkpoints" / str(last))
  (run_dir / "final_params.msgpack").unlink()
  named = rf"checkpoints?[ /]{last}\b"
  with pytest.warns(RuntimeWarning, match=rf"{named}.*: loaded the newest intact checkpoint, "
                                          rf"at env step {before:,}"):  # fmt: skip
    loaded = load_run(run_dir)
  assert loaded.source == "checkpoint" and loaded.env_steps == before
  assert _equal_trees(loaded.params, load_run(run_dir, checkpoint=before).params)
  with pytest.raises(DamagedCheckpointError, match=named):
    load_run(run_dir, checkpoint=last)


def test_checkpoints_of_other_shapes_than_config_json_says_are_refused_as_such(runs, tmp_path):
  """Every checkpoint of other shapes (config.json edited): another configuration, not
  damage."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["impala"], run_dir)
  (run_dir / "final_params.msgpack").unlink()
  config = json.loads((run_dir / "config.json").read_text())
  config["config"]["agent"]["hidden_sizes"] = [32]
  (run_dir / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="config.json no longer describes the agent") as error:
    load_run(run_dir)
  assert not isinstance(error.value, DamagedCheckpointError)


@pytest.mark.parametrize("record", [[1, 2], {"algorithm": ["impala"], "config": {}}, "impala"])
def test_a_config_json_of_another_shape_is_refused_in_one_line(tmp_path, record):
  (tmp_path / "config.json").write_text(json.dumps(record))
  with pytest.raises(ValueError, match="was not written by an experiment script"):
    load_run(tmp_path)


def test_a_learner_copied_away_loads_its_own_parameters_not_a_new_runs_in_its_place(tmp_path):
  """A seed directory copied on its own records its run's root; a new run made there since
  is another run (its run_id; before run ids, started after the learner): the copy loads
  its own final parameters, not the new run's checkpoints."""
  root = _run("sql", tmp_path / "run", total_env_steps=128, log_every=64,
              checkpoint_every=64, num_seeds=2, seed=3, min_replay_size=16)  # fmt: skip
  own = load_run(root / "seed4")
  lone = tmp_path / "lone" / "seed4"
  shutil.copytree(root / "seed4", lone)
  config_path = root / "config.json"
  root_config = json.loads(config_path.read_text())
  learner = json.loads((lone / "config.json").read_text())
  assert root_config["run_id"] == learner["run_id"]
  learner_run_id = learner["run_id"]
  assert load_run(lone).checkpoints == own.checkpoints  # its run's, while it is there
  root_config["run_id"] = "0" * 32  # another run made in its place
  config_path.write_text(json.dumps(root_config))
  copy = load_run(lone)
  assert copy.source == "final" and copy.checkpoints == () and copy.env_steps == 128
  assert _equal_trees(copy.params, own.params)
  # A learner written before run ids: the run in its place started after it.
  del learner["run_id"], root_config["run_id"]
  (lone / "config.json").write_text(json.dumps(learner))
  config_path.write_text(json.dumps(root_config))
  assert load_run(lone).checkpoints == own.checkpoints
  root_config["created"] = "2100-01-01T00:00:00+0000"
  config_path.write_text(json.dumps(root_config))
  assert load_run(lone).checkpoints == ()
  # An edited lane: refused by name, not another lane's parameters or an IndexError.
  config_path.write_text(json.dumps(dict(root_config, run_id=learner_run_id)))
  seed_config = root / "seed4" / "config.json"
  written = json.loads(seed_config.read_text())
  for lane in (7, "x", 0, True, -1):
    seed_config.write_text(json.dumps(dict(written, learner=lane)))
    with pytest.raises(ValueError, match=rf"learner {re.escape(repr(lane))} of 2 is not the "
                                         r"lane of its seed, 4"):  # fmt: skip
      load_run(root / "seed4", checkpoint=128)


def test_a_run_that_saved_observation_statistics_is_refused_without_them(runs, tmp_path):
  """config.json edited to train without normalised observations: the parameters would act
  on raw observations, which they were never trained on."""
  run_dir = tmp_path / "run"
  shutil.copytree(runs["sql"], run_dir)
  config = json.loads((run_dir / "config.json").read_text())
  config["config"]["train"]["transform"]["normalize_observations"] = False
  (run_dir / "config.json").write_text(json.dumps(config))
  for best in (False, True):
    with pytest.raises(ValueError, match=r"normalize_observations false.*saved them "
                                         r"\(final_transform.msgpack, best_transform.msgpack\)"):  # fmt: skip
      load_run(run_dir, best=best)
