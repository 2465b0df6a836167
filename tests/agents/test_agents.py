"""IMPALA and SQL/SQIL agents: shapes, purity, updates, configuration errors."""

import dataclasses
import re

from agent_data import agent_trajectory as _trajectory
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.agents import ImpalaConfig
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import base
from offpolicy_ac.agents import make_impala
from offpolicy_ac.agents import make_sql
from offpolicy_ac.agents import make_sql_discrete
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID
from offpolicy_ac.envs import Trajectory


def test_impala_discrete_act_and_update(cartpole_spec):
  agent = make_impala(cartpole_spec)
  state = agent.init(jax.random.PRNGKey(0))
  obs = jnp.zeros((5, 4))
  action, extras = jax.jit(agent.act)(state.params, obs, jax.random.PRNGKey(1))
  assert action.shape == (5,) and action.dtype == jnp.int32
  assert extras["logits"].shape == (5, 2)
  assert agent.greedy_act(state.params, obs).shape == (5,)
  traj = _trajectory(cartpole_spec, agent, state.params, jax.random.PRNGKey(2))
  new_state, metrics = agent.update(state, traj)
  assert int(new_state.num_updates) == 1
  assert all(np.isfinite(float(v)) for v in metrics.values())
  changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.params, new_state.params)
  assert all(jax.tree.leaves(changed))
  # On-policy data: all importance ratios are 1.
  assert float(metrics["mean_rho"]) == pytest.approx(1.0, abs=1e-5)
  assert float(metrics["clipped_rho_fraction"]) == 0.0


def test_impala_gaussian_act_and_update(pendulum_spec):
  agent = make_impala(pendulum_spec)
  state = agent.init(jax.random.PRNGKey(0))
  action, extras = agent.act(state.params, jnp.zeros((4, 3)), jax.random.PRNGKey(1))
  assert action.shape == (4, 1) and extras["log_prob"].shape == (4,)
  traj = _trajectory(pendulum_spec, agent, state.params, jax.random.PRNGKey(2))
  new_state, metrics = agent.update(state, traj)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  assert float(metrics["mean_rho"]) == pytest.approx(1.0, abs=1e-4)
  assert float(metrics["clipped_rho_fraction"]) == 0.0


@pytest.mark.parametrize("spec_name", ["cartpole_spec", "pendulum_spec"])
def test_impala_with_a_torso_each_keeps_the_value_loss_off_the_policy(spec_name, request):
  spec = request.getfixturevalue(spec_name)
  agent = make_impala(spec, ImpalaConfig(shared_torso=False, value_weight=1.0,
                                         entropy_weight=0.0))  # fmt: skip
  state = agent.init(jax.random.PRNGKey(0))
  assert set(state.params["params"]) == {"actor", "critic"}
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  new_state, metrics = agent.update(state, traj)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  moved = lambda tree: jax.tree.map(lambda a, b: bool(jnp.any(a != b)), tree(state.params),
                                    tree(new_state.params))  # fmt: skip
  # The policy learns only through the actor's torso and policy head, the value only
  # through the critic's: the actor's value head and the critic's policy head stay put.
  actor, critic = (moved(lambda p, k=k: p["params"][k]) for k in ("actor", "critic"))
  assert all(jax.tree.leaves(actor["torso"])) and all(jax.tree.leaves(critic["torso"]))
  heads = sorted(k for k in actor if k.startswith("Dense"))  # policy head(s), value head
  value_head = heads[-1]
  assert not any(jax.tree.leaves(actor[value_head]))
  assert all(jax.tree.leaves(critic[value_head]))
  assert not any(jax.tree.leaves(critic[heads[0]]))
  obs = traj.observation[0]
  action = agent.greedy_act(new_state.params, obs)
  assert action.shape == ((obs.shape[0],) if spec.is_discrete else (obs.shape[0], 1))


@pytest.mark.parametrize("spec_name", ["cartpole_spec", "pendulum_spec"])
def test_impala_clipped_surrogate_takes_the_vtrace_step_on_fresh_data(spec_name, request):
  # On the unroll the policy just acted on, every ratio pi/mu is 1 and the surrogate's
  # gradient is V-trace's policy gradient: the first update is the same step.
  spec = request.getfixturevalue(spec_name)
  plain = make_impala(spec)
  clipped = make_impala(spec, ImpalaConfig(surrogate_clip=0.2))
  state = plain.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, plain, state.params, jax.random.PRNGKey(2))
  after_plain, _ = plain.update(state, traj)
  after_clipped, metrics = clipped.update(state, traj)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      after_plain.params,
      after_clipped.params,
  )
  # A second step on the same unroll sees ratios away from 1: the steps now differ.
  again_plain, _ = plain.update(after_plain, traj)
  again_clipped, metrics = clipped.update(after_clipped, traj)
  assert float(metrics["mean_rho"]) != pytest.approx(1.0, abs=1e-6)
  differs = jax.tree.map(lambda a, b: bool(jnp.any(jnp.abs(a - b) > 1e-6)),
                         again_plain.params, again_clipped.params)  # fmt: skip
  assert any(jax.tree.leaves(differs))


def _moves(optimizer, updates):
  """How far each of `updates` optimizer steps on a constant gradient moves the parameters:
  with Adam, about the step size of that update."""
  params = jnp.zeros(3)
  opt_state = optimizer.init(params)
  moves = []
  for _ in range(updates):
    new, opt_state, _ = base.gradient_step(optimizer, params, opt_state, jnp.ones(3))
    moves.append(float(jnp.mean(params - new)))
    params = new
  return moves


