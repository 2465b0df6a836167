"""Host-side rollouts: run a jitted policy on an `EnvPoolEnv` and return time-major unrolls.

`make_rollout(env, act_fn, unroll_length)` returns `Rollout(init, unroll)`:

    rollout = make_rollout(env, act_fn, unroll_length=T)
    state = rollout.init(key)                          # resets the environments
    state, traj, stats = rollout.unroll(params, state) # traj: Trajectory [T+1, num_envs, ...]

Indexing (see `_trajectory.py`): `action[t]` is the action taken at step t, so `action[T]` of
one unroll is the first action of the next one, every field of index T of one unroll equals
index 0 of the next, and transitions [0, T) of consecutive unrolls tile the stream with no
step lost or counted twice. Column b of every unroll is environment `env_id == b`, in
asynchronous mode too.

How it runs. Between calls every environment has exactly one action in flight (or parked,
below): the action at its newest collected step. `unroll` repeats: `recv()` -> one jitted
call that splits the key and runs `act(params, obs, key)` -> the action and behaviour
outputs to host (`np.asarray`) -> `send()` (validate, clip, hand to envpool) -> keep the
step's arrays in a list while the environments step. Nothing else happens per step: envpool
hands out new arrays on every `recv` and the policy's outputs are immutable, so they are
kept as they are and placed into `[rows, num_envs, ...]` buffers once, after the loop (one
copy per field, a scatter keyed by env_id in async mode). FIRST/MID/LAST, reward 0 at FIRST,
discounts and episode statistics are then computed once per unroll, vectorised over the
block (`EnvPoolEnv._convert_block`, the same code `recv()` uses). In sync mode that is
exactly T iterations (T+1 after `init`). In async mode (`batch_size < num_envs`)
environments progress at different speeds; the ones that get ahead keep stepping, and their
extra steps are carried in the state as the beginning of the next unroll, keyed by env_id.
Some environments step faster steadily (on Pong 8 x 4 the lead grew by about a quarter of a
row per unroll), so an environment more than T rows ahead is parked: its action is held back
(and sent first by the next unroll) while enough others stay in flight to fill a batch
(fewer, and `recv` would block forever). The trajectory is copied to the device once per
unroll.

The policy's action is stored as returned by `act` (continuous actions before clipping: the
environment receives them clipped to bounds), so behaviour log-probabilities in `extras`
match the stored action.

Speed (docs/envs_notes.md): on a small CPU the per-step cost of a tiny jitted policy is
mostly JAX handing the computation to a worker thread; starting the process with
`jax.config.update("jax_cpu_enable_async_dispatch", False)` (before any JAX work; a
process-wide setting this library does not touch) runs it inline and is several times
faster per call.

Why a host loop by default, and not envpool's XLA interface (`env.xla()` in a compiled
loop): the segfault reported for threading the handle through `lax.scan` / `fori_loop` did
not reproduce on jax 0.10.2 / envpool 1.2.5 CPU in any variant probed
(docs/envs_notes.md), and `make_xla_rollout` (`_xla_rollout.py`) is that fully jitted
rollout, sync and async, behind its own switch as issue 3 asks (faster: see the README).
The host loop stays the default because it sends the float64 actions MuJoCo tasks take
without enabling x64, rejects a bad action before it is stepped (the compiled loop can only
report it after the unroll), and runs the policy wherever JAX puts it (envpool's custom
calls are CPU code, so the compiled loop keeps the policy on the CPU).

State is explicit (`RolloutState`) but the environments are not: a state may be used once.
Passing a stale state (one already consumed by `unroll`, or from before `init`) raises.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import itertools
from typing import Any
from typing import NamedTuple

import jax
import numpy as np

from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["ActFn", "RolloutState", "Rollout", "make_rollout"]

ActFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""`act(params, obs [B, *obs_shape], key) -> (action [B, *action_shape], extras)`, extras a
pytree of [B, ...] arrays (behaviour-policy outputs)."""

_generation = itertools.count(1)

# Async: an environment is parked once it has this many rows per step of the unroll beyond
# the unroll's T+1 (the carried steps and their age stay bounded). Tests set 0.
_MAX_LEAD_ROWS_PER_STEP = 1


