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

How it runs. Every environment always has exactly one action in flight between calls: the
action at its newest collected step. `unroll` repeats: `recv()` -> one jitted call that
splits the key and runs `act(params, obs, key)` -> the action and behaviour outputs to host
(`np.asarray`) -> `send()` (validate, clip, hand to envpool) -> store the step in
preallocated NumPy buffers while the environments step. FIRST/MID/LAST, reward 0 at FIRST,
discounts and episode statistics are computed once per unroll, vectorised over the
`[T+1, num_envs]` block (`EnvPoolEnv._convert_block`, the same code `recv()` uses), not per
step. In sync mode that is exactly T iterations (T+1 after `init`). In async mode
(`batch_size < num_envs`) environments progress at different speeds; the ones that get
ahead keep stepping (never parked: parking could leave fewer than `batch_size` environments
in flight and `recv` would block forever), and their extra steps are carried in the state as
the beginning of the next unroll, keyed by env_id. The trajectory is copied to the device
once per unroll.

The policy's action is stored as returned by `act` (continuous actions before clipping: the
environment receives them clipped to bounds), so behaviour log-probabilities in `extras`
match the stored action.

Speed (docs/envs_notes.md): on a small CPU the per-step cost of a tiny jitted policy is
mostly JAX handing the computation to a worker thread; starting the process with
`jax.config.update("jax_cpu_enable_async_dispatch", False)` (before any JAX work; a
process-wide setting this library does not touch) runs it inline and is several times
faster per call.

Why a host loop by default, and not envpool's XLA interface (`env.xla()` in `lax.scan`):
the segfault reported for threading the handle through `lax.scan` / `fori_loop` did not
reproduce on jax 0.10.2 / envpool 1.2.5 CPU in any variant probed (docs/envs_notes.md), and
`make_xla_rollout` (`_xla_rollout.py`) is that fully jitted rollout, behind its own switch
(faster on CartPole-sized tasks, about equal on Atari, where stepping dominates). The host
loop stays the default because only it does asynchronous stepping (async batches have
data-dependent env ids), sends the float64 actions MuJoCo tasks take without enabling x64,
and rejects a bad action before it is stepped (the compiled loop can only report it after
the unroll).

State is explicit (`RolloutState`) but the environments are not: a state may be used once.
Passing a stale state (one already consumed by `unroll`, or from before `init`) raises.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE, STEP_TYPE_DTYPE, EpisodeStats
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["ActFn", "RolloutState", "Rollout", "make_rollout"]

ActFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""`act(params, obs [B, *obs_shape], key) -> (action [B, *action_shape], extras)`, extras a
pytree of [B, ...] arrays (behaviour-policy outputs)."""

_generation = itertools.count(1)

# Async buffers start with T extra rows per environment for steps of environments that got
# ahead (they grow, by doubling, if one gets further ahead). Tests set it to 0 to exercise
# the growth path.
_ASYNC_EXTRA_ROWS_PER_STEP = 1


class RolloutState(NamedTuple):
    """What carries over between unrolls (NumPy arrays on the host, and the key).

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


