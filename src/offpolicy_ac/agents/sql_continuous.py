"""Soft Q-learning for continuous actions (Haarnoja et al. 2017, arXiv:1702.08165).

See "Reinforcement Learning with Deep Energy-Based Policies" by Haarnoja et al.
(https://arxiv.org/abs/1702.08165) and the authors' code (haarnoja/softqlearning).

* Q(s, a): an MLP over concat(torso(s), a) (`networks.StateActionQNetwork`), with a
  target network (Polyak averaging with `target_update_tau`, as the discrete agent).
  With `num_q_networks` = N > 1, N such networks (params stacked on a leading axis of N),
  each regressed on the same targets (the Q loss is the sum of theirs); "Q" below is then
  their minimum, in the targets and in SVGD (clipped double Q, as in soft actor-critic).
* The sampler a = tanh(f_phi(s, xi)), xi ~ N(0, I_d) (`networks.AmortizedSampler`),
  mapped affinely from (-1, 1)^d to the action box [low, high]. Q takes actions in
  [-1, 1]^d too (stored actions are mapped back and clipped).
* Targets: y = r + discount * V_target(s'), V_target the importance-sampled soft value
  (eq. 10) of Q_target at `num_value_samples` actions uniform in [-1, 1]^d (the
  authors' proposal, log q' = -d log 2), or with `value_proposal_std` > 0 half of them
  from a truncated normal around the sampler's noise-free action at s' (a mixture
  proposal, `losses.box_mixture_log_density`). `n_step` > 1 and `lambda_` > 0 bootstrap
  from the same V through the discrete agent's soft n-step / lambda targets, uncorrected
  as there.
  `envs.loss_inputs` gives the mask and discounts: junctions, terminations and truncations
  behave as in the discrete agent.
* The sampler follows SVGD (eq. 13): per source state, `num_particles` actions from the
  sampler, the last `num_updated_particles` moved along phi, computed from the others with
  log p(a) = Q(s, a) / alpha + sum_i log(1 - a_i^2 + eps) (the authors' tanh correction);
  surrogate loss -mean(stop_gradient(phi) * a).
* One loss, Q loss + SVGD surrogate, over params {"q": ..., "sampler": ...}: the SVGD term
  sees Q through stop_gradient and the Q loss does not use the sampler, so the gradients
  do not cross. Each network has its own optimizer (clipping included):
  `AgentState.opt_state` is {"q": ..., "sampler": ...}; `target_params` is Q's target.
* Acting: one sample from the sampler, or with probability epsilon a uniform action in the
  box. `greedy_act`: the sampler's action at xi = 0 (deterministic, no Q evaluations).

Metrics: "loss" (the mean squared soft TD error, summed over the Q networks), "q_mean" and
"abs_td_error" (averaged over the Q networks), "svgd_loss" (the surrogate), "particle_std"
(the particles' spread in [-1, 1]^d), "grad_norm" (Q, all networks), "sampler_grad_norm".
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import losses
from offpolicy_ac import networks
from offpolicy_ac.agents import base
from offpolicy_ac.agents.sql_config import SqlConfig
from offpolicy_ac.agents.sql_config import make_sql_optimizer

SQUASH_EPS = 1e-6
"""eps of the tanh correction sum_i log(1 - a_i^2 + eps) (the authors' EPS)."""


def _action_box(spec) -> tuple[np.ndarray, np.ndarray]:
  low = np.asarray(spec.action_low, np.float32).reshape(-1)
  high = np.asarray(spec.action_high, np.float32).reshape(-1)
  if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
    raise ValueError(
        f"continuous SQL samples actions in a bounded box, but {spec.task_id} has action "
        f"bounds low={spec.action_low}, high={spec.action_high}"
    )
  return low, high


def _apply(module, params, obs, actions):
  """module(obs [T, B, ...], actions [T, B, ..., d]) on flattened [T * B] rows."""
  lead = obs.shape[:2]
  flat_obs = obs.reshape((-1,) + obs.shape[2:])
  out = module.apply(params, flat_obs, actions.reshape((flat_obs.shape[0],) + actions.shape[2:]))
  return out.reshape(lead + out.shape[1:])


def _no_noise(shape: tuple) -> jax.Array:
  """The sampler's noise-free input [..., d]: float32 zeros (under `jax_enable_x64` too)."""
  return jnp.zeros(shape, jnp.float32)


def make_sql_continuous(spec, config: SqlConfig = SqlConfig(), *, name: str = "sql") -> base.Agent:
  """Builds SQL for continuous actions (Q(s, a), importance-sampled targets, SVGD sampler)."""
  base.check_continuous(spec, f"continuous {name.upper()} (make_sql_continuous)")
  base.check_config(config, SqlConfig, "make_sql_continuous")
  low, high = _action_box(spec)
  action_shape = tuple(spec.action_shape)
  d = int(math.prod(action_shape))
  obs_shape = tuple(spec.observation_shape)
  # The torso's MLP is empty for vector observations: the MLP layers follow the concat.
  q_net = networks.StateActionQNetwork(
      networks.make_torso(config.torso, obs_shape, ()), tuple(config.hidden_sizes)
  )
  sampler = networks.AmortizedSampler(
      networks.make_torso(config.torso, obs_shape, ()), d, tuple(config.hidden_sizes)
  )
  optimizer = make_sql_optimizer(config)
  obs_dtype, num_q = jnp.dtype(spec.observation_dtype), config.num_q_networks
  num_fixed = config.num_particles - config.num_updated_particles
  log_proposal = -d * math.log(2.0)  # uniform on [-1, 1]^d
  num_normal = config.num_value_samples // 2  # with value_proposal_std > 0
  num_uniform = config.num_value_samples - num_normal
  half_range, mid = (high - low) / 2.0, (high + low) / 2.0

  def to_env(u):
    """[B, d] in [-1, 1]^d -> [B, *action_shape] in [low, high]."""
    return (mid[None] + half_range[None] * u).reshape(u.shape[:1] + action_shape)

  def to_unit(action, lead):
    """Actions [*lead, *action_shape] in the box -> [*lead, d] in [-1, 1]^d."""
    shaped = (1,) * len(lead) + (d,)
    u = action.reshape(lead + (d,)).astype(jnp.float32) - mid.reshape(shaped)
    return jnp.clip(u / half_range.reshape(shaped), -1.0, 1.0)

  def q_init(key, obs, a):
    """Q's params; with num_q > 1, num_q of them stacked on a leading axis."""
    if num_q == 1:
      return q_net.init(key, obs, a)
    return jax.vmap(lambda k: q_net.init(k, obs, a))(jax.random.split(key, num_q))

  def q_each(params, obs, actions):
    """Every Q network's values [num_q, T, B, ...] at obs [T, B, ...], actions [T, B, ..., d]."""
    if num_q == 1:
      return _apply(q_net, params, obs, actions)[None]
    # One network after the other: under vmapped seeds, a vmap over the stacked params
    # makes each layer a matmul with two batch axes, which XLA:CPU runs about 1.5 times
    # slower (experiments/bench_sql_update.py, "vmapped"); a single seed runs as fast.
    return jnp.stack(
        [_apply(q_net, jax.tree.map(lambda x: x[i], params), obs, actions) for i in range(num_q)]
    )

  def q_min(params, obs, actions):
    """Q [T, B, ...]: the minimum over the Q networks (the only one when num_q = 1)."""
    return jnp.min(q_each(params, obs, actions), axis=0)

  @base.takes_key(f"continuous {name.upper()}")
  def init(key):
    q_key, sampler_key, key = jax.random.split(key, 3)
    obs = jnp.zeros((1,) + obs_shape, obs_dtype)
    a = jnp.zeros((1, d), jnp.float32)
    params = {"q": q_init(q_key, obs, a), "sampler": sampler.init(sampler_key, obs, a)}
    opt_state = {part: optimizer.init(p) for part, p in params.items()}
    return base.AgentState(params, params["q"], opt_state, key, jnp.zeros((), jnp.int32))

  @base.takes_params(f"continuous {name.upper()}")
  def act(params, obs, key):
    noise_key, explore_key, uniform_key = jax.random.split(key, 3)
    shape = obs.shape[:1] + (d,)
    u = sampler.apply(params["sampler"], obs, jax.random.normal(noise_key, shape, jnp.float32))
    explore = jax.random.uniform(explore_key, shape[:1] + (1,), jnp.float32) < config.epsilon
    uniform = jax.random.uniform(uniform_key, shape, jnp.float32, -1.0, 1.0)
    return to_env(jnp.where(explore, uniform, u)), {}

  @base.takes_params(f"continuous {name.upper()}")
  def greedy_act(params, obs):
    return to_env(sampler.apply(params["sampler"], obs, _no_noise(obs.shape[:1] + (d,))))

  def loss_fn(params, target_params, batch, key):
    value_key, particle_key = jax.random.split(key)
    sg = jax.lax.stop_gradient
    li = base.float32_loss_inputs(batch, config.gamma)
    steps = li.r_t.shape  # (T, B)
    w = li.mask.astype(jnp.float32)
    obs_tm1, obs_t = batch.observation[:-1], batch.observation[1:]

    # Soft Bellman targets from the importance-sampled soft value of Q_target (eq. 10).
    if config.value_proposal_std > 0:
      center = _apply(sampler, sg(params["sampler"]), obs_t, _no_noise(steps + (1, d)))[..., 0, :]
      u_t = losses.sample_box_mixture(
          value_key, center, config.value_proposal_std, num_uniform, num_normal
      )
      log_q = losses.box_mixture_log_density(
          u_t, center, config.value_proposal_std, num_uniform / config.num_value_samples
      )
    else:
      value_shape = steps + (config.num_value_samples, d)
      u_t = jax.random.uniform(value_key, value_shape, jnp.float32, -1.0, 1.0)
      log_q = log_proposal
    q_t = q_min(target_params, obs_t, u_t)  # [T, B, M]
    v_t = losses.importance_sampled_soft_value(q_t, log_q, config.alpha)
    # The soft value of a single entry is the entry (exactly so at alpha = 1).
    if config.lambda_ > 0:
      targets = losses.soft_q_targets(
          li.r_t, li.discount_t, v_t[..., None], alpha=1.0, lambda_=config.lambda_, mask=li.mask
      )
    else:
      targets = losses.soft_nstep_targets(
          li.r_t, li.discount_t, v_t[..., None], alpha=1.0, n=config.n_step, mask=li.mask
      )
    q_tm1 = q_each(params["q"], obs_tm1, to_unit(batch.action[:-1], steps))  # [N, T, B]
    errors = jnp.where(li.mask, targets[None] - q_tm1, 0.0)
    q_loss = jnp.sum(jax.vmap(lambda e: losses.weighted_mean(jnp.square(e), w))(errors))

    # The sampler: SVGD towards exp(Q / alpha) (eq. 13), Q held constant.
    noise = jax.random.normal(particle_key, steps + (config.num_particles, d), jnp.float32)
    particles = _apply(sampler, params["sampler"], obs_tm1, noise)  # [T, B, K, d]
    fixed, updated = sg(particles[..., :num_fixed, :]), particles[..., num_fixed:, :]

    def log_p(u):
      q = q_min(sg(params["q"]), obs_tm1, u)
      return jnp.sum(q / config.alpha + jnp.sum(jnp.log(1.0 - u**2 + SQUASH_EPS), axis=-1))

    phi = losses.svgd_direction(fixed, jax.grad(log_p)(fixed), sg(updated))
    surrogate = -jnp.mean(jnp.sum(sg(phi) * updated, axis=-1), axis=-1)
    svgd_loss = losses.weighted_mean(surrogate, w)
    w_each = jnp.broadcast_to(w, q_tm1.shape)
    metrics = {
        "loss": q_loss,
        "q_mean": losses.weighted_mean(q_tm1, w_each),
        "abs_td_error": losses.weighted_mean(jnp.abs(errors), w_each),
        "svgd_loss": svgd_loss,
        "particle_std": losses.weighted_mean(jnp.mean(jnp.std(sg(particles), axis=-2), -1), w),
    }
    return q_loss + svgd_loss, metrics

  @base.jit_update(spec, f"continuous {name.upper()}")
  def update(state, batch):
    base.check_trajectory(batch, spec, f"continuous {name.upper()}")
    key, loss_key = jax.random.split(state.key)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(
        state.params, state.target_params, batch, loss_key
    )
    params, opt_state = {}, {}
    for part, norm in (("q", "grad_norm"), ("sampler", "sampler_grad_norm")):
      params[part], opt_state[part], metrics[norm] = base.gradient_step(
          optimizer, state.params[part], state.opt_state[part], grads[part]
      )
    target = base.polyak(state.target_params, params["q"], config.target_update_tau)
    return base.AgentState(params, target, opt_state, key, state.num_updates + 1), metrics

  return base.Agent(name, init, act, greedy_act, update, off_policy=True, spec=spec, config=config)
