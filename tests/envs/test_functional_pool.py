"""`envs.make_functional_pool`: a host pool over a functional environment, with the API of
envpool's pools. Its TimeSteps must be exactly those of stepping the functional environment
by hand (vmapped, with the keys the pool documents), moved to NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST

pytest.importorskip("gymnax")

CARTPOLE = "gymnax:CartPole-v1"


def by_hand(env, n, seed, actions):
  """TimeSteps [K+1, n] of `env` stepped by hand, from the pool's documented first keys,
  and the final batched state."""
  keys = jnp.stack([jax.random.fold_in(jax.random.PRNGKey(seed), i) for i in range(n)])
  state, ts = jax.jit(jax.vmap(env.reset))(keys, jnp.arange(n))
  step = jax.jit(jax.vmap(env.step))
  out = [ts]
  for action in actions:
    state, ts = step(state, action)
    out.append(ts)
  return jax.tree.map(lambda *x: np.stack(x), *out), state


def by_pool(pool, actions):
  out = [pool.reset()]
  out += [pool.step(a) for a in actions]
  return jax.tree.map(lambda *x: np.stack(x), *out)


def assert_same(a, b):
  for name, x, y in zip(a._fields, a, b, strict=True):
    np.testing.assert_array_equal(x, y, err_msg=name)
    assert x.dtype == y.dtype, name


def episodes_of(ts):
  """(env_id, return, length) of every episode that ends in TimeSteps [K+1, n], in order."""
  ret, length = np.zeros(ts.reward.shape[1]), np.zeros(ts.reward.shape[1], int)
  out = []
  for t in range(1, ts.reward.shape[0]):
    first = ts.step_type[t] == FIRST
    ret = np.where(first, 0.0, ret + ts.reward[t])
    length = np.where(first, 0, length + 1)
    for i in np.flatnonzero(ts.step_type[t] == LAST):
      out.append((i, ret[i], length[i]))
  return out


def test_timesteps_and_episode_stats_are_the_functional_envs():
  """Terminations and truncations (limit 12), auto-reset steps, a second reset."""
  n, seed, k = 4, 3, 80
  env = envs.make_functional(CARTPOLE, max_episode_steps=12)
  actions = np.random.default_rng(0).integers(0, 2, size=(k, n)).astype(np.int32)
  want, state = by_hand(env, n, seed, actions)
  with envs.make_functional_pool(CARTPOLE, n, seed, max_episode_steps=12) as pool:
    got = by_pool(pool, actions)
    assert_same(got, want)
    assert isinstance(got.observation, np.ndarray) and got.observation.shape == (k + 1, n, 4)
    last = want.step_type == LAST
    assert (last & (want.discount == 0)).any() and (last & (want.discount == 1)).any()
    stats = pool.pop_episode_stats()
    expected = episodes_of(want)
    assert len(stats.env_id) == len(expected) > n
    np.testing.assert_array_equal(stats.env_id, [e[0] for e in expected])
    np.testing.assert_array_equal(stats.episode_return, [e[1] for e in expected])
    np.testing.assert_array_equal(stats.episode_length, [e[2] for e in expected])
    assert stats.episode_return.dtype == np.float64 and stats.episode_length.dtype == np.int64
    assert len(pool.pop_episode_stats().env_id) == 0
    # A second reset starts new episodes from the keys carried in the states.
    again = pool.reset()
    _, want_again = jax.vmap(env.reset)(state.key, jnp.arange(n))
    assert_same(again, jax.device_get(want_again))
    assert (again.step_type == FIRST).all()
    assert not np.array_equal(again.observation, got.observation[0])


def test_same_seed_same_episodes_whatever_the_pool_size():
  actions = np.random.default_rng(1).integers(0, 2, size=(30, 3)).astype(np.int32)
  a = by_pool(envs.make_functional_pool(CARTPOLE, 3, 5), actions)
  b = by_pool(envs.make_functional_pool(CARTPOLE, 3, 5), actions)
  assert_same(a, b)
  other = by_pool(envs.make_functional_pool(CARTPOLE, 3, 6), actions)
  assert not np.array_equal(a.observation, other.observation)
  assert not np.array_equal(a.observation[:, 0], a.observation[:, 1])
  # Environment 0 of a pool of one plays environment 0's episodes (render_episode's promise).
  one = by_pool(envs.make_functional_pool(CARTPOLE, 1, 5), actions[:, :1])
  assert_same(one, jax.tree.map(lambda x: x[:, :1], a))


def test_continuous_actions_are_clipped_like_the_functional_env():
  env = envs.make_functional("gymnax:Pendulum-v1", max_episode_steps=7)
  actions = np.random.default_rng(2).normal(0.0, 4.0, size=(10, 2, 1))  # float64, beyond +-2
  want, _ = by_hand(env, 2, 0, np.clip(actions, -2.0, 2.0).astype(np.float32))
  pool = envs.FunctionalPool(env, 2, 0)
  assert pool.spec == env.spec._replace(num_envs=2, batch_size=2)
  assert pool.max_episode_steps == 7 and not pool.is_batched and not pool.is_atari
  assert_same(by_pool(pool, actions), want)
  assert (want.step_type[7] == LAST).all() and (want.discount[7] == 1.0).all()


def test_bad_arguments_and_misuse_raise():
  with pytest.raises(ValueError, match="num_envs must be >= 1"):
    envs.make_functional_pool(CARTPOLE, 0, 0)
  with pytest.raises(ValueError, match="num_envs must be an int"):
    envs.make_functional_pool(CARTPOLE, True, 0)
  with pytest.raises(ValueError, match="seed must be in"):
    envs.make_functional_pool(CARTPOLE, 2, -1)
  with pytest.raises(ValueError, match="seed must be in"):
    envs.make_functional_pool(CARTPOLE, 2, 2**32)
  with pytest.raises(ValueError, match="unknown task"):
    envs.make_functional_pool("gymnax:CartPol-v1", 2, 0)
  with pytest.raises(ValueError, match="max_episode_steps"):
    envs.make_functional_pool(CARTPOLE, 2, 0, max_episode_steps=0)
  with pytest.raises(ValueError, match="no rgb_array renderer"):
    envs.make_functional_pool(CARTPOLE, 1, 0, render_mode="rgb_array")
  with pytest.raises(ValueError, match="must be a FunctionalEnv"):
    envs.FunctionalPool("gymnax:CartPole-v1", 2, 0)
  pool = envs.make_functional_pool(CARTPOLE, 2, 0)
  assert repr(pool) == "FunctionalPool('gymnax:CartPole-v1', num_envs=2, seed=0)"
  with pytest.raises(RuntimeError, match="reset"):
    pool.step(np.zeros(2, np.int32))
  pool.reset()
  for action, message in [
      (np.zeros(3, np.int32), r"action shape \(3,\), expected \(2,\)"),
      (np.zeros(2, np.float32), "integer dtype"),
      (np.array([0, 2], np.int32), r"must be in \[0, 2\)"),
  ]:
    with pytest.raises(ValueError, match=message):
      pool.step(action)
  # EnvPoolEnv's step(action, env_id) (a TypeError before): every environment, in order.
  assert pool.step(np.zeros(2, np.int32), np.arange(2)).env_id.tolist() == [0, 1]
  with pytest.raises(ValueError, match=r"steps its 2 environments together: env_id must be None"):
    pool.step(np.zeros(1, np.int32), np.array([1]))
  with pytest.raises(TypeError, match=r"NumPy Generator \(np.random.default_rng\(seed\)\), got 0"):
    envs.random_actions(pool.spec, (2,), 0)
  with pytest.raises(TypeError, match="random_actions takes an envs.EnvSpec, got str"):
    envs.random_actions("CartPole-v1", (2,), np.random.default_rng(0))
  for shape in ((-1,), 2, (2.0,)):  # numpy's "negative dimensions", or a TypeError
    with pytest.raises(ValueError, match=r"random_actions: shape must be a tuple of ints >= 0"):
      envs.random_actions(pool.spec, shape, np.random.default_rng(0))
  with pytest.raises(ValueError, match="no rgb_array renderer"):
    pool.render()
  pool.close()
  with pytest.raises(RuntimeError, match="reset"):
    pool.step(np.zeros(2, np.int32))
  pendulum = envs.make_functional_pool("gymnax:Pendulum-v1", 1, 0)
  pendulum.reset()
  with pytest.raises(ValueError, match="finite"):
    pendulum.step(np.array([[np.nan]], np.float32))
  with pytest.raises(ValueError, match="floating dtype"):
    pendulum.step(np.array([[1]], np.int32))


def test_episodes_finished_before_a_reset_wait_to_be_popped():
  with envs.make_functional_pool(CARTPOLE, 2, 0, max_episode_steps=3) as pool:
    pool.reset()
    for _ in range(3):
      ts = pool.step(np.zeros(2, np.int32))
    assert (ts.step_type == LAST).all()
    pool.reset()
    stats = pool.pop_episode_stats()
  assert stats.episode_length.tolist() == [3, 3] and stats.episode_return.tolist() == [3.0, 3.0]
