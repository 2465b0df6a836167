"""Experiment scripts end to end: run directories, bad configurations, learning.

The reduced-budget learning tests run in CI; the full-budget targets are marked
`slow` (`pytest -m slow`).
"""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scripts import EXPERIMENTS
from scripts import cpu_process_env
from scripts import load_script

from offpolicy_ac import cli
from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.analysis import statistics
from offpolicy_ac.training import is_refusal
from offpolicy_ac.training import load_run
from offpolicy_ac.training import read_metrics


def _script(name):
  return getattr(presets, name)


def _args(module, run_dir, preset=None, **loop_overrides):
  """The script's defaults (or a preset's) with the given loop settings (and demos)."""
  demos = loop_overrides.pop("demos", None)
  if preset is not None:
    args = module.PRESETS[preset]
    args = args if demos is None else dataclasses.replace(args, demos=demos)
  else:
    args = module.Args() if demos is None else module.Args(demos=demos)
  return dataclasses.replace(args, run_dir=str(run_dir), train=args.train.replace(**loop_overrides))


def _trailing_return(run_dir, lines=3):
  returns = [r["episode_return"] for r in read_metrics(run_dir) if r["episode_return"] is not None]
  return float(np.mean(returns[-lines:]))


def test_impala_run_directory_has_everything(tmp_path):
  module = _script("impala")
  result = module.run(
      _args(
          module,
          tmp_path / "run",
          total_env_steps=3000,
          log_every=1000,
          eval_every=1500,
          eval_episodes=2,
      )
  )
  run = tmp_path / "run"
  config = json.loads((run / "config.json").read_text())
  assert config["config"]["train"]["budget"]["total_env_steps"] == 3000
  assert config["versions"]["jax"] and config["git_revision"]
  lines = read_metrics(run)
  assert len(lines) >= 3
  for line in lines:
    assert {"env_steps", "wall_time_s", "episode_return"} <= set(line)
  assert any("eval_return" in line for line in lines)
  assert (run / "learning_curve.png").stat().st_size > 1000
  assert list((run / "tensorboard").glob("events.out.tfevents.*"))
  assert (run / "final_params.msgpack").exists()
  summary = json.loads((run / "summary.json").read_text())
  assert summary["env_steps"] == result.env_steps >= 3000


def test_num_seeds_runs_and_logs_each_seed(tmp_path):
  module = _script("sql")
  results = module.run(
      _args(
          module,
          tmp_path / "run",
          total_env_steps=640,
          log_every=320,
          num_seeds=2,
          seed=3,
          checkpoint_every=0,
      )
  )
  assert len(results) == 2
  for seed in (3, 4):
    run = tmp_path / "run" / f"seed{seed}"
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["train"]["budget"]["seed"] == seed
    assert len(read_metrics(run)) == 2
  first = [l["episode_return"] for l in read_metrics(tmp_path / "run" / "seed3")]
  second = [l["episode_return"] for l in read_metrics(tmp_path / "run" / "seed4")]
  assert first != second  # different seeds, different data
  assert (tmp_path / "run" / "learning_curves.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "script, overrides, message",
    [
        ("impala", dict(env_id="NoSuchEnv-v0"), "NoSuchEnv"),
        ("sql", dict(mini_batch_length=20, unroll_length=8), "longer than"),
        ("impala", dict(eval_every=0, target_return=100.0), "target_return"),
    ],
)
def test_bad_configuration_fails_fast(tmp_path, script, overrides, message):
  module = _script(script)
  with pytest.raises(ValueError, match=message):
    module.run(_args(module, tmp_path / "run", **overrides))


def test_continuous_sql_settings_are_checked_before_running(tmp_path):
  module = _script("sql")
  args = _args(module, tmp_path / "run", preset="pendulum")
  args = dataclasses.replace(args, agent=dataclasses.replace(args.agent, svgd_update_ratio=0.01))
  with pytest.raises(ValueError, match="svgd_update_ratio"):
    module.run(args)
  assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "run")


def test_impala_rejects_rho_bar_below_c_bar_before_running(tmp_path):
  module = _script("impala")
  args = _args(module, tmp_path / "run")
  args = dataclasses.replace(
      args, agent=dataclasses.replace(args.agent, clip_rho_threshold=0.5, clip_c_threshold=1.0)
  )
  with pytest.raises(ValueError, match="rho-bar"):
    module.run(args)
  assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "run")


# Random CartPole play returns about 22.


