"""Soft Q-learning on an envpool task (discrete actions).

    python experiments/sql.py --env-id CartPole-v1 --seed 0 \
        --total-env-steps 500000 --run-dir runs/sql-cartpole
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_sql
from offpolicy_ac.training import LoopConfig
from offpolicy_ac.training import parse_args
from offpolicy_ac.training import run_experiment


@dataclasses.dataclass(frozen=True)
class Args:
  loop: LoopConfig = LoopConfig(
      env_id="CartPole-v1", total_env_steps=500_000, num_envs=4, unroll_length=8,
      replay_capacity=5_000, min_replay_size=32, num_updates_per_train_iter=4,
      mini_batch_size=64, mini_batch_length=4)
  agent: SqlConfig = SqlConfig()
  resume: bool = False
  """Continue the run in --run-dir from its last checkpoint."""
  run_dir: Optional[str] = None
  """Run directory (default: runs/sql-<env>-seed<seed>-<time>)."""


PRESETS = {
    "cartpole": Args(),
    "atari": Args(loop=LoopConfig(env_id="Pong-v5", atari=True, total_env_steps=5_000_000, num_envs=8,
                        unroll_length=8, replay_capacity=4_000, min_replay_size=500,
                        num_updates_per_train_iter=1, mini_batch_size=32, mini_batch_length=4,
                        log_every=20_000, checkpoint_every=200_000),
                  agent=SqlConfig(torso="nature_cnn", alpha=0.01, learning_rate=1e-4,
                        target_update_tau=0.005, max_grad_norm=10.0)),
}


def main(args: Args):
  return run_experiment("sql", args, functools.partial(make_sql, config=args.agent))


if __name__ == "__main__":
  main(parse_args(Args, PRESETS, description=__doc__))
