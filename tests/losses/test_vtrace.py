"""Tests for `vtrace` (errors, pg_advantage, q_estimate) -- Contract 1.

Layers: (1) hand-computed cases with a termination, a truncation and a masked
junction; (2) the float64 NumPy loop reference (`offpolicy_ac.testing.reference.vtrace`, the
explicit sum of Espeholt et al.) on random inputs with random terminations,
truncations and junctions, via hypothesis; (3) identities: rho = 1, lambda = 1
is the n-step bootstrapped return, splitting at junctions changes nothing,
gradient stopping, equality with rlax, scan == associative, batch shapes ==
vmap, garbage at masked steps is ignored. Every numeric test runs jitted and
not: the tests in `VTraceVariantsTest` and `VTraceBadInputTest` run under chex's
variants (`self.variant` is chex's with_jit or without_jit); bad input fails at
trace time.

Compilation budget: random examples are padded (with masked steps) to one time
length T_PAD and one of three batch shapes, and hyper-parameters are passed as
traced arguments in the hypothesis tests, so each (shape, method) compiles
once under jit. Hand-computed and bad-input tests bind them statically.
Hypothesis drives the jitted runs; the chex variants' runs (eager and jitted)
of the same checks use a few fixed seeded examples, because an eager call
re-traces and re-compiles its reverse scan every time (~50 ms) -- what differs
between jit and eager is trace-time behaviour, which a few examples exercise as
well as many.
"""

import functools

from absl.testing import parameterized
import chex
from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from scan_variants import scan_and_associative

from offpolicy_ac import testing
from offpolicy_ac.losses import VTraceOutput
from offpolicy_ac.losses import vtrace
from offpolicy_ac.testing import reference as ref

METHODS = ["scan", "associative"]
# "auto" (the default: scan on CPU) joins the first hand-computed case (and
# the method-agreement test).
ALL_METHODS = ["scan", "associative", "auto"]
T_PAD = 20
BATCH_SHAPES = [(), (3,), (2, 3)]
ARGS = ("v_tm1", "v_t", "r_t", "discount_t", "rho_tm1")
# Eager `associative_scan` compiles each of its many small ops on first use of
# every new shape or transformation (1-3 s each): tests that add vmap / grad
# variants run it jitted only: a `_scan` test under both chex variants and an
# `_associative` one under with_jit. The eager associative path is covered by
# the hand-computed, reference, n-step and split tests.


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _static_fn(**static):
  """vtrace with hyper-parameters bound statically (jit compiles per value).

  One function per setting: jitting it again reuses its compilations."""
  return functools.partial(vtrace, **static)


def _run(wrap, *arrays, mask=None, **static):
  """`wrap` (`self.variant`: jitted or eager) applied to vtrace, `static` bound."""
  arrays = [jnp.asarray(x) for x in arrays]
  if mask is not None:
    mask = jnp.asarray(mask)
  return wrap(_static_fn(**static))(*arrays, mask=mask)


@functools.lru_cache(maxsize=None)
def _traced_fn(method="scan", stop_target_gradients=True):
  """vtrace with hyper-parameters as (traced) arguments: one compile/shape.

  Not jitted: callers wrap it (`jax.jit` or `self.variant`)."""

  def f(v_tm1, v_t, r_t, discount_t, rho_tm1, mask, lambda_, rho_bar, c_bar, pg_bar):
    return vtrace(
        v_tm1,
        v_t,
        r_t,
        discount_t,
        rho_tm1,
        mask=mask,
        lambda_=lambda_,
        clip_rho_threshold=rho_bar,
        clip_c_threshold=c_bar,
        clip_pg_rho_threshold=pg_bar,
        stop_target_gradients=stop_target_gradients,
        method=method,
    )

  return f


def _assert_scaled_close(actual, expected, scale, rtol, atol=0.0, what=""):
  """|actual - expected| <= rtol * scale + atol, with `scale` the same sums
  taken over absolute values (a bound on rounding whatever the cancellation)."""
  actual = np.asarray(actual, np.float64)
  assert actual.shape == np.shape(expected), (what, actual.shape, np.shape(expected))
  assert np.all(np.isfinite(actual)), (what, actual)
  bad = np.abs(actual - expected) > rtol * np.asarray(scale) + atol
  assert not np.any(bad), (
      f"{what}: mismatch at {np.argwhere(bad)[:5].tolist()}: actual "
      f"{actual[bad][:5]}, expected {np.asarray(expected)[bad][:5]}"
  )


def _scales(inputs, mask, lambda_, rho_bar, c_bar, pg_bar):
  """Upper bounds on the magnitudes summed in each output (float64)."""
  v_tm1, v_t, r_t, d, rho = (np.asarray(inputs[k], np.float64) for k in ARGS)
  m = np.ones(r_t.shape, bool) if mask is None else np.asarray(mask)
  # With d >= 0, rho >= 0 (real steps), -|V(x_s)|, |V(x_s+1)| and |r| make
  # every term of the explicit sum non-negative: the sum of absolute values.
  err_abs = ref.vtrace(
      -np.abs(v_tm1), np.abs(v_t), np.abs(r_t), d, rho, mask, lambda_, rho_bar, c_bar, pg_bar
  )[0]
  vs_abs = np.abs(v_tm1) + err_abs
  m_next = np.concatenate([m[1:], np.zeros_like(m[:1])])
  vs_next = np.concatenate([vs_abs[1:], np.zeros_like(vs_abs[:1])])
  q_abs = np.abs(r_t) + np.abs(d) * np.where(m_next, vs_next, np.abs(v_t))
  pg_abs = np.minimum(pg_bar, np.abs(rho)) * (q_abs + np.abs(v_tm1))
  return vs_abs, pg_abs, q_abs