def test_impala_learns_cartpole_reduced_budget(tmp_path):
  module = _script("impala")
  module.run(_args(module, tmp_path, total_env_steps=60_000, log_every=5_000))
  assert _trailing_return(tmp_path) > 80


def _max_smoothed_return(run_dir, window=5):
  """The best mean of `window` consecutive metrics lines' returns."""
  returns = [r["episode_return"] for r in read_metrics(run_dir) if r["episode_return"] is not None]
  return max(np.convolve(returns, np.ones(window) / window, mode="valid"))


# A random Pendulum policy returns about -1200 (the first lines of a run: ~-1300).


def test_impala_gaussian_learns_pendulum_reduced_budget(tmp_path):
  """Two vmapped seeds, each past -900 within 400k env steps. When learning starts varies
  with the seed and with the CPU's rounding: on one machine seed 0 alone was still at -1,397
  at 300k and reached -618 at 540k; the two lanes here reached -229 and -390."""
  module = _script("impala")
  module.run(
      _args(module, tmp_path, preset="pendulum", total_env_steps=400_000, num_seeds=2,
            checkpoint_every=0)  # fmt: skip
  )
  for seed in range(2):
    assert _max_smoothed_return(tmp_path / f"seed{seed}", 3) > -900, seed


@pytest.mark.slow
def test_full_budget_impala_gaussian_pendulum_reaches_minus_400(tmp_path):
  """Three vmapped seeds of the preset, each at -400 or better within its 1M env steps."""
  module = _script("impala")
  module.run(_args(module, tmp_path, preset="pendulum", num_seeds=3, checkpoint_every=0))
  for seed in range(3):
    assert _max_smoothed_return(tmp_path / f"seed{seed}") >= -400, seed


# MuJoCo through envpool (float64 actions, observation normalisation): random play on
# Hopper-v4 returns about 20 (it falls within about 25 steps); the `mujoco` presets.


@pytest.mark.parametrize("script, env_steps, bar", [("impala", 100_000, 100), ("acer", 50_000, 80)])
def test_actor_critics_learn_hopper_reduced_budget(tmp_path, script, env_steps, bar):
  module = _script(script)
  module.run(_args(module, tmp_path, preset="mujoco", env_id="Hopper-v4",
                    total_env_steps=env_steps, log_every=10_000, checkpoint_every=0))  # fmt: skip
  assert _max_smoothed_return(tmp_path, 3) > bar


@pytest.mark.parametrize("replay", [False, True], ids=["fresh", "replayed"])
def test_impala_anneals_the_learning_rate_over_the_runs_updates(tmp_path, replay):
  # --anneal-learning-rate sets the decay to the run's planned updates, which are the
  # updates the run makes: the step size reaches 0 at the last one.
  module = _script("impala")
  replay_settings = dict(replay_capacity=64, min_replay_size=40, num_updates_per_train_iter=3,
                         mini_batch_size=8, mini_batch_length=8)  # fmt: skip
  args = _args(module, tmp_path, total_env_steps=5_000, log_every=2_500, checkpoint_every=0,
               **(replay_settings if replay else {}))  # fmt: skip
  args = dataclasses.replace(args, anneal_learning_rate=True,
                             agent=dataclasses.replace(args.agent, use_replay=replay))  # fmt: skip
  planned = args.train.planned_updates(off_policy=replay)
  # 20 unrolls of 16 x 16 steps; replayed: 3 updates each from the 3rd (40 sequences).
  assert planned == (54 if replay else 20)
  result = module.run(args)
  assert result.num_updates == planned
  counts = [int(x) for x in jax.tree.leaves(result.agent_state.opt_state)
            if jnp.ndim(x) == 0 and jnp.issubdtype(x.dtype, jnp.integer)]  # fmt: skip
  assert planned in counts  # the schedule's own update count


def test_impala_anneals_over_the_updates_of_a_run_with_actor_pools(tmp_path):
  # Each iteration learns from both pools' unrolls: half the updates of the inline run.
  module = _script("impala")
  args = _args(module, tmp_path, total_env_steps=4_096, log_every=1_024, checkpoint_every=0,
               actors="pools", num_actors=2)  # fmt: skip
  args = dataclasses.replace(args, anneal_learning_rate=True)
  planned = args.train.planned_updates(off_policy=False)
  assert planned == 8 and args.train.replace(actors="inline", num_actors=1).planned_updates(
      off_policy=False) == 16  # fmt: skip
  assert module.run(args).num_updates == planned


