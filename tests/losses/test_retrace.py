"""Tests for `general_off_policy_returns`, `retrace_targets` and `retrace`.

Layers: (1) hand-computed cases with a termination, a truncation and a masked
junction; (2) the float64 NumPy loop references (`offpolicy_ac.testing.reference.retrace`,
`offpolicy_ac.testing.reference.general_off_policy_returns`) on random inputs with random
terminations, truncations and junctions, via hypothesis; (3) identities:
Retrace with pi = mu is Q(lambda) (`offpolicy_ac.testing.reference.q_lambda_errors`, the
expected-TD-error sum form), splitting at junctions changes nothing, gradient
stopping, equality with `rlax.retrace`, scan == associative == auto, batch
shapes == vmap, garbage at masked steps is ignored. Every numeric test runs
jitted and not: the tests in `RetraceVariantsTest` and `RetraceBadInputTest` run
under chex's variants (`self.variant` is chex's with_jit or without_jit); bad
input fails at trace time naming the argument.

As in test_vtrace.py: hypothesis drives the jitted runs (inputs padded with
masked steps to T_PAD, hyper-parameters traced, so each shape and method
compiles once); the variants' runs use a few fixed seeded examples.
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
from offpolicy_ac.losses import acer_q_ret
from offpolicy_ac.losses import general_off_policy_returns
from offpolicy_ac.losses import retrace
from offpolicy_ac.losses import retrace_targets
from offpolicy_ac.losses import soft_q_targets
from offpolicy_ac.losses import sql_nstep_td_error
from offpolicy_ac.testing import reference as ref

METHODS = ["scan", "associative"]
ALL_METHODS = ["scan", "associative", "auto"]
# Eager `associative_scan` compiles each of its small ops for every new shape
# or transformation (1-3 s each): tests adding vmap / grad variants run it
# jitted only, a `_scan` test under both chex variants and an `_associative`
# one under with_jit (the eager associative path is covered by the other tests).
T_PAD = 20
NUM_ACTIONS = 3
BATCH_SHAPES = [(), (3,), (2, 3)]
Q_ARGS = ("q_tm1", "q_t", "a_tm1", "a_t", "r_t", "discount_t", "pi_t", "mu_t")
G_ARGS = ("q_a_t", "v_t", "r_t", "discount_t", "c_t")


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _static_fn(fn, **static):
  """One function per setting: jitting it again reuses its compilations."""
  return functools.partial(fn, **static)


def _run(fn, wrap, *arrays, mask=None, **static):
  """`wrap` (`self.variant`: jitted or eager) applied to fn, `static` bound."""
  arrays = [jnp.asarray(x) for x in arrays]
  if mask is not None:
    mask = jnp.asarray(mask)
  return wrap(_static_fn(fn, **static))(*arrays, mask=mask)


def _retrace_fn(wrap, method="scan", stop_target_gradients=True):
  """retrace with (lambda_, eps) traced: one compilation per shape.

  `wrap` is `jax.jit` or `self.variant` (jitted or eager). With
  stop_target_gradients it reuses the program of `_errors_and_targets_fn`
  (fewer compilations across tests).
  """
  if stop_target_gradients:
    both = wrap(_errors_and_targets_fn(method))
    return lambda *args: both(*args)[0]
  return wrap(_retrace_unstopped_fn(method))


@functools.lru_cache(maxsize=None)
def _retrace_unstopped_fn(method="scan", stop_target_gradients=False):
  """retrace with (lambda_, eps) traced, target gradients flowing.

  Not jitted: `_retrace_fn` wraps it."""

  def f(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, mask, lambda_, eps):
    return retrace(
        q_tm1,
        q_t,
        a_tm1,
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

  return f


@functools.lru_cache(maxsize=None)
def _errors_and_targets_fn(method="scan"):
  """(retrace(...), retrace_targets(...)) in one program, traced hypers.

  Not jitted: callers wrap it (`jax.jit` or `self.variant`)."""

  def f(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, mask, lambda_, eps):
    errors = retrace(
        q_tm1,
        q_t,
        a_tm1,
        a_t,
        r_t,
        discount_t,
        pi_t,
        mu_t,
        mask=mask,
        lambda_=lambda_,
        eps=eps,
        method=method,
    )
    targets = retrace_targets(
        q_t, a_t, r_t, discount_t, pi_t, mu_t, mask=mask, lambda_=lambda_, eps=eps, method=method
    )
    return errors, targets

  return f


@functools.lru_cache(maxsize=None)
def _general_fn(method="scan", stop_target_gradients=True):
  """Not jitted: callers wrap it (`jax.jit` or `self.variant`)."""

  def f(q_a_t, v_t, r_t, discount_t, c_t, mask):
    return general_off_policy_returns(
        q_a_t,
        v_t,
        r_t,
        discount_t,
        c_t,
        mask=mask,
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


def _take(x, a):
  return np.take_along_axis(np.asarray(x, np.float64), np.asarray(a)[..., None], -1)[..., 0]


def _retrace_scales(inputs, mask, lambda_, eps):
  """(targets, errors) bounds: the returns' sums over absolute values."""
  f = {k: np.asarray(v) for k, v in inputs.items()}
  m = np.ones(f["r_t"].shape, bool) if mask is None else np.asarray(mask)
  with np.errstate(divide="ignore", invalid="ignore"):
    c = lambda_ * np.minimum(1.0, _take(f["pi_t"], f["a_t"]) / (f["mu_t"].astype(np.float64) + eps))
  c = np.where(m, np.abs(c), 0.0)  # garbage only at masked steps
  v_abs = np.sum(np.abs(f["pi_t"].astype(np.float64) * f["q_t"]), -1)
  g_abs = ref.general_off_policy_returns(
      -np.abs(_take(f["q_t"], f["a_t"])), v_abs, np.abs(f["r_t"]), np.abs(f["discount_t"]), c, mask
  )
  return g_abs, g_abs + np.abs(_take(f["q_tm1"], f["a_tm1"]))


