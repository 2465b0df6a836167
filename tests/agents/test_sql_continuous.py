"""Continuous SQL (and SQIL on it): acting in the box, the update's targets at episode
boundaries, the split of gradients between Q and the sampler, configuration errors."""

import dataclasses
import math

from agent_data import agent_trajectory as _trajectory
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac import networks
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_sqil
from offpolicy_ac.agents import make_sqil_batch_fn
from offpolicy_ac.agents import make_sql
from offpolicy_ac.agents import make_sql_continuous
from offpolicy_ac.agents import make_sql_discrete
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID
from offpolicy_ac.envs import Trajectory
from offpolicy_ac.testing import reference as ref

# A box that is not symmetric around 0, two action dimensions.
BOX = dict(action_shape=(2,), action_low=(-2.0, 0.0), action_high=(2.0, 1.0))


@pytest.fixture(scope="module")
def box_spec(pendulum_spec):
  return pendulum_spec._replace(task_id="Box-v0", **BOX)


def test_make_sql_picks_the_agent_by_action_space(pendulum_spec, cartpole_spec):
  continuous = make_sql(pendulum_spec).init(jax.random.PRNGKey(0))
  assert set(continuous.params) == {"q", "sampler"} and set(continuous.opt_state) == {
      "q",
      "sampler",
  }
  discrete = make_sql(cartpole_spec).init(jax.random.PRNGKey(0))
  assert set(discrete.params) == {"params"}


def test_acting_stays_in_the_box(box_spec):
  agent = make_sql(box_spec, SqlConfig(epsilon=0.0))
  state = agent.init(jax.random.PRNGKey(0))
  obs = jax.random.normal(jax.random.PRNGKey(1), (512, 3))
  low, high = np.array(BOX["action_low"]), np.array(BOX["action_high"])
  action, extras = jax.jit(agent.act)(state.params, obs, jax.random.PRNGKey(2))
  assert action.shape == (512, 2) and action.dtype == jnp.float32 and extras == {}
  action = np.asarray(action)
  assert np.all((low <= action) & (action <= high))
  assert np.all(np.std(np.asarray(action), 0) > 0)  # a sample, not one action per state
  greedy = np.asarray(agent.greedy_act(state.params, obs))
  assert greedy.shape == (512, 2) and np.all((low <= greedy) & (greedy <= high))
  # greedy_act is the sampler's action at zero noise: deterministic, and what the sampler
  # network gives for xi = 0 (mapped from [-1, 1]^2 to the box).
  np.testing.assert_array_equal(greedy, agent.greedy_act(state.params, obs))
  net = networks.AmortizedSampler(networks.make_torso("auto", (3,), ()), 2, (128, 128))
  u = np.asarray(net.apply(state.params["sampler"], obs, jnp.zeros((512, 2))))
  np.testing.assert_allclose(greedy, (low + high) / 2 + (high - low) / 2 * u, rtol=1e-6, atol=1e-6)


def test_epsilon_one_acts_uniformly_in_the_box(box_spec):
  agent = make_sql(box_spec, SqlConfig(epsilon=1.0))
  state = agent.init(jax.random.PRNGKey(0))
  action, _ = agent.act(state.params, jnp.zeros((20_000, 3)), jax.random.PRNGKey(1))
  action = np.asarray(action)
  np.testing.assert_allclose(action.mean(0), [0.0, 0.5], atol=0.03)
  np.testing.assert_allclose(action.min(0), [-2.0, 0.0], atol=0.01)
  np.testing.assert_allclose(action.max(0), [2.0, 1.0], atol=0.01)
  np.testing.assert_allclose(action.std(0), [4 / math.sqrt(12), 1 / math.sqrt(12)], rtol=0.03)


def test_keys_are_split_not_reused(pendulum_spec):
  agent = make_sql(pendulum_spec)
  state = agent.init(jax.random.PRNGKey(0))
  with jax.debug_key_reuse(True):
    agent.act(state.params, jnp.zeros((3, 3)), jax.random.PRNGKey(1))