def test_sql_cools_the_learning_rate_down_over_the_last_updates(tmp_path):
  # --learning-rate-cooldown 0.25: the step size is constant for the first 3/4 of the
  # planned updates, which are the updates the run makes, and reaches 0 at the last one.
  module = _script("sql")
  args = _args(module, tmp_path, preset="pendulum", total_env_steps=2_000, log_every=1_000,
               eval_every=0, checkpoint_every=0)  # fmt: skip
  args = dataclasses.replace(args, learning_rate_cooldown=0.25)
  planned = args.train.planned_updates(off_policy=True)
  # 63 unrolls of 4 x 8 steps, 16 updates each from the 8th (32 sequences stored).
  assert planned == 56 * 16
  assert args.train.cooldown_updates(0.25, off_policy=True) == (672, 224)
  result = module.run(args)
  assert result.num_updates == planned
  counts = [int(x) for x in jax.tree.leaves(result.agent_state.opt_state)
            if jnp.ndim(x) == 0 and jnp.issubdtype(x.dtype, jnp.integer)]  # fmt: skip
  assert counts.count(planned) == 4  # Adam's and the schedule's, of Q and of the sampler


def test_sql_refuses_a_cooldown_beside_a_decay_of_its_own(tmp_path):
  # The script's default cools the step size down over the whole run; decay settings given
  # as well would be overwritten, so the two together are refused.
  module = _script("sql")
  args = _args(module, tmp_path, total_env_steps=1_000)
  assert module.Args().learning_rate_cooldown == 1.0
  args = dataclasses.replace(
      args, agent=dataclasses.replace(args.agent, learning_rate_decay_updates=100)
  )
  with pytest.raises(ValueError, match="--learning-rate-cooldown 0") as refused:
    module.run(args)
  assert is_refusal(refused.value) and not (tmp_path / "config.json").exists()


def test_cooldown_updates_are_a_fraction_of_the_planned_updates():
  config = _args(_script("impala"), "unused").train
  updates = config.planned_updates(off_policy=False)
  assert config.cooldown_updates(1.0, off_policy=False) == (0, updates)  # PPO's annealing
  assert config.cooldown_updates(0.1, off_policy=False) == (updates - 195, 195)
  assert config.cooldown_updates(1e-9, off_policy=False) == (updates - 1, 1)
  for bad in (0.0, -0.1, 1.5, float("nan"), True):
    with pytest.raises(ValueError, match="cool-down is a fraction"):
      config.cooldown_updates(bad, off_policy=False)
  with pytest.raises(ValueError, match="--learning-rate-cooldown must lie in"):
    main_args = dataclasses.replace(_args(_script("sql"), "unused"), learning_rate_cooldown=2.0)
    _script("sql").run(main_args)


# cleanrl's PPO at 1M env steps (docs/benchmarks.md): where the preset's greedy policy
# passes it in the documented protocol, 3 vmapped seeds and the mean of their final greedy
# evaluations. ACER on Hopper-v4 is left out: two runs of its 3 seeds gave means of 2,840 and
# 1,918 against PPO's 2,383. So is IMPALA on Walker2d-v4: 2,297 against 2,288 is no margin
# for a test.


def _eval_returns(run_dir):
  return [l["eval_return"] for l in read_metrics(run_dir) if l.get("eval_return") is not None]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, env_id, ppo",
    [
        ("impala", "HalfCheetah-v4", 1_443),
        ("acer", "HalfCheetah-v4", 1_443),
        ("acer", "Walker2d-v4", 2_288),
    ],
)
def test_full_budget_mujoco_greedy_policy_passes_ppo(tmp_path, script, env_id, ppo):
  module = _script(script)
  preset = module.ENV_PRESETS.select(env_id)
  module.run(_args(module, tmp_path, preset=preset, env_id=env_id, num_seeds=3,
                    checkpoint_every=0))  # fmt: skip
  finals = [_eval_returns(tmp_path / f"seed{seed}")[-1] for seed in range(3)]
  assert np.mean(finals) > ppo, finals


def test_sql_learns_cartpole_reduced_budget(tmp_path):
  module = _script("sql")
  module.run(_args(module, tmp_path, total_env_steps=20_000, log_every=2_000))
  assert _trailing_return(tmp_path) > 80


def heuristic_cartpole_policy(obs):
  return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int32)


@pytest.fixture(scope="module")
def heuristic_demos(tmp_path_factory):
  env = envs.make("CartPole-v1", 10, 7)
  demos = demos_lib.record_episodes(env, heuristic_cartpole_policy, 10)
  env.close()
  path = tmp_path_factory.mktemp("demos") / "cartpole.npz"
  demos_lib.save_demos(path, demos, env_id="CartPole-v1")
  return path