def _alloc_like(arrays: list[np.ndarray], rows: int) -> list[np.ndarray]:
    """Buffers of `rows` rows whose first rows are copies of `arrays`."""
    bufs = [np.zeros((rows, *x.shape[1:]), x.dtype) for x in arrays]
    for buf, x in zip(bufs, arrays, strict=True):
        buf[: x.shape[0]] = x
    return bufs


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
        lo = state.num_pending  # rows [0, lo) of each column were collected before
        count = lo.copy()
        extra = 0 if sync else _ASYNC_EXTRA_ROWS_PER_STEP * T
        capacity = max(T + 1 + extra, int(count.max()) + 1)
        # Buffers [capacity, n, ...]. Written every step, in this order: observation, the raw
        # envpool fields (converted after the loop), action, *extras. Filled after the loop:
        # step_type, reward, discount. Pending rows are copied in first; buffers are new
        # for every unroll, so returned trajectories are never written again.
        step_bufs: list[np.ndarray] | None = None
        done_bufs: list[np.ndarray] | None = None
        if state.pending is not None:
            p = state.pending
            done_bufs = _alloc_like([p.step_type, p.reward, p.discount], capacity)
            kept = _alloc_like([p.observation, p.action, *jax.tree.leaves(p.extras)], capacity)
        flat_views: list[np.ndarray] = []  # async: [capacity * n, ...] views, one-index writes
        row = int(count[0])
        while (row < T + 1) if sync else (count.min() < T + 1):
            raw = env._recv_raw()
            key, action, extras = policy_step(params, raw.obs, key)
            action = np.asarray(action)
            extras = [np.asarray(x) for x in extras]
            # Hand the actions to envpool first; store while the environments step.
            env.send(action)  # validates and clips; env_id = the batch just received
            values = (raw.obs, raw.reward, raw.terminated, raw.truncated)
            if atari:
                values += (raw.game_reward, raw.game_over)
            values += (action, *extras)
            if step_bufs is None:  # the first step of this unroll
                if done_bufs is None:  # ... and of the rollout: allocate from the outputs
                    for name, leaf in (
                        ("action", action),
                        *(("an extras leaf", x) for x in extras),
                    ):
                        _check_batch_leaf(name, leaf, b)
                    done_bufs = [
                        np.zeros((capacity, n), STEP_TYPE_DTYPE),
                        np.zeros((capacity, n), np.float32),
                        np.zeros((capacity, n), np.float32),
                    ]
                    kept = [
                        np.zeros((capacity, n, *x.shape[1:]), x.dtype)
                        for x in (raw.obs, action, *extras)
                    ]
                elif len(kept) != 2 + len(extras):
                    raise ValueError("act returned extras with a different structure than before")
                num_raw = len(values) - 2 - len(extras)
                raw_bufs = [
                    np.zeros((capacity, n, *x.shape[1:]), x.dtype) for x in values[1 : 1 + num_raw]
                ]
                step_bufs = [kept[0], *raw_bufs, *kept[1:]]
            env_id = raw.env_id
            if sync:
                # envpool returns sync batches in env_id order; checked anyway.
                index: Any = row if (env_id == all_ids).all() else (row, env_id)
                for buf, value in zip(step_bufs, values, strict=True):
                    buf[index] = value
                row += 1
            else:
                pos = count[env_id]
                if pos.max() >= capacity:  # an environment got far ahead: grow the buffers
                    capacity *= 2
                    step_bufs = _alloc_like(step_bufs, capacity)
                    done_bufs = _alloc_like(done_bufs, capacity)
                    flat_views = []
                if not flat_views:
                    flat_views = [x.reshape(capacity * n, *x.shape[2:]) for x in step_bufs]
                index = pos * n + env_id
                for view, value in zip(flat_views, values, strict=True):
                    view[index] = value
                count[env_id] = pos + 1
        if sync:
            count[:] = row
        assert step_bufs is not None and done_bufs is not None

        # Convert the new rows [lo, count) of every column in one vectorised pass.
        raw_end = 6 if atari else 4  # step_bufs: observation, raw fields, action, *extras
        raw_fields = step_bufs[1:raw_end] + ([] if atari else [None, None])
        step_type, reward, discount = env._convert_block(all_ids, lo, count, *raw_fields)
        rows = np.arange(capacity)[:, None]
        new_rows = (rows >= lo) & (rows < count)
        for buf, value in zip(done_bufs, (step_type, reward, discount), strict=True):
            np.copyto(buf, value, where=new_rows)
        observation, action_and_extras = step_bufs[0], step_bufs[raw_end:]
        env_ids = np.broadcast_to(all_ids, (capacity, n))  # column j is environment j
        fields = [*done_bufs, observation, env_ids, *action_and_extras]

        extras_tree = extras_def[0]

        def as_traj(arrays: list[np.ndarray]) -> Trajectory:
            return Trajectory(*arrays[:6], extras=jax.tree.unflatten(extras_tree, arrays[6:]))

        extra_rows = int(count.max()) - T  # >= 1: row T is the shared boundary
        traj_np = as_traj(
            [np.ascontiguousarray(x[: T + 1]) if x is env_ids else x[: T + 1] for x in fields]
        )
        pending = as_traj([x[T : T + extra_rows].copy() for x in fields])
        new_state = RolloutState(key, pending, count - T, live["generation"])
        traj = jax.device_put(traj_np) if to_device else traj_np
        return new_state, traj, env.pop_episode_stats()

    return Rollout(init=init, unroll=unroll, env=env, unroll_length=T)
