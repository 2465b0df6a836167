"""Soft Q-learning (Haarnoja et al. 2017, arXiv:1702.08165): the agent for discrete actions.

Q-network with a target network (Polyak averaging), Boltzmann acting with
temperature alpha mixed with epsilon-greedy, and soft n-step or lambda targets
bootstrapped from V = alpha * logsumexp(Q_target / alpha), learned from
replayed sequences (windows may cross episode junctions: the mask cuts them).
`make_sql` picks this agent or the continuous one (`agents/sql_continuous.py`: Q(s, a),
importance-sampled soft values and an SVGD-trained sampler) from the action space. Both
take an `SqlConfig` (`agents/sql_config.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from offpolicy_ac import losses
from offpolicy_ac import networks
from offpolicy_ac.agents import base
from offpolicy_ac.agents.sql_config import SqlConfig
from offpolicy_ac.agents.sql_config import make_sql_optimizer
from offpolicy_ac.agents.sql_continuous import make_sql_continuous

__all__ = ["SqlConfig", "make_sql", "make_sql_discrete"]


def make_sql(spec, config: SqlConfig = SqlConfig(), *, name: str = "sql") -> base.Agent:
  """Builds SQL for an environment spec: discrete or continuous by `spec.is_discrete`."""
  base.check_spec(spec, f"make_{name}")
  if spec.is_discrete:
    return make_sql_discrete(spec, config, name=name)
  return make_sql_continuous(spec, config, name=name)


def make_sql_discrete(spec, config: SqlConfig = SqlConfig(), *, name: str = "sql") -> base.Agent:
  """Builds the SQL agent for discrete actions."""
  base.check_discrete(spec, name.upper())
  base.check_config(config, SqlConfig, "make_sql_discrete")
  if config.num_q_networks != 1:
    raise ValueError(
        f"num_q_networks={config.num_q_networks}: several Q networks (clipped double Q) are "
        f"implemented for continuous actions only; discrete {name.upper()} takes 1"
    )
  torso = networks.make_torso(config.torso, spec.observation_shape, config.hidden_sizes)
  net = networks.QNetwork(torso, spec.num_actions)
  optimizer = make_sql_optimizer(config)
  obs_dtype = jnp.dtype(spec.observation_dtype)
  num_actions = spec.num_actions

  @base.takes_key(f"discrete {name.upper()}")
  def init(key):
    init_key, key = jax.random.split(key)
    params = net.init(init_key, jnp.zeros((1,) + tuple(spec.observation_shape), obs_dtype))
    return base.AgentState(params, params, optimizer.init(params), key, jnp.zeros((), jnp.int32))

  @base.takes_params(f"discrete {name.upper()}")
  def act(params, obs, key):
    q = net.apply(params, obs)
    boltzmann_key, explore_key, uniform_key = jax.random.split(key, 3)
    action = jax.random.categorical(boltzmann_key, q / config.alpha)
    explore = jax.random.uniform(explore_key, action.shape, jnp.float32) < config.epsilon
    uniform = jax.random.randint(uniform_key, action.shape, 0, num_actions)
    return jnp.where(explore, uniform, action).astype(jnp.int32), {}

  @base.takes_params(f"discrete {name.upper()}")
  def greedy_act(params, obs):
    return jnp.argmax(net.apply(params, obs), axis=-1).astype(jnp.int32)

  def loss_fn(params, target_params, batch):
    base.check_trajectory(batch, spec, f"discrete {name.upper()}")
    li = base.float32_loss_inputs(batch, config.gamma)
    r_t = li.r_t
    q = base.apply_batched(net.apply, params, batch.observation)
    q_target = base.apply_batched(net.apply, target_params, batch.observation[1:])
    a_tm1 = batch.action[:-1]
    if config.lambda_ > 0:
      targets = losses.soft_q_targets(
          r_t, li.discount_t, q_target, alpha=config.alpha, lambda_=config.lambda_, mask=li.mask
      )
      errors = jnp.where(li.mask, targets - losses.take_action(q[:-1], a_tm1), 0.0)
    else:
      errors = losses.sql_nstep_td_error(
          q[:-1],
          a_tm1,
          r_t,
          li.discount_t,
          q_target,
          alpha=config.alpha,
          n=config.n_step,
          mask=li.mask,
      )
    w = li.mask.astype(jnp.float32)
    loss = losses.weighted_mean(jnp.square(errors), w)
    return loss, {
        "loss": loss,
        "q_mean": losses.weighted_mean(losses.take_action(q[:-1], a_tm1), w),
        "abs_td_error": losses.weighted_mean(jnp.abs(errors), w),
    }

  @base.jit_update(spec, f"discrete {name.upper()}")
  def update(state, batch):
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, state.target_params, batch)
    params, opt_state, metrics["grad_norm"] = base.gradient_step(
        optimizer, state.params, state.opt_state, grads
    )
    target = base.polyak(state.target_params, params, config.target_update_tau)
    return (
        state._replace(
            params=params,
            target_params=target,
            opt_state=opt_state,
            num_updates=state.num_updates + 1,
        ),
        metrics,
    )

  return base.Agent(name, init, act, greedy_act, update, off_policy=True, spec=spec, config=config)
