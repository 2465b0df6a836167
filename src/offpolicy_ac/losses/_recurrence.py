"""The one reverse linear recurrence behind every target in this package.

    acc_t = b_t + a_t * acc_{t+1},   t = T-1, ..., 0,   acc_T = init (default 0).

V-trace, Retrace (and every general off-policy return), Q^ret / Q^opc and soft
lambda-returns differ only in how they build the coefficients `a` and `b`
elementwise before this call and what they read off `acc` after it.

Two interchangeable implementations, selected with `method` ("auto", the
default everywhere, lowers to "scan" on CPU and "associative" on GPU/TPU via
`lax.platform_dependent`):

* ``"scan"`` -- a reverse `lax.scan` over the leading time axis whose body is a
  single fused multiply-add on one time-major row `[...]`. On the time-major
  layout `[T, B]` each step reads contiguous rows, so no transposes are needed.
  Work O(T*B), depth T. The fast path on CPU.
* ``"associative"`` -- `lax.associative_scan` with the composition of affine
  maps x -> b + a*x. Work O(T*B) (about twice the scan's) but depth O(log T):
  the fast path on accelerators for long T and small B.

Both agree to floating-point rounding (tests check it), trace coefficients above 1
included: the associative products of coefficients that overflow are never multiplied
into a zero (`_times`).
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp

from offpolicy_ac.losses import _checks


def _times(x, y):
  """x * y, and 0 where either is 0 even if the other overflowed to inf.

  A product of coefficients a over a long range can overflow where a > 1 (trace
  coefficients above 1), though it is multiplied by 0 (a termination's a, a zero b): the
  scan never forms it, and 0 * inf would be NaN. Only such an infinite factor is
  replaced (before the product, so that the gradients are not NaN either).
  """
  zero = jnp.zeros((), x.dtype)
  x_safe = jnp.where((y == 0) & jnp.isinf(x), zero, x)
  y_safe = jnp.where((x == 0) & jnp.isinf(y), zero, y)
  return x_safe * y_safe


def _compose(later, earlier):
  """Composes affine maps for a *reverse* scan.

  With `reverse=True`, `associative_scan` calls `fn(a, b)` where `a` holds
  elements at later times than `b`. Each element (a_t, b_t) is the map
  f_t(x) = b_t + a_t * x. The suffix f_t o f_{t+1} o ... is accumulated as
  f_earlier o f_later: (a_e * a_l, b_e + a_e * b_l), with `_times`' products.
  """
  a_l, b_l = later
  a_e, b_e = earlier
  return _times(a_e, a_l), b_e + _times(a_e, b_l)


def reverse_linear_recurrence(
    a: jax.Array,
    b: jax.Array,
    init: jax.Array | None = None,
    *,
    method: str = "auto",
    unroll: int = 1,
) -> jax.Array:
  """Computes acc_t = b_t + a_t * acc_{t+1} backwards in time.

  Args:
    a: multiplicative coefficients, shape [T, ...], times [0, T-1].
    b: additive terms, same shape and (floating) dtype as `a`.
    init: acc_T, shape `a.shape[1:]`; zeros if None.
    method: "scan" (reverse `lax.scan`), "associative" (`associative_scan`)
      or "auto" (scan on CPU, associative elsewhere; decided at lowering).
    unroll: `lax.scan`'s unroll factor, an int >= 1 or a bool (method "scan", and "auto"
      on a CPU; refused with "associative").

  Returns:
    acc with the shape and dtype of `b`: acc_t for t in [0, T-1] (float16 and bfloat16
    summed in float32, then rounded).
  """
  _checks.check_method(method)
  if not (isinstance(unroll, bool) or isinstance(unroll, numbers.Integral) and unroll >= 1):
    raise ValueError(f"unroll must be an int >= 1 or a bool (lax.scan's), got {unroll!r}")
  plain = unroll is not True and unroll in (1, False)  # True == 1: lax.scan unrolls it whole
  if method == "associative" and not plain:
    raise ValueError(f"unroll={unroll!r} is lax.scan's unroll factor: it applies to "
                     "method='scan' (and 'auto' on a CPU), not 'associative'")  # fmt: skip
  _checks.check_time_major("b", b)
  _checks.check_floating("b", b)
  _checks.check_shape("a", a, jnp.shape(b), "`b`")
  _checks.check_dtype("a", a, jnp.result_type(b), "`b`")
  a, b = jnp.asarray(a), jnp.asarray(b)
  if init is None:
    init = jnp.zeros(jnp.shape(b)[1:], dtype=b.dtype)
  else:
    _checks.check_shape("init", init, jnp.shape(b)[1:], "`b[0]`")
    _checks.check_dtype("init", init, b.dtype, "`b`")
    init = jnp.asarray(init)

  # Half precision (float16, bfloat16) is summed in float32 and rounded once at the end:
  # rounding at every step drifts over long unrolls (15% over 256 bfloat16 steps of a
  # discounted sum).
  out_dtype = b.dtype
  wide = jnp.promote_types(out_dtype, jnp.float32)
  a, b, init = a.astype(wide), b.astype(wide), init.astype(wide)
  scan = _scan if plain else functools.partial(_scan, unroll=unroll)
  if method == "scan":
    acc = scan(a, b, init)
  elif method == "associative":
    acc = _associative(a, b, init)
  else:
    acc = jax.lax.platform_dependent(a, b, init, cpu=scan, default=_associative)
  return acc.astype(out_dtype)


def _step(acc, a_and_b):
  a_t, b_t = a_and_b
  acc = b_t + a_t * acc
  return acc, acc


def _scan(a, b, init, unroll=1):
  # `_step` is a module-level function, so repeated eager calls hit JAX's
  # tracing cache instead of re-tracing a fresh closure.
  _, acc = jax.lax.scan(_step, init, (a, b), reverse=True, unroll=unroll)
  return acc


def _associative(a, b, init):
  # Fold `init` into the last step: b_{T-1} + a_{T-1} * init.
  b = b.at[-1].add(_times(a[-1], init))
  _, acc = jax.lax.associative_scan(_compose, (a, b), reverse=True, axis=0)
  return acc


def shift_to_previous(x: jax.Array, fill) -> jax.Array:
  """Returns y with y_t = x_{t+1} for t < T-1 and y_{T-1} = fill.

  Used to read "the next step" of a time-major array (the next step's mask,
  the next step's target) elementwise, fused by XLA into its consumer.
  """
  last = jnp.full((1,) + jnp.shape(x)[1:], fill, dtype=jnp.result_type(x))
  return jnp.concatenate([x[1:], last], axis=0)
