"""ACER: actor-critic with experience replay (Wang et al. 2016, arXiv:1611.01224).

See "Sample Efficient Actor-Critic with Experience Replay" by Wang et al.
(https://arxiv.org/abs/1611.01224).

* Discrete actions (`ActorQCritic`: policy logits and Q(x, .)): Retrace
  targets Q^ret (c = min(1, rho)), truncated importance sampling with bias
  correction (`clip_c`), ACER's trust region against an average policy network
  on the probabilities, critic loss 1/2 (Q^ret - Q(x, a))^2.
* Continuous actions (`StochasticDuelingNetwork`: diagonal Gaussian policy,
  V(x) and A(x, a)): Q~(x, a) = V(x) + A(x, a) - mean_i A(x, u_i) with
  `sdn_samples` draws u_i ~ pi, Q^ret (c = min(1, rho^(1/d))) for the critic,
  Q^opc (c = 1) for the policy gradient, and the trust region on the Gaussian
  statistics (mean, log_std).

Loss = policy surrogate + value_weight * critic loss - entropy_weight * entropy,
each a mean over the real transitions of the batch (`mask` from
`envs.loss_inputs`); the entropy bonus is added outside the trust region. With
`shared_torso=False` (the default) the policy and the critic are two copies of
the network, each with its own torso (see `AcerConfig.shared_torso`).
The average policy network lives in `AgentState.target_params` and follows the
parameters as an exponential moving average after every update:
theta_avg <- avg_decay * theta_avg + (1 - avg_decay) * theta.

`update` works on any time-major Trajectory batch [T+1, B] whose extras hold
the behaviour policy (as written by `act`): discrete `logits` [B, A];
continuous `log_prob` [B] of the taken action, `mean` [B, D] and `log_std`
[B, D]. So it serves both ACER's on-policy update (a fresh unroll, where
pi = mu at the first update) and its replayed updates.

ACER's scheme is one on-policy update on each fresh unroll followed by
`replay_ratio` updates on replayed sequences: the agent sets
`fresh_update_first=True`, and the loop's `num_updates_per_train_iter` is the
replay ratio (experiments/acer.py derives it from `AcerConfig.replay_ratio`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar
from typing import Sequence

import jax
import jax.numpy as jnp

from offpolicy_ac import losses
from offpolicy_ac import networks
from offpolicy_ac.agents import base


@dataclasses.dataclass(frozen=True)
class AcerConfig:
  """ACER's hyper-parameters: Retrace and the trust region, the average network, the loss
  weights, the replay ratio, the stochastic dueling network, the network and the optimizer."""

  TUNABLE: ClassVar[tuple[str, ...]] = (
      "gamma",
      "learning_rate",
      "max_grad_norm",
      "clip_c",
      "trust_region_delta",
      "avg_decay",
      "value_weight",
      "entropy_weight",
  )
  """Fields that may be arrays (swept, vmapped: `agents.hyperparams`)."""

  gamma: float = 0.99
  """Discount factor."""
  learning_rate: float = 1e-3
  """Optimizer step size."""
  optimizer: str = "adam"
  """'adam' or 'rmsprop'."""
  optimizer_eps: float = 1e-5
  """Epsilon of Adam / RMSProp."""
  max_grad_norm: float = 10.0
  """Global-norm gradient clipping."""
  clip_c: float = 10.0
  """c: truncation of the importance weights in the policy gradient (the bias
  correction term takes the rest)."""
  trust_region_delta: float = 1.0
  """delta: size of the linearised trust region KL(average || pi) <= delta."""
  use_trust_region: bool = True
  """Project the policy gradient onto the trust region around the average policy."""
  avg_decay: float = 0.99
  """alpha: the average network follows theta_avg <- alpha theta_avg + (1 - alpha) theta."""
  value_weight: float = 0.5
  """Weight of the critic loss."""
  entropy_weight: float = 0.01
  """Weight of the entropy bonus."""
  replay_ratio: int = 4
  """Replayed updates after each on-policy update (at least 1). The update reads one batch:
  the loop makes these updates, as its `num_updates_per_train_iter`, which must equal it
  (`experiments/acer.py` sets it from `--replay-ratio`, `presets.acer.Args.resolved_train`;
  `training.train`, `run_experiment` and `make_train` refuse another)."""
  sdn_samples: int = 5
  """Continuous: n, actions u_i ~ pi sampled for the stochastic dueling network."""
  sdn_hidden_size: int = 64
  """Continuous: hidden units of the SDN's advantage head A(x, a)."""
  torso: str = "auto"
  """Network body: 'auto' (by observation shape), 'mlp', 'nature_cnn', 'impala_resnet',
  'small_cnn' or 'minatar_cnn'."""
  shared_torso: bool = False
  """True: policy and critic share one torso (the paper's Atari network). False (the
  default) gives the critic (Q, or V and A) a torso of its own, so critic updates
  cannot move the policy past the trust region: on Pendulum-v1 the shared torso learnt
  about 3x slower and fell back after learning."""
  hidden_sizes: Sequence[int] = (64, 64)
  """MLP torso layer sizes; a built-in pixel torso has no layers they size (registered
  torsos are given them)."""
  init_log_std: float = 0.0
  """Continuous: initial log standard deviation of the Gaussian policy, in [-20, 20]."""

  def validate(self) -> None:
    base.check_in("gamma", self.gamma, 0.0, 1.0)
    for name in ("learning_rate", "max_grad_norm", "optimizer_eps", "clip_c"):
      base.check_positive(name, getattr(self, name))
    if self.optimizer not in ("adam", "rmsprop"):
      raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {self.optimizer!r}")
    base.check_non_negative("trust_region_delta", self.trust_region_delta)
    base.check_in("avg_decay", self.avg_decay, 0.0, 1.0)  # a number first
    if not base.is_traced(self.avg_decay) and not base.host_value(self.avg_decay) < 1.0:
      raise ValueError(
          f"avg_decay must lie in [0, 1) (0: the average network is the current one; "
          f"1 would freeze it), got {self.avg_decay}"
      )
    base.check_non_negative("value_weight", self.value_weight)
    base.check_non_negative("entropy_weight", self.entropy_weight)
    # optimizer_eps inf would make every step 0.
    finite = ("learning_rate", "optimizer_eps", "value_weight", "entropy_weight", "init_log_std")
    for name in finite:
      base.check_finite(name, getattr(self, name))
    # (a - mean) / e^init_log_std, squared in the log-probabilities, leaves float32 past ~44.
    base.check_in("init_log_std", self.init_log_std, -20.0, 20.0)
    for name, low in (("replay_ratio", 1), ("sdn_samples", 1), ("sdn_hidden_size", 1)):
      base.check_int(name, getattr(self, name), low)
    base.check_hidden_sizes(self.hidden_sizes)

  def unused_on(self, spec) -> dict[str, str]:
    """The settings that have no effect on the task of `spec` (or without the trust
    region), each with why (`base.check_settings_used` refuses them set off their
    defaults)."""
    unused = {**base.unused_mlp_sizes(self, spec), **self.ignored_settings()}
    if spec.is_discrete:
      why = "settings of continuous actions, which ACER on a discrete task does not use"
      unused.update(dict.fromkeys(("init_log_std", "sdn_samples", "sdn_hidden_size"), why))
    return unused

  def ignored_settings(self) -> dict[str, str]:
    """The settings the rest of this config leaves without effect, on any task, each with
    why: the trust region's size and its average network's decay without the trust
    region (the average network is read by the trust region alone)."""
    if self.use_trust_region:
      return {}
    return {
        "trust_region_delta": "the trust region's size: no effect without use_trust_region",
        "avg_decay": "the trust region's average network: no effect without use_trust_region",
    }