def test_update_moves_both_networks_and_the_target_by_tau(pendulum_spec):
  agent = make_sql(pendulum_spec)
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(pendulum_spec, agent, state.params, jax.random.PRNGKey(1))
  new_state, metrics = agent.update(state, traj)
  assert int(new_state.num_updates) == 1
  expected = {"loss", "q_mean", "abs_td_error", "svgd_loss", "particle_std", "grad_norm",
              "sampler_grad_norm"}  # fmt: skip
  assert set(metrics) == expected
  assert all(np.isfinite(float(v)) for v in metrics.values())
  for part in ("q", "sampler"):
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params[part],
                           new_state.params[part])  # fmt: skip
    assert all(jax.tree.leaves(changed)), part
  tau = agent.config.target_update_tau
  jax.tree.map(
      lambda t, a, p: np.testing.assert_allclose(t, (1 - tau) * a + tau * p, rtol=1e-6, atol=1e-7),
      new_state.target_params,
      state.target_params,
      new_state.params["q"],
  )
  assert not bool(jnp.all(new_state.key == state.key))


@pytest.mark.parametrize("spec_name", ["pendulum_spec", "cartpole_spec"])
def test_the_step_size_cools_down_to_zero(request, spec_name):
  # Full steps for the first 2 updates, half a step at the 3rd, none from the 4th on: the
  # networks move on updates 1 to 3 and stay where they are on the 4th and 5th (both
  # agents, every network, each with its own optimizer state).
  spec = request.getfixturevalue(spec_name)
  config = SqlConfig(learning_rate_decay_begin=1, learning_rate_decay_updates=2)
  agent = make_sql(spec, config)
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(1))
  moved = []
  for _ in range(5):
    new_state, _ = agent.update(state, traj)
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params, new_state.params)
    moved.append(any(jax.tree.leaves(changed)))
    state = new_state
  assert moved == [True, True, True, False, False]


def test_mixture_value_proposal_changes_only_the_targets(pendulum_spec):
  """value_proposal_std > 0: the same update, but the soft value of the targets is
  estimated from a mixture around the sampler's action, so Q's loss differs."""
  uniform = make_sql(pendulum_spec)
  mixture = make_sql(pendulum_spec, dataclasses.replace(SqlConfig(), value_proposal_std=0.1))
  state = uniform.init(jax.random.PRNGKey(0))
  traj = _trajectory(pendulum_spec, uniform, state.params, jax.random.PRNGKey(1))
  _, m_uniform = uniform.update(state, traj)
  new_state, m_mixture = mixture.update(state, traj)
  assert all(np.isfinite(float(v)) for v in m_mixture.values())
  assert float(m_mixture["loss"]) != float(m_uniform["loss"])
  # The sampler's own loss does not depend on the value estimate.
  np.testing.assert_allclose(m_mixture["svgd_loss"], m_uniform["svgd_loss"], rtol=1e-6)
  assert int(new_state.num_updates) == 1


def test_gradients_do_not_cross_between_q_and_the_sampler(pendulum_spec):
  """Q's step ignores the sampler (its targets use uniform actions); the sampler's step
  ignores the target network (SVGD uses the online Q, held constant)."""
  agent = make_sql(pendulum_spec)
  state = agent.init(jax.random.PRNGKey(0))
  other = agent.init(jax.random.PRNGKey(1))
  traj = _trajectory(pendulum_spec, agent, state.params, jax.random.PRNGKey(2))
  base, _ = agent.update(state, traj)
  new_sampler, _ = agent.update(
      state._replace(params={**state.params, "sampler": other.params["sampler"]}), traj
  )
  new_target, _ = agent.update(state._replace(target_params=other.params["q"]), traj)
  same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  same(base.params["q"], new_sampler.params["q"])
  same(base.params["sampler"], new_target.params["sampler"])
  with pytest.raises(AssertionError):
    same(base.params["sampler"], new_sampler.params["sampler"])


def _constant_q(params, hidden_sizes, value):
  """Q params whose output is `value` for every (s, a): the last layer's kernel zeroed."""
  last = f"Dense_{len(hidden_sizes)}"
  layer = params["params"][last]
  return {"params": {**params["params"], last: {"kernel": jnp.zeros_like(layer["kernel"]),
                                                 "bias": jnp.full_like(layer["bias"], value)}}}  # fmt: skip


def _boundary_trajectory(t=7, b=3, d=2):
  """[t+1, b] with a termination (col 0), a truncation (col 1) and junctions after them."""
  step_type = np.full((t + 1, b), MID, np.int32)
  step_type[0] = FIRST
  step_type[2, 0], step_type[3, 0] = LAST, FIRST  # termination
  step_type[4, 1], step_type[5, 1] = LAST, FIRST  # truncation
  discount = np.ones((t + 1, b), np.float32)
  discount[2, 0] = 0.0
  reward = np.linspace(-2.0, 1.0, (t + 1) * b, dtype=np.float32).reshape(t + 1, b)
  reward[step_type == FIRST] = 0.0
  rng = np.random.default_rng(0)
  return Trajectory(
      jnp.asarray(step_type),
      jnp.asarray(reward),
      jnp.asarray(discount),
      jnp.asarray(rng.normal(size=(t + 1, b, 3)).astype(np.float32)),
      jnp.zeros((t + 1, b), jnp.int32),
      jnp.asarray(rng.uniform(-2, 2, size=(t + 1, b, d)).astype(np.float32)),
      {},
  )


