"""The ACER agent: shapes, extras, updates, the average network, configuration
errors, and reduced-budget learning through experiments/acer.py.

Random CartPole play returns about 22; a random Pendulum policy about -1200.
The full-budget targets (CartPole-v1 >= 475 within 500k steps, Pendulum-v1
>= -250 within 300k) are marked `slow`.
"""

import dataclasses
import functools
import json

from agent_data import agent_trajectory
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import losses
from offpolicy_ac import presets
from offpolicy_ac.agents import AcerConfig
from offpolicy_ac.agents import base
from offpolicy_ac.agents import make_acer
from offpolicy_ac.agents import make_acer_continuous
from offpolicy_ac.agents import make_acer_discrete
from offpolicy_ac.envs import MID
from offpolicy_ac.envs import Trajectory
from offpolicy_ac.training import read_metrics
from offpolicy_ac.training import run_experiment


@pytest.fixture(params=["discrete", "continuous"])
def spec(request, cartpole_spec, pendulum_spec):
  return cartpole_spec if request.param == "discrete" else pendulum_spec


@pytest.fixture(scope="module")
def agents(cartpole_spec, pendulum_spec):
  """Default-config agents keyed by spec.is_discrete, shared so jit caches are reused."""
  return {True: make_acer(cartpole_spec), False: make_acer(pendulum_spec)}


@pytest.fixture(scope="module")
def loose_agents(cartpole_spec, pendulum_spec):
  """Agents whose trust region never acts (delta = 1e9), keyed like `agents`."""
  config = AcerConfig(trust_region_delta=1e9)
  return {True: make_acer(cartpole_spec, config), False: make_acer(pendulum_spec, config)}


def _trajectory(spec, agent, params, key, t=6, b=3):
  """A [t+1, b] trajectory from the agent's own `act`: env 0 terminates at step 3
  (LAST, discount 0) and restarts at step 4 (FIRST), a masked junction; varied rewards."""
  return agent_trajectory(spec, agent, params, key, t, b, varied_rewards=True)


def _max_abs_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# --- acting ------------------------------------------------------------------


def test_discrete_act_shapes_dtypes_and_extras(agents):
  agent = agents[True]
  assert agent.name == "acer" and agent.off_policy and agent.fresh_update_first
  state = agent.init(jax.random.PRNGKey(0))
  obs = jnp.zeros((5, 4), jnp.float32)
  action, extras = jax.jit(agent.act)(state.params, obs, jax.random.PRNGKey(1))
  assert action.shape == (5,) and action.dtype == jnp.int32
  assert set(extras) == {"logits"}
  assert extras["logits"].shape == (5, 2) and extras["logits"].dtype == jnp.float32
  greedy = jax.jit(agent.greedy_act)(state.params, obs)
  assert greedy.shape == (5,) and greedy.dtype == jnp.int32
  np.testing.assert_array_equal(greedy, jnp.argmax(extras["logits"], axis=-1))


def test_continuous_act_shapes_dtypes_and_extras(agents):
  agent = agents[False]
  state = agent.init(jax.random.PRNGKey(0))
  obs = jnp.ones((5, 3), jnp.float32)
  action, extras = jax.jit(agent.act)(state.params, obs, jax.random.PRNGKey(1))
  assert action.shape == (5, 1) and action.dtype == jnp.float32
  assert set(extras) == {"log_prob", "mean", "log_std"}
  assert extras["log_prob"].shape == (5,)
  assert extras["mean"].shape == extras["log_std"].shape == (5, 1)
  np.testing.assert_allclose(
      extras["log_prob"],
      losses.gaussian_log_prob(extras["mean"], extras["log_std"], action),
      rtol=1e-6,
  )
  greedy = jax.jit(agent.greedy_act)(state.params, obs)
  np.testing.assert_allclose(greedy, extras["mean"])


