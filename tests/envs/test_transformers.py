"""Data transformers: running statistics, reward transforms, fresh vs replayed data."""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs

jax.config.update("jax_numpy_rank_promotion", "raise")


MAX_BATCH = 6


@jax.jit
def _padded_update(stats, x, mask):
  return envs.running_stats_update(stats, x, mask)


@settings(deadline=None, max_examples=25)
@given(
    sizes=st.lists(st.integers(0, MAX_BATCH), min_size=1, max_size=5),
    dim=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    offset=st.floats(-100, 100),
)
def test_parallel_update_matches_numpy_over_all_samples(sizes, dim, seed, offset):
  """Batches of any size (padded to one shape with masked garbage) merged one by one give
  the mean and variance of all samples together."""
  rng = np.random.default_rng(seed)
  batches = [rng.normal(offset, 3.0, size=(k, 2, dim)).astype(np.float32) for k in sizes]
  stats = envs.running_stats_init((dim,))
  for x in batches:
    padded = rng.normal(1e3, 1e3, size=(MAX_BATCH, 2, dim)).astype(np.float32)
    padded[: x.shape[0]] = x
    mask = np.arange(MAX_BATCH)[:, None].repeat(2, 1) < x.shape[0]
    stats = _padded_update(stats, padded, mask)
  allx = np.concatenate(batches).reshape(-1, dim).astype(np.float64)
  assert float(stats.count) == allx.shape[0]
  if allx.shape[0] == 0:
    np.testing.assert_array_equal(stats.mean, 0.0)
    np.testing.assert_array_equal(stats.var, 1.0)
  else:
    np.testing.assert_allclose(stats.mean, allx.mean(0), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(stats.var, allx.var(0), rtol=1e-3, atol=1e-3)


def test_mask_drops_samples_and_update_is_jittable():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 5, 2)), jnp.float32)
  mask = jnp.asarray(np.random.default_rng(1).random((4, 5)) < 0.5)
  stats = jax.jit(envs.running_stats_update)(envs.running_stats_init((2,)), x, mask)
  kept = np.asarray(x)[np.asarray(mask)]
  assert float(stats.count) == kept.shape[0]
  np.testing.assert_allclose(stats.mean, kept.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats.var, kept.var(0), rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="mask has shape"):
    envs.running_stats_update(stats, x, mask[:2])
  with pytest.raises(ValueError, match="expected \\[\\*batch, 2\\]"):
    envs.running_stats_update(stats, x[..., :1])


def test_normalize_and_reward_transforms():
  stats = envs.RunningStats(jnp.float32(10), jnp.array([1.0, -2.0]), jnp.array([4.0, 0.25]))
  x = jnp.array([[[3.0, -2.0], [1.0, 10.0]]])
  y = envs.normalize(stats, x, clip=5.0, eps=0.0)
  np.testing.assert_allclose(y, [[[1.0, 0.0], [0.0, 5.0]]])
  np.testing.assert_allclose(envs.normalize(stats, x, clip=None, eps=0.0)[0, 1, 1], 24.0)
  r = jnp.array([-3.0, 0.0, 0.5, 7.0])
  np.testing.assert_allclose(envs.clip_reward(r, -1.0, 1.0), [-1.0, 0.0, 0.5, 1.0])
  np.testing.assert_allclose(envs.scale_reward(r, 0.1), [-0.3, 0.0, 0.05, 0.7], rtol=1e-6)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda s, x: envs.normalize(s, x, clip=-1.0), ValueError, "clip must be > 0 or None"),
        (lambda s, x: envs.normalize(s, x, eps=-1.0), ValueError, "eps must be >= 0 and finite"),
        (lambda s, x: envs.normalize(s, x, eps=np.nan), ValueError, "eps must be >= 0 and"),
        (lambda s, x: envs.normalize(s, x, clip="5"), ValueError, "clip must be a number"),
        (lambda s, x: envs.normalize(x, s), TypeError, "stats must be RunningStats"),
        (lambda s, x: envs.clip_reward(x, 1.0, -1.0), ValueError, "low must be <= high"),
        (lambda s, x: envs.clip_reward(x, np.nan, 1.0), ValueError, "low must be <= high"),
        (lambda s, x: envs.scale_reward(x, np.inf), ValueError, "scale must be finite"),
        (lambda s, x: envs.running_stats_init((-1,)), ValueError, r"shape must be a tuple of"),
    ],
)
def test_the_transforms_refuse_what_make_data_transformer_refuses(call, error, message):
  """Called alone, the public transforms gave [-1, -1] for clip -1 and a reversed reward
  clip, inf for eps -1 and NaN for eps NaN; the swapped arguments named no argument."""
  with pytest.raises(error, match=message):
    call(envs.running_stats_init((2,)), jnp.array([[2.0, -3.0]]))


