"""Tests for `reverse_linear_recurrence`: acc_t = b_t + a_t acc_{t+1}, acc_T = init.

Three layers: hand-computed cases, a float64 NumPy loop reference on random
inputs (hypothesis), and identities (scan == associative for any unroll, batch
shapes == vmap, a zero coefficient cuts the recursion, gradients). Every
numeric test runs jitted and not: the tests in `RecurrenceVariantsTest` and
`RecurrenceBadInputTest` run under chex's variants (`self.variant` is chex's
with_jit or without_jit); hypothesis properties and the float64 finite
differences run jitted. Hypothesis examples are padded to one time length
(T_PAD) so that each (shape, method) compiles once.
"""

import functools

from absl.testing import parameterized
import chex
from hypothesis import given
from hypothesis import strategies as st
import jax
from jax import test_util as jtu
import jax.numpy as jnp
import numpy as np
import pytest
from scan_variants import scan_and_associative

from offpolicy_ac.losses import reverse_linear_recurrence
from offpolicy_ac.testing import reference as ref

METHODS = ["scan", "associative"]
# "auto" (the default: scan on CPU) joins the first hand-computed case (and
# the method-agreement test).
ALL_METHODS = ["scan", "associative", "auto"]
T_PAD = 20
BATCH_SHAPES = [(), (3,), (2, 3)]
# Hypothesis drives the jitted runs; the chex variants' runs (eager and jitted)
# of the same checks use a few fixed seeded examples, because an eager call
# re-traces and re-compiles its reverse scan every time (~50 ms) -- what differs
# between jit and eager is trace-time behaviour, which a few examples exercise
# as well as many.
# Eager `associative_scan` compiles each of its many slicing ops on first use
# of every new shape / dtype / transformation (1-3 s each). Tests that would
# add such variants (vmap, grad, other dtypes) run it jitted only (a `_scan` test
# under both chex variants, an `_associative` one under with_jit); the eager
# associative path is covered by the hand-computed, reference and unroll tests.


def _run(wrap, *args, **static):
  """Calls the recurrence on `args` with `static` bound, wrapped by `wrap`
  (`self.variant`: jitted or eager).

  NumPy inputs are converted to jax arrays (see `test_accepts_numpy_arrays`
  for raw NumPy inputs).
  """
  args = [jnp.asarray(x) for x in args]
  f = functools.partial(reverse_linear_recurrence, **static)
  return wrap(f)(*args)


@functools.lru_cache(maxsize=None)
def _cached(method, unroll=1):
  """One function per static setting, so repeated jits reuse compilations."""
  return functools.partial(reverse_linear_recurrence, method=method, unroll=unroll)


def _assert_scaled_close(actual, expected, scale, rtol, atol=0.0):
  """|actual - expected| <= rtol * scale + atol elementwise.

  `scale` is the same sum computed on absolute values, so the bound holds
  whatever the cancellation in the sum.
  """
  actual = np.asarray(actual, np.float64)
  assert actual.shape == np.shape(expected), (actual.shape, np.shape(expected))
  assert np.all(np.isfinite(actual)), actual
  bound = rtol * np.asarray(scale) + atol
  bad = np.abs(actual - expected) > bound
  assert not np.any(bad), (
      f"mismatch at {np.argwhere(bad)[:5].tolist()}: actual "
      f"{actual[bad][:5]}, expected {np.asarray(expected)[bad][:5]}"
  )


# ---------------------------------------------------------------------------
# Layer 2: the float64 loop reference on random inputs.
# ---------------------------------------------------------------------------


def _random_problem(rng, t_len, batch_shape, dtype):
  shape = (t_len,) + tuple(batch_shape)
  a = rng.uniform(-1.2, 1.2, size=shape)
  a[rng.random(shape) < 0.2] = 0.0  # Cuts, as at episode boundaries.
  a[rng.random(shape) < 0.1] = 1.0
  b = rng.normal(size=shape) * rng.choice([0.1, 1.0, 100.0])
  init = rng.normal(size=shape[1:])
  return a.astype(dtype), b.astype(dtype), np.asarray(init).astype(dtype)