def test_act_draws_from_the_key(spec, agents):
  agent = agents[spec.is_discrete]
  state = agent.init(jax.random.PRNGKey(0))
  obs = jnp.zeros((64,) + tuple(spec.observation_shape), jnp.float32)
  a1, _ = agent.act(state.params, obs, jax.random.PRNGKey(1))
  a2, _ = agent.act(state.params, obs, jax.random.PRNGKey(2))
  a1_again, _ = agent.act(state.params, obs, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(a1, a1_again)
  assert bool(jnp.any(a1 != a2))


# --- updates -------------------------------------------------------------------


@pytest.mark.parametrize("shared_torso", [False, True])
def test_update_is_finite_changes_params_and_advances(spec, agents, shared_torso):
  agent = (
      agents[spec.is_discrete]
      if not shared_torso
      else make_acer(spec, AcerConfig(shared_torso=True))
  )
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  new_state, metrics = agent.update(state, traj)
  assert int(new_state.num_updates) == 1
  assert not bool(jnp.all(new_state.key == state.key))
  for name in (
      "loss",
      "policy_loss",
      "value_loss",
      "entropy",
      "mean_rho",
      "kl_avg",
      "trust_region_active",
      "grad_norm",
  ):
    assert np.isfinite(float(metrics[name])), name
  # On its own fresh data the learner is the behaviour policy: rho = 1.
  np.testing.assert_allclose(float(metrics["mean_rho"]), 1.0, rtol=1e-5)
  assert float(metrics["clipped_rho_fraction"]) == 0.0
  assert _max_abs_diff(state.params, new_state.params) > 0
  assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_average_network_moves_as_an_ema(spec, agents):
  agent = agents[spec.is_discrete]
  decay = agent.config.avg_decay
  state = agent.init(jax.random.PRNGKey(0))
  assert _max_abs_diff(state.params, state.target_params) == 0.0
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  for _ in range(3):
    new_state, _ = agent.update(state, traj)
    expected = jax.tree.map(
        lambda a, p: decay * a + (1 - decay) * p, state.target_params, new_state.params
    )
    assert _max_abs_diff(new_state.target_params, expected) < 1e-6
    state = new_state
  # It lags: closer to the initial parameters than the online network is.
  init = agent.init(jax.random.PRNGKey(0)).params
  assert 0 < _max_abs_diff(state.target_params, init) < _max_abs_diff(state.params, init)


def test_update_works_under_jit_and_scan(spec, agents):
  agent = agents[spec.is_discrete]
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  batches = jax.tree.map(lambda x: jnp.stack([x, x]), traj)

  @jax.jit
  def two_updates(state, batches):
    return jax.lax.scan(agent.update, state, batches)

  scanned, metrics = two_updates(state, batches)
  s1, _ = agent.update(state, traj)
  s2, _ = agent.update(s1, traj)
  assert int(scanned.num_updates) == 2 and metrics["loss"].shape == (2,)
  assert _max_abs_diff(scanned.params, s2.params) < 1e-5


def _trajectory_no_junction(spec, agent, params, t, b):
  obs = jnp.ones((t + 1, b) + tuple(spec.observation_shape), jnp.float32)
  flat = obs.reshape((-1,) + obs.shape[2:])
  action, extras = agent.act(params, flat, jax.random.PRNGKey(0))
  unflat = lambda x: x.reshape((t + 1, b) + x.shape[1:])
  ones = jnp.ones((t + 1, b), jnp.float32)
  return Trajectory(
      jnp.full((t + 1, b), MID, jnp.int32),
      ones,
      ones,
      obs,
      jnp.zeros((t + 1, b), jnp.int32),
      unflat(action),
      jax.tree.map(unflat, extras),
  )


def test_update_accepts_a_single_transition(spec, agents):
  """A [2, 1] batch (T = 1, B = 1): the smallest window the replay can return."""
  agent = agents[spec.is_discrete]
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory_no_junction(spec, agent, state.params, t=1, b=1)
  _, metrics = agent.update(state, traj)
  assert np.isfinite(float(metrics["loss"]))


def test_an_update_on_no_sequence_reports_zero_metrics(spec, agents):
  """B = 0: every metric is the masked mean's 0 (continuous ACER's log_std was a plain mean
  over nothing: NaN); with sequences, log_std is the learned steps' mean."""
  agent = agents[spec.is_discrete]
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  _, metrics = agent.update(state, jax.tree.map(lambda x: x[:, :0], traj))
  assert {k: float(v) for k, v in metrics.items()} == dict.fromkeys(metrics, 0.0)
  if not spec.is_discrete:
    _, metrics = agent.update(state, traj)
    np.testing.assert_allclose(float(metrics["log_std"]), AcerConfig().init_log_std, atol=1e-6)


def test_masked_junction_transition_is_ignored(spec, agents):
  """The transition leaving a LAST step (into the next episode's FIRST step) must
  not matter: change its reward and the update is the same."""
  agent = agents[spec.is_discrete]
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  other = traj._replace(reward=traj.reward.at[4, 0].set(1e3))
  s1, m1 = agent.update(state, traj)
  s2, m2 = agent.update(state, other)
  assert _max_abs_diff(s1.params, s2.params) < 1e-6
  np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-6)