def _random_q_inputs(
    rng, t_len, batch, *, num_actions=NUM_ACTIONS, use_mask=True, garbage=1e3, dtype=np.float32
):
  """Random Retrace inputs with episode structure; masked steps (and the
  unused mu_t of the step before each) hold arbitrary finite garbage."""
  shape = (t_len,) + tuple(batch)
  if use_mask:
    d, mask, kind = testing.random_layout(
        rng, t_len, batch, p_termination=0.12, p_truncation=0.12, p_padding=0.2
    )
  else:
    d, mask, kind = testing.random_layout(
        rng, t_len, batch, p_termination=0.12, p_truncation=0.0, p_start_masked=0.0
    )
    mask = None
  q_shape = shape + (num_actions,)
  logits = rng.normal(size=q_shape) * rng.choice([0.3, 1.0, 4.0], size=shape + (1,))
  pi = np.exp(logits - logits.max(-1, keepdims=True))
  pi /= pi.sum(-1, keepdims=True)
  a_t = rng.integers(0, num_actions, size=shape)
  ratio = np.exp(rng.uniform(np.log(1e-3), np.log(1e3), size=shape))
  mu = np.clip(_take(pi, a_t) / ratio, 1e-6, 1.0)
  inputs = dict(
      q_tm1=rng.normal(size=q_shape) * 2.0,
      q_t=rng.normal(size=q_shape) * 2.0,
      a_tm1=rng.integers(0, num_actions, size=shape),
      a_t=a_t,
      r_t=rng.normal(size=shape),
      discount_t=d,
      pi_t=pi,
      mu_t=mu,
  )
  if mask is not None:
    for k in ("q_tm1", "q_t", "r_t", "discount_t", "pi_t", "mu_t"):
      inputs[k] = testing.fill_masked(
          inputs[k], mask, rng.uniform(-garbage, garbage, size=np.shape(inputs[k]))
      )
    for k in ("a_tm1", "a_t"):
      inputs[k] = testing.fill_masked(inputs[k], mask, rng.integers(0, num_actions, size=shape))
    # mu_t (and a_t) of a step whose next step is masked are never used.
    before_masked = np.concatenate([~mask[1:], np.zeros_like(mask[:1])])
    inputs["mu_t"] = np.where(
        before_masked & mask, rng.uniform(-garbage, garbage, size=shape), inputs["mu_t"]
    )
  inputs = {
      k: (v.astype(dtype) if k not in ("a_tm1", "a_t") else v.astype(np.int32))
      for k, v in inputs.items()
  }
  return inputs, mask, kind


def _pad_time(inputs, mask, t_pad, garbage=1e3):
  """Pads to t_pad steps with masked steps holding garbage."""
  t_len = mask.shape[0]
  n = t_pad - t_len
  rng = np.random.default_rng(n)
  out = {}
  for k, v in inputs.items():
    pad_shape = (n,) + v.shape[1:]
    if k in ("a_tm1", "a_t"):
      pad = rng.integers(0, NUM_ACTIONS, size=pad_shape)
    else:
      pad = rng.uniform(-garbage, garbage, size=pad_shape)
    out[k] = np.concatenate([v, pad.astype(v.dtype)])
  pad_mask = np.concatenate([mask, np.zeros((n,) + mask.shape[1:], bool)])
  return out, pad_mask


_HYPER = dict(
    lambda_=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0)),
    eps=st.sampled_from([0.0, 1e-8, 1e-3]),
)


# ---------------------------------------------------------------------------
# Layer 1: hand-computed cases (in `RetraceVariantsTest`).
# ---------------------------------------------------------------------------


_R1 = dict(
    q_tm1=[[1.0, 2.0], [3.0, 4.0]],
    q_t=[[3.0, 5.0], [0.0, 2.0]],
    a_tm1=np.array([0, 1], np.int32),
    a_t=np.array([1, 0], np.int32),
    r_t=[1.0, 2.0],
    discount_t=[0.5, 0.9],
    pi_t=[[0.25, 0.75], [0.5, 0.5]],
    mu_t=[0.5, 0.4],
)


# ---------------------------------------------------------------------------
# Layer 2: the float64 loop references on random inputs.
# ---------------------------------------------------------------------------


def _check_retrace_example(wrap, methods, x64, t_len, batch, use_mask, lambda_, eps, seed):
  rng = np.random.default_rng(seed)
  dtype = np.float64 if x64 else np.float32
  if not use_mask:
    t_len = T_PAD
  inputs, mask, _ = _random_q_inputs(rng, t_len, batch, use_mask=use_mask, dtype=dtype)
  if use_mask:
    padded, pad_mask = _pad_time(inputs, mask, T_PAD)
  else:  # (mask=None is the same as all True: test_mask_none_equals_all_true)
    padded, pad_mask = inputs, np.ones((T_PAD,) + tuple(batch), bool)
  exp_errors, exp_targets = ref.retrace(*(inputs[k] for k in Q_ARGS), mask, lambda_, eps)
  g_scale, e_scale = _retrace_scales(inputs, mask, lambda_, eps)
  rtol = 1e-12 if x64 else 2e-5
  for method in methods:
    with jax.enable_x64(x64):
      args = [jnp.asarray(padded[k]) for k in Q_ARGS]
      errors, targets = (
          np.asarray(x) for x in wrap(_errors_and_targets_fn(method))(*args, pad_mask, lambda_, eps)
      )
    chex.assert_type([errors, targets], dtype)
    np.testing.assert_array_equal(errors[t_len:], 0.0)
    np.testing.assert_array_equal(targets[t_len:], 0.0)
    _assert_scaled_close(errors[:t_len], exp_errors, e_scale, rtol, what="errors")
    _assert_scaled_close(targets[:t_len], exp_targets, g_scale, rtol, what="targets")
    if mask is not None:
      np.testing.assert_array_equal(errors[:t_len][~mask], 0.0)
      np.testing.assert_array_equal(targets[:t_len][~mask], 0.0)


@pytest.mark.parametrize("x64", [False, True], ids=["f32", "f64"])
@given(
    t_len=st.integers(1, T_PAD),
    batch=st.sampled_from(BATCH_SHAPES),
    use_mask=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    **_HYPER,
)
def test_retrace_matches_loop_reference_jit(x64, t_len, batch, use_mask, seed, lambda_, eps):
  # float32: both methods on each example (one reference computation).
  # float64 (tight tolerance: checks the algorithm, not rounding): scan only;
  # the methods' agreement is checked in float32.
  methods = ("scan",) if x64 else ("scan", "associative")
  _check_retrace_example(jax.jit, methods, x64, t_len, batch, use_mask, lambda_, eps, seed)


