"""How episodes are played and scored, read off envpool's own configuration.

Atari scores are only comparable under the same protocol (Machado et al. 2018, "Revisiting
the Arcade Learning Environment", JAIR 61): sticky actions or not, a life loss ending an
episode or not, no-op starts, the full or the minimal action set, clipped or raw rewards,
and how many frames an env step and an episode are. `atari_protocol` reports each of them
as envpool will apply them, for the settings `make_atari` gets, so a score can be printed
with the protocol that produced it. `time_limit` gives any task's episode time limit.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

from offpolicy_ac.envs import _envpool_env


class AtariProtocol(NamedTuple):
  """How a task's Atari episodes are played and scored.

  Attributes:
    task_id: the envpool task id, e.g. "Pong-v5".
    sticky_action_probability: the probability that the emulator repeats the previous
      action instead of the agent's (0: deterministic emulator, "no sticky actions").
    full_action_space: all 18 actions (True) or the game's minimal set (False).
    num_actions: the size of the action set the agent chooses from.
    noop_max: episodes start with up to this many no-op actions (a random number).
    episodic_life: whether a life loss ends an episode (LAST, discount 0; the game goes
      on), in training and evaluation alike; scores are of whole games either way.
    reward_clip: whether training rewards are clipped to {-1, 0, 1}; scores are always
      raw game scores of whole games.
    frame_skip: emulator frames per env step (the action is repeated, max-pooled frames).
    max_episode_steps: the time limit of an episode, in env steps (a truncation).
    fire_reset: whether envpool presses FIRE at each reset of a game whose actions
      include it: a game's start and, with `episodic_life`, after each lost life (so the
      agent never has to serve Breakout's ball).
  """

  task_id: str
  sticky_action_probability: float
  full_action_space: bool
  num_actions: int
  noop_max: int
  episodic_life: bool
  reward_clip: bool
  frame_skip: int
  max_episode_steps: int
  fire_reset: bool = True

  @property
  def max_episode_frames(self) -> int:
    """The time limit in emulator frames."""
    return self.max_episode_steps * self.frame_skip

  def frames(self, env_steps: int) -> int:
    """Emulator frames behind `env_steps` env steps (of one environment or summed)."""
    return int(env_steps) * self.frame_skip

  def describe(self) -> str:
    """One line to print beside a score."""
    sticky = (
        f"sticky actions p={self.sticky_action_probability:g}"
        if self.sticky_action_probability
        else "no sticky actions"
    )
    actions = "full" if self.full_action_space else "minimal"
    life = "a life loss ends an episode (the game goes on)" if self.episodic_life else "whole games"
    fire = (f"FIRE pressed at a game's start{' and after a lost life' * self.episodic_life}; "
            if self.fire_reset else "")  # fmt: skip
    clip = "training rewards clipped" if self.reward_clip else "raw training rewards"
    return (
        f"{self.task_id}: raw game score of whole games; {sticky}; up to {self.noop_max} "
        f"no-op starts; {actions} action set ({self.num_actions} actions); {life}, "
        f"{clip}; {fire}frame skip {self.frame_skip} (frames = {self.frame_skip} x env steps); "
        f"time limit {self.max_episode_steps:,} env steps ({self.max_episode_frames:,} frames)"
    )


def atari_protocol(task_id: str, **envpool_kwargs: Any) -> AtariProtocol:
  """The protocol of `make_atari(task_id, ..., train=True, **envpool_kwargs)` (training
  episodes; its `train=False` twin, the evaluation's, only differs in raw rewards).

  Args:
    task_id: an envpool Atari id, e.g. "Pong-v5".
    **envpool_kwargs: envpool options on top of the Atari preset, as `make_atari` takes
      them (e.g. `repeat_action_probability=0.25`, `max_episode_steps=...`).

  Raises:
    ValueError: not an Atari task, or options envpool refuses.
  """
  envpool = _envpool_env.check_task_id(task_id)
  kwargs = _envpool_env.atari_kwargs(envpool, task_id, True, envpool_kwargs, "atari_protocol")
  pool_spec = _envpool_env.pool_spec_of(envpool, task_id, 1, kwargs)
  config = pool_spec.config
  return AtariProtocol(
      task_id=task_id,
      sticky_action_probability=float(config.repeat_action_probability),
      full_action_space=bool(config.full_action_space),
      num_actions=int(pool_spec.gymnasium_action_space.n),
      noop_max=int(config.noop_max),
      episodic_life=bool(config.episodic_life),
      reward_clip=bool(config.reward_clip),
      frame_skip=int(config.frame_skip),
      max_episode_steps=int(config.max_episode_steps),
      fire_reset=bool(config.use_fire_reset),
  )


def time_limit(task_id: str, **envpool_kwargs: Any) -> int:
  """The time limit of the task's episodes in env steps (envpool's `max_episode_steps`
  with `envpool_kwargs` applied); reaching it is a truncation, not a termination.

  Raises:
    ValueError: unknown task id.
  """
  envpool = _envpool_env.check_task_id(task_id)
  return int(
      _envpool_env.pool_spec_of(envpool, task_id, 1, envpool_kwargs).config.max_episode_steps
  )
