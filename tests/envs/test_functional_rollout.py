"""The pure rollout over functional environments (`envs.make_functional_rollout`): the
indexing and boundaries of `make_rollout`, episode statistics, one trace, purity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rollout_checks import assert_boundaries_shared
from rollout_checks import deterministic_act
from rollout_checks import follows
from rollout_checks import np_tree
from rollout_checks import random_act
from rollout_checks import stream

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST

jax.config.update("jax_numpy_rank_promotion", "raise")

pytest.importorskip("gymnax")

N, T, K = 3, 6, 5  # environments, unroll length, unrolls


@pytest.fixture(scope="module")
def cartpole():
  return envs.make_functional("gymnax:CartPole-v1", max_episode_steps=8)


@pytest.fixture(scope="module")
def deterministic(cartpole):
  return envs.make_functional_rollout(cartpole, deterministic_act, unroll_length=T, num_envs=N)


def run_unrolls(rollout, params, key, k):
  state = rollout.init(params, key)
  first = state
  trajs, stats = [], []
  for _ in range(k):
    state, traj, st = rollout.unroll(params, state)
    trajs.append(np_tree(traj))
    stats.append(np_tree(st))
  return first, trajs, stats, state


def test_rollout_equals_a_python_loop_over_env_step(cartpole, deterministic):
  """K unrolls equal a plain loop over the vmapped env.step from the same reset, and their
  episode statistics equal returns and lengths accumulated by hand."""
  params = jnp.float32(-1.0)  # falls within about 10 steps: terminations and truncations
  first, trajs, stats, _ = run_unrolls(deterministic, params, jax.random.PRNGKey(0), K)
  for traj in trajs:
    assert traj.observation.shape == (T + 1, N, 4) and traj.step_type.shape == (T + 1, N)
    assert traj.extras["pair"][0].shape == (T + 1, N, 2)
    assert traj.step_type.dtype == traj.env_id.dtype == np.int32
    assert traj.reward.dtype == traj.discount.dtype == np.float32
  assert_boundaries_shared(trajs)
  got = stream(trajs)
  # init resets every environment (env_id = arange(N)) and takes the first action.
  np.testing.assert_array_equal(np.asarray(first.timestep.step_type), FIRST)
  np.testing.assert_array_equal(got.env_id, np.broadcast_to(np.arange(N), got.env_id.shape))

  step, act = jax.jit(jax.vmap(cartpole.step)), jax.jit(deterministic_act)
  env_state, ts = first.env_state, first.timestep
  rows, ret, length, want_stats = [], np.zeros(N), np.zeros(N, int), []
  for t in range(K * T + 1):
    action, extras = act(params, ts.observation, None)
    rows.append(np_tree(envs.Trajectory(*ts, action=action, extras=extras)))
    if t == K * T:
      break
    env_state, ts = step(env_state, action)
    step_type, reward = np.asarray(ts.step_type), np.asarray(ts.reward)
    ret = np.where(step_type == FIRST, 0.0, ret + reward)
    length = np.where(step_type == FIRST, 0, length + 1)
    for e in np.flatnonzero(step_type == LAST):
      want_stats.append((e, ret[e], length[e]))
  want = jax.tree.map(lambda *x: np.stack(x), *rows)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6)
  terminated = (got.step_type == LAST) & (got.discount == 0)
  truncated = (got.step_type == LAST) & (got.discount == 1)
  assert terminated.any() and truncated.any()

  # Episode statistics: [T, B] per unroll, for steps 1..T.
  for traj, st in zip(trajs, stats, strict=True):
    assert st.done.shape == st.episode_return.shape == st.episode_length.shape == (T, N)
    assert st.episode_return.dtype == np.float32 and st.episode_length.dtype == np.int32
    np.testing.assert_array_equal(st.done, traj.step_type[1:] == LAST)
  episodes = envs.EpisodeStats.concatenate([envs.finished_episodes(st) for st in stats])
  assert len(want_stats) == episodes.env_id.shape[0] > 0
  e, r, n = (np.array(x) for x in zip(*want_stats, strict=True))  # by time, then env
  np.testing.assert_array_equal(episodes.env_id, e)
  np.testing.assert_allclose(episodes.episode_return, r)
  np.testing.assert_array_equal(episodes.episode_length, n)
  np.testing.assert_array_equal(episodes.episode_return, episodes.episode_length)  # reward 1
  assert episodes.env_id.dtype == np.int32 and episodes.episode_return.dtype == np.float64
  assert episodes.episode_length.dtype == np.int64


def test_columns_follow_their_environment_and_loss_inputs_mask_resets(cartpole):
  rollout = envs.make_functional_rollout(cartpole, random_act, T, N)
  _, trajs, _, _ = run_unrolls(rollout, jnp.float32(0), jax.random.PRNGKey(1), K)
  s = stream(trajs)
  np.testing.assert_array_equal(s.action, (s.extras["u"] > 0.5).astype(np.int32))
  prev, cur = slice(None, -1), slice(1, None)
  after_last = s.step_type[prev] == LAST
  assert after_last.any()
  np.testing.assert_array_equal(s.step_type[cur][after_last], FIRST)
  np.testing.assert_array_equal(s.reward[cur][after_last], 0.0)
  np.testing.assert_array_equal(s.step_type[cur][~after_last] != FIRST, True)
  assert follows(s.observation[prev], s.observation[cur])[~after_last].all()
  assert not follows(s.observation[prev], s.observation[cur])[after_last].any()
  for traj in trajs:
    inputs = envs.loss_inputs(envs.Trajectory(*traj), 0.9)
    np.testing.assert_array_equal(inputs.mask, traj.step_type[:-1] != LAST)
    masked = ~np.asarray(inputs.mask)
    np.testing.assert_array_equal(traj.step_type[1:][masked], FIRST)
    np.testing.assert_array_equal(np.asarray(inputs.r_t)[masked], 0.0)
    terminal = (traj.step_type[1:] == LAST) & (traj.discount[1:] == 0)
    np.testing.assert_array_equal(np.asarray(inputs.discount_t)[terminal], 0.0)


def test_same_key_same_data_other_key_other_data(cartpole):
  rollout = envs.make_functional_rollout(cartpole, random_act, T, N)
  go = lambda seed: run_unrolls(rollout, jnp.float32(0), jax.random.PRNGKey(seed), 3)[1]  # noqa: E731
  a, b, c = go(0), go(0), go(1)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(stream(a).action, stream(c).action)
  assert not np.array_equal(stream(a).observation, stream(c).observation)
  # Policy keys differ from step to step and unroll to unroll.
  u = stream(a).extras["u"]
  assert np.unique(u).size == u.size


def test_traced_once_and_pure_inside_a_scan(cartpole):
  traces = []

  def counting_act(params, obs, key):
    traces.append(1)
    return deterministic_act(params, obs, key)

  rollout = envs.make_functional_rollout(cartpole, counting_act, T, N)
  params = jnp.float32(1.0)
  state = rollout.init(params, jax.random.PRNGKey(0))
  start, straight = state, []
  for _ in range(3):
    state, traj, stats = rollout.unroll(params, state)
    straight.append((traj, stats))
  assert len(traces) == 2  # one trace of init, one of unroll
  assert rollout.unroll._cache_size() == 1

  # The same unrolls as one scan over the state (pure: a state is a value).
  @jax.jit
  def three(params, state):
    return jax.lax.scan(lambda s, _: (lambda o: (o[0], o[1:]))(rollout.unroll(params, s)),
                        state, None, length=3)  # fmt: skip

  end, (trajs, stats) = three(params, start)
  for i, (traj, st) in enumerate(straight):
    for x, y in zip(jax.tree.leaves((traj, st)), jax.tree.leaves((trajs, stats)), strict=True):
      np.testing.assert_array_equal(x, y[i])
  for x, y in zip(jax.tree.leaves(end), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(x, y)


def test_state_survives_an_orbax_checkpoint(deterministic, tmp_path):
  from offpolicy_ac.training.checkpoint import Checkpointer

  params = jnp.float32(-1.0)
  state = deterministic.init(params, jax.random.PRNGKey(2))
  state, _, _ = deterministic.unroll(params, state)
  checkpointer = Checkpointer(tmp_path)
  checkpointer.save(1, state, {})
  _, restored, _ = checkpointer.restore_latest(state)
  checkpointer.close()
  assert isinstance(restored, envs.FunctionalRolloutState)
  a = deterministic.unroll(params, state)
  b = deterministic.unroll(params, jax.tree.map(jnp.asarray, restored))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def test_continuous_actions_are_stored_as_returned_and_clipped_by_the_env():
  env = envs.make_functional("gymnax:Pendulum-v1", max_episode_steps=50)

  def act(params, obs, key):
    return jnp.full((obs.shape[0], 1), params), {"mean": jnp.zeros((obs.shape[0], 1))}

  rollout = envs.make_functional_rollout(env, act, 4, 2)
  key = jax.random.PRNGKey(0)
  _, (big,), _, _ = run_unrolls(rollout, jnp.float32(5.0), key, 1)
  _, (bound,), _, _ = run_unrolls(rollout, jnp.float32(2.0), key, 1)
  assert big.action.dtype == np.float32 and big.action.shape == (5, 2, 1)
  np.testing.assert_array_equal(big.action, 5.0)
  np.testing.assert_array_equal(big.observation, bound.observation)


def test_minatar_rollout_shapes():
  env = envs.make_functional("gymnax:Breakout-MinAtar", max_episode_steps=20)

  def act(params, obs, key):
    logits = jnp.zeros((obs.shape[0], env.spec.num_actions))
    return jax.random.categorical(key, logits).astype(jnp.int32), {"logits": logits}

  rollout = envs.make_functional_rollout(env, act, 3, 2)
  _, (traj,), _, _ = run_unrolls(rollout, None, jax.random.PRNGKey(0), 1)
  assert traj.observation.shape == (4, 2, 4, 10, 10) and traj.observation.dtype == np.float32
  assert traj.extras["logits"].shape == (4, 2, 3)
  np.testing.assert_array_equal(traj.step_type[0], FIRST)


def test_bad_rollout_arguments_raise(cartpole):
  with pytest.raises(ValueError, match="unroll_length must be >= 1"):
    envs.make_functional_rollout(cartpole, random_act, 0, 2)
  with pytest.raises(ValueError, match="num_envs must be an int"):
    envs.make_functional_rollout(cartpole, random_act, 3, 2.0)
  with pytest.raises(ValueError, match="num_envs must be >= 1"):
    envs.make_functional_rollout(cartpole, random_act, 3, 0)
  with pytest.raises(ValueError, match="FunctionalEnv"):
    envs.make_functional_rollout("gymnax:CartPole-v1", random_act, 3, 2)
  with pytest.raises(ValueError, match="callable"):
    envs.make_functional_rollout(cartpole, None, 3, 2)
  with pytest.raises(ValueError, match="finished_episodes expects"):
    envs.finished_episodes((np.zeros((2, 2), bool),) * 3)

  def act_with(action, extras):
    rollout = envs.make_functional_rollout(cartpole, lambda p, o, k: (action, extras), 3, 2)
    return lambda: rollout.init(None, jax.random.PRNGKey(0))

  with pytest.raises(ValueError, match=r"extras\['x'\] has shape \(3,\)"):
    act_with(jnp.zeros((2,), jnp.int32), {"x": jnp.zeros((3,))})()
  with pytest.raises(ValueError, match="integer dtype, got float32"):
    act_with(jnp.zeros((2,)), {})()
  with pytest.raises(ValueError, match=r"action shape \(2, 1\), expected \(2,\)"):
    act_with(jnp.zeros((2, 1), jnp.int32), {})()


def test_bad_keys_env_ids_and_episode_stats_are_refused_by_name():
  """A non-key reached JAX's "invalid PRNG key data"; env_id=1.5 became 1, -1 was taken;
  episode stats of another shape raised an IndexError, and a float `done` counted 0.5 as
  an episode's end."""
  env = envs.make_functional("gymnax:CartPole-v1")
  rollout = envs.make_functional_rollout(env, random_act, unroll_length=2, num_envs=2)
  key_message = r"key must be a PRNG key \(jax.random.key\(seed\) or jax.random.PRNGKey\(seed\)\)"
  with pytest.raises(ValueError, match=key_message):
    rollout.init(jnp.float32(0), 3)
  with pytest.raises(ValueError, match=key_message + ", got 3"):
    env.reset(3)
  other = envs.make_functional_rollout(env, random_act, unroll_length=2, num_envs=3)
  with pytest.raises(
      ValueError, match=r"the state of a rollout over 3 environments; this one " r"steps 2"
  ):  # fmt: skip (it blamed act's extras)
    rollout.unroll(jnp.float32(0), other.init(jnp.float32(0), jax.random.PRNGKey(0)))
  # uint32 2**32 - 1 was stored as -1, and 2**40 overflowed in JAX's int32 cast.
  for env_id in (1.5, -1, "a", True, np.uint32(2**32 - 1), 2**40, 2**70):
    with pytest.raises(ValueError, match=r"env_id must be an int in \[0, 2\*\*31\) \(the env"):
      env.reset(jax.random.PRNGKey(0), env_id)
  assert int(env.reset(jax.random.PRNGKey(0), np.int64(3))[1].env_id) == 3
  states = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), 2), jnp.arange(2))[1]
  assert states.env_id.tolist() == [0, 1]  # traced env ids are not read
  done = np.array([[False, True], [True, False], [False, False]])
  stats = envs.FunctionalEpisodeStats(done, np.ones((3, 2)), np.full((3, 2), 4))
  assert envs.finished_episodes(stats).env_id.tolist() == [1, 0]
  with pytest.raises(ValueError, match=r"\[T, B\] arrays alike, got shapes \[\(3, 2\), \(3,\)"):
    envs.finished_episodes(stats._replace(episode_return=np.ones(3)))
  with pytest.raises(ValueError, match="done must be bool, got float64"):
    envs.finished_episodes(stats._replace(done=done * 0.5))