# Fixed examples, eager and jitted (`RetraceVariantsTest`): scan over the three
# batch ranks; associative on [T, 2, 3] only (eager associative_scan compiles
# its many ops per new shape).
_FIXED_RETRACE_EXAMPLES = [
    ("scan", 13, (), True, 1.0, 1e-8, 0),
    ("scan", T_PAD, (3,), False, 0.7, 0.0, 1),
    ("scan", T_PAD, (2, 3), True, 0.0, 1e-3, 2),
    ("associative", T_PAD, (2, 3), True, 0.0, 1e-3, 2),
    ("associative", 2, (2, 3), True, 0.9, 1e-8, 3),
]


def _check_general_example(wrap, methods, t_len, batch, seed):
  rng = np.random.default_rng(seed)
  shape = (t_len,) + tuple(batch)
  d, mask, _ = testing.random_layout(
      rng, t_len, batch, p_termination=0.12, p_truncation=0.12, p_padding=0.2
  )
  inputs = dict(
      q_a_t=rng.normal(size=shape) * 2,
      v_t=rng.normal(size=shape),
      r_t=rng.normal(size=shape),
      discount_t=d,
      c_t=rng.uniform(0.0, 1.5, size=shape),
  )
  for k in G_ARGS:
    inputs[k] = testing.fill_masked(inputs[k], mask, rng.uniform(-1e3, 1e3, size=shape))
  inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
  n = T_PAD - t_len
  padded = [np.concatenate([inputs[k], np.full((n,) + shape[1:], 5e2, np.float32)]) for k in G_ARGS]
  pad_mask = np.concatenate([mask, np.zeros((n,) + shape[1:], bool)])
  expected = ref.general_off_policy_returns(*(inputs[k] for k in G_ARGS), mask)
  scale = ref.general_off_policy_returns(
      -np.abs(inputs["q_a_t"]),
      np.abs(inputs["v_t"]),
      np.abs(inputs["r_t"]),
      np.abs(inputs["discount_t"]),
      np.abs(inputs["c_t"]),
      mask,
  )
  for method in methods:
    out = np.asarray(wrap(_general_fn(method))(*padded, pad_mask))
    np.testing.assert_array_equal(out[t_len:], 0.0)
    _assert_scaled_close(out[:t_len], expected, scale, 2e-5, what=method)


@given(
    t_len=st.integers(1, T_PAD), batch=st.sampled_from(BATCH_SHAPES), seed=st.integers(0, 2**32 - 1)
)
def test_general_returns_match_loop_reference_jit(t_len, batch, seed):
  _check_general_example(jax.jit, ("scan", "associative"), t_len, batch, seed)


# Fixed examples, eager and jitted (`RetraceVariantsTest`).
_FIXED_GENERAL_EXAMPLES = [
    ("scan", T_PAD, (3,), 0),
    ("scan", 9, (2, 3), 1),
    ("associative", 9, (2, 3), 1),
]


# ---------------------------------------------------------------------------
# Layer 3: identities.
# ---------------------------------------------------------------------------


def _on_policy_consistent_example(seed, t_len, batch):
  """One Q table per state x_0..x_T: q_tm1[s] = Q(x_s), q_t[s] = Q(x_{s+1}),
  a_t[s] = a_tm1[s+1], and mu_t = pi_t[a_t] (on-policy). Masked steps hold
  garbage (so at a truncation q_t[e], the final observation's Q, differs
  from the masked step's q_tm1[e+1])."""
  rng = np.random.default_rng(seed)
  shape = (t_len,) + tuple(batch)
  d, mask, _ = testing.random_layout(
      rng, t_len, batch, p_termination=0.12, p_truncation=0.12, p_padding=0.2
  )
  q = rng.normal(size=(t_len + 1,) + shape[1:] + (NUM_ACTIONS,)) * 2
  acts = rng.integers(0, NUM_ACTIONS, size=(t_len + 1,) + shape[1:])
  logits = rng.normal(size=shape + (NUM_ACTIONS,))
  pi = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  inputs = dict(
      q_tm1=q[:-1],
      q_t=q[1:],
      a_tm1=acts[:-1],
      a_t=acts[1:],
      r_t=rng.normal(size=shape),
      discount_t=d,
      pi_t=pi,
  )
  for k in ("q_tm1", "q_t", "r_t", "discount_t", "pi_t"):
    inputs[k] = testing.fill_masked(
        inputs[k], mask, rng.uniform(-1e3, 1e3, size=np.shape(inputs[k]))
    )
  inputs["pi_t"] = testing.fill_masked(inputs["pi_t"], mask, 0.5)
  inputs["mu_t"] = _take(inputs["pi_t"], inputs["a_t"])
  inputs = {
      k: (v.astype(np.float32) if k not in ("a_tm1", "a_t") else v.astype(np.int32))
      for k, v in inputs.items()
  }
  return inputs, mask


def _check_q_lambda(wrap, methods, seed, batch, lambda_):
  for method in methods:
    _check_q_lambda_one(wrap, method, seed, batch, lambda_)


def _check_q_lambda_one(wrap, method, seed, batch, lambda_):
  inputs, mask = _on_policy_consistent_example(seed, T_PAD, batch)
  args = [inputs[k] for k in Q_ARGS]
  # eps = 0: c = lambda min(1, pi/pi) = lambda exactly.
  errors = _retrace_fn(wrap, method)(*args, mask, lambda_, 0.0)
  expected = ref.q_lambda_errors(
      inputs["q_tm1"],
      inputs["a_tm1"],
      inputs["q_t"],
      inputs["pi_t"],
      inputs["r_t"],
      inputs["discount_t"],
      mask,
      lambda_,
  )
  # The library computes the recursion form: its rounding is bounded by the
  # recursion's sum of absolute values.
  _, scale = _retrace_scales(inputs, mask, lambda_, 0.0)
  _assert_scaled_close(errors, expected, scale, 2e-5)
  # The same with general_off_policy_returns and c = lambda.
  q_a_t = _take(inputs["q_t"], inputs["a_t"]).astype(np.float32)
  v_t = np.sum(inputs["pi_t"] * inputs["q_t"], -1)
  g = wrap(_general_fn(method))(
      q_a_t,
      v_t,
      inputs["r_t"],
      inputs["discount_t"],
      np.full(mask.shape, lambda_, np.float32),
      mask,
  )
  expected_g = np.where(mask, expected + _take(inputs["q_tm1"], inputs["a_tm1"]), 0.0)
  _assert_scaled_close(g, expected_g, scale, 2e-5)