def make_acer(spec, config: AcerConfig = AcerConfig()) -> base.Agent:
  """Builds ACER for an environment spec: discrete or continuous by `spec.is_discrete`."""
  base.check_spec(spec, "make_acer")
  if spec.is_discrete:
    return make_acer_discrete(spec, config)
  return make_acer_continuous(spec, config)


def _agent(init, act, greedy_act, update, spec, config) -> base.Agent:
  return base.Agent(
      "acer",
      init,
      act,
      greedy_act,
      update,
      off_policy=True,
      spec=spec,
      config=config,
      fresh_update_first=True,
  )


def _make_update(loss_fn, optimizer, config: AcerConfig, spec, agent: str):
  """update(state, traj): one gradient step, then the average network's EMA step."""

  @base.jit_update(spec, agent)
  def update(state, traj):
    key, loss_key = jax.random.split(state.key)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(
        state.params, state.target_params, traj, loss_key
    )
    params, opt_state, metrics["grad_norm"] = base.gradient_step(
        optimizer, state.params, state.opt_state, grads
    )
    avg_params = base.polyak(state.target_params, params, 1.0 - config.avg_decay)
    return base.AgentState(params, avg_params, opt_state, key, state.num_updates + 1), metrics

  return update


def _make_init(net, optimizer, spec, method=None):
  obs_dtype = jnp.dtype(spec.observation_dtype)

  @base.takes_key("ACER")
  def init(key):
    init_key, key = jax.random.split(key)
    dummy = jnp.zeros((1,) + tuple(spec.observation_shape), obs_dtype)
    params = net.init(init_key, dummy, method=method)
    # The average policy network starts as a copy of the online one.
    avg_params = jax.tree.map(jnp.array, params)
    return base.AgentState(
        params, avg_params, optimizer.init(params), key, jnp.zeros((), jnp.int32)
    )

  return init


