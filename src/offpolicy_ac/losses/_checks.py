"""Trace-time validation of loss inputs and hyper-parameters.

Every check here runs while JAX traces a function (on static shapes and dtypes),
so it costs nothing at run time and a bad call fails before any compilation or
long work, with a message that names the offending argument.

Checks of values (action indices, hyper-parameters) can only run on concrete
arrays: called eagerly they raise `ValueError`. `check_action_range` on traced
values (under `jit`, `vmap`, `scan`, ...) adds a `checkify.debug_check`, which
does nothing unless the caller wraps the function in `checkify.checkify`; then
the check runs on the device and is reported in the returned error.

A `debug_check` leaves the compiled program unchanged, but it gives the traced
function an effect, and `jax.jit` dispatches a function with effects through its
Python path: about 50 us more per call than its C++ fast path, more with many
arguments. `without_range_checks(fn)` traces `fn` without them, for functions
called often (the agents' updates).
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any
from typing import Callable

import jax
from jax.experimental import checkify
import jax.numpy as jnp
import numpy as np


def _describe(x: Any) -> str:
  return f"shape {tuple(jnp.shape(x))} and dtype {jnp.result_type(x)}"


def check_floating(name: str, x: Any) -> None:
  """Raises TypeError unless `x` has a floating-point dtype."""
  if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    raise TypeError(f"`{name}` must have a floating-point dtype, got {_describe(x)}.")


def check_floating_alike(names_and_arrays: list[tuple[str, Any]]) -> None:
  """Raises TypeError unless every array has a floating-point dtype, the first's."""
  ref_name, ref = names_and_arrays[0]
  for name, x in names_and_arrays:
    check_floating(name, x)
    if jnp.result_type(x) != jnp.result_type(ref):
      raise TypeError(
          f"`{name}` must have the dtype of `{ref_name}`, {jnp.result_type(ref)}, got "
          f"{_describe(x)} (cast the float inputs to one dtype)."
      )


def check_integer(name: str, x: Any) -> None:
  """Raises TypeError unless `x` has an integer dtype (action indices)."""
  if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
    raise TypeError(f"`{name}` must have an integer dtype, got {_describe(x)}.")


def check_dtype(name: str, x: Any, dtype: Any, ref: str) -> None:
  """Raises TypeError unless `x` has exactly `dtype` (the dtype of `ref`)."""
  if jnp.result_type(x) != jnp.dtype(dtype):
    raise TypeError(
        f"`{name}` must have dtype {jnp.dtype(dtype)} (matching {ref}), got {_describe(x)}."
    )


def check_bool(name: str, x: Any) -> None:
  """Raises TypeError unless `x` is boolean (masks)."""
  if jnp.result_type(x) != jnp.bool_:
    raise TypeError(f"`{name}` must be a boolean array, got {_describe(x)}.")


def check_min_rank(name: str, x: Any, min_rank: int, what: str) -> None:
  """Raises ValueError if `x` has fewer than `min_rank` dimensions."""
  if jnp.ndim(x) < min_rank:
    raise ValueError(f"`{name}` must have rank >= {min_rank} ({what}), got {_describe(x)}.")


def check_nonempty(name: str, x: Any, axis: int, what: str) -> None:
  """Raises ValueError if `x`'s `axis` (of `what`: actions, samples, particles) is empty."""
  if jnp.shape(x)[axis] < 1:
    raise ValueError(f"`{name}` has no {what} (an empty axis {axis}): {_describe(x)}.")


def check_shape(name: str, x: Any, expected: tuple[int, ...], ref: str) -> None:
  """Raises ValueError unless `x.shape == expected` (the shape of `ref`)."""
  if tuple(jnp.shape(x)) != tuple(expected):
    raise ValueError(
        f"`{name}` must have shape {tuple(expected)} (matching {ref}), got " f"{_describe(x)}."
    )