@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.sampled_from(BATCH_SHAPES),
    lambda_=st.one_of(st.just(1.0), st.floats(0.0, 1.0)),
)
def test_on_policy_retrace_is_q_lambda_jit(seed, batch, lambda_):
  _check_q_lambda(jax.jit, ("scan", "associative"), seed, batch, lambda_)


# Episodes of lengths 2 and 3 ending by termination, truncation or the end of
# the window, joined by one masked step each (20 steps per column).
_SPLIT_PATTERNS = [
    [(3, "term"), (2, "trunc"), (3, "trunc"), (2, "term"), (3, "term"), (2, "open")],
    [(2, "trunc"), (3, "term"), (2, "term"), (3, "trunc"), (2, "trunc"), (3, "open")],
    [(3, "trunc"), (3, "trunc"), (2, "term"), (2, "trunc"), (3, "trunc"), (2, "trunc")],
]


def _split_layout(pattern, gamma):
  d, mask, spans, s = [], [], [], 0
  for i, (length, end) in enumerate(pattern):
    d += [gamma] * (length - 1) + [0.0 if end == "term" else gamma]
    mask += [True] * length
    spans.append((s, s + length))
    s += length
    if i + 1 < len(pattern):  # The junction: a masked auto-reset step.
      d.append(-3.0)
      mask.append(False)
      s += 1
  return np.array(d), np.array(mask), spans


def _check_split(wrap, method, seed, lambda_):
  rng = np.random.default_rng(seed)
  f = _retrace_fn(wrap, method)
  cols = []
  for pattern in _SPLIT_PATTERNS:
    d, mask, spans = _split_layout(pattern, rng.uniform(0.8, 1.0))
    chex.assert_shape(d, (T_PAD,))
    inputs, _, _ = _random_q_inputs(rng, T_PAD, (), use_mask=False)
    inputs["discount_t"] = d.astype(np.float32)
    for k in ("q_tm1", "q_t", "r_t", "pi_t", "mu_t"):  # Large garbage.
      inputs[k] = testing.fill_masked(inputs[k], mask, rng.uniform(-1e6, 1e6, size=inputs[k].shape))
    # The unused a_t / mu_t of each episode's last step: garbage too.
    for _, stop in spans:
      inputs["mu_t"][stop - 1] = rng.uniform(-1e6, 1e6)
      inputs["a_t"][stop - 1] = rng.integers(0, NUM_ACTIONS)
    cols.append((inputs, mask, spans))
  batch_inputs = [np.stack([c[0][k] for c in cols], 1) for k in Q_ARGS]
  batch_mask = np.stack([c[1] for c in cols], 1)
  joined = np.asarray(f(*batch_inputs, batch_mask, lambda_, 1e-8))
  np.testing.assert_array_equal(joined[~batch_mask], 0.0)
  for j, (inputs, mask, spans) in enumerate(cols):
    for start, stop in spans:
      alone_args = [inputs[k][start:stop] for k in Q_ARGS]
      chex.assert_shape(alone_args[0], (stop - start, NUM_ACTIONS))
      alone = f(*alone_args, None, lambda_, 1e-8)
      np.testing.assert_allclose(joined[start:stop, j], alone, rtol=1e-6, atol=1e-6)


@given(seed=st.integers(0, 2**32 - 1), lambda_=st.one_of(st.just(1.0), st.floats(0.0, 1.0)))
def test_split_at_junctions_changes_nothing_jit(seed, lambda_):
  _check_split(jax.jit, "scan", seed, lambda_)
  _check_split(jax.jit, "associative", seed, lambda_)


def _grad_example():
  rng = np.random.default_rng(11)
  inputs, mask, _ = _random_q_inputs(rng, T_PAD, (3,), garbage=10.0)
  mask[0, 0] = False
  # Ratios around 1, so that some traces are unclipped (c depends on mu).
  inputs["mu_t"] = np.where(
      mask,
      np.clip(
          _take(inputs["pi_t"], inputs["a_t"]) * np.exp(rng.uniform(-1, 1, mask.shape)), 1e-3, 1.0
      ),
      inputs["mu_t"],
  ).astype(np.float32)
  return inputs, mask


def _check_stop_target_gradients(wrap, method):
  inputs, mask = _grad_example()
  float_names = ("q_tm1", "q_t", "r_t", "discount_t", "pi_t", "mu_t")
  f = _retrace_fn(wrap, method, True)

  def loss(*floats):
    kw = dict(zip(float_names, floats), a_tm1=inputs["a_tm1"], a_t=inputs["a_t"])
    return jnp.sum(f(*(kw[k] for k in Q_ARGS), mask, 0.9, 1e-8))

  grads = jax.grad(loss, argnums=tuple(range(6)))(*(inputs[k] for k in float_names))
  grads = dict(zip(float_names, grads))
  one_hot = np.eye(NUM_ACTIONS)[inputs["a_tm1"]]
  np.testing.assert_array_equal(grads["q_tm1"], np.where(mask[..., None], -one_hot, 0.0))
  for k in float_names[1:]:
    np.testing.assert_array_equal(grads[k], 0.0, err_msg=k)
  # general_off_policy_returns: no gradient at all.
  g_args = [
      np.asarray(x, np.float32)
      for x in (
          _take(inputs["q_t"], inputs["a_t"]),
          inputs["r_t"],
          inputs["r_t"],
          inputs["discount_t"],
          np.full(mask.shape, 0.7),
      )
  ]
  gf = wrap(_general_fn(method, True))
  for g in jax.grad(lambda *a: jnp.sum(gf(*a, mask)), argnums=tuple(range(5)))(*g_args):
    np.testing.assert_array_equal(g, 0.0)


@functools.lru_cache(maxsize=None)
def _rlax_retrace():
  """rlax.retrace vmapped over batch axis 1, jitted, lambda_ traced."""
  return jax.jit(
      jax.vmap(
          lambda *a: rlax.retrace(*a[:8], lambda_=a[8], eps=1e-8),
          in_axes=(1,) * 8 + (None,),
          out_axes=1,
      )
  )