@pytest.mark.parametrize("demo_batch_size", [None, 64])  # half and half; agent data at 1/2
def test_sqil_imitates_demonstrations_reduced_budget(tmp_path, heuristic_demos, demo_batch_size):
  module = _script("sqil")
  args = _args(
      module, tmp_path, demos=str(heuristic_demos), total_env_steps=20_000, log_every=2_000
  )
  module.run(dataclasses.replace(args, demo_batch_size=demo_batch_size))
  assert _trailing_return(tmp_path) > 80


def test_sqil_on_two_learner_devices_from_the_command_line(tmp_path, heuristic_demos):
  # sqil.py puts its demonstrations on the device before the run: the host devices the
  # learner needs must exist by then (they cannot be added once JAX has started).
  cmd = [sys.executable, str(EXPERIMENTS / "sqil.py"), "--demos", str(heuristic_demos),
         "--learner-devices", "2", "--total-env-steps", "4096", "--run-dir", str(tmp_path)]  # fmt: skip
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cpu_process_env())
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert read_metrics(tmp_path)[-1]["env_steps"] == 4096


def _best_eval_return(run_dir):
  return max(_eval_returns(run_dir))


# Continuous SQL and SQIL on Pendulum-v1 (random play returns about -1200 to -1500).


def test_continuous_sql_learns_pendulum_reduced_budget(tmp_path):
  module = _script("sql")
  args = _args(module, tmp_path, preset="pendulum", total_env_steps=12_000, checkpoint_every=0)
  module.run(args)
  assert _best_eval_return(tmp_path) > -500


def heuristic_pendulum_policy(obs):
  """Energy pumping, then a PD controller near the top: returns about -150 (-1 to -300)."""
  cos, sin, velocity = obs[:, 0], obs[:, 1], obs[:, 2]
  energy = 0.5 * velocity**2 + 15.0 * cos  # 15 upright at rest (3g / 2l = 15)
  pump = 2.0 * np.sign(velocity + 1e-3) * (energy < 15.0)
  hold = np.clip(-10.0 * np.arctan2(sin, cos) - 2.0 * velocity, -2.0, 2.0)
  return np.where(cos > 0.85, hold, pump)[:, None].astype(np.float32)


@pytest.fixture(scope="module")
def pendulum_demos(tmp_path_factory):
  env = envs.make("Pendulum-v1", 10, 7)
  demos = demos_lib.record_episodes(env, heuristic_pendulum_policy, 10)
  env.close()
  path = tmp_path_factory.mktemp("demos") / "pendulum.npz"
  demos_lib.save_demos(path, demos, env_id="Pendulum-v1")
  return path


def test_continuous_sqil_imitates_pendulum_demonstrations_reduced_budget(tmp_path,
                                                                        pendulum_demos):  # fmt: skip
  module = _script("sqil")
  args = _args(module, tmp_path, preset="pendulum", demos=str(pendulum_demos),
               total_env_steps=10_000, checkpoint_every=0)  # fmt: skip
  module.run(args)
  assert _best_eval_return(tmp_path) > -500


def test_continuous_sqil_with_two_q_networks_resumes_and_loads(tmp_path, pendulum_demos):
  """--num-q-networks 2 through the script: the stacked Q networks are checkpointed, the
  run resumes from them, and load_run rebuilds the agent and acts in the box."""
  module = _script("sqil")
  args = _args(module, tmp_path, preset="pendulum", demos=str(pendulum_demos),
               total_env_steps=512, log_every=256, eval_every=0, checkpoint_every=256)  # fmt: skip
  args = dataclasses.replace(args, agent=dataclasses.replace(args.agent, num_q_networks=2))
  module.run(args)
  resumed = dataclasses.replace(args, resume=True, train=args.train.replace(total_env_steps=1024))
  result = module.run(resumed)
  assert result.env_steps == 1024
  assert all(np.isfinite(l["loss"]) for l in read_metrics(tmp_path) if "loss" in l)
  run = load_run(tmp_path)
  assert run.agent.config.num_q_networks == 2
  kernel = run.params["q"]["params"]["Dense_0"]["kernel"]
  assert kernel.shape[0] == 2 and not np.allclose(kernel[0], kernel[1])
  actions = run.greedy_policy()(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32))
  assert actions.shape == (8, 1) and np.all(np.abs(actions) <= 2.0)


