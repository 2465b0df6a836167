"""V-trace targets and policy-gradient advantages (IMPALA).

See "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures" by Espeholt et al. (https://arxiv.org/abs/1802.01561),
with the lambda mixing of AlphaStar ("Grandmaster level in StarCraft II using
multi-agent reinforcement learning", Vinyals et al. 2019).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses._masking import where_used
from offpolicy_ac.losses._recurrence import reverse_linear_recurrence
from offpolicy_ac.losses._recurrence import shift_to_previous


class VTraceOutput(NamedTuple):
  """V-trace outputs, each [T, ...] for transitions at times [0, T-1].

  errors: v_s - v_tm1 where v_s is the V-trace target (0 at masked steps).
  pg_advantage: min(rho_bar_pg, rho_tm1) * (q_estimate - v_tm1) (0 at masked steps).
  q_estimate: r_t + discount_t * v_{s+1}, with v_{s+1} = v_t where the trace is
    cut (the next step is masked) or at the end of the sequence (0 at masked steps).
  """

  errors: jax.Array
  pg_advantage: jax.Array
  q_estimate: jax.Array


def vtrace(
    v_tm1: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    rho_tm1: jax.Array,
    *,
    mask: jax.Array | None = None,
    lambda_=1.0,
    clip_rho_threshold=1.0,
    clip_c_threshold=1.0,
    clip_pg_rho_threshold=1.0,
    stop_target_gradients: bool = True,
    method: str = "auto",
) -> VTraceOutput:
  """V-trace errors, policy-gradient advantages and Q estimates.

  With rho_s = min(rho_bar, pi/mu), c_s = lambda * min(c_bar, pi/mu) and
  delta_s = rho_s * (r_{s+1} + gamma_{s+1} V(x_{s+1}) - V(x_s)):

      v_s - V(x_s) = delta_s + gamma_{s+1} c_s (v_{s+1} - V(x_{s+1}))

  computed with one reverse linear recurrence. A step with `mask=False` is not
  a transition (the auto-reset step after an episode's last step): it gets zero
  error and zero advantage and cuts the trace, so a batch of episodes joined at
  masked steps gives exactly the per-episode results. Its inputs may hold anything
  (NaN, inf): they change neither the outputs nor the gradients at the real steps
  (`stop_target_gradients=False` too), and get a zero gradient.

  All arrays share the shape [T, ...] (time-major; any trailing batch axes).

  Args:
    v_tm1: values V(x_s) at times [0, T-1].
    v_t: values V(x_{s+1}) at times [1, T] (the bootstrap; at a time-limit
      truncation this is the value of the true final observation).
    r_t: rewards at times [1, T].
    discount_t: gamma times the environment discount at times [1, T] (0 at a
      termination, gamma at a truncation).
    rho_tm1: importance ratios pi(a_s|x_s) / mu(a_s|x_s) at times [0, T-1].
    mask: optional bool, False where step s is not a real transition.
    lambda_: trace mixing in [0, 1]: a scalar, or an array of the inputs' rank that
      broadcasts to [T, ...] (per step: [T, 1, ...]).
    clip_rho_threshold: rho_bar > 0, truncation of the value-target weights.
    clip_c_threshold: c_bar > 0, truncation of the trace coefficients.
    clip_pg_rho_threshold: rho_bar_pg > 0, truncation of the pg weights.
      The three thresholds are scalars or arrays as `lambda_`, cast to the inputs' dtype;
      `float("inf")` truncates nothing (where other V-trace code takes None).
    stop_target_gradients: stop gradients through v_s and q_estimate.
    method: "auto", "scan" or "associative" (see `reverse_linear_recurrence`).

  Returns:
    A `VTraceOutput` of [T, ...] arrays. With lambda = 1, c_bar = 1 and no mask
    it equals `rlax.vtrace_td_error_and_advantage`; below lambda = 1 the errors still do,
    but rlax bootstraps the advantage from lambda * v_{s+1} + (1 - lambda) * V(x_{s+1}).
  """
  names = [
      ("v_tm1", v_tm1),
      ("v_t", v_t),
      ("r_t", r_t),
      ("discount_t", discount_t),
      ("rho_tm1", rho_tm1),
  ]
  _checks.check_floating_alike(names)
  _checks.check_time_major("v_tm1", v_tm1)
  shape = _checks.check_same_shape(names)
  mask = _checks.check_mask(mask, shape)
  _checks.check_discounts(discount_t, mask)
  _checks.check_entries("rho_tm1", rho_tm1, 0.0, what=" (importance ratios)", where=mask)
  _checks.check_in_unit_interval("lambda_", lambda_, shape)
  dtype = jnp.result_type(v_tm1)
  # Cast to the inputs' dtype below: a threshold that rounds to 0 there is refused (inf,
  # which truncates nothing, is allowed).
  _checks.check_positive("clip_rho_threshold", clip_rho_threshold, shape, dtype=dtype)
  _checks.check_positive("clip_c_threshold", clip_c_threshold, shape, dtype=dtype)
  _checks.check_positive("clip_pg_rho_threshold", clip_pg_rho_threshold, shape, dtype=dtype)

  mask_next = shift_to_previous(mask, False)
  # Array thresholds (a sweep's) take the inputs' dtype, as `lambda_` does below.
  clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold = (
      jnp.asarray(x, dtype) for x in (clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold)
  )
  zero = jnp.zeros((), dtype)
  # Every input is read at its own step only: a masked step's are replaced before any
  # arithmetic, so that their garbage (NaN, inf) reaches neither outputs nor gradients.
  v_tm1, v_t, r_t, discount_t, rho_tm1 = (
      where_used(mask, x) for x in (v_tm1, v_t, r_t, discount_t, rho_tm1)
  )

  rho_v = jnp.minimum(clip_rho_threshold, rho_tm1)
  c = (lambda_ * jnp.minimum(clip_c_threshold, rho_tm1)).astype(dtype)
  td = rho_v * (r_t + discount_t * v_t - v_tm1)
  b = jnp.where(mask, td, zero)
  a = jnp.where(mask & mask_next, discount_t * c, zero)
  err = reverse_linear_recurrence(a, b, method=method)

  vs = v_tm1 + err
  stop = _checks.static_flag("stop_target_gradients", stop_target_gradients)
  if stop:
    vs = jax.lax.stop_gradient(vs)
  vs_next = jnp.where(mask_next, shift_to_previous(vs, 0.0), v_t)
  q_estimate = r_t + discount_t * vs_next
  if stop:
    q_estimate = jax.lax.stop_gradient(q_estimate)
  rho_pg = jnp.minimum(clip_pg_rho_threshold, rho_tm1)
  pg_advantage = jnp.where(mask, rho_pg * (q_estimate - v_tm1), zero)
  errors = jnp.where(mask, vs - v_tm1, zero)
  q_estimate = jnp.where(mask, q_estimate, zero)
  return VTraceOutput(errors=errors, pg_advantage=pg_advantage, q_estimate=q_estimate)