def _check_against_reference(
    out, inputs, mask, hyper, rtol, t_len=None, expected=None, scales=None
):
  """Compares a VTraceOutput (maybe padded beyond t_len) with the reference."""
  if expected is None:
    expected = ref.vtrace(*(inputs[k] for k in ARGS), mask, *hyper)
    scales = _scales(inputs, mask, *hyper)
  for name, got, exp, scale in zip(VTraceOutput._fields, out, expected, scales):
    got = np.asarray(got)
    if t_len is not None:
      np.testing.assert_array_equal(got[t_len:], 0.0, err_msg=name)
      got = got[:t_len]
    _assert_scaled_close(got, exp, scale, rtol, what=name)
  if mask is not None:  # Exactly zero at masked steps.
    for name, got in zip(VTraceOutput._fields, out):
      got = np.asarray(got)[: np.shape(mask)[0]]
      np.testing.assert_array_equal(np.where(mask, 0.0, got), 0.0, err_msg=name)


def _random_inputs(rng, t_len, batch, *, use_mask=True, garbage=1e3, dtype=np.float32):
  """Random V-trace inputs with episode structure (see `testing.random_layout`).

  Masked steps hold arbitrary finite garbage in every array. Returns
  (dict of arrays, mask or None, kind).
  """
  shape = (t_len,) + tuple(batch)
  if use_mask:
    d, mask, kind = testing.random_layout(
        rng, t_len, batch, p_termination=0.12, p_truncation=0.12, p_padding=0.2
    )
  else:  # Terminations only (discount 0 cuts by itself); no masked steps.
    d, mask, kind = testing.random_layout(
        rng, t_len, batch, p_termination=0.12, p_truncation=0.0, p_start_masked=0.0
    )
    mask = None
  inputs = dict(
      v_tm1=rng.normal(size=shape) * 2.0,
      v_t=rng.normal(size=shape) * 2.0,
      r_t=rng.normal(size=shape),
      discount_t=d,
      rho_tm1=np.exp(rng.uniform(np.log(1e-3), np.log(1e3), size=shape)),
  )
  if mask is not None:
    for k in ARGS:
      inputs[k] = testing.fill_masked(inputs[k], mask, rng.uniform(-garbage, garbage, size=shape))
  inputs = {k: v.astype(dtype) for k, v in inputs.items()}
  return inputs, mask, kind


def _pad_time(inputs, mask, t_pad, garbage=1e3):
  """Pads to t_pad steps with masked steps holding garbage."""
  t_len = mask.shape[0]
  n = t_pad - t_len
  rng = np.random.default_rng(n)
  out = {
      k: np.concatenate([v, rng.uniform(-garbage, garbage, (n,) + v.shape[1:]).astype(v.dtype)])
      for k, v in inputs.items()
  }
  pad_mask = np.concatenate([mask, np.zeros((n,) + mask.shape[1:], bool)])
  return out, pad_mask


_HYPER = dict(
    lambda_=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0)),
    rho_bar=st.one_of(st.just(1.0), st.floats(0.05, 10.0)),
    c_bar=st.one_of(st.just(1.0), st.floats(0.05, 2.0)),
    pg_bar=st.one_of(st.just(1.0), st.floats(0.05, 10.0)),
)


# ---------------------------------------------------------------------------
# Layer 1: hand-computed cases (in `VTraceVariantsTest`).
# ---------------------------------------------------------------------------


