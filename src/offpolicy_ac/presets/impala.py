"""IMPALA's settings: the script's `Args`, its presets, and `run`.

from offpolicy_ac.presets import impala
impala.run(impala.PRESETS["pendulum"])      # what experiments/impala.py --preset pendulum runs
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from offpolicy_ac.agents import ImpalaConfig
from offpolicy_ac.agents import make_impala
from offpolicy_ac.cli import EnvPresets
from offpolicy_ac.presets import common
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import refusals
from offpolicy_ac.training import run_experiment


@dataclasses.dataclass(frozen=True)
class Args:
  """experiments/impala.py's command line."""

  train: TrainConfig = TrainConfig.of(
      env_id="CartPole-v1", total_env_steps=500_000, num_envs=16, unroll_length=16,
      reward_scale=0.1,
  )  # fmt: skip
  agent: ImpalaConfig = ImpalaConfig()
  anneal_learning_rate: bool = False
  """Anneal the learning rate linearly to 0 over the run, as PPO does. It sets
  --learning-rate-decay-updates from the budget."""
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  import_modules: tuple[str, ...] = ()
  """Modules to import first (dotted names, or .py files): those that register a custom
  torso the agent names (`networks.register_torso`; --torso NAME)."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/impala-<env>-seed<seed>-<time>)."""


# MuJoCo (envpool's v4 tasks), the paper's policy gradient on each fresh unroll: a torso
# each for policy and value (tanh MLPs 64-64, as PPO's), observation normalisation, no
# entropy bonus; lr 1e-3 and lambda 0.95 led a 2-seed sweep on HalfCheetah-v4.
_MUJOCO_PG = Args(
    train=TrainConfig.of(
        env_id="HalfCheetah-v4",
        total_env_steps=1_000_000,
        num_envs=16,
        unroll_length=32,
        normalize_observations=True,
        log_every=50_000,
        checkpoint_every=250_000,
        reward_scale=0.1,
    ),
    agent=ImpalaConfig(shared_torso=False, entropy_weight=0.0, lambda_=0.95, learning_rate=1e-3),
)

# MuJoCo, reusing each unroll: its sequences stay in replay for two unrolls and 32 updates
# of 4 replayed sequences follow each (every transition is learned from about 8 times);
# the policy term is PPO's clipped surrogate on V-trace's advantages (IMPACT), so that
# reuse cannot drift the policy far from the one that acted; Adam 3e-4 annealed to 0
# (the screens: results/notes/mujoco.md).
_MUJOCO = dataclasses.replace(
    _MUJOCO_PG,
    train=_MUJOCO_PG.train.replace(
        replay_capacity=32,
        min_replay_size=16,
        num_updates_per_train_iter=32,
        mini_batch_size=4,
        mini_batch_length=32,
    ),
    agent=dataclasses.replace(
        _MUJOCO_PG.agent, use_replay=True, surrogate_clip=0.2, learning_rate=3e-4
    ),
    anneal_learning_rate=True,
)


