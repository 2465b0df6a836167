"""SQIL on a JAX environment: demonstrations recorded by experiments/record_demos.py from a
compiled SQL run, then experiments/sqil.py on the same gymnax task (one compiled program
whose replayed batches go through SQIL's batch function)."""

import dataclasses
import json
import math
import time

import jax
import numpy as np
import pytest
from scripts import load_script

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.training import load_run
from offpolicy_ac.training import read_metrics

pytest.importorskip("gymnax")

CARTPOLE = "gymnax:CartPole-v1"


def _main(script, run_dir, args=None, preset=None, **train):
  module = getattr(presets, script)
  if args is None:
    args = module.PRESETS[preset] if preset else module.Args()
  args = dataclasses.replace(args, run_dir=str(run_dir), train=args.train.replace(**train))
  return module.run(args, progress=False)


def _record(run_dir, out, episodes):
  module = load_script("record_demos")
  module.main(module.Args(run_dir=str(run_dir), out=str(out), episodes=episodes))
  return out


def _sqil_args(demos, preset=None):
  module = presets.sqil
  args = module.PRESETS[preset] if preset else module.Args(demos="")
  return dataclasses.replace(args, demos=str(demos))


def test_sqil_trains_on_demonstrations_of_a_compiled_sql_run(tmp_path, monkeypatch):
  sql_dir = tmp_path / "sql"
  _main("sql", sql_dir, env_id=CARTPOLE, total_env_steps=512, log_every=256,
        min_replay_size=8, mini_batch_size=16, eval_every=0)  # fmt: skip
  demos = _record(sql_dir, tmp_path / "demos.npz", episodes=3)
  assert demos_lib.load_demos(demos)["env_id"] == CARTPOLE
  # Every batch the compiled program learns from, seen through SQIL's batch function.
  batches = []
  make_batch_fn = presets.sqil.make_sqil_batch_fn

  def spying_make_batch_fn(*args, **kwargs):
    batch_fn = make_batch_fn(*args, **kwargs)

    def spying_batch_fn(batch, key):
      out = batch_fn(batch, key)
      keep = lambda *x: batches.append(tuple(np.asarray(a) for a in x))
      jax.debug.callback(keep, out.reward, out.observation, out.env_id)
      return out

    return spying_batch_fn

  monkeypatch.setattr(presets.sqil, "make_sqil_batch_fn", spying_make_batch_fn)
  sqil_dir = tmp_path / "sqil"
  result = _main("sqil", sqil_dir, _sqil_args(demos), env_id=CARTPOLE,
                 total_env_steps=512, log_every=256, min_replay_size=8, mini_batch_size=16,
                 eval_episodes=2)  # fmt: skip
  assert result.env_steps == 512 and result.num_updates > 0
  assert result.last_eval_return is not None
  lines = read_metrics(sqil_dir)
  assert len(lines) == 2 and all(math.isfinite(line["loss"]) for line in lines)
  # Half the agent's windows relabelled with reward 0, half demonstrations with reward 1.
  # (Under the vmap over learners the replayed update runs even while the replay fills,
  # its result discarded: more batches than updates.)
  assert len(batches) >= result.num_updates
  recorded = {tuple(o) for o in demos_lib.load_demos(demos)["observation"]}
  for reward, observation, env_id in batches:
    assert reward.shape[-1] == observation.shape[-2] == 32
    np.testing.assert_array_equal(reward[..., :16], 0.0)
    np.testing.assert_array_equal(reward[..., 16:], 1.0)
    np.testing.assert_array_equal(env_id[..., 16:], -1)
    assert (env_id[..., :16] >= 0).all()
    assert all(tuple(o) in recorded for o in observation[..., 16:, :].reshape(-1, 4))
  run = load_run(sqil_dir)
  assert run.algorithm == "sqil" and run.agent.spec.task_id == CARTPOLE
  with run.make_env(2, 0) as env:
    assert isinstance(env, envs.FunctionalPool)


def test_continuous_sqil_trains_on_demonstrations_of_a_compiled_sql_run(tmp_path):
  """Continuous SQL (gymnax's Pendulum, its pendulum preset) records float actions; SQIL's
  compiled program learns from them."""
  pendulum = "gymnax:Pendulum-v1"
  sql_dir = tmp_path / "sql"
  _main("sql", sql_dir, preset="pendulum", env_id=pendulum, total_env_steps=512,
        log_every=256, eval_every=0, checkpoint_every=0)  # fmt: skip
  demos = demos_lib.load_demos(_record(sql_dir, tmp_path / "demos.npz", episodes=2))
  assert demos["env_id"] == pendulum and demos["action"].dtype == np.float32
  assert demos["action"].shape == (int(demos["episode_lengths"].sum()), 1)
  assert np.all(np.abs(demos["action"]) <= 2.0)
  sqil_dir = tmp_path / "sqil"
  result = _main("sqil", sqil_dir, _sqil_args(tmp_path / "demos.npz", "pendulum"),
                 env_id=pendulum, total_env_steps=512, log_every=256, eval_episodes=2,
                 checkpoint_every=0)  # fmt: skip
  assert result.env_steps == 512 and result.num_updates > 0
  assert result.last_eval_return is not None
  assert all(math.isfinite(line["loss"]) for line in read_metrics(sqil_dir))
  assert load_run(sqil_dir).agent.spec.task_id == pendulum


def test_sqil_refuses_demonstrations_of_another_task(tmp_path):
  pool = envs.make_functional_pool("gymnax:Acrobot-v1", 1, 0, max_episode_steps=5)
  demos = demos_lib.record_episodes(pool, lambda obs: np.zeros(len(obs), np.int32), 1)
  path = tmp_path / "acrobot.npz"
  demos_lib.save_demos(path, demos, env_id="gymnax:Acrobot-v1")
  with pytest.raises(ValueError, match="demonstrations are of gymnax:Acrobot-v1"):
    _main("sqil", tmp_path / "sqil", _sqil_args(path), env_id=CARTPOLE)


@pytest.mark.slow
def test_sqil_reaches_195_on_gymnax_cartpole(tmp_path):
  """SQL (the cartpole-v0 preset, until greedy episodes average 475) records 10 episodes;
  SQIL from them (its cartpole-v0 preset) must reach a greedy mean of 195 within 20k env
  steps. Takes about 2 minutes on two CPU cores."""
  start = time.monotonic()
  sql_dir = tmp_path / "sql"
  sql = _main("sql", sql_dir, preset="cartpole-v0", env_id=CARTPOLE, total_env_steps=30_000,
              log_every=512, target_return=475.0)  # fmt: skip
  assert sql.target_reached_at is not None, sql
  demos = demos_lib.load_demos(_record(sql_dir, tmp_path / "demos.npz", episodes=10))
  ends = np.cumsum(demos["episode_lengths"])
  returns = [demos["reward"][e - n + 1 : e].sum() for e, n in zip(ends, demos["episode_lengths"])]
  sqil = _main("sqil", tmp_path / "sqil", _sqil_args(tmp_path / "demos.npz", "cartpole-v0"),
               env_id=CARTPOLE, total_env_steps=20_000, log_every=512)  # fmt: skip
  summary = json.loads((tmp_path / "sqil" / "summary.json").read_text())
  print(f"demo returns {returns}; SQIL {summary}; {time.monotonic() - start:.0f} s in all")
  assert sqil.target_reached_at is not None and sqil.last_eval_return >= 195.0, summary
