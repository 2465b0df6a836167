"""Terminations that envpool reports as truncations, found again from the final observation.

envpool flags an episode end as a truncation whenever it happens on the time limit's step
(`trunc = done && elapsed_step >= max_episode_steps`, envpool/core/env.h), even when the
episode also reached a terminal state on that step: a pole that falls on CartPole's 500th
step comes back with `terminated=False, truncated=True`, and would be learned from with
discount 1 (gymnasium's TimeLimit reports both flags; the functional backends, discount 0).
For the tasks below, whose terminal test is a function of the observation envpool returns
(or, for Atari, of its game-over flag), `split_limit_step` turns such a step back into a
termination. The tests repeat envpool's own (classic_control/*.h, mujoco/gym/*.h), with
the task's options (`healthy_z_min`, `exclude_current_positions_from_observation`, ...):

* CartPole: |x| > 2.4 or |theta| > 12 degrees. Acrobot: -cos(t1) - cos(t1 + t2) > 1.
  MountainCar (MountainCarContinuous): position >= 0.5 (0.45) and velocity >= 0.
* Hopper, Walker2d, Ant, Humanoid, InvertedPendulum (-v2 to -v5, one observation frame):
  their healthy ranges on the positions in the observation, and, where envpool checks it,
  that the state is finite. Hopper's bound on the velocities is seen only where it is
  inside the observation's clip (by default it is not: 100 against a clip of 10).
* Atari: the game is over (`info["terminated"]`). A life lost on the limit's step under
  `episodic_life` stays a truncation.

Other tasks keep envpool's flags. Comparisons are on the observation as envpool returns it
(float32 for classic control: a state within float32 rounding of a threshold may be
judged either way).
"""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import Mapping

import numpy as np

TerminalTest = Callable[[Any, Any], Any]
"""(obs [..., D], xp: numpy or jax.numpy) -> [...] bool: the state is terminal."""

_CARTPOLE_THETA = 12 * 2 * math.pi / 360


def _cartpole(obs, xp):
  return (xp.abs(obs[..., 0]) > 2.4) | (xp.abs(obs[..., 2]) > _CARTPOLE_THETA)


def _acrobot(obs, xp):
  # obs = [cos t1, sin t1, cos t2, sin t2, dt1, dt2]; cos(t1 + t2) = c1 c2 - s1 s2.
  c1, s1, c2, s2 = obs[..., 0], obs[..., 1], obs[..., 2], obs[..., 3]
  return -c1 - (c1 * c2 - s1 * s2) > 1


def _mountain_car(goal: float) -> TerminalTest:
  return lambda obs, xp: (obs[..., 0] >= goal) & (obs[..., 1] >= 0)


def _not_finite(obs, xp):
  return ~xp.all(xp.isfinite(obs), axis=-1)


def _hopper(config: Mapping[str, Any]) -> TerminalTest:
  first = 1 if config["exclude_current_positions_from_observation"] else 0  # qpos[first:]
  low, high = config["healthy_state_min"], config["healthy_state_max"]

  def test(obs, xp):
    z, angle = obs[..., 1 - first], obs[..., 2 - first]
    rest = obs[..., 2 - first :]  # qpos[2:] and qvel (clipped to velocity_min/max)
    return (
        (angle <= config["healthy_angle_min"])
        | (angle >= config["healthy_angle_max"])
        | (z <= config["healthy_z_min"])
        | xp.any((rest <= low) | (rest >= high), axis=-1)
    )

  return test


def _walker2d(config: Mapping[str, Any]) -> TerminalTest:
  first = 1 if config["exclude_current_positions_from_observation"] else 0

  def test(obs, xp):
    z, angle = obs[..., 1 - first], obs[..., 2 - first]
    return (
        (z < config["healthy_z_min"])
        | (z > config["healthy_z_max"])
        | (angle < config["healthy_angle_min"])
        | (angle > config["healthy_angle_max"])
    )

  return test


def _ant(config: Mapping[str, Any]) -> TerminalTest:
  first = 2 if config["exclude_current_positions_from_observation"] else 0

  def test(obs, xp):
    z = obs[..., 2 - first]
    unhealthy = (z < config["healthy_z_min"]) | (z > config["healthy_z_max"])
    return unhealthy | _not_finite(obs, xp)

  return test


def _humanoid(config: Mapping[str, Any]) -> TerminalTest:
  first = 2 if config["exclude_current_positions_from_observation"] else 0

  def test(obs, xp):
    z = obs[..., 2 - first]
    return ~((config["healthy_z_min"] < z) & (z < config["healthy_z_max"]))

  return test


def _inverted_pendulum(config: Mapping[str, Any]) -> TerminalTest:
  def test(obs, xp):  # obs = qpos (cart, pole angle), qvel
    angle = obs[..., 1]
    unhealthy = (angle < config["healthy_z_min"]) | (angle > config["healthy_z_max"])
    return unhealthy | _not_finite(obs, xp)

  return test


_CLASSIC = {
    "CartPole": _cartpole,
    "Acrobot": _acrobot,
    "MountainCar": _mountain_car(0.5),
    "MountainCarContinuous": _mountain_car(0.45),
}
"""Terminal tests of classic-control tasks (they have no options)."""
_MUJOCO = {  # the task's options -> its terminal test
    "Hopper": _hopper,
    "Walker2d": _walker2d,
    "Ant": _ant,
    "Humanoid": _humanoid,
    "InvertedPendulum": _inverted_pendulum,
}


def terminal_test(task_id: str, family: str, config: Mapping[str, Any]) -> TerminalTest | None:
  """The terminal test of an envpool task, or None where it is not known here.

  Args:
    task_id: the envpool task id ("CartPole-v1", "Hopper-v4").
    family: envpool's module of the task ("envpool.classic_control", "envpool.mujoco.gym").
    config: the pool's options (`pool.config`).
  """
  name = task_id.rsplit("-v", 1)[0]
  if family == "envpool.classic_control" and name in _CLASSIC:
    return _CLASSIC[name]
  if family == "envpool.mujoco.gym" and name in _MUJOCO:
    if not config.get("terminate_when_unhealthy", True) or config.get("frame_stack", 1) != 1:
      return None  # never terminates / a stacked observation
    return _MUJOCO[name](config)
  return None


def split_limit_step(obs, terminated, truncated, game_over, test: TerminalTest | None, xp):
  """(terminated, truncated) with the truncations that reached a terminal state made
  terminations.

  Args:
    obs: [..., *obs_shape] the observations envpool returned with the flags.
    terminated, truncated: [...] bool, envpool's flags.
    game_over: [...] Atari's `info["terminated"]`, else None.
    test: the task's `terminal_test`, or None.
    xp: numpy or jax.numpy (the host and the XLA rollouts share this).
  """
  if xp is np and not truncated.any():  # the usual host step: nothing to test
    return terminated, truncated
  if game_over is not None:
    hidden = truncated & game_over.astype(bool)
  elif test is not None:
    hidden = truncated & test(obs, xp)
  else:
    return terminated, truncated
  return terminated | hidden, truncated & ~hidden