def make_acer_discrete(spec, config: AcerConfig = AcerConfig()) -> base.Agent:
  """Discrete ACER (categorical policy + Q head, Q^ret, trust region)."""
  base.check_discrete(spec, "discrete ACER (make_acer_discrete)")
  base.check_config(config, AcerConfig, "make_acer_discrete")
  net, policy = networks.actor_critic(
      lambda: networks.ActorQCritic(
          networks.make_torso(config.torso, spec.observation_shape, config.hidden_sizes),
          spec.num_actions,
      ),
      shared_torso=config.shared_torso,
      num_policy=1,
  )
  optimizer = base.make_optimizer(
      config.optimizer, config.learning_rate, config.max_grad_norm, eps=config.optimizer_eps
  )

  @base.takes_params("discrete ACER")
  def act(params, obs, key):
    (logits,) = policy(params, obs)
    action = jax.random.categorical(key, logits).astype(jnp.int32)
    return action, {"logits": logits}

  @base.takes_params("discrete ACER")
  def greedy_act(params, obs):
    (logits,) = policy(params, obs)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def loss_fn(params, avg_params, traj, key):
    del key  # discrete ACER draws no samples
    base.check_extras(traj, ("logits",), "discrete ACER")
    base.check_trajectory(traj, spec, "discrete ACER")
    sg = jax.lax.stop_gradient
    li = base.float32_loss_inputs(traj, config.gamma)
    r_t = li.r_t
    logits, q = base.apply_batched(net.apply, params, traj.observation)  # [T+1, B, A]
    (avg_logits,) = base.apply_batched(policy, avg_params, traj.observation[:-1])
    avg_logits = sg(avg_logits)
    a = traj.action.astype(jnp.int32)
    mu = jax.nn.softmax(traj.extras["logits"].astype(logits.dtype), axis=-1)
    pi = jax.nn.softmax(logits, axis=-1)

    q_ret = losses.acer_q_ret(
        sg(q[1:]),
        a[1:],
        r_t,
        li.discount_t,
        sg(pi[1:]),
        losses.take_action(mu[1:], a[1:]),
        mask=li.mask,
    )
    if config.use_trust_region:
      tr = losses.acer_trust_region_policy_loss(
          logits[:-1],
          avg_logits,
          mu[:-1],
          a[:-1],
          q[:-1],
          q_ret,
          clip_c=config.clip_c,
          delta=config.trust_region_delta,
          mask=li.mask,
      )
      policy_per_step, tr_active = tr.surrogate, tr.active.astype(r_t.dtype)
    else:
      policy_per_step = losses.acer_policy_loss(
          pi[:-1], mu[:-1], a[:-1], q[:-1], q_ret, clip_c=config.clip_c, mask=li.mask
      )
      tr_active = jnp.zeros_like(r_t)
    value_per_step = losses.acer_value_loss(q[:-1], a[:-1], q_ret, mask=li.mask)
    entropy_per_step = losses.categorical_entropy(logits[:-1])

    w = li.mask.astype(r_t.dtype)
    mean = functools.partial(losses.weighted_mean, weights=w)
    policy_loss = mean(policy_per_step)
    value_loss = mean(value_per_step)
    entropy = mean(entropy_per_step)
    loss = policy_loss + config.value_weight * value_loss - config.entropy_weight * entropy
    rho = sg(losses.take_action(pi[:-1], a[:-1]) / (losses.take_action(mu[:-1], a[:-1]) + 1e-8))
    metrics = dict(
        loss=loss,
        policy_loss=policy_loss,
        value_loss=value_loss,
        entropy=entropy,
        mean_rho=mean(rho),
        clipped_rho_fraction=mean(losses.exceeds_threshold(rho, config.clip_c).astype(w.dtype)),
        kl_avg=mean(losses.categorical_kl(avg_logits, sg(logits[:-1]))),
        trust_region_active=mean(tr_active),
        q_ret=mean(q_ret),
        q_taken=mean(sg(losses.take_action(q[:-1], a[:-1]))),
    )
    return loss, metrics

  update = _make_update(loss_fn, optimizer, config, spec, "discrete ACER")
  return _agent(_make_init(net, optimizer, spec), act, greedy_act, update, spec, config)


