"""The host backend of `make_rollout`: a Python loop over an `EnvPoolEnv`.

Between calls every environment has exactly one action in flight (or parked, below;
`_rollout_base.py`): the action at its newest collected step. `unroll` repeats: `recv_raw()`
-> one jitted call that splits the key and runs `act(params, obs, key)` -> the action and
behaviour outputs to host -> `send()` (validate, clip, hand to envpool) -> keep the step's
arrays. After the loop the steps are placed into `[rows, num_envs, ...]` buffers (one copy
per field, a scatter keyed by env_id when stepping is batched), and FIRST/MID/LAST, reward 0
at FIRST, discounts and episode statistics are computed once per unroll, vectorised over the
block (`EnvPoolEnv.convert_block`, the code `recv()` uses). Without batched stepping an
unroll is exactly T iterations (T+1 after `init`). With batched stepping environments
progress at different speeds; the ones that get ahead keep stepping, and their extra steps
are carried in the state as the beginning of the next unroll, keyed by env_id. An
environment more than T rows ahead is parked: its action is held back (and sent first by the
next unroll) while enough others stay in flight to fill a batch (fewer, and `recv` would
block forever), which bounds the rows carried over.

The state carried between unrolls is a `RolloutState` of NumPy arrays. A state may be used
once: the loop rejects a stale one (already consumed by `unroll`, or from before `init`).

On a small CPU the loop's per-step policy call is several times cheaper with
`jax.config.update("jax_cpu_enable_async_dispatch", False)` at process start (a
process-wide setting: of the library, only `training.run_experiment` sets it, for an
envpool run on a CPU; docs/envs_notes.md).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import numpy as np

from offpolicy_ac.envs import _rollout_base
from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._rollout_base import ActFn
from offpolicy_ac.envs._rollout_base import ParkedActions
from offpolicy_ac.envs._rollout_base import check_rollout_args
from offpolicy_ac.envs._rollout_base import furthest_ahead
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["RolloutState", "host_rollout"]


class RolloutState(NamedTuple):
  """What carries over between unrolls of the host backend (NumPy arrays, and the key).

  Attributes:
    key: PRNG key for the next policy call.
    pending: Trajectory of [P, num_envs, ...]: steps already collected for the next
      unroll; row 0 of column b is the shared boundary step of env b (index T of the
      previous unroll), later rows exist only with batched stepping, for environments
      that got ahead. Empty (P = 0) right after `init`.
    num_pending: [num_envs] int, how many rows of `pending` are valid per environment.
      The action of the newest one is in flight, or parked.
    generation: identifies the live state; a stale one is rejected.
    parked: batched stepping: (env_id [p], action [p, ...]) of environments whose newest
      action was held back because they were too far ahead; the next unroll sends them
      first. None when nothing is parked.
  """

  key: jax.Array
  pending: Trajectory | None
  num_pending: np.ndarray
  generation: int
  parked: tuple[np.ndarray, np.ndarray] | None = None


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
  # Whole batches in env_id order (no batched stepping) fill rows [lo, lo + K / n) of
  # every column: one copy.
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


def host_rollout(env: EnvPoolEnv, act_fn: ActFn, unroll_length: int) -> tuple[
    Callable[[Any, jax.Array], RolloutState],
    Callable[[Any, RolloutState], tuple[RolloutState, Trajectory, EpisodeStats]],
]:
  """The host backend of `make_rollout`: (init, unroll), NumPy trajectories."""
  T = check_rollout_args(env, act_fn, unroll_length)
  spec = env.spec
  n, b = spec.num_envs, spec.batch_size
  batched = spec.is_batched
  atari = env.is_atari
  all_ids = np.arange(n, dtype=ENV_ID_DTYPE)
  max_lead = int(_rollout_base.MAX_LEAD_ROWS_PER_STEP * T)
  live = _rollout_base.LiveState(env)
  extras_def: list[Any] = []  # the treedef of act's extras, found when tracing

  @jax.jit
  def policy_step(params, obs, key):
    key, sub = jax.random.split(key)
    action, extras = _rollout_base.call_policy(act_fn, params, obs, sub, obs.shape[0])
    leaves, treedef = jax.tree.flatten(extras)
    extras_def[:] = [treedef]
    return key, action, tuple(leaves)

  def init(params: Any, key: jax.Array) -> RolloutState:
    del params  # the first action is taken by the first unroll
    _rollout_base.restart(env, key)
    return RolloutState(key, None, np.zeros((n,), np.int64), live.renew())

  def check_outputs(action: np.ndarray, extras: list[np.ndarray], pending: Any) -> None:
    """act's outputs at the first step of an unroll: the action's batch axis (the extras'
    is checked where act is traced, `call_policy`), and the same extras structure as the
    steps carried over (`pending`)."""
    if pending is None:
      _check_batch_leaf("action", action, b)
    else:
      new = jax.tree.unflatten(extras_def[0], extras)
      _rollout_base.check_carried_extras(pending.extras, new, carried_lead=2, new_lead=1)

  def park(
      env_id: np.ndarray, action: np.ndarray, count: np.ndarray, parked: ParkedActions
  ) -> None:
    """Sends the batch's actions, except those of environments more than
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
    generation = live.take(state)
    key, pending = state.key, state.pending
    lo = state.num_pending  # rows [0, lo) of each column were collected before
    # The loop only collects. Each step's arrays are kept as they are (envpool hands out
    # new arrays on every recv, and the policy's outputs are immutable) and placed into
    # the [rows, num_envs, ...] buffers once, after the loop.
    steps: list[tuple[np.ndarray, ...]] = []  # (env_id, observation, raw..., action, *extras)
    remaining = T + 1 - int(lo[0])  # not batched: steps still to collect
    count = lo.copy()  # batched: steps collected per environment
    checked = False
    off_host = None  # act's outputs are on an accelerator (found at the first step)
    parked = ParkedActions()
    if state.parked is not None:
      env.send(state.parked[1], state.parked[0])
    while (count.min() < T + 1) if batched else (remaining > 0):
      raw = env.recv_raw()
      key, action, extras = policy_step(params, raw.obs, key)
      if off_host is None:
        off_host = any(d.platform != "cpu" for d in action.devices())
      if off_host:  # one wait for every output's copy instead of one per output
        for x in (action, *extras):
          x.copy_to_host_async()
      action = np.asarray(action)
      extras = [np.asarray(x) for x in extras]
      if not checked:
        check_outputs(action, extras, pending)
        checked = True
      # Hand the actions to envpool first; keep the step while the environments step.
      if batched:
        count[raw.env_id] += 1
        park(raw.env_id, action, count, parked)
      else:
        env.send(action)  # validates and clips; env_id = the batch just received
        remaining -= 1
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
    converted = env.convert_block(all_ids, lo, count, *raw_fields)
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
    new_state = RolloutState(key, pending, count - T, generation, parked.state())
    return new_state, traj_np, env.pop_episode_stats()

  return init, unroll
