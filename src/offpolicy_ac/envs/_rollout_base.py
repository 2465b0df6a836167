"""What the rollout backends share: the `Rollout` they return, the act function's type,
the argument checks, and the parking of environments that get too far ahead.

`make_rollout` (`_rollout.py`) picks a backend, the Python loop (`_host_rollout.py`) or the
compiled loop (`_xla_rollout.py`); each backend imports this module and no other backend.

Parking (batched stepping): environments that happen to step faster collect rows beyond
the unroll's T+1, carried into the next unroll. Once one is more than
`MAX_LEAD_ROWS_PER_STEP * T` rows beyond T+1 its action is held back (`furthest_ahead`,
`ParkedActions`) while enough others stay in flight to fill a batch, and the next unroll
sends it first, so the rows carried over stay bounded.
"""

from __future__ import annotations

from collections.abc import Callable
import itertools
from typing import Any
from typing import Literal
from typing import NamedTuple
import weakref

import jax
import numpy as np

from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import check_int
from offpolicy_ac.envs._timestep import check_key
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["ActFn", "Backend", "Rollout", "default_device"]

ActFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""`act(params, obs [B, *obs_shape], key) -> (action [B, *action_shape], extras)`, extras a
pytree of [B, ...] arrays (behaviour-policy outputs)."""

Backend = Literal["host", "compiled"]
"""`make_rollout`'s backends: the Python recv/act/send loop, or one compiled loop per
unroll through envpool's XLA interface."""

# Batched stepping: an environment is parked once it has this many rows per step of the
# unroll beyond the unroll's T+1 (the carried steps and their age stay bounded). Read by
# both backends when a rollout is made (as `_rollout_base.MAX_LEAD_ROWS_PER_STEP`, so that
# tests can set it, e.g. to 0).
MAX_LEAD_ROWS_PER_STEP = 1


class Rollout(NamedTuple):
  """A rollout of either backend (from `make_rollout`).

  Attributes:
    init: `init(params, key) -> state`: resets the environments. The compiled backend
      takes the first action inside `init` (so every unroll is one loop of exactly T
      steps), with these parameters; the host backend ignores them.
    unroll: `unroll(params, state) -> (state, Trajectory, EpisodeStats)`: the trajectory
      `[T+1, num_envs, ...]` (NumPy, or JAX arrays on the default device with
      `to_device`) and the episodes finished while it ran (returns are raw game scores
      for the Atari preset). The state type depends on the backend (`RolloutState`,
      `XlaRolloutState`, `XlaBatchedRolloutState`).
    env: the `EnvPoolEnv` it steps (closed by its owner, not by the rollout).
    unroll_length: T.
    backend: "host" or "compiled".
  """

  init: Callable[[Any, jax.Array], Any]
  unroll: Callable[[Any, Any], tuple[Any, Trajectory, EpisodeStats]]
  env: EnvPoolEnv
  unroll_length: int
  backend: str


def default_device() -> jax.Device:
  """The device uncommitted JAX arrays go to (`jax_default_device`, else the first local
  device of the default backend): where `to_device=True` puts trajectories."""
  device = jax.config.jax_default_device
  if device is None:
    return jax.local_devices()[0]
  if isinstance(device, str):
    return jax.local_devices(backend=device)[0]
  return device


def furthest_ahead(
    env_id: np.ndarray, count: np.ndarray, threshold: int, budget: int
) -> np.ndarray:
  """Parking (batched stepping): positions in the batch `env_id` of the environments to hold back,
  those with at least `threshold` rows (`count` [num_envs]), furthest ahead first, at
  most `budget` of them (the rest must be sent to keep a batch in flight)."""
  ahead = np.flatnonzero(count[env_id] >= threshold)
  if budget <= 0 or not ahead.size:
    return ahead[:0]
  return ahead[np.argsort(-count[env_id[ahead]], kind="stable")[:budget]]


class ParkedActions:
  """Parking within one unroll (batched stepping): the actions held back (see
  `furthest_ahead`), shared by the host loop and the compiled loop's host side."""

  def __init__(self) -> None:
    self._ids: list[np.ndarray] = []
    self._actions: list[np.ndarray] = []
    self.count = 0  # environments parked so far

  def hold(
      self,
      env_id: np.ndarray,
      action: np.ndarray,
      held: np.ndarray,
      send: Callable[[np.ndarray, np.ndarray], None],
  ) -> None:
    """Sends the batch's actions (`send(action, env_id)`) except those at positions
    `held`, which are kept."""
    keep = np.ones(env_id.shape, bool)
    keep[held] = False
    if keep.any():
      send(action[keep], env_id[keep])
    self._ids.append(env_id[held])
    self._actions.append(action[held])
    self.count += held.shape[0]

  def state(self) -> tuple[np.ndarray, np.ndarray] | None:
    """(env_id [p], action [p, ...]) of every parked environment (the `parked` field
    of the rollout states), or None."""
    if not self._ids:
      return None
    return np.concatenate(self._ids), np.concatenate(self._actions)


