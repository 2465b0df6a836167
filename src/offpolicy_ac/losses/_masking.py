"""Keeping the garbage of masked steps out of every computation, gradients included.

`jnp.where(mask, f(x), 0)` keeps a NaN or inf in `x` at a masked step out of the value,
but not out of the gradient: the backward pass multiplies the zero cotangent by f'(x),
and 0 * nan (or 0 * inf) is nan. So the losses first replace each input where it is not
used (the "double where"), and a masked step's garbage never enters any arithmetic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def where_used(used: jax.Array, x: jax.Array, fill=0.0) -> jax.Array:
  """`x` with `fill` at the steps where `used` is False, before any arithmetic on it.

  Args:
    used: bool [T, ...], the steps whose entries of `x` are read.
    x: [T, ...] or [T, ..., A] (`used` broadcasts over trailing axes).
    fill: a finite value that keeps every later operation finite (0, or 1 for a divisor).

  Returns:
    An array like `x`: its value and gradient at the used steps are `x`'s, its gradient
    elsewhere is exactly 0.
  """
  used = jnp.reshape(used, jnp.shape(used) + (1,) * (jnp.ndim(x) - jnp.ndim(used)))
  return jnp.where(used, x, jnp.asarray(fill, jnp.result_type(x)))
