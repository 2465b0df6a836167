"""Uniformly random actions for an environment's spec: the random policy of the benchmarks'
raw-stepping baselines, drawn on the host ahead of time."""

from __future__ import annotations

import numpy as np

from offpolicy_ac.envs._timestep import EnvSpec
from offpolicy_ac.envs._timestep import check_ints


def random_actions(spec: EnvSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
  """Actions drawn uniformly for `spec`, of shape `shape + spec.action_shape`.

  Discrete: int32 in [0, num_actions). Continuous: float32, uniform in the action box
  [action_low, action_high].

  >>> from offpolicy_ac import envs
  >>> envs.random_actions(envs.spec("CartPole-v1"), (1024, 16), np.random.default_rng(0)).shape
  (1024, 16)
  """
  if not isinstance(spec, EnvSpec):
    raise TypeError(f"random_actions takes an envs.EnvSpec, got {type(spec).__name__}")
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"random_actions takes a NumPy Generator (np.random.default_rng(seed)), got {rng!r}"
    )
  shape = check_ints("random_actions: shape", shape, low=0)
  if spec.is_discrete:
    return rng.integers(0, spec.num_actions, size=shape, dtype=np.int32)
  low = np.asarray(spec.action_low, np.float32).reshape(spec.action_shape)
  high = np.asarray(spec.action_high, np.float32).reshape(spec.action_shape)
  return rng.uniform(low, high, size=(*shape, *spec.action_shape)).astype(np.float32)