def test_learning_rate_decays_linearly_to_zero():
  # The moves fall linearly, 1e-2 (1 - k / 4) at update k, and stop after 4 updates.
  optimizer = base.make_optimizer("adam", 1e-2, 1e3, eps=1e-12, decay_updates=4)
  constant = base.make_optimizer("adam", 1e-2, 1e3, eps=1e-12)
  # The constant rate's own moves, scaled: Adam's bias correction in float32, 1 - 0.999^k
  # for small k, is exact to about 1e-5 only (the second move was 1.01e-5 short of 7.5e-3
  # with jax 0.9.1), alike with and without the schedule.
  expected = np.array(_moves(constant, 6)) * [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
  np.testing.assert_allclose(_moves(optimizer, 6), expected, rtol=1e-5, atol=1e-9)
  state = constant.init(jnp.zeros(3))
  for _ in range(5):
    new, state, _ = base.gradient_step(constant, jnp.zeros(3), state, jnp.ones(3))
  np.testing.assert_allclose(-new, 1e-2, rtol=1e-5)
  for bad in (-1, 2.5, True):
    with pytest.raises(ValueError, match="decay_updates"):
      base.make_optimizer("adam", 1e-2, 1.0, decay_updates=bad)


def test_learning_rate_cools_down_after_decay_begin():
  # 1e-2 for the first decay_begin = 3 updates, then 1e-2 (1 - k / 2) at update 3 + k:
  # the rate reaches 0 decay_updates = 2 updates after it began to fall.
  optimizer = base.make_optimizer("adam", 1e-2, 1e3, eps=1e-12, decay_updates=2, decay_begin=3)
  constant = base.make_optimizer("adam", 1e-2, 1e3, eps=1e-12)
  expected = np.array(_moves(constant, 7)) * [1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0]  # as above
  np.testing.assert_allclose(_moves(optimizer, 7), expected, rtol=1e-5, atol=1e-9)
  for bad in (-1, 2.5, True):
    with pytest.raises(ValueError, match="decay_begin"):
      base.make_optimizer("adam", 1e-2, 1.0, decay_updates=2, decay_begin=bad)
  with pytest.raises(ValueError, match="needs decay_updates > 0"):
    base.make_optimizer("adam", 1e-2, 1.0, decay_begin=3)


def test_rmsprop_is_tf1s_which_impala_used():
  """TF1's RMSPropOptimizer (Espeholt et al.'s): ms_k = decay ms_{k-1} + (1 - decay) g^2 from
  ms_0 = 1, a step of -lr g / sqrt(ms_k + eps). optax's default starts ms at 0: with decay
  0.99 its first step was -lr g / sqrt(0.01 g^2 + eps), up to 10 times the step size."""
  lr, decay, eps = 1e-3, 0.99, 1e-5
  optimizer = base.make_optimizer("rmsprop", lr, 1e9, eps=eps, decay=decay)
  params, g = jnp.zeros(3), jnp.array([1e-3, 0.1, 1.0])
  state, ms = optimizer.init(params), 1.0
  for _ in range(3):
    new, state, _ = base.gradient_step(optimizer, params, state, g)
    ms = decay * ms + (1 - decay) * np.asarray(g, np.float64) ** 2
    np.testing.assert_allclose(new - params, -lr * np.asarray(g) / np.sqrt(ms + eps), rtol=1e-5)
    params = new


def test_impala_rejects_rho_bar_below_c_bar(cartpole_spec):
  with pytest.raises(ValueError, match="rho-bar"):
    make_impala(cartpole_spec, ImpalaConfig(clip_rho_threshold=0.5, clip_c_threshold=1.0))
  with pytest.raises(ValueError, match="gamma"):
    make_impala(cartpole_spec, ImpalaConfig(gamma=1.5))
  with pytest.raises(ValueError, match="torso"):
    make_impala(cartpole_spec, ImpalaConfig(torso="nature_cnn"))
  for epsilon in (0.0, 1.0, 1.5):
    with pytest.raises(ValueError, match="surrogate_clip"):
      make_impala(cartpole_spec, ImpalaConfig(surrogate_clip=epsilon))
  for epsilon in ("0.2", True):  # not a TypeError at the first update
    with pytest.raises(ValueError, match="`surrogate_clip` must be None or a number, got"):
      make_impala(cartpole_spec, ImpalaConfig(surrogate_clip=epsilon))
  for decay in (-1, 0.5):
    with pytest.raises(ValueError, match="learning_rate_decay_updates"):
      make_impala(cartpole_spec, ImpalaConfig(learning_rate_decay_updates=decay))


def test_sql_acting_and_update(cartpole_spec):
  agent = make_sql(cartpole_spec, SqlConfig(epsilon=1.0))
  state = agent.init(jax.random.PRNGKey(0))
  actions, _ = agent.act(state.params, jnp.zeros((4000, 4)), jax.random.PRNGKey(1))
  assert 0.45 < float(jnp.mean(actions)) < 0.55  # uniform under epsilon = 1
  traj = _trajectory(cartpole_spec, agent, state.params, jax.random.PRNGKey(2))
  new_state, metrics = agent.update(state, traj)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  # The target network moved by exactly tau towards the new parameters.
  tau = agent.config.target_update_tau
  expected = jax.tree.map(
      lambda t, p: (1 - tau) * t + tau * p, state.target_params, new_state.params
  )
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
      new_state.target_params,
      expected,
  )


@pytest.mark.parametrize("spec_name", ["cartpole_spec", "pendulum_spec"])
@pytest.mark.parametrize("name", ["impala", "acer", "sql"])
def test_updates_have_no_effects_so_jit_keeps_its_fast_dispatch(name, spec_name, request):
  """The losses' in-program action-range checks (`checkify.debug_check`) would give every
  update an effect, and jit would dispatch it through its slow Python path: the agents
  trace their updates `without_range_checks`."""
  from offpolicy_ac.agents.registry import make_agent

  spec = request.getfixturevalue(spec_name)
  agent = make_agent(name, spec, {})
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  assert jax.make_jaxpr(agent.update)(state, traj).effects == set()


def test_sql_keys_are_split_not_reused(cartpole_spec):
  agent = make_sql(cartpole_spec)
  state = agent.init(jax.random.PRNGKey(0))
  with jax.debug_key_reuse(True):
    agent.act(state.params, jnp.zeros((3, 4)), jax.random.PRNGKey(1))
    make_impala(cartpole_spec).act(
        make_impala(cartpole_spec).init(jax.random.PRNGKey(0)).params,
        jnp.zeros((3, 4)),
        jax.random.PRNGKey(2),
    )


def test_sql_lambda_targets_variant(cartpole_spec):
  agent = make_sql(cartpole_spec, SqlConfig(lambda_=0.8))
  state = agent.init(jax.random.PRNGKey(0))
  traj = _trajectory(cartpole_spec, agent, state.params, jax.random.PRNGKey(2))
  _, metrics = agent.update(state, traj)
  assert np.isfinite(float(metrics["loss"]))


