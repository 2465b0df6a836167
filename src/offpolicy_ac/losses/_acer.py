"""ACER: truncated importance sampling with bias correction, Q^ret, trust region.

See "Sample Efficient Actor-Critic with Experience Replay" by Wang et al.
(https://arxiv.org/abs/1611.01224). Targets use the general off-policy return
of `_retrace` (Q^ret: c = min(1, rho); continuous Q^ret: c = min(1, rho^(1/d));
Q^opc: c = 1). Every per-step function returns [T, ...] arrays; reduce them
with `weighted_mean` and the step weights. Given the `mask`, a per-step function returns 0
at the masked steps and gives their inputs a zero gradient, whatever they hold (NaN, inf).
"""

from __future__ import annotations

from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses._actions import select_action
from offpolicy_ac.losses._distributions import probability_floor
from offpolicy_ac.losses._masking import where_used
from offpolicy_ac.losses._retrace import general_off_policy_returns
from offpolicy_ac.losses._retrace import retrace_targets


def acer_q_ret(
    q_t: jax.Array,
    a_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    pi_t: jax.Array,
    mu_t: jax.Array,
    *,
    mask: jax.Array | None = None,
    eps: float = 1e-8,
    method: str = "auto",
) -> jax.Array:
  """ACER's Q^ret targets (discrete): Retrace with lambda = 1, V = sum_a pi Q.

      Q^ret_s = r_{s+1} + gamma_{s+1} [min(1, rho_{s+1}) (Q^ret_{s+1} -
                Q(x_{s+1}, a_{s+1})) + V(x_{s+1})]

  Arguments as in `retrace_targets`; returns [T, ...] with stopped gradients.
  """
  return retrace_targets(
      q_t,
      a_t,
      r_t,
      discount_t,
      pi_t,
      mu_t,
      mask=mask,
      lambda_=1.0,
      eps=eps,
      stop_target_gradients=True,
      method=method,
  )


def _safe_log(x: jax.Array) -> jax.Array:
  """log(x) for x > 0 and 0 elsewhere, with a finite gradient everywhere."""
  positive = x > 0
  return jnp.where(positive, jnp.log(jnp.where(positive, x, 1.0)), 0.0)