_GENERATIONS = itertools.count(1)  # identifies live rollout states, across rollouts
# Each pool's live generation: the pool's, not a rollout's, so that another rollout's
# `init` or `unroll` on the same environments (which moves them on) makes a state stale.
_LIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class LiveState:
  """Which state of a rollout over `env` is live: each state is unrolled once (the
  environments move on), so a stale one is refused: already unrolled, from before `init`,
  or from before another rollout over the same environments began (`init`) or unrolled."""

  def __init__(self, env: EnvPoolEnv):
    self._env = env

  def renew(self) -> int:
    """A new live generation (for `init`), returned."""
    generation = _LIVE[self._env] = next(_GENERATIONS)
    return generation

  def take(self, state: Any) -> int:
    """Refuses `state` (ValueError) unless it is the live one; then a new generation, for
    the state the unroll returns; raises (RuntimeError) once the environments are closed
    (the compiled backend's steps would otherwise go on)."""
    self._env.check_open()
    if state.generation != _LIVE.get(self._env, 0):
      raise ValueError(
          f"stale {type(state).__name__}: each state can be unrolled once (the environments "
          "have moved on, also when another rollout over the same environments has begun "
          "or unrolled since); use the state returned by the last unroll, or init() again"
      )
    return self.renew()


def restart(env: EnvPoolEnv, key: Any) -> None:
  """What every envpool rollout's `init` does first: refuses a `key` that is not a PRNG
  key (`check_key`), receives the actions an earlier `init` and `unroll` left in flight
  (`drain`), and resets every environment."""
  check_key(key)
  drain(env)
  env.async_reset()


def drain(env: EnvPoolEnv) -> None:
  """Receives every action still in flight, so that `init` can reset a pool that an
  earlier `init` and `unroll` left stepping (every environment has an action in flight
  between unrolls). With batched stepping, idle environments are sent a valid action
  (discarded, as the steps received here are) whenever fewer than a batch are in flight,
  or the last `recv` would never return."""
  spec = env.spec
  while env.num_in_flight:
    short = env.batch_size - env.num_in_flight
    if short > 0:
      idle = np.flatnonzero(~env.in_flight)[:short].astype(np.int32)
      if spec.is_discrete:
        action = np.zeros((short,), np.int32)
      else:
        low, high = (np.asarray(x, np.float32) for x in (spec.action_low, spec.action_high))
        middle = ((low + high) / 2).reshape(spec.action_shape)
        action = np.broadcast_to(middle, (short, *spec.action_shape))
      env.send(action, idle)
    env.recv_raw()


def check_rollout_args(env: Any, act_fn: Any, unroll_length: Any) -> int:
  """Validates the arguments shared by both backends; returns T as an int."""
  if not isinstance(env, EnvPoolEnv):
    raise ValueError(f"env must be an EnvPoolEnv (from envs.make), got {type(env).__name__}")
  if not callable(act_fn):
    raise ValueError("act_fn must be callable: act(params, obs, key) -> (action, extras)")
  return check_int("unroll_length", unroll_length)


def check_carried_extras(carried: Any, new: Any, carried_lead: int, new_lead: int) -> None:
  """Refuses (ValueError) act's extras `new` (leaves [*lead, ...], `new_lead` leading
  axes) of another structure, shape or dtype per step than those carried over from the
  last unroll (`carried`, `carried_lead` leading axes): each trajectory joins the two at
  its first row, so a renamed key would relabel the carried step, a cast or a failed
  concatenation follow. Checked on shapes only (where traced, it costs nothing)."""

  def describe(tree: Any, lead: int) -> Any:
    return jax.tree.map(lambda x: f"{np.dtype(x.dtype).name}{list(np.shape(x)[lead:])}", tree)

  before, now = describe(carried, carried_lead), describe(new, new_lead)
  same = jax.tree.structure(before) == jax.tree.structure(now)
  if not same or jax.tree.leaves(before) != jax.tree.leaves(now):
    raise ValueError(
        f"act returned extras {now} (per step), and those of the steps carried over from "
        f"the last unroll are {before}: the extras must keep their structure, shapes and "
        "dtypes from one unroll to the next (init() again to start over)"
    )


def call_policy(act_fn: Callable, params: Any, obs: Any, key: Any, batch: int) -> tuple[Any, Any]:
  """`act_fn(params, obs, key)`, refusing (ValueError) outputs that are not an
  `(action, extras)` pair, or extras leaves without a leading batch axis of `batch`."""
  out = act_fn(params, obs, key)
  if not isinstance(out, (tuple, list)) or len(out) != 2:
    raise ValueError(
        "act must return a pair (action [B, ...], extras: a pytree of [B, ...] arrays, {} for "
        f"none), got {type(out).__name__}"
        + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
    )
  action, extras = out
  for path, leaf in jax.tree_util.tree_leaves_with_path(extras):
    if np.ndim(leaf) < 1 or np.shape(leaf)[0] != batch:
      raise ValueError(
          f"act must return extras with a leading batch axis of {batch}; extras"
          f"{jax.tree_util.keystr(path)} has shape {np.shape(leaf)}"
      )
  return action, extras
