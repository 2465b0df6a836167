"""Property checks for any target function over time-major trajectories.

The protocol: a target function under test is `fn(traj) -> outputs`, where
`traj` is a `offpolicy_ac.testing.Trajectory` (a NamedTuple of `[T, *batch]`
arrays, see `trajectories`) and `outputs` is a pytree (an array, a tuple, a
NamedTuple, a dict) of per-step arrays shaped `[T, *batch, ...]`. Wrap the
function you test in a small adapter that picks the fields it needs:

    fn = lambda tr: losses.vtrace(
        tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, jnp.exp(tr.log_rho_tm1), mask=tr.mask)

`fn` must accept any `T >= 1` and any batch shape (the checks call it on
sub-sequences), and must not close over arrays shaped like the trajectory.

Each check takes `examples`: one `Trajectory` or a sequence of them; None uses
`default_examples()`, small random trajectories with terminations,
truncations and junctions in every batch shape rank from 0 to 2. A check
raises `AssertionError` naming the check, the example, the chex variant, the
output and the worst index, and `ValueError` when it cannot run (outputs not
per step, unknown fields).

Each check runs `fn` under chex's variants (`chex.variants`), by default
`VARIANTS = ("without_jit", "with_jit")`, and judges with chex's assertions
(`chex.assert_trees_all_close`, `chex.assert_shape`,
`chex.assert_tree_all_finite`). Both variants matter: XLA rewrites a float
multiplied by a converted boolean mask into a select, so under `jit` a target
that masks by multiplying (`mask * x`) hides the NaN that `0 * nan` gives when
run eagerly; and a target that only runs eagerly (NumPy on its inputs, Python
branches on values) fails under `jit`.

Needs chex: `pip install 'offpolicy_ac[testing]'`.
"""

from collections.abc import Callable
from collections.abc import Sequence
import inspect
import types
from typing import Any

from offpolicy_ac._extras import missing

try:
  import chex
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
  raise missing("offpolicy_ac.testing.checks", "chex", "testing", e) from e
import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac.testing import trajectories as _tr

TargetFn = Callable[[_tr.Trajectory], Any]

# The chex variants every check runs by default: the target as is, and under `jax.jit`.
VARIANTS = ("without_jit", "with_jit")
# The chex variants a check can run (`with_pmap` needs a device axis the examples lack).
_KNOWN_VARIANTS = ("without_jit", "with_jit", "without_device", "with_device")
# What fails when a target cannot be traced (NumPy on a tracer, a Python branch on a value).
_TRACE_ERRORS = (jax.errors.JAXTypeError, jax.errors.JAXIndexError)


def _under_variants(
    check: str, fn: Callable, variants: Sequence[str], *, user_fn: Callable | None = None
) -> list[tuple[str, Callable]]:
  """[(variant name, fn wrapped by that chex variant)], in the order given. `user_fn`: the
  function the user gave, where `fn` wraps it (checked to take one trajectory).

  `chex.variants` turns a test method into one test per variant, each run with
  `self.variant` set to the variant's wrapper; running those tests here applies
  exactly chex's wrappers to `fn`.
  """
  if isinstance(variants, str):  # a tuple of one name is ("with_jit",)
    raise ValueError(f"{check}: variants must be a sequence of chex variant names from "
                     f"{_KNOWN_VARIANTS}, got the str {variants!r}")  # fmt: skip
  _check_takes_one_trajectory(check, fn if user_fn is None else user_fn)
  variants = tuple(variants)
  unknown = set(variants) - set(_KNOWN_VARIANTS)
  if unknown or not variants or len(set(variants)) != len(variants):
    raise ValueError(
        f"{check}: variants must be distinct chex variants from {_KNOWN_VARIANTS}, got {variants}"
    )
  wrapped = {}

  def wrap(case):
    wrapped[str(case.variant.type).lstrip("_")] = case.variant(fn)

  for test in chex.variants(wrap, **dict.fromkeys(variants, True)):
    test(types.SimpleNamespace())
  return [(name, wrapped[name]) for name in variants]


def _check_takes_one_trajectory(check: str, fn: Callable, what: str = "fn") -> None:
  """Raises unless `fn` (the argument `what`) can be called as fn(traj) (where its
  signature can be read): one with another signature failed with a bare TypeError from
  inside the check."""
  if not callable(fn):
    raise TypeError(f"{check}: {what} must be a function {what}(traj) -> outputs, got {fn!r:.60}")
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):  # builtins and some wrappers: nothing to read
    return
  try:
    signature.bind(None)
  except TypeError as e:
    raise TypeError(
        f"{check}: {what} is called as {what}(traj) with one Trajectory, but its signature is "
        f"{signature} ({e}); bind the other arguments first (functools.partial)"
    ) from None


def _call(run, traj, check, where):
  """run(traj); a failure to trace becomes an AssertionError naming the check."""
  try:
    return run(traj)
  except _TRACE_ERRORS as e:
    raise AssertionError(
        f"{check}: {where}: fn cannot be traced ({type(e).__name__}); a target must be"
        f" jittable: {str(e).splitlines()[0]}"
    ) from e


def _examples(examples) -> list[_tr.Trajectory]:
  if examples is None:
    return _tr.default_examples()
  if isinstance(examples, _tr.Trajectory):
    return [examples]
  examples = list(examples)
  if not examples or not all(isinstance(x, _tr.Trajectory) for x in examples):
    raise ValueError("examples must be a Trajectory or a non-empty sequence of Trajectory")
  return examples


def _describe(i, traj):
  return f"example {i} (T={np.shape(traj.r_t)[0]}, batch={traj.batch_shape})"


