"""Synthetic trajectories for agent tests."""

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID
from offpolicy_ac.envs import Trajectory


def agent_trajectory(spec, agent, params, key, t=6, b=3, varied_rewards=False):
  """A synthetic [t+1, b] trajectory from the agent's own act, with a junction."""
  obs_key, act_key = jax.random.split(key)
  obs = jax.random.normal(obs_key, (t + 1, b) + tuple(spec.observation_shape))
  flat = obs.reshape((-1,) + obs.shape[2:])
  action, extras = agent.act(params, flat, act_key)
  unflat = lambda x: x.reshape((t + 1, b) + x.shape[1:])
  step_type = np.full((t + 1, b), MID, np.int32)
  step_type[0] = FIRST
  step_type[3, 0], step_type[4, 0] = LAST, FIRST
  discount = np.ones((t + 1, b), np.float32)
  discount[3, 0] = 0.0
  if varied_rewards:
    reward = np.linspace(-1.0, 1.0, (t + 1) * b, dtype=np.float32).reshape(t + 1, b)
  else:
    reward = np.ones((t + 1, b), np.float32)
  reward[step_type == FIRST] = 0.0
  return Trajectory(
      jnp.asarray(step_type),
      jnp.asarray(reward),
      jnp.asarray(discount),
      obs,
      jnp.zeros((t + 1, b), jnp.int32),
      unflat(action),
      jax.tree.map(unflat, extras),
  )
