"""TimeStep, EnvSpec and EpisodeStats: the data types of the environment layer.

ALF's TimeStep semantics (docs/design.md, "Contract 2: environments"):

| step_type | discount | meaning                                                          |
|-----------|----------|------------------------------------------------------------------|
| FIRST (0) | 1        | first step of an episode, reward 0 (envpool's auto-reset step)   |
| MID (1)   | 1        | any other step                                                   |
| LAST (2)  | 0        | episode ended by the environment (termination)                   |
| LAST (2)  | 1        | episode ended by a time limit (truncation): still bootstrapped   |

The observation at a LAST step is the true final observation. The transition that leaves a
LAST step (LAST -> FIRST) is not a real transition and is never learned from.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import numpy as np

FIRST: int = 0
"""`step_type` of the first step of an episode (reward 0, discount 1)."""
MID: int = 1
"""`step_type` of any step that is neither the first nor the last of its episode."""
LAST: int = 2
"""`step_type` of an episode's last step: discount 0 at a termination, 1 at a truncation."""

STEP_TYPE_DTYPE = np.int32
ENV_ID_DTYPE = np.int32


class TimeStep(NamedTuple):
  """One batched step of `batch_size` environments (host-side NumPy arrays).

  Attributes:
    step_type: [B] int32, FIRST=0, MID=1, LAST=2.
    reward: [B] float32, the reward of the transition that led to this step; 0 at FIRST.
    discount: [B] float32, 0 at a terminating LAST step, 1 everywhere else (a truncating
      LAST step keeps discount 1: its value is still bootstrapped).
    observation: [B, *observation_shape], the observation at this step (the true final
      observation at LAST).
    env_id: [B] int32, which environment each row belongs to (arange(B) unless stepping
      is batched).
  """

  step_type: Any
  reward: Any
  discount: Any
  observation: Any
  env_id: Any


class EnvSpec(NamedTuple):
  """Static description of an environment, enough to build networks.

  Hashable (tuples and plain scalars only), so it can be a static argument of `jax.jit`.

  Attributes:
    task_id: envpool task id, e.g. "CartPole-v1".
    observation_shape: shape of one observation, e.g. (4,) or (4, 84, 84).
    observation_dtype: NumPy dtype name of observations as returned ("float32", "uint8").
      float64 observations (MuJoCo) are converted to float32.
    is_discrete: True for a Discrete action space.
    num_actions: number of discrete actions; None for continuous spaces.
    action_shape: shape of one action: () for discrete, e.g. (6,) for continuous.
    action_dtype: dtype name actions are given in: "int32" (discrete) or "float32".
    action_low: lower bounds, flattened, one per action dimension; None if discrete.
    action_high: upper bounds, flattened; None if discrete.
    num_envs: number of environments in the pool (a fact of the pool, not the task).
    batch_size: environments returned per `recv` (== num_envs unless stepping is
      batched).
  """

  task_id: str
  observation_shape: tuple[int, ...]
  observation_dtype: str
  is_discrete: bool
  num_actions: int | None
  action_shape: tuple[int, ...]
  action_dtype: str
  action_low: tuple[float, ...] | None
  action_high: tuple[float, ...] | None
  num_envs: int
  batch_size: int

  @property
  def is_batched(self) -> bool:
    """True when `batch_size < num_envs`: batched stepping, each `recv` returns whichever
    `batch_size` environments are ready (send/recv stepping)."""
    return self.batch_size < self.num_envs


class EpisodeStats(NamedTuple):
  """Finished episodes, one entry each (host-side NumPy arrays of length K >= 0).

  Attributes:
    env_id: [K] int32, environment the episode ran in.
    episode_return: [K] float64, undiscounted sum of the environment's rewards over the
      episode. For the Atari preset this is the raw game score over the whole game (all
      lives, rewards not clipped), not the return of one life.
    episode_length: [K] int64, number of agent steps (actions taken) in the episode;
      for Atari the whole game.
  """

  env_id: np.ndarray
  episode_return: np.ndarray
  episode_length: np.ndarray

  @staticmethod
  def empty() -> EpisodeStats:
    """No finished episode."""
    return EpisodeStats(
        np.zeros((0,), ENV_ID_DTYPE), np.zeros((0,), np.float64), np.zeros((0,), np.int64)
    )

  @staticmethod
  def concatenate(stats: list[EpisodeStats]) -> EpisodeStats:
    """Joins several EpisodeStats in order."""
    if not stats:
      return EpisodeStats.empty()
    return EpisodeStats(*(np.concatenate(fields) for fields in zip(*stats, strict=True)))


