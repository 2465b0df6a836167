"""The rollout a training run steps its environments with.

`LoopConfig.xla_rollout` chooses between envpool's host loop (`envs.make_rollout`, the
default: a Python loop of recv / jitted policy / send per step) and the compiled loop
(`envs.make_xla_rollout`: envpool's XLA interface, one XLA call per unroll, no Python per
step; int32/float32 actions only, the policy runs on the CPU). Both come back behind the
host loop's interface, which the inline source and the actor threads use:

    rollout = make_loop_rollout(env, act, T, params, xla=True, to_device=False)
    state = rollout.init(key)
    state, traj, stats = rollout.unroll(params, state)   # traj [T+1, num_envs, ...]

For sync environments the compiled loop takes its first action inside `init`, with the
parameters given here (see `envs.make_xla_rollout`); the training loop makes a rollout
right before its first unroll, with the parameters of that unroll. The trajectory is
NumPy (`to_device` False; a view of the CPU buffer, no copy) or on the default device
(True; no copy when that is the CPU the loop ran on). Both rollouts give the same
TimeStep semantics, tested equal in `tests/test_envs_xla.py`, and a training run logs
the same numbers with either (`tests/test_runs.py`).

Why it matters: an actor thread running the host loop holds the GIL for every step, so
actors and the learner contend for it; the compiled loop releases it for the whole unroll
(`experiments/bench_async.py --xla-rollout`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from offpolicy_ac import envs


def default_device() -> jax.Device:
  """The device uncommitted JAX arrays go to (`jax_default_device`, else the first local
  device of the default backend)."""
  device = jax.config.jax_default_device
  if device is None:
    return jax.local_devices()[0]
  if isinstance(device, str):
    return jax.local_devices(backend=device)[0]
  return device


_USED = object()  # CompiledRollout's parameters after init


class CompiledRollout:
  """`envs.make_xla_rollout` with the host loop's `init(key)` (see the module docstring).

  Attributes:
    env: the `EnvPoolEnv` it steps (closed by its owner).
    unroll_length: T.
  """

  def __init__(
      self,
      env: envs.EnvPoolEnv,
      act_fn: envs.ActFn,
      unroll_length: int,
      params: Any,
      *,
      to_device: bool,
  ):
    self._rollout = envs.make_xla_rollout(env, act_fn, unroll_length)
    self.env, self.unroll_length = env, unroll_length
    self._init_params, self._to_device = params, to_device

  def init(self, key: jax.Array) -> Any:
    params, self._init_params = self._init_params, _USED  # not kept alive after
    if params is _USED:
      raise RuntimeError(
          "CompiledRollout.init runs once (it takes the first action with "
          "the parameters it was made with)"
      )
    return self._rollout.init(params, key)

  def unroll(self, params: Any, state: Any) -> tuple[Any, envs.Trajectory, envs.EpisodeStats]:
    state, traj, stats = self._rollout.unroll(params, state)
    if self._to_device:
      traj = jax.device_put(traj, default_device())
    else:
      traj = jax.tree.map(np.asarray, traj)
    return state, traj, stats


def make_loop_rollout(
    env: envs.EnvPoolEnv,
    act_fn: envs.ActFn,
    unroll_length: int,
    params: Any,
    *,
    xla: bool,
    to_device: bool,
) -> Any:
  """The host loop (`xla` False) or the compiled loop behind the same interface.

  Args:
    env: the environments (sync or async).
    act_fn: the agent's `act(params, obs, key) -> (action, extras)`.
    unroll_length: T.
    params: parameters for the compiled loop's first action (unused by the host loop).
    xla: use `envs.make_xla_rollout`.
    to_device: trajectories as default-device JAX arrays, else NumPy.

  Raises:
    ValueError: the compiled loop cannot step this environment (float64 actions).
  """
  if xla:
    return CompiledRollout(env, act_fn, unroll_length, params, to_device=to_device)
  return envs.make_rollout(env, act_fn, unroll_length, to_device=to_device)