def check_actions_of(actions_name: str, actions: Any, values_name: str, values: Any) -> None:
  """Raises ValueError unless `actions` has the shape of `values` ([..., A]: logits,
  probabilities or Q-values) without its action axis. Arrays of one rank are named as
  what they most likely are, values whose action axis was left out (not as actions of
  the wrong shape)."""
  if jnp.ndim(actions) == jnp.ndim(values):
    raise ValueError(
        f"`{values_name}` has shape {tuple(jnp.shape(values))} and `{actions_name}` "
        f"{tuple(jnp.shape(actions))}: `{values_name}` needs a trailing action axis [..., A] "
        f"that the actions lack (integer actions of shape `{values_name}.shape[:-1]`)."
    )
  check_shape(actions_name, actions, jnp.shape(values)[:-1],
              f"`{values_name}` without its action axis")  # fmt: skip


def check_action_values(name: str, x: Any, shape: tuple[int, ...], ref: str = "r_t") -> None:
  """Raises ValueError unless `x` is `[*shape, A]`: the shape of `ref` plus an action axis
  (a missing action axis is named as such, not as a shape whose last axis is the batch's)."""
  if jnp.ndim(x) != len(shape) + 1:
    expected = ", ".join([*map(str, shape), "A"])
    raise ValueError(f"`{name}` must have shape ({expected}) (`{ref}`'s {tuple(shape)} plus an "
                     f"action axis A), got {_describe(x)}.")  # fmt: skip
  check_shape(name, x, tuple(shape) + (jnp.shape(x)[-1],), f"`{ref}` plus an action axis")


def check_same_shape(names_and_arrays: list[tuple[str, Any]]) -> tuple[int, ...]:
  """Checks that all arrays have one shape; returns it. Where they differ, the error names
  an array whose shape fewer of them have (the odd one out), against the first array of
  the most common shape (of shapes as common, the earliest listed)."""
  shapes = [tuple(jnp.shape(x)) for _, x in names_and_arrays]
  shape = max(shapes, key=shapes.count)  # the first of the most common
  ref_name = names_and_arrays[shapes.index(shape)][0]
  for name, x in names_and_arrays:
    check_shape(name, x, shape, f"`{ref_name}`")
  return shape


def check_time_major(name: str, x: Any) -> None:
  """Inputs carry a leading time axis: rank >= 1 and T >= 1."""
  check_min_rank(name, x, 1, "a leading time axis [T, ...]")
  if jnp.shape(x)[0] < 1:
    raise ValueError(f"`{name}` has an empty time axis: {_describe(x)}.")


def check_mask(mask: Any, shape: tuple[int, ...], ref: str = "`r_t`") -> jax.Array:
  """Validates an optional mask (the shape of `ref`) and returns a boolean array of `shape`."""
  if mask is None:
    return jnp.ones(shape, dtype=jnp.bool_)
  check_bool("mask", mask)
  check_shape("mask", mask, shape, ref)
  return jnp.asarray(mask)


def _concrete_values(x: Any, name: str = "") -> np.ndarray | None:
  """Returns the value of `x` as NumPy if it is known at trace time. Refuses (ValueError
  naming `name`) a str, which NumPy would parse as a number ("False" would not be False)."""
  if isinstance(x, jax.core.Tracer):
    return None
  if isinstance(x, (str, bytes)) or (isinstance(x, np.ndarray) and x.dtype.kind in "US"):
    raise ValueError(f"`{name}` must be a number or an array of numbers, got {x!r}.")
  try:
    return np.asarray(x, dtype=np.float64)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return None


_RANGE_CHECKS = contextvars.ContextVar("offpolicy_ac_range_checks", default=True)


def without_range_checks(fn: Callable) -> Callable:
  """`fn`, traced without the in-program action-range checks (`check_action_range` on
  traced actions), so that `jax.jit(without_range_checks(fn))` has no effect and keeps
  JAX's fast dispatch. Shape, dtype and eager checks stay; under `jit` an out-of-range
  action still selects NaN, and `checkify` has nothing to report inside `fn`."""

  @functools.wraps(fn)
  def traced_without_checks(*args, **kwargs):
    token = _RANGE_CHECKS.set(False)
    try:
      return fn(*args, **kwargs)
    finally:
      _RANGE_CHECKS.reset(token)

  return traced_without_checks


