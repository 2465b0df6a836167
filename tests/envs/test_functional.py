"""The functional environments (`envs.make_functional`): ALF TimeStep semantics over gymnax
and brax, checked as tests/envs/test_envpool.py checks envpool's.

CartPole's dynamics give a strong check that two steps belong together (see
test_envpool.py): gymnax integrates x += 0.02 x_dot and theta += 0.02 theta_dot first, so a
final observation that was really a reset observation breaks `follows` by far more than
float32 rounding.
"""

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rollout_checks import follows

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID

jax.config.update("jax_numpy_rank_promotion", "raise")

gymnax = pytest.importorskip("gymnax")


def cartpole_out_of_bounds(obs):
  return (np.abs(obs[..., 0]) > 2.4) | (np.abs(obs[..., 2]) > 12 * 2 * np.pi / 360)


def np_tree(x):
  return jax.tree.map(np.asarray, x)


def batched(env, n, seed):
  """Jitted, vmapped reset and step of n environments (env_id = arange(n))."""
  reset = jax.jit(jax.vmap(env.reset))
  step = jax.jit(jax.vmap(env.step))
  keys = jax.random.split(jax.random.PRNGKey(seed), n)
  state, ts = reset(keys, jnp.arange(n))
  return state, ts, step


def run(env, n, seed, actions):
  """TimeSteps [K+1, n] of n environments stepped with actions [K, n, ...]."""
  state, ts, step = batched(env, n, seed)
  out = [ts]
  for action in actions:
    state, ts = step(state, action)
    out.append(ts)
  return np_tree(jax.tree.map(lambda *x: jnp.stack(x), *out))


def assert_first_after_last(ts):
  """[K+1, n] TimeSteps: the step after LAST is FIRST with reward 0, discount 1; FIRST
  nowhere else; discount 0 only at LAST; env_id constant."""
  after = ts.step_type[:-1] == LAST
  np.testing.assert_array_equal(ts.step_type[0], FIRST)
  np.testing.assert_array_equal(ts.step_type[1:][after], FIRST)
  np.testing.assert_array_equal(ts.step_type[1:][~after] != FIRST, True)
  np.testing.assert_array_equal(ts.reward[ts.step_type == FIRST], 0.0)
  np.testing.assert_array_equal(ts.discount[ts.step_type != LAST], 1.0)
  np.testing.assert_array_equal(
      ts.env_id, np.broadcast_to(np.arange(ts.env_id.shape[1]), ts.env_id.shape)
  )


@pytest.fixture(scope="module")
def cartpole():
  return envs.make_functional("gymnax:CartPole-v1", max_episode_steps=12)


def test_cartpole_termination_truncation_and_first_steps(cartpole):
  n, limit, k = 4, 12, 150
  assert cartpole.max_episode_steps == limit
  actions = np.random.default_rng(0).integers(0, 2, size=(k, n)).astype(np.int32)
  ts = run(cartpole, n, 3, actions)
  assert_first_after_last(ts)
  prev, cur = jax.tree.map(lambda x: x[:-1], ts), jax.tree.map(lambda x: x[1:], ts)
  was_last = prev.step_type == LAST
  assert not follows(prev.observation, cur.observation)[was_last].any()  # a fresh reset
  assert follows(prev.observation, cur.observation)[~was_last].all()  # the true successor
  np.testing.assert_array_equal(cur.reward[~was_last], 1.0)
  # Actions taken in the episode at each step.
  elapsed = np.zeros((k + 1, n), int)
  for t in range(1, k + 1):
    elapsed[t] = np.where(ts.step_type[t] == FIRST, 0, elapsed[t - 1] + 1)
  last = ts.step_type == LAST
  terminated, truncated = last & (ts.discount == 0.0), last & (ts.discount == 1.0)
  # Termination: the true final observation is out of bounds, at most at the limit.
  assert cartpole_out_of_bounds(ts.observation[terminated]).all()
  assert (elapsed[terminated] <= limit).all()
  # Truncation: exactly at the limit, in bounds (termination wins when both).
  np.testing.assert_array_equal(elapsed[truncated], limit)
  assert not cartpole_out_of_bounds(ts.observation[truncated]).any()
  assert not cartpole_out_of_bounds(ts.observation[ts.step_type == MID]).any()
  np.testing.assert_array_equal(elapsed[ts.step_type == MID] < limit, True)
  assert terminated.sum() > 0 and truncated.sum() > 0


