"""A pure rollout over a batch of functional environments: one `lax.scan` per unroll.

    rollout = make_functional_rollout(env, act_fn, unroll_length=T, num_envs=B)
    state = rollout.init(params, key)                   # resets B envs, env_id = arange(B)
    state, traj, stats = rollout.unroll(params, state)  # Trajectory [T+1, B, ...]
    episodes = finished_episodes(stats)                 # host EpisodeStats, for the loggers

The trajectory has exactly the indexing of `_trajectory.py` and of `make_rollout`'s
backends: column b is environment `env_id == b`; `action[t]` and `extras[t]` are what
`act_fn` returned at step t (continuous actions before the environment clips them);
consecutive unrolls share their boundary, index T of one unroll being index 0 of the next,
every field included (`action[T]` is the action taken next, chosen with this unroll's
params). The state carries that boundary step: `init` resets the environments and picks
their first actions, so every unroll is exactly T steps, each a vmapped `env.step`, a
running-statistics update and one `act_fn` call.

Keys: the state's key is split once per policy call (one for `init`'s); every environment
keeps its own key inside its state. Nothing is reused.

Episode statistics are fixed-shape arrays (`FunctionalEpisodeStats`, [T, B], for steps
1..T of the unroll: index 0 was counted by the previous unroll), so `unroll` stays pure;
`finished_episodes` turns them into the host `EpisodeStats` of `make_rollout`.

`init` and `unroll` are jitted; both are pure, so they can also be called inside a larger
jitted function or `lax.scan` (the state is a NamedTuple pytree of arrays, which orbax can
checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs._functional import FunctionalEnv
from offpolicy_ac.envs._functional import FunctionalEnvState
from offpolicy_ac.envs._rollout_base import ActFn
from offpolicy_ac.envs._rollout_base import call_policy
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE
from offpolicy_ac.envs._timestep import FIRST
from offpolicy_ac.envs._timestep import LAST
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import TimeStep
from offpolicy_ac.envs._timestep import check_int
from offpolicy_ac.envs._timestep import check_key
from offpolicy_ac.envs._timestep import check_traced_actions
from offpolicy_ac.envs._trajectory import Trajectory

__all__ = [
    "FunctionalEpisodeStats",
    "FunctionalRollout",
    "FunctionalRolloutState",
    "finished_episodes",
    "make_functional_rollout",
]


class FunctionalEpisodeStats(NamedTuple):
  """Episodes that ended during an unroll, as fixed-shape arrays (steps 1..T of it).

  Attributes:
    done: [T, B] bool, an episode of environment b ended at step t+1 of the unroll (a LAST
      step, at `traj.step_type[t + 1]`).
    episode_return: [T, B] float32, the undiscounted sum of the environment's rewards over
      the episode so far (the whole episode where `done`).
    episode_length: [T, B] int32, the actions taken in the episode so far (where `done`:
      the episode's length).
  """

  done: Any
  episode_return: Any
  episode_length: Any


class FunctionalRolloutState(NamedTuple):
  """What carries over between unrolls (a pytree of arrays; [B, ...] each).

  Attributes:
    env_state: the environments' `FunctionalEnvState`, batched.
    timestep: the `TimeStep` of the boundary step (index T of the last unroll, index 0 of
      the next).
    action: [B, *action_shape], the action chosen at the boundary step, taken next.
    extras: pytree of [B, ...], the behaviour-policy outputs that came with it.
    episode_return: [B] float32, the running return of each environment's episode, up to
      and including the boundary step (0 at FIRST).
    episode_length: [B] int32, the actions taken in it so far.
    key: PRNG key of the next policy call.
  """

  env_state: FunctionalEnvState
  timestep: TimeStep
  action: Any
  extras: Any
  episode_return: jax.Array
  episode_length: jax.Array
  key: jax.Array


class FunctionalRollout(NamedTuple):
  """A rollout over functional environments (from `make_functional_rollout`).

  Attributes:
    init: `init(params, key) -> FunctionalRolloutState`: resets the `num_envs`
      environments (env_id = arange(B)) and picks their first actions with `params`.
    unroll: `unroll(params, state) -> (state, Trajectory, FunctionalEpisodeStats)`: T steps,
      the trajectory [T+1, B, ...] (JAX arrays), pure and jitted.
    env: the `FunctionalEnv`.
    unroll_length: T.
    num_envs: B.
  """

  init: Callable[[Any, jax.Array], FunctionalRolloutState]
  unroll: Callable[
      [Any, FunctionalRolloutState],
      tuple[FunctionalRolloutState, Trajectory, FunctionalEpisodeStats],
  ]
  env: FunctionalEnv
  unroll_length: int
  num_envs: int


def make_functional_rollout(
    env: FunctionalEnv, act_fn: ActFn, unroll_length: int, num_envs: int
) -> FunctionalRollout:
  """Makes a pure rollout of `unroll_length` steps of `num_envs` copies of `env`.

  Args:
    env: a `FunctionalEnv` (from `make_functional`).
    act_fn: `act(params, obs [B, *obs_shape], key) -> (action [B, *action_shape],
      extras)`, jittable; `extras` a pytree of [B, ...] arrays stored with the trajectory.
      Discrete actions must have an integer dtype, continuous ones a floating dtype.
    unroll_length: T >= 1; trajectories have T+1 steps.
    num_envs: B >= 1.

  Raises:
    ValueError: bad arguments; when the functions are first traced, an `act_fn` whose
      outputs have the wrong shapes or dtypes.
  """
  if not isinstance(env, FunctionalEnv):
    raise ValueError(
        f"env must be a FunctionalEnv (envs.make_functional), got {type(env).__name__}"
    )
  if not callable(act_fn):
    raise ValueError("act_fn must be callable: act(params, obs, key) -> (action, extras)")
  T = check_int("unroll_length", unroll_length)
  B = check_int("num_envs", num_envs)
  spec = env.spec

  def act(params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, Any]:
    action, extras = call_policy(act_fn, params, obs, key, B)
    action = jnp.asarray(action)
    check_traced_actions(spec, action, B)
    return action, extras

  @jax.jit
  def init(params: Any, key: jax.Array) -> FunctionalRolloutState:
    check_key(key)
    key, env_key, act_key = jax.random.split(key, 3)
    env_ids = jnp.arange(B, dtype=ENV_ID_DTYPE)
    env_state, ts = jax.vmap(env.reset)(jax.random.split(env_key, B), env_ids)
    action, extras = act(params, ts.observation, act_key)
    zeros = jnp.zeros((B,), jnp.float32), jnp.zeros((B,), jnp.int32)
    return FunctionalRolloutState(env_state, ts, action, extras, *zeros, key)

  def one_step(params: Any, state: FunctionalRolloutState, _: Any):
    env_state, ts = jax.vmap(env.step)(state.env_state, state.action)
    first = ts.step_type == FIRST
    ret = jnp.where(first, 0.0, state.episode_return + ts.reward)
    length = jnp.where(first, 0, state.episode_length + 1).astype(jnp.int32)
    key, sub = jax.random.split(state.key)
    action, extras = act(params, ts.observation, sub)
    stats = FunctionalEpisodeStats(ts.step_type == LAST, ret, length)
    step = Trajectory(*ts, action=action, extras=extras)
    return FunctionalRolloutState(env_state, ts, action, extras, ret, length, key), (step, stats)

  @jax.jit
  def unroll(
      params: Any, state: FunctionalRolloutState
  ) -> tuple[FunctionalRolloutState, Trajectory, FunctionalEpisodeStats]:
    if not isinstance(state, FunctionalRolloutState):
      raise ValueError(f"unroll expects a FunctionalRolloutState, got {type(state).__name__}")
    if np.shape(state.action)[:1] != (B,):
      given = np.shape(state.action)[0] if np.ndim(state.action) else "no batch of"
      raise ValueError(
          f"unroll got the state of a rollout over {given} environments; this one steps {B} "
          "(num_envs): use the state its own init() returned"
      )
    boundary = Trajectory(*state.timestep, action=state.action, extras=state.extras)
    state, (steps, stats) = jax.lax.scan(lambda s, x: one_step(params, s, x), state, None, length=T)
    traj = jax.tree.map(lambda b, s: jnp.concatenate([b[None], s]), boundary, steps)
    return state, traj, stats

  return FunctionalRollout(init, unroll, env, T, B)


def finished_episodes(stats: FunctionalEpisodeStats) -> EpisodeStats:
  """The host `EpisodeStats` of the episodes in `stats` (one entry per `done`, ordered by
  time then environment; env_id = the column), for the loggers that `make_rollout` feeds.

  Args:
    stats: `FunctionalEpisodeStats` of [T, B] arrays (JAX or NumPy).
  """
  if not isinstance(stats, FunctionalEpisodeStats):
    raise ValueError(
        f"finished_episodes expects FunctionalEpisodeStats, got {type(stats).__name__}"
    )
  done, ret, length = jax.device_get(tuple(stats))
  done, ret, length = (np.asarray(x) for x in (done, ret, length))
  shapes = [x.shape for x in (done, ret, length)]
  if done.ndim != 2 or len(set(shapes)) != 1:
    raise ValueError(f"FunctionalEpisodeStats must be [T, B] arrays alike, got shapes {shapes}")
  if done.dtype != bool:
    raise ValueError(f"FunctionalEpisodeStats.done must be bool, got {done.dtype}")
  r, c = np.nonzero(done)
  return EpisodeStats(
      c.astype(ENV_ID_DTYPE),
      ret[r, c].astype(np.float64),
      length[r, c].astype(np.int64),
  )