def below(actions: Any, num_actions: int) -> Any:
  """`actions < num_actions` for integer `actions` of any dtype: True where `num_actions`
  is past the dtype's largest value (JAX would cast it to the dtype, where 256 wraps to
  0 in uint8, and judge every action out of range)."""
  if num_actions > jnp.iinfo(jnp.result_type(actions)).max:
    return jnp.ones(jnp.shape(actions), bool)
  return actions < num_actions


def check_action_range(name: str, actions: Any, num_actions: int, ref: str,
                       where: Any = None) -> None:  # fmt: skip
  """Action indices must lie in [0, num_actions), the size of `ref`'s action axis, where
  `where` (bool, `actions`' shape; None: everywhere) is True: the steps whose action the
  function reads (a masked step's may hold anything).

  Concrete `actions` (an eager call) are checked on the host: ValueError naming
  the argument, the first bad value and its index, and the valid range. Traced
  `actions` get a `checkify.debug_check`: a no-op (dead code that XLA removes)
  unless the function runs under `checkify.checkify`, which then reports it; none
  inside `without_range_checks`.
  """
  if not jnp.size(actions):  # an empty batch: nothing to check (argmin of nothing fails)
    return
  what = f"`{name}` must hold actions in [0, {num_actions}) (the action axis of {ref})"
  if isinstance(actions, jax.core.Tracer) or isinstance(where, jax.core.Tracer):
    if not _RANGE_CHECKS.get():
      return
    flat = jnp.ravel(actions)
    ok = (flat >= 0) & below(flat, num_actions)
    if where is not None:
      ok = ok | ~jnp.ravel(jnp.broadcast_to(where, jnp.shape(actions)))
    checkify.debug_check(
        jnp.all(ok),
        what + ", got {value} at flat index {index}.",
        value=flat[jnp.argmin(ok)],
        index=jnp.argmin(ok),
    )
    return
  v = np.asarray(actions)
  bad = (v < 0) | (v >= num_actions)
  if where is not None:
    bad &= np.broadcast_to(np.asarray(where, bool), v.shape)
  if np.any(bad):
    where = _first_index(bad)
    values = np.unique(v[bad])
    others = "" if values.size == 1 else f" (all out-of-range values: {values[:8].tolist()}"
    others += ", ...)" if values.size > 8 else (")" if values.size > 1 else "")
    raise ValueError(
        f"{what}, got {v[where].item()} at index {where}{others}; "
        f"{int(np.sum(bad))} of {v.size} entries are out of range."
    )


def check_broadcasts(name: str, x: Any, shape: tuple[int, ...]) -> None:
  """ValueError unless `x` is a scalar or an array of `shape`'s rank that broadcasts to
  it. A lower-rank array is refused even where NumPy would broadcast it: a per-step [T]
  value would meet the last axis, and silently so when that axis also has T entries."""
  if x is None or not jnp.ndim(x):  # None: refused by the value checks that follow
    return
  try:
    fits = np.broadcast_shapes(tuple(jnp.shape(x)), tuple(shape)) == tuple(shape)
  except ValueError:
    fits = False
  if not fits or jnp.ndim(x) != len(shape):
    raise ValueError(f"`{name}` of shape {tuple(jnp.shape(x))} must be a scalar or have the "
                     f"inputs' rank and broadcast to their shape {tuple(shape)} (a per-step "
                     f"[T] value: `{name}[:, None]`).")  # fmt: skip


def _first_index(bad: np.ndarray) -> tuple[int, ...]:
  """The index of `bad`'s first True entry (() for a scalar)."""
  return tuple(int(i) for i in np.argwhere(bad)[0])


