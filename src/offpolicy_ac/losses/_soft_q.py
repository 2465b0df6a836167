"""Soft Q-learning targets (SQL) and SQIL's reward relabelling.

See "Reinforcement Learning with Deep Energy-Based Policies" by Haarnoja et al.
(https://arxiv.org/abs/1702.08165) and "SQIL: Imitation Learning via
Reinforcement Learning with Sparse Rewards" by Reddy et al.
(https://arxiv.org/abs/1905.11108).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses._actions import max_actions
from offpolicy_ac.losses._actions import select_action
from offpolicy_ac.losses._actions import sum_actions
from offpolicy_ac.losses._masking import where_used
from offpolicy_ac.losses._recurrence import reverse_linear_recurrence
from offpolicy_ac.losses._recurrence import shift_to_previous


def _per_action(alpha: jax.Array) -> jax.Array:
  """A scalar stays a scalar; an array [...] becomes [..., 1] to meet [..., A]."""
  return alpha if alpha.ndim == 0 else alpha[..., None]


def soft_value(q: jax.Array, alpha) -> jax.Array:
  """Soft state value V = alpha * logsumexp(Q / alpha) over the last axis.

  Stable for any finite `q` and alpha > 0 (tested down to alpha = 1e-4 with
  |q| up to 1e4): the maximum is subtracted inside `logsumexp`, so nothing is
  clamped. Entries of -inf (illegal actions) are ignored; all -inf gives -inf.
  float16 and bfloat16 `q` are computed in float32 (value and gradient), returned in
  their own dtype.

  Args:
    q: action values [..., A].
    alpha: temperature > 0 and finite (ValueError otherwise, for concrete values): a scalar,
      or an array of q.shape[:-1]'s rank that broadcasts to it.

  Returns:
    soft values of shape q.shape[:-1]. As alpha -> 0 this tends to max_a Q.
  """
  _checks.check_floating("q", q)
  _checks.check_min_rank("q", q, 1, "a trailing action axis [..., A]")
  _checks.check_nonempty("q", q, -1, "actions")
  _checks.check_positive("alpha", alpha, jnp.shape(q)[:-1], finite=True, dtype=jnp.result_type(q))
  dtype = jnp.result_type(q)
  # Half precision is computed in float32: the backward pass multiplies the incoming
  # gradient by alpha before dividing by it, which overflows float16 from alpha ~ 1e3.
  wide = jnp.promote_types(dtype, jnp.float32)
  q, alpha = jnp.asarray(q, wide), jnp.asarray(alpha, dtype).astype(wide)
  m = _finite_max(q)
  # (q - m) / alpha <= 0, with its maximum 0 where m is finite: the sum of exponentials
  # cannot overflow, so no second maximum is subtracted.
  v = m + alpha * jnp.log(sum_actions(jnp.exp((q - m[..., None]) / _per_action(alpha))))
  return v.astype(dtype)


def _finite_max(q: jax.Array) -> jax.Array:
  """max_a Q [...] (gradient stopped; 0 where it is not finite), subtracted before dividing
  by alpha, so that Q / alpha cannot overflow (float16's maximum is 65504)."""
  m = jax.lax.stop_gradient(max_actions(q))
  return jnp.where(jnp.isfinite(m), m, jnp.zeros((), m.dtype))


def soft_policy(q: jax.Array, alpha) -> jax.Array:
  """Boltzmann policy pi(a|x) = softmax(Q / alpha) over the last axis, [..., A]; `alpha`
  as in `soft_value`."""
  _checks.check_floating("q", q)
  _checks.check_min_rank("q", q, 1, "a trailing action axis [..., A]")
  _checks.check_nonempty("q", q, -1, "actions")
  _checks.check_positive("alpha", alpha, jnp.shape(q)[:-1], finite=True, dtype=jnp.result_type(q))
  alpha = jnp.asarray(alpha, dtype=jnp.result_type(q))
  return jax.nn.softmax((q - _finite_max(q)[..., None]) / _per_action(alpha), axis=-1)


def soft_q_targets(
    r_t: jax.Array,
    discount_t: jax.Array,
    q_t: jax.Array,
    *,
    alpha,
    lambda_=0.0,
    mask: jax.Array | None = None,
    stop_target_gradients: bool = True,
    method: str = "auto",
) -> jax.Array:
  """Soft lambda-returns, computed with one reverse linear recurrence.

      G_s = r_{s+1} + gamma_{s+1} ((1 - lambda) V_soft(x_{s+1}) + lambda G_{s+1})

  with V_soft = soft_value(q_t, alpha); the recursion bootstraps fully from
  V_soft at the end of the sequence and where the trace is cut (the next step
  is masked). lambda = 0 gives the one-step soft Bellman target.

  Args:
    r_t: rewards at times [1, T], [T, ...].
    discount_t: gamma times environment discount at times [1, T], [T, ...].
    q_t: Q(x_{s+1}, .) at times [1, T] (usually a target network), [T, ..., A].
    alpha: temperature > 0 and finite.
    lambda_: in [0, 1].
      `alpha` and `lambda_` are scalars, or arrays of `r_t`'s rank that broadcast to its
      shape (per step: [T, 1, ...]).
    mask: optional bool [T, ...]; False where step s is not a real
      transition. Its target is 0 and must not be learned from. Its inputs may hold
      anything (NaN, inf): they change neither the targets nor the gradients at the
      real steps, and get a zero gradient.
    stop_target_gradients: stop gradients through the targets.
    method: "auto", "scan" or "associative" (see `reverse_linear_recurrence`).

  Returns:
    targets G_s at times [0, T-1], shape [T, ...].
  """
  _checks.check_floating_alike([("r_t", r_t), ("discount_t", discount_t), ("q_t", q_t)])
  _checks.check_time_major("r_t", r_t)
  shape = tuple(jnp.shape(r_t))
  _checks.check_shape("discount_t", discount_t, shape, "`r_t`")
  _checks.check_action_values("q_t", q_t, shape)
  _checks.check_in_unit_interval("lambda_", lambda_, shape)
  _checks.check_positive("alpha", alpha, shape, finite=True, dtype=jnp.result_type(r_t))
  mask = _checks.check_mask(mask, shape)
  _checks.check_discounts(discount_t, mask)
  mask_next = shift_to_previous(mask, False)
  zero = jnp.zeros((), jnp.result_type(r_t))

  # A masked step's inputs are replaced before any arithmetic, so that their garbage
  # (NaN, inf) reaches neither the targets nor the gradients; its discount becomes 0.
  r_t, discount_t = where_used(mask, r_t), where_used(mask, discount_t)
  # Not bootstrapped where discount_t is 0 (masked steps too): a terminal state's V_soft may
  # be -inf (every action illegal), and 0 x -inf is NaN; its Q values are replaced before
  # the soft value, so that the gradient (stop_target_gradients=False) is 0 there, not NaN.
  bootstrapped = discount_t != 0
  q_t = jnp.where(bootstrapped[..., None], q_t, jnp.zeros((), q_t.dtype))
  v_t = jnp.where(bootstrapped, soft_value(q_t, alpha), zero)
  lam = jnp.where(mask_next, jnp.asarray(lambda_, r_t.dtype), zero)
  b = jnp.where(mask, r_t + discount_t * (1.0 - lam) * v_t, zero)
  a = jnp.where(mask, discount_t * lam, zero)
  targets = reverse_linear_recurrence(a, b, method=method)
  if _checks.static_flag("stop_target_gradients", stop_target_gradients):
    targets = jax.lax.stop_gradient(targets)
  return targets


def soft_nstep_targets(
    r_t: jax.Array,
    discount_t: jax.Array,
    q_t: jax.Array,
    *,
    alpha,
    n: int,
    mask: jax.Array | None = None,
    stop_target_gradients: bool = True,
) -> jax.Array:
  """n-step soft targets, truncated at the sequence end and at trace cuts.

      G^(n)_s = sum_{k<m} (prod_{j<k} gamma_{s+1+j}) r_{s+1+k}
                + (prod_{j<m} gamma_{s+1+j}) V_soft(x_{s+m}),

  with m = min(n, steps until the sequence ends or the next masked step).
  Computed with n-1 fused elementwise passes (n is static), not a loop over time.

  Args:
    r_t, discount_t, q_t, alpha, mask, stop_target_gradients: as in
      `soft_q_targets`.
    n: number of steps >= 1 (static Python int).

  Returns:
    targets at times [0, T-1], shape [T, ...] (0 at masked steps).
  """
  n = _checks.static_int("n", n, 1)
  one_step = soft_q_targets(
      r_t, discount_t, q_t, alpha=alpha, lambda_=0.0, mask=mask, stop_target_gradients=False
  )
  shape = tuple(jnp.shape(r_t))
  mask = _checks.check_mask(mask, shape)
  mask_next = shift_to_previous(mask, False)
  r_t, discount_t = where_used(mask, r_t), where_used(mask, discount_t)  # as in soft_q_targets
  targets = one_step
  zero = jnp.zeros((), one_step.dtype)
  # A return is cut at the sequence end: past n = T, more passes change nothing (and each
  # one is compiled: n in the thousands took minutes under jit).
  for _ in range(min(n, shape[0]) - 1):
    longer = r_t + discount_t * shift_to_previous(targets, 0.0)
    targets = jnp.where(mask & mask_next, longer, jnp.where(mask, one_step, zero))
  if _checks.static_flag("stop_target_gradients", stop_target_gradients):
    targets = jax.lax.stop_gradient(targets)
  return targets


def sql_nstep_td_error(
    q_tm1: jax.Array,
    a_tm1: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    q_t: jax.Array,
    *,
    alpha,
    n: int = 1,
    mask: jax.Array | None = None,
    stop_target_gradients: bool = True,
) -> jax.Array:
  """SQL's n-step soft TD error G^(n)_s - Q(x_s, a_s), shape [T, ...].

  The semantics of DI-engine's `q_nstep_sql_td_error` (n-step return
  bootstrapped from alpha * logsumexp(Q_target / alpha)) made stable: no clamping
  of infinities to +-20, a stable logsumexp instead, and episode junctions
  handled by `mask` (0 error at masked steps; no return crosses them).

  Args:
    q_tm1: Q(x_s, .) at times [0, T-1], [T, ..., A] (online network).
    a_tm1: actions a_s at times [0, T-1], int [T, ...] in [0, A): checked when
      concrete (ValueError); under `jit` an out-of-range action makes its error
      NaN, and `jax.experimental.checkify.checkify` reports it (see `take_action`).
    r_t: rewards at times [1, T].
    discount_t: gamma times environment discount at times [1, T].
    q_t: Q(x_{s+1}, .) at times [1, T], [T, ..., A] (target network).
    alpha: temperature > 0 and finite.
    n: steps of the return (static int >= 1).
    mask: optional bool [T, ...].
    stop_target_gradients: stop gradients through the targets.
  """
  _checks.check_floating_alike(
      [("q_tm1", q_tm1), ("r_t", r_t), ("discount_t", discount_t), ("q_t", q_t)]
  )
  _checks.check_integer("a_tm1", a_tm1)
  _checks.check_time_major("r_t", r_t)
  shape = tuple(jnp.shape(r_t))
  _checks.check_action_values("q_tm1", q_tm1, shape)
  _checks.check_shape("q_t", q_t, jnp.shape(q_tm1), "`q_tm1`")
  _checks.check_shape("a_tm1", a_tm1, shape, "`r_t`")
  mask = _checks.check_mask(mask, shape)
  _checks.check_action_range("a_tm1", a_tm1, jnp.shape(q_tm1)[-1], "`q_tm1`", where=mask)
  targets = soft_nstep_targets(
      r_t, discount_t, q_t, alpha=alpha, n=n, mask=mask, stop_target_gradients=stop_target_gradients
  )
  q_a_tm1 = select_action(jnp.asarray(q_tm1), jnp.asarray(a_tm1))
  return jnp.where(mask, targets - q_a_tm1, jnp.zeros((), q_a_tm1.dtype))


def sqil_rewards(is_demonstration: jax.Array, dtype=jnp.float32) -> jax.Array:
  """SQIL's relabelled rewards: 1 for demonstration data, 0 for agent data.

  Args:
    is_demonstration: bool array of any shape (e.g. [T, B]).
    dtype: floating dtype of the result.
  """
  _checks.check_bool("is_demonstration", is_demonstration)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"`dtype` must be a floating-point dtype, got {jnp.dtype(dtype)}.")
  return jnp.asarray(is_demonstration).astype(dtype)


