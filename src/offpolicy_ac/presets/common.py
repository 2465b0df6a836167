"""The task settings IMPALA's and ACER's presets share (each adds its own replay and agent
settings), and what every script's `run` does first (`import_registrations`)."""

from __future__ import annotations

from typing import Any

from offpolicy_ac.cli import import_modules
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import refusals

ATARI = TrainConfig.of(
    env_id="Pong-v5",
    atari=True,
    total_env_steps=10_000_000,
    num_envs=16,
    unroll_length=20,
    log_every=20_000,
    checkpoint_every=200_000,
    reward_scale=1.0,
)
"""Atari (envpool's v5 tasks, Pong unless --env-id says otherwise): 16 environments x
20-step unrolls (IMPALA's and OpenAI baselines' ACER settings); envpool clips the training
rewards to {-1, 0, 1}, and returns are reported as raw game scores."""

MINATAR = TrainConfig.of(
    env_id="gymnax:Breakout-MinAtar",
    total_env_steps=10_000_000,
    num_envs=64,
    unroll_length=16,
    log_every=200_000,
    checkpoint_every=1_000_000,
    reward_scale=1.0,
)
"""MinAtar (Young & Tian 2019), one compiled program: 64 environments x 16-step unrolls,
10M env steps, raw game rewards."""


def on_brax_halfcheetah(train: TrainConfig, **fields) -> TrainConfig:
  """`train` on brax's halfcheetah (one compiled program, meant for a GPU), logged every 1M
  and checkpointed every 5M env steps, with `fields` (budget, pool size, ...) changed."""
  return train.replace(
      env_id="brax:halfcheetah", log_every=1_000_000, checkpoint_every=5_000_000, **fields
  )


def import_registrations(args: Any) -> None:
  """Imports `args.import_modules` (`cli.import_modules`: the modules that register a
  custom torso the run names), before the agent is built; a module that cannot be found is
  refused in one line."""
  with refusals():
    import_modules("--import-modules", args.import_modules)
