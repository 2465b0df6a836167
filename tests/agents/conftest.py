"""The agents' tests' shared task specs (of 2 environments)."""

import pytest

from offpolicy_ac import envs


@pytest.fixture(scope="module")
def cartpole_spec():
  return envs.spec("CartPole-v1", num_envs=2)


@pytest.fixture(scope="module")
def pendulum_spec():
  return envs.spec("Pendulum-v1", num_envs=2)