def test_final_observation_is_what_step_env_returned():
  """Truncation at 5 steps: LAST with discount 1 and the observation of gymnax's step_env
  from the previous state (CartPole's step_env ignores its key), not a reset's."""
  env = envs.make_functional("gymnax:CartPole-v1", max_episode_steps=5)
  genv, params = gymnax.make("CartPole-v1")
  state, ts = env.reset(jax.random.PRNGKey(1), env_id=7)
  assert int(ts.env_id) == 7 and ts.env_id.dtype == jnp.int32
  step = jax.jit(env.step)
  prev_obs = ts.observation
  for t in range(1, 7):
    action = jnp.int32(t % 2)
    want, _, want_reward, _, _ = genv.step_env(jax.random.PRNGKey(0), state.inner, action, params)
    prev = state
    state, ts = step(state, action)
    assert int(ts.env_id) == 7
    if t <= 5:
      np.testing.assert_allclose(ts.observation, want, rtol=1e-5, atol=1e-7)  # jit vs eager
      assert float(ts.reward) == float(want_reward) == 1.0
      assert int(ts.step_type) == (LAST if t == 5 else MID)
      assert float(ts.discount) == 1.0 and int(state.elapsed) == t
    else:  # the reset ignores the action and does not follow the final step
      _, other = step(prev, 1 - action)
      np.testing.assert_array_equal(ts.observation, other.observation)
      assert int(ts.step_type) == FIRST and float(ts.reward) == 0.0
      assert float(ts.discount) == 1.0 and int(state.elapsed) == 0
      assert not follows(np.asarray(prev_obs), np.asarray(ts.observation))
      np.testing.assert_array_equal(prev.needs_reset, True)
    prev_obs = ts.observation


def test_same_key_same_data_other_key_other_data(cartpole):
  actions = np.random.default_rng(1).integers(0, 2, size=(30, 3)).astype(np.int32)
  a, b, c = run(cartpole, 3, 5, actions), run(cartpole, 3, 5, actions), run(cartpole, 3, 6, actions)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.observation, c.observation)
  # Environments of one batch get different keys.
  assert not np.array_equal(a.observation[:, 0], a.observation[:, 1])


def test_jit_vmap_and_eager_agree(cartpole):
  key = jax.random.PRNGKey(2)
  s_eager, ts_eager = cartpole.reset(key)
  s_jit, ts_jit = jax.jit(cartpole.reset)(key)
  states, ts_vmap = jax.vmap(cartpole.reset)(key[None])
  for x, y, z in zip(jax.tree.leaves((s_eager, ts_eager)), jax.tree.leaves((s_jit, ts_jit)),
                     jax.tree.leaves((states, ts_vmap)), strict=True):  # fmt: skip
    np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(x, z[0])
  a = cartpole.step(s_eager, jnp.int32(1))
  b = jax.jit(cartpole.step)(s_jit, jnp.int32(1))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6)
  assert ts_vmap.observation.shape == (1, 4) and ts_vmap.step_type.shape == (1,)


@pytest.mark.parametrize("name", envs.GYMNAX_TASKS)
def test_gymnax_spec_matches_the_arrays(name):
  env = envs.make_functional(f"gymnax:{name}")
  spec = env.spec
  genv, params = gymnax.make(name)
  assert env.max_episode_steps == params.max_steps_in_episode  # gymnax's default limit
  assert spec.task_id == f"gymnax:{name}" and (spec.num_envs, spec.batch_size) == (1, 1)
  assert hash(spec) == hash(spec)
  state, ts = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
  action = jax.ShapeDtypeStruct(spec.action_shape, spec.action_dtype)
  _, ts2 = jax.eval_shape(env.step, state, action)
  for t in (ts, ts2):
    assert t.observation.shape == spec.observation_shape
    assert t.observation.dtype == spec.observation_dtype == "float32"
    assert (t.step_type.dtype, t.env_id.dtype) == (jnp.int32, jnp.int32)
    assert (t.reward.dtype, t.discount.dtype) == (jnp.float32, jnp.float32)
    assert t.reward.shape == t.discount.shape == t.step_type.shape == ()
  if name.endswith("-MinAtar"):  # [H, W, C] -> channels first
    h, w, c = genv.observation_space(params).shape
    assert spec.observation_shape == (c, h, w)
  if spec.is_discrete:
    assert spec.num_actions == genv.action_space(params).n and spec.action_dtype == "int32"
  else:
    assert spec.action_low is not None and spec.action_dtype == "float32"


