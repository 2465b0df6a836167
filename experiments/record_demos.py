"""Records demonstrations with a finished run's final parameters (greedy policy).

    python experiments/record_demos.py --run-dir runs/sql-cartpole --episodes 10 \
        --out demos/cartpole.npz
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import numpy as np
import tyro

from offpolicy_ac import demos as demos_lib
from offpolicy_ac.agents.registry import make_agent
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import load_params
from offpolicy_ac.training.learner import make_transformer
from offpolicy_ac.training.sources import make_env


@dataclasses.dataclass(frozen=True)
class Args:
  run_dir: str
  """A finished run (holds config.json and final_params.msgpack)."""
  out: str
  """Output .npz file."""
  episodes: int = 10
  """Episodes to record (one per environment, each from a fresh reset)."""
  seed: int = 12345
  """Seed of the recording environments."""


def main(args: Args) -> dict:
  run_dir = pathlib.Path(args.run_dir)
  config = json.loads((run_dir / "config.json").read_text())
  params_path = run_dir / "final_params.msgpack"
  if not params_path.exists():
    raise FileNotFoundError(f"{params_path} not found: is {run_dir} a finished run?")
  train = TrainConfig.from_dict(config["config"]["train"])
  env = make_env(train, args.episodes, args.seed, train=False)
  agent = make_agent(config["algorithm"], env.spec, config["config"]["agent"])
  params = load_params(params_path, agent.init(jax.random.PRNGKey(0)).params)
  transformer = make_transformer(env.spec, train)
  transform = transformer.init()
  if (run_dir / "final_transform.msgpack").exists():  # observation statistics
    transform = load_params(run_dir / "final_transform.msgpack", transform)
  greedy = jax.jit(lambda obs: agent.greedy_act(params, transformer.observe(transform, obs)))
  demos = demos_lib.record_episodes(env, greedy, args.episodes)
  env.close()
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  demos_lib.save_demos(args.out, demos, env_id=train.env.env_id)
  ends = np.cumsum(demos["episode_lengths"])
  starts = np.concatenate([[0], ends[:-1]])
  returns = [float(demos["reward"][s + 1 : e].sum()) for s, e in zip(starts, ends)]
  print(
      f"recorded {args.episodes} episodes of {train.env.env_id} to {args.out}: "
      f"returns {returns} (mean {np.mean(returns):.1f})"
  )
  return demos


if __name__ == "__main__":
  main(tyro.cli(Args))