def check_bool(name: str, value: Any) -> bool:
  """`value` as a bool; raises ValueError naming `name` unless it is one (a NumPy bool
  too): a switch given "no" would act as True."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be True or False, got {value!r}")
  return bool(value)


def check_key(key: Any, where: str = "") -> None:
  """Refuses (ValueError, its message after `where`) a `key` that is not a PRNG key (JAX
  would refuse it later, with "invalid PRNG key data"). Works on traced keys (checks the
  abstract value). A batch of keys is named as one, with its shape."""
  try:
    jax.eval_shape(jax.random.split, key)
  except (TypeError, ValueError) as e:
    if _is_key_batch(key):
      raise ValueError(
          f"{where}key must be one PRNG key, got a batch of {key.shape[0]} keys ({key.dtype}"
          f"{list(key.shape)}): give one, or jax.vmap the function over the batch"
      ) from e
    traced = isinstance(key, jax.core.Tracer)
    shown = f"a traced {key.dtype}{list(key.shape)}" if traced else repr(key)
    raise ValueError(
        f"{where}key must be a PRNG key (jax.random.key(seed) or jax.random.PRNGKey(seed)), "
        f"got {shown}"
    ) from e


def _is_key_batch(key: Any) -> bool:
  """Whether `key` is keys stacked along a leading axis (typed or raw)."""
  if not hasattr(key, "shape") or not hasattr(key, "dtype") or not key.shape:
    return False
  try:
    jax.eval_shape(jax.vmap(jax.random.split), key)
  except (TypeError, ValueError):
    return False
  return True


def check_int(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
  """`value` as an int; raises ValueError naming `name` unless it is an int (not a bool) in
  [low, high) (no upper bound when `high` is None)."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be an int, got {value!r}")
  if value < low or (high is not None and value >= high):
    bound = f">= {low}" if high is None else f"in [{low}, {high})"
    raise ValueError(f"{name} must be {bound}, got {value}")
  return int(value)


def check_ints(name: str, value: Any, low: int = 1) -> tuple[int, ...]:
  """`value` (a shape, or layer sizes) as a tuple of ints; raises ValueError naming `name`
  unless it is a tuple or list of ints (not bools) >= `low`. Empty is allowed."""
  if not isinstance(value, (tuple, list)) or not all(
      isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= low for d in value
  ):
    ints = "positive ints" if low == 1 else f"ints >= {low}"
    raise ValueError(f"{name} must be a tuple of {ints}, got {value!r}")
  return tuple(int(d) for d in value)


def check_number(name: str, x: Any) -> float:
  """`x` as a float; raises ValueError naming `name` unless it is one real number (a
  Python, NumPy or concrete JAX scalar; not a bool)."""
  scalar = (int, float, np.generic, np.ndarray, jax.Array)
  value = np.asarray(x) if isinstance(x, scalar) and not isinstance(x, bool) else None
  if value is None or value.ndim or value.dtype.kind not in "iuf":
    raise ValueError(f"{name} must be a number, got {x!r}")
  return float(value)


def check_traced_actions(spec: EnvSpec, action: Any, batch: int) -> None:
  """Raises ValueError if a batch of actions computed by a policy (a JAX array, checked
  at trace time) does not fit the spec: shape [batch, *action_shape], an integer dtype
  for discrete actions, a floating one for continuous actions."""
  expected = (batch, *spec.action_shape)
  if tuple(action.shape) != expected:
    raise ValueError(f"{spec.task_id}: action shape {action.shape}, expected {expected}")
  kind = np.dtype(action.dtype).kind
  if spec.is_discrete and kind not in "iu":
    raise ValueError(
        f"{spec.task_id}: discrete actions must have an integer dtype, got {action.dtype}"
    )
  if not spec.is_discrete and kind != "f":
    raise ValueError(
        f"{spec.task_id}: continuous actions must have a floating dtype, got {action.dtype}"
    )
