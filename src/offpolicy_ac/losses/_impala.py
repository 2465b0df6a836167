"""The IMPALA loss: V-trace policy gradient + value regression - entropy bonus.

See "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures" by Espeholt et al. (https://arxiv.org/abs/1802.01561).

Per step s (a real transition, weight w_s):

    l_s = -stop_grad(pg_advantage_s) * log pi(a_s|x_s)
          + w_v * (v_s - V(x_s))^2
          - w_e * H(pi(.|x_s))

loss = sum_s w_s l_s / sum_s w_s with w = weights * mask (0 if no real step).

With `surrogate_clip` = epsilon, the policy term is instead PPO's clipped surrogate
(Schulman et al. 2017, arXiv:1707.06347) on the ratio r_s = pi(a_s|x_s) / mu(a_s|x_s) and
V-trace's advantage A_s = q_s - V(x_s), as in IMPACT (Luo et al. 2020, arXiv:1912.00167):

    -min(r_s A_s, clip(r_s, 1 - epsilon, 1 + epsilon) A_s)

Its gradient is r_s A_s grad log pi(a_s|x_s) while the ratio is inside the clip range, and 0
once a step has moved the policy past it: replayed data can be reused without the policy
drifting far from the one that acted. At r_s = 1 (fresh on-policy data) it equals the
V-trace policy gradient's (with rho-bar_pg >= 1).
"""

from __future__ import annotations

import inspect
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses import _distributions
from offpolicy_ac.losses._masking import where_used
from offpolicy_ac.losses._vtrace import vtrace


class ImpalaLossOutput(NamedTuple):
  """Scalar loss terms (weighted means over real steps) and diagnostics.

  `clipped_rho_fraction` is the weighted fraction of steps whose rho exceeds
  rho-bar by more than float noise (`exceeds_threshold`): 0 on on-policy data (a
  training run with observation normalisation is not quite: the learner normalises a
  fresh unroll with statistics updated from it, `training.learner`, step 3).
  """

  loss: jax.Array
  policy_loss: jax.Array
  value_loss: jax.Array
  entropy: jax.Array
  mean_rho: jax.Array
  clipped_rho_fraction: jax.Array
  pg_advantage: jax.Array  # [T, ...]
  vtrace_errors: jax.Array  # [T, ...]


def weighted_mean(x: jax.Array, weights: jax.Array) -> jax.Array:
  """sum(w x) / sum(w) over all entries, and 0 where all weights are 0; entries of weight
  0 are left out, not multiplied by 0 (a NaN there does not reach the mean). The mean of
  finite values is finite, even where sum(w x) is not in the inputs' dtype (ratios near
  the dtype's maximum; float16 and bfloat16 are summed in float32).

  `weights` must have the shape of `x` (ValueError naming both shapes
  otherwise): a broadcast weight would be summed once in the denominator but
  applied to every row in the numerator. Broadcast it explicitly
  (`jnp.broadcast_to(w, x.shape)`) where that is what you mean. Weights are >= 0
  (ValueError otherwise, for concrete values: a negative weight makes sum(w) no total).

  The mean has the dtype of `x` and `weights` together, at least float32 where both are
  bool or integer (the fraction of steps where a condition holds, `weighted_mean(rho > 1,
  mask)`, was cast back to bool).
  """
  _checks.check_shape("weights", weights, jnp.shape(x), "`x`")
  _checks.check_non_negative("weights", weights)
  dtype = jnp.result_type(weights, x)
  if not jnp.issubdtype(dtype, jnp.inexact):
    dtype = jnp.promote_types(dtype, jnp.float32)
  # Half precision is summed in float32 (its sums overflow at 65504); float32 and float64
  # as they are.
  acc = jnp.promote_types(dtype, jnp.float32)
  w, x = jnp.asarray(weights, acc), jnp.asarray(x, acc)
  total = jnp.sum(w)
  total = jnp.where(total > 0, total, 1.0)
  zero = jnp.zeros((), acc)
  mean = jnp.sum(jnp.where(w != 0, w * x, zero)) / total
  # Where sum(w x) overflows, sum the shares w / sum(w) instead (rounded differently).
  shares = jnp.sum(jnp.where(w != 0, (w / total) * x, zero))
  return jnp.where(jnp.isfinite(mean), mean, shares).astype(dtype)


def step_weights(shape, mask, weights, dtype) -> jax.Array:
  """Combines an optional bool mask and optional float weights into [T, ...]."""
  mask = _checks.check_mask(mask, shape)
  if weights is None:
    return mask.astype(dtype)
  _checks.check_floating("weights", weights)
  _checks.check_shape("weights", weights, shape, "`r_t`")
  _checks.check_entries("weights", weights, 0.0, where=mask)
  return jnp.where(mask, weights, jnp.zeros((), dtype)).astype(dtype)