def _check_batch_shapes_and_vmap_agree(wrap, method):
  rng = np.random.default_rng(4)
  inputs, mask, _ = _random_q_inputs(rng, T_PAD, (2, 3))
  args = [inputs[k] for k in Q_ARGS]
  f = _retrace_fn(wrap, method)
  full = np.asarray(f(*args, mask, 0.8, 1e-8))
  chex.assert_shape(full, (T_PAD, 2, 3))
  for i in range(2):
    rows = [a[:, i] for a in args]
    chex.assert_shape(rows[0], (T_PAD, 3, NUM_ACTIONS))
    np.testing.assert_allclose(f(*rows, mask[:, i], 0.8, 1e-8), full[:, i], rtol=1e-6, atol=1e-5)
    for j in (i, 2):
      cols = [a[:, i, j] for a in args]
      chex.assert_shape(cols[0], (T_PAD, NUM_ACTIONS))
      np.testing.assert_allclose(
          f(*cols, mask[:, i, j], 0.8, 1e-8), full[:, i, j], rtol=1e-6, atol=1e-5
      )
  # (vmap jitted only: it traces the function either way; eager vmap would
  # compile every batched op again.)
  g = jax.jit(
      jax.vmap(
          lambda *a: retrace(*a[:8], mask=a[8], lambda_=0.8, method=method), in_axes=1, out_axes=1
      )
  )
  np.testing.assert_allclose(g(*args, mask), full, rtol=1e-6, atol=1e-5)


class RetraceVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  # -------------------------------------------------------------------------
  # Layer 1: hand-computed cases.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_general_returns_hand_computed(self, method):
    q_a_t, v_t, r_t = [1.0, 2.0, 3.0], [2.0, 1.0, 0.5], [1.0, 1.0, 1.0]
    d, c = [0.5, 0.5, 0.5], [0.5, 1.0, 0.7]
    # G_2 = 1 + .5 * .5 = 1.25 (the last c is unused);
    # G_1 = 1 + .5 (1 - 1 * 2 + 1 * 1.25) = 1.125;
    # G_0 = 1 + .5 (2 - .5 * 1 + .5 * 1.125) = 2.03125.
    out = _run(general_off_policy_returns, self.variant, q_a_t, v_t, r_t, d, c, method=method)
    chex.assert_type(out, jnp.float32)
    chex.assert_shape(out, (3,))
    np.testing.assert_allclose(out, [2.03125, 1.125, 1.25], rtol=1e-6)
    # A masked junction at step 1: step 0 bootstraps fully from v_t[0]
    # (G_0 = 1 + .5 * 2 = 2), step 1 is 0, step 2 unchanged.
    out = _run(
        general_off_policy_returns,
        self.variant,
        q_a_t,
        v_t,
        r_t,
        d,
        c,
        mask=[True, False, True],
        method=method,
    )
    np.testing.assert_allclose(out, [2.0, 0.0, 1.25], rtol=1e-6)
    # A termination at step 0 (discount 0): G_0 = r_0 = 1.
    out = _run(
        general_off_policy_returns,
        self.variant,
        q_a_t,
        v_t,
        r_t,
        [0.0, 0.5, 0.5],
        c,
        method=method,
    )
    np.testing.assert_allclose(out, [1.0, 1.125, 1.25], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=ALL_METHODS)
  def test_retrace_hand_computed(self, method):
    # V(x_1) = .25 * 3 + .75 * 5 = 4.5, V(x_2) = .5 * 0 + .5 * 2 = 1;
    # c_1 = min(1, .75 / .5) = 1 (lambda 1), Q(x_1, a_1 = 1) = 5.
    # G_1 = 2 + .9 * 1 = 2.9; G_0 = 1 + .5 (4.5 - 1 * 5 + 1 * 2.9) = 2.2.
    # errors = G - q_tm1[a_tm1] = [2.2 - 1, 2.9 - 4] = [1.2, -1.1].
    args = [_R1[k] for k in Q_ARGS]
    out = _run(retrace, self.variant, *args, eps=0.0, method=method)
    chex.assert_type(out, jnp.float32)
    chex.assert_shape(out, (2,))
    np.testing.assert_allclose(out, [1.2, -1.1], rtol=1e-5)
    targets = _run(retrace_targets, self.variant, *args[1:2], *args[3:], eps=0.0, method=method)
    np.testing.assert_allclose(targets, [2.2, 2.9], rtol=1e-5)
    # lambda = .5 and mu_t[0] = 1: c_1 = .5 * min(1, .75 / 1) = .375;
    # G_0 = 1 + .5 (4.5 - .375 * 5 + .375 * 2.9) = 2.85625.
    args[-1] = [1.0, 0.4]
    out = _run(retrace, self.variant, *args, lambda_=0.5, eps=0.0, method=method)
    np.testing.assert_allclose(out, [1.85625, -1.1], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_retrace_hand_computed_truncation_junction_termination(self, method):
    # Step 0: LAST by time limit (discount .9) -> bootstraps fully from
    # V(final obs) = .5 * 2 + .5 * 4 = 3: G_0 = 1 + .9 * 3 = 3.7, error
    # 3.7 - q_tm1[0, 1] = 1.7 (a_t[0], mu_t[0] and the masked step's garbage
    # are unused).  Step 1: masked -> 0.  Step 2: terminates: G_2 = r = 3,
    # error 3 - .5 = 2.5.
    args = [
        [[1.0, 2.0], [99.0, -99.0], [0.5, 1.5]],
        [[2.0, 4.0], [55.0, 66.0], [7.0, 8.0]],
        np.array([1, 0, 0], np.int32),
        np.array([0, 1, 1], np.int32),
        [1.0, 77.0, 3.0],
        [0.9, 0.9, 0.0],
        [[0.5, 0.5], [0.1, 0.9], [0.2, 0.8]],
        [1e-30, 0.3, 0.9],
    ]
    out = _run(retrace, self.variant, *args, mask=[True, False, True], method=method)
    np.testing.assert_allclose(out, [1.7, 0.0, 2.5], rtol=1e-5)
    targets = _run(
        retrace_targets,
        self.variant,
        args[1],
        *args[3:],
        mask=[True, False, True],
        method=method,
    )
    np.testing.assert_allclose(targets, [3.7, 0.0, 3.0], rtol=1e-5)

  # -------------------------------------------------------------------------
  # Layer 2: the float64 loop references on fixed examples.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*_FIXED_RETRACE_EXAMPLES)
  def test_retrace_matches_loop_reference_fixed_examples(
      self, method, t_len, batch, use_mask, lambda_, eps, seed
  ):
    _check_retrace_example(
        self.variant, (method,), False, t_len, batch, use_mask, lambda_, eps, seed
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*_FIXED_GENERAL_EXAMPLES)
  def test_general_returns_match_loop_reference_fixed_examples(self, method, t_len, batch, seed):
    _check_general_example(self.variant, (method,), t_len, batch, seed)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(num_actions=[1, 40])
  def test_retrace_other_action_counts(self, num_actions):
    # A = 1 (a single action) and A = 40 (beyond the elementwise-unrolled
    # action path of the library) against the reference.
    rng = np.random.default_rng(num_actions)
    inputs, mask, _ = _random_q_inputs(rng, T_PAD, (3,), num_actions=num_actions)
    errors = _retrace_fn(self.variant)(*(inputs[k] for k in Q_ARGS), mask, 0.9, 1e-8)
    expected, _ = ref.retrace(*(inputs[k] for k in Q_ARGS), mask, 0.9, 1e-8)
    _, scale = _retrace_scales(inputs, mask, 0.9, 1e-8)
    _assert_scaled_close(errors, expected, scale, 2e-5)

  # -------------------------------------------------------------------------
  # Layer 3: identities.
  # -------------------------------------------------------------------------

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      ("scan", 0, (2, 3), 0.8), ("scan", 1, (), 1.0), ("associative", 0, (2, 3), 0.8)
  )
  def test_on_policy_retrace_is_q_lambda_fixed_examples(self, method, seed, batch, lambda_):
    _check_q_lambda(self.variant, (method,), seed, batch, lambda_)

  @chex.variants(with_jit=True, without_jit=True)
  def test_split_at_junctions_changes_nothing_fixed_example(self):
    # Scan only: eager associative would compile for three more shapes; the
    # hypothesis test runs both methods jitted.
    _check_split(self.variant, "scan", 0, 0.9)

  test_stop_target_gradients_scan, test_stop_target_gradients_associative = scan_and_associative(
      _check_stop_target_gradients
  )

  @chex.variants(with_jit=True, without_jit=True)
  def test_target_gradients_flow_without_stop(self):
    # Scan only (differentiating the associative scan: test_recurrence.py).
    inputs, mask = _grad_example()
    float_names = ("q_tm1", "q_t", "r_t", "discount_t", "pi_t", "mu_t")
    f = _retrace_fn(self.variant, "scan", False)

    def loss(*floats):
      kw = dict(zip(float_names, floats), a_tm1=inputs["a_tm1"], a_t=inputs["a_t"])
      return jnp.sum(f(*(kw[k] for k in Q_ARGS), mask, 0.9, 1e-8))

    grads = jax.grad(loss, argnums=tuple(range(6)))(*(inputs[k] for k in float_names))
    for k, g in zip(float_names, grads):
      g = np.asarray(g)
      assert np.all(np.isfinite(g)), k
      assert np.any(g != 0.0), k
      # Nothing flows into the masked steps' garbage.
      np.testing.assert_array_equal(g[~mask], 0.0, err_msg=k)
    np.testing.assert_array_equal(
        grads[0], np.where(mask[..., None], -np.eye(NUM_ACTIONS)[inputs["a_tm1"]], 0.0)
    )
    # general_off_policy_returns: gradient reaches every input.
    g_args = [
        np.asarray(x, np.float32)
        for x in (
            _take(inputs["q_t"], inputs["a_t"]),
            inputs["r_t"],
            inputs["r_t"],
            inputs["discount_t"],
            np.full(mask.shape, 0.7),
        )
    ]
    gf = self.variant(_general_fn("scan", False))
    for name, g in zip(
        G_ARGS, jax.grad(lambda *a: jnp.sum(gf(*a, mask)), argnums=tuple(range(5)))(*g_args)
    ):
      assert np.any(np.asarray(g) != 0.0), name

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_rlax_retrace(self):
    f = _retrace_fn(self.variant)
    for seed, lambda_ in enumerate([1.0, 0.6, 0.0]):
      rng = np.random.default_rng(seed)
      inputs, _, _ = _random_q_inputs(rng, T_PAD, (3,), use_mask=False)
      args = [inputs[k] for k in Q_ARGS]
      ours = f(*args, None, lambda_, 1e-8)
      theirs = _rlax_retrace()(*args, lambda_)
      _, scale = _retrace_scales(inputs, None, lambda_, 1e-8)
      _assert_scaled_close(ours, np.asarray(theirs, np.float64), scale, 2e-5)
      # And unbatched [T].
      ours_1d = f(*(a[:, 0] for a in args), None, lambda_, 1e-8)
      chex.assert_trees_all_close(ours_1d, np.asarray(ours)[:, 0], rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(seed=[0, 1])
  def test_scan_associative_and_auto_agree(self, seed):
    rng = np.random.default_rng(seed)
    inputs, mask, _ = _random_q_inputs(rng, T_PAD, (2, 3))
    args = [inputs[k] for k in Q_ARGS]
    _, scale = _retrace_scales(inputs, mask, 0.95, 1e-8)
    scan = _retrace_fn(self.variant, "scan")(*args, mask, 0.95, 1e-8)
    for method in ("associative", "auto"):
      other = _retrace_fn(self.variant, method)(*args, mask, 0.95, 1e-8)
      _assert_scaled_close(other, np.asarray(scan, np.float64), scale, 4e-5, what=method)

  test_batch_shapes_and_vmap_agree_scan, test_batch_shapes_and_vmap_agree_associative = (
      scan_and_associative(_check_batch_shapes_and_vmap_agree)
  )

  @chex.variants(with_jit=True, without_jit=True)
  def test_mask_none_equals_all_true(self):
    rng = np.random.default_rng(5)
    inputs, _, _ = _random_q_inputs(rng, T_PAD, (3,), use_mask=False)
    args = [inputs[k] for k in Q_ARGS]
    f = _retrace_fn(self.variant)
    chex.assert_trees_all_close(
        f(*args, None, 0.9, 1e-8),
        f(*args, np.ones((T_PAD, 3), bool), 0.9, 1e-8),
        rtol=1e-6,
        atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=METHODS)
  def test_huge_garbage_at_masked_steps_is_ignored(self, method):
    rng = np.random.default_rng(6)
    inputs, mask, _ = _random_q_inputs(rng, T_PAD, (2, 3))
    mask[0, 0, 1] = mask[-1, 1, 2] = False
    f = _retrace_fn(self.variant, method)
    outs = []
    for value in (0.0, 1e30, -1e30):
      garbled = {
          k: (testing.fill_masked(v, mask, value) if k not in ("a_tm1", "a_t") else v)
          for k, v in inputs.items()
      }
      out = np.asarray(f(*(garbled[k] for k in Q_ARGS), mask, 1.0, 1e-8))
      assert np.all(np.isfinite(out)), value
      np.testing.assert_array_equal(out[~mask], 0.0)
      outs.append(out)
    for out in outs[1:]:
      chex.assert_trees_all_equal(out, outs[0])

  @chex.variants(with_jit=True, without_jit=True)
  def test_traced_lambda_vmap_over_a_sweep(self):
    rng = np.random.default_rng(7)
    inputs, mask, _ = _random_q_inputs(rng, T_PAD, (3,))
    args = [inputs[k] for k in Q_ARGS]
    f = _retrace_fn(self.variant)
    lambdas = jnp.array([0.0, 0.5, 1.0])
    swept = jax.vmap(lambda lam: f(*args, mask, lam, 1e-8))(lambdas)
    for i in range(3):
      np.testing.assert_allclose(
          swept[i], f(*args, mask, float(lambdas[i]), 1e-8), rtol=1e-6, atol=1e-6
      )


# ---------------------------------------------------------------------------
# Bad input: trace-time errors naming the argument, jitted and not.
# ---------------------------------------------------------------------------


def _good_q_args(t=3, b=2, a=4):
  return dict(
      q_tm1=jnp.ones((t, b, a)),
      q_t=jnp.ones((t, b, a)),
      a_tm1=jnp.zeros((t, b), jnp.int32),
      a_t=jnp.zeros((t, b), jnp.int32),
      r_t=jnp.ones((t, b)),
      discount_t=jnp.ones((t, b)),
      pi_t=jnp.full((t, b, a), 0.25),
      mu_t=jnp.full((t, b), 0.5),
  )


_TARGET_ARGS = ("q_t", "a_t", "r_t", "discount_t", "pi_t", "mu_t")


def _call(fn, wrap, kwargs, mask=None, **static):
  names = Q_ARGS if fn is retrace else _TARGET_ARGS
  return _run(fn, wrap, *(kwargs[k] for k in names), mask=mask, **static)


_WRONG_SHAPES = [
    ("q_tm1", jnp.ones((3, 2, 5))),
    ("q_tm1", jnp.ones((3, 2))),
    ("q_t", jnp.ones((3, 2, 5))),
    ("q_t", jnp.ones((3, 4))),
    ("pi_t", jnp.ones((3, 2, 5))),
    ("a_tm1", jnp.zeros((3, 3), jnp.int32)),
    ("a_t", jnp.zeros((3,), jnp.int32)),
    ("discount_t", jnp.ones((3, 3))),
    ("mu_t", jnp.ones((2, 2))),
]
_FNS = [(retrace, Q_ARGS), (retrace_targets, _TARGET_ARGS)]
_Q_BAD_HYPERPARAMETERS = [
    (dict(lambda_=-0.01), "lambda_"),
    (dict(lambda_=1.01), "lambda_"),
    (dict(lambda_=float("nan")), "lambda_"),
    (dict(eps=-1e-8), "eps"),
    (dict(method="loop"), "method"),
]
# Named cases (a function's repr holds its address, which would make the test
# names differ between processes, e.g. pytest-xdist's workers).
_Q_FNS = [("retrace", retrace), ("retrace_targets", retrace_targets)]


def _good_g_args(shape=(3, 2)):
  return [jnp.ones(shape) for _ in G_ARGS]


class RetraceBadInputTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      *(
          (f"{fn.__name__}_{name}_{i}", fn, name, value)
          for fn, names in _FNS
          for i, (name, value) in enumerate(_WRONG_SHAPES)
          if name in names
      )
  )
  def test_q_wrong_shape_names_the_argument(self, fn, name, value):
    kwargs = _good_q_args()
    kwargs[name] = value
    with pytest.raises(ValueError, match=f"`{name}`"):
      _call(fn, self.variant, kwargs)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      *((f"{fn.__name__}_{name}", fn, name) for fn, names in _FNS for name in names)
  )
  def test_q_wrong_dtype_names_the_argument(self, fn, name):
    kwargs = _good_q_args()
    x = kwargs[name]
    kwargs[name] = (
        x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.integer) else x.astype(jnp.int32)
    )
    with pytest.raises(TypeError, match=f"`{name}`"):
      _call(fn, self.variant, kwargs)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*_Q_FNS)
  def test_q_wrong_rank_and_bad_mask(self, fn):
    kwargs = _good_q_args()
    kwargs["r_t"] = jnp.float32(1.0)
    with pytest.raises(ValueError, match="`r_t`"):
      _call(fn, self.variant, kwargs)
    kwargs = _good_q_args(t=0)
    with pytest.raises(ValueError, match="`r_t`"):
      _call(fn, self.variant, kwargs)
    with pytest.raises(TypeError, match="`mask`"):
      _call(fn, self.variant, _good_q_args(), mask=jnp.ones((3, 2), jnp.float32))
    with pytest.raises(ValueError, match="`mask`"):
      _call(fn, self.variant, _good_q_args(), mask=jnp.ones((3,), bool))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      *(
          (f"{fn_name}_{name}_{i}", fn, kwargs, name)
          for fn_name, fn in _Q_FNS
          for i, (kwargs, name) in enumerate(_Q_BAD_HYPERPARAMETERS)
      )
  )
  def test_q_bad_hyperparameters(self, fn, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
      _call(fn, self.variant, _good_q_args(), **kwargs)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*((name, index) for index, name in enumerate(G_ARGS)))
  def test_general_wrong_shape_and_dtype_name_the_argument(self, index):
    args = _good_g_args()
    args[index] = jnp.ones((3, 5))
    # r_t is the reference shape: a mismatch there is reported on the others.
    with pytest.raises(ValueError, match=f"`{G_ARGS[index]}`" if index != 2 else "`q_a_t`"):
      _run(general_off_policy_returns, self.variant, *args)
    args = _good_g_args()
    args[index] = jnp.ones((3, 2), jnp.int32)
    with pytest.raises(TypeError, match=f"`{G_ARGS[index]}`"):
      _run(general_off_policy_returns, self.variant, *args)

  @chex.variants(with_jit=True, without_jit=True)
  def test_general_bad_rank_mask_and_method(self):
    wrap = self.variant
    with pytest.raises(ValueError, match="`r_t`"):
      _run(general_off_policy_returns, wrap, *[jnp.float32(1.0)] * 5)
    with pytest.raises(ValueError, match="`r_t`"):
      _run(general_off_policy_returns, wrap, *_good_g_args((0, 2)))
    with pytest.raises(TypeError, match="`mask`"):
      _run(general_off_policy_returns, wrap, *_good_g_args(), mask=jnp.ones((3, 2), jnp.int32))
    with pytest.raises(ValueError, match="`mask`"):
      _run(general_off_policy_returns, wrap, *_good_g_args(), mask=jnp.ones((3, 3), bool))
    with pytest.raises(ValueError, match="`method`"):
      _run(general_off_policy_returns, wrap, *_good_g_args(), method="loop")


