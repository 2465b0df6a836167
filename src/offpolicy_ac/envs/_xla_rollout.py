"""Fully jitted rollouts through envpool's XLA interface (`env.xla()` inside `lax.scan`).

The switch next to the host loop of `_rollout.py`: same `Trajectory` and indexing, same
TimeStep semantics, same `(init, unroll)` interface, but one compiled `lax.scan` per unroll
in which envpool's recv/send run as XLA custom calls, so there is no Python per step.

    rollout = make_xla_rollout(env, act_fn, unroll_length=T)
    state = rollout.init(params, key)
    state, traj, stats = rollout.unroll(params, state)   # traj [T+1, num_envs, ...] on device

Limits (each raises ValueError in `make_xla_rollout`):
  * sync environments only (`batch_size == num_envs`): async batches have data-dependent
    env ids, which the scan would have to scatter; use `make_rollout` for async;
  * actions must have the dtype envpool wants: int32 (discrete) or float32 (Pendulum, ...);
    MuJoCo tasks want float64 actions, which JAX only has with `jax_enable_x64`.
Action checks: dtype and shape at trace time, i.e. before any step; continuous actions are
clipped in the graph; an out-of-range discrete action cannot raise inside the compiled loop,
so it is clipped for envpool and reported by a ValueError after the unroll (the stored
trajectory keeps the policy's action).

`init` needs `params`: it receives the reset step and takes its action inside one jitted
call, so that every unroll is one scan of exactly T steps (row 0 is carried in the state).
While this rollout owns an `EnvPoolEnv`, do not step it through its host methods.

Investigation (docs/envs_notes.md): on jax 0.10.2 / envpool 1.2.5 CPU, threading the handle
through `lax.scan` and `fori_loop` worked in every variant tried (carried handle, closed-over
handle, send/recv split, async recv/send, Atari, 1e4-step loops, repeated calls, a stale
handle, `xla()` called twice); no segfault reproduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._rollout import ActFn, check_rollout_args
from offpolicy_ac.envs._timestep import FIRST, LAST, MID, EpisodeStats
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["XlaRollout", "XlaRolloutState", "make_xla_rollout"]


class _EnvCarry(NamedTuple):
    """Per-environment state, [num_envs] each (indexed by env_id)."""

    next_is_first: jax.Array  # bool
    next_starts_episode: jax.Array  # bool
    episode_return: jax.Array  # float32
    episode_length: jax.Array  # int32


class XlaRolloutState(NamedTuple):
    """Carried between unrolls (device arrays).

    Attributes:
      handle: envpool's XLA handle.
      key: PRNG key for the next policy call.
      boundary: Trajectory of [num_envs, ...], the shared boundary step (index T of the last
        unroll, index 0 of the next); its action is in flight.
      env_carry: per-environment TimeStep and episode-statistics state.
    """

    handle: jax.Array
    key: jax.Array
    boundary: Trajectory
    env_carry: _EnvCarry


class XlaRollout(NamedTuple):
    """`init(params, key) -> state`;
    `unroll(params, state) -> (state, Trajectory, EpisodeStats)`."""

    init: Callable[[Any, jax.Array], XlaRolloutState]
    unroll: Callable[[Any, XlaRolloutState], tuple[XlaRolloutState, Trajectory, EpisodeStats]]
    env: EnvPoolEnv
    unroll_length: int


def make_xla_rollout(env: EnvPoolEnv, act_fn: ActFn, unroll_length: int) -> XlaRollout:
    """Makes a fully jitted rollout of `unroll_length` steps (sync environments only).

    Args:
      env: a sync `EnvPoolEnv` whose actions are int32 or float32 (see module docstring).
      act_fn: `act(params, obs, key) -> (action, extras)`, jittable.
      unroll_length: T >= 1.

    Raises:
      ValueError: bad arguments or an unsupported environment.
    """
    T = check_rollout_args(env, act_fn, unroll_length)
    spec = env.spec
    if spec.is_async:
        raise ValueError(
            "make_xla_rollout supports sync environments only (batch_size == num_envs); "
            "use make_rollout for asynchronous stepping"
        )
    pool = env.pool
    pool_action_dtype = np.dtype(pool._spec._action_spec[-1][0])
    if pool_action_dtype == np.float64 and not jax.config.jax_enable_x64:
        raise ValueError(
            f"{spec.task_id} takes float64 actions, which envpool's XLA interface can only "
            "receive with jax_enable_x64; use make_rollout"
        )
    n = spec.num_envs
    atari = env._atari
    obs_dtype = jnp.dtype(spec.observation_dtype)
    handle0, xla_recv, xla_send, _ = pool.xla()
    if spec.is_discrete:
        num_actions = spec.num_actions
    else:
        low = jnp.asarray(np.asarray(spec.action_low, np.float32).reshape(spec.action_shape))
        high = jnp.asarray(np.asarray(spec.action_high, np.float32).reshape(spec.action_shape))

    def check_action(action: jax.Array) -> None:
        expected = (n, *spec.action_shape)
        if tuple(action.shape) != expected:
            raise ValueError(f"{spec.task_id}: action shape {action.shape}, expected {expected}")
        kind = jnp.dtype(action.dtype).kind
        if spec.is_discrete and kind not in "iu":
            raise ValueError(
                f"{spec.task_id}: discrete actions must have an integer dtype, got {action.dtype}"
            )
        if not spec.is_discrete and kind != "f":
            raise ValueError(
                f"{spec.task_id}: continuous actions must have a floating dtype, got {action.dtype}"
            )

    def to_env(action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(action as envpool wants it, [n] bool out of range)."""
        if spec.is_discrete:
            bad = (action < 0) | (action >= num_actions)
            return jnp.clip(action, 0, num_actions - 1).astype(pool_action_dtype), bad
        bad = ~jnp.all(jnp.isfinite(action), axis=tuple(range(1, action.ndim)))
        clipped = jnp.clip(action, low[None], high[None])
        return jnp.where(jnp.isfinite(clipped), clipped, 0.0).astype(pool_action_dtype), bad

    def env_step(handle, carry: _EnvCarry):
        """recv one step of every env and convert it (ALF semantics, per env_id)."""
        handle, (obs, reward, terminated, truncated, info) = xla_recv(handle)
        first = carry.next_is_first
        done = terminated | truncated
        step_type = jnp.where(first, FIRST, jnp.where(done, LAST, MID)).astype(jnp.int32)
        reward = jnp.where(first, 0.0, reward).astype(jnp.float32)
        discount = (~terminated).astype(jnp.float32)
        if atari:
            score = jnp.where(first, 0.0, info["reward"]).astype(jnp.float32)
            over = done & (truncated | info["terminated"].astype(bool))
        else:
            score, over = reward, done
        starts = carry.next_starts_episode
        ret = jnp.where(starts, 0.0, carry.episode_return) + score
        length = jnp.where(starts, 0, carry.episode_length) + (~first).astype(jnp.int32)
        in_order = jnp.all(info["env_id"] == jnp.arange(n, dtype=info["env_id"].dtype))
        fields = (
            step_type,
            reward,
            discount,
            obs.astype(obs_dtype),
            info["env_id"].astype(jnp.int32),
        )
        return handle, _EnvCarry(done, over, ret, length), fields, (over, ret, length, in_order)

    def policy(params, obs, key):
        key, sub = jax.random.split(key)
        action, extras = act_fn(params, obs, sub)
        check_action(action)
        return key, action, extras

    def one_step(params, handle, key, carry):
        handle, carry, fields, stats = env_step(handle, carry)
        key, action, extras = policy(params, fields[3], key)
        env_action, bad = to_env(action)
        handle = xla_send(handle, env_action)
        return handle, key, carry, Trajectory(*fields, action=action, extras=extras), stats, bad

    @jax.jit
    def init_step(params, handle, key):
        carry = _EnvCarry(
            jnp.ones((n,), bool),
            jnp.ones((n,), bool),
            jnp.zeros((n,), jnp.float32),
            jnp.zeros((n,), jnp.int32),
        )
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
        traj = jax.tree.map(lambda b, s: jnp.concatenate([b[None], s]), state.boundary, steps)
        boundary = jax.tree.map(lambda s: s[-1], steps)
        return XlaRolloutState(handle, key, boundary, carry), traj, stats, jnp.any(bad)

    def init(params: Any, key: jax.Array) -> XlaRolloutState:
        env.async_reset()
        state, bad = init_step(params, jnp.asarray(handle0), key)
        if bool(bad):
            raise ValueError(
                f"{spec.task_id}: the policy produced an out-of-range or non-finite action"
            )
        return state

    def unroll(
        params: Any, state: XlaRolloutState
    ) -> tuple[XlaRolloutState, Trajectory, EpisodeStats]:
        if not isinstance(state, XlaRolloutState):
            raise ValueError(f"unroll expects an XlaRolloutState, got {type(state).__name__}")
        state, traj, (over, ret, length, in_order), bad = unroll_core(params, state)
        over, ret, length, in_order, bad = jax.device_get((over, ret, length, in_order, bad))
        if not in_order.all():
            raise RuntimeError("envpool returned sync steps out of env_id order")
        if bad:
            raise ValueError(
                f"{spec.task_id}: the policy produced an out-of-range or non-finite action "
                "(clipped for the environment; stored as produced)"
            )
        r, c = np.nonzero(over)
        stats = EpisodeStats(
            c.astype(np.int32), ret[r, c].astype(np.float64), length[r, c].astype(np.int64)
        )
        return state, traj, stats

    return XlaRollout(init=init, unroll=unroll, env=env, unroll_length=T)