def test_sqil_resume_refuses_demonstrations_whose_content_changed(tmp_path, pendulum_demos):
  """The --demos path is the same, its content is not: --resume refuses it before
  training; the run's own file resumes, at another path too."""
  module = _script("sqil")
  demos = tmp_path / "demos.npz"
  demos.write_bytes(pendulum_demos.read_bytes())
  args = _args(module, tmp_path / "run", preset="pendulum", demos=str(demos),
               total_env_steps=256, log_every=256, eval_every=0, checkpoint_every=256)  # fmt: skip
  module.run(args)
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert len(config["inputs"]["demos"]) == 64  # the file's sha256
  resumed = dataclasses.replace(args, resume=True, train=args.train.replace(total_env_steps=512))
  env = envs.make("Pendulum-v1", 10, 8)
  other = demos_lib.record_episodes(env, lambda obs: np.zeros((len(obs), 1), np.float32), 10)
  env.close()
  demos_lib.save_demos(demos, other, env_id="Pendulum-v1")
  with pytest.raises(ValueError, match="--demos file's content differs"):
    module.run(resumed)
  assert len(read_metrics(tmp_path / "run")) == 1  # nothing trained
  moved = tmp_path / "moved.npz"  # the run's file at another path: compared by content
  moved.write_bytes(pendulum_demos.read_bytes())
  assert module.run(dataclasses.replace(resumed, demos=str(moved))).env_steps == 512


def test_sqil_resume_accepts_flags_given_as_the_values_their_null_stood_for(tmp_path,
                                                                          heuristic_demos):  # fmt: skip
  """--demo-batch-size 32 (--mini-batch-size's, which the default null stands for) and
  --eval-every at the interval the run derived resume it; another value is still refused,
  naming what the run's null stood for."""
  module = _script("sqil")
  args = _args(module, tmp_path, demos=str(heuristic_demos), total_env_steps=512,
               log_every=256, checkpoint_every=256, mini_batch_size=32)  # fmt: skip
  assert args.demo_batch_size is None and args.train.eval.eval_every is None
  module.run(args)
  resumed = dataclasses.replace(args, resume=True)
  changed = dataclasses.replace(resumed, demo_batch_size=16)
  with pytest.raises(ValueError, match=r"demo_batch_size \(the run's null = 32, given 16\)"):
    module.run(changed)
  same = dataclasses.replace(resumed, demo_batch_size=32,
                             train=args.train.replace(total_env_steps=768, eval_every=256))  # fmt: skip
  assert module.run(same).env_steps == 768


def test_sqil_learners_record_the_demonstrations_digest(tmp_path, pendulum_demos):
  """Each learner of a two-seed run records the --demos file's digest, as the root does:
  the statistics group runs by it (runs trained on other demonstrations at the same path
  were pooled as seeds of one configuration)."""
  module = _script("sqil")
  args = _args(module, tmp_path, preset="pendulum", demos=str(pendulum_demos), num_seeds=2,
               total_env_steps=256, log_every=256, eval_every=0)  # fmt: skip
  module.run(args)
  digest = json.loads((tmp_path / "config.json").read_text())["inputs"]["demos"]
  for seed in (0, 1):
    learner = json.loads((tmp_path / f"seed{seed}" / "config.json").read_text())
    assert learner["inputs"] == {"demos": digest}
  runs = [statistics.run_info(tmp_path / f"seed{seed}") for seed in (0, 1)]
  assert len(statistics.group_runs(runs)) == 1


def test_sqil_halfcheetah_preset_trains_from_demonstrations_inside_the_box(tmp_path):
  """The halfcheetah preset as it is (two Q networks, the mixture proposal), on 2 episodes
  of uniform actions inside [-0.9, 0.9]^6, for 2,048 env steps."""
  rng = np.random.default_rng(0)
  env = envs.make("HalfCheetah-v4", 2, 3)
  demos = demos_lib.record_episodes(
      env, lambda obs: rng.uniform(-0.9, 0.9, (len(obs), 6)).astype(np.float32), 2
  )
  env.close()
  demos_lib.save_demos(tmp_path / "hc.npz", demos, env_id="HalfCheetah-v4")
  sqil = _script("sqil")
  result = sqil.run(_args(sqil, tmp_path / "sqil", preset="halfcheetah",
                           demos=str(tmp_path / "hc.npz"), total_env_steps=2_048,
                           log_every=1_024, eval_every=0, checkpoint_every=0))  # fmt: skip
  assert 0 < result.num_updates <= 2_048 // 64 * 32  # 32 per 64 env steps, from 250 stored
  metrics = [l for l in read_metrics(tmp_path / "sqil") if "loss" in l]
  assert metrics and all(np.isfinite(l["loss"]) and np.isfinite(l["q_mean"]) for l in metrics)
  assert load_run(tmp_path / "sqil").agent.config.num_q_networks == 2


