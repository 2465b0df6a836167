"""training/rollouts.py: the host loop or the compiled loop behind one interface."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac.training.rollouts import CompiledRollout
from offpolicy_ac.training.rollouts import default_device
from offpolicy_ac.training.rollouts import make_loop_rollout


def _act(params, obs, key):
  action = (params * (obs[:, 2] + 0.5 * obs[:, 3]) > 0).astype(jnp.int32)
  return action, {"v": obs[:, 0] * params}


@pytest.mark.parametrize("batch_size", [4, 2])
@pytest.mark.parametrize("to_device", [False, True])
def test_compiled_rollout_has_the_host_loops_interface(batch_size, to_device):
  params = jnp.float32(1.0)
  make = lambda xla: make_loop_rollout(  # noqa: E731
      envs.make("CartPole-v1", 4, 3, batch_size=batch_size, max_episode_steps=7),
      _act,
      5,
      params,
      xla=xla,
      to_device=to_device,
  )
  compiled, host = make(True), make(False)
  assert isinstance(compiled, CompiledRollout) and not isinstance(host, CompiledRollout)
  cs, hs = compiled.init(jax.random.PRNGKey(0)), host.init(jax.random.PRNGKey(0))
  for _ in range(3):
    cs, ctraj, cstats = compiled.unroll(params, cs)
    hs, htraj, hstats = host.unroll(params, hs)
    assert ctraj.observation.shape == htraj.observation.shape == (6, 4, 4)
    for leaf in jax.tree.leaves(ctraj):
      if to_device:
        assert isinstance(leaf, jax.Array) and leaf.devices() == {default_device()}
      else:
        assert isinstance(leaf, np.ndarray)
    if batch_size == 4:  # sync: the same steps as the host loop
      for x, y in zip(jax.tree.leaves((ctraj, cstats)), jax.tree.leaves((htraj, hstats))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
  with pytest.raises(RuntimeError, match="runs once"):
    compiled.init(jax.random.PRNGKey(1))
  compiled.env.close()
  host.env.close()


def test_default_device_follows_the_jax_setting():
  assert default_device() == jax.local_devices()[0]
  with jax.default_device(jax.local_devices(backend="cpu")[0]):
    assert default_device() == jax.local_devices(backend="cpu")[0]


def test_float64_action_tasks_are_refused_by_the_compiled_loop_only():
  env = envs.make("Hopper-v4", 2, 0)
  with pytest.raises(ValueError, match="float64 actions"):
    make_loop_rollout(env, _act, 3, None, xla=True, to_device=False)
  make_loop_rollout(env, _act, 3, None, xla=False, to_device=False)  # the host loop takes them
  env.close()