def _pad(a, b, t_pad):
  """Pads the time axis with identity maps (a = 1, b = 0): acc is unchanged."""
  n = t_pad - a.shape[0]
  pad_a = np.ones((n,) + a.shape[1:], a.dtype)
  pad_b = np.zeros((n,) + b.shape[1:], b.dtype)
  return np.concatenate([a, pad_a]), np.concatenate([b, pad_b])


def _check_matches_loop_reference(wrap, methods, x64, t_len, batch, seed):
  rng = np.random.default_rng(seed)
  dtype = np.float64 if x64 else np.float32
  a, b, init = _random_problem(rng, t_len, batch, dtype)
  expected = ref.reverse_linear_recurrence(a, b, init)
  scale = ref.reverse_linear_recurrence(np.abs(a), np.abs(b), np.abs(init))
  pad_a, pad_b = _pad(a, b, T_PAD)
  for method in methods:
    with jax.enable_x64(x64):
      out = wrap(_cached(method))(jnp.asarray(pad_a), jnp.asarray(pad_b), jnp.asarray(init))
      chex.assert_type(out, dtype)
      chex.assert_shape(out, pad_b.shape)
      out = np.asarray(out)
    rtol = 1e-12 if x64 else 1e-5
    _assert_scaled_close(out[:t_len], expected, scale, rtol)
    # The identity padding carries init unchanged.
    np.testing.assert_array_equal(out[t_len:], np.broadcast_to(init, out[t_len:].shape))


_PROBLEMS = dict(
    t_len=st.integers(1, T_PAD), batch=st.sampled_from(BATCH_SHAPES), seed=st.integers(0, 2**32 - 1)
)


@pytest.mark.parametrize("x64", [False, True], ids=["f32", "f64"])
@given(**_PROBLEMS)
def test_matches_loop_reference_jit(x64, t_len, batch, seed):
  # float32: both methods on each example (one reference computation).
  # float64 (tight tolerance, checks the algorithm rather than rounding):
  # scan only -- the methods' agreement is checked in float32 here and in
  # test_scan_unroll_and_associative_agree.
  methods = ("scan",) if x64 else ("scan", "associative")
  _check_matches_loop_reference(jax.jit, methods, x64, t_len, batch, seed)


# Fixed examples, jitted and eager (`RecurrenceVariantsTest`): scan over the
# three batch ranks; associative on [T, 2, 3] only (eager associative_scan
# compiles its many ops per new shape).
_FIXED_REFERENCE_EXAMPLES = [
    ("scan", 13, (), 0),
    ("scan", T_PAD, (3,), 1),
    ("scan", 7, (2, 3), 2),
    ("associative", 1, (2, 3), 3),
    ("associative", T_PAD, (2, 3), 4),
]


# ---------------------------------------------------------------------------
# Layer 3: identities.
# ---------------------------------------------------------------------------