def test_sql_mujoco_preset_trains_as_it_is(tmp_path):
  """The hopper preset as it is (two Q networks, the mixture proposal, half an update per
  env step, alpha / reward scale = 1 / 10, the step size's cool-down) for 2,048 env
  steps."""
  sql = _script("sql")
  result = sql.run(_args(sql, tmp_path, preset="hopper", total_env_steps=2_048,
                          log_every=1_024, eval_every=0, checkpoint_every=0))  # fmt: skip
  assert 0 < result.num_updates <= 2_048 // 64 * 32  # 32 per 64 env steps, from 250 stored
  metrics = [l for l in read_metrics(tmp_path) if "loss" in l]
  assert metrics and all(np.isfinite(l["loss"]) and np.isfinite(l["q_mean"]) for l in metrics)
  assert load_run(tmp_path).agent.config.num_q_networks == 2


def test_record_demos_records_continuous_actions(tmp_path, monkeypatch):
  """A short continuous SQL run, its greedy policy recorded, and SQIL trained on it."""
  sql = _script("sql")
  sql.run(_args(sql, tmp_path / "sql", preset="pendulum", total_env_steps=512, log_every=256,
                 eval_every=0, checkpoint_every=0))  # fmt: skip
  record = load_script("record_demos")
  out = tmp_path / "demos.npz"
  record.main(record.Args(run_dir=str(tmp_path / "sql"), out=str(out), episodes=2))
  demos = demos_lib.load_demos(out)
  assert demos["env_id"] == "Pendulum-v1" and list(demos["episode_lengths"]) == [201, 201]
  assert demos["action"].shape == (402, 1) and demos["action"].dtype == np.float32
  assert np.all(np.abs(demos["action"]) <= 2.0) and np.std(demos["action"]) > 0
  inner = tmp_path / "home" / "inner.npz"  # the box [-2, 2] shrunk by half: [-1, 1]
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)  # `--out ~/inner.npz` is written in $HOME, not in ./~
  record.main(record.Args(run_dir=str(tmp_path / "sql"), out="~/inner.npz", episodes=2,
                          action_box_fraction=0.5))  # fmt: skip
  assert not (tmp_path / "~").exists()
  clipped = demos_lib.load_demos(inner)["action"]
  assert np.all(np.abs(clipped) <= 1.0) and np.std(clipped) > 0
  np.testing.assert_array_equal(clipped[:1], np.clip(demos["action"][:1], -1.0, 1.0))
  sqil = _script("sqil")
  result = sqil.run(_args(sqil, tmp_path / "sqil", preset="pendulum", demos=str(out),
                           total_env_steps=512, log_every=256, eval_every=0,
                           checkpoint_every=0))  # fmt: skip
  assert result.num_updates > 0
  assert all(np.isfinite(l["loss"]) for l in read_metrics(tmp_path / "sqil") if "loss" in l)


def test_record_demos_clips_a_gaussian_policys_actions_to_the_box_by_default(tmp_path, capsys):
  """IMPALA's sampled Pendulum actions lie outside [-2, 2]: recorded as the policy gave
  them, sqil.py refused the file. By default they are clipped to the box, as the
  environment clips them, with a note on stderr about the ones on its faces."""
  impala = _script("impala")
  impala.run(_args(impala, tmp_path / "impala", preset="pendulum", total_env_steps=512,
                   log_every=256, eval_every=0, checkpoint_every=0))  # fmt: skip
  record = load_script("record_demos")
  out = tmp_path / "demos.npz"
  capsys.readouterr()
  record.main(record.Args(run_dir=str(tmp_path / "impala"), out=str(out), episodes=2,
                          policy="behaviour"))  # fmt: skip
  demos = demos_lib.load_demos(out)
  assert np.abs(demos["action"]).max() == 2.0  # some were outside
  demos_lib.check_demos(demos, load_run(tmp_path / "impala").agent.spec)  # as sqil.py checks
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "of the steps' actions lie on the action box's faces" in err[0]