def test_the_transforms_take_traced_and_array_settings():
  """Under jit, and for per-entry bounds, the settings are jnp's (nothing to check here)."""
  stats, x = envs.running_stats_init((2,)), jnp.array([[2.0, -3.0]])
  y = jax.jit(lambda c: envs.normalize(stats, x, clip=c))(1.0)
  np.testing.assert_allclose(y, [[1.0, -1.0]])
  lows = np.array([-1.0, -2.0])
  np.testing.assert_allclose(envs.clip_reward(x[0], lows, 1.0), [1.0, -2.0])
  np.testing.assert_allclose(jax.jit(envs.scale_reward)(x[0], 2.0), [4.0, -6.0])


@pytest.mark.parametrize("const", [0.0, 0.1, 1000.1, 123456.7, 1e7 + 0.3, -3.3e9])
def test_a_constant_dimension_normalises_to_zero_at_any_magnitude(const):
  """Float32 rounding left the running mean of a constant a few ulps off it, which its
  spurious variance plus eps could not absorb: 1000.1 normalised to 0.88, 123456.7 to -1.
  It is now the constant exactly, with variance 0; a normal dimension beside it keeps its
  statistics, and masked samples (inf here) are not read."""
  rng = np.random.default_rng(0)
  update = jax.jit(envs.running_stats_update)
  stats, seen = envs.running_stats_init((2,)), []
  for _ in range(20):
    x = np.stack([rng.normal(size=(16, 7)), np.full((16, 7), const)], -1).astype(np.float32)
    mask = rng.random((16, 7)) < 0.8
    x[~mask] = np.inf
    stats = update(stats, jnp.asarray(x), jnp.asarray(mask))
    seen.append(x[mask])
  assert float(stats.mean[1]) == np.float32(const) and float(stats.var[1]) == 0.0
  masked = jnp.full((16, 7, 2), jnp.inf)  # every sample masked, the first one inf too
  unchanged = update(stats, masked, jnp.zeros((16, 7), bool))
  for a, b in zip(jax.tree.leaves(unchanged), jax.tree.leaves(stats)):
    np.testing.assert_array_equal(a, b)
  seen = np.concatenate(seen).astype(np.float64)
  np.testing.assert_allclose(stats.mean[0], seen[:, 0].mean(), atol=1e-5)
  np.testing.assert_allclose(stats.var[0], seen[:, 0].var(), rtol=1e-5)
  point = jnp.asarray([[0.0, const]], jnp.float32)
  for eps in (1e-8, 0.0):  # eps = 0: 0 / 0 was NaN
    assert float(envs.normalize(stats, point, eps=eps)[0, 1]) == 0.0
  transformer = envs.make_data_transformer((2,), normalize_observations=True, obs_eps=0.0)
  tstate = transformer.init()._replace(obs_stats=stats)
  assert float(transformer.observe(tstate, point)[0, 1]) == 0.0


@pytest.fixture(scope="module")
def trajs():
  return _collect()


def _collect(k=3, T=5):
  def act(params, obs, key):
    logits = jnp.zeros((obs.shape[0], 2))
    return jax.random.categorical(key, logits).astype(jnp.int32), {"logits": logits}

  env = envs.make("CartPole-v1", 3, 0, max_episode_steps=9)
  rollout = envs.make_rollout(env, act, T, to_device=True)
  state = rollout.init(None, jax.random.PRNGKey(0))
  trajs = []
  for _ in range(k):
    state, traj, _ = rollout.unroll(None, state)
    trajs.append(traj)
  return trajs