@pytest.mark.parametrize("n_step, lambda_", [(1, 0.0), (3, 0.0), (3, 0.6)])
def test_targets_at_terminations_truncations_and_junctions(box_spec, n_step, lambda_):
  """With Q_target = c everywhere, the importance-sampled V(s') is c + alpha d log 2 for
  any sampled actions, so the loss is known exactly: the soft targets of the discrete
  agent's semantics (envs.loss_inputs: gamma discounts, 0 at termination, bootstrapped
  truncation, masked junctions) against Q = c0."""
  config = SqlConfig(alpha=0.3, gamma=0.9, n_step=n_step, lambda_=lambda_)
  agent = make_sql(box_spec, config)
  state = agent.init(jax.random.PRNGKey(0))
  c, c0 = 1.5, -0.5
  state = state._replace(
      params={**state.params, "q": _constant_q(state.params["q"], config.hidden_sizes, c0)},
      target_params=_constant_q(state.target_params, config.hidden_sizes, c),
  )
  traj = _boundary_trajectory()
  _, metrics = agent.update(state, traj)
  li = envs.loss_inputs(traj, config.gamma)
  mask = np.asarray(li.mask)
  v = np.full(mask.shape + (1,), c + config.alpha * 2 * np.log(2.0))
  r, disc = np.asarray(li.r_t), np.asarray(li.discount_t)
  if lambda_ > 0:
    targets = ref.soft_q_targets(r, disc, v, 1.0, lambda_, mask)
  else:
    targets = ref.soft_nstep_targets(r, disc, v, 1.0, n_step, mask)
  errors = np.where(mask, targets - c0, 0.0)
  assert not mask.all() and (disc == 0).any() and (disc[mask] > 0).any()
  np.testing.assert_allclose(metrics["loss"], np.sum(errors**2) / mask.sum(), rtol=1e-5)
  np.testing.assert_allclose(metrics["abs_td_error"], np.abs(errors).sum() / mask.sum(), rtol=1e-5)
  np.testing.assert_allclose(metrics["q_mean"], c0, rtol=1e-6)


