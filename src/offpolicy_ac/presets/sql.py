"""Soft Q-learning's settings: the script's `Args`, its presets, and `run`.

    from offpolicy_ac.presets import sql
    sql.run(sql.PRESETS["pendulum"])            # what experiments/sql.py --preset pendulum runs

Discrete or continuous SQL is picked from the task's action space (`agents.make_sql`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_sql
from offpolicy_ac.cli import EnvPresets
from offpolicy_ac.presets import common
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import refusals
from offpolicy_ac.training import run_experiment


@dataclasses.dataclass(frozen=True)
class Args:
  """experiments/sql.py's command line."""

  # CartPole-v1: the greedy policy reaches 500 by about 75k env steps; with a constant step
  # size it then swings (2 of 5 seeds ended at 215 and 308 after 500k); annealed to 0 over
  # 150k, all 5 end at 500 (results/defaults/).
  train: TrainConfig = TrainConfig.of(
      env_id="CartPole-v1",
      total_env_steps=150_000,
      num_envs=4,
      unroll_length=8,
      replay_capacity=5_000,
      min_replay_size=32,
      num_updates_per_train_iter=4,
      mini_batch_size=64,
      mini_batch_length=4,
  )
  agent: SqlConfig = SqlConfig()
  learning_rate_cooldown: float = 1.0
  """Lower the learning rate to 0 over this last fraction of the run. Linearly, over this
  fraction of the run's updates (1: the whole run), setting --learning-rate-decay-begin and
  --learning-rate-decay-updates from the budget; 0: as those two say (a constant learning
  rate unless they are set)."""
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  import_modules: tuple[str, ...] = ()
  """Modules to import first (dotted names, or .py files): those that register a custom
  torso the agent names (`networks.register_torso`; --torso NAME)."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/sql-<env>-seed<seed>-<time>)."""


def _mujoco(env_id: str, alpha: float, learning_rate_cooldown: float = 0.0) -> Args:
  """Continuous SQL on a MuJoCo task: rewards x 0.1 and temperature `alpha`."""
  return Args(
      learning_rate_cooldown=learning_rate_cooldown,
      train=TrainConfig.of(
          env_id=env_id,
          total_env_steps=1_000_000,
          num_envs=16,
          unroll_length=4,
          replay_capacity=250_000,
          min_replay_size=250,
          num_updates_per_train_iter=32,
          mini_batch_size=64,
          mini_batch_length=2,
          reward_scale=0.1,
          log_every=10_000,
          eval_every=10_000,
          checkpoint_every=50_000,
      ),
      agent=SqlConfig(
          alpha=alpha,
          epsilon=0.0,
          n_step=1,
          learning_rate=3e-4,
          target_update_tau=0.005,
          hidden_sizes=(128, 128),
          num_particles=16,
          num_value_samples=16,
          value_proposal_std=0.1,
          num_q_networks=2,
      ),
  )