class RolloutState(NamedTuple):
  """What carries over between unrolls (NumPy arrays on the host, and the key).

  Attributes:
    key: PRNG key for the next policy call.
    pending: Trajectory of [P, num_envs, ...]: steps already collected for the next
      unroll; row 0 of column b is the shared boundary step of env b (index T of the
      previous unroll), later rows exist only in async mode for environments that got
      ahead. Empty (P = 0) right after `init`.
    num_pending: [num_envs] int, how many rows of `pending` are valid per environment.
      The action of the newest one is in flight, or parked.
    generation: identifies the live state; a stale one is rejected.
    parked: async mode: (env_id [p], action [p, ...]) of environments whose newest
      action was held back because they were too far ahead; the next unroll sends them
      first. None when nothing is parked.
  """

  key: jax.Array
  pending: Trajectory | None
  num_pending: np.ndarray
  generation: int
  parked: tuple[np.ndarray, np.ndarray] | None = None


class Rollout(NamedTuple):
  """`init(key) -> state`; `unroll(params, state) -> (state, Trajectory, EpisodeStats)`.

  `unroll` returns the trajectory `[T+1, num_envs, ...]` as device arrays and the episodes
  finished while it ran (returns are raw game scores for the Atari preset).
  """

  init: Callable[[jax.Array], RolloutState]
  unroll: Callable[[Any, RolloutState], tuple[RolloutState, Trajectory, EpisodeStats]]
  env: EnvPoolEnv
  unroll_length: int


def _check_batch_leaf(name: str, leaf: np.ndarray, batch: int) -> None:
  if leaf.ndim < 1 or leaf.shape[0] != batch:
    raise ValueError(
        f"act must return arrays with a leading batch axis of {batch}; {name} has shape "
        f"{leaf.shape}"
    )


