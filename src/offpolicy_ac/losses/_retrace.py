"""General off-policy returns: Retrace, Q(lambda), tree-backup, ACER's Q^ret.

One return with different trace coefficients c_t (see "Safe and Efficient
Off-Policy Reinforcement Learning" by Munos et al.,
https://arxiv.org/abs/1606.02647):

    G_s = r_{s+1} + gamma_{s+1} [ V(x_{s+1}) - c_{s+1} Q(x_{s+1}, a_{s+1})
                                  + c_{s+1} G_{s+1} ]

Retrace: c = lambda min(1, pi/mu); Q(lambda): c = lambda; tree-backup:
c = lambda pi. ACER's Q^ret is Retrace with lambda = 1 and V = sum_a pi Q;
its continuous Q^opc uses c = 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from offpolicy_ac.losses import _checks
from offpolicy_ac.losses._actions import select_action
from offpolicy_ac.losses._actions import sum_actions
from offpolicy_ac.losses._distributions import probability_floor
from offpolicy_ac.losses._masking import where_used
from offpolicy_ac.losses._recurrence import reverse_linear_recurrence
from offpolicy_ac.losses._recurrence import shift_to_previous


def general_off_policy_returns(
    q_a_t: jax.Array,
    v_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    c_t: jax.Array,
    *,
    mask: jax.Array | None = None,
    stop_target_gradients: bool = True,
    method: str = "auto",
) -> jax.Array:
  """Off-policy return targets G_s for any trace coefficients c.

  All arrays [T, ...] (time-major, any trailing batch axes).

  Args:
    q_a_t: Q(x_{s+1}, a_{s+1}) at times [1, T] (only used where a trace continues, with
      c_t > 0: it may be -inf or NaN where c_t is 0).
    v_t: V(x_{s+1}) at times [1, T] (e.g. sum_a pi(a|x_{s+1}) Q(x_{s+1}, a)).
    r_t: rewards at times [1, T].
    discount_t: gamma times environment discount at times [1, T].
    c_t: trace coefficients c_{s+1} at times [1, T]; the last is unused.
    mask: optional bool, False where step s is not a real transition; such a
      step's target is 0 and nothing after it flows into earlier targets. Its inputs
      may hold anything (NaN, inf): they change neither the targets nor the gradients
      at the real steps, and get a zero gradient (as do q_a_t and c_t where unused).
    stop_target_gradients: stop gradients through the targets.
    method: "auto", "scan" or "associative" (see `reverse_linear_recurrence`).

  Returns:
    targets G_s at times [0, T-1], shape [T, ...].
  """
  names = [("q_a_t", q_a_t), ("v_t", v_t), ("r_t", r_t), ("discount_t", discount_t), ("c_t", c_t)]
  _checks.check_floating_alike([names[2]] + names[:2] + names[3:])
  _checks.check_time_major("r_t", r_t)
  shape = _checks.check_same_shape([names[2]] + names[:2] + names[3:])
  mask = _checks.check_mask(mask, shape)
  mask_next = shift_to_previous(mask, False)
  _checks.check_discounts(discount_t, mask)
  _checks.check_entries("c_t", c_t, 0.0, what=" (trace coefficients)", where=mask & mask_next)
  zero = jnp.zeros((), jnp.result_type(r_t))

  # Inputs are replaced where they are not read, before any arithmetic, so that garbage
  # there (NaN, inf) reaches neither the targets nor the gradients.
  continues = mask & mask_next  # the trace continues: only there are q_a_t and c_t read
  c_t = where_used(continues, c_t)
  # A trace cut (c = 0) reads no Q: it may be -inf there (an action pi never takes).
  q_a_t = where_used(continues & (c_t != 0), q_a_t)
  v_t, r_t, discount_t = (where_used(mask, x) for x in (v_t, r_t, discount_t))
  b = jnp.where(mask, r_t + discount_t * (v_t - c_t * q_a_t), zero)
  a = jnp.where(mask, discount_t * c_t, zero)
  targets = reverse_linear_recurrence(a, b, method=method)
  if _checks.static_flag("stop_target_gradients", stop_target_gradients):
    targets = jax.lax.stop_gradient(targets)
  return targets


def _check_q_inputs(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t):
  _checks.check_floating_alike(
      [
          ("r_t", r_t),
          ("q_tm1", q_tm1),
          ("q_t", q_t),
          ("discount_t", discount_t),
          ("pi_t", pi_t),
          ("mu_t", mu_t),
      ]
  )
  _checks.check_integer("a_tm1", a_tm1)
  _checks.check_integer("a_t", a_t)
  _checks.check_time_major("r_t", r_t)
  shape = tuple(jnp.shape(r_t))
  _checks.check_action_values("q_tm1", q_tm1, shape)
  q_shape = shape + (jnp.shape(q_tm1)[-1],)
  _checks.check_shape("q_t", q_t, q_shape, "`q_tm1`")
  _checks.check_shape("pi_t", pi_t, q_shape, "`q_tm1`")
  for name, x in [("a_tm1", a_tm1), ("a_t", a_t), ("discount_t", discount_t), ("mu_t", mu_t)]:
    _checks.check_shape(name, x, shape, "`r_t`")
  return shape


def retrace_targets(
    q_t: jax.Array,
    a_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    pi_t: jax.Array,
    mu_t: jax.Array,
    *,
    mask: jax.Array | None = None,
    lambda_=1.0,
    eps: float = 1e-8,
    stop_target_gradients: bool = True,
    method: str = "auto",
) -> jax.Array:
  """Retrace targets Q^ret(x_s, a_s), shape [T, ...] (ACER's Q^ret at lambda=1).

  Args:
    q_t: Q(x_{s+1}, .) at times [1, T], shape [T, ..., A]; may be -inf (an illegal
      action) where `pi_t` is 0, which V = sum_a pi Q then leaves out.
    a_t: actions a_{s+1} at times [1, T], int [T, ...] in [0, A) (checked as in
      `retrace`).
    r_t: rewards at times [1, T], [T, ...].
    discount_t: gamma times environment discount at times [1, T].
    pi_t: target-policy probabilities pi(.|x_{s+1}) at times [1, T], [T, ..., A].
    mu_t: behaviour probability mu(a_{s+1}|x_{s+1}) at times [1, T], [T, ...].
    mask, lambda_, eps, stop_target_gradients, method: as in `retrace`.
  """
  _checks.check_floating_alike(
      [
          ("r_t", r_t),
          ("q_t", q_t),
          ("discount_t", discount_t),
          ("pi_t", pi_t),
          ("mu_t", mu_t),
      ]
  )
  _checks.check_integer("a_t", a_t)
  _checks.check_time_major("r_t", r_t)
  shape = tuple(jnp.shape(r_t))
  _checks.check_action_values("q_t", q_t, shape)
  q_shape = shape + (jnp.shape(q_t)[-1],)
  _checks.check_shape("pi_t", pi_t, q_shape, "`q_t`")
  for name, x in [("a_t", a_t), ("discount_t", discount_t), ("mu_t", mu_t)]:
    _checks.check_shape(name, x, shape, "`r_t`")
  _checks.check_in_unit_interval("lambda_", lambda_, shape)
  _checks.check_non_negative("eps", eps)
  # The probabilities are checked here, named, rather than through the `c_t` they make:
  # pi_t at the real steps (V(x_{s+1})), mu_t and a_t where a trace continues (c_{s+1}).
  real = _checks.check_mask(mask, shape)
  continues = real & shift_to_previous(real, False)
  _checks.check_action_range("a_t", a_t, q_shape[-1], "`q_t`", where=continues)
  _checks.check_probabilities("pi_t", pi_t, where=real[..., None])
  _checks.check_probabilities("mu_t", mu_t, where=continues)
  # Garbage where the inputs are not read is replaced before any arithmetic (see
  # `general_off_policy_returns`); mu_t by 1, as it divides.
  q_t, pi_t = where_used(real, q_t), where_used(real, pi_t)
  mu_t = where_used(continues, mu_t, 1.0)
  a_t = jnp.asarray(a_t)
  pi_a_t = select_action(pi_t, a_t)
  c_t = lambda_ * jnp.minimum(1.0, pi_a_t / (mu_t + probability_floor(eps, jnp.result_type(mu_t))))
  c_t = c_t.astype(r_t.dtype)
  # An action the target policy never takes (pi 0) may have a Q of -inf (an illegal action,
  # as soft-Q allows): its term of V = sum_a pi Q is 0, not 0 x -inf = NaN.
  v_t = sum_actions(pi_t * jnp.where(pi_t > 0, q_t, jnp.zeros((), q_t.dtype)))
  return general_off_policy_returns(
      select_action(q_t, a_t),
      v_t,
      r_t,
      discount_t,
      c_t,
      mask=mask,
      stop_target_gradients=stop_target_gradients,
      method=method,
  )


def retrace(
    q_tm1: jax.Array,
    q_t: jax.Array,
    a_tm1: jax.Array,
    a_t: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    pi_t: jax.Array,
    mu_t: jax.Array,
    *,
    mask: jax.Array | None = None,
    lambda_=1.0,
    eps: float = 1e-8,
    stop_target_gradients: bool = True,
    method: str = "auto",
) -> jax.Array:
  """Retrace errors Q^ret(x_s, a_s) - Q(x_s, a_s), shape [T, ...].

  c_{s+1} = lambda min(1, pi(a_{s+1}|x_{s+1}) / mu(a_{s+1}|x_{s+1})). Equals
  `rlax.retrace` without a mask. A step with `mask=False` has zero error and
  cuts the trace; garbage in its inputs changes no output or gradient at the real
  steps (see `general_off_policy_returns`).

  Args:
    q_tm1: Q(x_s, .) at times [0, T-1], [T, ..., A].
    q_t: Q(x_{s+1}, .) at times [1, T], [T, ..., A] (target network); may be -inf (an
      illegal action) where `pi_t` is 0, as in `retrace_targets`.
    a_tm1: actions a_s at times [0, T-1], int [T, ...] in [0, A).
    a_t: actions a_{s+1} at times [1, T], int [T, ...] in [0, A).
    r_t: rewards at times [1, T], [T, ...].
    discount_t: gamma times environment discount at times [1, T].
    pi_t: target-policy probabilities at times [1, T], [T, ..., A].
    mu_t: behaviour probability of a_t at times [1, T], [T, ...].
    mask: optional bool [T, ...], False where step s is not a real transition.
    lambda_: trace mixing in [0, 1].
    eps: added to mu_t before dividing (at least the dtype's smallest normal number).
    stop_target_gradients: stop gradients through the targets.
    method: "auto", "scan" or "associative" (see `reverse_linear_recurrence`).

  Raises:
    ValueError: an action outside [0, A) in a concrete (eager) call. Under `jit`
      the range is not checked: an out-of-range action selects NaN, so the
      errors turn NaN (see `take_action`); wrap the function in
      `jax.experimental.checkify.checkify` to have the range checked there.
  """
  shape = _check_q_inputs(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t)
  mask = _checks.check_mask(mask, shape)
  _checks.check_action_range("a_tm1", a_tm1, jnp.shape(q_tm1)[-1], "`q_tm1`", where=mask)
  targets = retrace_targets(
      q_t,
      a_t,
      r_t,
      discount_t,
      pi_t,
      mu_t,
      mask=mask,
      lambda_=lambda_,
      eps=eps,
      stop_target_gradients=stop_target_gradients,
      method=method,
  )
  q_a_tm1 = select_action(jnp.asarray(q_tm1), jnp.asarray(a_tm1))
  return jnp.where(mask, targets - q_a_tm1, jnp.zeros((), q_a_tm1.dtype))
