"""Greedy (discrete) / mean (continuous) evaluation on a separate env pool.

The protocol of the in-training evaluation and of `experiments/evaluate.py`: N episodes,
each on its own freshly reset environment of an N-environment pool (so no episode is
picked for being short), with the policy's deterministic action; an episode ends at the
LAST step its episode statistics count, time-limit truncations included. Atari pools use
evaluation settings: raw scores of whole games; a life loss ends an episode to the agent
as in training, so that the environment serves after it as it does in training, and an
evaluation episode is the whole game. `render_episode` (in memory) and `RenderedEpisode`
(streamed) play and render episode 0 of the same protocol.
`describe_protocol` says all of it in one line, to print beside a score.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Iterator

import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.envs import LAST
from offpolicy_ac.training.config import MAX_EPISODES
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.sources import task_kwargs

POOL_SIZE = 256
"""The most environments `episode_pools` plays at once (an Atari emulator holds megabytes)."""


class EpisodeLimitError(RuntimeError):
  """The episodes did not end within the steps allowed (`max_steps`)."""


class EvaluationStopped(Exception):
  """A stop request came while `evaluate` played its episodes: they are left unfinished
  (an Atari evaluation can take longer than a scheduler's grace period)."""


def describe_protocol(config: TrainConfig, num_episodes: int | None = None) -> str:
  """The evaluation protocol of a run's scores in one line: the policy, the episodes, the
  schedule (in-training evaluation; pass `num_episodes` for a one-off evaluation) and, on
  Atari, how the games are played (`envs.atari_protocol`: sticky actions, no-op starts,
  action set, episodic life, frames)."""
  if num_episodes is None:
    episodes = config.eval.eval_episodes * config.parallel.num_processes  # each its own
    interval = config.eval_interval
    when = f" every {interval:,} env steps" if interval else " (evaluation off)"
    step = config.steps_per_iteration
    if interval and interval < step and config.fixed_iterations:  # one at each iteration
      when = (f" every iteration of {step:,} env steps (the interval set, {interval:,} env "
              "steps, is shorter)")  # fmt: skip
    if interval > config.budget.total_env_steps:  # only the one at the end of the budget
      when = " at the end of the run"
  else:
    episodes, when = num_episodes, ""
  text = (
      f"greedy policy, mean return of {episodes} episode{'s' * (episodes != 1)}, each on its "
      f"own freshly reset environment{when}"
  )
  if config.env.atari:
    protocol = envs.atari_protocol(config.env.env_id, **task_kwargs(config))
    return f"{protocol.describe()}; {text}"
  if config.compiled:  # a JAX environment: its own time limit, no envpool
    steps = envs.make_functional(config.env.env_id, **task_kwargs(config)).max_episode_steps
  else:
    steps = envs.time_limit(config.env.env_id, **task_kwargs(config))
  return f"{config.env.env_id}: sum of rewards per episode, time limit {steps:,} env steps; {text}"


def episode_pools(num_episodes: int, seed: int) -> list[tuple[int, int]]:
  """The pools that play `num_episodes` episodes, one per environment, in bounded memory:
  (environments, pool seed) of pools of at most `POOL_SIZE` environments, pool k seeded
  `seed + k * POOL_SIZE`. On envpool tasks, whose environment i of a pool of seed s is
  seeded s + i, they play the episodes of one pool of `num_episodes` environments.

  Raises:
    ValueError: `num_episodes` outside [1, `MAX_EPISODES`].
  """
  if not 1 <= num_episodes <= MAX_EPISODES:
    raise ValueError(f"--episodes must be in [1, {MAX_EPISODES:,}], got {num_episodes}")
  return [(min(POOL_SIZE, num_episodes - first), seed + first)
          for first in range(0, num_episodes, POOL_SIZE)]  # fmt: skip


def evaluate(
    env: Any,
    greedy_act: Callable,
    params: Any,
    num_episodes: int,
    max_steps: int = 1_000_000,
    should_stop: Callable[[], bool] | None = None,
) -> np.ndarray:
  """Runs the deterministic policy until each of `num_episodes` envs finished one
  episode; returns their returns [num_episodes] (raw game scores on Atari).

  `env` must have `num_envs == num_episodes`, so every episode starts from a
  fresh reset of its own environment and none is chosen by its length. `should_stop`,
  polled before each step, ends the evaluation with `EvaluationStopped` when True.
  """
  if not isinstance(num_episodes, int) or isinstance(num_episodes, bool) or num_episodes < 1:
    raise ValueError(f"num_episodes must be a positive int, got {num_episodes!r}")
  if env.num_envs != num_episodes:
    raise ValueError(f"the evaluation pool has {env.num_envs} envs, need {num_episodes}")
  env.pop_episode_stats()
  ts = env.reset()
  returns = np.full((num_episodes,), np.nan)
  for _ in range(max_steps):
    if should_stop is not None and should_stop():
      raise EvaluationStopped(f"stopped with {int(np.isnan(returns).sum())} of {num_episodes} "
                              "evaluation episodes unfinished")  # fmt: skip
    action = np.asarray(greedy_act(params, ts.observation))
    ts = env.step(action)
    stats = env.pop_episode_stats()
    for env_id, ret in zip(stats.env_id, stats.episode_return):
      if np.isnan(returns[env_id]):
        returns[env_id] = ret
    if not np.isnan(returns).any():
      return returns
  raise EpisodeLimitError(f"evaluation did not finish {num_episodes} episodes in {max_steps} steps")


class RenderedEpisode:
  """One episode of the deterministic policy, rendered as it is played: iterating yields
  its frames [H, W, 3] uint8, one at a time (the reset, then the state after each step), so
  that a writer (`write_video`) holds one frame, not the episode's (a 27,000-step Atari
  game is 2.7 GB of frames). After the iteration, `episode_return` is the episode's return
  (the raw game score on Atari) and `num_frames` the frames yielded.

  `env` is a pool of one environment made with `render_mode="rgb_array"`; envpool seeds
  environment i of a pool with `seed + i`, so with the same seed this is the episode
  `evaluate` plays on its environment 0 (evaluate.py passes both `pool_seed(seed,
  "evaluate")`); continuous actions up to float rounding, the policy acting on a batch of
  one observation. The episode runs from the reset (FIRST) to the LAST step that ends it as
  `evaluate` scores it (the environment's episode statistics: on Atari, the LAST step of
  the game, not of a life), a time-limit truncation included; `EpisodeLimitError` after
  `max_steps` steps. On Atari, where a lost life ends an episode as in training, the step
  after it is that life's reset (FIRE pressed), one frame more for each lost life.
  """

  def __init__(self, env: Any, greedy_act: Callable, params: Any, max_steps: int = 1_000_000):
    if env.num_envs != 1:
      raise ValueError(f"a rendered episode plays one environment, the pool has {env.num_envs}")
    self.env, self.greedy_act, self.params, self.max_steps = env, greedy_act, params, max_steps
    self.episode_return: float | None = None
    self.num_frames = 0

  def __iter__(self) -> Iterator[np.ndarray]:
    env = self.env
    env.pop_episode_stats()
    ts = env.reset()
    self.num_frames = 1
    yield env.render()[0]
    for _ in range(self.max_steps):
      ts = env.step(np.asarray(self.greedy_act(self.params, ts.observation)))
      self.num_frames += 1
      yield env.render()[0]
      stats = env.pop_episode_stats() if ts.step_type[0] == LAST else None
      if stats is not None and len(stats.episode_return):
        self.episode_return = float(stats.episode_return[0])
        return
    raise EpisodeLimitError(f"the episode did not finish in {self.max_steps} steps")


def render_episode(
    env: Any, greedy_act: Callable, params: Any, max_steps: int = 1_000_000
) -> tuple[np.ndarray, float]:
  """Plays one episode of the deterministic policy and renders every step of it, in
  memory (`RenderedEpisode` streams them instead; see there for `env` and the episode).

  Returns:
    (frames [L + 1, H, W, 3] uint8: the reset and the state after each of the L steps
    played, on Atari a reset step after each lost life included; the episode's return, the
    raw game score on Atari).
  """
  episode = RenderedEpisode(env, greedy_act, params, max_steps)
  frames = np.stack(list(episode))
  return frames, episode.episode_return