def _shown(x: Any, v: np.ndarray) -> Any:
  """A refused hyper-parameter as the message shows it: None as None, not as the NaN that
  `_concrete_values` makes of it."""
  if x is None:
    return None
  return v if v.ndim == 0 else v.tolist()


def check_in_unit_interval(name: str, x: Any, shape: tuple[int, ...] | None = None) -> None:
  """ValueError unless every (concrete) value of `x` lies in [0, 1], and, given `shape`,
  unless `x` broadcasts to it (`check_broadcasts`).

  Traced values (for example a hyper-parameter `vmap`-ed over a sweep) cannot be
  inspected at trace time and are accepted.
  """
  if shape is not None:
    check_broadcasts(name, x, shape)
  v = _concrete_values(x, name)
  if v is not None and (np.any(np.isnan(v)) or np.any(v < 0) or np.any(v > 1)):
    raise ValueError(f"`{name}` must lie in [0, 1], got {_shown(x, v)}.")


def check_positive(name: str, x: Any, shape: tuple[int, ...] | None = None, *,
                   finite: bool = False, dtype: Any = None) -> None:  # fmt: skip
  """ValueError unless every (concrete) value of `x` is > 0 (and, with `finite`, below
  +inf: a temperature of inf makes 0 x inf = NaN), and, given `shape`, unless `x`
  broadcasts to it (`check_broadcasts`). Given `dtype` (the inputs' dtype, which `x` is
  cast to), the values must stay so once cast: a value that rounds to 0 in it (alpha =
  1e-8 in float16) is refused, and, with `finite`, one that overflows to inf."""
  if shape is not None:
    check_broadcasts(name, x, shape)
  v = _concrete_values(x, name)
  if v is None:
    return
  if not np.all((v > 0) & (np.isfinite(v) if finite else True)):
    raise ValueError(f"`{name}` must be > 0{' and finite' if finite else ''}, got "
                     f"{_shown(x, v)}.")  # fmt: skip
  if dtype is not None:
    _check_representable(name, v, jnp.dtype(dtype), finite)


def _check_representable(name: str, v: np.ndarray, dtype: np.dtype, finite: bool) -> None:
  """ValueError if a positive value of `v` becomes 0 (or, with `finite`, inf) in `dtype`."""
  with np.errstate(over="ignore", under="ignore"):
    cast = v.astype(dtype)
  info = jnp.finfo(dtype)  # jnp's finfo knows bfloat16
  for bad, becomes, bound in [
      (cast == 0, "0", f"its smallest positive value is {float(info.smallest_subnormal):g}"),
      (np.isinf(cast) & finite, "inf", f"its largest value is {float(info.max):g}"),
  ]:
    if not np.any(bad):
      continue
    index = _first_index(bad)
    at = f" at index {index}" if index else ""
    wider = " or cast the inputs to float32," if info.bits < 32 else ""
    raise ValueError(
        f"{name}={float(v[index])!r}{at} is {becomes} in {dtype}, the inputs' dtype that "
        f"`{name}` is cast to: {bound} (pass a value in its range,{wider} so that `{name}` "
        f"keeps its meaning)."
    )


def check_scalar(name: str, x: Any, what: str) -> None:
  """ValueError unless `x` is a scalar (0-d; traced too, as in a `vmap` over a sweep): a
  weight of `what`, a mean over all steps, has one value."""
  if jnp.ndim(x):
    raise ValueError(f"`{name}` must be a scalar (it weighs {what}), got shape "
                     f"{tuple(jnp.shape(x))}")  # fmt: skip


def check_non_negative(name: str, x: Any, shape: tuple[int, ...] | None = None, *,
                       finite: bool = False) -> None:  # fmt: skip
  """ValueError unless every (concrete) value of `x` is >= 0 (and, with `finite`, below
  +inf: a loss weight of inf makes the loss inf or NaN), and, given `shape`, unless `x`
  broadcasts to it (`check_broadcasts`)."""
  if shape is not None:
    check_broadcasts(name, x, shape)
  v = _concrete_values(x, name)
  if v is not None and not np.all((v >= 0) & (np.isfinite(v) if finite else True)):
    raise ValueError(f"`{name}` must be >= 0{' and finite' if finite else ''}, got "
                     f"{_shown(x, v)}.")  # fmt: skip