def _leaves(fn, traj, check, where):
  """Runs fn and returns [(pytree path, NumPy array)] of its leaves, checked to be per step."""
  out = _call(fn, traj, check, where)
  flat, _ = jax.tree_util.tree_flatten_with_path(out)
  if not flat:
    raise ValueError(f"{check}: fn returned no arrays for {where}")
  lead = np.shape(traj.r_t)
  leaves = []
  for path, leaf in flat:
    name = jax.tree_util.keystr(path) or "(the array)"
    arr = np.asarray(leaf)
    _check_real(check, f"output {name}", arr)
    if arr.shape[: len(lead)] != lead:
      swapped = len(lead) > 1 and sorted(arr.shape[: len(lead)]) == sorted(lead)
      hint = ("Its leading axes are those of [T, *batch] in another order: return it "
              "time-major." if swapped else "Return targets, not reduced losses.")  # fmt: skip
      raise ValueError(
          f"{check}: output {name} has shape {arr.shape}; every output must be per step,"
          f" shaped [T, *batch, ...] = {lead} + (...). {hint}"
      )
    leaves.append((name, arr))
  return leaves


def _check_real(check: str, what: str, arr: np.ndarray) -> None:
  """Raises ValueError for a complex array: the checks compare real values (a complex one,
  cast to float64, lost its imaginary part)."""
  if np.iscomplexobj(arr):
    raise ValueError(f"{check}: {what} is complex ({arr.dtype}); the checks compare real "
                     "values: return its real and imaginary parts as two outputs")  # fmt: skip


def _default_tolerance(dtype):
  """1e-10 for float64 outputs, 1e-4 for float32, 8 epsilons of a half-precision dtype
  (float16: 0.0078, bfloat16: 0.0625): a correct target computed in half precision is a
  few epsilons off a float64 reference, far more than 1e-4."""
  if np.dtype(dtype) == np.float64:
    return 1e-10
  if jnp.issubdtype(dtype, jnp.floating):
    return max(1e-4, 8 * float(jnp.finfo(dtype).eps))
  return 1e-4


def _strictest(*dtypes):
  """Of the trajectory's and the outputs' float dtypes, the one of the smallest default
  tolerance: outputs cast down (float32 data, bfloat16 outputs) are held to the data's."""
  return min(dtypes, key=_default_tolerance)


def _float_dtype(traj):
  """The floating dtype JAX computes the trajectory's rewards in (float64 data: float32
  unless `jax_enable_x64`)."""
  return jax.dtypes.canonicalize_dtype(np.asarray(traj.r_t).dtype)


def _check_tolerances(check: str, allow_none: bool = True, **tolerances) -> None:
  """Raises ValueError unless each tolerance (`rtol`, `atol`) is a finite number >= 0 (or
  None, the dtype's default, where `allow_none`): a negative or NaN one failed every
  comparison, an infinite one passed any."""
  for name, value in tolerances.items():
    if value is None and allow_none:
      continue
    try:
      ok = not isinstance(value, (bool, str, bytes)) and 0.0 <= float(value) < np.inf
    except (TypeError, ValueError):
      ok = False
    if not ok:
      default = " (or None: the default for the dtype)" if allow_none else ""
      raise ValueError(f"{check}: {name} must be a finite number >= 0{default}, got {value!r}")


def _tolerance(expected, compared, rtol, atol, dtype):
  """(rtol, atol * max(1, max|expected|)) over the `compared` entries of `expected`: the
  tolerance `_assert_close` allows an entry, `atol * scale + rtol * |expected|`; a tolerance
  of None is the default for `dtype`."""
  default = _default_tolerance(dtype)
  rtol = default if rtol is None else rtol
  atol = default if atol is None else atol
  scale = max(1.0, float(np.max(np.abs(np.where(compared, expected, 0.0)), initial=0)))
  return rtol, atol * scale


def _assert_close(check, where, name, actual, expected, rtol, atol, dtype, select=None,
                  locate=None):  # fmt: skip
  """`chex.assert_trees_all_close` at the selected entries (all when `select` is None),
  with the tolerance `atol * max(1, max|expected|) + rtol * |expected|` (the maximum over
  the selected entries); a tolerance of None is the default for `dtype` (`_strictest` of
  the trajectory's and the outputs' dtypes). The AssertionError names the check, the
  output and the worst index (`locate(index)`: its index in the example, for a part of
  it), then gives chex's report."""
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  try:
    chex.assert_shape(actual, expected.shape)
  except AssertionError as e:
    raise AssertionError(f"{check}: {where}: output {name}: {e}") from None
  both_nan = np.isnan(actual) & np.isnan(expected)  # chex takes them as close: a hidden bug
  if select is not None:
    both_nan &= select
  if both_nan.any():
    idx = tuple(int(i) for i in np.argwhere(both_nan)[0])
    raise AssertionError(f"{check}: {where}: output {name} is NaN at index {idx}, and so is "
                         "the expected value")  # fmt: skip
  compared = np.isfinite(expected)
  if select is not None:  # entries left out compare equal, and do not set the scale
    actual = np.where(select, actual, expected)
    compared &= select
  rtol, atol = _tolerance(expected, compared, rtol, atol, dtype)
  try:
    chex.assert_trees_all_close(actual, expected, rtol=rtol, atol=atol)
  except AssertionError as e:
    tol = atol + rtol * np.abs(expected)
    with np.errstate(invalid="ignore"):
      err = np.abs(actual - expected)
      finite = np.isfinite(actual) & np.isfinite(expected)
      # Equal infinities are close; an infinity or a NaN against anything else is not.
      bad = (actual != expected) & ~(finite & (err <= tol))
      counted = np.ones(bad.shape, bool) if select is None else np.broadcast_to(select, bad.shape)
      bad &= counted  # the entries left out were set equal: none is a difference
      excess = np.where(bad, np.where(finite, err - tol, np.inf), -np.inf)
    idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
    shown = tuple(int(i) for i in (locate(idx) if locate is not None else idx))
    why = f"|diff| {err[idx]:.3g} > tolerance {tol[idx]:.3g}" if finite[idx] else "not finite"
    raise AssertionError(
        f"{check}: {where}: output {name} differs at {int(bad.sum())} of {int(counted.sum())}"
        f" compared entries; worst at index {shown}: got {actual[idx]!r}, expected"
        f" {expected[idx]!r} ({why})\nchex: {e}"
    ) from None