@pytest.mark.parametrize("name", ["impala", "acer", "sql"])
def test_updates_refuse_actions_of_the_other_kind_and_missing_extras(
    name, cartpole_spec, pendulum_spec
):
  """A float action given to a discrete agent would be truncated to an index (ACER's
  was), an integer one to a continuous agent read as a float: both are refused, as are
  behaviour extras missing from the trajectory (a bare KeyError deep in the loss)."""
  from offpolicy_ac import agents

  make = getattr(agents, f"make_{name}")
  for spec, wrong in ((cartpole_spec, jnp.float32), (pendulum_spec, jnp.int32)):
    agent = make(spec)
    state = agent.init(jax.random.PRNGKey(0))
    traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
    with pytest.raises(ValueError, match="actions must have an integer dtype|a floating dtype"):
      agent.update(state, traj._replace(action=traj.action.astype(wrong)))
    if traj.extras:
      with pytest.raises(ValueError, match=r"update needs the behaviour policy in traj.extras"):
        agent.update(state, traj._replace(extras={}))
    # Observations or actions of another task's shapes: named, not a Flax shape error.
    wider = jnp.concatenate([traj.observation, traj.observation[..., :1]], axis=-1)
    with pytest.raises(ValueError, match=r"traj.observation \[T\+1, B, \*\(\d,\)\]"):
      agent.update(state, traj._replace(observation=wider))
    with pytest.raises(ValueError, match=r"traj.action \[T\+1, B, \*\("):
      agent.update(state, traj._replace(action=traj.action[..., None]))
    # Actions or extras of another time or batch length than the step types: named, not a
    # failed reshape (continuous ACER and SQL) or an error about a loss's argument.
    lead = r"with the step types' \[T\+1, B\] = \[7, 3\] leading axes"
    with pytest.raises(ValueError, match=r"traj.action " + lead):
      agent.update(state, traj._replace(action=traj.action[:-1]))
    with pytest.raises(ValueError, match=r"traj.observation " + lead):
      agent.update(state, traj._replace(observation=traj.observation[:, :-1]))
    for key in traj.extras:
      extras = {**traj.extras, key: traj.extras[key][:, :-1]}
      with pytest.raises(ValueError, match=rf"traj.extras\['{key}'\] " + lead):
        agent.update(state, traj._replace(extras=extras))


@pytest.mark.parametrize("name", ["impala", "acer", "sql"])
def test_updates_check_a_numpy_trajectory_on_the_host(name, cartpole_spec):
  """A hand-built batch of NumPy arrays: an out-of-range action (under jit, IMPALA's and
  ACER's parameters became NaN) and a batch-major [B, T+1] layout (silently learned from)
  are refused before the jitted update."""
  from offpolicy_ac import agents

  agent = getattr(agents, f"make_{name}")(cartpole_spec)
  state = agent.init(jax.random.PRNGKey(0))
  traj = jax.tree.map(np.asarray, _trajectory(cartpole_spec, agent, state.params,
                                              jax.random.PRNGKey(2)))  # fmt: skip
  traj = traj._replace(env_id=np.tile(np.arange(3, dtype=np.int32), (7, 1)))  # column b: env b
  _, metrics = agent.update(state, traj)
  assert np.isfinite(metrics["loss"])
  for bad, value in (((2, 1), 2), ((6, 0), -1)):
    action = traj.action.copy()
    action[bad] = value
    message = rf"traj.action in \[0, 2\) \(CartPole-v1's actions\), got {value} at index "
    with pytest.raises(ValueError, match=message + re.escape(str(bad))):
      agent.update(state, traj._replace(action=action))
  # A LAST step's action is never read (Contract 1): -1 there is accepted, and the update
  # is the one device arrays get.
  step_type, action = traj.step_type.copy(), traj.action.copy()
  step_type[3, 0], step_type[4, 0], action[3, 0] = LAST, FIRST, -1
  padded = traj._replace(step_type=step_type, action=action)
  on_host, _ = agent.update(state, padded)
  on_device, _ = agent.update(state, jax.tree.map(jnp.asarray, padded))
  for a, b in zip(jax.tree.leaves(on_host.params), jax.tree.leaves(on_device.params)):
    np.testing.assert_array_equal(a, b)
  swapped = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), traj)
  with pytest.raises(ValueError, match=r"traj.env_id\[1, 0\] = 1 differs .* is it batch-major"):
    agent.update(state, swapped)


@pytest.mark.parametrize(
    "name, spec_name",
    [("impala", "cartpole_spec"), ("acer", "cartpole_spec"), ("sql", "cartpole_spec"),
     ("impala", "pendulum_spec"), ("acer", "pendulum_spec"), ("sql", "pendulum_spec")],
)  # fmt: skip
def test_updates_refuse_values_no_environment_gives_on_the_host(name, spec_name, request):
  """A NumPy batch whose learned-from transitions hold a discount outside [0, 1], a
  non-finite reward, observation or continuous action, an unknown step type or an episode
  that starts after a MID step (a batch-major batch whose env_id is constant) trained
  silently (NaN parameters for a NaN reward). Each is refused by name and index; the same
  values at a transition that leaves a LAST step (masked) are accepted and change
  nothing."""
  from offpolicy_ac import agents

  spec = request.getfixturevalue(spec_name)
  agent = getattr(agents, f"make_{name}")(spec)
  state = agent.init(jax.random.PRNGKey(0))
  traj = jax.tree.map(np.asarray, _trajectory(spec, agent, state.params, jax.random.PRNGKey(2)))
  traj = traj._replace(env_id=np.zeros((7, 3), np.int32))
  step_type = traj.step_type.copy()
  step_type[:, 1], step_type[3, 1], step_type[4, 1] = MID, LAST, FIRST  # leaves step 3: masked
  traj = traj._replace(step_type=step_type)
  reference, _ = agent.update(state, traj)

  def altered(field, index, value):
    x = getattr(traj, field).copy()
    x[index] = value
    return traj._replace(**{field: x})

  learned = "at the transitions it learns from"
  refused = [
      ("discount", (2, 1), 1.5, rf"traj.discount in \[0, 1\] .* {learned} .*\[2, 1\] = 1.5"),
      ("discount", (5, 2), -0.5, r"traj.discount\[5, 2\] = -0.5"),
      ("discount", (1, 0), np.nan, r"traj.discount\[1, 0\] = nan"),
      ("reward", (6, 2), np.inf, rf"finite rewards {learned} .*traj.reward\[6, 2\] = inf"),
      ("observation", (2, 0), np.nan, r"finite observations .*traj.observation\[2, 0\]"),
      ("observation", (6, 0), np.nan, r"finite observations .*traj.observation\[6, 0\]"),
      ("step_type", (2, 2), 7, r"FIRST \(0\), MID \(1\) or LAST \(2\), got 7 at index \(2, 2\)"),
      (
          "step_type",
          (6, 1),
          FIRST,
          r"traj.step_type\[6, 1\] FIRST after MID at \[5, 1\].*batch-major",
      ),
  ]
  if not spec.is_discrete:
    refused.append(("action", (0, 2), np.nan, r"finite actions .*traj.action\[0, 2\]"))
  for field, index, value, message in refused:
    with pytest.raises(ValueError, match=message):
      agent.update(state, altered(field, index, value))
  # The transition from LAST step 3 into FIRST step 4 is masked: anything there is ignored,
  # on the host and on a device. A NaN continuous action at LAST step 3 made continuous
  # ACER's and SQL's parameters NaN (their Q(s, a) is evaluated at every step's action).
  unread = [("discount", (4, 1), np.nan), ("discount", (4, 1), 3.0), ("reward", (4, 1), np.nan)]
  if not spec.is_discrete:
    unread += [("action", (3, 1), np.nan), ("action", (3, 1), np.inf)]
  for field, index, value in unread:
    for place in (np.asarray, jnp.asarray):
      masked, _ = agent.update(state, jax.tree.map(place, altered(field, index, value)))
      for a, b in zip(jax.tree.leaves(masked.params), jax.tree.leaves(reference.params)):
        np.testing.assert_array_equal(a, b)
  # A batch-major batch whose env_id tells nothing: its episode starts give it away.
  swapped = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), traj)
  with pytest.raises(ValueError, match=r"FIRST after .*Is the trajectory batch-major"):
    agent.update(state, swapped)