def _assert_output(out, errors, pg_advantage, q_estimate, rtol=1e-5):
  assert isinstance(out, VTraceOutput)
  for got, want in zip(out, (errors, pg_advantage, q_estimate)):
    chex.assert_type(got, jnp.float32)
    chex.assert_shape(got, np.shape(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


def _check_hand_computed_batch_columns(wrap, method):
  # The two previous cases side by side as a [T=3, B=2] batch.
  out = _run(
      wrap,
      [[1.0, 1.0], [100.0, -7.0], [2.0, 2.0]],
      [[3.0, 10.0], [-100.0, 33.0], [4.0, 3.0]],
      [[2.0, 0.5], [50.0, 9.0], [1.0, 1.0]],
      [[0.0, 0.9], [0.9, 0.9], [0.5, 0.9]],
      [[2.0, 1.0], [7.0, 1.0], [0.5, 1.0]],
      mask=[[True, True], [False, False], [True, True]],
      method=method,
  )
  _assert_output(
      out,
      [[1.0, 8.5], [0.0, 0.0], [0.5, 1.7]],
      [[1.0, 8.5], [0.0, 0.0], [0.5, 1.7]],
      [[2.0, 9.5], [0.0, 0.0], [3.0, 3.7]],
  )


# ---------------------------------------------------------------------------
# Layer 2: the float64 loop reference on random inputs.
# ---------------------------------------------------------------------------


def _check_reference_example(wrap, methods, x64, t_len, batch, use_mask, hyper, seed):
  rng = np.random.default_rng(seed)
  dtype = np.float64 if x64 else np.float32
  if not use_mask:
    t_len = T_PAD  # No masked step and no padding.
  inputs, mask, _ = _random_inputs(rng, t_len, batch, use_mask=use_mask, dtype=dtype)
  if use_mask:
    padded, pad_mask = _pad_time(inputs, mask, T_PAD)
  else:  # (mask=None is the same as all True: test_mask_none_equals_all_true)
    padded, pad_mask = inputs, np.ones((T_PAD,) + tuple(batch), bool)
  expected = ref.vtrace(*(inputs[k] for k in ARGS), mask, *hyper)
  scales = _scales(inputs, mask, *hyper)
  for m in methods:
    with jax.enable_x64(x64):
      args = [jnp.asarray(padded[k]) for k in ARGS]
      out = wrap(_traced_fn(m))(*args, jnp.asarray(pad_mask), *hyper)
      out = VTraceOutput(*(np.asarray(x) for x in out))
    chex.assert_type(out, dtype)
    _check_against_reference(
        out,
        inputs,
        mask,
        hyper,
        rtol=1e-12 if x64 else 2e-5,
        t_len=t_len,
        expected=expected,
        scales=scales,
    )


@pytest.mark.parametrize("x64", [False, True], ids=["f32", "f64"])
@given(
    t_len=st.integers(1, T_PAD),
    batch=st.sampled_from(BATCH_SHAPES),
    use_mask=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    **_HYPER,
)
def test_matches_loop_reference_jit(
    x64, t_len, batch, use_mask, seed, lambda_, rho_bar, c_bar, pg_bar
):
  # float32: both methods on each example (one reference computation).
  # float64 (tight tolerance: checks the algorithm, not rounding): scan only;
  # the methods' agreement is checked in float32.
  methods = ("scan",) if x64 else ("scan", "associative")
  _check_reference_example(
      jax.jit, methods, x64, t_len, batch, use_mask, (lambda_, rho_bar, c_bar, pg_bar), seed
  )


# Fixed examples, eager and jitted (`VTraceVariantsTest`): scan over the three
# batch ranks; associative on [T, 2, 3] only (eager associative_scan compiles
# its many ops per new shape).
_FIXED_REFERENCE_EXAMPLES = [
    ("scan", 13, (), True, (0.9, 1.0, 1.0, 1.0), 0),
    ("scan", T_PAD, (3,), False, (1.0, 2.0, 0.5, 3.0), 1),
    ("scan", T_PAD, (2, 3), True, (0.0, 0.3, 1.7, 0.8), 2),
    ("associative", T_PAD, (2, 3), True, (0.0, 0.3, 1.7, 0.8), 2),
    ("associative", 4, (2, 3), True, (0.6, 5.0, 1.3, 1.0), 3),
]


# ---------------------------------------------------------------------------
# Layer 3: identities.
# ---------------------------------------------------------------------------


def _consistent_values(rng, kind, shape):
  """v_tm1[s+1] == v_t[s] inside episodes; at a truncation v_t is the value of
  the true final observation and the masked step after it holds garbage."""
  values = rng.normal(size=(shape[0] + 1,) + shape[1:]) * 3.0
  v_tm1, v_t = values[:-1].copy(), values[1:].copy()
  garbage = rng.uniform(-1e3, 1e3, size=shape)
  v_tm1 = np.where(kind == 3, garbage, v_tm1)
  v_t = np.where(kind == 3, -garbage, v_t)
  return v_tm1, v_t


def _nstep_example(seed, t_len, batch):
  rng = np.random.default_rng(seed)
  shape = (t_len,) + tuple(batch)
  d, mask, kind = testing.random_layout(
      rng, t_len, batch, p_termination=0.12, p_truncation=0.12, p_padding=0.2
  )
  v_tm1, v_t = _consistent_values(rng, kind, shape)
  r = testing.fill_masked(rng.normal(size=shape), mask, 1e3)
  d = testing.fill_masked(d, mask, -5.0)
  return [x.astype(np.float32) for x in (v_tm1, v_t, r, d)], mask


def _check_nstep(wrap, methods, seed, batch, rho_bar, c_bar):
  (v_tm1, v_t, r, d), mask = _nstep_example(seed, T_PAD, batch)
  rho = np.where(mask, 1.0, 1e3).astype(np.float32)  # garbage rho when masked
  g = ref.nstep_bootstrapped_returns(v_t, r, d, mask)
  g_abs = ref.nstep_bootstrapped_returns(np.abs(v_t), np.abs(r), np.abs(d), mask)
  scale = g_abs + np.abs(v_tm1)
  expected_err = np.where(mask, g - v_tm1, 0.0)
  for method in methods:
    out = wrap(_traced_fn(method))(v_tm1, v_t, r, d, rho, mask, 1.0, rho_bar, c_bar, 1.0)
    _assert_scaled_close(out.errors, expected_err, scale, 2e-5, what="errors")
    # q_estimate = r + d * G_{s+1} inside the segment = G_s; pg = q - V.
    _assert_scaled_close(out.q_estimate, g, scale, 2e-5, what="q")
    _assert_scaled_close(out.pg_advantage, expected_err, scale, 2e-5, what="pg")


@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.sampled_from(BATCH_SHAPES),
    rho_bar=st.floats(1.0, 5.0),
    c_bar=st.floats(1.0, 5.0),
)
def test_rho_one_lambda_one_is_nstep_bootstrapped_return_jit(seed, batch, rho_bar, c_bar):
  # Thresholds >= 1 do not clip rho = 1.
  _check_nstep(jax.jit, ("scan", "associative"), seed, batch, rho_bar, c_bar)


# Episodes of lengths 2 and 3 (shapes shared with the hand-computed tests),
# each ending by termination ("term"), truncation ("trunc") or the end of the
# window ("open"), joined by one masked step each: 3+1+2+1+3+1+2+1+3+1+2 = 20.
_SPLIT_PATTERNS = [
    [(3, "term"), (2, "trunc"), (3, "trunc"), (2, "term"), (3, "term"), (2, "open")],
    [(2, "trunc"), (3, "term"), (2, "term"), (3, "trunc"), (2, "trunc"), (3, "open")],
    [(3, "trunc"), (3, "trunc"), (2, "term"), (2, "trunc"), (3, "trunc"), (2, "trunc")],
]


def _split_layout(pattern, gamma):
  """Discounts, mask and the (start, stop) of each episode for a pattern."""
  d, mask, spans, s = [], [], [], 0
  for i, (length, end) in enumerate(pattern):
    d += [gamma] * (length - 1) + [0.0 if end == "term" else gamma]
    mask += [True] * length
    spans.append((s, s + length))
    s += length
    if i + 1 < len(pattern):  # The junction: a masked auto-reset step.
      d.append(123.0)  # garbage discount
      mask.append(False)
      s += 1
  return np.array(d), np.array(mask), spans


def _check_split(wrap, method, seed, lambda_, rho_bar, c_bar, pg_bar):
  rng = np.random.default_rng(seed)
  hyper = (lambda_, rho_bar, c_bar, pg_bar)
  if method == "both":  # One example, both methods.
    _check_split(wrap, "scan", seed, *hyper)
    _check_split(wrap, "associative", seed, *hyper)
    return
  f = wrap(_traced_fn(method))
  cols = []
  for pattern in _SPLIT_PATTERNS:
    d, mask, spans = _split_layout(pattern, rng.uniform(0.8, 1.0))
    chex.assert_shape(d, (T_PAD,))
    inputs = dict(
        v_tm1=rng.normal(size=T_PAD),
        v_t=rng.normal(size=T_PAD),
        r_t=rng.normal(size=T_PAD),
        discount_t=d,
        rho_tm1=np.exp(rng.uniform(-3, 3, size=T_PAD)),
    )
    for k in ARGS:  # Large garbage at the junctions.
      inputs[k] = testing.fill_masked(inputs[k], mask, rng.uniform(-1e6, 1e6, size=T_PAD))
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    cols.append((inputs, mask, spans))
  # The three patterns side by side as a [T, 3] batch ...
  batch_inputs = {k: np.stack([c[0][k] for c in cols], 1) for k in ARGS}
  batch_mask = np.stack([c[1] for c in cols], 1)
  joined = [np.asarray(x) for x in f(*(batch_inputs[k] for k in ARGS), batch_mask, *hyper)]
  # ... and every episode alone: cut out of the time axis, run without a mask.
  for j, (inputs, mask, spans) in enumerate(cols):
    for name, x in zip(VTraceOutput._fields, joined):
      np.testing.assert_array_equal(x[~mask, j], 0.0, err_msg=name)
    for start, stop in spans:
      alone_inputs = [inputs[k][start:stop] for k in ARGS]
      chex.assert_shape(alone_inputs[0], (stop - start,))
      alone = f(*alone_inputs, None, *hyper)
      for name, x, y in zip(VTraceOutput._fields, joined, alone):
        np.testing.assert_allclose(x[start:stop, j], y, rtol=1e-6, atol=1e-6, err_msg=name)


@given(seed=st.integers(0, 2**32 - 1), **_HYPER)
def test_split_at_junctions_changes_nothing_jit(seed, lambda_, rho_bar, c_bar, pg_bar):
  _check_split(jax.jit, "both", seed, lambda_, rho_bar, c_bar, pg_bar)


def _grad_example():
  rng = np.random.default_rng(7)
  inputs, mask, _ = _random_inputs(rng, T_PAD, (3,), garbage=10.0)
  mask[0, 0] = False  # Make sure there is at least one masked step.
  inputs["rho_tm1"] = np.exp(rng.uniform(-1, 1, (T_PAD, 3))).astype(np.float32)
  return inputs, mask


def _check_stop_target_gradients(wrap, method):
  inputs, mask = _grad_example()
  hyper = (0.9, 1.0, 1.0, 1.0)
  args = [jnp.asarray(inputs[k]) for k in ARGS]
  f = wrap(_traced_fn(method, True))
  out, vjp = jax.vjp(lambda *a: f(*a, mask, *hyper), *args)

  def grads(output_index):
    """Gradients of sum(out[output_index]) w.r.t. the five inputs."""
    cotangent = [jnp.zeros_like(x) for x in out]
    cotangent[output_index] = jnp.ones_like(out[output_index])
    return vjp(VTraceOutput(*cotangent))

  g_v_tm1, g_v_t, g_r, g_d, g_rho = grads(0)  # sum(errors)
  np.testing.assert_array_equal(g_v_tm1, -mask.astype(np.float32))
  for name, g in [("v_t", g_v_t), ("r_t", g_r), ("discount_t", g_d), ("rho_tm1", g_rho)]:
    np.testing.assert_array_equal(g, 0.0, err_msg=name)
  # q_estimate: no gradient at all.
  for g in grads(2):
    np.testing.assert_array_equal(g, 0.0)
  # pg_advantage: only through -v_tm1 (and rho_pg's own clipping).
  g_v_tm1, g_v_t, g_r, g_d, _ = grads(1)
  rho_pg = np.minimum(1.0, inputs["rho_tm1"])
  np.testing.assert_allclose(g_v_tm1, np.where(mask, -rho_pg, 0.0), rtol=1e-6)
  for g in (g_v_t, g_r, g_d):
    np.testing.assert_array_equal(g, 0.0)


def _no_mask_example(seed, batch, t_len=T_PAD):
  rng = np.random.default_rng(seed)
  inputs, _, _ = _random_inputs(rng, t_len, batch, use_mask=False)
  return [inputs[k] for k in ARGS]


@functools.lru_cache(maxsize=None)
def _rlax_oracles():
  """rlax, vmapped over batch axis 1 and jitted, hyper-parameters traced."""
  td_and_adv = jax.jit(
      jax.vmap(
          lambda v_tm1, v_t, r_t, d, rho, rho_bar, pg_bar: rlax.vtrace_td_error_and_advantage(
              v_tm1,
              v_t,
              r_t,
              d,
              rho,
              lambda_=1.0,
              clip_rho_threshold=rho_bar,
              clip_pg_rho_threshold=pg_bar,
          ),
          in_axes=(1, 1, 1, 1, 1, None, None),
          out_axes=1,
      )
  )
  errors = jax.jit(
      jax.vmap(
          lambda v_tm1, v_t, r_t, d, rho, lambda_, rho_bar: rlax.vtrace(
              v_tm1, v_t, r_t, d, rho, lambda_=lambda_, clip_rho_threshold=rho_bar
          ),
          in_axes=(1, 1, 1, 1, 1, None, None),
          out_axes=1,
      )
  )
  return td_and_adv, errors


def _check_batch_shapes_and_vmap_agree(wrap, method):
  rng = np.random.default_rng(3)
  inputs, mask, _ = _random_inputs(rng, T_PAD, (2, 3))
  args = [inputs[k] for k in ARGS]
  hyper = (0.9, 2.0, 0.7, 1.5)
  f = wrap(_traced_fn(method))
  full = f(*args, mask, *hyper)
  chex.assert_shape(full, (T_PAD, 2, 3))

  def close(x, y):
    for name, a, b in zip(VTraceOutput._fields, x, y):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5, err_msg=name)

  for i in range(2):
    rows = [a[:, i] for a in args]
    chex.assert_shape(rows[0], (T_PAD, 3))
    close(f(*rows, mask[:, i], *hyper), [np.asarray(x)[:, i] for x in full])
    for j in (i, 2):
      cols = [a[:, i, j] for a in args]
      chex.assert_shape(cols[0], (T_PAD,))
      close(f(*cols, mask[:, i, j], *hyper), [np.asarray(x)[:, i, j] for x in full])
  # jax.vmap over batch axis 1 of [T, B1, B2]. (Jitted only: vmap traces the
  # function either way; eager vmap would compile every batched op again.)
  g = jax.jit(
      jax.vmap(
          lambda *a: vtrace(
              *a[:5],
              mask=a[5],
              lambda_=0.9,
              clip_rho_threshold=2.0,
              clip_c_threshold=0.7,
              clip_pg_rho_threshold=1.5,
              method=method,
          ),
          in_axes=1,
          out_axes=1,
      )
  )
  close(g(*args, mask), full)


class VTraceVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  # -------------------------------------------------------------------------
  # Layer 1: hand-computed cases.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=ALL_METHODS)
  def test_hand_computed_no_mask(self, method):
    # rho = [.5, 2, 1] -> rho_v = c = [.5, 1, 1] (all thresholds 1, lambda 1).
    # td_s = rho_v (r + d v_t - v_tm1) = [.5 * 1.8, 0.7, -0.4] = [.9, .7, -.4]
    # err_2 = -.4; err_1 = .7 + .9 * 1 * -.4 = .34; err_0 = .9 + .9 * .5 * .34
    # = 1.053.  vs = [2.053, 2.34, 2.6].
    # q_0 = 1 + .9 * 2.34 = 3.106; q_1 = 0 + .9 * 2.6 = 2.34;
    # q_2 = -1 + .9 * v_t[2] = 2.6.  pg = min(1, rho) (q - v_tm1)
    # = [.5 * 2.106, .34, -.4].
    out = _run(
        self.variant,
        [1.0, 2.0, 3.0],
        [2.0, 3.0, 4.0],
        [1.0, 0.0, -1.0],
        [0.9, 0.9, 0.9],
        [0.5, 2.0, 1.0],
        method=method,
    )
    _assert_output(out, [1.053, 0.34, -0.4], [1.053, 0.34, -0.4], [3.106, 2.34, 2.6])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_hand_computed_separate_thresholds_and_lambda(self, method):
    # lambda = .5, rho_bar = 2, c_bar = .5, rho_bar_pg = 3, rho = [4, .25]:
    # rho_v = [2, .25], c = .5 * min(.5, rho) = [.25, .125], rho_pg = [3, .25].
    # err_1 = .25 * (1 + 2 - 1) = .5; err_0 = 2 * (1 + 1 - 0) + 1 * .25 * .5
    # = 4.125.  q_0 = 1 + vs_1 = 1 + 1.5 = 2.5 (the contract's v_{s+1}; rlax's
    # lambda-mixed bootstrap would give 2.25), q_1 = 1 + 2 = 3.
    # pg = [3 * 2.5, .25 * (3 - 1)] = [7.5, .5].
    out = _run(
        self.variant,
        [0.0, 1.0],
        [1.0, 2.0],
        [1.0, 1.0],
        [1.0, 1.0],
        [4.0, 0.25],
        lambda_=0.5,
        clip_rho_threshold=2.0,
        clip_c_threshold=0.5,
        clip_pg_rho_threshold=3.0,
        method=method,
    )
    _assert_output(out, [4.125, 0.5], [7.5, 0.5], [2.5, 3.0])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_hand_computed_termination(self, method):
    # Step 1 terminates (discount 0): its bootstrap v_t = 5 is ignored.
    # err_1 = 1 + 0 - 2 = -1; err_0 = (1 + .5 * 2 - 1) + .5 * 1 * -1 = .5.
    # q = [1 + .5 * vs_1, 1 + 0] = [1.5, 1]; pg = q - v_tm1 = [.5, -1].
    out = _run(
        self.variant, [1.0, 2.0], [2.0, 5.0], [1.0, 1.0], [0.5, 0.0], [1.0, 1.0], method=method
    )
    _assert_output(out, [0.5, -1.0], [0.5, -1.0], [1.5, 1.0])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_hand_computed_termination_then_masked_junction(self, method):
    # Step 0 terminates, step 1 is the masked auto-reset step (garbage), step 2
    # starts the next episode and is the end of the window.
    # s0: rho_v = min(1, 2) = 1, err_0 = 2 + 0 * 3 - 1 = 1 (cut), q_0 = 2,
    #     pg_0 = 1.  s1: zeros.  s2: rho_v = .5: err_2 = .5 (1 + .5 * 4 - 2) = .5,
    #     q_2 = 1 + .5 * 4 = 3, pg_2 = .5 * (3 - 2) = .5.
    out = _run(
        self.variant,
        [1.0, 100.0, 2.0],
        [3.0, -100.0, 4.0],
        [2.0, 50.0, 1.0],
        [0.0, 0.9, 0.5],
        [2.0, 7.0, 0.5],
        mask=[True, False, True],
        method=method,
    )
    _assert_output(out, [1.0, 0.0, 0.5], [1.0, 0.0, 0.5], [2.0, 0.0, 3.0])

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_hand_computed_truncation_then_masked_junction(self, method):
    # Step 0 is LAST by time limit (discount .9): it bootstraps from the value
    # of the true final observation v_t[0] = 10, not from the next step's
    # v_tm1[1] = -7 (the masked auto-reset step, whose values are garbage).
    # err_0 = .5 + .9 * 10 - 1 = 8.5, q_0 = .5 + .9 * 10 = 9.5, pg_0 = 8.5.
    # err_2 = 1 + .9 * 3 - 2 = 1.7, q_2 = 3.7, pg_2 = 1.7.
    out = _run(
        self.variant,
        [1.0, -7.0, 2.0],
        [10.0, 33.0, 3.0],
        [0.5, 9.0, 1.0],
        [0.9, 0.9, 0.9],
        [1.0, 1.0, 1.0],
        mask=[True, False, True],
        method=method,
    )
    _assert_output(out, [8.5, 0.0, 1.7], [8.5, 0.0, 1.7], [9.5, 0.0, 3.7])

  test_hand_computed_batch_columns_scan, test_hand_computed_batch_columns_associative = (
      scan_and_associative(_check_hand_computed_batch_columns)
  )

  # -------------------------------------------------------------------------
  # Layer 2: the float64 loop reference on fixed examples.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*_FIXED_REFERENCE_EXAMPLES)
  def test_matches_loop_reference_fixed_examples(self, method, t_len, batch, use_mask, hyper, seed):
    _check_reference_example(self.variant, (method,), False, t_len, batch, use_mask, hyper, seed)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(t_len=[1, 2, 3])
  def test_matches_loop_reference_short_unpadded(self, t_len):
    # Unpadded short sequences (T = 1 included), every mask pattern.
    rng = np.random.default_rng(t_len)
    hyper = (0.7, 1.5, 0.8, 2.0)
    # Every mask pattern jitted; eagerly (each call re-compiles the scan)
    # all-real, all-masked and alternating.
    jit = self.variant.type == chex.ChexVariantType.WITH_JIT
    patterns = range(2**t_len) if jit else sorted({0, 2**t_len - 1, 0b101 & (2**t_len - 1)})
    f = self.variant(_traced_fn())
    for bits in patterns:
      mask = np.array([(bits >> i) & 1 == 1 for i in range(t_len)])
      inputs, _, _ = _random_inputs(rng, t_len, (), use_mask=False)
      out = f(*(inputs[k] for k in ARGS), mask, *hyper)
      _check_against_reference(out, inputs, mask, hyper, rtol=2e-5)

  # -------------------------------------------------------------------------
  # Layer 3: identities.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(("scan", 0, (2, 3)), ("scan", 1, ()), ("associative", 0, (2, 3)))
  def test_rho_one_lambda_one_is_nstep_bootstrapped_return_fixed_examples(
      self, method, seed, batch
  ):
    _check_nstep(self.variant, (method,), seed, batch, 1.0, 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_split_at_junctions_changes_nothing_fixed_example(self):
    # Scan only: eager associative would compile for three more shapes; the
    # hypothesis test runs both methods jitted.
    _check_split(self.variant, "scan", 0, 0.8, 1.5, 0.9, 2.0)

  test_stop_target_gradients_scan, test_stop_target_gradients_associative = scan_and_associative(
      _check_stop_target_gradients
  )

  @chex.variants(with_jit=True, without_jit=True)
  def test_target_gradients_flow_without_stop(self):
    # Scan only: differentiating through the associative scan is checked in
    # test_recurrence.py; here it would only add a slow compilation.
    method = "scan"
    inputs, mask = _grad_example()
    hyper = (0.9, 1.0, 1.0, 1.0)
    args = [jnp.asarray(inputs[k]) for k in ARGS]
    f = self.variant(_traced_fn(method, False))
    loss = lambda *a: jnp.sum(f(*a, mask, *hyper).errors)
    g_v_tm1, g_v_t, g_r, _, g_rho = jax.grad(loss, argnums=tuple(range(5)))(*args)
    for name, g in [("v_t", g_v_t), ("r_t", g_r), ("rho_tm1", g_rho), ("v_tm1", g_v_tm1)]:
      g = np.asarray(g)
      assert np.all(np.isfinite(g)), name
      assert np.any(g[mask] != 0.0), name
      # Nothing flows into masked steps' (garbage) inputs.
      np.testing.assert_array_equal(g[~mask], 0.0, err_msg=name)
    # d sum(err) / d r_t[s] = sum over earlier steps of the trace products: at
    # least rho_v[s] > 0 at every real step.
    assert np.all(np.asarray(g_r)[mask] > 0)
    assert not np.allclose(g_v_tm1, -mask.astype(np.float32))

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_rlax_vtrace_td_error_and_advantage(self):
    f = self.variant(_traced_fn())
    for seed, (rho_bar, pg_bar) in enumerate([(1.0, 1.0), (2.5, 0.7), (0.3, 4.0)]):
      args = _no_mask_example(seed, (3,))
      ours = f(*args, None, 1.0, rho_bar, 1.0, pg_bar)
      theirs = _rlax_oracles()[0](*args, rho_bar, pg_bar)
      scales = _scales(dict(zip(ARGS, args)), None, 1.0, rho_bar, 1.0, pg_bar)
      for name, x, y, s in zip(VTraceOutput._fields, ours, theirs, scales):
        _assert_scaled_close(x, np.asarray(y, np.float64), s, 2e-5, what=name)
      # And unbatched [T].
      ours_1d = f(*(a[:, 0] for a in args), None, 1.0, rho_bar, 1.0, pg_bar)
      chex.assert_trees_all_close(
          ours_1d, jax.tree.map(lambda y: np.asarray(y)[:, 0], ours), rtol=1e-6, atol=1e-6
      )

  @chex.variants(with_jit=True, without_jit=True)
  def test_errors_match_rlax_vtrace_with_lambda(self):
    f = self.variant(_traced_fn())
    for seed, lambda_ in enumerate([0.0, 0.3, 0.95]):
      args = _no_mask_example(seed + 10, (3,))
      ours = f(*args, None, lambda_, 1.7, 1.0, 1.0)
      theirs = _rlax_oracles()[1](*args, lambda_, 1.7)
      scale = _scales(dict(zip(ARGS, args)), None, lambda_, 1.7, 1.0, 1.0)[0]
      _assert_scaled_close(ours.errors, np.asarray(theirs, np.float64), scale, 2e-5)
      # q_estimate deliberately differs from rlax's lambda-mixed one for
      # lambda < 1: it bootstraps from the V-trace target vs_{s+1}.
      vs = np.asarray(args[0], np.float64) + np.asarray(ours.errors, np.float64)
      expected_q = np.asarray(args[2], np.float64) + np.asarray(
          args[3], np.float64
      ) * np.concatenate([vs[1:], args[1][-1:]])
      np.testing.assert_allclose(ours.q_estimate, expected_q, rtol=1e-5, atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(seed=[0, 1])
  def test_scan_and_associative_agree(self, seed):
    rng = np.random.default_rng(seed)
    inputs, mask, _ = _random_inputs(rng, T_PAD, (2, 3))
    hyper = (0.8, 1.5, 1.2, 2.0)
    args = [inputs[k] for k in ARGS]
    scan = self.variant(_traced_fn("scan"))(*args, mask, *hyper)
    assoc = self.variant(_traced_fn("associative"))(*args, mask, *hyper)
    auto = self.variant(_traced_fn("auto"))(*args, mask, *hyper)
    scales = _scales(inputs, mask, *hyper)
    for name, x, y, z, s in zip(VTraceOutput._fields, scan, assoc, auto, scales):
      _assert_scaled_close(x, np.asarray(y, np.float64), s, 4e-5, what=name)
      _assert_scaled_close(z, np.asarray(x, np.float64), s, 4e-5, what=name)

  test_batch_shapes_and_vmap_agree_scan, test_batch_shapes_and_vmap_agree_associative = (
      scan_and_associative(_check_batch_shapes_and_vmap_agree)
  )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_mask_none_equals_all_true(self, method):
    args = _no_mask_example(11, (2, 3))
    hyper = (0.6, 1.3, 0.9, 1.1)
    f = self.variant(_traced_fn(method))
    a = f(*args, None, *hyper)
    b = f(*args, np.ones((T_PAD, 2, 3), bool), *hyper)
    # Two different programs: equal up to rounding.
    chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_huge_garbage_at_masked_steps_is_ignored(self, method):
    rng = np.random.default_rng(5)
    inputs, mask, _ = _random_inputs(rng, T_PAD, (2, 3))
    mask[0, 0, 1] = mask[-1, 1, 2] = False
    hyper = (1.0, 1e3, 1e3, 1e3)  # No clipping: rho's garbage is not bounded.
    f = self.variant(_traced_fn(method))
    outs = []
    for value in (0.0, 1e30, -1e30):
      garbled = [testing.fill_masked(inputs[k], mask, value) for k in ARGS]
      out = f(*garbled, mask, *hyper)
      for name, x in zip(VTraceOutput._fields, out):
        x = np.asarray(x)
        assert np.all(np.isfinite(x)), (name, value)
        np.testing.assert_array_equal(x[~mask], 0.0, err_msg=name)
      outs.append(out)
    for out in outs[1:]:
      chex.assert_trees_all_equal(out, outs[0])

  @chex.variants(with_jit=True, without_jit=True)
  def test_traced_hyperparameters_vmap_over_a_sweep(self):
    # Hyper-parameters can be traced (e.g. vmapped over a sweep).
    args = _no_mask_example(13, (3,))
    lambdas = jnp.array([0.0, 0.5, 1.0])
    c_bars = jnp.array([0.5, 1.0, 2.0])
    f = self.variant(_traced_fn())
    swept = jax.vmap(lambda lam, cb: f(*args, None, lam, 1.0, cb, 1.0))(lambdas, c_bars)
    for i in range(3):
      single = f(*args, None, float(lambdas[i]), 1.0, float(c_bars[i]), 1.0)
      for x, y in zip(swept, single):
        np.testing.assert_allclose(x[i], y, rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_output_dtype_follows_inputs(self):
    args = _no_mask_example(17, ())
    out = _run(self.variant, *args)
    chex.assert_type(out, jnp.float32)
    if self.variant.type == chex.ChexVariantType.WITH_JIT:
      # (Eager float64 would compile every op once more.)
      with jax.enable_x64(True):
        out = _run(self.variant, *(a.astype(np.float64) for a in args))
        chex.assert_type(out, jnp.float64)


# ---------------------------------------------------------------------------
# Bad input: trace-time errors naming the argument, jitted and not.
# ---------------------------------------------------------------------------


def _good_args(shape=(3, 2)):
  return [jnp.ones(shape, jnp.float32) for _ in ARGS]


class VTraceBadInputTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*((name, index) for index, name in enumerate(ARGS)))
  def test_wrong_shape_names_the_argument(self, index):
    args = _good_args()
    args[index] = jnp.ones((3, 4), jnp.float32)
    name = ARGS[index] if index else ARGS[1]  # v_tm1 is the reference shape.
    with pytest.raises(ValueError, match=f"`{name}`"):
      _run(self.variant, *args)

  @chex.variants(with_jit=True, without_jit=True)
  def test_wrong_rank_or_empty_time_axis(self):
    with pytest.raises(ValueError, match="`v_tm1`"):
      _run(self.variant, *[jnp.float32(1.0)] * 5)
    with pytest.raises(ValueError, match="`v_tm1`"):
      _run(self.variant, *_good_args((0, 2)))
    args = _good_args((3,))
    args[2] = jnp.ones((3, 1))
    with pytest.raises(ValueError, match="`r_t`"):
      _run(self.variant, *args)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*((name, index) for index, name in enumerate(ARGS) if index))
  def test_mixed_float_dtypes_name_the_argument(self, index):
    """bfloat16 values with a float32 discount (`jnp.full(..., 0.99)`): the message names
    the argument, not a variable of the recurrence."""
    args = [x.astype(jnp.bfloat16) for x in _good_args()]
    args[index] = args[index].astype(jnp.float32)
    with pytest.raises(TypeError, match=f"`{ARGS[index]}` must have the dtype of `v_tm1`"):
      _run(self.variant, *args)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*((name, index) for index, name in enumerate(ARGS)))
  def test_wrong_dtype_names_the_argument(self, index):
    args = _good_args()
    args[index] = jnp.ones((3, 2), jnp.int32)
    with pytest.raises(TypeError, match=f"`{ARGS[index]}`"):
      _run(self.variant, *args)

  @chex.variants(with_jit=True, without_jit=True)
  def test_bad_mask(self):
    with pytest.raises(TypeError, match="`mask`"):
      _run(self.variant, *_good_args(), mask=jnp.ones((3, 2), jnp.float32))
    with pytest.raises(TypeError, match="`mask`"):
      _run(self.variant, *_good_args(), mask=jnp.ones((3, 2), jnp.int32))
    with pytest.raises(ValueError, match="`mask`"):
      _run(self.variant, *_good_args(), mask=jnp.ones((3,), bool))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      (dict(lambda_=-0.1), "lambda_"),
      (dict(lambda_=1.5), "lambda_"),
      (dict(lambda_=float("nan")), "lambda_"),
      (dict(clip_rho_threshold=0.0), "clip_rho_threshold"),
      (dict(clip_rho_threshold=-1.0), "clip_rho_threshold"),
      (dict(clip_c_threshold=0.0), "clip_c_threshold"),
      (dict(clip_c_threshold=-2.0), "clip_c_threshold"),
      (dict(clip_pg_rho_threshold=0.0), "clip_pg_rho_threshold"),
      (dict(clip_pg_rho_threshold=-0.5), "clip_pg_rho_threshold"),
      (dict(method="fft"), "method"),
  )
  def test_bad_hyperparameters(self, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
      _run(self.variant, *_good_args(), **kwargs)

  @chex.variants(with_jit=True, without_jit=True)
  def test_none_threshold_is_shown_as_none_and_inf_truncates_nothing(self):
    # None (no truncation in other V-trace code) was reported as "got nan".
    with pytest.raises(ValueError, match=r"`clip_rho_threshold` must be > 0, got None\."):
      _run(self.variant, *_good_args(), clip_rho_threshold=None)
    with pytest.raises(ValueError, match=r"`lambda_` must lie in \[0, 1\], got None\."):
      _run(self.variant, *_good_args(), lambda_=None)
    inf = dict(clip_rho_threshold=np.inf, clip_c_threshold=np.inf, clip_pg_rho_threshold=np.inf)
    big = dict(clip_rho_threshold=1e30, clip_c_threshold=1e30, clip_pg_rho_threshold=1e30)
    args = _good_args()
    args[3], args[4] = 0.9 * args[3], 3.0 * args[4]  # discounts, and ratios that would be clipped
    unclipped = _run(self.variant, *args, **inf)
    chex.assert_trees_all_close(unclipped, _run(self.variant, *args, **big))
    assert float(unclipped.pg_advantage[0, 0]) != float(
        _run(self.variant, *args).pg_advantage[0, 0]
    )


def test_a_threshold_that_is_zero_in_the_inputs_dtype_is_refused():
  """The thresholds are cast to the inputs' dtype: 1e-8 is 0 in float16 (a truncation at
  0, which the contract refuses, zeroed every weight). A concrete one is refused, naming
  it, its value and the dtype; one that overflows (inf: no truncation) is allowed, as is a
  traced one."""
  args = [x.astype(jnp.float16) for x in _good_args()]
  for name in ("clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold"):
    with pytest.raises(ValueError, match=rf"^{name}=1e-08 is 0 in float16"):
      vtrace(*args, **{name: 1e-8})
    with pytest.raises(ValueError, match=rf"^{name}=1e-08 at index \(0, 1\) is 0 in float16"):
      vtrace(*args, **{name: np.array([[1.0, 1e-8]])})
    big = vtrace(*args, **{name: 1e5})  # inf in float16: truncates nothing, as 1e5 would
    same = vtrace(*args, **{name: float("inf")})
    for x, y in zip(big, same):
      np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    traced = jax.jit(lambda c, name=name: vtrace(*args, **{name: c}))(jnp.float16(0.5))
    assert np.isfinite(np.asarray(traced.errors, np.float32)).all()
  # float32 holds 1e-8: unchanged.
  assert np.isfinite(np.asarray(vtrace(*_good_args(), clip_rho_threshold=1e-8).errors)).all()
