"""Records demonstrations with a finished run's final parameters (`load_run`).

    python experiments/record_demos.py --run-dir runs/sql-cartpole --episodes 10 \
        --out demos/cartpole.npz

`--policy behaviour` samples actions as the run trained (for Atari players whose greedy
policy stalls: a Breakout player that never serves plays until the time limit).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Literal

import numpy as np
import tyro

from offpolicy_ac import demos as demos_lib
from offpolicy_ac.training import load_run


@dataclasses.dataclass(frozen=True)
class Args:
  run_dir: str
  """A finished run (holds config.json and final_params.msgpack, or checkpoints)."""
  out: str
  """Output .npz file."""
  episodes: int = 10
  """Episodes to record (one per environment, each from a fresh reset)."""
  seed: int = 12345
  """Seed of the recording environments (and of the behaviour policy's actions)."""
  policy: Literal["greedy", "behaviour"] = "greedy"
  """'greedy': the greedy (discrete) or mean (continuous) action, as the in-training
  evaluation acts; 'behaviour': actions sampled from the policy the run trained with."""


def main(args: Args) -> dict:
  run = load_run(args.run_dir)
  env_id = run.config.env.env_id
  with run.make_env(args.episodes, args.seed) as env:
    policy = run.greedy_policy() if args.policy == "greedy" else run.behaviour_policy(args.seed)
    demos = demos_lib.record_episodes(env, policy, args.episodes)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  demos_lib.save_demos(args.out, demos, env_id=env_id)
  ends = np.cumsum(demos["episode_lengths"])
  starts = np.concatenate([[0], ends[:-1]])
  returns = [float(demos["reward"][s + 1 : e].sum()) for s, e in zip(starts, ends)]
  print(
      f"recorded {args.episodes} episodes of {env_id} ({args.policy} policy) to {args.out}: "
      f"returns {returns} (mean {np.mean(returns):.1f})"
  )
  return demos


if __name__ == "__main__":
  main(tyro.cli(Args))