def _is_number(value: Any) -> bool:
  """A real number, or a 0-d array of one (not a str, whose float() would pass, nor a bool)."""
  if isinstance(value, (str, bytes, bool, np.bool_)) or np.ndim(value) != 0:
    return False
  return np.issubdtype(np.asarray(value).dtype, np.number)


def check_surrogate_clip(surrogate_clip: float | None) -> None:
  """Raises unless `surrogate_clip` is None or an epsilon in (0, 1) (a traced epsilon
  is not checked)."""
  if surrogate_clip is None or isinstance(surrogate_clip, jax.core.Tracer):
    return
  if not _is_number(surrogate_clip):
    raise ValueError(f"`surrogate_clip` must be None or a number, got {surrogate_clip!r}")
  if not 0.0 < float(surrogate_clip) < 1.0:
    raise ValueError(
        f"`surrogate_clip` must be None (the V-trace policy gradient) or an epsilon in "
        f"(0, 1), got {surrogate_clip}"
    )


def clipped_surrogate(
    log_pi: jax.Array, log_mu: jax.Array, advantage: jax.Array, epsilon: float
) -> jax.Array:
  """min(r A, clip(r, 1 - epsilon, 1 + epsilon) A) per step, r = exp(log_pi - log_mu).

  Gradients flow into `log_pi` only. Shapes: all [T, ...]; `epsilon` in (0, 1).
  """
  names = [("log_pi", log_pi), ("log_mu", log_mu), ("advantage", advantage)]
  for name, x in names:
    _checks.check_floating(name, x)
  _checks.check_same_shape(names)
  if not isinstance(epsilon, jax.core.Tracer) and not (
      _is_number(epsilon) and 0 < float(epsilon) < 1
  ):
    raise ValueError(f"`epsilon` must be a number in (0, 1), got {epsilon!r}")
  ratio = _distributions.importance_ratios_from_log_probs(
      log_pi, jax.lax.stop_gradient(log_mu), stop_gradient=False
  )
  # The bounds take the ratios' dtype: a NumPy float64 epsilon made float32 inputs float64.
  low, high = (jnp.asarray(x, ratio.rho.dtype) for x in (1.0 - epsilon, 1.0 + epsilon))
  clipped = jnp.clip(ratio.rho, low, high)
  advantage = jax.lax.stop_gradient(advantage)
  return jnp.minimum(ratio.rho * advantage, clipped * advantage)


