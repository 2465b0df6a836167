"""Compiled runs (JAX environments) read back: `load_run`, experiments/evaluate.py and
experiments/record_demos.py on a run directory, evaluating on a host pool of the functional
environment. (The learners of a sweep: tests/training/test_anakin.py.)"""

import dataclasses
import json

import jax
import numpy as np
import pytest
from scripts import load_script

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import describe_protocol
from offpolicy_ac.training import evaluate
from offpolicy_ac.training import load_params
from offpolicy_ac.training import load_run
from offpolicy_ac.training import pool_seed

pytest.importorskip("gymnax")

CARTPOLE = "gymnax:CartPole-v1"
SMALL = dict(env_id=CARTPOLE, num_envs=4, unroll_length=8, eval_episodes=2)


def _equal_trees(a, b):
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def _main(script, run_dir, **train):
  module = getattr(presets, script)
  args = module.Args()
  args = dataclasses.replace(args, run_dir=str(run_dir), train=args.train.replace(**train))
  return module.run(args, progress=False)


@pytest.fixture(scope="module")
def sql_run(tmp_path_factory):
  """One SQL learner on observations it normalises (so the run saves transformer state)."""
  run_dir = tmp_path_factory.mktemp("runs") / "sql"
  _main("sql", run_dir, **SMALL, total_env_steps=1024, log_every=256, checkpoint_every=512,
        min_replay_size=8, mini_batch_size=16, normalize_observations=True)  # fmt: skip
  return run_dir


def test_load_run_gives_the_agent_parameters_and_a_pool_of_the_jax_environment(sql_run):
  run = load_run(sql_run)
  saved = json.loads((sql_run / "config.json").read_text())
  assert run.algorithm == "sql" and run.source == "final" and run.config.compiled
  assert run.config == TrainConfig.from_dict(saved["config"]["train"])
  spec = envs.make_functional(CARTPOLE).spec
  assert run.agent.spec == spec._replace(num_envs=4, batch_size=4)
  template = run.agent.init(jax.random.PRNGKey(1)).params
  assert _equal_trees(run.params, load_params(sql_run / "final_params.msgpack", template))
  count = run.acting.transform.obs_stats.count
  assert float(count) > 0  # the run's observation statistics, not fresh ones
  assert run.env_steps == 1024 and run.checkpoints == (512, 1024)
  last = load_run(sql_run, checkpoint=1024)
  assert last.source == "checkpoint" and _equal_trees(last.acting, run.acting)
  earlier = load_run(sql_run, checkpoint=512)
  assert not _equal_trees(earlier.params, run.params)
  with run.make_env(3, seed=0) as env:
    assert isinstance(env, envs.FunctionalPool)
    assert env.spec == spec._replace(num_envs=3, batch_size=3)
    obs = env.reset().observation
  action = run.greedy_policy()(obs)
  assert action.shape == (3,) and action.dtype == np.int32 and ((action >= 0) & (action < 2)).all()
  with pytest.raises(ValueError, match="no rgb_array renderer"):
    run.make_env(1, seed=0, render_mode="rgb_array")


def test_evaluate_script_on_a_compiled_run(sql_run, capsys, monkeypatch):
  module = load_script("evaluate")
  result = module.main(module.Args(run_dir=str(sql_run), episodes=3, seed=4))
  assert json.loads((sql_run / "evaluation.json").read_text()) == result
  run = load_run(sql_run)
  with run.make_env(3, pool_seed(4, "evaluate")) as env:
    returns = evaluate(env, run.greedy, run.acting, 3)
  np.testing.assert_array_equal(result["returns"], returns)
  assert result["env_id"] == CARTPOLE and result["parameters"] == "final"
  # The protocol comes from the functional environment, not from envpool.
  monkeypatch.setattr(envs, "time_limit", lambda *a, **k: pytest.fail("envpool was asked"))
  assert result["protocol"] == describe_protocol(run.config, 3)
  assert result["protocol"].startswith(f"{CARTPOLE}: sum of rewards per episode, time limit 500")
  limited = run.config.replace(max_episode_steps=100)
  assert "time limit 100 env steps" in describe_protocol(limited)
  assert f"protocol: {result['protocol']}" in capsys.readouterr().out
  ckpt = module.main(module.Args(run_dir=str(sql_run), episodes=2, checkpoint=512,
                                 out=str(sql_run / "ckpt.json")))  # fmt: skip
  assert ckpt["parameters"] == "checkpoint" and ckpt["env_steps"] == 512
  # No video of a JAX environment: refused before anything is evaluated or written.
  (sql_run / "evaluation.json").unlink()
  with pytest.raises(
      ValueError, match="^--video: .*gymnax environments have no rgb_array renderer"
  ):
    module.main(module.Args(run_dir=str(sql_run), episodes=2, video=str(sql_run / "v.mp4")))
  assert not (sql_run / "evaluation.json").exists()


def test_record_demos_script_records_the_greedy_episodes(sql_run, tmp_path):
  module = load_script("record_demos")
  out = tmp_path / "demos.npz"
  module.main(module.Args(run_dir=str(sql_run), out=str(out), episodes=3, seed=9))
  demos = demos_lib.load_demos(out)
  assert demos["env_id"] == CARTPOLE
  n = int(demos["episode_lengths"].sum())
  assert demos["observation"].shape == (n, 4) and demos["observation"].dtype == np.float32
  assert demos["action"].shape == (n,) and demos["action"].dtype == np.int32
  ends = np.cumsum(demos["episode_lengths"])
  starts = ends - demos["episode_lengths"]
  np.testing.assert_array_equal(demos["step_type"][starts], FIRST)
  np.testing.assert_array_equal(demos["step_type"][ends - 1], LAST)
  # The episodes the evaluation plays on a pool of the same seed (one per environment).
  run = load_run(sql_run)
  with run.make_env(3, pool_seed(9, "evaluate")) as env:
    returns = evaluate(env, run.greedy, run.acting, 3)
  recorded = [demos["reward"][s + 1 : e].sum() for s, e in zip(starts, ends)]
  np.testing.assert_array_equal(recorded, returns)
