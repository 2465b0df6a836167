"""ACER's settings: the script's `Args`, its presets, and `run`.

    from offpolicy_ac.presets import acer
    acer.run(acer.PRESETS["pendulum"])          # what experiments/acer.py --preset pendulum runs

`--replay-ratio` sets the replayed updates after each on-policy update: the loop's
`num_updates_per_train_iter` is derived from it (`Args.resolved_train`), and the command line
refuses `--num-updates-per-train-iter` (`Args.DERIVED_FLAGS`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar
from typing import Optional

from offpolicy_ac.agents import AcerConfig
from offpolicy_ac.agents import make_acer
from offpolicy_ac.agents.base import check_int32
from offpolicy_ac.cli import EnvPresets
from offpolicy_ac.presets import common
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import run_experiment

_DEFAULT_UPDATES = TrainConfig().replay.num_updates_per_train_iter


@dataclasses.dataclass(frozen=True)
class Args:
  """experiments/acer.py's command line."""

  train: TrainConfig = TrainConfig.of(
      env_id="CartPole-v1",
      total_env_steps=500_000,
      num_envs=8,
      unroll_length=16,
      replay_capacity=1_000,
      min_replay_size=64,
      mini_batch_size=32,
      mini_batch_length=16,
      reward_scale=0.1,
  )
  agent: AcerConfig = AcerConfig()
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  import_modules: tuple[str, ...] = ()
  """Modules to import first (dotted names, or .py files): those that register a custom
  torso the agent names (`networks.register_torso`; --torso NAME)."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/acer-<env>-seed<seed>-<time>)."""

  DERIVED_FLAGS: ClassVar[dict[str, str]] = {
      "--num-updates-per-train-iter": "ACER sets the replayed updates per iteration from "
      "--replay-ratio: set --replay-ratio instead"
  }
  """Flags the command line refuses (`cli.parse_args`): the script sets these fields."""

  def __post_init__(self):
    if not isinstance(self.agent, AcerConfig):
      raise ValueError(f"agent must be an AcerConfig, got {self.agent!r}")
    # Raised while the command line is parsed, before the script can translate field names
    # into flags (`cli.in_flag_terms`): the message names only the flags users type.
    if self.agent.replay_ratio < 1:
      raise ValueError(
          "--replay-ratio must be at least 1 (the replayed updates after each on-policy "
          "update, of which the training loop runs at least one), got "
          f"{self.agent.replay_ratio}"
      )
    check_int32("--replay-ratio", self.agent.replay_ratio)  # the loop's updates per iteration
    n = self.train.replay.num_updates_per_train_iter
    if n not in (_DEFAULT_UPDATES, self.agent.replay_ratio):
      raise ValueError(
          f"--num-updates-per-train-iter {n} conflicts with --replay-ratio "
          f"{self.agent.replay_ratio}: ACER derives the loop's updates per iteration "
          "from the replay ratio; set --replay-ratio only"
      )

  @property
  def resolved_train(self) -> TrainConfig:
    """The config actually run: replayed updates per iteration = replay_ratio."""
    return self.train.replace(num_updates_per_train_iter=self.agent.replay_ratio)


# Continuous control: observation normalisation, 16 envs x 16-step unrolls, a 2,000-sequence
# buffer (125 unrolls, 32k transitions), 4 replayed updates per on-policy update, Adam 3e-4.
_MUJOCO = Args(
    train=Args().train.replace(
        env_id="HalfCheetah-v4",
        total_env_steps=1_000_000,
        num_envs=16,
        replay_capacity=2_000,
        normalize_observations=True,
        log_every=50_000,
        checkpoint_every=250_000,
    ),
    agent=AcerConfig(learning_rate=3e-4),
)

PRESETS = {
    "cartpole": Args(),
    "pendulum": Args(
        train=Args().train.replace(env_id="Pendulum-v1", total_env_steps=300_000, log_every=10_000)
    ),
    "mujoco": _MUJOCO,
    # HalfCheetah-v4: the mujoco preset with Adam 1e-3 and entropy weight 0.001 (with 3e-4
    # and 0.01 the policy's standard deviation kept growing); on Hopper-v4 and Walker2d-v4
    # these did worse than the mujoco preset (results/notes/mujoco.md).
    "halfcheetah": dataclasses.replace(
        _MUJOCO,
        agent=dataclasses.replace(_MUJOCO.agent, learning_rate=1e-3, entropy_weight=0.001),
    ),
    # brax's halfcheetah: the mujoco preset with 64 environments per learner and a buffer
    # four times as large (the same 125 unrolls of history).
    "brax": dataclasses.replace(
        _MUJOCO,
        train=common.on_brax_halfcheetah(
            _MUJOCO.train, total_env_steps=20_000_000, num_envs=64, replay_capacity=8_000
        ),
    ),
    # MinAtar: the MinAtar network (auto torso) shared by policy and Q heads, an
    # 80k-transition buffer, one replayed update per on-policy update, lr 3e-3.
    "minatar": Args(
        train=common.MINATAR.replace(
            replay_capacity=5_000,
            min_replay_size=64,
            mini_batch_size=32,
            mini_batch_length=16,
            checkpoint_every=2_000_000,
        ),
        agent=AcerConfig(shared_torso=True, replay_ratio=1, learning_rate=3e-3),
    ),
    # The paper's Atari network and the OpenAI-baselines ACER settings (a 50k-step buffer,
    # 10k steps before replay) but the optimizer; not tuned here.
    "atari": Args(
        train=common.ATARI.replace(
            replay_capacity=2_500, min_replay_size=500, mini_batch_size=16, mini_batch_length=20
        ),
        # Adam, not baselines' RMSProp (7e-4, eps 1e-5), whose policy stayed uniform on
        # Breakout-v5 for 460k env steps.
        agent=AcerConfig(
            torso="nature_cnn",
            shared_torso=True,
            optimizer="adam",
            learning_rate=7e-4,
            max_grad_norm=10.0,
        ),
    ),
}
"""experiments/acer.py's presets (--preset NAME)."""


ENV_PRESETS = EnvPresets(
    {
        "Pendulum-v1": "pendulum",
        "gymnax:*-MinAtar": "minatar",
        "HalfCheetah-v4": "halfcheetah",
        "Hopper-v4": "mujoco",
        "Walker2d-v4": "mujoco",
        "Ant-v4": "mujoco",
        "brax:halfcheetah": "brax",
    },
    atari="atari",
)
"""The preset an --env-id selects when no --preset is given (--preset none: defaults)."""


def run(args: Args, **run_kwargs):
  """Trains ACER as experiments/acer.py does; `run_kwargs` go to
  `training.run_experiment` (e.g. a `rollout_factory`)."""
  common.import_registrations(args)
  resolved = dataclasses.replace(args, train=args.resolved_train)
  return run_experiment(
      "acer", resolved, functools.partial(make_acer, config=args.agent), **run_kwargs
  )