@pytest.mark.parametrize("fn", [retrace, retrace_targets], ids=["retrace", "retrace_targets"])
def test_probabilities_outside_0_1_are_named_at_real_steps_only(fn):
  # A negative probability made a `c_t` error, an argument neither function has.
  kwargs = _good_q_args()
  names = Q_ARGS if fn is retrace else _TARGET_ARGS
  bad_pi = dict(kwargs, pi_t=kwargs["pi_t"].at[1, 0, 2].set(-0.25))
  with pytest.raises(
      ValueError,
      match=r"`pi_t` must be in \[0, 1\] \(probabilities\), got -0.25 at index \(1, 0, 2\)",
  ):
    fn(*(bad_pi[k] for k in names))
  bad_mu = dict(kwargs, mu_t=kwargs["mu_t"].at[0, 1].set(-0.5))
  with pytest.raises(
      ValueError,
      match=r"`mu_t` must be in \[0, 1\] \(probabilities\), got -0.5 at index \(0, 1\)",
  ):
    fn(*(bad_mu[k] for k in names))
  # Q-values or logits passed as probabilities: a ratio above 1 is clipped, silently.
  logits = dict(kwargs, pi_t=kwargs["pi_t"].at[2, 1, 0].set(3.5))
  with pytest.raises(
      ValueError, match=r"`pi_t` must be in \[0, 1\] .*got 3.5 at index \(2, 1, 0\)"
  ):
    fn(*(logits[k] for k in names))
  fn(*(dict(kwargs, pi_t=kwargs["pi_t"] * (1 + 1e-6))[k] for k in names))  # softmax rounding
  # Masked steps may hold anything, and so may mu_t where no trace continues (the step
  # before a masked one, and the last step); under jit nothing is read.
  mask = jnp.ones((3, 2), bool).at[1, 0].set(False)
  garbage = dict(kwargs, pi_t=kwargs["pi_t"].at[1, 0].set(-1.0),
                 mu_t=kwargs["mu_t"].at[0, 0].set(-1.0).at[1, 0].set(-1.0).at[2, 1].set(-1.0))  # fmt: skip
  fn(*(garbage[k] for k in names), mask=mask)
  jax.jit(fn)(*(bad_pi[k] for k in names))