def _init_sdn(module, obs):
  """Creates every SDN parameter: the policy / value heads and A(x, a)."""
  mean, log_std, value, features = module(obs)
  return (mean, log_std, value), module.advantage(features, jnp.zeros_like(mean))


def make_acer_continuous(spec, config: AcerConfig = AcerConfig()) -> base.Agent:
  """Continuous ACER (stochastic dueling network, Q^ret / Q^opc, trust region)."""
  base.check_continuous(spec, "continuous ACER (make_acer_continuous)")
  base.check_config(config, AcerConfig, "make_acer_continuous")
  action_shape = tuple(spec.action_shape)
  action_dim = int(math.prod(action_shape))
  net, policy = networks.actor_critic(
      lambda: networks.StochasticDuelingNetwork(
          networks.make_torso(config.torso, spec.observation_shape, config.hidden_sizes),
          action_dim,
          config.sdn_hidden_size,
          config.init_log_std,
      ),
      shared_torso=config.shared_torso,
      num_policy=2,
  )
  optimizer = base.make_optimizer(
      config.optimizer, config.learning_rate, config.max_grad_norm, eps=config.optimizer_eps
  )
  n = config.sdn_samples

  @base.takes_params("continuous ACER")
  def act(params, obs, key):
    mean, log_std = policy(params, obs)
    action = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
    extras = {
        "log_prob": losses.gaussian_log_prob(mean, log_std, action),
        "mean": mean,
        "log_std": log_std,
    }
    return action.reshape(action.shape[:1] + action_shape), extras

  @base.takes_params("continuous ACER")
  def greedy_act(params, obs):
    mean, _ = policy(params, obs)
    return mean.reshape(mean.shape[:1] + action_shape)

  def advantage(params, features, actions):
    """A(x, a) for features [T+1, B, H] and actions [T+1, B, K, D] -> [T+1, B, K]."""
    lead = features.shape[:2]
    flat_f = features.reshape((-1,) + features.shape[2:])
    flat_a = actions.reshape((flat_f.shape[0],) + actions.shape[2:])
    adv = net.apply(params, flat_f, flat_a, method=net.advantage)
    return adv.reshape(lead + adv.shape[1:])

  def loss_fn(params, avg_params, traj, key):
    base.check_extras(traj, ("log_prob", "mean", "log_std"), "continuous ACER")
    base.check_trajectory(traj, spec, "continuous ACER")
    sg = jax.lax.stop_gradient
    li = base.float32_loss_inputs(traj, config.gamma)
    r_t = li.r_t
    mean, log_std, v, h = base.apply_batched(net.apply, params, traj.observation)
    avg_mean, avg_log_std = base.apply_batched(policy, avg_params, traj.observation[:-1])
    avg_mean, avg_log_std = sg(avg_mean), sg(avg_log_std)
    steps = mean.shape[:2]  # (T+1, B)
    a = traj.action.reshape(steps + (action_dim,)).astype(mean.dtype)
    mu_mean = traj.extras["mean"].reshape(mean.shape).astype(mean.dtype)
    mu_log_std = traj.extras["log_std"].reshape(mean.shape).astype(mean.dtype)
    log_mu_a = traj.extras["log_prob"].astype(mean.dtype)

    # Actions drawn from the current policy (constants): a' for the bias
    # correction term, u_1..u_n for the SDN's advantage baseline.
    noise = jax.random.normal(key, steps + (n + 1, action_dim), mean.dtype)
    samples = sg(mean[:, :, None] + jnp.exp(log_std)[:, :, None] * noise)
    adv = advantage(params, h, jnp.concatenate([a[:, :, None], samples], axis=2))
    adv_a, adv_prime, adv_u = adv[..., 0], adv[..., 1], adv[..., 2:]
    q_tilde_a = losses.sdn_q_value(v, adv_a, adv_u)  # [T+1, B]
    q_tilde_prime = losses.sdn_q_value(v, adv_prime, adv_u)
    a_prime = samples[:, :, 0]

    log_rho_a = losses.importance_ratios_from_log_probs(
        losses.gaussian_log_prob(mean, log_std, a), log_mu_a
    ).log_rho
    targets = losses.acer_continuous_targets(
        sg(q_tilde_a[1:]),
        sg(v[1:]),
        r_t,
        li.discount_t,
        log_rho_a[1:],
        action_dim=action_dim,
        mask=li.mask,
    )
    value_per_step = losses.acer_continuous_value_losses(
        q_tilde_a[:-1], v[:-1], targets.q_ret, log_rho_a[:-1], mask=li.mask
    )

    # Policy: the objective as a function of the Gaussian statistics.
    a_tm1, a_prime_tm1 = a[:-1], a_prime[:-1]
    log_rho_prime = losses.importance_ratios_from_log_probs(
        losses.gaussian_log_prob(mean[:-1], log_std[:-1], a_prime_tm1),
        losses.gaussian_log_prob(mu_mean[:-1], mu_log_std[:-1], a_prime_tm1),
    ).log_rho

    def objective_fn(stats):
      m, ls = stats[..., :action_dim], stats[..., action_dim:]
      return losses.acer_continuous_policy_objective(
          losses.gaussian_log_prob(m, ls, a_tm1),
          losses.gaussian_log_prob(m, ls, a_prime_tm1),
          log_rho_a[:-1],
          log_rho_prime,
          targets.q_opc,
          sg(q_tilde_prime[:-1]),
          sg(v[:-1]),
          clip_c=config.clip_c,
          mask=li.mask,
      )

    def kl_fn(stats):
      m, ls = stats[..., :action_dim], stats[..., action_dim:]
      return losses.gaussian_kl(avg_mean, avg_log_std, m, ls)

    stats = jnp.concatenate([mean[:-1], log_std[:-1]], axis=-1)
    if config.use_trust_region:
      tr = losses.trust_region_surrogate(
          objective_fn, kl_fn, stats, delta=config.trust_region_delta, mask=li.mask
      )
      policy_per_step, tr_active = tr.surrogate, tr.active.astype(r_t.dtype)
    else:
      policy_per_step = -objective_fn(stats)
      tr_active = jnp.zeros_like(r_t)
    entropy_per_step = losses.gaussian_entropy(log_std[:-1])

    w = li.mask.astype(r_t.dtype)
    wmean = functools.partial(losses.weighted_mean, weights=w)
    policy_loss = wmean(policy_per_step)
    value_loss = wmean(value_per_step)
    entropy = wmean(entropy_per_step)
    loss = policy_loss + config.value_weight * value_loss - config.entropy_weight * entropy
    rho = jnp.exp(log_rho_a[:-1])
    metrics = dict(
        loss=loss,
        policy_loss=policy_loss,
        value_loss=value_loss,
        entropy=entropy,
        mean_rho=wmean(rho),
        clipped_rho_fraction=wmean(losses.exceeds_threshold(rho, config.clip_c).astype(w.dtype)),
        kl_avg=wmean(sg(kl_fn(stats))),
        trust_region_active=wmean(tr_active),
        q_ret=wmean(targets.q_ret),
        q_opc=wmean(targets.q_opc),
        v=wmean(sg(v[:-1])),
        log_std=wmean(jnp.mean(sg(log_std[:-1]), axis=-1)),  # the learned steps' (0 on none)
    )
    return loss, metrics

  update = _make_update(loss_fn, optimizer, config, spec, "continuous ACER")
  return _agent(_make_init(net, optimizer, spec, _init_sdn), act, greedy_act, update, spec, config)