@pytest.mark.parametrize("name", ["impala", "acer", "sql"])
def test_swapped_arguments_get_a_type_error_that_says_which(name, cartpole_spec):
  """act(state, ...) and update(state.params, traj) failed on a missing attribute deep in
  Flax or the update."""
  from offpolicy_ac import agents

  agent = getattr(agents, f"make_{name}")(cartpole_spec)
  state = agent.init(jax.random.PRNGKey(0))
  obs, key = jnp.zeros((3, 4)), jax.random.PRNGKey(1)
  with pytest.raises(TypeError, match=r"act takes the network parameters, state.params"):
    agent.act(state, obs, key)
  with pytest.raises(TypeError, match=r"greedy_act takes the network parameters"):
    jax.jit(agent.greedy_act)(state, obs)
  traj = _trajectory(cartpole_spec, agent, state.params, jax.random.PRNGKey(2))
  with pytest.raises(TypeError, match=r"update takes the AgentState .*got dict"):
    agent.update(state.params, traj)
  with pytest.raises(TypeError, match=r"update takes a time-major envs.Trajectory .*got dict"):
    agent.update(state, traj._asdict())


@pytest.mark.parametrize("name", ["impala", "acer", "sql"])
@pytest.mark.parametrize("spec_name", ["cartpole_spec", "pendulum_spec"])
def test_a_seed_or_a_batch_of_keys_for_a_key_is_refused_naming_the_agent(name, spec_name, request):
  """init(0) and act(params, obs, 0) got JAX's "invalid PRNG key data", which names no
  argument; a batch of keys is named as one, jitted or not."""
  from offpolicy_ac import agents

  spec = request.getfixturevalue(spec_name)
  agent = getattr(agents, f"make_{name}")(spec)
  seed = r"'s init: key must be a PRNG key \(jax.random.key\(seed\) .*got 0"
  with pytest.raises(ValueError, match=seed):
    agent.init(0)
  keys = jax.random.split(jax.random.key(0), 3)
  with pytest.raises(ValueError, match=r"'s init: key must be one PRNG key, got a batch of 3"):
    jax.jit(agent.init)(keys)
  state = agent.init(jax.random.key(0))  # typed and raw keys are both keys
  params = agent.init(jax.random.PRNGKey(0)).params
  obs = jnp.zeros((3, *spec.observation_shape))
  for act in (agent.act, jax.jit(agent.act)):
    with pytest.raises(
        ValueError, match=r"'s act: key must be a PRNG key .*got (0|a traced int32\[\])"
    ):
      act(state.params, obs, 0)
    with pytest.raises(ValueError, match=r"'s act: key must be one PRNG key, got a batch of 3"):
      act(params, obs, jax.random.split(jax.random.PRNGKey(1), 3))
    act(params, obs, jax.random.key(1))


@pytest.mark.parametrize("name", ["impala", "acer", "sql"])
def test_parameters_of_other_networks_are_refused_naming_the_agent(name, cartpole_spec):
  """Parameters of another structure or another task's shapes: Flax's own error named a
  module path ("/torso/Dense_0") and neither the agent nor the argument."""
  from offpolicy_ac import agents

  make = getattr(agents, f"make_{name}")
  agent = make(cartpole_spec)
  state = agent.init(jax.random.PRNGKey(0))
  other_task = make(envs.spec("Acrobot-v1", num_envs=3)).init(jax.random.PRNGKey(0)).params
  obs, key = jnp.zeros((3, 4)), jax.random.PRNGKey(1)
  misfit = r"'s {} got parameters that are not its networks' .*: pass the params of this"
  for params in (state.params["params"], other_task):
    with pytest.raises(ValueError, match=misfit.format("act")):
      agent.act(params, obs, key)
    with pytest.raises(ValueError, match=misfit.format("greedy_act")):
      jax.jit(agent.greedy_act)(params, obs)
  traj = _trajectory(cartpole_spec, agent, state.params, jax.random.PRNGKey(2))
  with pytest.raises(ValueError, match=misfit.format("update")):
    agent.update(state._replace(params=other_task), traj)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_actions=0), r"num_actions an int >= 1"),
        (dict(num_actions=None), r"num_actions an int >= 1"),
        (dict(action_shape=(2,)), r"action_shape \(\), got 2 and \(2,\)"),
        (dict(observation_shape=(0,)), r"observation_shape is not a tuple of positive ints"),
        (dict(observation_shape=[4]), r"observation_shape is not a tuple"),
        (dict(batch_size=3), r"batch_size 3 exceeds num_envs 2"),
        (dict(is_discrete=False, num_actions=None, action_shape=(0,)), r"action_shape of positive"),
        (dict(is_discrete=False, num_actions=None, action_shape=(2,), action_low=(-1.0,),
              action_high=(1.0, 1.0)), r"action_low must hold one number per action dimension"),
        (dict(is_discrete=False, num_actions=None, action_shape=(1,), action_low=(2.0,),
              action_high=(-2.0,)), r"action_low\[0\] = 2.0 exceeds action_high\[0\] = -2.0"),
        (dict(is_discrete=False, num_actions=None, action_shape=(1,), action_low=None,
              action_high=None), r"action_low must hold one number"),
    ],
)  # fmt: skip
def test_a_hand_made_spec_that_no_task_has_is_refused_by_its_field(change, message, cartpole_spec):
  """An empty action set, an empty or inverted action box, or bounds of another size failed
  deep in a network (an empty argmax, a division by zero, a failed reshape), or sampled
  from an empty box."""
  from offpolicy_ac import agents

  spec = cartpole_spec._replace(**change)
  for factory in (agents.make_impala, agents.make_sql):
    with pytest.raises(ValueError, match=r"got an EnvSpec for 'CartPole-v1' whose .*" + message):
      factory(spec)


