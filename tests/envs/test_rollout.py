"""The host backend on real envpool environments: indexing, boundaries, per-env columns of
batched stepping, bad use."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rollout_checks import assert_batched_columns
from rollout_checks import assert_boundaries_shared
from rollout_checks import deterministic_act
from rollout_checks import np_tree
from rollout_checks import random_act
from rollout_checks import run_batched_unrolls
from rollout_checks import run_unrolls
from rollout_checks import stream

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID
from offpolicy_ac.envs import _rollout_base

jax.config.update("jax_numpy_rank_promotion", "raise")


def test_rollout_equals_manual_stepping():
  n, T, k, params = 3, 6, 5, -1.0  # falls within about 10 steps: terminations
  rollout = envs.make_rollout(
      envs.make("CartPole-v1", n, 4, max_episode_steps=12), deterministic_act, T
  )
  trajs, stats, _ = run_unrolls(rollout, jnp.float32(params), jax.random.PRNGKey(0), k)
  for traj in trajs:
    assert traj.observation.shape == (T + 1, n, 4) and traj.step_type.shape == (T + 1, n)
    assert traj.extras["pair"][0].shape == (T + 1, n, 2)
  assert_boundaries_shared(trajs)
  got = stream(trajs)

  env = envs.make("CartPole-v1", n, 4, max_episode_steps=12)
  ts = env.reset()
  steps = []
  act = jax.jit(deterministic_act)
  for t in range(k * T + 1):
    action, extras = np_tree(act(jnp.float32(params), ts.observation, None))
    steps.append(envs.Trajectory(*ts, action=action, extras=extras))
    if t < k * T:
      ts = env.step(action)
  want = jax.tree.map(lambda *x: np.stack(x), *steps)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6)
  assert (got.step_type == LAST).any() and (got.discount == 0).any()
  want_stats = env.pop_episode_stats()
  for x, y in zip(stats, want_stats, strict=True):
    np.testing.assert_array_equal(x, y)


def test_same_seed_same_data():
  def go(seed):
    env = envs.make("CartPole-v1", 4, 1, max_episode_steps=9)
    trajs, stats, _ = run_unrolls(
        envs.make_rollout(env, random_act, 6), jnp.float32(0), jax.random.PRNGKey(seed), 3
    )
    return trajs, stats

  (a, sa), (b, sb), (c, _) = go(0), go(0), go(1)
  for x, y in zip(jax.tree.leaves((a, sa)), jax.tree.leaves((b, sb)), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(stream(a).action, stream(c).action)


@pytest.mark.parametrize(
    "num_envs, batch_size, T, lead",
    [(6, 2, 7, 1), (5, 3, 7, 1), (5, 3, 1, 1), (6, 2, 7, 0), (5, 3, 7, 0)],
    ids=["6x2", "5x3", "5x3-T1", "6x2-park", "5x3-park"],
)
def test_batched_rollout_columns_are_environments(num_envs, batch_size, T, lead, monkeypatch):
  # With 5 envs in batches of 3 some environments get ahead (the steps carried over to the
  # next unroll), then start the next unroll's buffers; T = 1 is the shortest unroll.
  # lead 0 parks every environment that has its T+1 rows, whenever a batch stays in flight.
  monkeypatch.setattr(_rollout_base, "MAX_LEAD_ROWS_PER_STEP", lead)
  k = 6 if T > 1 else 30
  # With lead 0 the bound on how far a column gets ahead assumes that envpool returns the
  # environments in the order they were sent, which only one worker thread guarantees.
  threads = {"num_threads": 1} if lead == 0 else {}
  env = envs.make(
      "CartPole-v1", num_envs, 2, batch_size=batch_size, max_episode_steps=10, **threads
  )
  rollout = envs.make_rollout(env, random_act, T)
  state = rollout.init(jnp.float32(0), jax.random.PRNGKey(3))
  trajs, stats, state, ahead, parked = run_batched_unrolls(
      rollout, state, jnp.float32(0), k, lead == 0, env
  )
  if num_envs % batch_size and lead:
    assert ahead >= 1  # the carry-over path ran
  if lead == 0:
    assert parked >= k // 2  # the parking path ran
  assert state.pending.observation.shape[1] == num_envs
  assert_batched_columns(trajs, stats, state.num_pending, num_envs, T)


def test_batched_deterministic_policy_is_reproducible():
  def go():
    env = envs.make("CartPole-v1", 4, 9, batch_size=2, max_episode_steps=8)
    trajs, _, _ = run_unrolls(
        envs.make_rollout(env, deterministic_act, 5), jnp.float32(1), jax.random.PRNGKey(0), 4
    )
    return stream(trajs)

  a, b = go(), go()
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def test_loss_inputs_by_hand_and_on_a_rollout():
  step_type = np.array([[FIRST], [MID], [LAST], [FIRST], [MID]], np.int32)
  traj = envs.Trajectory(
        step_type=step_type,
        reward=np.array([[0.0], [1.0], [2.0], [0.0], [3.0]], np.float32),
        discount=np.array([[1.0], [1.0], [0.0], [1.0], [1.0]], np.float32),
        observation=np.zeros((5, 1, 2)), env_id=np.zeros((5, 1), np.int32),
        action=np.zeros((5, 1), np.int32), extras={},
    )  # fmt: skip
  for fn in (envs.loss_inputs, jax.jit(envs.loss_inputs, static_argnums=1)):
    out = fn(traj, 0.9)
    np.testing.assert_allclose(out.r_t[:, 0], [1.0, 2.0, 0.0, 3.0])
    np.testing.assert_allclose(out.discount_t[:, 0], [0.9, 0.0, 0.9, 0.9], rtol=1e-6)
    np.testing.assert_array_equal(out.mask[:, 0], [True, True, False, True])
  with pytest.raises(ValueError, match="gamma"):
    envs.loss_inputs(traj, 1.5)
  with pytest.raises(ValueError, match="T\\+1 >= 2"):
    envs.loss_inputs(jax.tree.map(lambda x: x[:1], traj))

  env = envs.make("CartPole-v1", 3, 0, max_episode_steps=6)
  state = (rollout := envs.make_rollout(env, random_act, 8)).init(None, jax.random.PRNGKey(0))
  state, traj, _ = rollout.unroll(jnp.float32(0), state)
  inputs = envs.loss_inputs(traj)
  assert inputs.mask.shape == inputs.r_t.shape == inputs.discount_t.shape == (8, 3)
  masked = ~np.asarray(inputs.mask)
  assert masked.any()
  np.testing.assert_array_equal(np.asarray(traj.step_type)[1:][masked], FIRST)
  np.testing.assert_array_equal(np.asarray(inputs.r_t)[masked], 0.0)


def test_continuous_rollout_stores_the_policy_action_and_env_gets_it_clipped():
  def act(params, obs, key):
    return jnp.full((obs.shape[0], 1), 5.0), {"mean": jnp.zeros((obs.shape[0], 1))}

  rollout = envs.make_rollout(envs.make("Pendulum-v1", 2, 3), act, 4, to_device=False)
  state = rollout.init(None, jax.random.PRNGKey(0))
  state, traj, _ = rollout.unroll(None, state)
  assert isinstance(traj.observation, np.ndarray)
  np.testing.assert_array_equal(traj.action, 5.0)
  twin = envs.make("Pendulum-v1", 2, 3)
  ts = twin.reset()
  for t in range(1, 5):
    ts = twin.step(np.full((2, 1), 2.0, np.float32))
    np.testing.assert_array_equal(traj.observation[t], ts.observation)


def test_atari_rollout_shapes_and_dtypes():
  env = envs.make_atari("Pong-v5", 2, 0)

  def act(params, obs, key):
    logits = jnp.zeros((obs.shape[0], env.spec.num_actions))
    return jax.random.categorical(key, logits).astype(jnp.int32), {"logits": logits}

  rollout = envs.make_rollout(env, act, 3)
  state = rollout.init(None, jax.random.PRNGKey(0))
  state, traj, stats = rollout.unroll(None, state)
  assert traj.observation.shape == (4, 2, 4, 84, 84) and traj.observation.dtype == jnp.uint8
  assert traj.extras["logits"].shape == (4, 2, 6)
  np.testing.assert_array_equal(np.asarray(traj.step_type)[0], FIRST)
  assert stats.env_id.shape == (0,)


def test_bad_rollout_use_raises():
  env = envs.make("CartPole-v1", 2, 0)
  with pytest.raises(ValueError, match="unroll_length must be >= 1"):
    envs.make_rollout(env, random_act, 0)
  with pytest.raises(ValueError, match="EnvPoolEnv"):
    envs.make_rollout("CartPole-v1", random_act, 3)
  with pytest.raises(ValueError, match="callable"):
    envs.make_rollout(env, None, 3)
  for backend in ("host", "compiled"):  # a seed given where the key goes: refused at init
    with pytest.raises(ValueError, match=r"key must be a PRNG key .*, got 0"):
      envs.make_rollout(env, random_act, 3, backend=backend).init(None, 0)
  rollout = envs.make_rollout(env, random_act, 3)
  state = rollout.init(None, jax.random.PRNGKey(0))
  new_state, _, _ = rollout.unroll(jnp.float32(0), state)
  with pytest.raises(ValueError, match="stale RolloutState"):
    rollout.unroll(jnp.float32(0), state)
  rollout.unroll(jnp.float32(0), new_state)  # the live one still works

  def float_actions(params, obs, key):
    return jnp.zeros((obs.shape[0],)), {}

  bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), float_actions, 3)
  with pytest.raises(ValueError, match="integer dtype"):
    bad.unroll(None, bad.init(None, jax.random.PRNGKey(0)))

  def out_of_range(params, obs, key):
    return jnp.full((obs.shape[0],), 7, jnp.int32), {}

  bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), out_of_range, 3)
  with pytest.raises(ValueError, match=r"must be in \[0, 2\)"):
    bad.unroll(None, bad.init(None, jax.random.PRNGKey(0)))

  def bad_extras(params, obs, key):
    return jnp.zeros((obs.shape[0],), jnp.int32), {"x": jnp.zeros((3,))}

  bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), bad_extras, 3)
  with pytest.raises(ValueError, match="leading batch axis of 2"):
    bad.unroll(None, bad.init(None, jax.random.PRNGKey(0)))


def test_furthest_ahead_holds_the_leaders_within_the_budget():
  count = np.array([3, 9, 5, 12, 9])
  batch = np.array([1, 2, 3, 4])
  # Envs 1, 3, 4 have >= 9 rows; furthest first (env 3), ties in batch order (1 before 4).
  np.testing.assert_array_equal(_rollout_base.furthest_ahead(batch, count, 9, 5), [2, 0, 3])
  np.testing.assert_array_equal(_rollout_base.furthest_ahead(batch, count, 9, 2), [2, 0])
  assert _rollout_base.furthest_ahead(batch, count, 9, 0).size == 0
  assert _rollout_base.furthest_ahead(batch, count, 13, 4).size == 0


def test_parked_actions_send_the_rest_and_keep_the_held():
  parked, sent = _rollout_base.ParkedActions(), []
  assert parked.state() is None and parked.count == 0
  send = lambda action, env_id: sent.append((action.tolist(), env_id.tolist()))  # noqa: E731
  parked.hold(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40]), np.array([2, 0]), send)
  parked.hold(np.array([0, 5]), np.array([50, 60]), np.array([0, 1]), send)  # all held
  assert sent == [([20, 40], [2, 4])]  # nothing sent when the whole batch is held
  env_id, action = parked.state()
  np.testing.assert_array_equal(env_id, [3, 1, 0, 5])
  np.testing.assert_array_equal(action, [30, 10, 50, 60])
  assert parked.count == 4


def _zeros_policy(extras):
  return lambda params, obs, key: (jnp.zeros(obs.shape[0], jnp.int32), extras(obs))


@pytest.mark.parametrize("backend", ["host", "compiled"])
def test_a_state_is_unrolled_once_and_extras_carry_the_batch_axis(backend):
  env = envs.make("CartPole-v1", 2, 0)
  rollout = envs.make_rollout(env, _zeros_policy(lambda obs: {}), 3, backend=backend)
  state = rollout.init(None, jax.random.PRNGKey(0))
  rollout.unroll(None, state)
  with pytest.raises(ValueError, match="stale .*RolloutState: each state can be unrolled once"):
    rollout.unroll(None, state)
  for extras, shape in (({"lp": jnp.float32(0)}, r"\(\)"), ({"lp": jnp.zeros(5)}, r"\(5,\)")):
    bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), _zeros_policy(lambda obs: extras), 3,
                            backend=backend)  # fmt: skip
    with pytest.raises(
        ValueError, match=rf"leading batch axis of 2; extras\['lp'\] has shape {shape}"
    ):
      bad.unroll(None, bad.init(None, jax.random.PRNGKey(0)))
  bare = envs.make_rollout(envs.make("CartPole-v1", 2, 0),
                           lambda p, obs, k: jnp.zeros(obs.shape[0], jnp.int32), 3, backend=backend)  # fmt: skip
  with pytest.raises(ValueError, match=r"act must return a pair \(action"):
    bare.unroll(None, bare.init(None, jax.random.PRNGKey(0)))


@pytest.mark.parametrize("backend", ["host", "compiled"])
def test_another_rollout_over_the_same_environments_makes_a_state_stale(backend):
  """A second rollout's init resets the shared pool; the first rollout's state was still
  taken, and its next unroll joined two episodes with no FIRST step between them (the
  host backend learned from a transition into the reset, mask True). Closed environments
  are refused by the compiled backend too (it stepped on)."""
  env = envs.make("CartPole-v1", 2, 0)
  first, second = (envs.make_rollout(env, random_act, 5, backend=backend) for _ in range(2))
  state, _, _ = first.unroll(jnp.float32(0), first.init(jnp.float32(0), jax.random.PRNGKey(0)))
  other = second.init(jnp.float32(0), jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match=r"stale .*another rollout over the same environments"):
    first.unroll(jnp.float32(0), state)
  other, _, _ = second.unroll(jnp.float32(0), other)  # the live state is the second rollout's
  state = first.init(jnp.float32(0), jax.random.PRNGKey(2))  # init takes the pool back
  with pytest.raises(ValueError, match="stale"):
    second.unroll(jnp.float32(0), other)
  state, traj, _ = first.unroll(jnp.float32(0), state)
  assert traj.step_type[0].tolist() == [envs.FIRST] * 2
  env.close()
  with pytest.raises(RuntimeError, match="the environments were closed"):
    first.unroll(jnp.float32(0), state)
  with pytest.raises(ValueError, match="to_device must be True or False, got 'no'"):
    envs.make_rollout(env, random_act, 5, backend=backend, to_device="no")


@pytest.mark.parametrize("backend", ["host", "compiled"])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_extras_that_change_between_unrolls_are_refused_by_what_changed(backend, batch_size):
  """The host backend compared only the number of extras: a renamed key relabelled the
  step carried over from the last unroll; the compiled one failed with JAX's pytree or
  concatenation errors."""
  kwargs = {} if batch_size is None else {"batch_size": batch_size}
  for params, now in (({"b": jnp.ones(())}, r"\{'b': 'float32\[\]'\}"),
                      ({"a": jnp.ones(3)}, r"\{'a': 'float32\[3\]'\}")):  # fmt: skip
    env = envs.make("CartPole-v1", 4, 0, **kwargs)

    def act(params, obs, key):
      del key
      extras = jax.tree.map(lambda v: jnp.broadcast_to(v, (obs.shape[0],) + v.shape), params)
      return jnp.zeros(obs.shape[0], jnp.int32), extras

    rollout = envs.make_rollout(env, act, 3, backend=backend)
    state = rollout.init({"a": jnp.zeros(())}, jax.random.PRNGKey(0))
    state, _, _ = rollout.unroll({"a": jnp.zeros(())}, state)
    with pytest.raises(ValueError, match=rf"act returned extras {now} \(per step\), and those of "
                                         r"the steps carried over .* are \{'a': 'float32\[\]'\}"):  # fmt: skip
      rollout.unroll(params, state)
    env.close()


def test_loss_inputs_refuses_fields_that_disagree_and_a_bad_gamma():
  T1, B = 6, 2
  traj = envs.Trajectory(
      step_type=np.ones((T1, B), np.int32), reward=np.zeros((T1, B), np.float32),
      discount=np.ones((T1, B), np.float32), observation=np.zeros((T1, B, 4), np.float32),
      env_id=np.zeros((T1, B), np.int32), action=np.zeros((T1, B), np.int32), extras={},
  )  # fmt: skip
  envs.loss_inputs(traj, np.float32(0.9))
  for bad, match in (
      (traj._replace(reward=traj.reward[1:]), r"reward has shape \(5, 2\), its step_type \(6, 2\)"),
      (traj._replace(discount=traj.discount[..., None]), r"discount has shape \(6, 2, 1\)"),
      (traj._replace(step_type=traj.step_type + 0.5), "step_type must be integers"),
      (traj._replace(reward=traj.reward.astype(np.int32)), "reward must have a floating dtype"),
  ):
    with pytest.raises(ValueError, match=match):
      envs.loss_inputs(bad, 0.9)
  for gamma in (np.float32(1.5), jnp.array(-1.0), True, "0.9", None, 1j):
    with pytest.raises(ValueError, match="gamma must be"):
      envs.loss_inputs(traj, gamma)
  jax.jit(envs.loss_inputs)(traj, 0.9)  # a traced gamma is not read