def test_same_transform_for_fresh_and_replayed_data_and_never_twice(trajs):
  transformer = envs.make_data_transformer(
      (4,), normalize_observations=True, obs_clip=3.0, reward_clip=(-0.5, 0.5), reward_scale=2.0
  )
  tstate = transformer.init()
  update = jax.jit(transformer.update)
  for traj in trajs:
    tstate = update(tstate, traj)
  # Each observation counted once: [0, T) of each unroll (index T is the next index 0).
  obs = np.concatenate([np.asarray(t.observation[:-1]) for t in trajs]).reshape(-1, 4)
  assert float(tstate.obs_stats.count) == obs.shape[0]
  np.testing.assert_allclose(tstate.obs_stats.mean, obs.mean(0), rtol=1e-4, atol=1e-6)

  fresh = trajs[-1]
  replayed = jax.tree.map(lambda x: np.array(x, copy=True), fresh)  # raw data through a host buffer
  assert isinstance(replayed, envs.Trajectory)
  apply_jit = jax.jit(transformer.apply)
  outs = [transformer.apply(tstate, fresh), apply_jit(tstate, fresh), apply_jit(tstate, replayed)]
  for out in outs:
    assert isinstance(out, envs.TransformedTrajectory)
    for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(outs[0]), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
  out = outs[0]
  np.testing.assert_allclose(out.reward, 2.0 * np.clip(np.asarray(fresh.reward), -0.5, 0.5))
  np.testing.assert_array_equal(
      np.asarray(out.reward)[np.asarray(fresh.step_type) == envs.FIRST], 0.0
  )
  assert np.abs(np.asarray(out.observation)).max() <= 3.0
  np.testing.assert_array_equal(out.action, fresh.action)
  np.testing.assert_array_equal(out.step_type, fresh.step_type)
  # loss inputs work on both types.
  np.testing.assert_allclose(envs.loss_inputs(out).r_t, np.asarray(out.reward)[1:])
  # Never twice, jitted or not; and update refuses transformed data.
  with pytest.raises(ValueError, match="TransformedTrajectory"):
    transformer.apply(tstate, out)
  with pytest.raises(ValueError, match="TransformedTrajectory"):
    apply_jit(tstate, out)
  with pytest.raises(ValueError, match="TransformedTrajectory"):
    transformer.update(tstate, out)
  with pytest.raises(ValueError, match="expects a Trajectory"):
    transformer.apply(tstate, tuple(fresh))


def test_identity_transformer_only_changes_the_type(trajs):
  traj = trajs[0]
  transformer = envs.make_data_transformer((4,))
  tstate = transformer.init()
  assert tstate.obs_stats is None
  assert transformer.update(tstate, traj) == tstate
  out = transformer.apply(tstate, traj)
  assert isinstance(out, envs.TransformedTrajectory)
  for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(traj), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(observation_shape=(0,)), "observation_shape"),
        (dict(obs_clip=0.0), "obs_clip"),
        (dict(obs_eps=-1.0), "obs_eps"),
        (dict(reward_clip=(0.5, 1.0)), "reward_clip"),
        (dict(reward_clip=(1.0, -1.0)), "reward_clip"),
        (dict(reward_scale=0.0), "reward_scale"),
        (dict(observation_shape=4), r"observation_shape must be a tuple of positive ints, got 4"),
        (dict(obs_clip="5"), "obs_clip must be a number, got '5'"),
        (dict(reward_scale="2"), "reward_scale must be a number"),
        (dict(reward_scale=float("inf")), "reward_scale must be > 0 and finite"),
        (dict(obs_eps=float("nan")), "obs_eps must be >= 0 and finite"),
        (dict(reward_clip=(-1, 0, 1)), r"reward_clip must be a pair \(low, high\)"),
        (dict(reward_clip=(-1, "1")), "reward_clip must be a number"),
        (dict(normalize_observations="False"), "normalize_observations must be True or False"),
    ],
)
def test_make_data_transformer_validates(kwargs, match):
  args = dict(observation_shape=(4,))
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    envs.make_data_transformer(args.pop("observation_shape"), **args)


def test_a_state_of_another_transformer_is_refused():
  """A state without statistics skipped a normalising transformer's normalisation; None
  raised an AttributeError. NumPy ints are sizes too."""
  normalizing = envs.make_data_transformer((np.int64(4),), normalize_observations=True)
  plain = envs.make_data_transformer((4,))
  traj = envs.Trajectory(
      np.ones((3, 2), np.int32), np.zeros((3, 2), np.float32), np.ones((3, 2), np.float32),
      np.ones((3, 2, 4), np.float32), np.zeros((3, 2), np.int32), np.zeros((3, 2), np.int32), {},
  )  # fmt: skip
  with pytest.raises(ValueError, match=r"apply: the state has no observation statistics, and the "
                                       r"transformer was made with normalize_observations=True"):  # fmt: skip
    normalizing.apply(plain.init(), traj)
  with pytest.raises(ValueError, match=r"observe: the state has observation statistics, and "):
    plain.observe(normalizing.init(), traj.observation[0])
  with pytest.raises(TypeError, match=r"DataTransformer.apply takes its TransformerState .*None"):
    plain.apply(None, traj)
  assert normalizing.apply(normalizing.init(), traj).observation.shape == (3, 2, 4)