@pytest.fixture(scope="module")
def breakout():
  return envs.make_functional("gymnax:Breakout-MinAtar", max_episode_steps=40)


def test_minatar_channels_first_terminates_and_resets(breakout):
  genv, _ = gymnax.make("Breakout-MinAtar")
  n, k = 3, 60
  state, ts, step = batched(breakout, n, 0)
  obs_of = jax.jit(jax.vmap(lambda inner: jnp.transpose(genv.get_obs(inner), (2, 0, 1))))
  rng = np.random.default_rng(0)
  out = [ts]
  for _ in range(k):
    state, ts = step(state, rng.integers(0, 3, size=n).astype(np.int32))
    # The observation is the state's (the final one at LAST), channels first.
    np.testing.assert_array_equal(ts.observation, obs_of(state.inner))
    out.append(ts)
  ts = np_tree(jax.tree.map(lambda *x: jnp.stack(x), *out))
  assert ts.observation.shape == (k + 1, n, 4, 10, 10) and ts.observation.dtype == np.float32
  assert set(np.unique(ts.observation).tolist()) <= {0.0, 1.0}
  assert_first_after_last(ts)
  # Breakout ends when the ball passes the paddle: a termination (discount 0), fast with a
  # random paddle; the ball is then in the bottom row (channel 1).
  terminated = (ts.step_type == LAST) & (ts.discount == 0.0)
  assert terminated.any()
  np.testing.assert_array_equal(ts.observation[terminated][:, 1, 9].max(axis=-1), 1.0)


def test_freeway_game_end_is_a_termination_and_the_time_limit_a_truncation():
  """MinAtar's Freeway lasts 2500 steps by its rules: reaching game step 2500 is a
  termination (discount 0) whatever the time limit (which counts actions separately); a
  shorter time limit truncates (discount 1)."""
  assert envs.make_functional("gymnax:Freeway-MinAtar").max_episode_steps == 2500
  env = envs.make_functional("gymnax:Freeway-MinAtar", max_episode_steps=3)
  step = jax.jit(env.step)
  state, ts = env.reset(jax.random.PRNGKey(0))
  for game_step, want in ((2498, MID), (2499, LAST)):
    near_end = state._replace(inner=state.inner.replace(time=jnp.int32(game_step)))
    _, ts = step(near_end, jnp.int32(0))
    assert int(ts.step_type) == want
    assert float(ts.discount) == (0.0 if want == LAST else 1.0)
  state, ts = env.reset(jax.random.PRNGKey(0))
  out = [ts]
  for _ in range(4):
    state, ts = step(state, jnp.int32(1))
    out.append(ts)
  assert [int(t.step_type) for t in out] == [FIRST, MID, MID, LAST, FIRST]
  assert [float(t.discount) for t in out] == [1.0] * 5


# ------------------------------------------------------------------ brax


@pytest.fixture(scope="module")
def pendulum():
  pytest.importorskip("brax")
  env = envs.make_functional("brax:inverted_pendulum", max_episode_steps=8)
  return env, jax.jit(jax.vmap(env.reset)), jax.jit(jax.vmap(env.step))


def test_brax_tasks_load_without_brax_maintenance_notice():
  pytest.importorskip("brax")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    envs.make_functional("brax:inverted_pendulum")
  assert not [w for w in caught if "Brax System" in str(w.message)]


def test_the_preset_check_knows_brax_task_kinds_without_building_them(pendulum):
  from offpolicy_ac import cli  # it assumes every brax task is continuous, vector-observed
  from offpolicy_ac.training import TrainConfig

  spec = pendulum[0].spec
  config = TrainConfig.of(env_id="brax:inverted_pendulum", compile_for="startup")
  assert cli._task_kind(config)[:2] == (spec.is_discrete, len(spec.observation_shape))