def _assert_finite(check, where, leaves, mask, masked_too=False, example="clean example"):
  """`chex.assert_tree_all_finite` on the outputs at the unmasked steps (a NaN there would
  compare equal to a NaN and hide a difference), and with `masked_too` at the masked ones
  (a NaN or inf there makes a loss that multiplies by the mask NaN)."""
  for name, x in leaves:
    if not jnp.issubdtype(x.dtype, jnp.inexact):
      continue
    real = _step_select(mask, x.shape)
    checked = np.ones_like(real) if masked_too else real
    try:
      chex.assert_tree_all_finite(np.where(checked, x, 0))
    except AssertionError as e:
      bad = checked & ~np.isfinite(np.asarray(x, np.float64))
      idx = tuple(int(i) for i in np.argwhere(bad & real if (bad & real).any() else bad)[0])
      step, hint = ("an unmasked", "") if real[idx] else (
          "a masked", ": a loss that multiplies by the mask is NaN there; give a finite value"
          " (0: `jnp.where(mask, x, 0)`) at masked steps")  # fmt: skip
      raise AssertionError(
          f"{check}: {where}: output {name} is {float(x[idx])} at index {idx}, {step} step of the"
          f" {example}{hint}\nchex: {e}"
      ) from None


def _step_select(mask, shape):
  """Broadcasts a [T, *batch] mask to an output's shape [T, *batch, ...]."""
  m = np.asarray(mask, bool)
  return np.broadcast_to(m.reshape(m.shape + (1,) * (len(shape) - m.ndim)), shape)


def _segments(mask_col):
  """[(start, end)] of the maximal runs of True in a 1-D mask (end inclusive)."""
  runs, start = [], None
  for s, m in enumerate(mask_col):
    if m and start is None:
      start = s
    if not m and start is not None:
      runs.append((start, s - 1))
      start = None
  if start is not None:
    runs.append((start, len(mask_col) - 1))
  return runs


def _segment(traj, idx, a, e):
  """Steps a..e of batch column idx as a Trajectory with every batch axis of size 1."""
  fields = {}
  for name, x in traj._asdict().items():
    x = np.asarray(x)
    keep = tuple(slice(i, i + 1) for i in idx)  # keeps the batch rank
    fields[name] = x[(slice(a, e + 1),) + keep]
  return _tr.Trajectory(**fields)