def _check_batch_shapes_and_vmap_agree(wrap, method):
  rng = np.random.default_rng(0)
  a, b, init = (jnp.asarray(x) for x in _random_problem(rng, T_PAD, (2, 3), np.float32))
  f = wrap(_cached(method))
  full = np.asarray(f(a, b, init))
  chex.assert_shape(full, (T_PAD, 2, 3))
  # [T, B] per leading batch row, [T] per column.
  for i in range(2):
    row = np.asarray(f(a[:, i], b[:, i], init[i]))
    chex.assert_shape(a[:, i], (T_PAD, 3))
    np.testing.assert_allclose(row, full[:, i], rtol=1e-6, atol=1e-6)
    for j in range(3):
      col = np.asarray(f(a[:, i, j], b[:, i, j], init[i, j]))
      chex.assert_shape(col, (T_PAD,))
      np.testing.assert_allclose(col, full[:, i, j], rtol=1e-6, atol=1e-6)
  # jax.vmap over batch axis 1 of a [T, B1, B2] problem (init axis 0).
  # (Jitted only: vmap traces the function either way, and eager vmap would
  # compile every batched op once more.)
  f = functools.partial(reverse_linear_recurrence, method=method)
  vmapped = jax.jit(jax.vmap(f, in_axes=(1, 1, 0), out_axes=1))
  np.testing.assert_allclose(vmapped(a, b, init), full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_finite_differences_float64(method):
  # Jitted only: eager float64 differentiation of the associative scan costs
  # seconds of op-by-op compilation; the closed-form test below runs both.
  rng = np.random.default_rng(2)
  with jax.enable_x64(True):
    a, b, init = (jnp.asarray(x) for x in _random_problem(rng, 6, (2,), np.float64))
    f = jax.jit(functools.partial(reverse_linear_recurrence, method=method))
    jtu.check_grads(f, (a, b, init), order=1, modes=["rev", "fwd"])


def _check_gradient_closed_form(wrap, method):
  # d acc_0 / d b_t = prod_{i < t} a_i; d acc_0 / d init = prod_i a_i.
  rng = np.random.default_rng(3)
  a, b, init = (jnp.asarray(x) for x in _random_problem(rng, T_PAD, (3,), np.float32))
  f = functools.partial(reverse_linear_recurrence, method=method)
  loss = wrap(lambda bb, ii: f(a, bb, ii)[0].sum())
  grad_b, grad_init = jax.grad(loss, argnums=(0, 1))(b, init)
  expected = np.ones(b.shape)
  for t in range(1, T_PAD):
    expected[t] = expected[t - 1] * np.asarray(a, np.float64)[t - 1]
  np.testing.assert_allclose(grad_b, expected, rtol=1e-5, atol=1e-30)
  np.testing.assert_allclose(
      grad_init, expected[-1] * np.asarray(a, np.float64)[-1], rtol=1e-5, atol=1e-30
  )


def _check_preserves_float_dtypes(wrap, method):
  a = np.full((4, 2), 0.5)
  b = np.ones((4, 2))
  for dtype in (jnp.float32, jnp.bfloat16):
    out = _run(wrap, a.astype(dtype), b.astype(dtype), method=method)
    chex.assert_type(out, dtype)
    np.testing.assert_allclose(
        np.asarray(out, np.float64)[:, 0], [1.875, 1.75, 1.5, 1.0], rtol=1e-2
    )
  with jax.enable_x64(True):
    out = _run(wrap, a, b, method=method)
    chex.assert_type(out, jnp.float64)


class RecurrenceVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  # -------------------------------------------------------------------------
  # Layer 1: hand-computed cases.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=ALL_METHODS)
  def test_hand_computed_default_init(self, method):
    # acc_2 = 3, acc_1 = 2 + 2 * 3 = 8, acc_0 = 1 + 0.5 * 8 = 5.
    a = jnp.array([0.5, 2.0, 3.0])
    b = jnp.array([1.0, 2.0, 3.0])
    out = _run(self.variant, a, b, method=method)
    chex.assert_type(out, jnp.float32)
    chex.assert_shape(out, (3,))
    np.testing.assert_allclose(out, [5.0, 8.0, 3.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_hand_computed_with_init(self, method):
    # acc_3 = 10: acc_2 = 3 + 3 * 10 = 33, acc_1 = 2 + 2 * 33 = 68,
    # acc_0 = 1 + 0.5 * 68 = 35.
    a = jnp.array([0.5, 2.0, 3.0])
    b = jnp.array([1.0, 2.0, 3.0])
    out = _run(self.variant, a, b, jnp.float32(10.0), method=method)
    np.testing.assert_allclose(out, [35.0, 68.0, 33.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_hand_computed_batch_and_single_step(self, method):
    # T = 1, B = 2: acc_0 = b_0 + a_0 * init per column.
    a = jnp.array([[2.0, 3.0]])
    b = jnp.array([[1.0, 1.0]])
    init = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(
        _run(self.variant, a, b, init, method=method), [[3.0, 7.0]], rtol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_zero_coefficient_cuts_huge_later_values(self, method):
    # a_0 = 0: acc_0 must not see the (huge, finite) values after it.
    # (acc_1 = 1e30 + (-5e29 + 1e30) = 1.5e30 stays finite: 0 * inf would be
    # NaN by IEEE rules, which is why the estimators select with `where`
    # instead of relying on a = 0.)
    a = jnp.array([0.0, 1.0, 1.0])
    b = jnp.array([2.0, 1e30, -5e29])
    out = np.asarray(_run(self.variant, a, b, jnp.float32(1e30), method=method))
    np.testing.assert_allclose(out, [2.0, 1.5e30, 5e29], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_coefficients_above_one_whose_products_overflow(self, method):
    # a = 9.9 for 256 steps: the associative scan's products of a over long ranges
    # overflow float32, but each meets a zero (the termination's a at 127, b's zeros): the
    # exact result there is 0, as the scan computes it, not 0 * inf = NaN.
    a = jnp.full((256, 2), 9.9).at[127].set(0.0)
    b = jnp.zeros((256, 2)).at[150, 1].set(1e-3)
    out = np.asarray(_run(self.variant, a, b, method=method))
    expected = np.zeros((256, 2))
    expected[128:151, 1] = 1e-3 * 9.9 ** (150 - np.arange(128, 151.0))
    np.testing.assert_allclose(out, expected, rtol=1e-4)

  # -------------------------------------------------------------------------
  # Layer 2: the float64 loop reference on fixed examples.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*_FIXED_REFERENCE_EXAMPLES)
  def test_matches_loop_reference_fixed_examples(self, method, t_len, batch, seed):
    # float32 only: eager float64 would double the op-by-op compilations.
    _check_matches_loop_reference(self.variant, (method,), False, t_len, batch, seed)

  # -------------------------------------------------------------------------
  # Layer 3: identities.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(unroll=[3])  # 3 does not divide T = 20
  def test_scan_unroll_and_associative_agree(self, unroll):
    rng = np.random.default_rng(unroll)
    a, b, init = _random_problem(rng, T_PAD, (2, 3), np.float32)
    expected = ref.reverse_linear_recurrence(a, b, init)
    scale = ref.reverse_linear_recurrence(np.abs(a), np.abs(b), np.abs(init))
    a, b, init = jnp.asarray(a), jnp.asarray(b), jnp.asarray(init)
    scan = self.variant(_cached("scan", unroll))(a, b, init)
    assoc = self.variant(_cached("associative"))(a, b, init)
    auto = self.variant(_cached("auto", unroll))(a, b, init)
    _assert_scaled_close(scan, expected, scale, 1e-5)
    _assert_scaled_close(assoc, expected, scale, 1e-5)
    _assert_scaled_close(auto, expected, scale, 1e-5)
    _assert_scaled_close(scan, np.asarray(assoc, np.float64), scale, 2e-5)
    if unroll > 1:  # and the plain scan
      np.testing.assert_allclose(
          scan,
          self.variant(_cached("scan"))(a, b, init),
          rtol=1e-6,
          atol=1e-6 * float(np.max(scale)),
      )

  test_batch_shapes_and_vmap_agree_scan, test_batch_shapes_and_vmap_agree_associative = (
      scan_and_associative(_check_batch_shapes_and_vmap_agree)
  )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_accepts_numpy_arrays(self, method):
    # Like every jax / rlax function, NumPy arrays are valid inputs.
    a = np.array([0.5, 2.0, 3.0], np.float32)
    b = np.array([1.0, 2.0, 3.0], np.float32)
    f = self.variant(functools.partial(reverse_linear_recurrence, method=method))
    np.testing.assert_allclose(f(a, b), [5.0, 8.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(f(a, b, np.float32(10.0)), [35.0, 68.0, 33.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_default_init_is_zero(self, method):
    rng = np.random.default_rng(1)
    a, b, _ = _random_problem(rng, T_PAD, (2, 3), np.float32)
    a, b = jnp.asarray(a), jnp.asarray(b)
    f = self.variant(_cached(method))
    chex.assert_trees_all_close(f(a, b), f(a, b, jnp.zeros((2, 3))), rtol=1e-6)

  test_gradient_closed_form_scan, test_gradient_closed_form_associative = scan_and_associative(
      _check_gradient_closed_form
  )

  test_preserves_float_dtypes_scan, test_preserves_float_dtypes_associative = scan_and_associative(
      _check_preserves_float_dtypes
  )


# ---------------------------------------------------------------------------
# Bad input: fails at trace time, naming the argument.
# ---------------------------------------------------------------------------


class RecurrenceBadInputTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_bad_method_raises(self):
    x = jnp.ones(3)
    with pytest.raises(ValueError, match="`method`"):
      _run(self.variant, x, x, method="fft")

  def test_a_bad_unroll_is_refused(self):
    """unroll was taken silently with method='associative' (which has none) and at 0."""
    x = jnp.ones(3)
    with pytest.raises(ValueError, match=r"unroll=2 is lax.scan's unroll factor: .*not "
                       r"'associative'"):  # fmt: skip
      reverse_linear_recurrence(x, x, method="associative", unroll=2)
    for unroll in (0, -1, 1.5, "2"):
      with pytest.raises(ValueError, match="unroll must be an int >= 1 or a bool"):
        reverse_linear_recurrence(x, x, method="scan", unroll=unroll)
    np.testing.assert_array_equal(reverse_linear_recurrence(x, x, method="scan", unroll=True),
                                  reverse_linear_recurrence(x, x, method="scan"))  # fmt: skip
    with pytest.raises(ValueError, match=r"unroll=True is lax.scan's unroll factor"):
      reverse_linear_recurrence(x, x, method="associative", unroll=True)

  def test_unroll_reaches_lax_scan(self):
    """unroll=True (True == 1) ran the plain scan, not the whole loop unrolled."""
    x = jnp.ones(8)
    for unroll, steps in ((True, 8), (False, 1), (1, 1), (4, 4)):  # steps per loop body
      jaxpr = jax.make_jaxpr(
          functools.partial(reverse_linear_recurrence, method="scan", unroll=unroll)
      )(x, x)
      (scan,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
      assert scan.params["unroll"] == steps, (unroll, scan.params["unroll"])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(
      [
          dict(a_shape=(3,), b_shape=(4,), init_shape=None, name="`a`"),
          dict(a_shape=(3, 2), b_shape=(3,), init_shape=None, name="`a`"),
          dict(a_shape=(3, 2), b_shape=(3, 2), init_shape=(3,), name="`init`"),
          dict(a_shape=(3, 2), b_shape=(3, 2), init_shape=(2, 1), name="`init`"),
          dict(a_shape=(), b_shape=(), init_shape=None, name="`b`"),
          dict(a_shape=(0, 2), b_shape=(0, 2), init_shape=None, name="`b`"),
      ],
      method=METHODS,
  )
  def test_bad_shapes_raise_value_error(self, method, a_shape, b_shape, init_shape, name):
    args = [jnp.ones(a_shape), jnp.ones(b_shape)]
    if init_shape is not None:
      args.append(jnp.ones(init_shape))
    with pytest.raises(ValueError, match=name):
      _run(self.variant, *args, method=method)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_mismatched_dtypes_raise_type_error_naming_the_argument(self, method):
    # The docstring requires `b` to have "the same shape and dtype as `a`".
    b = jnp.ones(3, jnp.float32)
    with pytest.raises(TypeError, match="`a`"):
      _run(self.variant, jnp.ones(3, jnp.int32), b, method=method)
    with jax.enable_x64(True):
      with pytest.raises(TypeError, match="`a`"):
        _run(self.variant, jnp.ones(3, jnp.float64), b, method=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_is_summed_in_float32_and_rounded_once(method, dtype):
  """A long discounted sum rounded to half precision at every step drifts: 256 steps of
  b = 0.05, a = 0.999 gave 14.75 in bfloat16 where the sum of the rounded inputs is 12.81.
  Summed in float32 and rounded once, each entry is within 2 of the dtype's eps; the
  result keeps the inputs' dtype, and gradients flow back in it."""
  t_len = 256
  a, b = jnp.full((t_len, 2), 0.999, dtype), jnp.full((t_len, 2), 0.05, dtype)
  f = jax.jit(functools.partial(reverse_linear_recurrence, method=method))
  got = f(a, b)
  assert got.dtype == dtype
  a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
  exact, acc = np.zeros((t_len, 2)), np.zeros(2)
  for t in reversed(range(t_len)):
    acc = b64[t] + a64[t] * acc
    exact[t] = acc
  error = np.abs(np.asarray(got, np.float64) - exact) / exact
  assert error.max() <= 2 * float(jnp.finfo(dtype).eps), error.max()
  grad_b = jax.grad(lambda bb: f(a, bb)[0].sum().astype(jnp.float32))(b)
  assert grad_b.dtype == dtype and np.isfinite(np.asarray(grad_b, np.float32)).all()
