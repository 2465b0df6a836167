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
(`np.asarray`) -> `send()` (validate, clip, hand to envpool) -> keep the step's arrays in a
list while the environments step. Nothing else happens per step: envpool hands out new
arrays on every `recv` and the policy's outputs are immutable, so they are kept as they are
and placed into `[rows, num_envs, ...]` buffers once, after the loop (one copy per field,
a scatter keyed by env_id in async mode). FIRST/MID/LAST, reward 0 at FIRST, discounts and
episode statistics are then computed once per unroll, vectorised over the block
(`EnvPoolEnv._convert_block`, the same code `recv()` uses). In sync mode that is exactly T
iterations (T+1 after `init`). In async mode (`batch_size < num_envs`) environments progress
at different speeds; the ones that get ahead keep stepping (never parked: parking could
leave fewer than `batch_size` environments in flight and `recv` would block forever), and
their extra steps are carried in the state as the beginning of the next unroll, keyed by
env_id. The trajectory is copied to the device once per unroll.

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
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE, EpisodeStats
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = ["ActFn", "RolloutState", "Rollout", "make_rollout"]

ActFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""`act(params, obs [B, *obs_shape], key) -> (action [B, *action_shape], extras)`, extras a
pytree of [B, ...] arrays (behaviour-policy outputs)."""

_generation = itertools.count(1)

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

    def check_outputs(action: np.ndarray, extras: list[np.ndarray], pending: Any) -> None:
        """act's outputs at the first step of an unroll: batch axes, and the same extras
        structure as the steps carried over (`pending`)."""
        if pending is None:
            for name, leaf in (("action", action), *(("an extras leaf", x) for x in extras)):
                _check_batch_leaf(name, leaf, b)
        elif len(jax.tree.leaves(pending.extras)) != len(extras):
            raise ValueError("act returned extras with a different structure than before")

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
        while (remaining > 0) if sync else (count.min() < T + 1):
            raw = env._recv_raw()
            key, action, extras = policy_step(params, raw.obs, key)
            action = np.asarray(action)
            extras = [np.asarray(x) for x in extras]
            if not checked:
                check_outputs(action, extras, pending)
                checked = True
            # Hand the actions to envpool first; keep the step while the environments step.
            env.send(action)  # validates and clips; env_id = the batch just received
            if atari:
                steps.append((raw.env_id, *raw[:4], raw.game_reward, raw.game_over, action, *extras))
            else:
                steps.append((raw.env_id, *raw[:4], action, *extras))
            if sync:
                remaining -= 1
            else:
                count[raw.env_id] += 1

        # Where every collected step goes: row lo[e] + (its rank among env e's new steps) of
        # column e, as an index into the buffers flattened to [rows * num_envs, ...].
        columns = list(zip(*steps, strict=True))
        env_id = np.concatenate(columns[0])
        k = len(steps)
        start = int(lo[0]) * n
        # Sync batches come in env_id order (checked): the steps fill rows [lo, lo + k).
        contiguous = sync and np.array_equal(env_id.reshape(k, n), np.broadcast_to(all_ids, (k, n)))
        if contiguous:
            count = lo + k
        else:
            new = np.bincount(env_id, minlength=n)
            count = lo + new
            order = np.argsort(env_id, kind="stable")
            sorted_id = env_id[order]
            row = np.empty(env_id.shape, np.int64)
            row[order] = lo[sorted_id] + np.arange(env_id.size) - (np.cumsum(new) - new)[sorted_id]
            flat = row * n + env_id
        capacity = max(T + 1, int(count.max()))

        def place(parts: tuple[np.ndarray, ...], carried: np.ndarray | None) -> np.ndarray:
            """[capacity, n, ...]: the rows carried over, then this unroll's steps."""
            buf = np.zeros((capacity, n, *parts[0].shape[1:]), parts[0].dtype)
            if carried is not None:
                buf[: carried.shape[0]] = carried
            view = buf.reshape(capacity * n, *buf.shape[2:])
            if contiguous:
                np.concatenate(parts, out=view[start : start + k * n])
            else:
                view[flat] = np.concatenate(parts)
            return buf

        num_raw = 5 if atari else 3  # reward, terminated, truncated[, game_reward, game_over]
        carried = [None] * (len(columns) - 1)
        if pending is not None:
            carried[0] = pending.observation
            carried[1 + num_raw :] = [pending.action, *jax.tree.leaves(pending.extras)]
        observation, *placed = (place(c, p) for c, p in zip(columns[1:], carried, strict=True))
        raw_fields, action_and_extras = placed[:num_raw], placed[num_raw:]
        if not atari:
            raw_fields += [None, None]

        # Convert the new rows [lo, count) of every column in one vectorised pass.
        converted = env._convert_block(all_ids, lo, count, *raw_fields)
        rows = np.arange(capacity)[:, None]
        new_rows = (rows >= lo) & (rows < count)
        done_bufs = []
        for value, old in zip(
            converted,
            (None,) * 3 if pending is None else pending[:3],
            strict=True,
        ):
            buf = np.zeros((capacity, n), value.dtype)
            if old is not None:
                buf[: old.shape[0]] = old
            np.copyto(buf, value, where=new_rows)
            done_bufs.append(buf)
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
