"""Log-probabilities, importance ratios and entropies, computed in log space.

Ratios rho = pi/mu are formed as exp(log pi - log mu) with the log-ratio clamped
to the range whose exponential is finite in the input dtype, so any finite
logits give a finite rho; an action with log-probability -inf (masked out by
-inf logits) gives rho = 0, finite values and finite gradients.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses._actions import select_action


class ImportanceRatios(NamedTuple):
  """rho = pi/mu and its clamped logarithm, both shaped like the actions."""

  rho: jax.Array
  log_rho: jax.Array


_LOG_2PI = math.log(2 * math.pi)  # a Python float: keeps half-precision inputs' dtype


def probability_floor(eps, dtype) -> jax.Array:
  """`eps` (added to a probability before dividing by it), at least `dtype`'s smallest
  normal number: 1e-8 rounds to 0 in float16, where a probability may underflow to 0."""
  return jnp.maximum(jnp.asarray(eps, dtype), jnp.finfo(dtype).tiny)


def _max_log(dtype) -> float:
  # exp(_max_log) is finite and leaves headroom for products with thresholds.
  return float(np.log(float(jnp.finfo(dtype).max))) - 1.0  # jnp's finfo knows bfloat16


def categorical_log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
  """log softmax(logits)[action], shape logits.shape[:-1].

  Args:
    logits: [..., A] (entries may be -inf for illegal actions).
    actions: int [...] in [0, A).

  Raises:
    ValueError: an action outside [0, A) in a concrete (eager) call. Under `jit`
      an out-of-range action gives NaN (see `take_action`); wrap the function in
      `jax.experimental.checkify.checkify` to have the range checked there.
  """
  return log_prob_of(logits, actions, "logits", "actions")


def log_prob_of(logits, actions, logits_name: str, actions_name: str, where=None) -> jax.Array:
  """`categorical_log_prob` whose errors name the caller's arguments; the actions' range
  is checked where `where` is True (the steps read; None: all)."""
  _checks.check_floating(logits_name, logits)
  _checks.check_integer(actions_name, actions)
  _checks.check_min_rank(logits_name, logits, 1, "a trailing action axis")
  _checks.check_actions_of(actions_name, actions, logits_name, logits)
  _checks.check_action_range(actions_name, actions, jnp.shape(logits)[-1], f"`{logits_name}`",
                             where=where)  # fmt: skip
  # NaN or +inf logits (a diverged network) make every ratio NaN; refused here by name, not
  # later as a ratio the caller never passed.
  used = True if where is None else jnp.expand_dims(jnp.asarray(where), -1)
  _checks.check_entries(logits_name, logits, -np.inf, float(np.finfo(np.float64).max),
                        bounds="finite or -inf (an action ruled out)", where=used)  # fmt: skip
  return select_action(jax.nn.log_softmax(logits, axis=-1), jnp.asarray(actions))


def importance_ratios_from_log_probs(
    log_pi: jax.Array, log_mu: jax.Array, *, stop_gradient: bool = True
) -> ImportanceRatios:
  """rho = exp(log_pi - log_mu), computed safely (any action space).

  Args:
    log_pi: target-policy log-probabilities of the taken actions [T, ...].
    log_mu: behaviour-policy log-probabilities of the same actions [T, ...].
    stop_gradient: return ratios with gradients stopped (as the estimators
      treat them as constants).

  Returns:
    `ImportanceRatios`; both -inf gives log_rho = 0 (the action is impossible
    under both policies), log_pi = -inf alone gives rho = 0. log_rho is clamped
    to +-log of the dtype's largest value (+-88.72 in float32), so that rho stays
    finite: a larger log-ratio, or log_mu = -inf alone, gives the bound (and,
    unstopped, no gradient there).
  """
  _checks.check_floating_alike([("log_pi", log_pi), ("log_mu", log_mu)])
  _checks.check_shape("log_mu", log_mu, jnp.shape(log_pi), "`log_pi`")
  dtype = jnp.result_type(log_pi)
  both_impossible = jnp.isneginf(log_pi) & jnp.isneginf(log_mu)
  safe_pi = jnp.where(both_impossible, jnp.zeros((), dtype), log_pi)
  safe_mu = jnp.where(both_impossible, jnp.zeros((), dtype), log_mu)
  bound = _max_log(dtype)
  log_rho = jnp.clip(safe_pi - safe_mu, -bound, bound)
  if stop_gradient:
    log_rho = jax.lax.stop_gradient(log_rho)
  # At the lower clamp (log pi = -inf) rho is exactly 0 on every backend, not a
  # denormal that some backends keep and others flush.
  rho = jnp.where(log_rho <= -bound, jnp.zeros((), dtype), jnp.exp(log_rho))
  return ImportanceRatios(rho=rho, log_rho=log_rho)


CLIP_RTOL = 1e-5
"""Relative tolerance of `exceeds_threshold`: rho counts as clipped only above
threshold * (1 + CLIP_RTOL)."""


def exceeds_threshold(rho: jax.Array, threshold, *, rtol: float = CLIP_RTOL) -> jax.Array:
  """Whether each ratio exceeds `threshold` by more than float noise (bool, like `rho`).

  A diagnostic, not part of any estimator (the estimators clip with `min(threshold,
  rho)`, where a ratio of 1 + 1e-7 changes nothing). On-policy data gives ratios
  exp(log pi - log mu) = 1 +- a few float32 ulps (about 1e-7), so `rho > 1.0` would
  count a random part of them as clipped; this counts rho > threshold * (1 + rtol).
  The default rtol = 1e-5 is about 100 float32 ulps, far below any truncation that
  matters.

  Args:
    rho: importance ratios [T, ...] (>= 0).
    threshold: the truncation level (rho-bar, c) > 0: a scalar, or an array of `rho`'s
      rank that broadcasts to its shape (as the estimators' thresholds).
    rtol: relative tolerance >= 0.

  Returns:
    bool [T, ...]: rho > threshold * (1 + rtol).
  """
  _checks.check_floating("rho", rho)
  _checks.check_positive("threshold", threshold, jnp.shape(rho), dtype=jnp.result_type(rho))
  _checks.check_non_negative("rtol", rtol)
  return rho > threshold * (1.0 + rtol)


def categorical_importance_ratios(
    pi_logits: jax.Array,
    mu_logits: jax.Array,
    actions: jax.Array,
    *,
    stop_gradient: bool = True,
) -> ImportanceRatios:
  """Importance ratios of categorical policies from logits, in log space.

  Args:
    pi_logits: target-policy logits [T, ..., A].
    mu_logits: behaviour-policy logits [T, ..., A].
    actions: taken actions, int [T, ...] in [0, A) (checked as in
      `categorical_log_prob`).
    stop_gradient: stop gradients through the ratios.

  Returns:
    `ImportanceRatios`, as `importance_ratios_from_log_probs` gives them (log_rho
    clamped to keep rho finite).
  """
  _checks.check_shape("mu_logits", mu_logits, jnp.shape(pi_logits), "`pi_logits`")
  return importance_ratios_from_log_probs(
      log_prob_of(pi_logits, actions, "pi_logits", "actions"),
      log_prob_of(mu_logits, actions, "mu_logits", "actions"),
      stop_gradient=stop_gradient,
  )


def categorical_entropy(logits: jax.Array) -> jax.Array:
  """Entropy -sum_a p log p over the last axis; -inf logits contribute 0.

  Safe for -inf logits in value and gradient (the p log p term of an
  impossible action is 0, with a zero gradient, not NaN); NaN logits give NaN.
  """
  _checks.check_floating("logits", logits)
  _checks.check_min_rank("logits", logits, 1, "a trailing action axis [..., A]")
  log_p = jax.nn.log_softmax(logits, axis=-1)
  possible = ~jnp.isneginf(log_p)  # NaN stays NaN
  safe_log_p = jnp.where(possible, log_p, jnp.zeros((), log_p.dtype))
  p = jnp.exp(safe_log_p) * possible
  return -jnp.sum(p * safe_log_p, axis=-1)


def categorical_kl(p_logits: jax.Array, q_logits: jax.Array) -> jax.Array:
  """KL(p || q) over the last axis of two logits arrays [..., A]; actions impossible under
  p (-inf logits) contribute 0, NaN logits give NaN."""
  _checks.check_floating("p_logits", p_logits)
  _checks.check_floating("q_logits", q_logits)
  _checks.check_min_rank("p_logits", p_logits, 1, "a trailing action axis [..., A]")
  _checks.check_shape("q_logits", q_logits, jnp.shape(p_logits), "`p_logits`")
  log_p = jax.nn.log_softmax(p_logits, axis=-1)
  log_q = jax.nn.log_softmax(q_logits, axis=-1)
  possible = ~jnp.isneginf(log_p)  # NaN stays NaN
  zero = jnp.zeros((), log_p.dtype)
  p = jnp.exp(jnp.where(possible, log_p, zero)) * possible
  diff = jnp.where(possible, log_p - log_q, zero)
  return jnp.sum(p * diff, axis=-1)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, actions: jax.Array) -> jax.Array:
  """Log-density of a diagonal Gaussian, summed over the last (action) axis.

  Args:
    mean: [..., D]; log_std: [..., D] (or broadcastable [D]); actions: [..., D].
  """
  _checks.check_floating("mean", mean)
  _checks.check_floating("log_std", log_std)
  _checks.check_floating("actions", actions)
  _checks.check_min_rank("mean", mean, 1, "a trailing action axis [..., D]")
  _checks.check_shape("actions", actions, jnp.shape(mean), "`mean`")
  log_std = _broadcast_log_std(log_std, mean)
  z = (actions - mean) * jnp.exp(-log_std)
  return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * _LOG_2PI, axis=-1)


def check_log_std_shape(log_std, mean, name: str = "log_std") -> None:
  """ValueError (naming `name`) unless log_std has mean's shape or [D] (state-independent)."""
  if tuple(jnp.shape(log_std)) not in (tuple(jnp.shape(mean)), tuple(jnp.shape(mean)[-1:])):
    raise ValueError(
        f"`{name}` must have shape {tuple(jnp.shape(mean))} or "
        f"{tuple(jnp.shape(mean)[-1:])} (matching the mean), got "
        f"{tuple(jnp.shape(log_std))}."
    )


def _broadcast_log_std(log_std, mean, name: str = "log_std"):
  """log_std of shape mean.shape or [D] (state-independent), broadcast to mean's."""
  check_log_std_shape(log_std, mean, name)
  return jnp.broadcast_to(log_std, jnp.shape(mean))


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
  """Entropy of a diagonal Gaussian, summed over the last axis."""
  _checks.check_floating("log_std", log_std)
  _checks.check_min_rank("log_std", log_std, 1, "a trailing action axis [..., D]")
  return jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI), axis=-1)


def gaussian_kl(mean_p, log_std_p, mean_q, log_std_q) -> jax.Array:
  """KL(p || q) of diagonal Gaussians, summed over the last axis.

  Means are [..., D]; log-stds are [..., D] or [D].
  """
  for name, x in [
      ("mean_p", mean_p),
      ("log_std_p", log_std_p),
      ("mean_q", mean_q),
      ("log_std_q", log_std_q),
  ]:
    _checks.check_floating(name, x)
  _checks.check_min_rank("mean_p", mean_p, 1, "a trailing action axis [..., D]")
  _checks.check_shape("mean_q", mean_q, jnp.shape(mean_p), "`mean_p`")
  log_std_p = _broadcast_log_std(log_std_p, mean_p, "log_std_p")
  log_std_q = _broadcast_log_std(log_std_q, mean_p, "log_std_q")
  var_p = jnp.exp(2 * log_std_p)
  var_q = jnp.exp(2 * log_std_q)
  return jnp.sum(
      log_std_q - log_std_p + (var_p + jnp.square(mean_p - mean_q)) / (2 * var_q) - 0.5, axis=-1
  )
