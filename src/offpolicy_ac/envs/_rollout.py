"""Rollouts: run a jitted policy on an `EnvPoolEnv` and return time-major unrolls.

One factory, two backends behind the same interface:

    rollout = make_rollout(env, act_fn, unroll_length=T, backend="host", to_device=False)
    state = rollout.init(params, key)                  # resets the environments
    state, traj, stats = rollout.unroll(params, state) # traj: Trajectory [T+1, num_envs, ...]

Indexing (see `_trajectory.py`): `action[t]` is the action taken at step t, so `action[T]` of
one unroll is the first action of the next one, every field of index T of one unroll equals
index 0 of the next, and transitions [0, T) of consecutive unrolls tile the stream with no
step lost or counted twice. Column b of every unroll is environment `env_id == b`, with
batched stepping (`batch_size < num_envs`) too.

The backends, one module each, import the shared `_rollout_base.py` and not each other:

* host (`_host_rollout.py`): a Python recv/act/send loop, one jitted policy call per step.
* compiled (`_xla_rollout.py`): the same loop inside one XLA computation per unroll,
  through envpool's XLA interface.

The compiled backend gives the same trajectories as the host backend, but takes only
int32/float32 actions (MuJoCo's float64 ones only with `jax_enable_x64`), reports an invalid
action only after the unroll, and runs the policy on the first CPU device. The host backend
takes any action dtype, rejects a bad action before it is stepped, and runs the policy
wherever JAX puts it.

The policy's action is stored as returned by `act` (continuous actions before clipping: the
environment receives them clipped to bounds), so behaviour log-probabilities in `extras`
match the stored action.

State is explicit but the environments are not: a state may be used once.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from offpolicy_ac.envs._envpool_env import EnvPoolEnv
from offpolicy_ac.envs._host_rollout import host_rollout
from offpolicy_ac.envs._rollout_base import ActFn
from offpolicy_ac.envs._rollout_base import Backend
from offpolicy_ac.envs._rollout_base import Rollout
from offpolicy_ac.envs._rollout_base import default_device
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import check_bool
from offpolicy_ac.envs._trajectory import Trajectory
from offpolicy_ac.envs._xla_rollout import compiled_rollout

__all__ = ["make_rollout"]


def make_rollout(
    env: EnvPoolEnv,
    act_fn: ActFn,
    unroll_length: int,
    *,
    backend: Backend = "host",
    to_device: bool = False,
) -> Rollout:
  """Makes a rollout of `unroll_length` steps of `env` with the policy `act_fn`.

  Args:
    env: an `EnvPoolEnv`, with or without batched stepping.
    act_fn: `act(params, obs, key) -> (action, extras)`, jittable; it is jitted here
      together with the key split (jitting an already jitted function costs nothing).
      `obs` is [batch_size, *obs_shape] in the env's dtype; `extras` is a pytree of
      [batch_size, ...] arrays (behaviour-policy outputs), stored with the trajectory.
    unroll_length: T >= 1; trajectories have T+1 steps.
    backend: "host", the Python recv/act/send loop; or "compiled", one compiled loop per
      unroll through envpool's XLA interface (int32/float32 actions; float64 only with
      `jax_enable_x64`; it runs on this process's first CPU device, policy included,
      whatever the default device is).
    to_device: trajectories as JAX arrays on `default_device()` (one transfer per
      unroll; none when that is the CPU the compiled loop ran on); False keeps NumPy
      arrays (e.g. for a host-side replay buffer; for the compiled backend a view of its
      CPU buffer, no copy).

  Raises:
    ValueError: bad arguments, or a task the compiled backend cannot step (float64
      actions).
  """
  to_device = check_bool("to_device", to_device)
  if backend == "host":
    init, unroll = host_rollout(env, act_fn, unroll_length)
    put = jax.device_put  # NumPy to the default device
    to_host = None  # the host loop's trajectories are NumPy already
  elif backend == "compiled":
    init, unroll = compiled_rollout(env, act_fn, unroll_length)
    put = lambda traj: jax.device_put(traj, default_device())  # noqa: E731
    to_host = lambda traj: jax.tree.map(np.asarray, traj)  # noqa: E731
  else:
    raise ValueError(f"backend must be 'host' or 'compiled', got {backend!r}")

  def unroll_to(params: Any, state: Any) -> tuple[Any, Trajectory, EpisodeStats]:
    state, traj, stats = unroll(params, state)
    if to_device:
      return state, put(traj), stats
    return state, traj if to_host is None else to_host(traj), stats

  return Rollout(init, unroll_to, env, int(unroll_length), backend)