def check_entries(name: str, x: Any, low: float, high: float = np.inf, what: str = "", *,
                  where: Any = True, bounds: str | None = None) -> None:  # fmt: skip
  """ValueError unless every (concrete) entry of `x` lies in [low, high] (NaN does not)
  where `where` (a bool array of x's shape: the steps whose entries are used) is True,
  naming the first bad entry, its index and how many there are (the range as `bounds`
  says, when given). Traced values (under `jit`, `vmap`, ...) cannot be inspected at trace
  time and are accepted."""
  v, used = _concrete_values(x, name), _concrete_values(where, "where")
  if v is None or used is None:
    return
  bad = ~((v >= low) & (v <= high)) & (used > 0)
  if np.any(bad):
    where = _first_index(bad)
    bounds = bounds or (f"[{low:g}, {high:g}]" if np.isfinite(high) else f">= {low:g}")
    raise ValueError(
        f"`{name}` must be {_in(bounds)}{what}, got {v[where].item()} at index {where}; "
        f"{int(np.sum(bad))} of {v.size} entries are not."
    )


def _in(bounds: str) -> str:
  """The range in a message: "in [low, high]" for an interval, else the bound (">= 0")."""
  return f"in {bounds}" if bounds.startswith("[") else bounds


PROBABILITY_SLACK = 1e-4
"""How far above 1 a probability may lie: a float32 softmax's rounding, not a logit's."""


def check_probabilities(name: str, x: Any, where: Any = True) -> None:
  """`check_entries` for probabilities: in [0, 1] (to `PROBABILITY_SLACK`) where `where`
  is True. Logits, log-probabilities or Q-values passed instead would be read silently as
  probabilities (a negative one as 0, a large one as a huge importance ratio)."""
  check_entries(name, x, 0.0, 1.0 + PROBABILITY_SLACK, " (probabilities)", where=where,
                bounds="[0, 1]")  # fmt: skip


def check_discounts(discount_t: Any, mask: Any) -> None:
  """`check_entries` for `discount_t`: gamma times the environment's discount, in [0, 1]
  at the real steps (`mask`; a masked step's discount is never used)."""
  check_entries("discount_t", discount_t, 0.0, 1.0, " (gamma times the environment's discount)",
                where=mask)  # fmt: skip


def check_static(name: str, value: Any, kind: str) -> None:
  """TypeError if `value` is traced: a Python `kind` ("float", ...) that the function
  branches on while tracing, which `jax.jit` must get as a static argument."""
  if isinstance(value, jax.core.Tracer):
    raise TypeError(f"`{name}` is static (a Python {kind} that sets the computation), got a "
                    f"traced value: pass it to jax.jit as a static argument (static_argnums or "
                    f"static_argnames), or close over it; never through vmap.")  # fmt: skip


def static_int(name: str, value: Any, minimum: int) -> int:
  """`value` as a Python int (a NumPy integer too, as `np.prod(shape)` gives), refusing
  traced values (TypeError), bools, floats and values below `minimum` (ValueError naming
  the argument)."""
  check_static(name, value, "int")
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
  return int(value)


def static_flag(name: str, value: Any) -> bool:
  """`value` as a Python bool (a switch read while tracing), refusing traced values with a
  TypeError that says how to pass it to `jax.jit`."""
  check_static(name, value, "bool")
  if not isinstance(value, (bool, np.bool_)):  # "False" would act as True
    raise ValueError(f"`{name}` must be True or False, got {value!r}.")
  return bool(value)


def check_method(method: str) -> None:
  if method not in ("auto", "scan", "associative"):
    raise ValueError(f"`method` must be 'auto', 'scan' or 'associative', got {method!r}.")