PRESETS = {
    "cartpole": Args(),
    # Pendulum: discount 0.9 and lambda 0.95 (as rl-zoo's A2C/PPO settings); no entropy
    # bonus (with it the Gaussian's std grew and the runs stalled near -1400); the step
    # size annealed to 0 (at a constant one, 3 of 5 seeds' final greedy policies scored
    # -323 to -647; annealed, all 5 -204 to -220: results/defaults/).
    "pendulum": Args(
        train=TrainConfig.of(
            env_id="Pendulum-v1",
            total_env_steps=1_000_000,
            num_envs=16,
            unroll_length=16,
            log_every=20_000,
            reward_scale=0.1,
        ),
        agent=ImpalaConfig(gamma=0.9, lambda_=0.95, entropy_weight=0.0),
        anneal_learning_rate=True,
    ),
    # JAX environments: the whole run is one compiled program (training.make_train).
    # 100k env steps take about a second: checkpoint that often. The run trains in less
    # time than its program compiles for speed: compile it for startup. The step size is
    # annealed to 0 over the 200k env steps: at a constant one, 1 of 5 seeds' final greedy
    # policy scored 292 after 500k (results/defaults/).
    "gymnax-cartpole": Args(
        train=TrainConfig.of(
            env_id="gymnax:CartPole-v1",
            total_env_steps=200_000,
            num_envs=16,
            unroll_length=16,
            log_every=5_000,
            eval_every=5_000,
            checkpoint_every=100_000,
            reward_scale=0.1,
            compile_for="startup",
        ),
        anneal_learning_rate=True,
    ),
    # MinAtar: the MinAtar network (auto torso), lambda 0.95, lr 3e-3 (the best of
    # 3e-4, 1e-3, 3e-3 on Breakout) annealed to 0 over the run, entropy weight 0.03. (At a
    # constant step size the greedy policy swings between evaluations, and 1 of 5 seeds'
    # final policies scored 46 on SpaceInvaders. At entropy weight 0.01 the Breakout
    # policies are nearly deterministic by 1M env steps and 4 of 5 seeds sit on plateaus,
    # IQM 24.3; at 0.03, 32.8, and Asterix 73.3 instead of 67.4: results/notes/minatar.md.)
    "minatar": Args(
        train=common.MINATAR,
        agent=ImpalaConfig(lambda_=0.95, learning_rate=3e-3, entropy_weight=0.03),
        anneal_learning_rate=True,
    ),
    "mujoco": _MUJOCO,
    "mujoco-pg": _MUJOCO_PG,
    # brax's halfcheetah: mujoco-pg with 128 environments per learner (4,096 transitions
    # per update) and brax's own PPO budget.
    "brax": dataclasses.replace(
        _MUJOCO_PG,
        train=common.on_brax_halfcheetah(
            _MUJOCO_PG.train, total_env_steps=50_000_000, num_envs=128
        ),
    ),
    "atari": Args(
        train=common.ATARI,
        # Adam, not the paper's RMSProp(eps=0.01): our losses are means over [T, B], not
        # sums, and optax's eps sits inside the square root, so RMSProp's steps would be
        # ~1e-2 x the gradient and the policy would stay uniform.
        agent=ImpalaConfig(
            torso="nature_cnn",
            optimizer="adam",
            learning_rate=6e-4,
            optimizer_eps=1e-5,
            max_grad_norm=0.5,
        ),
    ),
}
"""experiments/impala.py's presets (--preset NAME)."""


ENV_PRESETS = EnvPresets(
    {
        "Pendulum-v1": "pendulum",
        "gymnax:CartPole-v1": "gymnax-cartpole",
        "gymnax:*-MinAtar": "minatar",
        "HalfCheetah-v4": "mujoco",
        "Hopper-v4": "mujoco",
        "Walker2d-v4": "mujoco",
        "Ant-v4": "mujoco",
        "brax:halfcheetah": "brax",
    },
    atari="atari",
)
"""The preset an --env-id selects when no --preset is given (--preset none: defaults)."""


def run(args: Args, **run_kwargs):
  """Trains IMPALA as experiments/impala.py does; `run_kwargs` go to
  `training.run_experiment` (e.g. a `rollout_factory`)."""
  common.import_registrations(args)
  agent = args.agent
  if args.anneal_learning_rate:
    with refusals():  # a bad config is one line
      if agent.learning_rate_decay_updates:
        raise ValueError(
            "--anneal-learning-rate sets --learning-rate-decay-updates from the budget: give "
            "one of the two (a preset that anneals: --no-anneal-learning-rate)"
        )
      updates = args.train.planned_updates(off_policy=agent.use_replay)
      common.check_derived_updates("--anneal-learning-rate", "--no-anneal-learning-rate",
                                   args.train, updates)  # fmt: skip
    agent = dataclasses.replace(agent, learning_rate_decay_updates=updates)
  return run_experiment("impala", args, functools.partial(make_impala, config=agent), **run_kwargs)
