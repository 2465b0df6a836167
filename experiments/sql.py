"""Soft Q-learning on an envpool task or a JAX environment (discrete or continuous actions).

    python experiments/sql.py --env-id CartPole-v1 --seed 0 \
        --total-env-steps 500000 --run-dir runs/sql-cartpole
    python experiments/sql.py --preset cartpole-v0 --seed 0  # DI-engine's v0 protocol
    python experiments/sql.py --preset pendulum              # continuous: SVGD sampler
    python experiments/sql.py --preset pendulum --env-id gymnax:Pendulum-v1   # compiled
    python experiments/sql.py --env-id HalfCheetah-v4 --num-seeds 3   # halfcheetah preset
    python experiments/sql.py --env-id gymnax:Breakout-MinAtar --num-seeds 5   # minatar

Discrete or continuous SQL is picked from the task's action space (`agents.make_sql`).

Preset cartpole-v0: DI-engine's CartPole-v0 protocol (stop when 5 greedy episodes
average 195, evaluating every 500 env steps), tuned for few env steps: a high
replay ratio (16 updates of 128 windows per 32 env steps, training from 8 stored
sequences on), temperature 0.12 and step size 3e-3.

Preset pendulum: continuous SQL (Haarnoja et al. 2017) with 1-step targets, 8 value
samples and 8 SVGD particles (half moved), a (64, 64) network, 0.5 updates of 128
transitions per env step, alpha 0.2, step size 1e-3, target tau 0.01. Greedy returns
reach about -150 after 8k to 12k env steps (5 of 5 seeds on Pendulum-v1; alpha 0.05 to 1
learnt alike on gymnax:Pendulum-v1, step size 3e-4 or tau 0.05 slower).

Preset minatar (selected by gymnax:*-MinAtar), one compiled program: the MinAtar network,
64 environments x 8-step unrolls, a 100k-transition buffer, 4 updates of 32 8-step windows
per unroll (2 replayed transitions per env step), 3-step soft targets, alpha 0.05, Polyak tau
0.01, Adam 1e-3. A 1-seed screen of step sizes {1e-3, 3e-3} at 1M env steps split (greedy
returns: Breakout 23.6 against 11.2, Asterix 27.2 against 48.8); 1e-3 is kept for Breakout.

Preset atari (selected by an Atari task; Pong-v5 unless --env-id says otherwise): the Nature
CNN, 8 environments x 8-step unrolls, a 100k-transition buffer (as DI-engine's SQL on Pong),
one update of 32 4-step windows per unroll (2 replayed transitions per env step), 3-step
soft targets, alpha 0.01, epsilon 0.01, Polyak tau 0.01, Adam 3e-4. On Breakout-v5 with the
small_cnn torso it scores 2.4 times a random policy after 800k env steps
(tests/experiments/test_atari_learning.py); with Adam 1e-4, tau 0.005 and a 32k buffer the
score rose to 1.9 times random and fell back to 1.1 to 1.3 times.

Presets halfcheetah, hopper, walker2d, ant (selected by HalfCheetah-v4, Hopper-v4,
Walker2d-v4, Ant-v4): sqil.py's halfcheetah settings, learning from rewards. Two Q networks
(clipped double Q), the soft value's proposal half uniform and half around the sampler's
action, Polyak tau 0.005, (128, 128) networks, 16 value samples and 16 SVGD particles, Adam
3e-4, and half an update per env step (32 updates of 64 windows of 2 transitions per 64 env
steps, 16 environments), from a 1M-transition buffer. The authors' reward scale per task
(softqlearning's examples/mujoco_all_sql.py: 30, 30, 10 and 300, at alpha 1) is the
temperature here: rewards x 0.1 and alpha = 0.1 / scale (their other settings: one update of
128 transitions per env step, one Q network), except on Hopper: alpha 0.01 (a scale of 10
where theirs is 30), which learns Hopper-v4 sooner than 0.0033 and 0.001 do, and a step
size that falls linearly to 0 over the last 10% of the updates (from 900k env steps), which
steadies the greedy policy's returns at the end of the run. docs/benchmarks.md has the runs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_sql
from offpolicy_ac.training import EnvPresets
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import exit_process
from offpolicy_ac.training import parse_args
from offpolicy_ac.training import run_experiment


@dataclasses.dataclass(frozen=True)
class Args:
  train: TrainConfig = TrainConfig.of(
      env_id="CartPole-v1",
      total_env_steps=500_000,
      num_envs=4,
      unroll_length=8,
      replay_capacity=5_000,
      min_replay_size=32,
      num_updates_per_train_iter=4,
      mini_batch_size=64,
      mini_batch_length=4,
  )
  agent: SqlConfig = SqlConfig()
  learning_rate_cooldown: float = 0.0
  """> 0: the step size falls linearly to 0 over this last fraction of the run's updates
  (1: over the whole run); sets --learning-rate-decay-begin and --learning-rate-decay-updates
  from the budget. 0: as those two say (by default a constant step size)."""
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/sql-<env>-seed<seed>-<time>)."""


def _mujoco(env_id: str, alpha: float, learning_rate_cooldown: float = 0.0) -> Args:
  """Continuous SQL on a MuJoCo task (see the module docstring): rewards x 0.1, temperature
  `alpha`, the authors' reward scale for the task as alpha = 0.1 / reward scale."""
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
    "cartpole-v0": Args(
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
    "pendulum": Args(
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
    # alpha = 0.1 / the authors' reward scale (30, 30, 10, 300), to two digits; on Hopper
    # 0.1 / 10 and a cool-down over the last 10% of the updates (see the module docstring).
    "halfcheetah": _mujoco("HalfCheetah-v4", 0.0033),
    "hopper": _mujoco("Hopper-v4", 0.01, learning_rate_cooldown=0.1),
    "walker2d": _mujoco("Walker2d-v4", 0.01),
    "ant": _mujoco("Ant-v4", 0.00033),
    # MinAtar (Young & Tian 2019): see the module docstring.
    "minatar": Args(
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
    "atari": Args(
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


def main(args: Args, **run_kwargs):
  """Trains; `run_kwargs` go to `run_experiment` (e.g. a `rollout_factory`)."""
  agent = args.agent
  if args.learning_rate_cooldown:
    begin, updates = args.train.cooldown_updates(args.learning_rate_cooldown, off_policy=True)
    agent = dataclasses.replace(
        agent, learning_rate_decay_begin=begin, learning_rate_decay_updates=updates
    )
  return run_experiment("sql", args, functools.partial(make_sql, config=agent), **run_kwargs)


if __name__ == "__main__":
  main(parse_args(Args, PRESETS, description=__doc__, env_presets=ENV_PRESETS))
  exit_process()  # skip the interpreter's slow teardown (see its docstring)