def acer_policy_objective(
    pi_tm1: jax.Array,
    mu_tm1: jax.Array,
    a_tm1: jax.Array,
    q_tm1: jax.Array,
    q_ret_tm1: jax.Array,
    *,
    clip_c=10.0,
    eps: float = 1e-8,
    mask: jax.Array | None = None,
) -> jax.Array:
  """Per-step ACER policy objective (to maximise) with bias correction.

      min(c, rho(a_s)) (Q^ret_s - V(x_s)) log pi(a_s|x_s)
      + sum_a [1 - c / rho(a)]_+ pi(a|x_s) (Q(x_s, a) - V(x_s)) log pi(a|x_s)

  with rho(a) = pi(a|x_s) / mu(a|x_s) and V = sum_a pi Q. Every coefficient is a
  constant; gradients flow only through log pi (i.e. through `pi_tm1`).

  Args:
    pi_tm1: learner probabilities [T, ..., A] at times [0, T-1].
    mu_tm1: behaviour probabilities [T, ..., A] at times [0, T-1].
    a_tm1: taken actions int [T, ...] in [0, A): checked when concrete
      (ValueError); under `jit` an out-of-range action makes the objective NaN,
      and `jax.experimental.checkify.checkify` reports it (see `take_action`).
    q_tm1: Q(x_s, .) [T, ..., A]; may be -inf (an illegal action) where `pi_tm1` is 0,
      as in `acer_q_ret`.
    q_ret_tm1: Q^ret_s [T, ...].
    clip_c: truncation c > 0 (10 in the paper): a scalar, or an array of `a_tm1`'s rank
      that broadcasts to its shape (per step: [T, 1, ...]).
    eps: added to mu before dividing (at least the dtype's smallest normal number, so
      that a probability of 0 in float16 does not divide by 0).
    mask: optional bool [T, ...] (`a_tm1`'s shape), False where step s is not a real
      transition: 0 there.
  """
  for name, x in [
      ("pi_tm1", pi_tm1),
      ("mu_tm1", mu_tm1),
      ("q_tm1", q_tm1),
      ("q_ret_tm1", q_ret_tm1),
  ]:
    _checks.check_floating(name, x)
  _checks.check_integer("a_tm1", a_tm1)
  _checks.check_min_rank("pi_tm1", pi_tm1, 2, "[T, ..., A]")
  _checks.check_shape("mu_tm1", mu_tm1, jnp.shape(pi_tm1), "`pi_tm1`")
  _checks.check_shape("q_tm1", q_tm1, jnp.shape(pi_tm1), "`pi_tm1`")
  _checks.check_actions_of("a_tm1", a_tm1, "pi_tm1", pi_tm1)
  _checks.check_shape("q_ret_tm1", q_ret_tm1, jnp.shape(a_tm1), "`a_tm1`")
  dtype = jnp.result_type(pi_tm1, mu_tm1, q_tm1, q_ret_tm1)
  _checks.check_positive("clip_c", clip_c, jnp.shape(a_tm1), dtype=dtype)
  _checks.check_non_negative("eps", eps)
  used = _checks.check_mask(mask, jnp.shape(a_tm1), "`a_tm1`")
  _checks.check_action_range("a_tm1", a_tm1, jnp.shape(pi_tm1)[-1], "`pi_tm1`", where=used)
  a_tm1 = jnp.asarray(a_tm1)
  # Probabilities, not logits or log-probabilities: a log-probability (< 0) would be read as
  # a probability of 0 (no log pi, no gradient), and the objective would be silently 0.
  for name, x in [("pi_tm1", pi_tm1), ("mu_tm1", mu_tm1)]:
    _checks.check_probabilities(name, x, where=used[..., None])
  pi_tm1, mu_tm1 = where_used(used, pi_tm1, 1.0), where_used(used, mu_tm1, 1.0)
  q_tm1, q_ret_tm1 = where_used(used, q_tm1), where_used(used, q_ret_tm1)
  # c takes the inputs' dtype (a NumPy float64 c made float32 inputs' objective float64).
  clip_c = jnp.asarray(clip_c, dtype)
  clip_c_a = clip_c if not jnp.ndim(clip_c) else jnp.asarray(clip_c)[..., None]  # [T, ..., 1]

  sg = jax.lax.stop_gradient
  log_pi = _safe_log(pi_tm1)
  pi_c = sg(pi_tm1)
  # An action pi never takes may have a Q of -inf (an illegal action, as `acer_q_ret`
  # allows): its terms are 0, not 0 x -inf = NaN.
  q_c = sg(jnp.where(pi_c > 0, q_tm1, jnp.zeros((), q_tm1.dtype)))
  rho = pi_c / (sg(mu_tm1) + probability_floor(eps, pi_c.dtype))
  v = jnp.sum(pi_c * q_c, axis=-1)
  rho_a = select_action(rho, a_tm1)
  truncated = jnp.minimum(clip_c, rho_a) * (sg(q_ret_tm1) - v)
  term1 = truncated * select_action(log_pi, a_tm1)
  # [1 - c/rho]_+ written as [rho - c]_+ / rho, 0 where rho = 0.
  correction = jnp.where(rho > 0, jax.nn.relu(rho - clip_c_a) / jnp.where(rho > 0, rho, 1.0), 0.0)
  coeff = correction * pi_c * (q_c - v[..., None])
  term2 = jnp.sum(jnp.where(coeff != 0, coeff * log_pi, 0.0), axis=-1)
  return jnp.where(used, term1 + term2, 0.0)