def test_impala_continuous_actions_keep_the_action_shape(pendulum_spec):
  """Actions [B, *action_shape], as the other agents' and the Trajectory contract's."""
  spec = pendulum_spec._replace(action_shape=(2, 2), action_low=(-1.0,) * 4, action_high=(1.0,) * 4)
  agent = make_impala(spec)
  state = agent.init(jax.random.PRNGKey(0))
  obs = jnp.zeros((5, 3))
  action, extras = agent.act(state.params, obs, jax.random.PRNGKey(1))
  assert action.shape == (5, 2, 2) and extras["log_prob"].shape == (5,)
  assert agent.greedy_act(state.params, obs).shape == (5, 2, 2)
  traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
  assert np.isfinite(float(agent.update(state, traj)[1]["loss"]))


def test_discrete_agents_refuse_continuous_tasks(pendulum_spec):
  with pytest.raises(ValueError, match="discrete action space"):
    make_sql_discrete(pendulum_spec)


def test_sql_config_validation(cartpole_spec):
  for bad in (dict(alpha=0.0), dict(epsilon=2.0), dict(n_step=0), dict(lambda_=-0.1)):
    with pytest.raises(ValueError):
      make_sql(cartpole_spec, dataclasses.replace(SqlConfig(), **bad))
  # n_step sets the n-step targets, which lambda_ > 0 replaces: both given are refused;
  # 1-step targets (a preset's) or the default n_step are no conflict.
  with pytest.raises(ValueError, match="n_step=2 with lambda_=0.5"):
    make_sql(cartpole_spec, SqlConfig(n_step=2, lambda_=0.5))
  for n_step in (1, SqlConfig.n_step):
    make_sql(cartpole_spec, SqlConfig(n_step=n_step, lambda_=0.5))
  # The sampler's and the sampled soft value's settings: continuous SQL's only, refused for
  # a run being configured; a run rebuilt from its config.json builds as it trained.
  unused = SqlConfig(num_particles=4, svgd_update_ratio=0.25)
  with pytest.raises(ValueError, match="num_particles, svgd_update_ratio: settings of the "
                                       "continuous agent's sampler"):  # fmt: skip
    base.check_settings_used(unused, cartpole_spec)
  make_sql(cartpole_spec, unused)
  assert SqlConfig(lambda_=0.5).ignored_settings().keys() == {"n_step"}
  assert SqlConfig().ignored_settings() == {}


def test_impala_refuses_a_policy_gradient_rho_clip_under_the_clipped_surrogate(cartpole_spec):
  """The clipped surrogate clips the ratio itself: clip_pg_rho_threshold has no effect."""
  config = ImpalaConfig(surrogate_clip=0.2, clip_pg_rho_threshold=0.5)
  with pytest.raises(ValueError, match="clip_pg_rho_threshold: the policy gradient's rho clip"):
    base.check_settings_used(config, cartpole_spec)
  base.check_settings_used(ImpalaConfig(surrogate_clip=0.2), cartpole_spec)
  base.check_settings_used(ImpalaConfig(clip_pg_rho_threshold=0.5), cartpole_spec)
  make_impala(cartpole_spec, config)  # a run rebuilt from its config.json


@pytest.mark.parametrize(
    "kind,features", [("nature_cnn", 512), ("impala_resnet", 256), ("small_cnn", 128)]
)
def test_pixel_torsos_map_frames_to_features(kind, features):
  from offpolicy_ac import networks

  torso = networks.make_torso(kind, (4, 84, 84))
  frames = jax.random.randint(jax.random.PRNGKey(0), (3, 4, 84, 84), 0, 256).astype(jnp.uint8)
  # Jitted: op by op, XLA:CPU compiles each of the convolutions' primitives on its own
  # (about a minute on a loaded 2-core machine).
  params = jax.jit(torso.init)(jax.random.PRNGKey(1), frames)
  # Full float32 products: on a GPU the default (TF32) rounds differently per batch size.
  with jax.default_matmul_precision("highest"):
    out = jax.jit(torso.apply)(params, frames)
    one = jax.jit(torso.apply)(params, frames[1:2])[0]
  assert out.shape == (3, features) and bool(jnp.all(jnp.isfinite(out)))
  # Each frame is processed on its own: a batch of one gives the same features.
  np.testing.assert_allclose(one, out[1], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="frames"):
    networks.make_torso(kind, (4,))
  # Channels last (CarRacing's 96 x 96 x 3): refused by name, not a ZeroDivisionError at init.
  with pytest.raises(ValueError, match=r"shape \(96, 96, 3\) look like \[H, W, C\]"):
    networks.make_torso(kind, (96, 96, 3))
  if kind == "nature_cnn":  # frames too narrow for its 8x8, 4x4 and 3x3 convolutions
    with pytest.raises(ValueError, match=r"does not fit frames of shape \(4, 84, 8\)"):
      networks.make_torso(kind, (4, 84, 8))
  # A frame without its batch axis is refused by name, not misread as a batch.
  with pytest.raises(
      ValueError, match=r"takes a batch of frames \[B, C, H, W\], got shape \(4, 84, 84\)"
  ):
    torso.apply(params, frames[0])
  # Called directly on channel-last frames, or on frames too small for its convolutions:
  # refused by name, not a ZeroDivisionError in the dense layer's initialisation.
  with pytest.raises(ValueError, match=r"looks like \[B, H, W, C\]"):
    type(torso)().init(jax.random.PRNGKey(1), jnp.zeros((2, 84, 84, 4), jnp.uint8))
  if kind != "impala_resnet":  # its SAME convolutions take any frame
    with pytest.raises(ValueError, match="leave no feature"):
      type(torso)().init(jax.random.PRNGKey(1), jnp.zeros((2, 4, 20, 20), jnp.uint8))


@pytest.mark.parametrize(
    "kind,shape",
    [("mlp", (3,)), ("nature_cnn", (4, 84, 84)), ("impala_resnet", (4, 84, 84)),
     ("small_cnn", (4, 84, 84)), ("minatar_cnn", (4, 10, 10))],
)  # fmt: skip
def test_every_torso_maps_an_empty_batch_to_no_rows(kind, shape):
  """B = 0 (acting for no environment): [0, features], not reshape's ZeroDivisionError."""
  from offpolicy_ac import networks

  torso = networks.make_torso(kind, shape)
  params = torso.init(jax.random.PRNGKey(1), jnp.zeros((2, *shape)))
  features = torso.apply(params, jnp.zeros((2, *shape))).shape[-1]
  assert torso.apply(params, jnp.zeros((0, *shape))).shape == (0, features)