def test_inactive_trust_region_gives_the_plain_acer_gradient(spec, loose_agents):
  """With a huge delta the projection never acts: same step as no trust region."""
  loose = loose_agents[spec.is_discrete]
  state = loose.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, loose, state.params, jax.random.PRNGKey(2))
  # Off-policy data: perturb the behaviour policy so rho != 1 and the bias
  # correction term is exercised.
  if spec.is_discrete:
    traj = traj._replace(extras={"logits": traj.extras["logits"] * 0.0})
  with_tr, metrics = loose.update(state, traj)
  assert float(metrics["trust_region_active"]) == 0.0
  without_tr, _ = make_acer(spec, AcerConfig(use_trust_region=False)).update(state, traj)
  assert _max_abs_diff(with_tr.params, without_tr.params) < 1e-6


def test_tight_trust_region_changes_the_step(cartpole_spec, loose_agents):
  agent = loose_agents[True]
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(cartpole_spec, agent, state.params, jax.random.PRNGKey(2))
  # Move the online policy away from the average one so k != 0.
  moved = state._replace(params=jax.tree.map(lambda p: p * 1.5, state.params))
  loose, _ = agent.update(moved, traj)
  tight, m = make_acer(cartpole_spec, AcerConfig(trust_region_delta=0.0)).update(moved, traj)
  assert float(m["trust_region_active"]) > 0
  assert _max_abs_diff(loose.params, tight.params) > 0


# --- configuration errors --------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("gamma", 1.5, "gamma"),
        ("learning_rate", 0.0, "learning_rate"),
        ("max_grad_norm", -1.0, "max_grad_norm"),
        ("clip_c", 0.0, "clip_c"),
        ("trust_region_delta", -0.1, "trust_region_delta"),
        ("avg_decay", 1.0, "avg_decay"),
        ("avg_decay", -0.1, "avg_decay"),
        ("avg_decay", "0.9", "avg_decay must be a number, got '0.9'"),
        ("value_weight", -1.0, "value_weight"),
        ("entropy_weight", -1.0, "entropy_weight"),
        ("replay_ratio", 0, "replay_ratio must be an int >= 1"),
        ("replay_ratio", -1, "replay_ratio"),
        ("replay_ratio", 1.5, "replay_ratio"),
        ("replay_ratio", np.int64(4), r"got np.int64\(4\) \(a NumPy integer: give int\(value\)\)"),
        ("sdn_samples", 0, "sdn_samples"),
        ("optimizer", "sgd", "optimizer"),
        ("hidden_sizes", (), "hidden_sizes"),
    ],
)
def test_bad_config_raises(cartpole_spec, field, value, message):
  config = dataclasses.replace(AcerConfig(), **{field: value})
  with pytest.raises(ValueError, match=message):
    config.validate()
  with pytest.raises(ValueError, match=message):
    make_acer(cartpole_spec, config)


def test_a_trust_region_size_without_the_trust_region_is_refused(cartpole_spec):
  config = AcerConfig(use_trust_region=False, trust_region_delta=0.5)
  with pytest.raises(ValueError, match="trust_region_delta: the trust region's size: no effect"):
    base.check_settings_used(config, cartpole_spec)
  base.check_settings_used(AcerConfig(use_trust_region=False), cartpole_spec)  # the default
  with pytest.raises(ValueError, match="avg_decay: the trust region's average network"):
    base.check_settings_used(AcerConfig(use_trust_region=False, avg_decay=0.5), cartpole_spec)
  with pytest.raises(ValueError, match="--sweep avg_decay: the trust region's average"):
    base.check_swept_settings_used(AcerConfig(use_trust_region=False), cartpole_spec,
                                   ["avg_decay"])  # fmt: skip
  make_acer(cartpole_spec, config)  # a run rebuilt from its config.json


def test_discrete_acer_on_a_continuous_task_names_the_problem(pendulum_spec):
  with pytest.raises(ValueError, match="discrete ACER.*discrete action space.*Pendulum"):
    make_acer_discrete(pendulum_spec)


def test_continuous_acer_on_a_discrete_task_names_the_problem(cartpole_spec):
  with pytest.raises(ValueError, match="continuous ACER.*continuous action space.*CartPole"):
    make_acer_continuous(cartpole_spec)


@pytest.mark.parametrize("missing", ["logits", "log_prob", "mean", "log_std"])
def test_update_names_missing_behaviour_extras(cartpole_spec, pendulum_spec, agents, missing):
  spec = cartpole_spec if missing == "logits" else pendulum_spec
  agent = agents[spec.is_discrete]
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  extras = {k: v for k, v in traj.extras.items() if k != missing}
  with pytest.raises(ValueError, match=f"extras.*{missing}"):
    agent.update(state, traj._replace(extras=extras))