def acer_policy_loss(
    pi_tm1, mu_tm1, a_tm1, q_tm1, q_ret_tm1, *, clip_c=10.0, eps: float = 1e-8, mask=None
) -> jax.Array:
  """Per-step ACER policy loss without trust region: -acer_policy_objective."""
  return -acer_policy_objective(
      pi_tm1, mu_tm1, a_tm1, q_tm1, q_ret_tm1, clip_c=clip_c, eps=eps, mask=mask
  )


def trust_region_projection(g: jax.Array, k: jax.Array, delta) -> jax.Array:
  """ACER's closed-form trust-region step over the last axis.

      z* = g - max(0, (k.g - delta) / |k|^2) k

  Args:
    g: objective gradients w.r.t. the policy statistics [..., K].
    k: gradients of KL(average policy || policy) w.r.t. the same [..., K].
    delta: trust-region size >= 0: a scalar, or an array of g.shape[:-1]'s rank that
      broadcasts to it.
  """
  _checks.check_shape("k", k, jnp.shape(g), "`g`")
  _checks.check_non_negative("delta", delta, jnp.shape(g)[:-1])
  kg = jnp.sum(k * g, axis=-1, keepdims=True)
  kk = jnp.sum(k * k, axis=-1, keepdims=True)
  delta = jnp.asarray(delta, jnp.result_type(g, k))  # float32 stays float32 (not float64)
  delta_k = delta if not jnp.ndim(delta) else delta[..., None]  # [..., 1]
  scale = jax.nn.relu(kg - delta_k) / jnp.where(kk > 0, kk, 1.0)
  return g - jnp.where(kk > 0, scale, 0.0) * k


class TrustRegionOutput(NamedTuple):
  """Per-step surrogate loss (its gradient is -z* . dstats/dtheta) and stats."""

  surrogate: jax.Array  # [T, ...]
  objective: jax.Array  # [T, ...]
  kl: jax.Array  # [T, ...]
  active: jax.Array  # [T, ...] bool, where the projection changed g


def trust_region_surrogate(
    objective_fn: Callable[[jax.Array], jax.Array],
    kl_fn: Callable[[jax.Array], jax.Array],
    stats: jax.Array,
    *,
    delta,
    mask: jax.Array | None = None,
) -> TrustRegionOutput:
  """Backpropagates ACER's projected gradient z* through policy statistics.

  `objective_fn(stats)` and `kl_fn(stats)` map statistics [T, ..., K] to
  per-step values [T, ...], each step depending only on its own statistics
  (so the gradient of their sums is the per-step gradient). The returned
  surrogate has gradient -z* w.r.t. `stats`; minimising it ascends the
  objective inside the trust region KL(average || pi) <= delta (linearised).

  `mask` (optional bool [T, ...]): False where step s is not a real transition. Its
  outputs are 0 there (`active` False) and its statistics get a zero gradient, whatever
  `objective_fn` and `kl_fn` compute there; what `stats` are computed from is the
  caller's to clean (`acer_trust_region_policy_loss` does).
  """
  _checks.check_floating("stats", stats)
  _checks.check_min_rank("stats", stats, 1, "a trailing statistics axis [..., K]")
  used = _checks.check_mask(mask, jnp.shape(stats)[:-1], "`stats` without its last axis")
  stats = where_used(used, stats)
  per_step = jnp.shape(stats)[:-1]
  for name, fn in (("objective_fn", objective_fn), ("kl_fn", kl_fn)):
    out = jax.eval_shape(fn, stats)
    if getattr(out, "shape", None) != per_step:  # a sum would spread one total over steps
      got = getattr(out, "shape", type(out).__name__)
      raise ValueError(f"`{name}(stats)` must give one value per step, of shape {per_step} "
                       f"(`stats`' without its last axis), got {got}.")  # fmt: skip
  sg = jax.lax.stop_gradient
  g = sg(jax.grad(lambda s: jnp.sum(objective_fn(s)))(stats))
  k = sg(jax.grad(lambda s: jnp.sum(kl_fn(s)))(stats))
  g, k = where_used(used, g), where_used(used, k)
  objective = jnp.where(used, sg(objective_fn(stats)), 0.0)
  z = trust_region_projection(g, k, delta)
  # A NaN objective (an out-of-range action under `jit`) can have a finite gradient (a
  # `where` gives the NaN branch none): the step's surrogate and gradient are NaN too.
  z = jnp.where(jnp.isnan(objective)[..., None], jnp.nan, z)
  surrogate = -jnp.sum(sg(z) * stats, axis=-1)
  kg = jnp.sum(k * g, axis=-1)
  return TrustRegionOutput(
      surrogate=surrogate,
      objective=objective,
      kl=jnp.where(used, sg(kl_fn(stats)), 0.0),
      active=(kg > delta) & (jnp.sum(k * k, axis=-1) > 0) & used,
  )