def assert_junction_split_invariant(
    fn: TargetFn,
    examples=None,
    *,
    variants: Sequence[str] = VARIANTS,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
  """Splitting a batch at its masked junctions changes nothing at real steps.

  Every column of each example is cut into its episode segments (the maximal
  runs of unmasked steps); each segment is computed as its own sequence and its
  outputs must equal the full batch's outputs at those steps. This catches a
  target whose recursion leaks across an auto-reset (a trace, a bootstrap or a
  TD error that reads the next episode), and any mixing between batch columns.

  For example, rlax's `vtrace_td_error_and_advantage` has no episode cut: at a
  truncated LAST step its `q_estimate` bootstraps from the next step's target,
  which after a junction is the next episode's, so it fails this check, while
  `offpolicy_ac.losses.vtrace` with `mask=` passes:

  >>> import jax.numpy as jnp
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_junction_split_invariant(
  ...     lambda tr: losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
  ...                              jnp.exp(tr.log_rho_tm1), mask=tr.mask))

  Args:
    fn: the target function, `fn(traj) -> pytree of [T, *batch, ...] arrays`.
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    variants: the chex variants to run `fn` under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted
      (one compilation per segment shape).
    rtol, atol: the tolerance, `|a - b| <= atol * max(1, max|b|) + rtol * |b|`, finite
      and >= 0 (ValueError otherwise); None uses 1e-4 for float32 (1e-10 for float64, 8
      epsilons of float16 and bfloat16: 0.0078 and 0.0625), of the stricter of the
      trajectory's and the outputs' dtypes.

  An example without junctions is split into its batch columns only.

  Raises:
    AssertionError: an output differs at an unmasked step.
  """
  check = "assert_junction_split_invariant"
  _check_tolerances(check, rtol=rtol, atol=atol)
  examples = _examples(examples)
  for variant, run in _under_variants(check, fn, variants):
    _assert_split_invariant(check, variant, run, examples, rtol, atol)


def _assert_split_invariant(check, variant, run, examples, rtol, atol):
  for i, traj in enumerate(examples):
    described = f"{_describe(i, traj)}, chex variant {variant}"
    full = _leaves(run, traj, check, described)
    _assert_finite(check, described, full, traj.mask)
    # Each segment runs alone (batch axes of size 1, so no column can see another);
    # segments of one shape share one compilation under jit.
    for idx in np.ndindex(*traj.batch_shape):
      for a, e in _segments(np.asarray(traj.mask)[(slice(None),) + idx]):
        where = (
            f"{described}, batch index {idx}, steps {a}..{e}: in the full batch (got) vs"
            " computed alone (expected)"
        )
        parts = _leaves(run, _segment(traj, idx, a, e), check, where)
        if len(parts) != len(full):
          raise ValueError(f"{check}: {where}: fn returned a different pytree on a segment")
        for (name, whole), (_, part) in zip(full, parts):
          got = whole[(slice(a, e + 1),) + idx]
          want = part[(slice(None),) + (0,) * len(idx)]  # alone, it cannot read another episode
          dtype = _strictest(_float_dtype(traj), whole.dtype, part.dtype)
          locate = lambda i, a=a, idx=idx: (a + i[0], *idx, *i[1:])  # noqa: E731
          _assert_close(check, where, name, got, want, rtol, atol, dtype, locate=locate)


_GARBAGE = {"huge": 1e6, "nan": np.nan, "inf": np.inf}


def _garbage_like(name, x, mask, num_actions, kind, rng):
  x = np.asarray(x)
  if name in _tr.ACTION_FIELDS:
    return _tr.fill_masked(x, mask, (x + 1) % max(num_actions, 1))
  value = _GARBAGE[kind]
  if kind == "huge":  # float16 holds at most 65504: huge, not inf
    value = min(value, float(jnp.finfo(x.dtype).max) / 2)
  return _tr.fill_masked(x, mask, value * rng.choice([-1.0, 1.0], size=x.shape))


def _check_garbage(check, garbage):
  if set(garbage) - set(_GARBAGE) or not garbage:
    raise ValueError(f"{check}: garbage must be a non-empty subset of {tuple(_GARBAGE)}")


_PREDICTIONS = ("v_tm1", "q_tm1")
"""Predictions: at a junction row, the values of the final observation (`v_tm1[s] ==
v_t[s - 1]`), which a truncation bootstraps from; not garbage."""


def _garbled(traj, fields, kind, rng):
  """`traj` with `kind` garbage at the masked steps of `fields`."""
  return traj._replace(
      **{f: _garbage_like(f, getattr(traj, f), traj.mask, traj.num_actions, kind, rng)
         for f in fields}
  )  # fmt: skip


def assert_masked_steps_ignored(
    fn: TargetFn,
    examples=None,
    *,
    fields: Sequence[str] | None = None,
    garbage: Sequence[str] = ("huge", "nan"),
    variants: Sequence[str] = VARIANTS,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> None:
  """Garbage at the masked steps changes nothing at the unmasked steps.

  The masked (junction) rows of the given fields are overwritten with garbage
  (`"huge"`: +-1e6, or half the largest float16; `"nan"`: NaN; `"inf"`: +-inf; actions:
  another valid action) and the outputs at unmasked steps must stay the same. This
  catches a target that reads the reward, discount or ratios of the auto-reset step, or
  multiplies them by zero instead of selecting them away (`0 * nan` is `nan`). The outputs
  must be finite at every step, the masked ones included, of the clean example and of the
  garbled ones: a NaN or inf there makes a loss that multiplies by the mask NaN.

  >>> import jax.numpy as jnp
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_masked_steps_ignored(
  ...     lambda tr: losses.soft_q_targets(tr.r_t, tr.discount_t, tr.q_t, alpha=0.5,
  ...                                      lambda_=0.8, mask=tr.mask))

  Args:
    fn: the target function, `fn(traj) -> pytree of [T, *batch, ...] arrays`.
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    fields: the Trajectory fields to garble; None garbles every field but
      `mask`, `kind` and the predictions `v_tm1` and `q_tm1` (chained: at a junction row,
      the values of the final observation, which a target reading `values[1:]`
      bootstraps a truncation from).
    garbage: the kinds of garbage to try, from `"huge"`, `"nan"` and `"inf"`.
    variants: the chex variants to run `fn` under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted.
      Keep "without_jit": under `jit`, XLA turns `mask * x` into a select and
      hides the NaN that multiplying by the mask lets through.
    rtol, atol: as in `assert_junction_split_invariant`.
    seed: seeds the garbage.

  An example without masked steps passes trivially.
  """
  check = "assert_masked_steps_ignored"
  _check_tolerances(check, rtol=rtol, atol=atol)
  examples = _examples(examples)
  names = [f for f in _tr.Trajectory._fields if f not in _tr.LAYOUT_FIELDS]
  fields = [f for f in names if f not in _PREDICTIONS] if fields is None else list(fields)
  unknown = set(fields) - set(names)
  if unknown:
    raise ValueError(f"{check}: unknown or layout fields {sorted(unknown)}; choose from {names}")
  _check_garbage(check, garbage)
  runs = _under_variants(check, fn, variants)
  rng = np.random.default_rng(seed)
  for i, traj in enumerate(examples):
    dirty = {kind: _garbled(traj, fields, kind, rng) for kind in garbage}
    for variant, run in runs:
      where = f"{_describe(i, traj)}, chex variant {variant}"
      clean = _leaves(run, traj, check, where)
      _assert_finite(check, where, clean, traj.mask, masked_too=True)
      for kind in garbage:
        what = f"{where}, {kind} garbage in {fields} at masked steps"
        garbled = _leaves(run, dirty[kind], check, what)
        for (name, want), (_, got) in zip(clean, garbled):
          select = _step_select(traj.mask, want.shape)
          dtype = _strictest(_float_dtype(traj), want.dtype)
          _assert_close(check, what, name, got, want, rtol, atol, dtype, select=select)
        # The unmasked steps are as the clean example's: finite; now the masked ones.
        _assert_finite(check, what, garbled, traj.mask, masked_too=True,
                       example="garbled example")  # fmt: skip


def assert_zero_at_masked_steps(
    fn: TargetFn,
    examples=None,
    *,
    variants: Sequence[str] = VARIANTS,
) -> None:
  """An error or advantage function's outputs are exactly 0 at the masked steps.

  Contract 1: a masked (junction) step contributes zero error and zero advantage, so a
  loss may sum or average the outputs with the mask as weights, or without it. This
  catches a TD error or advantage that is computed at the junction row too (its target
  then pulls the final observation's value toward the next episode's data), which the
  other checks pass: they compare the real steps only. Each example is run as given and
  with NaN at the masked steps of its data (every field but the layout and the
  predictions, as `assert_masked_steps_ignored` garbles them): an error multiplied by the
  mask, `mask * (target - v)`, is NaN there. Not for targets and returns, which may hold
  anything at a masked step.

  >>> import jax.numpy as jnp
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_zero_at_masked_steps(
  ...     lambda tr: losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
  ...                              jnp.exp(tr.log_rho_tm1), mask=tr.mask).errors)

  Args:
    fn: the error function, `fn(traj) -> pytree of [T, *batch, ...] arrays`.
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    variants: the chex variants to run `fn` under (see `assert_masked_steps_ignored`).

  An example without masked steps passes trivially.
  """
  check = "assert_zero_at_masked_steps"
  runs = _under_variants(check, fn, variants)
  fields = [f for f in _tr.Trajectory._fields if f not in (*_tr.LAYOUT_FIELDS, *_PREDICTIONS)]
  rng = np.random.default_rng(0)
  for i, traj in enumerate(_examples(examples)):
    given = (("", traj), (", NaN at its masked steps", _garbled(traj, fields, "nan", rng)))
    for variant, run in runs:
      for garbage, example in given:
        where = f"{_describe(i, traj)}{garbage}, chex variant {variant}"
        for name, x in _leaves(run, example, check, where):
          masked = ~_step_select(traj.mask, x.shape)
          bad = masked & ~(np.asarray(x) == 0)  # NaN too
          if bad.any():
            idx = tuple(int(j) for j in np.argwhere(bad)[0])
            raise AssertionError(
                f"{check}: {where}: output {name} is {float(x[idx])} at index {idx}, a masked "
                f"step ({int(bad.sum())} of {int(masked.sum())} masked entries are not 0): "
                "select it away, `jnp.where(mask, error, 0)`"
            )


def _floating_fields(traj) -> list[str]:
  """The Trajectory fields of a floating dtype (bfloat16 too)."""
  return [
      f
      for f in _tr.Trajectory._fields
      if jnp.issubdtype(np.asarray(getattr(traj, f)).dtype, jnp.floating)
  ]


def _names(wrt: str | Sequence[str]) -> list[str]:
  """`wrt` as a list of field names: one name may be given as a str."""
  return [wrt] if isinstance(wrt, str) else list(wrt)


def _check_wrt(check: str, wrt: list[str], floating: list[str]) -> None:
  if set(wrt) - set(floating) or not wrt:
    raise ValueError(f"{check}: wrt must name floating fields from {floating}, got {wrt}")


def _random_cotangent(rng, shapes, mask=None):
  """Standard normal draws shaped and typed as the leaves of `shapes` (arrays or
  `jax.ShapeDtypeStruct`s, [T, *batch, ...]); 0 where `mask` [T, *batch] is False, if given."""

  def draw(o):
    cotangent = rng.normal(size=o.shape)
    return jnp.asarray(cotangent if mask is None else cotangent * _step_select(mask, o.shape),
                       o.dtype)  # fmt: skip

  return jax.tree_util.tree_map(draw, shapes)


def _pulled_back(check, fn, examples, wrt, variants, seed, *, real_only):
  """Yields (where, traj, {field: gradient}) for every example and chex variant: a random
  cotangent of `fn`'s outputs (0 at the masked steps with `real_only`) pulled back to the
  `wrt` fields of the trajectory (one `jax.vjp`)."""
  rng = np.random.default_rng(seed)

  def pullback(traj, p, cotangent):
    _, vjp = jax.vjp(lambda q: fn(traj._replace(**q)), p)
    return vjp(cotangent)[0]

  runs = _under_variants(check, pullback, variants, user_fn=fn)
  for i, traj in enumerate(examples):
    _leaves(fn, traj, check, _describe(i, traj))  # validates the outputs' shapes
    primals = {f: jnp.asarray(getattr(traj, f)) for f in wrt}
    shapes = lambda tr, primals=primals: jax.eval_shape(lambda p: fn(tr._replace(**p)), primals)
    out = _call(shapes, traj, check, _describe(i, traj))

    cotangent = _random_cotangent(rng, out, traj.mask if real_only else None)
    for variant, run in runs:
      where = f"{_describe(i, traj)}, chex variant {variant}"
      yield where, traj, _call(lambda tr, run=run: run(tr, primals, cotangent), traj, check, where)


def assert_no_gradient_through_targets(
    fn: TargetFn,
    examples=None,
    *,
    wrt: str | Sequence[str] | None = None,
    variants: Sequence[str] = VARIANTS,
    atol: float = 0.0,
    seed: int = 0,
) -> None:
  """The targets carry no gradient into the inputs they are built from.

  Pulls a random cotangent of every output back to the `wrt` fields of the
  trajectory (one `jax.vjp`) and requires the gradient to be zero: a target
  computed with `stop_gradient` (e.g. `stop_target_gradients=True`) is a
  constant for the optimiser. This catches a target function that forgets
  its `stop_gradient`, so that the critic is trained to move its own
  bootstrap targets.

  Apply it to the targets, or to TD errors `target - prediction` with `wrt`
  leaving out the prediction (the default leaves out `v_tm1` and `q_tm1`).

  >>> import jax.numpy as jnp
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_no_gradient_through_targets(
  ...     lambda tr: losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
  ...                              jnp.exp(tr.log_rho_tm1), mask=tr.mask).errors)

  Args:
    fn: the target function, `fn(traj) -> pytree of [T, *batch, ...] arrays`.
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    wrt: the floating Trajectory fields that must get no gradient (or one name); None uses
      every floating field but the predictions `v_tm1` and `q_tm1`.
    variants: the chex variants to compute the gradient under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted.
    atol: the largest absolute gradient allowed, finite and >= 0 (0: exactly none).
    seed: seeds the random cotangents.
  """
  check = "assert_no_gradient_through_targets"
  _check_tolerances(check, allow_none=False, atol=atol)
  examples = _examples(examples)
  floating = _floating_fields(examples[0])
  wrt = [f for f in floating if f not in _PREDICTIONS] if wrt is None else _names(wrt)
  _check_wrt(check, wrt, floating)
  for where, _, grads in _pulled_back(check, fn, examples, wrt, variants, seed, real_only=False):
    for name in wrt:
      g = np.asarray(grads[name], np.float64)
      try:
        chex.assert_trees_all_close(g, np.zeros_like(g), rtol=0.0, atol=atol)
      except AssertionError as e:
        over = ~(np.abs(g) <= atol)
        idx = np.unravel_index(int(np.argmax(np.nan_to_num(np.abs(g), nan=np.inf))), g.shape)
        raise AssertionError(
            f"{check}: {where}: the outputs carry a gradient into {name}: nonzero at"
            f" {int(over.sum())} of {g.size} entries, largest {g[idx]!r} at index"
            f" {tuple(int(k) for k in idx)} (is a stop_gradient missing on the targets?)"
            f"\nchex: {e}"
        ) from None


def assert_gradient_reaches_predictions(
    fn: TargetFn,
    examples=None,
    *,
    wrt: str | Sequence[str],
    variants: Sequence[str] = VARIANTS,
    seed: int = 0,
) -> None:
  """The outputs carry a gradient into the predictions at every unmasked step.

  The mirror image of `assert_no_gradient_through_targets`: pulls a random cotangent
  of the outputs at the unmasked steps back to the `wrt` fields (one `jax.vjp`: the
  gradient of a random weighted sum of the per-step losses) and requires the gradient
  to be finite everywhere and nonzero at every unmasked step s: at `[s, *b]` of a
  `[T, *batch]` field, at some action of a `[T, *batch, A]` one (a TD error reads
  `q_tm1[s, ..., a_tm1[s]]` only). This catches a loss whose critic is not trained: an
  extra `jax.lax.stop_gradient` on the prediction (`v_tm1`, `q_tm1`), which the other
  checks pass, as the outputs are unchanged.

  Strict at every unmasked step: the cotangents are random, and so is the data, so the
  gradient of a correct loss is 0 there with probability 0 (a squared error's is 0
  where the error is). Every error and loss of `offpolicy_ac.losses` reads its
  prediction at every real step (V-trace's `pg_advantage` through ratios > 0). A loss
  that leaves some real steps out on purpose fails; check it on examples without them.

  >>> import jax.numpy as jnp
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_gradient_reaches_predictions(
  ...     lambda tr: losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
  ...                              jnp.exp(tr.log_rho_tm1), mask=tr.mask).errors,
  ...     wrt=["v_tm1"])

  Args:
    fn: the loss function, `fn(traj) -> pytree of [T, *batch, ...] arrays` (per-step
      errors or losses; return the per-step terms of a reduced loss).
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    wrt: the floating Trajectory fields the loss trains, e.g. `["v_tm1"]` or
      `["q_tm1"]`, or one such name (no default: a loss reads only some of the
      predictions).
    variants: the chex variants to compute the gradient under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted.
    seed: seeds the random cotangents.

  Raises:
    AssertionError: a gradient that is not finite, or 0 at an unmasked step.
  """
  check = "assert_gradient_reaches_predictions"
  examples = _examples(examples)
  wrt = _names(wrt)
  _check_wrt(check, wrt, _floating_fields(examples[0]))
  for where, traj, grads in _pulled_back(check, fn, examples, wrt, variants, seed, real_only=True):
    for name in wrt:
      _assert_gradient_reaches(check, where, name, np.asarray(grads[name]), traj.mask)


def _assert_gradient_reaches(check, where, name, g, mask):
  """`chex.assert_tree_all_finite` on the gradient into `name`, then nonzero at every
  unmasked step (at some entry of its trailing axes, e.g. the taken action)."""
  try:
    chex.assert_tree_all_finite(g)
  except AssertionError as e:
    bad = ~np.isfinite(np.asarray(g, np.float64))
    real = _step_select(mask, g.shape)
    idx = tuple(int(k) for k in np.argwhere(bad & real if (bad & real).any() else bad)[0])
    step = "an unmasked" if real[idx] else "a masked"
    raise AssertionError(
        f"{check}: {where}: the gradient into {name} is {g[idx]!r} at index {idx}, {step}"
        f" step of the clean example\nchex: {e}"
    ) from None
  real = np.asarray(mask, bool)
  reached = np.any(np.reshape(g, real.shape + (-1,)) != 0, axis=-1)
  missed = real & ~reached
  if missed.any():
    idx = tuple(int(k) for k in np.argwhere(missed)[0])
    raise AssertionError(
        f"{check}: {where}: no gradient reaches {name} at unmasked step {idx}"
        f" ({int(missed.sum())} of {int(real.sum())} unmasked steps get none): is a"
        f" stop_gradient on the prediction {name}, or is the step left out of the loss?"
    )


def assert_masked_steps_get_no_gradient(
    fn: TargetFn,
    examples=None,
    *,
    wrt: str | Sequence[str] | None = None,
    garbage: Sequence[str] = ("huge", "nan", "inf"),
    variants: Sequence[str] = VARIANTS,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> None:
  """Garbage at the masked steps changes no gradient of the outputs at the real steps.

  Overwrites the masked rows of every field but `mask`, `kind` and the predictions with
  garbage (as `assert_masked_steps_ignored`), pulls a random cotangent of the outputs at
  the unmasked steps back to the `wrt` fields (one `jax.vjp`), and requires every gradient to be
  finite, exactly 0 at the masked steps, and equal to the gradient on the clean example.
  It catches a target that masks its outputs with `jnp.where(mask, f(x), 0)` but lets
  the garbage into `f`: the value is right, but the backward pass multiplies the zero
  cotangent by f'(x), and `0 * nan` is nan. Replace such inputs first
  (`x = jnp.where(mask, x, 0)`, the "double where"). Arithmetic in `fn` itself counts:
  pass `jnp.exp(tr.log_rho_tm1)` and the exponential of a masked inf has a NaN gradient.

  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_masked_steps_get_no_gradient(
  ...     lambda tr: losses.soft_q_targets(tr.r_t, tr.discount_t, tr.q_t, alpha=0.5,
  ...                                      lambda_=0.8, mask=tr.mask,
  ...                                      stop_target_gradients=False))

  Args:
    fn: the target function, `fn(traj) -> pytree of [T, *batch, ...] arrays`.
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    wrt: the floating Trajectory fields whose gradients are compared (or one
      name); None: all of them.
    garbage: the kinds of garbage to try, from `"huge"`, `"nan"` and `"inf"`.
    variants: the chex variants to compute the gradient under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted.
    rtol, atol: as in `assert_junction_split_invariant`, for the gradients.
    seed: seeds the garbage and the cotangents.
  """
  check = "assert_masked_steps_get_no_gradient"
  _check_tolerances(check, rtol=rtol, atol=atol)
  examples = _examples(examples)
  fields = [f for f in _tr.Trajectory._fields if f not in _tr.LAYOUT_FIELDS]
  floating = [f for f in _floating_fields(examples[0]) if f in fields]
  fields = [f for f in fields if f not in _PREDICTIONS]  # garbled: see _PREDICTIONS
  wrt = floating if wrt is None else _names(wrt)
  _check_wrt(check, wrt, floating)
  _check_garbage(check, garbage)
  rng = np.random.default_rng(seed)

  def pullback(traj, cotangent):
    primals = {f: getattr(traj, f) for f in wrt}
    _, vjp = jax.vjp(lambda p: fn(traj._replace(**p)), primals)
    return vjp(cotangent)[0]

  runs = _under_variants(check, pullback, variants, user_fn=fn)
  for i, traj in enumerate(examples):
    _leaves(fn, traj, check, _describe(i, traj))  # per step, or a ValueError
    cotangent = _random_cotangent(rng, jax.eval_shape(fn, traj), traj.mask)
    dirty = {kind: _garbled(traj, fields, kind, rng) for kind in garbage}
    for variant, run in runs:
      where = f"{_describe(i, traj)}, chex variant {variant}"
      clean = _call(lambda tr, run=run: run(tr, cotangent), traj, check, where)
      for kind in garbage:
        what = f"{where}, {kind} garbage at masked steps"
        grads = _call(lambda tr, run=run: run(tr, cotangent), dirty[kind], check, what)
        for name in wrt:
          got, want = np.asarray(grads[name]), np.asarray(clean[name])
          # A prediction at a junction row is the final observation's: a truncation's
          # bootstrap from it (`values[1:]`, stop_target_gradients=False) has a gradient.
          masked = ~_step_select(traj.mask, got.shape) & (name not in _PREDICTIONS)
          bad = ~np.isfinite(got) | (masked & (got != 0))
          if bad.any():
            idx = tuple(int(k) for k in np.argwhere(bad)[0])
            real = _step_select(traj.mask, got.shape)[idx]
            raise AssertionError(
                f"{check}: {what}: the gradient into {name} is {got[idx]!r} at index {idx}"
                f" ({'an unmasked' if real else 'a masked'} step; {int(bad.sum())} of"
                f" {bad.size} entries not finite or, at a masked step, not 0): is garbage"
                " computed with before a `jnp.where` drops it?"
            )
          _assert_close(check, what, f"gradient into {name}", got, want, rtol, atol, got.dtype)


def assert_matches_reference(
    fn: TargetFn,
    reference: Callable[[_tr.Trajectory], Any],
    examples=None,
    *,
    variants: Sequence[str] = VARIANTS,
    compare_masked: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
  """`fn` agrees with a float64 reference on trajectories with every kind of boundary.

  `reference(traj)` returns the same outputs as `fn` (the same pytree, or any
  pytree with the same leaves in the same order), e.g. a loop from
  `offpolicy_ac.testing.reference`. `fn` runs under each chex variant (by
  default as is and under `jax.jit`).
  Outputs are compared at the unmasked steps (everywhere with
  `compare_masked=True`), with a tolerance scaled to the reference's
  magnitude.

  >>> import jax.numpy as jnp
  >>> import numpy as np
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_matches_reference(
  ...     lambda tr: losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
  ...                              jnp.exp(tr.log_rho_tm1), mask=tr.mask),
  ...     lambda tr: testing.reference.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
  ...                                         np.exp(tr.log_rho_tm1), mask=tr.mask))

  Args:
    fn: the target function, `fn(traj) -> pytree of [T, *batch, ...] arrays`.
    reference: `reference(traj) -> pytree of arrays`, the expected outputs.
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    variants: the chex variants to run `fn` under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted.
    compare_masked: also compare the masked steps.
    rtol, atol: as in `assert_junction_split_invariant` (default 1e-4 for
      float32, 1e-10 for float64, 8 epsilons of float16 and bfloat16, of the stricter of
      the trajectory's and the outputs' dtypes).
  """
  check = "assert_matches_reference"
  _check_tolerances(check, rtol=rtol, atol=atol)
  examples = _examples(examples)
  runs = _under_variants(check, fn, variants)
  _check_takes_one_trajectory(check, reference, "reference")
  for i, traj in enumerate(examples):
    expected = [np.asarray(x) for x in jax.tree_util.tree_leaves(reference(traj))]
    for k, x in enumerate(expected):
      _check_real(check, f"the reference's output {k}", x)
    expected = [x.astype(np.float64) for x in expected]
    for variant, run in runs:
      where = f"{_describe(i, traj)}, chex variant {variant}"
      flat = _leaves(run, traj, check, where)  # per step, or a ValueError
      if len(flat) != len(expected):
        raise AssertionError(
            f"{check}: {where}: fn returned {len(flat)} arrays, the reference {len(expected)}"
        )
      for (name, got), want in zip(flat, expected):
        select = None if compare_masked else _step_select(traj.mask, np.shape(got))
        dtype = _strictest(_float_dtype(traj), got.dtype)
        _assert_close(check, where, name, got, want, rtol, atol, dtype, select=select)


def _final_values_moved(traj, last, perturbation, rng):
  """`traj` with the value of the final observation x_{s+1} of every step s where `last`
  holds moved by a random +-[1, 2] * perturbation: `v_t[s]`, `q_t[s]` (every action by the
  same amount) and, chained, `v_tm1[s + 1]`, `q_tm1[s + 1]` (the junction row after s);
  also returns the moves, [T, *batch] (0 where `last` does not hold)."""
  shape = np.shape(last)
  move = perturbation * rng.choice([-1.0, 1.0], size=shape) * rng.uniform(1.0, 2.0, size=shape)
  move = np.where(last, move, 0.0)
  after = np.concatenate([np.zeros_like(move[:1]), move[:-1]])  # the row after s: s + 1

  def add(x, d):
    x = np.asarray(x)
    return (x.astype(np.float64) + d.reshape(d.shape + (1,) * (x.ndim - d.ndim))).astype(x.dtype)

  moved = traj._replace(
      v_t=add(traj.v_t, move),
      q_t=add(traj.q_t, move),
      v_tm1=add(traj.v_tm1, after),
      q_tm1=add(traj.q_tm1, after),
  )
  return moved, move


def _assert_changed(check, where, name, got, want, mask, at, move, discount, rtol, atol, dtype):
  """Every step where `at` holds and the bootstrap's move, `discount * move`, is over ten
  times the tolerance (`_tolerance`, scaled to `want` at the unmasked steps) has some entry
  of output `name` that moved by more than the tolerance. A smaller move (gamma 0 or tiny)
  cannot tell a truncation from a termination, and is not required to show."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  compared = _step_select(mask, want.shape) & np.isfinite(want)
  rtol, atol = _tolerance(want, compared, rtol, atol, dtype)
  with np.errstate(invalid="ignore"):
    changed = np.abs(got - want) > atol + rtol * np.abs(want)
  changed = np.any(np.reshape(changed, np.shape(at) + (-1,)), axis=-1)
  scale = float(np.max(np.abs(np.where(compared, want, 0.0)), initial=0.0))
  with np.errstate(invalid="ignore"):
    shows = np.abs(np.asarray(discount, np.float64) * move) > 10 * (atol + rtol * scale)
  unchanged = np.asarray(at, bool) & shows & ~changed
  if unchanged.any():
    idx = tuple(int(k) for k in np.argwhere(unchanged)[0])
    entry = idx + (0,) * (got.ndim - len(idx))  # its first entry, if it has trailing axes
    raise AssertionError(
        f"{check}: {where}: output {name} is unchanged at truncated step {idx} (got"
        f" {got[entry]!r}, {want[entry]!r} before; {int(unchanged.sum())} of"
        f" {int(np.sum(at))} truncated steps unchanged) when the value of its final"
        f" observation moves by {float(move[idx]):+.4g} (v_t and q_t at step {idx}, v_tm1"
        " and q_tm1 at the junction row after it): a truncation bootstraps from that"
        " value, its discount_t is gamma, not 0 (is the time limit taken for a"
        " termination?)"
    )


def assert_truncation_bootstraps(
    fn: TargetFn,
    examples=None,
    *,
    variants: Sequence[str] = VARIANTS,
    perturbation: float = 100.0,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> None:
  """A truncated episode bootstraps from its final observation; a terminated one does not.

  A LAST step s (row s of a column, an unmasked `TRUNCATION` or `TERMINATION`) is the
  transition `(x_s, a_s, r_s, x_{s+1})`. The value of its final observation x_{s+1} is
  `v_t[s]` and `q_t[s]` (the targets' bootstrap, every action) and, chained, `v_tm1[s + 1]`
  and `q_tm1[s + 1]`, the junction row after it (when s + 1 < T), where a target that
  reads `values[1:]` finds it. The check moves those four by a random +-[1, 2] times
  `perturbation` (every action by the same amount, so that `sum_a pi q`, the max and the
  soft value move by it too):

  * at every truncation (`discount_t` = gamma > 0), each output must change at step s
    (some entry of its trailing axes, by more than the tolerance): the target there is
    `r_s + gamma V(x_{s+1})`, or mixes it in. This catches a time limit taken for a
    termination (discount 0, a `done` that includes truncations). A truncation whose
    `gamma * move` is at most ten times the tolerance (gamma 0 or tiny: it cannot be told
    from a termination) is not required to change; a larger `perturbation` reaches
    smaller gammas. The earlier steps of
    the episode, from its first step (after the previous junction, or 0) to s - 1, are
    not required to change: they see x_{s+1} through a trace (lambda > 0) or an n-step
    sum only, not at all at lambda = 0 or n = 1, and scaled by the product of
    gamma * lambda * c along the way, which can fall below any tolerance.
  * at every termination (`discount_t` = 0) at once, no output may change at any
    unmasked step (rows 0 to T - 1 of every column).

  >>> import jax.numpy as jnp
  >>> from offpolicy_ac import losses, testing
  >>> testing.assert_truncation_bootstraps(
  ...     lambda tr: losses.retrace_targets(tr.q_t, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t,
  ...                                       tr.mu_t, mask=tr.mask, lambda_=0.9))

  Args:
    fn: the target function, `fn(traj) -> pytree of [T, *batch, ...] arrays`; every
      output must bootstrap (pick them, e.g. `lambda tr: fn(tr).q_estimate`).
    examples: a Trajectory, a sequence of them, or None for `default_examples()`.
    variants: the chex variants to run `fn` under, from "without_jit",
      "with_jit", "without_device" and "with_device"; by default as is and jitted.
    perturbation: the size of the moves, > 0 (the default, 100, is 50 times the values'
      scale, and far below float16's largest value).
    rtol, atol: as in `assert_junction_split_invariant`, for what counts as a change.
    seed: seeds the moves.

  An example without truncations (terminations) passes that half trivially.

  Raises:
    AssertionError: an output unchanged at a truncation, or changed by a termination.
  """
  check = "assert_truncation_bootstraps"
  _check_tolerances(check, rtol=rtol, atol=atol)
  if not 0.0 < perturbation < np.inf:
    raise ValueError(f"{check}: perturbation must be finite and > 0, got {perturbation}")
  examples = _examples(examples)
  runs = _under_variants(check, fn, variants)
  rng = np.random.default_rng(seed)
  for i, traj in enumerate(examples):
    real, kind = np.asarray(traj.mask, bool), np.asarray(traj.kind)
    truncated, terminated = real & (kind == _tr.TRUNCATION), real & (kind == _tr.TERMINATION)
    cut, cut_moves = _final_values_moved(traj, truncated, perturbation, rng)
    ended, _ = _final_values_moved(traj, terminated, perturbation, rng)
    ends = [tuple(int(k) for k in idx) for idx in np.argwhere(terminated)]
    for variant, run in runs:
      where = f"{_describe(i, traj)}, chex variant {variant}"
      clean = _leaves(run, traj, check, where)
      _assert_finite(check, where, clean, traj.mask)
      what = f"{where}, the final observations of the truncated steps moved"
      moved = _leaves(run, cut, check, what)
      _assert_finite(check, what, moved, traj.mask)
      for (name, want), (_, got) in zip(clean, moved):
        dtype = _strictest(_float_dtype(traj), want.dtype)
        _assert_changed(check, where, name, got, want, traj.mask, truncated, cut_moves,
                        traj.discount_t, rtol, atol, dtype)  # fmt: skip
      what = (
          f"{where}, the final observations of the terminated steps {ends} moved (v_t and q_t"
          " there, v_tm1 and q_tm1 at the junction rows after them): a termination must not"
          " bootstrap, its discount_t is 0; moved (got) vs clean (expected)"
      )
      for (name, want), (_, got) in zip(clean, _leaves(run, ended, check, what)):
        select = _step_select(traj.mask, want.shape)
        dtype = _strictest(_float_dtype(traj), want.dtype)
        _assert_close(check, what, name, got, want, rtol, atol, dtype, select=select)