def test_sqil_refuses_demos_of_another_task(tmp_path, heuristic_demos):
  module = _script("sqil")
  with pytest.raises(ValueError, match="demonstrations are of CartPole-v1"):
    module.run(_args(module, tmp_path, demos=str(heuristic_demos), env_id="CartPole-v0"))


def _short_demos(env_id):
  """One episode of `env_id` of at most 4 steps (action 0, or the action box's lower corner)."""
  env = envs.make(env_id, 1, 0, max_episode_steps=4)
  spec = env.spec
  low = (
      np.zeros((), spec.action_dtype)
      if spec.is_discrete
      else np.asarray(spec.action_low, spec.action_dtype)
  )
  demos = demos_lib.record_episodes(env, lambda obs: np.stack([low] * len(obs)), 1)
  env.close()
  return demos


@pytest.mark.parametrize(
    "preset, held, advised",
    [("pendulum", "CartPole-v1", "cartpole"), (None, "Pendulum-v1", "pendulum"),
     (None, "CartPole-v0", "cartpole-v0"), (None, "Acrobot-v1", "none")],
)  # fmt: skip
def test_sqil_advises_a_preset_that_fits_the_demonstrations_task(tmp_path, preset, held, advised):
  """Demonstrations of another task: the advice names the task and a preset for it, which
  the command line then accepts (the run's own preset, made for another kind of task, would
  be refused: --preset pendulum --env-id CartPole-v1)."""
  module = _script("sqil")
  path = tmp_path / "demos.npz"
  demos_lib.save_demos(path, _short_demos(held), env_id=held)
  with pytest.raises(ValueError, match=rf"pass --env-id {held} --preset {advised}, or record"):
    module.run(_args(module, tmp_path / "run", preset, demos=str(path)))
  argv = ["--env-id", held, "--preset", advised, "--demos", str(path)]
  args = cli.parse_args(module.Args, module.PRESETS, argv, env_presets=module.ENV_PRESETS)
  assert args.train.env.env_id == held


def test_sqil_refuses_an_empty_demonstration_batch(tmp_path, heuristic_demos):
  module = _script("sqil")
  args = _args(module, tmp_path, demos=str(heuristic_demos))
  with pytest.raises(ValueError, match="--demo-batch-size must be an int >= 1, got 0"):
    module.run(dataclasses.replace(args, demo_batch_size=0))
  assert not tmp_path.exists() or not any(tmp_path.iterdir())  # refused before the run starts


@pytest.mark.slow
@pytest.mark.parametrize("script", ["impala", "sql"])
def test_full_budget_cartpole_v1_reaches_475(tmp_path, script):
  module = _script(script)
  module.run(_args(module, tmp_path, total_env_steps=500_000, log_every=10_000))
  assert _max_smoothed_return(tmp_path) >= 475


@pytest.mark.slow
def test_full_budget_sqil_from_sql_expert(tmp_path):
  sql = _script("sql")
  sql.run(_args(sql, tmp_path / "expert", total_env_steps=100_000))
  load_script("record_demos").main(
      load_script("record_demos").Args(
          run_dir=str(tmp_path / "expert"), out=str(tmp_path / "demos.npz"), episodes=10
      )
  )
  sqil = _script("sqil")
  sqil.run(
      _args(
          sqil,
          tmp_path / "sqil",
          demos=str(tmp_path / "demos.npz"),
          total_env_steps=200_000,
          log_every=10_000,
      )
  )
  assert _max_smoothed_return(tmp_path / "sqil") >= 450


@pytest.mark.slow
def test_full_budget_continuous_sqil_from_sql_expert(tmp_path):
  """Continuous SQL's pendulum preset trains an expert, record_demos records 10 greedy
  episodes, SQIL's pendulum preset imitates them."""
  sql = _script("sql")
  sql.run(_args(sql, tmp_path / "expert", preset="pendulum", total_env_steps=16_000,
                 checkpoint_every=0))  # fmt: skip
  record = load_script("record_demos")
  out = str(tmp_path / "demos.npz")
  record.main(record.Args(run_dir=str(tmp_path / "expert"), out=out, episodes=10))
  sqil = _script("sqil")
  sqil.run(_args(sqil, tmp_path / "sqil", preset="pendulum", demos=out, total_env_steps=16_000,
                  checkpoint_every=0))  # fmt: skip
  assert _best_eval_return(tmp_path / "sqil") > -300


# IMPALA with asynchronous actors and with a learner on two devices.