def acer_trust_region_policy_loss(
    logits_tm1: jax.Array,
    avg_logits_tm1: jax.Array,
    mu_tm1: jax.Array,
    a_tm1: jax.Array,
    q_tm1: jax.Array,
    q_ret_tm1: jax.Array,
    *,
    clip_c=10.0,
    delta=1.0,
    eps: float = 1e-8,
    mask: jax.Array | None = None,
) -> TrustRegionOutput:
  """Discrete ACER policy loss with the trust region, per step [T, ...].

  The statistics are the policy's probabilities f = softmax(logits) (as in the
  paper); k = d KL(f_avg || f) / d f = -f_avg / f.

  Args:
    logits_tm1: learner logits [T, ..., A].
    avg_logits_tm1: logits of the average policy network [T, ..., A].
    mu_tm1: behaviour probabilities [T, ..., A].
    a_tm1, q_tm1, q_ret_tm1, clip_c, eps, mask: as in `acer_policy_objective`.
    delta: trust-region size >= 0 (1 in the paper).
  """
  _checks.check_shape("avg_logits_tm1", avg_logits_tm1, jnp.shape(logits_tm1), "`logits_tm1`")
  _checks.check_integer("a_tm1", a_tm1)
  _checks.check_actions_of("a_tm1", a_tm1, "logits_tm1", logits_tm1)
  used = _checks.check_mask(mask, jnp.shape(a_tm1), "`a_tm1`")
  _checks.check_action_range("a_tm1", a_tm1, jnp.shape(logits_tm1)[-1], "`logits_tm1`",
                             where=used)  # fmt: skip
  logits_tm1, avg_logits_tm1 = where_used(used, logits_tm1), where_used(used, avg_logits_tm1)
  f_avg = jax.lax.stop_gradient(jax.nn.softmax(avg_logits_tm1, axis=-1))
  log_f_avg = _safe_log(f_avg)

  def objective_fn(f):
    return acer_policy_objective(
        f, mu_tm1, a_tm1, q_tm1, q_ret_tm1, clip_c=clip_c, eps=eps, mask=used
    )

  def kl_fn(f):
    terms = jnp.where(f_avg > 0, f_avg * (log_f_avg - _safe_log(f)), 0.0)
    return jnp.sum(terms, axis=-1)

  return trust_region_surrogate(
      objective_fn, kl_fn, jax.nn.softmax(logits_tm1, axis=-1), delta=delta, mask=used
  )


