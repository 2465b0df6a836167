"""Greedy (discrete) / mean (continuous) evaluation on a separate env pool."""

from __future__ import annotations

from typing import Any
from typing import Callable

import numpy as np


def evaluate(
    env: Any, greedy_act: Callable, params: Any, num_episodes: int, max_steps: int = 1_000_000
) -> np.ndarray:
  """Runs the deterministic policy until each of `num_episodes` envs finished one
  episode; returns their returns [num_episodes] (raw game scores on Atari).

  `env` must have `num_envs == num_episodes`, so every episode starts from a
  fresh reset of its own environment and none is chosen by its length.
  """
  if env.num_envs != num_episodes:
    raise ValueError(f"the evaluation pool has {env.num_envs} envs, need {num_episodes}")
  env.pop_episode_stats()
  ts = env.reset()
  returns = np.full((num_episodes,), np.nan)
  for _ in range(max_steps):
    action = np.asarray(greedy_act(params, ts.observation))
    ts = env.step(action)
    stats = env.pop_episode_stats()
    for env_id, ret in zip(stats.env_id, stats.episode_return):
      if np.isnan(returns[env_id]):
        returns[env_id] = ret
    if not np.isnan(returns).any():
      return returns
  raise RuntimeError(f"evaluation did not finish {num_episodes} episodes in {max_steps} steps")