def _run_impala_subprocess(run_dir, *flags):
  # Two learner devices need host devices created before JAX starts: a fresh process
  # (the script asks for them itself), on the CPU also on a machine with one GPU.
  cmd = [sys.executable, str(EXPERIMENTS / "impala.py"), "--run-dir", str(run_dir), *flags]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=cpu_process_env())
  assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("xla_rollout", [False, True])
def test_impala_async_actors_learn_cartpole_reduced_budget(tmp_path, xla_rollout):
  module = _script("impala")
  module.run(
      _args(
          module,
          tmp_path,
          total_env_steps=100_000,
          log_every=5_000,
          actors="async",
          num_actors=2,
          max_policy_lag=4,
          rollout="compiled" if xla_rollout else "host",
      )
  )
  # Threads make the run's data depend on timing, and IMPALA on CartPole can fall back for a
  # while after a peak: judge the best three consecutive lines, not the last three.
  assert _max_smoothed_return(tmp_path, window=3) > 80
  lines = read_metrics(tmp_path)
  assert all(0 <= l.get("policy_lag", 0) <= 4 for l in lines)  # none: every one dropped


def test_impala_two_learner_devices_learn_cartpole_reduced_budget(tmp_path):
  _run_impala_subprocess(
      tmp_path, "--learner-devices", "2", "--total-env-steps", "60000", "--log-every", "5000"
  )
  assert _trailing_return(tmp_path) > 80


@pytest.mark.slow
def test_full_budget_impala_async_actors_reaches_475(tmp_path):
  module = _script("impala")
  module.run(
      _args(
          module,
          tmp_path,
          total_env_steps=500_000,
          log_every=10_000,
          actors="async",
          num_actors=2,
          max_policy_lag=4,
      )
  )
  assert _max_smoothed_return(tmp_path) >= 475


@pytest.mark.slow
def test_full_budget_impala_async_xla_actors_reaches_475(tmp_path):
  module = _script("impala")
  module.run(
      _args(
          module,
          tmp_path,
          total_env_steps=500_000,
          log_every=10_000,
          actors="async",
          num_actors=2,
          max_policy_lag=4,
          rollout="compiled",
      )
  )
  assert _max_smoothed_return(tmp_path) >= 475


def test_xla_rollout_refuses_float64_actions_before_training(tmp_path):
  module = _script("impala")
  with pytest.raises(ValueError, match="float64 actions"):
    module.run(
        _args(
            module,
            tmp_path / "run",
            preset="pendulum",
            env_id="Hopper-v4",
            rollout="compiled",
            total_env_steps=4096,
        )
    )
  assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "run")


@pytest.mark.slow
def test_full_budget_impala_two_learner_devices_reaches_475(tmp_path):
  _run_impala_subprocess(
      tmp_path, "--learner-devices", "2", "--total-env-steps", "500000", "--log-every", "10000"
  )
  assert _max_smoothed_return(tmp_path) >= 475


def test_a_run_refused_before_its_first_step_does_not_block_the_corrected_rerun(tmp_path):
  module = _script("impala")
  with pytest.raises(ValueError):
    module.run(_args(module, tmp_path / "run", env_id="NoSuchTask-v0"))
  module.run(_args(module, tmp_path / "run", total_env_steps=512, log_every=256))
  assert read_metrics(tmp_path / "run")[-1]["env_steps"] == 512


@pytest.mark.parametrize("backend", ["host", "compiled"])
def test_batched_env_stepping_trains_through_the_driver(tmp_path, backend):
  # --env-batch-size 4 of 8 envs: envpool returns the first 4 environments to finish a step;
  # the rollout keys steps by env_id, so trajectories are still [T+1, 8], one env a column.
  module = _script("sql")
  result = module.run(
      _args(
          module, tmp_path / "run", num_envs=8, env_batch_size=4, unroll_length=8,
          total_env_steps=2048, log_every=512, checkpoint_every=1024, rollout=backend,
      )
  )  # fmt: skip
  lines = read_metrics(tmp_path / "run")
  assert [l["env_steps"] for l in lines] == [512, 1024, 1536, 2048]
  assert result.env_steps == 2048 and result.num_updates > 0
  assert all(np.isfinite(l["loss"]) for l in lines if "loss" in l)
  assert sum(l["episodes"] for l in lines) > 0


def test_batched_env_stepping_is_checked_before_training(tmp_path):
  module = _script("impala")
  with pytest.raises(ValueError, match=r"env_batch_size \(9\) exceeds num_envs \(8\)"):
    module.run(_args(module, tmp_path / "run", num_envs=8, env_batch_size=9))