def test_brax_spec_termination_truncation_clipping_and_final_observation(pendulum):
  from brax import envs as brax_envs

  env, reset, step = pendulum
  spec = env.spec
  assert spec.task_id == "brax:inverted_pendulum" and not spec.is_discrete
  assert spec.action_shape == (1,) and (spec.action_low, spec.action_high) == ((-1.0,), (1.0,))
  assert spec.observation_shape == (4,) and spec.observation_dtype == "float32"
  assert envs.make_functional("brax:inverted_pendulum").max_episode_steps == 1000
  # Env 0 stands still: truncated every 8 steps. Env 1 pushes hard one way: the pole falls
  # (brax's done: |angle| > 0.2), a termination. Env 2 starts as env 1 (same key) and
  # pushes with 7.5, clipped to 1 inside step: the same steps.
  k0, k1 = jax.random.split(jax.random.PRNGKey(0))
  state, ts = reset(jnp.stack([k0, k1, k1]), jnp.arange(3))
  pushes = np.array([[0.0], [1.0], [7.5]], np.float32)
  out, states = [ts], [state]
  for _ in range(20):
    state, ts = step(state, pushes)
    out.append(ts)
    states.append(state)
  ts = np_tree(jax.tree.map(lambda *x: jnp.stack(x), *out))
  assert ts.observation.dtype == np.float32 and ts.observation.shape == (21, 3, 4)
  assert_first_after_last(ts)
  np.testing.assert_array_equal(ts.observation[:, 1], ts.observation[:, 2])
  last = ts.step_type == LAST
  terminated, truncated = last & (ts.discount == 0.0), last & (ts.discount == 1.0)
  assert terminated[:, 1].any() and not terminated[:, 0].any()
  np.testing.assert_array_equal(np.flatnonzero(truncated[:, 0]), [8, 17])
  # The true final observation: the pole's angle is past 0.2 at termination only...
  assert (np.abs(ts.observation[terminated][:, 1]) > 0.2).all()
  assert (np.abs(ts.observation[~terminated][:, 1]) <= 0.2).all()
  # ... and what brax's own step returns from the state before (at LAST steps 8 and 17).
  benv = brax_envs.get_environment("inverted_pendulum", backend=envs.BRAX_DEFAULT_BACKEND)
  bstep = jax.jit(jax.vmap(benv.step))
  for t in (8, 17):
    with jax.numpy_rank_promotion("allow"):  # brax relies on implicit rank promotion
      want = bstep(states[t - 1].inner, np.clip(pushes, -1, 1)).obs
    np.testing.assert_allclose(ts.observation[t, 0], want[0], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ bad use


@pytest.mark.parametrize(
    "task_id, kwargs, match",
    [
        ("CartPole-v1", {}, r"'<prefix>:<name>'.*'gymnax:CartPole-v1'"),
        ("gym:CartPole-v1", {}, r"unknown prefix 'gym'.*\['gymnax', 'brax'\]"),
        ("gymnax:CartPole-v9", {}, r"unknown task 'CartPole-v9'.*did you mean.*CartPole-v1"),
        ("gymnax:Catch-bsuite", {}, r"unknown task 'Catch-bsuite'.*valid: \["),
        ("brax:halfcheeta", {}, r"unknown task 'halfcheeta'.*halfcheetah"),
        ("brax:ant", {"backend": "warp"}, r"unknown brax backend 'warp'.*'spring'"),
        ("gymnax:CartPole-v1", {"max_episode_steps": 0}, "max_episode_steps must be"),
        ("gymnax:CartPole-v1", {"max_episode_steps": 2.0}, "max_episode_steps must be"),
        ("gymnax:CartPole-v1", {"max_episode_steps": True}, "max_episode_steps must be"),
        ("gymnax:Breakout-MinAtar", {"sticky": 0.1}, r"unknown keyword argument\(s\) \['sticky'\]"),
        ("gymnax:CartPole-v1", {"x": 1}, r"unknown keyword argument\(s\) \['x'\].*valid: \[\]"),
        ("brax:ant", {"colour": 1}, "bad keyword arguments"),
    ],
)
def test_make_functional_rejects_bad_arguments(task_id, kwargs, match):
  if task_id.startswith("brax:"):
    pytest.importorskip("brax")
  with pytest.raises(ValueError, match=match):
    envs.make_functional(task_id, **kwargs)


@pytest.mark.parametrize("module, task_id", [("gymnax", "gymnax:CartPole-v1"),
                                             ("brax", "brax:ant")])  # fmt: skip
def test_missing_package_says_what_to_install(module, task_id, monkeypatch):
  monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
  with pytest.raises(
      ImportError,
      match=rf"needs {module}, which is not installed: pip install 'offpolicy_ac\[jax-envs\]'$",
  ):
    envs.make_functional(task_id)


def test_installed_package_that_fails_to_import_shows_its_own_error(tmp_path, monkeypatch):
  """gymnax installed without a dependency of its own (gymnax 1.0.1 needs six and does not
  say so): the message quotes gymnax's error rather than claiming gymnax is missing."""
  (tmp_path / "gymnax").mkdir()
  (tmp_path / "gymnax" / "__init__.py").write_text("import six_is_not_installed\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  for name in [n for n in sys.modules if n == "gymnax" or n.startswith("gymnax.")]:
    monkeypatch.delitem(sys.modules, name)
  with pytest.raises(ImportError) as raised:
    envs.make_functional("gymnax:CartPole-v1")
  assert str(raised.value) == (
      "gymnax:CartPole-v1 needs gymnax, which is installed but fails to import "
      "(ModuleNotFoundError: No module named 'six_is_not_installed'). "
      "pip install 'offpolicy_ac[jax-envs]' installs it with what it needs"
  )
  assert isinstance(raised.value.__cause__, ModuleNotFoundError)


def test_bad_actions_and_states_raise_when_traced(cartpole):
  state, _ = cartpole.reset(jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match=r"action shape \(2,\), expected \(\)"):
    cartpole.step(state, jnp.zeros((2,), jnp.int32))
  with pytest.raises(ValueError, match="integer dtype, got float32"):
    jax.jit(cartpole.step)(state, jnp.float32(1))
  with pytest.raises(ValueError, match="FunctionalEnvState"):
    cartpole.step(tuple(state), jnp.int32(0))
  with pytest.raises(ValueError, match="env_id must be a scalar"):
    cartpole.reset(jax.random.PRNGKey(0), jnp.arange(2))
  pendulum = envs.make_functional("gymnax:Pendulum-v1")
  state, _ = pendulum.reset(jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="floating dtype, got int32"):
    pendulum.step(state, jnp.zeros((1,), jnp.int32))
  # Out-of-range discrete actions are clipped (a jitted function cannot raise).
  a = jax.jit(cartpole.step)(state := cartpole.reset(jax.random.PRNGKey(0))[0], jnp.int32(9))
  b = jax.jit(cartpole.step)(state, jnp.int32(1))
  np.testing.assert_array_equal(a[1].observation, b[1].observation)


def test_gymnax_rendering_modules_load_on_first_use_only():
  """gymnax imports seaborn and pyplot for rendering; they load when first used."""
  code = """
import sys
from offpolicy_ac import envs
envs.make_functional("gymnax:CartPole-v1")
print(type(sys.modules["seaborn"]).__name__, type(sys.modules["matplotlib.pyplot"]).__name__)
import gymnax.environments.misc.pong as pong
print(len(pong.sns.color_palette("cubehelix", 3)), type(sys.modules["seaborn"]).__name__)
import matplotlib.pyplot as plt
print(callable(plt.figure), type(sys.modules["matplotlib.pyplot"]).__name__)
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["_Deferred", "_Deferred", "3", "module", "True", "module"]


def test_modules_imported_before_gymnax_stay_as_they_are():
  code = """
import sys
import seaborn
from offpolicy_ac import envs
envs.make_functional("gymnax:CartPole-v1")
print(sys.modules["seaborn"] is seaborn, type(sys.modules["matplotlib.pyplot"]).__name__)
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["True", "module"]