def impala_loss(
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    log_pi_tm1: jax.Array,
    log_mu_tm1: jax.Array,
    entropy_tm1: jax.Array,
    *,
    mask: jax.Array | None = None,
    weights: jax.Array | None = None,
    value_weight=0.5,
    entropy_weight=0.01,
    lambda_=1.0,
    clip_rho_threshold=1.0,
    clip_c_threshold=1.0,
    clip_pg_rho_threshold=1.0,
    surrogate_clip: float | None = None,
    method: str = "auto",
) -> ImpalaLossOutput:
  """IMPALA loss for any policy given log-probabilities and entropies.

  Gradients flow into `v_tm1` (value loss), `log_pi_tm1` (policy gradient) and
  `entropy_tm1` (bonus); the V-trace targets, advantages and the ratios are
  constants.

  Args:
    v_tm1: V(x_s) at times [0, T-1], [T, ...].
    v_t: V(x_{s+1}) at times [1, T], [T, ...].
    r_t: rewards at times [1, T].
    discount_t: gamma times environment discount at times [1, T].
    log_pi_tm1: log pi(a_s|x_s) of the learner's policy, times [0, T-1].
    log_mu_tm1: log mu(a_s|x_s) of the behaviour policy, times [0, T-1].
    entropy_tm1: H(pi(.|x_s)) at times [0, T-1].
    mask: optional bool [T, ...], False where step s is not a real transition.
    weights: optional float [T, ...] per-step weights (e.g. padding, priority).
    value_weight: w_v >= 0, a scalar.
    entropy_weight: w_e >= 0, a scalar.
    lambda_, clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold, method: as in
      `vtrace` (`clip_pg_rho_threshold` is unused with `surrogate_clip`).
    surrogate_clip: epsilon in (0, 1) of the clipped surrogate policy term (module
      docstring); None: the V-trace policy gradient.
  """
  _checks.check_floating_alike([
      ("v_tm1", v_tm1), ("log_pi_tm1", log_pi_tm1), ("log_mu_tm1", log_mu_tm1),
      ("entropy_tm1", entropy_tm1),
  ])  # fmt: skip
  _checks.check_same_shape([
      ("r_t", r_t), ("log_pi_tm1", log_pi_tm1), ("log_mu_tm1", log_mu_tm1),
      ("entropy_tm1", entropy_tm1),
  ])  # fmt: skip
  _checks.check_scalar("value_weight", value_weight, "the mean value loss")
  _checks.check_scalar("entropy_weight", entropy_weight, "the mean entropy")
  _checks.check_non_negative("value_weight", value_weight, finite=True)
  _checks.check_non_negative("entropy_weight", entropy_weight, finite=True)
  check_surrogate_clip(surrogate_clip)
  # NaN log-probabilities are named here: `vtrace` would name the ratios they make.
  used = _checks.check_mask(mask, jnp.shape(r_t))
  for name, x in (("log_pi_tm1", log_pi_tm1), ("log_mu_tm1", log_mu_tm1)):
    _checks.check_entries(name, x, -np.inf, np.inf, where=used, bounds="a number, not NaN")
  ratios = _distributions.importance_ratios_from_log_probs(
      log_pi_tm1, log_mu_tm1, stop_gradient=True
  )
  out = vtrace(
      v_tm1,
      v_t,
      r_t,
      discount_t,
      ratios.rho,
      mask=mask,
      lambda_=lambda_,
      clip_rho_threshold=clip_rho_threshold,
      clip_c_threshold=clip_c_threshold,
      clip_pg_rho_threshold=clip_pg_rho_threshold,
      stop_target_gradients=True,
      method=method,
  )
  dtype = jnp.result_type(v_tm1)
  # The weights take the inputs' dtype, as `vtrace`'s hyper-parameters do: a NumPy float64
  # weight made the loss of float32 inputs float64 (under `jax_enable_x64`).
  value_weight, entropy_weight = (jnp.asarray(x, dtype) for x in (value_weight, entropy_weight))
  w = step_weights(jnp.shape(r_t), mask, weights, dtype)
  zero = jnp.zeros((), dtype)
  safe_log_pi = jnp.where(w > 0, log_pi_tm1, zero)
  if surrogate_clip is None:
    pg_adv = jax.lax.stop_gradient(out.pg_advantage)
    # A step whose advantage is 0 adds nothing, not 0 x log pi: an action the learner
    # gives probability 0 (log pi = -inf, so rho = 0 and pg_adv = 0) would make it NaN.
    # Nor does an action both policies give probability 0 (rho = 1): its log pi = -inf
    # would make the loss inf (its gradient is 0).
    counted = (pg_adv != 0) & ~jnp.isneginf(safe_log_pi)
    policy_loss = weighted_mean(-pg_adv * jnp.where(counted, safe_log_pi, zero), w)
  else:
    advantage = jax.lax.stop_gradient(out.q_estimate - v_tm1)
    safe_log_mu = jnp.where(w > 0, log_mu_tm1, jnp.zeros((), log_mu_tm1.dtype))
    policy_loss = weighted_mean(
        -clipped_surrogate(safe_log_pi, safe_log_mu, advantage, surrogate_clip), w
    )
  # Squared in the summing dtype (float32 for half precision): an error over 256 squares
  # past float16's maximum, while the mean of the squares may not.
  acc = jnp.promote_types(dtype, jnp.float32)
  value_loss = weighted_mean(jnp.square(out.errors.astype(acc)), w.astype(acc)).astype(dtype)
  entropy = weighted_mean(entropy_tm1, w)
  loss = policy_loss + value_weight * value_loss - entropy_weight * entropy
  clipped = _distributions.exceeds_threshold(ratios.rho, clip_rho_threshold).astype(w.dtype)
  return ImpalaLossOutput(
      loss=loss,
      policy_loss=policy_loss,
      value_loss=value_loss,
      entropy=entropy,
      mean_rho=weighted_mean(ratios.rho, w),
      clipped_rho_fraction=weighted_mean(clipped, w),
      pg_advantage=out.pg_advantage,
      vtrace_errors=out.errors,
  )


_KEYWORDS = tuple(p.name for p in inspect.signature(impala_loss).parameters.values()
                  if p.kind is inspect.Parameter.KEYWORD_ONLY)  # fmt: skip
"""The keywords `impala_loss` takes, which its wrappers pass on."""


def _check_keywords(name: str, kwargs: dict) -> None:
  """TypeError naming `name` (the wrapper the user called) for a keyword `impala_loss`
  does not take: Python's own error named `impala_loss`, which the user never called."""
  for key in kwargs:
    if key not in _KEYWORDS:
      raise TypeError(f"{name}() got an unexpected keyword argument {key!r}; its keywords "
                      f"are those of impala_loss: {', '.join(_KEYWORDS)}")  # fmt: skip


