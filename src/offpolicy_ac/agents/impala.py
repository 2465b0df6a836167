"""IMPALA: a V-trace actor-critic (Espeholt et al. 2018, arXiv:1802.01561).

Discrete (categorical) and continuous (diagonal Gaussian) policies. The loss is
`offpolicy_ac.losses.impala_loss` on a time-major Trajectory [T+1, B]; it works
on fresh unrolls (the classic on-policy learner, with actor lag corrected by
V-trace) and on replayed sequences alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar
from typing import Optional
from typing import Sequence

import jax
import jax.numpy as jnp

from offpolicy_ac import losses
from offpolicy_ac import networks
from offpolicy_ac.agents import base


@dataclasses.dataclass(frozen=True)
class ImpalaConfig:
  """IMPALA's hyper-parameters: V-trace, the loss weights, the network and the optimizer."""

  TUNABLE: ClassVar[tuple[str, ...]] = (
      "gamma",
      "lambda_",
      "clip_rho_threshold",
      "clip_c_threshold",
      "clip_pg_rho_threshold",
      "value_weight",
      "entropy_weight",
      "learning_rate",
      "max_grad_norm",
  )
  """Fields that may be arrays (swept, vmapped: `agents.hyperparams`)."""

  gamma: float = 0.99
  """Discount factor."""
  lambda_: float = 1.0
  """V-trace lambda: below 1 mixes in shorter returns, as in TD(lambda); 1 is the paper's
  V-trace."""
  clip_rho_threshold: float = 1.0
  """rho-bar: truncation of the value-target importance weights."""
  clip_c_threshold: float = 1.0
  """c-bar: truncation of the trace coefficients (must be <= rho-bar)."""
  clip_pg_rho_threshold: float = 1.0
  """rho-bar for the policy-gradient weights."""
  surrogate_clip: Optional[float] = None
  """None: the paper's V-trace policy gradient. epsilon in (0, 1): PPO's clipped surrogate
  on pi/mu with V-trace's advantages (IMPACT, Luo et al. 2020), which lets replayed
  sequences be reused several times."""
  value_weight: float = 0.5
  """Weight of the value loss (the paper's w_v)."""
  entropy_weight: float = 0.01
  """Weight of the entropy bonus (the paper's w_e)."""
  learning_rate: float = 3e-3
  """Optimizer step size."""
  learning_rate_decay_updates: int = 0
  """> 0: the step size falls linearly to 0 over this many updates (PPO's annealing;
  `experiments/impala.py --anneal-learning-rate` sets it to the run's updates); 0:
  constant."""
  optimizer: str = "adam"
  """'adam' or 'rmsprop'."""
  optimizer_eps: float = 1e-5
  """Epsilon of Adam / RMSProp."""
  max_grad_norm: float = 0.5
  """Global-norm gradient clipping."""
  torso: str = "auto"
  """Network body: 'auto' (by observation shape), 'mlp', 'nature_cnn', 'impala_resnet',
  'small_cnn' or 'minatar_cnn'."""
  hidden_sizes: Sequence[int] = (64, 64)
  """MLP torso layer sizes; a built-in pixel torso has no layers they size (registered
  torsos are given them)."""
  shared_torso: bool = True
  """True: policy and value share one torso (the paper's). False: each has a torso of its
  own (as PPO's continuous-control networks), so the value loss cannot move the policy's
  features."""
  init_log_std: float = 0.0
  """Initial log standard deviation of a Gaussian policy, in [-20, 20]."""
  use_replay: bool = False
  """Learn from replayed sequences (V-trace corrects the policy lag) instead of
  only from each fresh unroll; see the loop's replay settings."""

  def validate(self) -> None:
    base.check_in("gamma", self.gamma, 0.0, 1.0)
    base.check_hidden_sizes(self.hidden_sizes)
    base.check_in("lambda_", self.lambda_, 0.0, 1.0)
    for name in (
        "clip_rho_threshold",
        "clip_c_threshold",
        "clip_pg_rho_threshold",
        "learning_rate",
        "max_grad_norm",
        "optimizer_eps",
    ):
      base.check_positive(name, getattr(self, name))
    traced = base.is_traced(self.clip_rho_threshold) or base.is_traced(self.clip_c_threshold)
    if not traced and base.host_value(self.clip_rho_threshold) < base.host_value(
        self.clip_c_threshold
    ):
      raise ValueError(
          f"rho-bar ({self.clip_rho_threshold}) < c-bar ({self.clip_c_threshold}): "
          "V-trace needs clip_rho_threshold >= clip_c_threshold (Espeholt et al. 2018, "
          "Remark 1)"
      )
    base.check_non_negative("value_weight", self.value_weight)
    base.check_non_negative("entropy_weight", self.entropy_weight)
    # optimizer_eps inf would make every step 0.
    finite = ("learning_rate", "optimizer_eps", "value_weight", "entropy_weight", "init_log_std")
    for name in finite:
      base.check_finite(name, getattr(self, name))
    # (a - mean) / e^init_log_std, squared in the log-probabilities, leaves float32 past ~44.
    base.check_in("init_log_std", self.init_log_std, -20.0, 20.0)
    losses.check_surrogate_clip(self.surrogate_clip)
    base.check_int("learning_rate_decay_updates", self.learning_rate_decay_updates, 0)

  def unused_on(self, spec) -> dict[str, str]:
    """The settings that have no effect on the task of `spec`, each with why
    (`base.check_settings_used` refuses them set off their defaults)."""
    unused = {**base.unused_mlp_sizes(self, spec), **self.ignored_settings()}
    if spec.is_discrete:
      unused["init_log_std"] = (
          "settings of continuous actions, which IMPALA on a discrete task does not use"
      )
    return unused

  def ignored_settings(self) -> dict[str, str]:
    """The settings the rest of this config leaves without effect, on any task, each with
    why: the policy gradient's rho clip under the clipped surrogate, which clips the
    ratio itself."""
    if self.surrogate_clip is None:
      return {}
    return {"clip_pg_rho_threshold": "the policy gradient's rho clip: no effect with "
                                     "surrogate_clip, which clips the ratio itself"}  # fmt: skip


