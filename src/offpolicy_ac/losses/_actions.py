"""Reductions and lookups over the trailing action axis.

On CPU, XLA reduces a short innermost axis (A = 2..32 actions) slowly and
turns `take_along_axis` into a gather. For such A these helpers fold the
action axis into a chain of elementwise operations on [T, ...] arrays, which
XLA fuses into one pass; for larger A they use the plain reductions. Both paths
give the same values and gradients.

`take_action` is the public, checked lookup; the losses check their actions
themselves (naming their own arguments) and then use `select_action`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from offpolicy_ac.losses import _checks

# Largest action axis folded into elementwise operations.
_MAX_UNROLLED_ACTIONS = 32


def _unrolled(x: jax.Array) -> bool:
  return jnp.shape(x)[-1] <= _MAX_UNROLLED_ACTIONS


def take_action(values: jax.Array, actions: jax.Array) -> jax.Array:
  """values[..., a] for integer `actions` of shape values.shape[:-1].

  Args:
    values: [..., A], any dtype.
    actions: int [...] in [0, A).

  Raises:
    TypeError: `actions` is not an integer array.
    ValueError: `actions` is not shaped values.shape[:-1], or (when concrete: an
      eager call) holds an action outside [0, A); the message names the first bad
      value, its index and the range.

  Under `jit` (or `vmap`, `grad` with respect to traced actions) the range cannot
  be checked on the host: an out-of-range action (negative ones included) selects
  NaN (for integer values the dtype's minimum, as JAX's gather in "fill" mode).
  Run the function under `jax.experimental.checkify.checkify` to have the range
  checked there too.
  """
  _checks.check_integer("actions", actions)
  _checks.check_min_rank("values", values, 1, "a trailing action axis [..., A]")
  _checks.check_actions_of("actions", actions, "values", values)
  _checks.check_action_range("actions", actions, jnp.shape(values)[-1], "`values`")
  return select_action(jnp.asarray(values), jnp.asarray(actions))


def _fill_value(dtype) -> jax.Array:
  """What JAX's gather in "fill" mode returns for an out-of-range index."""
  if jnp.issubdtype(dtype, jnp.inexact):
    return jnp.array(jnp.nan, dtype)
  if jnp.issubdtype(dtype, jnp.signedinteger):
    return jnp.array(jnp.iinfo(dtype).min, dtype)
  if jnp.issubdtype(dtype, jnp.unsignedinteger):
    return jnp.array(jnp.iinfo(dtype).max, dtype)
  return jnp.array(True, dtype)


def select_action(values: jax.Array, actions: jax.Array) -> jax.Array:
  """values[..., a] without checks (callers validate shapes and ranges).

  An out-of-range action (negative ones included) gives `_fill_value`: NaN for
  floating values, on both paths, so that bad actions under `jit` turn the loss
  NaN instead of silently wrong.
  """
  num_actions = values.shape[-1]
  in_range = (actions >= 0) & _checks.below(actions, num_actions)
  if not _unrolled(values):
    safe = jnp.where(in_range, actions, 0)
    out = jnp.take_along_axis(values, safe[..., None], axis=-1, mode="promise_in_bounds")
    out = out[..., 0]
  else:
    out = values[..., 0]
    for k in range(1, num_actions):
      out = jnp.where(actions == k, values[..., k], out)
  return jnp.where(in_range, out, _fill_value(values.dtype))


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