def impala_loss_categorical(
    logits_tm1: jax.Array,
    mu_logits_tm1: jax.Array,
    a_tm1: jax.Array,
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    **kwargs,
) -> ImpalaLossOutput:
  """IMPALA loss for a categorical policy.

  Args:
    logits_tm1: learner logits [T, ..., A] at times [0, T-1].
    mu_logits_tm1: behaviour logits [T, ..., A] recorded by the actors.
    a_tm1: actions int [T, ...] in [0, A): checked when concrete (ValueError);
      under `jit` an out-of-range action makes the loss NaN, and
      `jax.experimental.checkify.checkify` reports it (see `take_action`).
    v_tm1, v_t, r_t, discount_t, **kwargs: as in `impala_loss`.

  The logits of a masked step may hold anything (NaN, inf): they are replaced before the
  log-probabilities and the entropy, so they get a zero gradient and change no other.
  """
  _check_keywords("impala_loss_categorical", kwargs)
  _checks.check_shape("mu_logits_tm1", mu_logits_tm1, jnp.shape(logits_tm1), "`logits_tm1`")
  mask = _checks.check_mask(kwargs.get("mask"), jnp.shape(logits_tm1)[:-1])
  logits_tm1, mu_logits_tm1 = where_used(mask, logits_tm1), where_used(mask, mu_logits_tm1)
  log_pi = _distributions.log_prob_of(logits_tm1, a_tm1, "logits_tm1", "a_tm1", where=mask)
  log_mu = _distributions.log_prob_of(mu_logits_tm1, a_tm1, "mu_logits_tm1", "a_tm1", where=mask)
  for name, x in [("v_tm1", v_tm1), ("v_t", v_t), ("r_t", r_t), ("discount_t", discount_t)]:
    _checks.check_shape(name, x, jnp.shape(a_tm1), "`a_tm1`, `logits_tm1` without its action axis")
  entropy = _distributions.categorical_entropy(logits_tm1)
  return impala_loss(v_tm1, v_t, r_t, discount_t, log_pi, log_mu, entropy, **kwargs)


def impala_loss_gaussian(
    mean_tm1: jax.Array,
    log_std_tm1: jax.Array,
    log_mu_tm1: jax.Array,
    a_tm1: jax.Array,
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    **kwargs,
) -> ImpalaLossOutput:
  """IMPALA loss for a diagonal Gaussian policy.

  Args:
    mean_tm1: learner means [T, ..., D]; log_std_tm1: [T, ..., D] or [D].
    log_mu_tm1: behaviour log-densities of the taken actions [T, ...].
    a_tm1: actions [T, ..., D] (unclipped samples, as the actors drew them).
    v_tm1, v_t, r_t, discount_t, **kwargs: as in `impala_loss`.

  The means, actions (and per-step log-stds) of a masked step may hold anything (NaN,
  inf): they are replaced before the log-densities, so they get a zero gradient and change
  no other.
  """
  _check_keywords("impala_loss_gaussian", kwargs)
  for name, x in [("mean_tm1", mean_tm1), ("log_std_tm1", log_std_tm1), ("a_tm1", a_tm1)]:
    _checks.check_floating(name, x)
  _checks.check_min_rank("mean_tm1", mean_tm1, 1, "a trailing action axis [..., D]")
  _checks.check_shape("a_tm1", a_tm1, jnp.shape(mean_tm1), "`mean_tm1`")
  _distributions.check_log_std_shape(log_std_tm1, mean_tm1, "log_std_tm1")
  mask = _checks.check_mask(kwargs.get("mask"), jnp.shape(mean_tm1)[:-1])
  mean_tm1, a_tm1 = where_used(mask, mean_tm1), where_used(mask, a_tm1)
  if jnp.shape(log_std_tm1) == jnp.shape(mean_tm1):  # per step, not a shared [D]
    log_std_tm1 = where_used(mask, log_std_tm1)
  log_pi = _distributions.gaussian_log_prob(mean_tm1, log_std_tm1, a_tm1)
  for name, x in [("v_tm1", v_tm1), ("v_t", v_t), ("r_t", r_t), ("discount_t", discount_t)]:
    _checks.check_shape(name, x, jnp.shape(mean_tm1)[:-1], "`mean_tm1` without its action axis")
  entropy = _distributions.gaussian_entropy(jnp.broadcast_to(log_std_tm1, jnp.shape(mean_tm1)))
  return impala_loss(v_tm1, v_t, r_t, discount_t, log_pi, log_mu_tm1, entropy, **kwargs)
