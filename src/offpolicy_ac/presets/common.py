"""The task settings IMPALA's and ACER's presets share (each adds its own replay and agent
settings), and what every script's `run` does first (`import_registrations`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from offpolicy_ac.agents.base import INT32_MAX
from offpolicy_ac.agents.base import unlike_default
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


def check_derived_updates(flag: str, off: str, train: TrainConfig, updates: int) -> None:
  """Refuses a step-size schedule that `flag` derives from the budget over `updates`
  learner updates that a 32-bit count cannot hold, naming the budget and `flag` (`off`
  turns it off), not the derived field the user never gave."""
  if updates > INT32_MAX:
    raise ValueError(
        f"--total-env-steps {train.budget.total_env_steps:,}: {flag} anneals the step size "
        f"over the run's {updates:,} updates, more than the program's 32-bit count holds "
        f"(2**31): a smaller budget, or {off}"
    )


def import_registrations(args: Any) -> None:
  """Checks a script's `args` (`check_args`) and imports `args.import_modules`
  (`cli.import_modules`: the modules that register a custom torso the run names), before
  the agent is built; a module that cannot be found is refused in one line."""
  with refusals():
    check_args(args)
    import_modules("--import-modules", args.import_modules)


def check_args(args: Any) -> None:
  """Refuses (ValueError naming the field) a script's `Args` built from Python with a field
  of another type than its default's: an agent config of another algorithm, a bool given
  "no" (which would act as True), a number given as a str, a str of module names (which
  would be read letter by letter). The command line gives each its type. Something else
  than a script's `Args` (a dict) is a TypeError."""
  if not dataclasses.is_dataclass(args) or isinstance(args, type) or not hasattr(args, "train"):
    raise TypeError(f"a preset's run takes its Args (for example presets.impala.Args("
                    f"run_dir=...)), got {type(args).__name__}")  # fmt: skip
  for f in dataclasses.fields(args):
    value = getattr(args, f.name)
    default = f.default if f.default is not dataclasses.MISSING else None
    if f.default_factory is not dataclasses.MISSING:
      default = f.default_factory()
    if default is None or isinstance(default, (TrainConfig, str)):
      continue  # Optional fields: their own checks; paths may be Paths; the TrainConfig: `validate`
    said = unlike_default(value, default)
    if said:
      raise ValueError(f"{f.name} must be {said}, got {value!r}")