@pytest.mark.parametrize(
    "kind,shape",
    [("nature_cnn", (4, 84, 84)), ("impala_resnet", (4, 84, 84)), ("small_cnn", (4, 84, 84)),
     ("minatar_cnn", (4, 10, 10)), ("auto", (2, 16, 16))],
)  # fmt: skip
def test_frame_torsos_scale_8_bit_frames_only(kind, shape):
  """uint8 frames are scaled to [0, 1]; float frames (MinAtar's 0/1 grids, normalised
  observations) are taken as they are: 8-bit frames of 0 and 255 give the features of the
  float grid of 0 and 1 (also in the MinAtar network, which "auto" gives small frames)."""
  from offpolicy_ac import networks

  torso = networks.make_torso(kind, shape)
  grid = jax.random.bernoulli(jax.random.PRNGKey(0), 0.3, (2, *shape))
  params = torso.init(jax.random.PRNGKey(1), grid.astype(jnp.float32))
  with jax.default_matmul_precision("highest"):
    as_floats = torso.apply(params, grid.astype(jnp.float32))
    as_bytes = torso.apply(params, grid.astype(jnp.uint8) * 255)
  assert float(jnp.std(as_floats)) > 0.05  # the grid reached the features unscaled
  np.testing.assert_allclose(as_bytes, as_floats, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("torso", ["nature_cnn", "small_cnn", "minatar_cnn", "registered"])
def test_agents_build_on_frames_with_jax_rbg_keys(torso):
  """With `jax_default_prng_impl="rbg"` (JAX's faster generator on accelerators, raw keys of
  4 words) the pixel torsos' and registered torsos' shape checks build and the agents act."""
  import flax.linen as nn

  from offpolicy_ac import networks

  class Flat(nn.Module):

    @nn.compact
    def __call__(self, x):
      return nn.Dense(5)(x.reshape(x.shape[0], -1).astype(jnp.float32))

  if torso == "registered":
    networks.register_torso("flat_for_rbg_test", lambda shape, hidden: Flat())
    torso = "flat_for_rbg_test"
  shape = (4, 10, 10) if torso == "minatar_cnn" else (4, 84, 84)
  spec = envs.EnvSpec("Frames", shape, "uint8", True, 3, (), "int32", None, None, 1, 1)
  networks.torsos._check_frames_fit.cache_clear()  # pylint: disable=protected-access
  try:
    with jax.default_prng_impl("rbg"):
      assert jax.random.PRNGKey(0).shape == (4,)
      for agent in (make_impala(spec, ImpalaConfig(torso=torso)),
                    make_sql(spec, SqlConfig(torso=torso))):  # fmt: skip
        state = agent.init(jax.random.PRNGKey(0))
        obs = jnp.zeros((2, *shape), jnp.uint8)
        action, _ = agent.act(state.params, obs, jax.random.PRNGKey(1))
        assert action.shape == (2,)
  finally:
    networks.torsos._REGISTERED.pop("flat_for_rbg_test", None)  # pylint: disable=protected-access


@pytest.mark.parametrize("algo", ["impala", "acer", "sql"])
def test_mlp_sizes_on_a_pixel_torso_are_refused(algo):
  """hidden_sizes size the mlp torso; a built-in pixel torso, chosen or picked by "auto", has
  none: sizes off the default would be a flag without effect."""
  from offpolicy_ac import agents
  from offpolicy_ac import networks

  make, config = {"impala": (agents.make_impala, agents.ImpalaConfig),
                  "acer": (agents.make_acer, agents.AcerConfig),
                  "sql": (agents.make_sql, agents.SqlConfig)}[algo]  # fmt: skip
  minatar = envs.EnvSpec("Frames", (4, 10, 10), "uint8", True, 3, (), "int32", None, None, 1, 1)
  atari = minatar._replace(observation_shape=(4, 84, 84))
  for spec, torso, kind in ((minatar, "auto", "minatar_cnn"), (atari, "small_cnn", "small_cnn")):
    sized = config(torso=torso, hidden_sizes=(32,))
    with pytest.raises(ValueError, match=f"hidden_sizes: the {kind} torso has no layers"):
      base.check_settings_used(sized, spec)
    make(spec, sized)  # a run rebuilt from its config.json builds as it trained
    base.check_settings_used(config(torso=torso), spec)  # the default sizes: no flag given
  base.check_settings_used(config(torso="mlp", hidden_sizes=(32,)), minatar)  # flattened frames
  networks.register_torso("sized_for_pixel_test", lambda shape, hidden: networks.MLPTorso(hidden))
  try:  # a registered torso takes the sizes
    base.check_settings_used(config(torso="sized_for_pixel_test", hidden_sizes=(32,)), minatar)
  finally:
    networks.torsos._REGISTERED.pop("sized_for_pixel_test", None)  # pylint: disable=protected-access


@pytest.mark.parametrize("algo", ["impala", "acer", "sql"])
@pytest.mark.parametrize("discrete", [True, False])
def test_agents_keep_float32_and_update_on_their_own_actions_with_jax_x64(algo, discrete):
  """With `jax_enable_x64` every parameter stays float32, `act` returns the spec's dtypes,
  and an update on the agent's own actions and extras (a continuous agent's Gaussian
  log-probabilities) is finite and computes what it computes without x64: the same actions
  and metrics (continuous SQL drew its noise in float64, another random stream), float64
  rewards and discounts included."""
  from offpolicy_ac import agents

  if discrete:
    spec = envs.EnvSpec("Discrete", (4,), "float32", True, 2, (), "int32", None, None, 1, 1)
  else:
    spec = envs.EnvSpec("Box", (3,), "float32", False, None, (1,), "float32", (-2.0,), (2.0,),
                        1, 1)  # fmt: skip
  make, config = {"impala": (agents.make_impala, agents.ImpalaConfig),
                  "acer": (agents.make_acer, agents.AcerConfig),
                  "sql": (agents.make_sql, agents.SqlConfig)}[algo]  # fmt: skip
  float32 = lambda tree: {str(x.dtype) for x in jax.tree.leaves(tree)} == {"float32"}
  with jax.enable_x64(True):
    agent = make(spec, config(hidden_sizes=(8,)))
    state = agent.init(jax.random.PRNGKey(0))
    assert float32(state.params)
    obs = jnp.zeros((5, *spec.observation_shape), jnp.float32)
    action, extras = agent.act(state.params, obs, jax.random.PRNGKey(1))
    assert action.dtype == spec.action_dtype and float32(extras or jnp.float32(0))
    assert agent.greedy_act(state.params, obs).dtype == spec.action_dtype
    traj = _trajectory(spec, agent, state.params, jax.random.PRNGKey(2))
    traj = traj._replace(observation=traj.observation.astype(jnp.float32))
    new_state, metrics = agent.update(state, traj)
    assert float32(new_state.params)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    traj = jax.tree.map(np.asarray, traj)
    # NumPy's float64 rewards and discounts stay float64 here (a TypeError in the losses).
    wide = traj._replace(reward=traj.reward.astype(np.float64),
                         discount=traj.discount.astype(np.float64))  # fmt: skip
    assert agent.update(state, wide)[1] == metrics
  agent = make(spec, config(hidden_sizes=(8,)))  # x64 off
  state = agent.init(jax.random.PRNGKey(0))
  np.testing.assert_array_equal(agent.act(state.params, obs, jax.random.PRNGKey(1))[0], action)
  _, metrics32 = agent.update(state, traj)
  for name, value in metrics.items():
    np.testing.assert_allclose(float(value), float(metrics32[name]), rtol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    "dtype,shape",
    [(jnp.uint8, (3, 4, 84, 84)), (jnp.uint8, (2, 2, 10, 7)), (jnp.float32, (2, 3, 9, 12))],
)
def test_small_cnn_pooling_is_flax_max_pooling(dtype, shape):
  import flax.linen as nn

  from offpolicy_ac.networks.torsos import _max_pool_to_nhwc
  from offpolicy_ac.networks.torsos import _to_nhwc

  frames = jax.random.randint(jax.random.PRNGKey(3), shape, 0, 256).astype(dtype)
  expected = nn.max_pool(_to_nhwc(frames), (4, 4), strides=(4, 4))
  got = jax.jit(_max_pool_to_nhwc, static_argnums=1)(frames, 4)
  assert got.shape == expected.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_small_cnn_pooling_keeps_a_two_pixel_ball_at_full_contrast():
  """Pong's ball (2 x 2 pixels of value 236 on a background of 87) lifts its pooled cell by
  (236 - 87) / 255 = 0.58, not the quarter of that a block mean would give."""
  from offpolicy_ac.networks.torsos import _max_pool_to_nhwc

  background = jnp.full((1, 4, 84, 84), 87, jnp.uint8)
  with_ball = background.at[:, :, 65:67, 81:83].set(236)
  lift = _max_pool_to_nhwc(with_ball, 4) - _max_pool_to_nhwc(background, 4)
  assert lift.shape == (1, 21, 21, 4)
  np.testing.assert_allclose(lift[0, 16, 20], (236 - 87) / 255, rtol=1e-6)
  assert float(jnp.abs(lift).sum()) == pytest.approx(4 * (236 - 87) / 255, rel=1e-5)


def test_minatar_cnn_is_the_3x3_convolution_then_dense():
  """MinAtarCNN's patch product is `lax.conv` (3x3, stride 1, VALID) with the same kernel
  reshaped; `auto` picks it for 10 x 10 grids and the Nature CNN for 84 x 84 frames."""
  import flax.linen as nn

  from offpolicy_ac import networks

  grids = (jax.random.uniform(jax.random.PRNGKey(0), (3, 4, 10, 10)) < 0.3).astype(jnp.float32)
  torso = networks.make_torso("auto", (4, 10, 10))
  assert isinstance(torso, networks.torsos.MinAtarCNN)
  assert isinstance(networks.make_torso("auto", (4, 84, 84)), networks.torsos.NatureCNN)
  params = torso.init(jax.random.PRNGKey(1), grids)
  conv = params["params"]["conv"]
  kernel = conv["kernel"].reshape(3, 3, 4, 16)  # patches are ordered (row, column, channel)
  x = jnp.transpose(grids, (0, 2, 3, 1))
  dense = params["params"]["Dense_0"]
  # Full float32 products on both sides (a GPU's default, TF32, rounds each differently).
  with jax.default_matmul_precision("highest"):
    conv_out = nn.relu(
        jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        + conv["bias"][None, None, None]
    )  # fmt: skip
    expected = nn.relu(conv_out.reshape(3, -1) @ dense["kernel"] + dense["bias"][None])
    got = torso.apply(params, grids)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # gymnax's own MinAtar grids are [H, W, C]: with more than 4 channels too, refused by name.
  with pytest.raises(ValueError, match=r"\(10, 10, 7\) look like \[H, W, C\]"):
    networks.make_torso("auto", (10, 10, 7))
  with pytest.raises(ValueError, match="leaves no feature"):
    torso.init(jax.random.PRNGKey(1), grids[:, :, :2, :2])


def test_mlp_torso_refuses_an_observation_without_its_batch_axis_or_of_another_shape(
    cartpole_spec,
):
  """make_torso's MLP knows one observation's shape: [D] is refused, not read as D
  observations of one feature, and so is another task's [B, D'] (a Flax parameter shape
  error otherwise, from an agent's act too); scalar observations take a batch [B]."""
  from offpolicy_ac import networks

  torso = networks.make_torso("mlp", (4,))
  params = torso.init(jax.random.PRNGKey(0), jnp.zeros((3, 4)))
  assert torso.apply(params, jnp.ones((3, 4))).shape == (3, 64)
  with pytest.raises(ValueError, match=r"\[B, \*\(4,\)\], got shape \(4,\): add the batch"):
    torso.apply(params, jnp.ones(4))
  agent = make_impala(cartpole_spec)
  state = agent.init(jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match=r"observations \[B, \*\(4,\)\], got shape \(3, 5\)(\n|\Z)"):
    agent.act(state.params, jnp.ones((3, 5)), jax.random.PRNGKey(1))
  scalar = networks.make_torso("mlp", ())
  assert scalar.apply(scalar.init(jax.random.PRNGKey(0), jnp.zeros(3)), jnp.ones(3)).shape == (
      3,
      64,
  )


def test_impala_atari_preset_learns_from_small_advantages():
  """Regression: the Atari preset once used RMSProp(eps=0.01) as in the paper, but optax
  puts eps inside the square root and our losses are means over [T, B], not sums, so
  with Pong's small advantages its steps were ~1e-2 of the gradient: a 6.8M-step Pong run
  on a GPU kept the uniform policy (entropy ln 6). Here a pixel bandit pays 0.01 for
  action 2 (an advantage of Pong's size); 60 on-policy updates of the preset must raise
  that action's probability clearly, and far more than the old setting does."""
  preset = presets.impala.PRESETS["atari"]
  env = envs.make_atari(preset.train.env.env_id, 1, 0)
  spec = env.spec
  env.close()
  t, b = 5, 4
  frames = jax.random.randint(
      jax.random.PRNGKey(0), (t + 1, b) + tuple(spec.observation_shape), 0, 256
  ).astype(jnp.uint8)
  step_type = np.full((t + 1, b), MID, np.int32)
  step_type[0] = FIRST

  def gain_of_rewarded_action(config, updates=60):
    agent = make_impala(spec, config)
    state = agent.init(jax.random.PRNGKey(1))
    act, update = jax.jit(agent.act), jax.jit(agent.update)
    flat = frames.reshape((-1,) + frames.shape[2:])
    key = jax.random.PRNGKey(2)
    probability = lambda params: float(
        jnp.mean(jax.nn.softmax(act(params, flat, key)[1]["logits"])[:, 2])
    )
    start = probability(state.params)
    for _ in range(updates):
      key, act_key = jax.random.split(key)
      action, extras = act(state.params, flat, act_key)
      action = action.reshape(t + 1, b)
      paid = 0.01 * np.asarray(action == 2, np.float32)  # arrives one step later
      reward = np.concatenate([np.zeros((1, b), np.float32), paid[:-1]])
      traj = Trajectory(
          jnp.asarray(step_type),
          jnp.asarray(reward),
          jnp.ones((t + 1, b)),
          frames,
          jnp.zeros((t + 1, b), jnp.int32),
          action,
          jax.tree.map(lambda x: x.reshape((t + 1, b) + x.shape[1:]), extras),
      )
      state, _ = update(state, traj)
    return probability(state.params) - start

  preset_gain = gain_of_rewarded_action(preset.agent)
  old_gain = gain_of_rewarded_action(
      dataclasses.replace(preset.agent, optimizer="rmsprop", optimizer_eps=0.01, max_grad_norm=40.0)
  )
  assert preset_gain > 0.01, preset_gain
  assert preset_gain > 10 * abs(old_gain), (preset_gain, old_gain)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("num_demo", [4, 7])  # half and half (the paper's); more demos
def test_sqil_batch_fn_joins_agent_and_demonstration_windows(jit, num_demo):
  from offpolicy_ac.agents import make_sqil_batch_fn

  seq_len, num_seq, length, b = 6, 5, 3, 4
  obs = np.arange(seq_len * num_seq * 2, dtype=np.float32).reshape(seq_len, num_seq, 2)
  step_type = np.full((seq_len, num_seq), MID, np.int32)
  step_type[0] = FIRST
  demos = Trajectory(
      step_type,
      np.full((seq_len, num_seq), 7.0, np.float32),
      np.ones((seq_len, num_seq), np.float32),
      obs,
      np.tile(np.arange(num_seq, dtype=np.int32), (seq_len, 1)),
      (obs[..., 0] % 2).astype(np.int32),
      {},
  )
  agent_batch = Trajectory(
      jnp.full((length, b), MID, jnp.int32),
      jnp.full((length, b), 3.0),
      jnp.ones((length, b)),
      -jnp.ones((length, b, 2)),
      jnp.arange(b, dtype=jnp.int32)[None].repeat(length, 0),
      jnp.zeros((length, b), jnp.int32),
      {"logits": jnp.ones((length, b, 2))},
  )
  batch_fn = make_sqil_batch_fn(demos, batch_size=num_demo, length=length)
  fn = jax.jit(batch_fn) if jit else batch_fn
  out = fn(agent_batch, jax.random.PRNGKey(0))
  total = b + num_demo
  assert out.observation.shape == (length, total, 2)
  assert out.extras["logits"].shape == (length, total, 2)
  for leaf in jax.tree.leaves(out):
    assert leaf.shape[:2] == (length, total)
  np.testing.assert_array_equal(out.reward[:, :b], 0.0)  # agent half relabelled 0
  np.testing.assert_array_equal(out.observation[:, :b], agent_batch.observation)
  np.testing.assert_array_equal(out.extras["logits"][:, :b], 1.0)  # the agent's, kept
  np.testing.assert_array_equal(out.extras["logits"][:, b:], 0.0)  # demonstrations have none
  np.testing.assert_array_equal(out.reward[1:, b:], 1.0)  # demo half relabelled 1 (not at FIRST)
  np.testing.assert_array_equal(out.env_id[:, :b], agent_batch.env_id)
  np.testing.assert_array_equal(out.env_id[:, b:], -1)
  for j in range(b, total):  # each demo column is a contiguous window of one sequence
    first = np.asarray(out.observation[0, j, 0])
    t0, s = np.argwhere(obs[..., 0] == first)[0]
    np.testing.assert_array_equal(out.observation[:, j], obs[t0 : t0 + length, s])
    np.testing.assert_array_equal(out.action[:, j], (obs[t0 : t0 + length, s, 0] % 2))
  # Float demonstration actions for a discrete agent would be truncated to indices.
  float_demos = demos._replace(action=demos.action.astype(np.float32) + 0.5)
  float_fn = make_sqil_batch_fn(float_demos, batch_size=num_demo, length=length)
  with pytest.raises(ValueError, match="demonstrations' actions are float32 and the agent's int32"):
    (jax.jit(float_fn) if jit else float_fn)(agent_batch, jax.random.PRNGKey(0))
  # Observations of another task, or agent windows of another length: named, not a
  # concatenation error.
  with pytest.raises(ValueError, match=r"observation windows are \[3, \d, 2\] .* \[3, 4, 3\]"):
    fn(agent_batch._replace(observation=-jnp.ones((length, b, 3))), jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match=r"the agent's \[2, 4, 2\]"):
    fn(jax.tree.map(lambda x: x[:2], agent_batch), jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="fewer than"):
    make_sqil_batch_fn(demos, batch_size=b, length=seq_len + 1)


def test_factories_refuse_another_agents_config_and_settings_of_the_wrong_type(
    cartpole_spec, pendulum_spec
):
  from offpolicy_ac.agents import AcerConfig
  from offpolicy_ac.agents import make_acer

  for factory, spec, config, message in [
      (make_acer, cartpole_spec, ImpalaConfig(), "make_acer_discrete takes AcerConfig, got Imp"),
      (make_acer, pendulum_spec, SqlConfig(), "make_acer_continuous takes AcerConfig, got Sql"),
      (make_impala, cartpole_spec, AcerConfig(), "make_impala takes ImpalaConfig, got AcerConfig"),
      (make_sql, cartpole_spec, ImpalaConfig(), "make_sql_discrete takes SqlConfig, got Impala"),
      (make_sql, pendulum_spec, AcerConfig(), "make_sql_continuous takes SqlConfig, got Acer"),
      (make_impala, cartpole_spec, ImpalaConfig(learning_rate="3e-3"),
       "learning_rate must be a number, got '3e-3'"),
      (make_impala, cartpole_spec, ImpalaConfig(gamma=True), "gamma must be a number, got True"),
      (make_sql, cartpole_spec, SqlConfig(alpha="0.1"), "alpha must be a number, got '0.1'"),
      (make_impala, cartpole_spec, ImpalaConfig(hidden_sizes=64),
       "hidden_sizes must be positive ints, got 64"),
  ]:  # fmt: skip
    with pytest.raises(ValueError, match=message):
      factory(spec, config)
  make_impala(cartpole_spec, ImpalaConfig(learning_rate=np.float32(1e-3), gamma=jnp.float32(0.9)))