def test_traced_hyperparams_give_the_update_of_the_concrete_config(pendulum_spec):
  from offpolicy_ac.agents import hyperparams as hp_lib

  config = SqlConfig()
  setting = {"alpha": 0.5, "learning_rate": 3e-3, "epsilon": 0.2, "target_update_tau": 0.3}
  concrete = make_sql(pendulum_spec, dataclasses.replace(config, **setting))
  state = concrete.init(jax.random.PRNGKey(0))
  traj = _trajectory(pendulum_spec, concrete, state.params, jax.random.PRNGKey(1))
  want = concrete.update(state, traj)
  want_action, _ = concrete.act(state.params, traj.observation[0], jax.random.PRNGKey(3))

  def update(hp, state, traj):
    return make_sql(pendulum_spec, hp_lib.with_hyperparams(config, hp)).update(state, traj)

  def act(hp, params, obs, key):
    return make_sql(pendulum_spec, hp_lib.with_hyperparams(config, hp)).act(params, obs, key)

  hp = {**hp_lib.hyperparams_of(config), **{k: jnp.float32(v) for k, v in setting.items()}}
  got = jax.jit(update)(hp, state, traj)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
  got_action, _ = jax.jit(act)(hp, state.params, traj.observation[0], jax.random.PRNGKey(3))
  np.testing.assert_allclose(want_action, got_action, rtol=1e-6, atol=1e-6)
  both = jax.tree.map(lambda d, s: jnp.stack([d, s]), hp_lib.hyperparams_of(config), hp)
  lanes, _ = jax.jit(jax.vmap(update, in_axes=(0, None, None)))(both, state, traj)
  lane = jax.tree.map(lambda x: x[1], lanes)
  for a, b in zip(jax.tree.leaves(want[0].params), jax.tree.leaves(lane.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_q_networks_are_stacked_and_initialised_apart(pendulum_spec):
  one = make_sql(pendulum_spec).init(jax.random.PRNGKey(0))
  twin = make_sql(pendulum_spec, SqlConfig(num_q_networks=2)).init(jax.random.PRNGKey(0))
  for a, b in zip(jax.tree.leaves(one.params["q"]), jax.tree.leaves(twin.params["q"])):
    assert b.shape == (2,) + a.shape
  kernels = twin.params["q"]["params"]["Dense_0"]["kernel"]
  assert not np.allclose(kernels[0], kernels[1])
  jax.tree.map(np.testing.assert_array_equal, twin.target_params, twin.params["q"])
  # The sampler's initial values do not depend on the number of Q networks.
  jax.tree.map(np.testing.assert_array_equal, one.params["sampler"], twin.params["sampler"])


def _with_second_q(single_q, second_q):
  """Stacks two single-network Q params into the params of two Q networks."""
  return jax.tree.map(lambda a, b: jnp.stack([a, b]), single_q, second_q)


def test_a_dominating_second_q_network_leaves_the_first_as_the_single_agent(pendulum_spec):
  """Clipped double Q takes the minimum in the targets and in SVGD: with a second network
  (online and target) above the first everywhere, the first network and the sampler take
  exactly the single-network agent's step, and the loss adds the second's squared errors.
  No clipping (a huge max_grad_norm): the clipping norm is global over the networks."""
  config = SqlConfig(max_grad_norm=1e9, value_proposal_std=0.1)
  single = make_sql(pendulum_spec, config)
  twin = make_sql(pendulum_spec, dataclasses.replace(config, num_q_networks=2))
  state = single.init(jax.random.PRNGKey(0))
  high = 1e3
  far = _constant_q(state.params["q"], config.hidden_sizes, high)
  twin_state = state._replace(
      params={**state.params, "q": _with_second_q(state.params["q"], far)},
      target_params=_with_second_q(state.target_params, far),
      opt_state={**state.opt_state, "q": twin.init(jax.random.PRNGKey(0)).opt_state["q"]},
  )
  traj = _trajectory(pendulum_spec, single, state.params, jax.random.PRNGKey(1))
  want, want_metrics = single.update(state, traj)
  got, got_metrics = twin.update(twin_state, traj)
  first = lambda tree: jax.tree.map(lambda x: x[0], tree)
  close = lambda a, b: jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a, b
  )
  close(want.params["q"], first(got.params["q"]))
  close(want.target_params, first(got.target_params))
  close(want.params["sampler"], got.params["sampler"])
  np.testing.assert_allclose(got_metrics["svgd_loss"], want_metrics["svgd_loss"], rtol=1e-5)
  # The second network's errors: its constant against targets far below it.
  np.testing.assert_allclose(got_metrics["q_mean"], (want_metrics["q_mean"] + high) / 2, rtol=1e-5)
  assert float(got_metrics["loss"]) > float(want_metrics["loss"]) + (high - 100) ** 2


@pytest.mark.parametrize("num_q", [1, 2, 3])
def test_targets_bootstrap_from_the_smallest_q_network(box_spec, num_q):
  """Target networks constant at c_k: V(s') is min_k c_k + alpha d log 2; every online
  network (constant c0_k) regresses on those targets; the loss sums their errors."""
  config = SqlConfig(alpha=0.3, gamma=0.9, n_step=1, num_q_networks=num_q)
  agent = make_sql(box_spec, config)
  state = agent.init(jax.random.PRNGKey(0))
  single = make_sql(box_spec, dataclasses.replace(config, num_q_networks=1))
  q = single.init(jax.random.PRNGKey(0)).params["q"]
  targets_c, online_c = [2.5, 1.5, 4.0][:num_q], [-0.5, 0.25, 1.0][:num_q]
  stack = lambda values: jax.tree.map(
      lambda *xs: jnp.stack(xs), *[_constant_q(q, config.hidden_sizes, v) for v in values]
  )
  state = state._replace(
      params={**state.params, "q": stack(online_c) if num_q > 1 else
              _constant_q(q, config.hidden_sizes, online_c[0])},
      target_params=stack(targets_c) if num_q > 1 else
      _constant_q(q, config.hidden_sizes, targets_c[0]),
  )  # fmt: skip
  traj = _boundary_trajectory()
  _, metrics = agent.update(state, traj)
  li = envs.loss_inputs(traj, config.gamma)
  mask = np.asarray(li.mask)
  v = np.full(mask.shape + (1,), min(targets_c) + config.alpha * 2 * np.log(2.0))
  targets = ref.soft_nstep_targets(np.asarray(li.r_t), np.asarray(li.discount_t), v, 1.0, 1, mask)
  errors = [np.where(mask, targets - c0, 0.0) for c0 in online_c]
  np.testing.assert_allclose(
      metrics["loss"], sum(np.sum(e**2) for e in errors) / mask.sum(), rtol=1e-5
  )
  np.testing.assert_allclose(
      metrics["abs_td_error"], np.mean([np.abs(e).sum() / mask.sum() for e in errors]), rtol=1e-5
  )
  np.testing.assert_allclose(metrics["q_mean"], np.mean(online_c), rtol=1e-6)


def test_pixel_observations_use_the_pixel_torso(box_spec):
  spec = box_spec._replace(observation_shape=(4, 10, 10), observation_dtype="uint8")
  agent = make_sql(spec, SqlConfig(num_particles=4, num_value_samples=4))
  state = agent.init(jax.random.PRNGKey(0))
  assert "conv" in state.params["q"]["params"]["torso"]
  assert "conv" in state.params["sampler"]["params"]["torso"]
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(1), t=4, b=2)
  traj = traj._replace(observation=(jnp.abs(traj.observation) * 50).astype(jnp.uint8))
  _, metrics = agent.update(state, traj)
  assert all(np.isfinite(float(v)) for v in metrics.values())