def acer_value_loss(
    q_tm1: jax.Array, a_tm1: jax.Array, q_ret_tm1: jax.Array, *, mask: jax.Array | None = None
) -> jax.Array:
  """Per-step critic loss 1/2 (Q^ret_s - Q(x_s, a_s))^2, [T, ...].

  Args:
    q_tm1: Q(x_s, .) [T, ..., A].
    a_tm1: taken actions int [T, ...] in [0, A): checked when concrete
      (ValueError); under `jit` an out-of-range action makes its loss NaN, and
      `jax.experimental.checkify.checkify` reports it (see `take_action`).
    q_ret_tm1: Q^ret_s [T, ...] (a constant).
    mask: optional bool [T, ...], False where step s is not a real transition: 0 there.
  """
  _checks.check_floating("q_tm1", q_tm1)
  _checks.check_floating("q_ret_tm1", q_ret_tm1)
  _checks.check_integer("a_tm1", a_tm1)
  _checks.check_min_rank("q_tm1", q_tm1, 1, "a trailing action axis [..., A]")
  _checks.check_actions_of("a_tm1", a_tm1, "q_tm1", q_tm1)
  _checks.check_shape("q_ret_tm1", q_ret_tm1, jnp.shape(a_tm1), "`a_tm1`")
  used = _checks.check_mask(mask, jnp.shape(a_tm1), "`a_tm1`")
  _checks.check_action_range("a_tm1", a_tm1, jnp.shape(q_tm1)[-1], "`q_tm1`", where=used)
  q_a = select_action(where_used(used, q_tm1), jnp.asarray(a_tm1))
  # 0 at a masked step even where its action is out of range under `jit` (q_a is NaN).
  return jnp.where(
      used, 0.5 * jnp.square(jax.lax.stop_gradient(where_used(used, q_ret_tm1)) - q_a), 0.0
  )


class AcerContinuousTargets(NamedTuple):
  """Q^ret (critic target) and Q^opc (policy-gradient target), [T, ...]."""

  q_ret: jax.Array
  q_opc: jax.Array


def acer_continuous_targets(
    q_a_t: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    log_rho_t: jax.Array,
    *,
    action_dim: int,
    mask: jax.Array | None = None,
    method: str = "auto",
) -> AcerContinuousTargets:
  """Continuous ACER's Q^ret (c = min(1, rho^(1/d))) and Q^opc (c = 1).

  Args:
    q_a_t: SDN's Q~(x_{s+1}, a_{s+1}) at times [1, T], [T, ...].
    v_t: V(x_{s+1}) at times [1, T].
    r_t: rewards at times [1, T].
    discount_t: gamma times environment discount at times [1, T].
    log_rho_t: log pi(a_{s+1}|x_{s+1}) - log mu(a_{s+1}|x_{s+1}), times [1, T].
    action_dim: d >= 1, the action dimension.
    mask: optional bool [T, ...], False where step s is not a real transition.
    method: "auto", "scan" or "associative" (see `reverse_linear_recurrence`).
  """
  action_dim = _checks.static_int("action_dim", action_dim, 1)
  _checks.check_floating_alike([("r_t", r_t), ("log_rho_t", log_rho_t)])
  _checks.check_shape("log_rho_t", log_rho_t, jnp.shape(r_t), "`r_t`")
  c_ret = jnp.exp(jnp.minimum(0.0, log_rho_t / action_dim))
  q_ret = general_off_policy_returns(q_a_t, v_t, r_t, discount_t, c_ret, mask=mask, method=method)
  q_opc = general_off_policy_returns(
      q_a_t, v_t, r_t, discount_t, jnp.ones_like(r_t), mask=mask, method=method
  )
  return AcerContinuousTargets(q_ret=q_ret, q_opc=q_opc)


def sdn_q_value(v: jax.Array, adv_a: jax.Array, adv_samples: jax.Array) -> jax.Array:
  """Stochastic dueling network: Q~(x, a) = V(x) + A(x, a) - mean_i A(x, u_i).

  Args:
    v: V(x) [...].
    adv_a: A(x, a) for the action of interest [...].
    adv_samples: A(x, u_i) for n actions u_i ~ pi(.|x), [..., n].
  """
  _checks.check_shape("adv_a", adv_a, jnp.shape(v), "`v`")
  _checks.check_shape(
      "adv_samples",
      adv_samples,
      jnp.shape(v) + (jnp.shape(adv_samples)[-1],),
      "`v` plus a samples axis",
  )
  _checks.check_nonempty("adv_samples", adv_samples, -1, "samples")
  return v + adv_a - jnp.mean(adv_samples, axis=-1)