@pytest.mark.parametrize("jit", [False, True])
def test_an_illegal_action_s_minus_inf_q_leaves_v_out_as_in_soft_q(jit):
  """V = sum_a pi Q with a Q of -inf where pi is 0 (an illegal action, which soft-Q's
  targets allow) was 0 x -inf = NaN, carried back through the whole episode."""
  finite = jnp.array([[1.0, 2.0, -7.0]] * 3)
  illegal = finite.at[:, 2].set(-jnp.inf)
  pi_t = jnp.array([[0.5, 0.5, 0.0]] * 3)
  a = jnp.zeros(3, jnp.int32)
  rest = (jnp.ones(3), jnp.full(3, 0.9), pi_t, jnp.full(3, 0.5))
  unstopped = functools.partial(retrace, stop_target_gradients=False)
  fn, unstopped = (jax.jit(retrace), jax.jit(unstopped)) if jit else (retrace, unstopped)
  want = fn(finite, finite, a, a, *rest)
  np.testing.assert_array_equal(fn(finite, illegal, a, a, *rest), want)
  grad = jax.grad(lambda q: unstopped(q, illegal, a, a, *rest).sum())
  np.testing.assert_array_equal(grad(illegal), grad(finite))  # finite, 0 at the illegal action
  errors, _ = ref.retrace(finite, illegal, a, a, *(np.asarray(x) for x in rest))
  np.testing.assert_allclose(want, errors, rtol=1e-6)
  q_ret = acer_q_ret(illegal, a, rest[0], rest[1], pi_t, rest[3])  # Retrace at lambda = 1
  np.testing.assert_array_equal(q_ret, acer_q_ret(finite, a, rest[0], rest[1], pi_t, rest[3]))
  assert np.isfinite(q_ret).all()


@pytest.mark.parametrize("jit", [False, True])
def test_a_cut_trace_reads_no_q_so_the_next_action_s_q_may_be_minus_inf(jit):
  """c_1 = min(1, pi/mu) = 0 where the next action is one pi never takes: its Q of -inf
  (which `q_t`'s docstring allows there) made c x Q = 0 x -inf = NaN."""
  q_t = jnp.array([[1.0, 2.0, -jnp.inf], [1.0, 2.0, 3.0]])
  pi_t, mu_t = jnp.array([[0.5, 0.5, 0.0]] * 2), jnp.full(2, 0.5)
  a_t, r_t, discount_t = jnp.array([2, 0]), jnp.ones(2), jnp.full(2, 0.9)
  fns = (retrace_targets, acer_q_ret)
  for fn in map(jax.jit, fns) if jit else fns:
    np.testing.assert_allclose(fn(q_t, a_t, r_t, discount_t, pi_t, mu_t), [2.35, 2.35], rtol=1e-6)


def test_a_missing_action_axis_is_named_as_such():
  """The expected shape was built from the bad array's last axis, the batch's: `q_tm1` [4, 2]
  was told to be (4, 2, 2)."""
  x, a = jnp.zeros((4, 2)), jnp.zeros((4, 2), jnp.int32)
  missing = (
      r"`q_tm1` must have shape \(4, 2, A\) \(`r_t`'s \(4, 2\) plus an action axis A\), "
      r"got shape \(4, 2\)"
  )
  with pytest.raises(ValueError, match=missing):
    retrace(x, x, a, a, x, x, x, x)
  with pytest.raises(ValueError, match=missing):
    sql_nstep_td_error(x, a, x, x, x, alpha=0.3)
  with pytest.raises(ValueError, match=missing.replace("q_tm1", "q_t")):
    soft_q_targets(x, x, x, alpha=0.3)
