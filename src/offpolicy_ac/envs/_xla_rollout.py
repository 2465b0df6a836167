"""The compiled backend of `make_rollout`: envpool's XLA interface in one compiled loop.

Same `Trajectory` and indexing, same TimeStep semantics and the same `(init, unroll)`
interface as the host loop of `_host_rollout.py`, but the steps run inside one compiled loop per
unroll in which envpool's recv/send are XLA custom calls: no Python per step.

Without batched stepping (`batch_size == num_envs`): one `lax.scan` of exactly T steps per
unroll; row 0 (the shared boundary step, whose action is in flight) is carried in the
state, which is why `init` takes `params`: it receives the reset step and takes its action.

With batched stepping (`batch_size < num_envs`) each recv returns whichever `batch_size`
environments are ready, so how many steps an unroll takes is data-dependent. One
`lax.while_loop` steps until every environment has its T+1 rows, writing the step at row
count[env_id] of column env_id into ring buffers [R, n, ...] (R > T+1: room for
environments that get ahead, grown by doubling, i.e. a recompile, when one would overflow).
Row r lives at (offset + r) % R; the trajectory is gathered from rows [0, T], and advancing
the offset by T carries rows [T, count) into the next unroll without moving them. Per-env
TimeStep and episode state is gathered and scattered by env_id inside the loop. An
environment more than T rows ahead is parked as in the host loop: the compiled loop stops
before sending a batch that holds one, the host holds its action back and sends the others
through envpool's Python API (the same pool), and the next unroll sends it first. `init`
only shapes the column buffers.

Limits: actions must have the dtype envpool takes, int32 (discrete) or float32 (Pendulum,
...); MuJoCo tasks take float64 actions, which JAX only has with `jax_enable_x64`, and are
refused with a ValueError when the rollout is made, as are tasks that return 64-bit arrays
(MetaWorld, MyoSuite and Adroit observations) without it: envpool writes them at their own
width into the buffers JAX gives it.
Placement: envpool's custom calls are CPU code, so the whole loop, policy included, runs on
this process's first CPU device whatever the default device is: `params` and `key` are
copied there (a no-op when they are there already) and the trajectory is returned there.
Action checks: dtype and shape at trace time, i.e. before any step; continuous actions are
clipped in the graph; an out-of-range discrete action cannot raise inside the compiled loop,
so it is clipped for envpool and reported by a ValueError after the unroll (the stored
trajectory keeps the policy's action).
While this rollout owns an `EnvPoolEnv`, do not step it through its host methods.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs import _rollout_base
from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._envpool_env import action_dtype_of
from offpolicy_ac.envs._envpool_env import check_task_id
from offpolicy_ac.envs._envpool_env import pool_spec_of
from offpolicy_ac.envs._rollout_base import ActFn
from offpolicy_ac.envs._rollout_base import ParkedActions
from offpolicy_ac.envs._rollout_base import check_rollout_args
from offpolicy_ac.envs._rollout_base import furthest_ahead
from offpolicy_ac.envs._terminal_states import split_limit_step
from offpolicy_ac.envs._timestep import FIRST
from offpolicy_ac.envs._timestep import LAST
from offpolicy_ac.envs._timestep import MID
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import check_traced_actions
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["XlaBatchedRolloutState", "XlaRolloutState", "compiled_rollout"]


# Batched stepping: room in the column buffers, beyond T+1 rows, for environments that get
# ahead: this many rows per step of the unroll (growing recompiles the loop, so start with
# plenty). Tests set 0 to exercise the growth path.
_BATCHED_EXTRA_ROWS_PER_STEP = 1


class _EnvCarry(NamedTuple):
  """Per-environment state, [num_envs] each (indexed by env_id)."""

  next_is_first: jax.Array  # bool
  next_starts_episode: jax.Array  # bool
  episode_return: jax.Array  # [num_envs, 2] float32: a two-float sum (`_add_to_sum`)
  episode_length: jax.Array  # int32


def _add_to_sum(total: jax.Array, x: jax.Array) -> jax.Array:
  """`total` [..., 2] float32, a sum held as two floats (high, low: the sum is high + low),
  plus `x` [...] float32. The rounding error of each addition is kept in `low` (Knuth's
  TwoSum, then renormalised), so `float64(high) + float64(low)` is the float64 sum the host
  backend reports to about float32's precision squared (a plain float32 sum drifts by about
  1e-7 of the return over a long episode of fractional rewards)."""
  high, low = total[..., 0], total[..., 1]
  s = high + x
  x_part = s - high
  low = low + ((high - (s - x_part)) + (x - x_part))
  high = s + low
  return jnp.stack([high, low - (high - s)], axis=-1)


def _float64_sums(total: np.ndarray) -> np.ndarray:
  """[..., 2] two-float sums (`_add_to_sum`) -> [...] float64."""
  total = np.asarray(total, np.float64)
  return total[..., 0] + total[..., 1]


class XlaRolloutState(NamedTuple):
  """Carried between unrolls of the compiled backend without batched stepping (arrays on
  the first CPU device).

  Attributes:
    handle: envpool's XLA handle.
    key: PRNG key for the next policy call.
    boundary: Trajectory of [num_envs, ...], the shared boundary step (index T of the last
      unroll, index 0 of the next); its action is in flight.
    env_carry: per-environment TimeStep and episode-statistics state.
    generation: identifies the live state (a state can be unrolled once; a stale one is
      refused, as the host backend's); None inside the compiled loop.
  """

  handle: jax.Array
  key: jax.Array
  boundary: Trajectory
  env_carry: _EnvCarry
  generation: Optional[int] = None


class XlaBatchedRolloutState(NamedTuple):
  """Carried between unrolls of the compiled backend with batched stepping.

  Attributes:
    handle: envpool's XLA handle.
    key: PRNG key for the next policy call.
    env_carry: per-environment TimeStep and episode-statistics state.
    pending: Trajectory of [R, num_envs, ...] ring buffers (JAX arrays), R > T+1; rows [0,
      num_pending[e]) of column e, stored at (pending_offset + row) % R, are the steps
      already collected for the next unroll (as `RolloutState.pending`), later rows are
      room. Donated to the next unroll: a state can be unrolled once.
    num_pending: [num_envs] int, the valid rows of `pending` per environment.
    pending_offset: where row 0 of `pending` is stored, in [0, R).
    parked: (env_id [p], action [p, ...] as envpool takes it) of environments held back
      for being too far ahead (as in `RolloutState`); sent first by the next unroll.
    generation: identifies the live state (a stale one is refused, as the other
      backends' are).
  """

  handle: jax.Array
  key: jax.Array
  env_carry: _EnvCarry
  pending: Trajectory
  num_pending: np.ndarray
  pending_offset: int = 0
  parked: tuple[np.ndarray, np.ndarray] | None = None
  generation: Optional[int] = None


class _Precompiled:
  """A jitted function called through its ahead-of-time compiled executable.

  envpool's XLA recv/send are custom calls with side effects, which turn JAX's C++ fast
  path off for every jitted function that holds them: each call of the unroll's loop goes
  through jit's Python dispatch (tracing-cache lookups, per-argument checks), about twice
  what calling the compiled executable of the same lowering costs (about 0.2 ms saved per
  call for the unroll's ~40 argument and output arrays: several percent of a CartPole
  unroll). Compiled at the first call, and again if the arguments' types change (the
  executable refuses them with a TypeError before running anything)."""

  def __init__(self, jitted: Any):
    self._jitted = jitted
    self._compiled: Any = None

  def __call__(self, *args: Any) -> Any:
    if self._compiled is not None:
      try:
        return self._compiled(*args)
      except TypeError:
        pass  # other argument types (checked before anything runs): compile for them
    self._compiled = self._jitted.lower(*args).compile()
    return self._compiled(*args)


class _PlacedParams:
  """`params` on the CPU device the compiled loop runs on, placed once per set of arrays.

  An actor passes the same parameters to every unroll until the learner publishes new
  ones, and `jax.device_put` of a pytree costs about 0.1 ms even when nothing moves (a
  few percent of a CartPole unroll). The placement is reused while the pytree has the same
  structure and the very same leaves, all JAX arrays (immutable; NumPy leaves, which could
  change in place, are placed every time)."""

  def __init__(self, cpu: jax.Device):
    self._cpu = cpu
    self._treedef: Any = None
    self._leaves: list[Any] = []
    self._placed: Any = None

  def __call__(self, params: Any) -> Any:
    leaves, treedef = jax.tree.flatten(params)
    if (
        self._treedef is not None
        and treedef == self._treedef
        and all(a is b for a, b in zip(leaves, self._leaves))
    ):
      return self._placed
    placed = jax.device_put(params, self._cpu)
    if all(isinstance(x, jax.Array) for x in leaves):
      self._treedef, self._leaves, self._placed = treedef, leaves, placed
    else:
      self._treedef, self._leaves, self._placed = None, [], None
    return placed


_Init = Callable[[Any, jax.Array], Any]
_Unroll = Callable[[Any, Any], tuple[Any, Trajectory, EpisodeStats]]


def check_action_dtype(task_id: str, dtype: np.dtype | None) -> np.dtype:
  """`dtype`, the dtype envpool takes the task's actions in, refused (ValueError) where
  envpool's XLA interface cannot receive it: unreported, or float64 (MuJoCo) without
  `jax_enable_x64`. Before a run is built: `check_action_dtype(task_id,
  envs.pool_action_dtype(task_id, ...))`."""
  if dtype is None:
    raise ValueError(
        f"{task_id}: envpool does not report the dtype of its actions, which the compiled "
        "backend needs; use the host backend (backend='host', --rollout host)"
    )
  if dtype == np.float64 and not jax.config.jax_enable_x64:
    raise ValueError(
        f"{task_id} takes float64 actions, which envpool's XLA interface can only receive "
        "with jax_enable_x64; use the host backend (backend='host', --rollout host)"
    )
  return dtype


_WIDE_DTYPES = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.uint64))


def _check_output_widths(task_id: str, pool_spec: Any) -> None:
  """Refuses a pool that returns 64-bit arrays (MetaWorld's float64 observations and
  infos) while JAX runs without `jax_enable_x64`: JAX gives envpool's XLA interface 32-bit
  buffers for them, and envpool writes past their ends (the process aborted with
  corrupted memory)."""
  if jax.config.jax_enable_x64:
    return
  wide = [
      f"{name.removeprefix('info:')} ({np.dtype(array.dtype).name})"
      for name, array in pool_spec.state_array_spec.items()
      if np.dtype(array.dtype) in _WIDE_DTYPES
  ]
  if wide:
    more = f" and {len(wide) - 3} more" if len(wide) > 3 else ""
    raise ValueError(
        f"{task_id} returns 64-bit arrays ({', '.join(wide[:3])}{more}), which envpool's XLA "
        "interface can only hand to JAX with jax_enable_x64; use the host backend "
        "(backend='host', --rollout host)"
    )


def _xla_action_dtype(task_id: str, pool_spec: Any) -> np.dtype:
  """The dtype of the actions of the pool envpool's spec `pool_spec` describes, refused
  where envpool's XLA interface cannot receive them or hand over its outputs."""
  dtype = check_action_dtype(task_id, action_dtype_of(pool_spec))
  _check_output_widths(task_id, pool_spec)
  return dtype


def check_compiled_task(task_id: str, **envpool_kwargs: Any) -> np.dtype:
  """The dtype envpool takes the task's actions in, refused (ValueError) where the compiled
  backend cannot step the task with these envpool options: as `check_action_dtype`, or
  64-bit observations or infos without `jax_enable_x64`. Makes no pool: call it before a
  run is built."""
  pool_spec = pool_spec_of(check_task_id(task_id), task_id, 1, dict(envpool_kwargs))
  return _xla_action_dtype(task_id, pool_spec)


def compiled_rollout(env: EnvPoolEnv, act_fn: ActFn, unroll_length: int) -> tuple[_Init, _Unroll]:
  """The compiled backend of `make_rollout`: (init, unroll), trajectories as JAX arrays on
  the first CPU device.

  Raises:
    ValueError: bad arguments, or an environment whose actions are neither int32 nor
      float32 (see the module docstring).
  """
  T = check_rollout_args(env, act_fn, unroll_length)
  spec = env.spec
  pool = env.pool
  pool_action_dtype = _xla_action_dtype(env.spec.task_id, env.pool.spec)
  n, b = spec.num_envs, spec.batch_size
  cpu = jax.local_devices(backend="cpu")[0]
  place = _PlacedParams(cpu)
  atari = env.is_atari
  terminal = env.terminal_test
  obs_dtype = jnp.dtype(spec.observation_dtype)
  handle0, xla_recv, xla_send, _ = pool.xla()
  if spec.is_discrete:
    num_actions = spec.num_actions
  else:
    low = jnp.asarray(np.asarray(spec.action_low, np.float32).reshape(spec.action_shape))
    high = jnp.asarray(np.asarray(spec.action_high, np.float32).reshape(spec.action_shape))

  def check_action(action: jax.Array) -> None:
    check_traced_actions(spec, action, b)

  def to_env(action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(action as envpool wants it, [batch] bool: out of range or not finite)."""
    if spec.is_discrete:
      bad = (action < 0) | (action >= num_actions)
      return jnp.clip(action, 0, num_actions - 1).astype(pool_action_dtype), bad
    bad = ~jnp.all(jnp.isfinite(action), axis=tuple(range(1, action.ndim)))
    clipped = jnp.clip(action, low[None], high[None])
    return jnp.where(jnp.isfinite(clipped), clipped, 0.0).astype(pool_action_dtype), bad

  def env_step(handle, carry: _EnvCarry):
    """recv one batch and convert it (ALF semantics, per-env state indexed by env_id)."""
    handle, (obs, reward, terminated, truncated, info) = xla_recv(handle)
    game_over = info["terminated"] if atari else None
    terminated, truncated = split_limit_step(obs, terminated, truncated, game_over, terminal, jnp)
    env_id = info["env_id"].astype(jnp.int32)
    first = carry.next_is_first[env_id]
    done = terminated | truncated
    step_type = jnp.where(first, FIRST, jnp.where(done, LAST, MID)).astype(jnp.int32)
    reward = jnp.where(first, 0.0, reward).astype(jnp.float32)
    discount = (~terminated).astype(jnp.float32)
    if atari:
      score = jnp.where(first, 0.0, info["reward"]).astype(jnp.float32)
      over = done & (truncated | game_over.astype(bool))
    else:
      score, over = reward, done
    starts = carry.next_starts_episode[env_id]
    ret = _add_to_sum(jnp.where(starts[:, None], 0.0, carry.episode_return[env_id]), score)
    length = jnp.where(starts, 0, carry.episode_length[env_id]) + (~first).astype(jnp.int32)
    carry = _EnvCarry(
        carry.next_is_first.at[env_id].set(done),
        carry.next_starts_episode.at[env_id].set(over),
        carry.episode_return.at[env_id].set(ret),
        carry.episode_length.at[env_id].set(length),
    )
    in_order = jnp.all(env_id == jnp.arange(b, dtype=jnp.int32))
    fields = (step_type, reward, discount, obs.astype(obs_dtype), env_id)
    return handle, carry, fields, (over, ret, length, in_order)

  bad_action_message = (
      f"{spec.task_id}: the policy produced an out-of-range or non-finite action "
      "(clipped for the environment; stored as produced)"
  )

  def policy(params, obs, key):
    key, sub = jax.random.split(key)
    action, extras = _rollout_base.call_policy(act_fn, params, obs, sub, obs.shape[0])
    check_action(action)
    return key, action, extras

  def one_step(params, handle, key, carry, send=True):
    """recv, convert, act and (unless `send` is False) send. Without the send, the
    action as envpool takes it is returned as well, for the caller to send."""
    handle, carry, fields, stats = env_step(handle, carry)
    key, action, extras = policy(params, fields[3], key)
    env_action, bad = to_env(action)
    step = Trajectory(*fields, action=action, extras=extras)
    if not send:
      return handle, key, carry, step, stats, bad, env_action
    handle = xla_send(handle, env_action, fields[4])
    return handle, key, carry, step, stats, bad

  def initial_carry() -> _EnvCarry:
    return _EnvCarry(
        jnp.ones((n,), bool),
        jnp.ones((n,), bool),
        jnp.zeros((n, 2), jnp.float32),
        jnp.zeros((n,), jnp.int32),
    )

  if spec.is_batched:
    return _batched_rollout(
        env, T, one_step, xla_send, initial_carry, handle0, bad_action_message, cpu
    )

  return _unbatched_rollout(
      env, T, one_step, initial_carry, handle0, bad_action_message, cpu, place
  )


def _unbatched_rollout(
    env: EnvPoolEnv,
    T: int,
    one_step: Callable,
    initial_carry: Callable[[], _EnvCarry],
    handle0: np.ndarray,
    bad_action_message: str,
    cpu: Any,
    place: _PlacedParams,
) -> tuple[_Init, _Unroll]:
  """`compiled_rollout` without batched stepping: every step receives all environments
  in env_id order, and each unroll is one `lax.scan` of T steps."""

  @jax.jit
  def init_step(params, handle, key):
    carry = initial_carry()
    handle, key, carry, step, _, bad = one_step(params, handle, key, carry)
    return XlaRolloutState(handle, key, step, carry), jnp.any(bad)

  @jax.jit
  def unroll_core(params, state: XlaRolloutState):
    def body(c, _):
      handle, key, carry = c
      handle, key, carry, step, stats, bad = one_step(params, handle, key, carry)
      return (handle, key, carry), (step, stats, bad)

    (handle, key, carry), (steps, stats, bad) = jax.lax.scan(
        body, (state.handle, state.key, state.env_carry), None, length=T
    )
    _rollout_base.check_carried_extras(state.boundary.extras, steps.extras, 1, 2)
    traj = jax.tree.map(lambda b, s: jnp.concatenate([b[None], s]), state.boundary, steps)
    boundary = jax.tree.map(lambda s: s[-1], steps)
    return XlaRolloutState(handle, key, boundary, carry), traj, stats, jnp.any(bad)

  unroll_core = _Precompiled(unroll_core)

  live = _rollout_base.LiveState(env)

  def init(params: Any, key: jax.Array) -> XlaRolloutState:
    _rollout_base.restart(env, key)
    params, handle, key = jax.device_put((params, handle0, key), cpu)
    state, bad = init_step(params, handle, key)
    generation = live.renew()
    if bool(bad):
      raise ValueError(bad_action_message)
    return state._replace(generation=generation)

  def unroll(
      params: Any, state: XlaRolloutState
  ) -> tuple[XlaRolloutState, Trajectory, EpisodeStats]:
    if not isinstance(state, XlaRolloutState):
      raise ValueError(f"unroll expects an XlaRolloutState, got {type(state).__name__}")
    generation = live.take(state)
    state, traj, (over, ret, length, in_order), bad = unroll_core(
        place(params), state._replace(generation=None)
    )
    state = state._replace(generation=generation)
    over, ret, length, in_order, bad = jax.device_get((over, ret, length, in_order, bad))
    if not in_order.all():
      raise RuntimeError("envpool returned a whole batch out of env_id order")
    if bad:
      raise ValueError(bad_action_message)
    r, c = np.nonzero(over)
    stats = EpisodeStats(
        c.astype(np.int32), _float64_sums(ret[r, c]), length[r, c].astype(np.int64)
    )
    return state, traj, stats

  return init, unroll


def _ring_take(x: jax.Array, offset: jax.Array, count: int) -> jax.Array:
  """Rows [0, count) of the ring buffer x [R, ...] whose row 0 is at slot `offset`."""
  return jnp.take(x, offset + jnp.arange(count), axis=0, mode="wrap")


def _batched_collect(one_step: Callable, xla_send: Callable, T: int, n: int, b: int,
                     max_lead: int) -> _Precompiled:  # fmt: skip
  """The batched rollout's compiled loop (`collect` below), for `n` environments stepped
  `b` at a time: rows [0, T] of every column, parking environments more than `max_lead`
  rows ahead."""

  @functools.partial(jax.jit, donate_argnums=(4,))
  def collect(params, handle, key, carry, buf, offset, count, in_flight):
    """Steps until every environment has T+1 rows (`count`), writing each step at row
    count[env_id] of column env_id of the ring buffers `buf` [R, n, ...] (stored at
    (offset + row) % R). Stops early, rather than let a
    column overflow, or without sending a batch in which an environment got more than
    max_lead rows ahead (the host parks it and sends the others). Also returns (over,
    return, length) of each step, [R, n], and the unsent batch (env_id, action)."""
    rows = buf.step_type.shape[0]

    def step(c):
      handle, key, carry, buf, count, stats, bad, in_flight, _, unsent = c
      handle, key, carry, traj, step_stats, bad_now, action = one_step(
          params, handle, key, carry, send=False
      )
      _rollout_base.check_carried_extras(buf.extras, traj.extras, 2, 1)
      row, env_id = count[traj.env_id], traj.env_id
      slot = (offset + row) % rows
      buf = jax.tree.map(lambda x, v: x.at[slot, env_id].set(v), buf, traj)
      stats = jax.tree.map(lambda x, v: x.at[row, env_id].set(v), stats, step_stats[:3])
      count = count.at[env_id].add(1)
      in_flight = in_flight - b
      # Park only while other environments still need steps and some stay in flight.
      hold = jnp.any(count[env_id] >= T + 1 + max_lead) & (jnp.min(count) < T + 1) & (in_flight > 0)
      handle = jax.lax.cond(hold, lambda h: h, lambda h: xla_send(h, action, env_id), handle)
      in_flight = in_flight + jnp.where(hold, 0, b)
      bad = bad | jnp.any(bad_now)
      return handle, key, carry, buf, count, stats, bad, in_flight, hold, (env_id, action)

    stats = (
        jnp.zeros((rows, n), bool),
        jnp.zeros((rows, n, 2), jnp.float32),
        jnp.zeros((rows, n), jnp.int32),
    )
    action_shape = jax.eval_shape(
        lambda *c: one_step(params, *c, send=False)[6], handle, key, carry
    )
    unsent = (jnp.zeros((b,), jnp.int32), jnp.zeros(action_shape.shape, action_shape.dtype))
    init = (handle, key, carry, buf, count, stats, jnp.bool_(False), in_flight,
                jnp.bool_(False), unsent)  # fmt: skip

    def more(c):
      count, held = c[4], c[8]
      return (jnp.min(count) < T + 1) & (jnp.max(count) < rows) & ~held

    handle, key, carry, buf, count, stats, bad, _, held, unsent = jax.lax.while_loop(
        more, step, init
    )
    return handle, key, carry, buf, count, stats, bad, held, unsent

  return _Precompiled(collect)


def _batched_rollout(
    env: EnvPoolEnv,
    T: int,
    one_step: Callable,
    xla_send: Callable,
    initial_carry: Callable[[], _EnvCarry],
    handle0: np.ndarray,
    bad_action_message: str,
    cpu: jax.Device,
) -> tuple[_Init, _Unroll]:
  """`compiled_rollout` with batched stepping (see the module docstring)."""
  n, b = env.spec.num_envs, env.spec.batch_size
  place = _PlacedParams(cpu)
  # Rows of the column buffers beyond T+1: room for environments that get ahead. When one
  # would overflow, the compiled loop stops, the host doubles the room and goes on.
  slack = {"rows": int(_BATCHED_EXTRA_ROWS_PER_STEP * T)}
  # Environments more than max_lead rows beyond T+1 are parked, as in the host loop.
  max_lead = int(_rollout_base.MAX_LEAD_ROWS_PER_STEP * T)

  collect = _batched_collect(one_step, xla_send, T, n, b, max_lead)

  @functools.partial(jax.jit, static_argnums=(2,))
  def empty_columns(params, state_parts, rows):
    """Zero [rows, n, ...] buffers shaped like one step of every environment."""
    traj = jax.eval_shape(lambda *c: one_step(params, *c)[3], *state_parts)
    shape = lambda x: jnp.zeros((rows, n, *x.shape[1:]), x.dtype)  # noqa: E731
    return jax.tree.map(shape, traj)

  @functools.partial(jax.jit, static_argnums=(2,))
  def grow(buf, offset, rows):
    """The ring buffers `buf` with row 0 moved to slot 0 and room up to `rows` rows."""

    def pad(x):
      x = _ring_take(x, offset, x.shape[0])
      return jnp.concatenate([x, jnp.zeros((rows - x.shape[0], *x.shape[1:]), x.dtype)])

    return jax.tree.map(pad, buf)

  @jax.jit
  def unroll_rows(buf, offset):
    """Rows [0, T] of the ring buffers: the unroll (a copy; `buf` stays as it is)."""
    return jax.tree.map(lambda x: _ring_take(x, offset, T + 1), buf)

  def send_on_host(action: np.ndarray, env_id: np.ndarray) -> None:
    """Sends through envpool's Python API (the same pool the custom calls step)."""
    env.pool.send(np.array(action), np.array(env_id, np.int32))

  live = _rollout_base.LiveState(env)

  def init(params: Any, key: jax.Array) -> XlaBatchedRolloutState:
    _rollout_base.restart(env, key)
    params, handle, key, carry = jax.device_put((params, handle0, key, initial_carry()), cpu)
    buf = empty_columns(params, (handle, key, carry), T + 1 + slack["rows"])
    return XlaBatchedRolloutState(
        handle, key, carry, buf, np.zeros((n,), np.int64), generation=live.renew()
    )

  def unroll(
      params: Any, state: XlaBatchedRolloutState
  ) -> tuple[XlaBatchedRolloutState, Trajectory, EpisodeStats]:
    if not isinstance(state, XlaBatchedRolloutState):
      raise ValueError(f"unroll expects an XlaBatchedRolloutState, got {type(state).__name__}")
    generation = live.take(state)
    params = place(params)
    handle, key, carry, buf = state.handle, state.key, state.env_carry, state.pending
    count, offset, bad, finished = state.num_pending, state.pending_offset, False, []
    if state.parked is not None:
      send_on_host(state.parked[1], state.parked[0])
      env.mark_in_flight(state.parked[0], True)
    parked = ParkedActions()
    while True:
      before = count
      # Every environment not parked is in flight when the loop starts.
      in_flight = n - parked.count
      handle, key, carry, buf, count, (over, ret, length), bad_now, held, unsent = collect(
          params, handle, key, carry, buf, offset, jnp.asarray(count, jnp.int32), in_flight
      )
      count = np.asarray(count).astype(np.int64)
      bad |= bool(bad_now)
      over, ret, length = jax.device_get((over, ret, length))
      rows = np.arange(over.shape[0])[:, None]
      r, c = np.nonzero(over & (rows >= before) & (rows < count))
      finished.append(
          EpisodeStats(c.astype(np.int32), _float64_sums(ret[r, c]), length[r, c].astype(np.int64))
      )
      if bool(held):
        # Park the environments furthest ahead (as many as leave a batch in flight:
        # the received batch is not) and send the rest of the batch.
        env_id, action = (np.asarray(x) for x in unsent)
        held_at = furthest_ahead(env_id, count, T + 1 + max_lead, in_flight - b)
        parked.hold(env_id, action, held_at, send_on_host)
        continue
      if count.min() >= T + 1:
        break
      # An environment got further ahead than the buffers have room for: grow them.
      slack["rows"] = max(1, 2 * slack["rows"])
      buf, offset = grow(buf, offset, T + 1 + slack["rows"]), 0
    if bad:
      raise ValueError(bad_action_message)
    traj = unroll_rows(buf, offset)
    offset = (offset + T) % buf.step_type.shape[0]
    new_state = XlaBatchedRolloutState(
        handle, key, carry, buf, count - T, offset, parked.state(), generation
    )
    if new_state.parked is not None:  # held back: not in flight (`drain` needs to know)
      env.mark_in_flight(new_state.parked[0], False)
    return new_state, traj, EpisodeStats.concatenate(finished)

  return init, unroll