# --- the experiment script --------------------------------------------------------


def _script():
  return presets.acer


def _args(module, run_dir, agent=None, preset="cartpole", **loop_overrides):
  args = module.PRESETS[preset]
  return dataclasses.replace(
      args,
      run_dir=str(run_dir),
      train=args.train.replace(**loop_overrides),
      agent=dataclasses.replace(args.agent, **(agent or {})),
  )


def _trailing_returns(run_dir, lines=3):
  returns = [r["episode_return"] for r in read_metrics(run_dir) if r["episode_return"] is not None]
  return [float(np.mean(returns[max(0, i - lines + 1) : i + 1])) for i in range(len(returns))]


def test_presets_are_valid_and_the_pendulum_one_only_changes_the_task():
  module = _script()
  assert module.PRESETS["cartpole"] == module.Args()
  pendulum = module.PRESETS["pendulum"]
  assert pendulum.train.env.env_id == "Pendulum-v1" and pendulum.agent == AcerConfig()
  assert module.PRESETS["atari"].agent.torso == "nature_cnn"
  for args in module.PRESETS.values():
    args.agent.validate()
    args.resolved_train.validate()


def test_script_derives_the_loop_updates_from_the_replay_ratio():
  module = _script()
  args = module.Args(agent=AcerConfig(replay_ratio=3))
  assert args.resolved_train.replay.num_updates_per_train_iter == 3
  with pytest.raises(ValueError, match="replay-ratio"):
    module.Args(
        train=module.Args().train.replace(num_updates_per_train_iter=7),
        agent=AcerConfig(replay_ratio=3),
    )
  with pytest.raises(ValueError, match="replay-ratio"):
    module.Args(agent=AcerConfig(replay_ratio=0))


def test_run_experiment_refuses_a_loop_whose_updates_are_not_the_replay_ratio(tmp_path):
  """The script's Args, not resolved (train's num_updates_per_train_iter 1, replay_ratio 4),
  given to run_experiment: refused before the run directory is made."""
  args = dataclasses.replace(_script().Args(), run_dir=str(tmp_path / "run"))
  with pytest.raises(ValueError, match=r"replay_ratio \(4\) .* num_updates_per_train_iter is 1"):
    run_experiment("acer", args, functools.partial(make_acer, config=args.agent), progress=False)
  assert not (tmp_path / "run").exists()


def test_script_run_records_the_replay_ratio(tmp_path):
  module = _script()
  result = module.run(
      _args(
          module,
          tmp_path / "run",
          agent=dict(replay_ratio=2),
          total_env_steps=2048,
          log_every=1024,
          eval_every=1024,
          eval_episodes=2,
          num_envs=4,
          unroll_length=8,
          mini_batch_length=8,
      )
  )
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["config"]["train"]["replay"]["num_updates_per_train_iter"] == 2
  assert config["config"]["agent"]["replay_ratio"] == 2
  # 64 iterations: one fresh update each, then 2 replayed ones once the buffer
  # holds min_replay_size = 64 sequences (16 iterations of 4).
  assert result.num_updates == 64 + 2 * (64 - 15)
  lines = read_metrics(tmp_path / "run")
  assert all(np.isfinite(l["loss"]) for l in lines if "loss" in l)


def test_acer_learns_cartpole_reduced_budget(tmp_path):
  module = _script()
  module.run(_args(module, tmp_path, total_env_steps=40_000, log_every=5_000))
  assert max(_trailing_returns(tmp_path)) > 150


def test_acer_improves_on_pendulum_reduced_budget(tmp_path):
  module = _script()
  module.run(_args(module, tmp_path, preset="pendulum", total_env_steps=60_000))
  assert _trailing_returns(tmp_path, lines=2)[-1] > -900


@pytest.mark.slow
def test_acer_reaches_the_cartpole_target(tmp_path):
  module = _script()
  # The target allows 500k steps; the defaults get there in about 50k.
  module.run(_args(module, tmp_path, total_env_steps=200_000, log_every=10_000))
  assert max(_trailing_returns(tmp_path)) >= 475


@pytest.mark.slow
def test_acer_reaches_the_pendulum_target(tmp_path):
  module = _script()
  module.run(_args(module, tmp_path, preset="pendulum"))
  assert max(_trailing_returns(tmp_path)) >= -250
