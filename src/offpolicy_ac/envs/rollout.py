"""Host-side rollouts: run a jitted policy on an `EnvPoolEnv` and return time-major unrolls.

`make_rollout(env, act_fn, unroll_length)` returns `Rollout(init, unroll)`:

    rollout = make_rollout(env, act_fn, unroll_length=T)
    state = rollout.init(key)                          # resets the environments
    state, traj, stats = rollout.unroll(params, state) # traj: Trajectory [T+1, num_envs, ...]

Indexing (see `trajectory.py`): `action[t]` is the action taken at step t, so `action[T]` of
one unroll is the first action of the next one, every field of index T of one unroll equals
index 0 of the next, and transitions [0, T) of consecutive unrolls tile the stream with no
step lost or counted twice. Column b of every unroll is environment `env_id == b`, in
asynchronous mode too.

How it runs. Every environment always has exactly one action in flight between calls: the
action at its newest collected step. `unroll` repeats `recv()` -> one jitted call of
`act(params, obs, key)` (which also splits the key) -> one device-to-host copy of the action
and behaviour outputs -> `send()` -> write into preallocated NumPy buffers, until each
environment has T+1 steps. In sync mode that is exactly T iterations (T+1 after `init`). In
async mode (`batch_size < num_envs`) environments progress at different speeds; the ones
that get ahead keep stepping (never parked: parking could leave fewer than `batch_size`
environments in flight and `recv` would block forever), and their extra steps are carried in
the state as the beginning of the next unroll, keyed by env_id. The trajectory is copied to
the device once per unroll.

The policy's action is stored as returned by `act` (continuous actions before clipping: the
environment receives them clipped to bounds), so behaviour log-probabilities in `extras`
match the stored action.

Why a host loop and not envpool's XLA interface (`env.xla()` inside `lax.scan`): see
docs/envs_notes.md. In short: on this machine (jax 0.10.2, envpool 1.2.5, CPU) threading the
handle through `lax.scan` / `fori_loop` did not crash in any variant we probed, but the XLA
path only offers sync stepping (async needs per-env scatter of variable batches), cannot
send the float64 actions MuJoCo tasks expect unless x64 is enabled, and keeps envpool's own
TimeStep semantics out of reach of `EnvPoolEnv`'s checks, so the host loop is the default.
`make_xla_rollout` in `xla_rollout.py` is the fully jitted variant for sync discrete or
float32-continuous tasks.

State is explicit (`RolloutState`) but the environments are not: a state may be used once.
Passing a stale state (one already consumed by `unroll`, or from before `init`) raises.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from offpolicy_ac.envs.envpool_env import EnvPoolEnv
from offpolicy_ac.envs.timestep import ENV_ID_DTYPE, STEP_TYPE_DTYPE, EpisodeStats
from offpolicy_ac.envs.trajectory import Trajectory

__all__ = ["ActFn", "RolloutState", "Rollout", "make_rollout"]

ActFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""`act(params, obs [B, *obs_shape], key) -> (action [B, *action_shape], extras pytree of [B, ...])`."""

_generation = itertools.count(1)


