"""Reductions and lookups over the trailing action axis.

On CPU, XLA reduces a short innermost axis (A = 2..32 actions) slowly and
turns `take_along_axis` into a gather. For such A these helpers fold the
action axis into a chain of elementwise operations on [T, ...] arrays, which
XLA fuses into one pass; for larger A they use the plain reductions. Both paths
give the same values and gradients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Largest action axis folded into elementwise operations.
_MAX_UNROLLED_ACTIONS = 32


def _unrolled(x: jax.Array) -> bool:
  return jnp.shape(x)[-1] <= _MAX_UNROLLED_ACTIONS


def take_action(values: jax.Array, actions: jax.Array) -> jax.Array:
  """values[..., a] for integer `actions` of shape values.shape[:-1].

  Out-of-range actions give 0 on the unrolled path (callers validate ranges).
  """
  if not _unrolled(values):
    return jnp.take_along_axis(values, actions[..., None], axis=-1)[..., 0]
  zero = jnp.zeros((), values.dtype)
  out = jnp.where(actions == 0, values[..., 0], zero)
  for k in range(1, values.shape[-1]):
    out = jnp.where(actions == k, values[..., k], out)
  return out


def sum_actions(x: jax.Array) -> jax.Array:
  """sum over the last axis."""
  if not _unrolled(x):
    return jnp.sum(x, axis=-1)
  return functools.reduce(lambda acc, k: acc + x[..., k], range(1, x.shape[-1]), x[..., 0])


def max_actions(x: jax.Array) -> jax.Array:
  """max over the last axis."""
  if not _unrolled(x):
    return jnp.max(x, axis=-1)
  return functools.reduce(
      lambda acc, k: jnp.maximum(acc, x[..., k]), range(1, x.shape[-1]), x[..., 0]
  )


def logsumexp_actions(x: jax.Array) -> jax.Array:
  """Stable log(sum(exp(x))) over the last axis; all -inf gives -inf.

  The maximum is subtracted (with its gradient stopped, as in
  `jax.nn.logsumexp`), so finite inputs never overflow.
  """
  if not _unrolled(x):
    return jax.nn.logsumexp(x, axis=-1)
  m = jax.lax.stop_gradient(max_actions(x))
  m = jnp.where(jnp.isfinite(m), m, jnp.zeros((), x.dtype))
  s = functools.reduce(
      lambda acc, k: acc + jnp.exp(x[..., k] - m), range(1, x.shape[-1]), jnp.exp(x[..., 0] - m)
  )
  return jnp.log(s) + m