def sqil_relabel(r_t: jax.Array, is_demonstration) -> jax.Array:
  """Replaces environment rewards by SQIL's: 1 on demonstrations, 0 otherwise.

  Args:
    r_t: rewards [T, ...] (only the shape and dtype are used: SQIL discards them).
    is_demonstration: bool: a Python bool, a scalar or one entry for the whole batch, an
      array of `r_t.shape[1:]` for whole sequences ([B] for r_t [T, B]; with T == B a [T]
      is read so too), or an array of r_t's rank that broadcasts to it (per step:
      [T, 1] or [T, B]; per sequence also [1, B]).

  Raises:
    ValueError: `is_demonstration` of any other shape (a per-step [T] for r_t [T, B] with
      T != B).
  """
  _checks.check_floating("r_t", r_t)
  is_demo = jnp.asarray(is_demonstration)
  _checks.check_bool("is_demonstration", is_demo)
  shape = jnp.shape(r_t)
  if jnp.size(is_demo) == 1:  # one flag for the whole batch
    is_demo = jnp.reshape(is_demo, ())
  if jnp.ndim(is_demo) and jnp.shape(is_demo) == shape[1:]:  # one flag per sequence
    is_demo = is_demo[None]
  elif jnp.ndim(is_demo):
    try:
      _checks.check_broadcasts("is_demonstration", is_demo, shape)
    except ValueError:
      raise ValueError(
          f"`is_demonstration` of shape {jnp.shape(is_demo)} must be a scalar, one flag per "
          f"sequence {shape[1:]} or an array of r_t's rank that broadcasts to {shape}"
      ) from None
  return jnp.broadcast_to(is_demo, shape).astype(jnp.result_type(r_t))
