"""IMPALA (V-trace actor-critic) on an envpool task.

    python experiments/impala.py --env-id CartPole-v1 --seed 0 \
        --total-env-steps 500000 --run-dir runs/impala-cartpole

Defaults learn CartPole-v1 on a 2-core CPU. See `--help` for every field.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import tyro

from offpolicy_ac.agents import ImpalaConfig
from offpolicy_ac.agents import make_impala
from offpolicy_ac.training import LoopConfig
from offpolicy_ac.training import run_experiment


@dataclasses.dataclass(frozen=True)
class Args:
  loop: LoopConfig = LoopConfig(env_id="CartPole-v1", total_env_steps=500_000,
                                num_envs=16, unroll_length=16)
  agent: ImpalaConfig = ImpalaConfig()
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/impala-<env>-seed<seed>-<time>)."""


def main(args: Args):
  return run_experiment("impala", args, functools.partial(make_impala, config=args.agent))


if __name__ == "__main__":
  main(tyro.cli(Args, config=(tyro.conf.OmitArgPrefixes,)))