def acer_continuous_policy_objective(
    log_pi_a: jax.Array,
    log_pi_sample: jax.Array,
    log_rho_a: jax.Array,
    log_rho_sample: jax.Array,
    q_opc: jax.Array,
    q_sample: jax.Array,
    v: jax.Array,
    *,
    clip_c=10.0,
    mask: jax.Array | None = None,
) -> jax.Array:
  """Per-step continuous ACER objective (to maximise), [T, ...].

      min(c, rho(a_s)) (Q^opc_s - V(x_s)) log pi(a_s|x_s)
      + [1 - c / rho(a')]_+ (Q~(x_s, a') - V(x_s)) log pi(a'|x_s),  a' ~ pi

  Gradients flow only through `log_pi_a` and `log_pi_sample` (with a' fixed). Every
  argument is [T, ...]; `mask` (optional bool [T, ...]): False where step s is not a real
  transition, 0 there.
  """
  names = [
      ("log_pi_a", log_pi_a),
      ("log_pi_sample", log_pi_sample),
      ("log_rho_a", log_rho_a),
      ("log_rho_sample", log_rho_sample),
      ("q_opc", q_opc),
      ("q_sample", q_sample),
      ("v", v),
  ]
  for name, x in names:
    _checks.check_floating(name, x)
  shape = _checks.check_same_shape(names)
  _checks.check_positive("clip_c", clip_c, shape, dtype=jnp.result_type(log_rho_a))
  used = _checks.check_mask(mask, shape, "`log_pi_a`")
  log_pi_a, log_pi_sample, log_rho_a, log_rho_sample, q_opc, q_sample, v = (
      where_used(used, x) for _, x in names
  )
  sg = jax.lax.stop_gradient
  log_c = jnp.log(jnp.asarray(clip_c, log_rho_a.dtype))
  rho_a_trunc = jnp.exp(jnp.minimum(log_c, sg(log_rho_a)))
  correction = jax.nn.relu(1.0 - jnp.exp(log_c - sg(log_rho_sample)))
  v = sg(v)
  objective = rho_a_trunc * (sg(q_opc) - v) * log_pi_a
  return objective + correction * (sg(q_sample) - v) * log_pi_sample


def acer_continuous_value_losses(
    q_tilde_a: jax.Array,
    v: jax.Array,
    q_ret: jax.Array,
    log_rho_a: jax.Array,
    *,
    mask: jax.Array | None = None,
) -> jax.Array:
  """Per-step SDN critic loss: 1/2 (Q^ret - Q~)^2 + 1/2 (V_target - V)^2.

  V_target = min(1, rho(a_s)) (Q^ret_s - Q~(x_s, a_s)) + V(x_s) (constants). Every
  argument is [T, ...]; `mask` (optional bool [T, ...]): False where step s is not a real
  transition, 0 there.
  """
  names = [("q_tilde_a", q_tilde_a), ("v", v), ("q_ret", q_ret), ("log_rho_a", log_rho_a)]
  for name, x in names:
    _checks.check_floating(name, x)
  used = _checks.check_mask(mask, _checks.check_same_shape(names), "`q_tilde_a`")
  q_tilde_a, v, q_ret, log_rho_a = (where_used(used, x) for _, x in names)
  sg = jax.lax.stop_gradient
  q_ret = sg(q_ret)
  v_target = sg(jnp.exp(jnp.minimum(0.0, log_rho_a)) * (q_ret - q_tilde_a) + v)
  return 0.5 * jnp.square(q_ret - q_tilde_a) + 0.5 * jnp.square(v_target - v)