def _place_steps(
    fields: list[Sequence[np.ndarray]],
    env_id: np.ndarray,
    lo: np.ndarray,
    min_rows: int,
    carried: list[np.ndarray | None],
) -> tuple[list[np.ndarray], np.ndarray]:
  """Places steps collected in any environment order into per-environment columns.

  Step j (row j of the concatenated fields) is the next step of environment `env_id[j]`;
  the steps of one environment are in time order. Environment e's steps go to rows
  lo[e], lo[e] + 1, ... of column e, after the rows carried over.

  Args:
    fields: per field, a sequence of arrays whose concatenation along axis 0 is [K, ...].
    env_id: [K] int, the environment of each step.
    lo: [num_envs] int, how many rows of each column are carried over.
    min_rows: the buffers have at least this many rows.
    carried: per field, None or [P, num_envs, ...] with rows [0, lo[e]) of column e valid.

  Returns:
    (per field a new [R, num_envs, ...] buffer, zero where nothing was placed;
    count [num_envs] = lo + the number of steps of each environment),
    R = max(min_rows, count.max()).
  """
  n = lo.shape[0]
  k = env_id.shape[0]
  start = int(lo[0]) * n
  # Sync batches in env_id order fill rows [lo, lo + K / n) of every column: one copy.
  contiguous = (
      k % n == 0
      and (lo == lo[0]).all()
      and np.array_equal(env_id.reshape(k // n, n), np.broadcast_to(np.arange(n), (k // n, n)))
  )
  if contiguous:
    count = lo + k // n
  else:
    new = np.bincount(env_id, minlength=n)
    count = lo + new
    order = np.argsort(env_id, kind="stable")
    sorted_id = env_id[order]
    row = np.empty((k,), np.int64)
    row[order] = lo[sorted_id] + np.arange(k) - (np.cumsum(new) - new)[sorted_id]
    flat = row * n + env_id
  rows = max(min_rows, int(count.max()))
  bufs = []
  for parts, old in zip(fields, carried, strict=True):
    buf = np.zeros((rows, n, *parts[0].shape[1:]), parts[0].dtype)
    if old is not None:
      buf[: old.shape[0]] = old
    view = buf.reshape(rows * n, *buf.shape[2:])
    if contiguous:
      np.concatenate(parts, out=view[start : start + k])
    else:
      view[flat] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    bufs.append(buf)
  return bufs, count


def _split_unroll(
    columns: list[np.ndarray], extras_tree: Any, count: np.ndarray, unroll_length: int
) -> tuple[Trajectory, Trajectory]:
  """(rows [0, T] as the unroll's Trajectory, rows [T, count.max()) as the steps carried
  into the next unroll), from [R, num_envs, ...] columns ordered as `Trajectory`'s fields
  without env_id: step_type, reward, discount, observation, action, *extras leaves."""
  T = unroll_length
  n = count.shape[0]
  env_ids = np.broadcast_to(np.arange(n, dtype=ENV_ID_DTYPE), (columns[0].shape[0], n))
  fields = [*columns[:4], env_ids, *columns[4:]]

  def as_traj(arrays: list[np.ndarray]) -> Trajectory:
    return Trajectory(*arrays[:6], extras=jax.tree.unflatten(extras_tree, arrays[6:]))

  extra_rows = int(count.max()) - T  # >= 1: row T is the shared boundary
  unroll = as_traj(
      [np.ascontiguousarray(x[: T + 1]) if x is env_ids else x[: T + 1] for x in fields]
  )
  return unroll, as_traj([x[T : T + extra_rows].copy() for x in fields])


def furthest_ahead(
    env_id: np.ndarray, count: np.ndarray, threshold: int, budget: int
) -> np.ndarray:
  """Async parking: positions in the batch `env_id` of the environments to hold back,
  those with at least `threshold` rows (`count` [num_envs]), furthest ahead first, at
  most `budget` of them (the rest must be sent to keep a batch in flight)."""
  ahead = np.flatnonzero(count[env_id] >= threshold)
  if budget <= 0 or not ahead.size:
    return ahead[:0]
  return ahead[np.argsort(-count[env_id[ahead]], kind="stable")[:budget]]


class ParkedActions:
  """Async parking within one unroll: the actions held back (see `furthest_ahead`),
  shared by the host loop and the jitted rollout's host side."""

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


def check_rollout_args(env: Any, act_fn: Any, unroll_length: Any) -> int:
  """Validates the arguments shared by both rollouts; returns T as an int."""
  if not isinstance(env, EnvPoolEnv):
    raise ValueError(f"env must be an EnvPoolEnv (from envs.make), got {type(env).__name__}")
  if not callable(act_fn):
    raise ValueError("act_fn must be callable: act(params, obs, key) -> (action, extras)")
  if isinstance(unroll_length, bool) or not isinstance(unroll_length, (int, np.integer)):
    raise ValueError(f"unroll_length must be an int, got {unroll_length!r}")
  if unroll_length < 1:
    raise ValueError(f"unroll_length must be >= 1, got {unroll_length}")
  return int(unroll_length)


def make_rollout(
    env: EnvPoolEnv, act_fn: ActFn, unroll_length: int, *, to_device: bool = True
) -> Rollout:
  """Makes a host-loop rollout of `unroll_length` steps.

  Args:
    env: an `EnvPoolEnv` (sync or async).
    act_fn: `act(params, obs, key) -> (action, extras)`, jittable; it is jitted here
      together with the key split (jitting an already jitted function costs nothing).
      `obs` is [batch_size, *obs_shape] in the env's dtype.
    unroll_length: T >= 1; trajectories have T+1 steps.
    to_device: return the trajectory as JAX arrays (one transfer per unroll); False
      keeps NumPy arrays (e.g. for a host-side replay buffer).

  Raises:
    ValueError: bad arguments.
  """
  T = check_rollout_args(env, act_fn, unroll_length)
  spec = env.spec
  n, b = spec.num_envs, spec.batch_size
  sync = not spec.is_async
  atari = env._atari
  all_ids = np.arange(n, dtype=ENV_ID_DTYPE)
  max_lead = int(_MAX_LEAD_ROWS_PER_STEP * T)
  live = {"generation": 0}
  extras_def: list[Any] = []  # the treedef of act's extras, found when tracing

  @jax.jit
  def policy_step(params, obs, key):
    key, sub = jax.random.split(key)
    action, extras = act_fn(params, obs, sub)
    leaves, treedef = jax.tree.flatten(extras)
    extras_def[:] = [treedef]
    return key, action, tuple(leaves)

  def init(key: jax.Array) -> RolloutState:
    env.async_reset()
    live["generation"] = next(_generation)
    return RolloutState(key, None, np.zeros((n,), np.int64), live["generation"])

  def check_outputs(action: np.ndarray, extras: list[np.ndarray], pending: Any) -> None:
    """act's outputs at the first step of an unroll: batch axes, and the same extras
    structure as the steps carried over (`pending`)."""
    if pending is None:
      for name, leaf in (("action", action), *(("an extras leaf", x) for x in extras)):
        _check_batch_leaf(name, leaf, b)
    elif len(jax.tree.leaves(pending.extras)) != len(extras):
      raise ValueError("act returned extras with a different structure than before")

  def park(
      env_id: np.ndarray, action: np.ndarray, count: np.ndarray, parked: ParkedActions
  ) -> None:
    """Async: sends the batch's actions, except those of environments more than
    `max_lead` rows ahead of the unroll's T+1, which are parked (sent by the next unroll)
    as long as the environments left in flight still fill a batch. Environments that
    happen to step faster (on Pong some do, steadily) would otherwise collect ever more
    rows ahead: memory and the age of carried steps would grow without bound."""
    if count[env_id].max() < T + 1 + max_lead:  # the usual case: nobody too far ahead
      env.send(action)
      return
    if count.min() >= T + 1:  # the unroll is complete: nothing more to receive
      budget = env_id.shape[0]
    else:  # keep at least a batch in flight, or the next recv would never return
      budget = env.num_in_flight + env_id.shape[0] - b
    held = furthest_ahead(env_id, count, T + 1 + max_lead, budget)
    if held.size:
      parked.hold(env_id, action, held, env.send)
    else:
      env.send(action)

  def unroll(params: Any, state: RolloutState) -> tuple[RolloutState, Trajectory, EpisodeStats]:
    if not isinstance(state, RolloutState):
      raise ValueError(f"unroll expects a RolloutState, got {type(state).__name__}")
    if state.generation != live["generation"]:
      raise ValueError(
          "stale RolloutState: each state can be unrolled once (the environments have "
          "moved on); use the state returned by the last unroll, or init() again"
      )
    live["generation"] = next(_generation)
    key, pending = state.key, state.pending
    lo = state.num_pending  # rows [0, lo) of each column were collected before
    # The loop only collects. Each step's arrays are kept as they are (envpool hands out
    # new arrays on every recv, and the policy's outputs are immutable) and placed into
    # the [rows, num_envs, ...] buffers once, after the loop.
    steps: list[tuple[np.ndarray, ...]] = []  # (env_id, observation, raw..., action, *extras)
    remaining = T + 1 - int(lo[0])  # sync: steps still to collect
    count = lo.copy()  # async: steps collected per environment
    checked = False
    parked = ParkedActions()
    if state.parked is not None:
      env.send(state.parked[1], state.parked[0])
    while (remaining > 0) if sync else (count.min() < T + 1):
      raw = env._recv_raw()
      key, action, extras = policy_step(params, raw.obs, key)
      action = np.asarray(action)
      extras = [np.asarray(x) for x in extras]
      if not checked:
        check_outputs(action, extras, pending)
        checked = True
      # Hand the actions to envpool first; keep the step while the environments step.
      if sync:
        env.send(action)  # validates and clips; env_id = the batch just received
        remaining -= 1
      else:
        count[raw.env_id] += 1
        park(raw.env_id, action, count, parked)
      if atari:
        game = (raw.game_reward, raw.game_over)
        steps.append((raw.env_id, *raw[:4], *game, action, *extras))
      else:
        steps.append((raw.env_id, *raw[:4], action, *extras))

    columns = list(zip(*steps, strict=True))
    num_raw = 5 if atari else 3  # reward, terminated, truncated[, game_reward, game_over]
    carried: list[np.ndarray | None] = [None] * (len(columns) - 1)
    if pending is not None:
      carried[0] = pending.observation
      carried[1 + num_raw :] = [pending.action, *jax.tree.leaves(pending.extras)]
    (observation, *placed), count = _place_steps(
        columns[1:], np.concatenate(columns[0]), lo, T + 1, carried
    )
    raw_fields, action_and_extras = placed[:num_raw], placed[num_raw:]
    if not atari:
      raw_fields += [None, None]

    # Convert the new rows [lo, count) of every column in one vectorised pass.
    converted = env._convert_block(all_ids, lo, count, *raw_fields)
    rows = np.arange(observation.shape[0])[:, None]
    new_rows = (rows >= lo) & (rows < count)
    done_bufs = []
    old_rows = (None,) * 3 if pending is None else pending[:3]
    for value, old in zip(converted, old_rows, strict=True):
      buf = np.zeros(value.shape, value.dtype)
      if old is not None:
        buf[: old.shape[0]] = old
      np.copyto(buf, value, where=new_rows)
      done_bufs.append(buf)

    traj_np, pending = _split_unroll(
        [*done_bufs, observation, *action_and_extras], extras_def[0], count, T
    )
    new_state = RolloutState(key, pending, count - T, live["generation"], parked.state())
    traj = jax.device_put(traj_np) if to_device else traj_np
    return new_state, traj, env.pop_episode_stats()

  return Rollout(init=init, unroll=unroll, env=env, unroll_length=T)
