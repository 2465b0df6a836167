"""Trajectory types and the loss inputs derived from them.

Indexing convention (time-major, `[T+1, B, ...]`, column b is environment `env_id` b):

    index t:      0        1        ...      T
    observation:  o_0      o_1      ...      o_T        observation at step t
    step_type:    s_0      s_1      ...      s_T
    reward:       r_0      r_1      ...      r_T        reward of the transition INTO step t
    discount:     d_0      d_1      ...      d_T        discount of the transition INTO step t
    action:       a_0      a_1      ...      a_T        action taken AT step t (from o_t)
    extras:       x_0      x_1      ...      x_T        behaviour-policy outputs at step t

Transition t (t in [0, T)) goes from step t to step t+1: source `o_t, a_t, x_t`, then
`r_t := reward[t+1]`, `discount_t := discount[t+1]`, destination `o_{t+1}` (and `a_{t+1}`,
`x_{t+1}` for Q-style targets). It is a real transition iff `step_type[t] != LAST`: the
transition leaving a LAST step lands on the next episode's FIRST step (reward 0) and is
masked out (`mask=False` of docs/design.md, "Contract 1: losses").

Consecutive unrolls share their boundary: index T of one unroll *is* index 0 of the next,
every field included (`action[T]` is the action actually taken next, chosen by the policy
that collected this unroll). So transitions [0, T) of each unroll tile the stream exactly:
no step lost, none counted twice.
"""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs._timestep import LAST

__all__ = ["Trajectory", "TransformedTrajectory", "LossInputs", "loss_inputs"]


class Trajectory(NamedTuple):
  """A raw time-major unroll, `[T+1, B, ...]` (see the module docstring for indexing).

  Attributes:
    step_type: [T+1, B] int32, FIRST/MID/LAST of steps 0..T.
    reward: [T+1, B] float32, reward of the transition into step t (0 at FIRST).
    discount: [T+1, B] float32, discount of the transition into step t (0 only at a
      terminating LAST step).
    observation: [T+1, B, *obs_shape], observation at step t.
    env_id: [T+1, B] int32, environment of each column (constant along time).
    action: [T+1, B, *action_shape], action taken at step t.
    extras: pytree of [T+1, B, ...], behaviour-policy outputs at step t (logits,
      log-probabilities, ...), as returned by `act`.
  """

  step_type: Any
  reward: Any
  discount: Any
  observation: Any
  env_id: Any
  action: Any
  extras: Any


class TransformedTrajectory(NamedTuple):
  """A Trajectory after data transformers (same fields and shapes as `Trajectory`).

  A distinct type so a transformer is never applied twice: transformer `apply` functions
  take a `Trajectory` and raise on a `TransformedTrajectory`. The type survives `jit`
  (NamedTuple pytree nodes keep their class).
  """

  step_type: Any
  reward: Any
  discount: Any
  observation: Any
  env_id: Any
  action: Any
  extras: Any


class LossInputs(NamedTuple):
  """Per-transition inputs for the losses, `[T, B]` for transitions t in [0, T).

  Attributes:
    r_t: [T, B] reward[1:], the reward of transition t.
    discount_t: [T, B] gamma * discount[1:]: 0 at termination, gamma otherwise.
    mask: [T, B] bool, step_type[:-1] != LAST: False for the transition leaving a LAST step.
  """

  r_t: Any
  discount_t: Any
  mask: Any


def _check_gamma(gamma: Any) -> None:
  """A scalar in [0, 1]: checked when concrete (a number or an eager array), not when traced
  (a hyper-parameter under `jit` or `vmap`)."""
  is_array = isinstance(gamma, (np.ndarray, np.generic, jax.Array))
  kind = np.dtype(gamma.dtype).kind if is_array else None
  number = kind in ("i", "u", "f") or (
      not is_array and isinstance(gamma, (int, float)) and not isinstance(gamma, bool)
  )
  if not number or np.ndim(gamma) != 0:
    what = f"shape {np.shape(gamma)}" if number else repr(gamma)
    raise ValueError(f"gamma must be a scalar number in [0, 1], got {what}")
  if not isinstance(gamma, jax.core.Tracer) and not 0.0 <= float(gamma) <= 1.0:
    raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")


def loss_inputs(traj: Trajectory | TransformedTrajectory, gamma: float = 1.0) -> LossInputs:
  """Per-transition reward, discount and mask of a `[T+1, B]` trajectory.

  `r_t = reward[t+1]`, `discount_t = gamma * discount[t+1]`, `mask_t = step_type[t] != LAST`
  for t in [0, T). Works on NumPy or JAX arrays, inside or outside `jit`.

  Args:
    traj: a Trajectory or TransformedTrajectory with at least 2 time steps.
    gamma: discount factor in [0, 1]: a number or a scalar array, checked unless traced
      (a hyper-parameter under `jit` or `vmap`).

  Raises:
    ValueError: not a trajectory, fewer than 2 steps, reward or discount not shaped as
      step_type, step_type not integers, or reward not floating point.
  """
  if not isinstance(traj, (Trajectory, TransformedTrajectory)):
    raise ValueError(f"loss_inputs expects a Trajectory, got {type(traj).__name__}")
  _check_gamma(gamma)
  shape = jnp.shape(traj.step_type)
  if len(shape) < 1 or shape[0] < 2:
    raise ValueError(f"a trajectory needs T+1 >= 2 time steps, got step_type shape {shape}")
  for name in ("reward", "discount"):
    if jnp.shape(getattr(traj, name)) != shape:
      raise ValueError(f"the trajectory's {name} has shape {jnp.shape(getattr(traj, name))}, "
                       f"its step_type {shape}: both are [T+1, B]")  # fmt: skip
  step_type = jnp.asarray(traj.step_type)
  if not jnp.issubdtype(step_type.dtype, jnp.integer):
    raise ValueError(f"the trajectory's step_type must be integers (FIRST, MID, LAST), got "
                     f"{step_type.dtype}")  # fmt: skip
  reward = jnp.asarray(traj.reward)
  if not jnp.issubdtype(reward.dtype, jnp.floating):
    raise ValueError(
        f"the trajectory's reward must have a floating dtype (the value estimates', float32 "
        f"for the built-in agents), got {reward.dtype}"
    )
  return LossInputs(
      r_t=reward[1:],
      discount_t=gamma * jnp.asarray(traj.discount)[1:],
      mask=step_type[:-1] != LAST,
  )