PRESETS = {
    "cartpole": Args(),
    # DI-engine's CartPole-v0 protocol (stop when 5 greedy episodes average 195, evaluating
    # every 500 env steps), tuned for few env steps: a high replay ratio (16 updates of 128
    # windows per 32 env steps, from 8 stored sequences on), temperature 0.12, lr 3e-3.
    "cartpole-v0": Args(
        learning_rate_cooldown=0.0,
        train=TrainConfig.of(
            env_id="CartPole-v0",
            total_env_steps=100_000,
            num_envs=4,
            unroll_length=8,
            replay_capacity=5_000,
            min_replay_size=8,
            num_updates_per_train_iter=16,
            mini_batch_size=128,
            mini_batch_length=4,
            eval_every=500,
            eval_episodes=5,
            target_return=195.0,
        ),
        agent=SqlConfig(alpha=0.12, learning_rate=3e-3),
    ),
    # Continuous SQL (Haarnoja et al. 2017): 1-step targets, 8 value samples and 8 SVGD
    # particles, a (64, 64) network, 0.5 updates of 128 transitions per env step, alpha 0.2,
    # lr 1e-3, tau 0.01. Greedy returns reach about -150 after 8k to 12k env steps.
    "pendulum": Args(
        learning_rate_cooldown=0.0,
        train=TrainConfig.of(
            env_id="Pendulum-v1",
            total_env_steps=30_000,
            num_envs=4,
            unroll_length=8,
            replay_capacity=5_000,
            min_replay_size=32,
            num_updates_per_train_iter=16,
            mini_batch_size=64,
            mini_batch_length=2,
            log_every=2_000,
            eval_every=2_000,
            eval_episodes=4,
        ),
        agent=SqlConfig(
            alpha=0.2,
            n_step=1,
            learning_rate=1e-3,
            target_update_tau=0.01,
            hidden_sizes=(64, 64),
            num_particles=8,
            num_value_samples=8,
        ),
    ),
    # MuJoCo: two Q networks (clipped double Q), the soft value's proposal half uniform and
    # half around the sampler's action, (128, 128) networks, 16 value samples and 16 SVGD
    # particles, Adam 3e-4, tau 0.005, half an update per env step, a 1M-transition buffer.
    # The authors' reward scale per task (softqlearning: 30, 30, 10, 300 at alpha 1) is the
    # temperature here: alpha = 0.1 / scale, to two digits. On Hopper alpha 0.01 (a scale
    # of 10, which learns sooner) and a step size that falls to 0 over the last 10% of the
    # updates (it steadies the greedy policy's returns at the end).
    "halfcheetah": _mujoco("HalfCheetah-v4", 0.0033),
    "hopper": _mujoco("Hopper-v4", 0.01, learning_rate_cooldown=0.1),
    "walker2d": _mujoco("Walker2d-v4", 0.01),
    "ant": _mujoco("Ant-v4", 0.00033),
    # MinAtar, one compiled program: the MinAtar network, 64 environments x 8-step unrolls,
    # a 100k-transition buffer, 4 updates of 32 8-step windows per unroll (2 replayed
    # transitions per env step), 3-step soft targets, alpha 0.05, tau 0.01, Adam 1e-3.
    "minatar": Args(
        learning_rate_cooldown=0.0,
        train=TrainConfig.of(
            env_id="gymnax:Breakout-MinAtar",
            total_env_steps=10_000_000,
            num_envs=64,
            unroll_length=8,
            replay_capacity=12_500,
            min_replay_size=250,
            num_updates_per_train_iter=4,
            mini_batch_size=32,
            mini_batch_length=8,
            log_every=200_000,
            checkpoint_every=2_000_000,
            reward_scale=1.0,
        ),
        agent=SqlConfig(learning_rate=1e-3, target_update_tau=0.01),
    ),
    # Atari: the Nature CNN, 8 environments x 8-step unrolls, a 100k-transition buffer (as
    # DI-engine's SQL on Pong), one update of 32 4-step windows per unroll, 3-step soft
    # targets, alpha 0.01, epsilon 0.01, tau 0.01, Adam 3e-4.
    "atari": Args(
        learning_rate_cooldown=0.0,
        train=TrainConfig.of(
            env_id="Pong-v5",
            atari=True,
            total_env_steps=5_000_000,
            num_envs=8,
            unroll_length=8,
            replay_capacity=12_500,
            min_replay_size=500,
            num_updates_per_train_iter=1,
            mini_batch_size=32,
            mini_batch_length=4,
            log_every=20_000,
            checkpoint_every=200_000,
        ),
        agent=SqlConfig(
            torso="nature_cnn",
            alpha=0.01,
            learning_rate=3e-4,
            target_update_tau=0.01,
            max_grad_norm=10.0,
        ),
    ),
}
"""experiments/sql.py's presets (--preset NAME)."""


ENV_PRESETS = EnvPresets(
    {
        "Pendulum-v1": "pendulum",
        "gymnax:Pendulum-v1": "pendulum",
        "gymnax:*-MinAtar": "minatar",
        "HalfCheetah-v4": "halfcheetah",
        "Hopper-v4": "hopper",
        "Walker2d-v4": "walker2d",
        "Ant-v4": "ant",
    },
    atari="atari",
)
"""The preset an --env-id selects when no --preset is given (--preset none: defaults)."""


def cooled_agent(agent: SqlConfig, train: TrainConfig, cooldown: float) -> SqlConfig:
  """`agent` with its step size falling linearly to 0 over the last `cooldown` fraction of
  the run's updates (`--learning-rate-cooldown`; 0: `agent` as given). Refuses decay
  settings given beside it, which it would overwrite."""
  if isinstance(cooldown, bool) or not 0.0 <= cooldown <= 1.0:
    with refusals():
      raise ValueError(
          f"--learning-rate-cooldown must lie in [0, 1] (a fraction of the run's updates; 0: "
          f"none), got {cooldown!r}"
      )
  if not cooldown:
    return agent
  if agent.learning_rate_decay_updates or agent.learning_rate_decay_begin:
    with refusals():
      raise ValueError(
          "--learning-rate-cooldown sets --learning-rate-decay-begin and "
          "--learning-rate-decay-updates from the budget: give those two with "
          "--learning-rate-cooldown 0, or the cool-down alone"
      )
  with refusals():  # a bad config is one line
    begin, updates = train.cooldown_updates(cooldown, off_policy=True)
    common.check_derived_updates("--learning-rate-cooldown", "--learning-rate-cooldown 0",
                                 train, begin + updates)  # fmt: skip
  return dataclasses.replace(
      agent, learning_rate_decay_begin=begin, learning_rate_decay_updates=updates
  )


def run(args: Args, **run_kwargs):
  """Trains SQL as experiments/sql.py does; `run_kwargs` go to `training.run_experiment`
  (e.g. a `rollout_factory`)."""
  common.import_registrations(args)
  agent = cooled_agent(args.agent, args.train, args.learning_rate_cooldown)
  return run_experiment("sql", args, functools.partial(make_sql, config=agent), **run_kwargs)
