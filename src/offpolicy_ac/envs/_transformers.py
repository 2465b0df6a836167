"""Data transformers (as in ALF): observation normalisation, reward clipping and scaling.

Replay stores *raw* data. A transformer is a pair of pure functions over a `Trajectory`:

    transformer = make_data_transformer(spec.observation_shape, normalize_observations=True,
                                        reward_clip=(-1.0, 1.0))
    tstate = transformer.init()
    tstate = transformer.update(tstate, fresh_traj)     # statistics from fresh data only
    batch = transformer.apply(tstate, fresh_traj)       # -> TransformedTrajectory
    batch = transformer.apply(tstate, replayed_traj)    # same function for replayed data

`apply` takes a raw `Trajectory` and returns a `TransformedTrajectory` (same fields, a
distinct NamedTuple type that survives `jit`); given a `TransformedTrajectory` it raises, so
a transformation is never applied twice. Both are jittable; the state is a NamedTuple of
arrays.

Observation statistics are merged with the parallel (Chan et al.) update, "Updating Formulae
and a Pairwise Algorithm for Computing Sample Variances" (1979): for a running (n_a, mean_a,
var_a) and a batch (n_b, mean_b, var_b), with delta = mean_b - mean_a and n = n_a + n_b,

    mean = mean_a + delta * n_b / n
    var  = (n_a * var_a + n_b * var_b + delta^2 * n_a * n_b / n) / n.

A batch's own moments are those of its samples less its first one (shifted data), so a
constant dimension gets exactly its value as mean and a variance of 0, and normalises to 0
at any magnitude (not to about +-1, as a mean a few float32 ulps off a large constant did).

`update` uses observations [0, T) of a `[T+1, ...]` unroll: index T is index 0 of the next
unroll, so each observation of the stream is counted exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs._timestep import check_bool
from offpolicy_ac.envs._timestep import check_ints
from offpolicy_ac.envs._timestep import check_number
from offpolicy_ac.envs._trajectory import Trajectory
from offpolicy_ac.envs._trajectory import TransformedTrajectory

__all__ = [
    "RunningStats",
    "running_stats_init",
    "running_stats_update",
    "normalize",
    "clip_reward",
    "scale_reward",
    "TransformerState",
    "DataTransformer",
    "make_data_transformer",
]


class RunningStats(NamedTuple):
  """Running mean and (population) variance of vectors of shape `shape`.

  Attributes:
    count: [] float32, number of samples seen.
    mean: [*shape] float32.
    var: [*shape] float32 (1 before any sample, so normalising is the identity shift).
  """

  count: jax.Array
  mean: jax.Array
  var: jax.Array


def running_stats_init(shape: tuple[int, ...]) -> RunningStats:
  """Statistics with no sample: count 0, mean 0, var 1."""
  shape = check_ints("running_stats_init: shape", shape)
  return RunningStats(
      jnp.zeros((), jnp.float32), jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32)
  )


def running_stats_update(
    stats: RunningStats, x: jax.Array, mask: jax.Array | None = None
) -> RunningStats:
  """Merges a batch `x` [*batch, *shape] into `stats` (parallel variance update).

  Args:
    stats: statistics over vectors of shape `stats.mean.shape`.
    x: samples; every leading axis beyond `stats.mean.ndim` trailing ones is a batch axis.
    mask: optional [*batch] bool, False drops a sample.

  Returns:
    Statistics over the samples of `stats` and of `x`. With no new sample (all masked),
    `stats` unchanged.
  """
  shape = stats.mean.shape
  if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape) :]) != tuple(shape):
    raise ValueError(f"x has shape {x.shape}; expected [*batch, {', '.join(map(str, shape))}]")
  batch_shape = x.shape[: x.ndim - len(shape)]
  x = jnp.reshape(x.astype(jnp.float32), (-1, *shape))
  if mask is None:
    w = jnp.ones((x.shape[0],), jnp.float32)
  else:
    if tuple(mask.shape) != tuple(batch_shape):
      raise ValueError(f"mask has shape {mask.shape}; expected the batch shape {batch_shape}")
    w = jnp.reshape(mask, (-1,)).astype(jnp.float32)
  if not x.shape[0]:  # no sample: nothing to merge (and no first sample to shift by)
    return stats
  # The batch's moments of x - shift (shift: its first unmasked sample): a constant
  # dimension then has exactly its value as mean and 0 as variance. Summing x itself left
  # the mean a few float32 ulps off a large constant, so that normalising mapped the
  # constant to about +-1 (1000.1 to 0.88), not 0. Masked samples are read as the shift.
  first = jnp.argmax(w)  # 0 with every sample masked: then no shift (x[0] may be inf)
  shift = jnp.where(w[first] > 0, x[first], jnp.zeros_like(x[first]))
  w = jnp.reshape(w, (-1,) + (1,) * len(shape))
  n_b = jnp.sum(w)
  safe_n_b = jnp.maximum(n_b, 1.0)
  d = jnp.where(w > 0, x - shift[None], 0.0)
  mean_d = jnp.sum(d, axis=0) / safe_n_b
  mean_b = shift + mean_d
  var_b = jnp.sum(w * jnp.square(d - mean_d[None]), axis=0) / safe_n_b
  n = stats.count + n_b
  safe_n = jnp.maximum(n, 1.0)
  delta = mean_b - stats.mean
  mean = stats.mean + delta * (n_b / safe_n)
  m2 = stats.var * stats.count + var_b * n_b + jnp.square(delta) * (stats.count * n_b / safe_n)
  var = m2 / safe_n
  has_new = n_b > 0
  return RunningStats(
      count=n,
      mean=jnp.where(has_new, mean, stats.mean),
      var=jnp.where(has_new, var, stats.var),
  )


def normalize(
    stats: RunningStats, x: jax.Array, *, clip: float | None = 5.0, eps: float = 1e-8
) -> jax.Array:
  """(x - mean) / sqrt(var + eps), clipped to [-clip, clip]; x [*batch, *shape], float32.

  Raises:
    TypeError: `stats` is not a `RunningStats`.
    ValueError: x of another trailing shape, `clip` not > 0, or `eps` not finite and >= 0
      (checked where they are concrete).
  """
  if not isinstance(stats, RunningStats):
    raise TypeError(f"normalize(stats, x): stats must be RunningStats (running_stats_init), "
                    f"got {type(stats).__name__}")  # fmt: skip
  _check_obs_clip("clip", clip)
  _check_obs_eps("eps", eps)
  shape = stats.mean.shape
  if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape) :]) != tuple(shape):
    raise ValueError(f"x has shape {x.shape}; expected [*batch, {', '.join(map(str, shape))}]")
  expand = (1,) * (x.ndim - len(shape)) + tuple(shape)  # explicit: rank promotion may be 'raise'
  mean, var = jnp.reshape(stats.mean, expand), jnp.reshape(stats.var, expand)
  diff = x.astype(jnp.float32) - mean
  # 0 where x is the mean: a constant dimension (variance 0) with eps = 0 gave 0 / 0 = NaN.
  y = jnp.where(diff == 0, 0.0, diff / jnp.sqrt(var + eps))
  return y if clip is None else jnp.clip(y, -clip, clip)


def clip_reward(reward: jax.Array, low: float, high: float) -> jax.Array:
  """Rewards clipped to [low, high]; ValueError for low > high or NaN (where concrete)."""
  lo, hi = _concrete_number("clip_reward: low", low), _concrete_number("clip_reward: high", high)
  if lo is not None and hi is not None and not lo <= hi:
    raise ValueError(f"clip_reward: low must be <= high, got low {low}, high {high}")
  return jnp.clip(reward, low, high)


def scale_reward(reward: jax.Array, scale: float) -> jax.Array:
  """Rewards times `scale`; ValueError for a scale that is not finite (where concrete)."""
  value = _concrete_number("scale_reward: scale", scale)
  if value is not None and not np.isfinite(value):
    raise ValueError(f"scale_reward: scale must be finite, got {scale}")
  return reward * scale


class TransformerState(NamedTuple):
  """State of a DataTransformer.

  Attributes:
    obs_stats: RunningStats of observations, or None when normalisation is off.
  """

  obs_stats: RunningStats | None


class DataTransformer(NamedTuple):
  """`init() -> state`; `update(state, traj) -> state` (fresh raw data only);
  `apply(state, traj: Trajectory) -> TransformedTrajectory` (fresh and replayed data alike);
  `observe(state, obs) -> obs`: the observation transform alone, for acting on raw
  observations [*batch, *obs_shape] as the learner sees them (the identity when
  normalisation is off)."""

  init: Callable[[], TransformerState]
  update: Callable[[TransformerState, Trajectory], TransformerState]
  apply: Callable[[TransformerState, Trajectory], TransformedTrajectory]
  observe: Callable[[TransformerState, Any], Any]


def _check_raw(traj: Any, what: str) -> None:
  if isinstance(traj, TransformedTrajectory):
    raise ValueError(
        f"{what} got a TransformedTrajectory: transformers take raw Trajectory data only "
        "(replay stores raw data; apply the transformer once, to raw data)"
    )
  if not isinstance(traj, Trajectory):
    raise ValueError(f"{what} expects a Trajectory, got {type(traj).__name__}")


def _update(state: TransformerState, traj: Trajectory) -> TransformerState:
  _check_raw(traj, "DataTransformer.update")
  if state.obs_stats is None:
    return state
  obs = jnp.asarray(traj.observation)
  if obs.shape[0] < 2:
    raise ValueError(f"a trajectory needs T+1 >= 2 steps, got observation shape {obs.shape}")
  return TransformerState(running_stats_update(state.obs_stats, obs[:-1]))


def _apply(
    state: TransformerState,
    traj: Trajectory,
    *,
    obs_clip: float | None,
    obs_eps: float,
    reward_clip: tuple[float, float] | None,
    reward_scale: float,
) -> TransformedTrajectory:
  _check_raw(traj, "DataTransformer.apply")
  observation = traj.observation
  if state.obs_stats is not None:
    observation = normalize(state.obs_stats, jnp.asarray(observation), clip=obs_clip, eps=obs_eps)
  reward = jnp.asarray(traj.reward)
  if reward_clip is not None:
    reward = clip_reward(reward, *reward_clip)
  if reward_scale != 1.0:
    reward = scale_reward(reward, reward_scale)
  return TransformedTrajectory(*traj._replace(observation=observation, reward=reward))


def _concrete_number(name: str, x: Any) -> float | None:
  """`check_number(name, x)`, or None for what jnp takes but cannot be checked here: a traced
  value, or an array of several values."""
  if isinstance(x, jax.core.Tracer) or (isinstance(x, (np.ndarray, jax.Array)) and np.ndim(x)):
    return None
  return check_number(name, x)


def _check_obs_clip(name: str, clip: Any) -> None:
  if clip is not None and (value := _concrete_number(name, clip)) is not None and not value > 0:
    raise ValueError(f"{name} must be > 0 or None, got {clip}")


def _check_obs_eps(name: str, eps: Any) -> None:
  if (value := _concrete_number(name, eps)) is not None and not 0 <= value < float("inf"):
    raise ValueError(f"{name} must be >= 0 and finite, got {eps}")


def make_data_transformer(
    observation_shape: tuple[int, ...],
    *,
    normalize_observations: bool = False,
    obs_clip: float | None = 5.0,
    obs_eps: float = 1e-8,
    reward_clip: tuple[float, float] | None = None,
    reward_scale: float = 1.0,
) -> DataTransformer:
  """Makes a DataTransformer; with every option off, apply only changes the type.

  Args:
    observation_shape: shape of one observation (`EnvSpec.observation_shape`).
    normalize_observations: normalise observations with running mean and variance.
    obs_clip: clip normalised observations to [-obs_clip, obs_clip]; None: no clip.
    obs_eps: added to the variance before the square root.
    reward_clip: (low, high) with low <= 0 <= high (so FIRST steps keep reward 0), or None.
    reward_scale: multiplies rewards (after clipping), > 0.

  Raises:
    ValueError: bad arguments.
  """
  shape = check_ints("observation_shape", observation_shape)
  normalize_observations = check_bool("normalize_observations", normalize_observations)
  if obs_clip is not None:
    check_number("obs_clip", obs_clip)  # a number (not an array, not traced)
    _check_obs_clip("obs_clip", obs_clip)
  check_number("obs_eps", obs_eps)
  _check_obs_eps("obs_eps", obs_eps)
  if reward_clip is not None:
    if not isinstance(reward_clip, (tuple, list)) or len(reward_clip) != 2:
      raise ValueError(f"reward_clip must be a pair (low, high), got {reward_clip!r}")
    low, high = (check_number("reward_clip", x) for x in reward_clip)
    if not low <= 0.0 <= high or not low < high:
      raise ValueError(
          "reward_clip must be (low, high) with low <= 0 <= high, low < high; " f"got {reward_clip}"
      )
    reward_clip = (low, high)
  if not 0 < check_number("reward_scale", reward_scale) < float("inf"):
    raise ValueError(f"reward_scale must be > 0 and finite, got {reward_scale}")

  def init() -> TransformerState:
    return TransformerState(running_stats_init(shape) if normalize_observations else None)

  def check_state(state: Any, where: str) -> None:
    """Refuses a state of another transformer (with or without normalisation), whose
    observations would be normalised, or not, against the transformer's settings."""
    if not isinstance(state, TransformerState):
      raise TypeError(f"DataTransformer.{where} takes its TransformerState (init(), update()), "
                      f"got {type(state).__name__}")  # fmt: skip
    if (state.obs_stats is not None) != normalize_observations:
      has = "has no" if state.obs_stats is None else "has"
      raise ValueError(
          f"DataTransformer.{where}: the state {has} observation statistics, and the "
          f"transformer was made with normalize_observations={normalize_observations}"
      )

  def apply(state: TransformerState, traj: Trajectory) -> TransformedTrajectory:
    check_state(state, "apply")
    return _apply(
            state, traj, obs_clip=obs_clip, obs_eps=obs_eps, reward_clip=reward_clip,
            reward_scale=float(reward_scale),
        )  # fmt: skip

  def observe(state: TransformerState, obs: Any) -> Any:
    check_state(state, "observe")
    if state.obs_stats is None:
      return obs
    return normalize(state.obs_stats, jnp.asarray(obs), clip=obs_clip, eps=obs_eps)

  return DataTransformer(init=init, update=_update, apply=apply, observe=observe)