class RolloutState(NamedTuple):
    """What carries over between unrolls (host-side, NumPy).

    Attributes:
      key: PRNG key for the next policy call.
      pending: Trajectory of [P, num_envs, ...]: steps already collected for the next
        unroll; row 0 of column b is the shared boundary step of env b (index T of the
        previous unroll), later rows exist only in async mode for environments that got
        ahead. Empty (P = 0) right after `init`.
      num_pending: [num_envs] int, how many rows of `pending` are valid per environment.
        The action of the newest one is in flight.
      generation: identifies the live state; a stale one is rejected.
    """

    key: jax.Array
    pending: Trajectory | None
    num_pending: np.ndarray
    generation: int


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
    if not isinstance(env, EnvPoolEnv):
        raise ValueError(f"env must be an EnvPoolEnv (from envs.make), got {type(env).__name__}")
    if not callable(act_fn):
        raise ValueError("act_fn must be callable: act(params, obs, key) -> (action, extras)")
    if isinstance(unroll_length, bool) or not isinstance(unroll_length, (int, np.integer)):
        raise ValueError(f"unroll_length must be an int, got {unroll_length!r}")
    if unroll_length < 1:
        raise ValueError(f"unroll_length must be >= 1, got {unroll_length}")
    T = int(unroll_length)
    spec = env.spec
    n, b = spec.num_envs, spec.batch_size
    sync = not spec.is_async
    live = {"generation": 0}

    @jax.jit
    def policy_step(params, obs, key):
        key, sub = jax.random.split(key)
        action, extras = act_fn(params, obs, sub)
        return key, action, extras

    def init(key: jax.Array) -> RolloutState:
        env.async_reset()
        live["generation"] = next(_generation)
        return RolloutState(key, None, np.zeros((n,), np.int64), live["generation"])

    def alloc(rows: int, action_like: np.ndarray, extras_like: list[np.ndarray]) -> list[np.ndarray]:
        """Buffers for the flat field list (step_type, reward, discount, obs, env_id, action, *extras)."""
        return [
            np.empty((rows, n), STEP_TYPE_DTYPE),
            np.empty((rows, n), np.float32),
            np.empty((rows, n), np.float32),
            np.empty((rows, n, *spec.observation_shape), spec.observation_dtype),
            np.empty((rows, n), ENV_ID_DTYPE),
            np.empty((rows, n, *action_like.shape[1:]), action_like.dtype),
            *(np.empty((rows, n, *x.shape[1:]), x.dtype) for x in extras_like),
        ]

    def unroll(params: Any, state: RolloutState) -> tuple[RolloutState, Trajectory, EpisodeStats]:
        if not isinstance(state, RolloutState):
            raise ValueError(f"unroll expects a RolloutState, got {type(state).__name__}")
        if state.generation != live["generation"]:
            raise ValueError(
                "stale RolloutState: each state can be unrolled once (the environments have "
                "moved on); use the state returned by the last unroll, or init() again"
            )
        live["generation"] = next(_generation)
        key = state.key
        count = state.num_pending.copy()
        bufs: list[np.ndarray] | None = None
        treedef = None
        capacity = T + 1 if sync else 2 * T + 1
        if state.pending is not None:
            flat_pending, treedef = jax.tree.flatten(state.pending)
            rows = flat_pending[0].shape[0]
            capacity = max(capacity, rows + 1)
            bufs = [np.empty((capacity, *x.shape[1:]), x.dtype) for x in flat_pending]
            for buf, x in zip(bufs, flat_pending, strict=True):
                buf[:rows] = x
        while True:
            if sync:
                row = int(count[0])
                if row >= T + 1:
                    break
            elif count.min() >= T + 1:
                break
            ts = env.recv()
            key, action, extras = policy_step(params, ts.observation, key)
            action, extras = jax.device_get((action, extras))
            extras_leaves, extras_def = jax.tree.flatten(extras)
            env.send(action)  # validates and clips; env_id = the batch just received
            if bufs is None:  # first step after init: allocate from the policy's outputs
                _check_batch_leaf("action", action, b)
                for leaf in extras_leaves:
                    _check_batch_leaf("an extras leaf", leaf, b)
                bufs = alloc(capacity, action, extras_leaves)
                _, treedef = jax.tree.flatten(
                    Trajectory(*([0] * 6), extras=jax.tree.unflatten(extras_def, [0] * len(extras_leaves)))
                )
            values = (ts.step_type, ts.reward, ts.discount, ts.observation, ts.env_id, action, *extras_leaves)
            if len(values) != len(bufs):
                raise ValueError("act returned extras with a different structure than before")
            env_id = ts.env_id
            if sync:
                for buf, value in zip(bufs, values, strict=True):
                    buf[row, env_id] = value
                count += 1
            else:
                pos = count[env_id]
                if pos.max() >= capacity:  # an environment got far ahead: grow the buffers
                    capacity *= 2
                    grown = [np.empty((capacity, *x.shape[1:]), x.dtype) for x in bufs]
                    for g, x in zip(grown, bufs, strict=True):
                        g[: x.shape[0]] = x
                    bufs = grown
                for buf, value in zip(bufs, values, strict=True):
                    buf[pos, env_id] = value
                count[env_id] = pos + 1
        assert bufs is not None and treedef is not None
        extra_rows = int(count.max()) - T  # >= 1: row T is the shared boundary
        traj_np = jax.tree.unflatten(treedef, [buf[: T + 1] for buf in bufs])
        pending = jax.tree.unflatten(treedef, [buf[T : T + extra_rows].copy() for buf in bufs])
        new_state = RolloutState(key, pending, count - T, live["generation"])
        traj = jax.device_put(traj_np) if to_device else traj_np
        return new_state, traj, env.pop_episode_stats()

    return Rollout(init=init, unroll=unroll, env=env, unroll_length=T)