def test_sqil_on_continuous_demonstrations(pendulum_spec):
  agent = make_sqil(pendulum_spec, SqlConfig(num_particles=4, num_value_samples=4))
  assert agent.name == "sqil"
  state = agent.init(jax.random.PRNGKey(0))
  agent_batch = _trajectory(pendulum_spec, agent, state.params, jax.random.PRNGKey(1), t=4, b=2)
  demos = _trajectory(pendulum_spec, agent, state.params, jax.random.PRNGKey(2), t=7, b=3)
  batch_fn = make_sqil_batch_fn(demos._replace(extras={}), batch_size=2, length=5)
  batch = jax.jit(batch_fn)(agent_batch, jax.random.PRNGKey(3))
  assert batch.action.shape == (5, 4, 1) and batch.action.dtype == jnp.float32
  np.testing.assert_array_equal(batch.reward[1:, :2], 0.0)
  new_state, metrics = agent.update(state, batch)
  assert all(np.isfinite(float(v)) for v in metrics.values())


def test_agents_refuse_the_other_action_space(pendulum_spec, cartpole_spec):
  with pytest.raises(ValueError, match="SQL needs a discrete action space"):
    make_sql_discrete(pendulum_spec)
  with pytest.raises(ValueError, match="continuous SQL .* needs a continuous action space"):
    make_sql_continuous(cartpole_spec)
  with pytest.raises(ValueError, match="bounded box"):
    make_sql(pendulum_spec._replace(action_low=(-np.inf,)))
  with pytest.raises(ValueError, match="continuous actions only; discrete SQL takes 1"):
    make_sql(cartpole_spec, SqlConfig(num_q_networks=2))


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(num_particles=1), "num_particles must be an int >= 2"),
        (dict(num_particles=16, svgd_update_ratio=0.05), "svgd_update_ratio"),
        (dict(num_particles=2, svgd_update_ratio=1.0), "svgd_update_ratio"),
        (dict(svgd_update_ratio=float("nan")), "svgd_update_ratio must lie in"),
        (dict(num_value_samples=0), "num_value_samples"),
        (dict(num_value_samples=4.0), "num_value_samples"),
        (dict(value_proposal_std=-0.1), "value_proposal_std must be >= 0"),
        (dict(value_proposal_std=float("inf")), "value_proposal_std must be finite"),
        (dict(value_proposal_std=0.1, num_value_samples=1), "num_value_samples >= 2"),
        (dict(num_q_networks=0), "num_q_networks must be an int >= 1"),
        (dict(num_q_networks=2.0), "num_q_networks must be an int >= 1"),
        (dict(learning_rate_decay_updates=-1), "learning_rate_decay_updates must be an int >= 0"),
        (
            dict(learning_rate_decay_updates=4, learning_rate_decay_begin=0.5),
            "learning_rate_decay_begin must be an int >= 0",
        ),
        (dict(learning_rate_decay_begin=10), "needs learning_rate_decay_updates > 0"),
    ],
)
def test_continuous_settings_are_validated(pendulum_spec, cartpole_spec, bad, message):
  config = dataclasses.replace(SqlConfig(), **bad)
  for spec in (pendulum_spec, cartpole_spec):  # checked before anything is built
    with pytest.raises(ValueError, match=message):
      make_sql(spec, config)