def make_impala(spec, config: ImpalaConfig = ImpalaConfig()) -> base.Agent:
  """Builds the IMPALA agent for an environment spec (discrete or continuous)."""
  base.check_spec(spec, "make_impala")
  base.check_config(config, ImpalaConfig, "make_impala")
  discrete = spec.is_discrete

  def make_net():
    torso = networks.make_torso(config.torso, spec.observation_shape, config.hidden_sizes)
    if discrete:
      return networks.CategoricalActorCritic(torso, spec.num_actions)
    return networks.GaussianActorCritic(torso, math.prod(spec.action_shape), config.init_log_std)

  net, policy = networks.actor_critic(
      make_net, shared_torso=config.shared_torso, num_policy=1 if discrete else 2
  )
  optimizer = base.make_optimizer(
      config.optimizer,
      config.learning_rate,
      config.max_grad_norm,
      eps=config.optimizer_eps,
      decay_updates=config.learning_rate_decay_updates,
  )
  obs_dtype = jnp.dtype(spec.observation_dtype)
  action_shape = tuple(spec.action_shape)  # continuous: [B, d] -> [B, *action_shape]

  @base.takes_key("IMPALA")
  def init(key):
    init_key, key = jax.random.split(key)
    dummy = jnp.zeros((1,) + tuple(spec.observation_shape), obs_dtype)
    params = net.init(init_key, dummy)
    return base.AgentState(params, (), optimizer.init(params), key, jnp.zeros((), jnp.int32))

  @base.takes_params("IMPALA")
  def act(params, obs, key):
    if discrete:
      (logits,) = policy(params, obs)
      action = jax.random.categorical(key, logits).astype(jnp.int32)
      return action, {"logits": logits}
    mean, log_std = policy(params, obs)
    action = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
    log_prob = losses.gaussian_log_prob(mean, log_std, action)
    return action.reshape(mean.shape[:-1] + action_shape), {"log_prob": log_prob}

  @base.takes_params("IMPALA")
  def greedy_act(params, obs):
    if discrete:
      (logits,) = policy(params, obs)
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    mean = policy(params, obs)[0]
    return mean.reshape(mean.shape[:-1] + action_shape)

  def loss_fn(params, traj):
    base.check_extras(traj, ("logits",) if discrete else ("log_prob",), "IMPALA")
    base.check_trajectory(traj, spec, "IMPALA")
    li = base.float32_loss_inputs(traj, config.gamma)
    out = base.apply_batched(net.apply, params, traj.observation)
    kwargs = dict(
        mask=li.mask,
        value_weight=config.value_weight,
        entropy_weight=config.entropy_weight,
        lambda_=config.lambda_,
        clip_rho_threshold=config.clip_rho_threshold,
        clip_c_threshold=config.clip_c_threshold,
        clip_pg_rho_threshold=config.clip_pg_rho_threshold,
        surrogate_clip=config.surrogate_clip,
    )
    r_t = li.r_t
    if discrete:
      logits, values = out
      res = losses.impala_loss_categorical(
          logits[:-1],
          traj.extras["logits"][:-1],
          traj.action[:-1],
          values[:-1],
          values[1:],
          r_t,
          li.discount_t,
          **kwargs,
      )
    else:
      mean, log_std, values = out
      res = losses.impala_loss_gaussian(
          mean[:-1],
          log_std[:-1],
          traj.extras["log_prob"][:-1],
          traj.action[:-1].reshape(mean[:-1].shape),
          values[:-1],
          values[1:],
          r_t,
          li.discount_t,
          **kwargs,
      )
    metrics = dict(
        loss=res.loss,
        policy_loss=res.policy_loss,
        value_loss=res.value_loss,
        entropy=res.entropy,
        mean_rho=res.mean_rho,
        clipped_rho_fraction=res.clipped_rho_fraction,
    )
    return res.loss, metrics

  @base.jit_update(spec, "IMPALA")
  def update(state, traj):
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, traj)
    params, opt_state, metrics["grad_norm"] = base.gradient_step(
        optimizer, state.params, state.opt_state, grads
    )
    return (
        state._replace(params=params, opt_state=opt_state, num_updates=state.num_updates + 1),
        metrics,
    )

  return base.Agent(
      "impala",
      init,
      act,
      greedy_act,
      update,
      off_policy=config.use_replay,
      spec=spec,
      config=config,
  )
