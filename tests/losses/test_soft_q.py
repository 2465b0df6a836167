"""Tests for soft values, soft-Q / SQL targets and SQIL relabelling.

Three layers: hand-computed cases, float64 NumPy loop references
(`offpolicy_ac.testing.reference.soft_q_targets`, `offpolicy_ac.testing.reference.soft_nstep_targets`) on random
inputs with terminations, truncations and masked junctions, and identities
(alpha -> 0 gives the hard max, n = 1 is lambda = 0, n >= T is lambda = 1,
splitting at junctions changes nothing, no gradient reaches stopped targets).

Dispatch: hand cases, fixed-shape reference comparisons, the extreme-value
checks and SQIL run both eagerly and under `jax.jit` (chex variants,
`self.variant`). Gradients, properties over hypothesis-drawn shapes and the
identities run jitted: eager execution would recompile every small op for
every new shape, for no extra coverage.
"""

import functools

from absl.testing import parameterized
import chex
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import losses as L
from offpolicy_ac import testing
from offpolicy_ac.testing import reference as ref

RTOL, ATOL = 2e-5, 2e-4

T_STRAT = st.integers(1, 16)
BATCH_STRAT = st.one_of(
    st.just(()), st.tuples(st.integers(1, 4)), st.tuples(st.integers(1, 3), st.integers(1, 3))
)
SEED_STRAT = st.integers(0, 2**31 - 1)
FEW = settings(max_examples=6)
SOME = settings(max_examples=4)  # the costlier properties


def _soft_q_inputs(seed, t, batch, n_actions=3, *, garble=True, p_padding=0.2):
  """Random r_t, discount_t, q_t, mask with terminations/truncations/junctions/padding."""
  rng = np.random.default_rng(seed)
  discount, mask, _ = testing.random_layout(
      rng, t, batch, junction_discount=7.0, p_padding=p_padding
  )
  r = rng.normal(size=(t,) + batch)
  q = 2.0 * rng.normal(size=(t,) + batch + (n_actions,))
  if garble:
    r = testing.garble(rng, r, mask)
    q = testing.garble(rng, q, mask)
  f32 = lambda x: np.asarray(x, np.float32)
  return f32(r), f32(discount), f32(q), mask


def _soft_q_lam(r, d, q, m, lam, alpha=0.5, *, method="scan"):
  """Hyper-parameters as (traced) arguments: one compilation per shape."""
  return L.soft_q_targets(r, d, q, alpha=alpha, lambda_=lam, mask=m, method=method)


def test_random_layouts_cover_every_kind_of_step():
  """The generator behind the reference tests makes all the cases we need."""
  kinds = np.concatenate(
      [
          testing.random_layout(np.random.default_rng(seed), 16, (4,), junction_discount=7.0)[
              2
          ].ravel()
          for seed in range(5)
      ]
  )
  # MID, termination, truncation (LAST with discount gamma) and masked steps.
  assert set(np.unique(kinds)) == {0, 1, 2, 3}
  d, m, k = testing.random_layout(np.random.default_rng(0), 64, (8,), junction_discount=7.0)
  after_last = np.concatenate([np.zeros((1, 8), bool), (k == 1) | (k == 2)])
  np.testing.assert_array_equal(~m[1:], after_last[1:-1])  # LAST -> masked
  assert np.all(d[k == 1] == 0.0) and np.all(d[k == 2] > 0.0)


# -----------------------------------------------------------------------------
# soft_value / soft_policy
# -----------------------------------------------------------------------------


def _soft_value_sum(q, alpha):
  return jnp.sum(L.soft_value(q, alpha))


def test_soft_value_gradient_is_the_boltzmann_policy():
  rng = np.random.default_rng(1)
  q = rng.normal(size=(4, 3, 5)).astype(np.float32)
  grad_fn = jax.jit(jax.grad(_soft_value_sum))
  for alpha in [0.3, 1.0, 3.0]:
    grad = grad_fn(q, alpha)
    expected = ref.softmax(q / alpha)
    np.testing.assert_allclose(grad, expected, atol=1e-6)
    np.testing.assert_allclose(L.soft_policy(q, alpha), expected, atol=1e-6)
    np.testing.assert_allclose(np.sum(L.soft_policy(q, alpha), -1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_soft_value_gradient_in_half_precision_at_a_large_alpha(dtype):
  """The backward pass multiplied the incoming gradient by alpha before dividing by it:
  100 x 1000 overflowed float16, and the gradient was inf."""
  q = jnp.array([1.0, 2.0, 3.0, 4.0], dtype)
  for alpha in [1.0, 1000.0]:
    grad = jax.grad(lambda q: 100.0 * L.soft_value(q, alpha).astype(jnp.float32))(q)
    assert grad.dtype == dtype and L.soft_value(q, alpha).dtype == dtype
    expected = 100.0 * ref.softmax(np.asarray(q, np.float64) / alpha)
    np.testing.assert_allclose(np.asarray(grad, np.float64), expected, rtol=1e-2)


def test_soft_value_alpha_derivative_is_the_policy_entropy():
  # d/d alpha [alpha lse(q/alpha)] = H(softmax(q/alpha)) >= 0: V grows with alpha.
  q = jnp.array([0.3, -1.2, 2.0, 0.5])
  grad_fn = jax.jit(jax.grad(L.soft_value, argnums=1))
  for alpha in [0.1, 0.7, 2.0]:
    d_alpha = grad_fn(q, alpha)
    p = ref.softmax(np.asarray(q, np.float64) / alpha)
    np.testing.assert_allclose(d_alpha, -np.sum(p * np.log(p)), rtol=1e-5, atol=1e-5)


def test_soft_value_tends_to_hard_max():
  q = jnp.array([[1.0, 3.0, 2.9, -4.0], [0.0, 0.0, 0.0, 0.0]])
  prev_gap = np.inf
  for alpha in [10.0, 1.0, 0.1, 1e-2, 1e-3, 1e-4]:
    v = np.asarray(L.soft_value(q, alpha))
    gap = v - np.asarray(q).max(-1)
    assert np.all(gap >= -1e-6)
    assert np.all(gap <= alpha * np.log(4) + 1e-5)
    assert gap.max() <= prev_gap + 1e-6  # monotone in alpha
    prev_gap = gap.max()
  np.testing.assert_allclose(L.soft_value(q, 1e-4), [3.0, 0.0], atol=2e-4)


def test_soft_value_per_state_alpha():
  q = jnp.array([[1.0, 2.0], [3.0, -1.0]])
  alpha = jnp.array([0.5, 2.0])
  v = L.soft_value(q, alpha)
  np.testing.assert_allclose(v, [ref.soft_value(q[0], 0.5), ref.soft_value(q[1], 2.0)], rtol=1e-6)


def test_soft_value_accepts_traced_alpha():
  q = jnp.array([[1.0, 2.0, 0.0]])
  alphas = jnp.array([0.1, 1.0, 10.0])
  v = jax.vmap(lambda a: L.soft_value(q, a))(alphas)
  np.testing.assert_allclose(
      v[:, 0], [ref.soft_value(q[0], a) for a in [0.1, 1.0, 10.0]], rtol=1e-6
  )
  v_jit = jax.jit(L.soft_value)(q, 0.5)
  np.testing.assert_allclose(v_jit, ref.soft_value(q, 0.5), rtol=1e-6)


# -----------------------------------------------------------------------------
# soft_q_targets: hand cases
# -----------------------------------------------------------------------------

_R = np.array([1.0, 2.0, -1.0, 0.5], np.float32)
_D = np.array([0.9, 0.5, 0.8, 0.7], np.float32)
_Q = np.array([[0.0, 1.0], [2.0, 2.0], [-1.0, 1.0], [0.5, 0.0]], np.float32)


def _v(row, alpha=1.0):
  return alpha * np.log(np.sum(np.exp(np.asarray(row, np.float64) / alpha)))


# -----------------------------------------------------------------------------
# soft_q_targets: NumPy reference on random inputs
# -----------------------------------------------------------------------------


# Hypothesis draws a new shape per example: those properties run jitted (one
# compilation each); eager execution is covered on the fixed shapes below.
FIXED_SHAPES = [(8, 3)]  # [T] and [T, B1, B2] come from hypothesis (jitted)


def _check_soft_q_reference(fn, seed, shape, lambda_, alpha, n_actions):
  r, d, q, mask = _soft_q_inputs(seed, shape[0], shape[1:], n_actions)
  out = fn(r, d, q, mask, lambda_, alpha)
  assert out.shape == r.shape and out.dtype == jnp.float32
  expected = ref.soft_q_targets(r, d, q, alpha, lambda_, mask)
  np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(np.asarray(out)[~mask], 0.0)


@FEW
@given(
    t=T_STRAT,
    batch=BATCH_STRAT,
    seed=SEED_STRAT,
    lambda_=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    alpha=st.floats(0.05, 5.0),
    n_actions=st.integers(1, 4),
)
@pytest.mark.parametrize("method", ["scan", "associative"])
def test_soft_q_targets_matches_numpy_reference(method, t, batch, seed, lambda_, alpha, n_actions):
  fn = jax.jit(functools.partial(_soft_q_lam, method=method))
  _check_soft_q_reference(fn, seed, (t,) + batch, lambda_, alpha, n_actions)


@FEW
@given(t=T_STRAT, batch=BATCH_STRAT, seed=SEED_STRAT, lambda_=st.floats(0.0, 1.0))
def test_soft_q_targets_scan_and_associative_agree(t, batch, seed, lambda_):
  r, d, q, mask = _soft_q_inputs(seed, t, batch)
  scan, assoc = jax.jit(
      lambda r, d, q, m, lam: tuple(
          L.soft_q_targets(r, d, q, alpha=0.5, lambda_=lam, mask=m, method=meth)
          for meth in ("scan", "associative")
      )
  )(r, d, q, mask, lambda_)
  np.testing.assert_allclose(scan, assoc, rtol=1e-5, atol=1e-4)


def test_soft_q_targets_time_major_batch_and_vmap_agree():
  t, b = 8, 3
  r, d, q, mask = _soft_q_inputs(3, t, (b,))
  batched = jax.jit(_soft_q_lam)(r, d, q, mask, 0.8)
  vmapped = jax.jit(jax.vmap(_soft_q_lam, in_axes=(1, 1, 1, 1, None), out_axes=1))(
      r, d, q, mask, 0.8
  )
  single_fn = jax.jit(_soft_q_lam)
  for j in range(b):
    assert r[:, j].shape == (t,) and q[:, j].shape == (t, 3)
    single = single_fn(r[:, j], d[:, j], q[:, j], mask[:, j], 0.8)
    np.testing.assert_allclose(batched[:, j], single, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(batched, vmapped, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_soft_q_targets_splitting_at_junctions_changes_nothing(method):
  rng = np.random.default_rng(7)
  fn = jax.jit(functools.partial(_soft_q_lam, method=method))
  # Both layouts have T = 8: two episodes, or a leading masked step and two.
  for lengths, lead_masked in [([3, 4], False), ([3, 3], True)]:
    mask, slices = testing.junction_layout(lengths, lead_masked)
    t = mask.size
    r = rng.normal(size=(t, 3)).astype(np.float32)
    d = rng.uniform(0.5, 1.0, size=(t, 3)).astype(np.float32)
    q = rng.normal(size=(t, 3, 3)).astype(np.float32)
    r[~mask], d[~mask], q[~mask] = 1e4, 3.0, -1e4  # junction garbage
    for lam in [0.0, 0.6, 1.0]:
      joined = np.asarray(fn(r, d, q, np.stack([mask] * 3, 1), lam))
      np.testing.assert_array_equal(joined[~mask], 0.0)
      for sl in slices:
        alone = fn(r[sl], d[sl], q[sl], None, lam)
        np.testing.assert_allclose(joined[sl], alone, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_soft_q_targets_nan_garbage_at_masked_steps_does_not_leak(method):
  r, d, q, mask = _soft_q_inputs(11, 8, (3,), garble=False)
  mask[4, :] = False
  r[~mask], d[~mask], q[~mask] = np.nan, np.nan, np.nan
  fn = jax.jit(functools.partial(_soft_q_lam, method=method))
  for lam in [0.0, 0.5, 1.0]:
    out = fn(r, d, q, mask, lam)
    assert np.all(np.isfinite(out)), (lam, method)
    np.testing.assert_allclose(
        out,
        ref.soft_q_targets(
            np.where(mask, r, 0),
            np.where(mask, d, 0),
            np.where(mask[..., None], q, 0),
            0.5,
            lam,
            mask,
        ),
        rtol=RTOL,
        atol=ATOL,
    )


def test_soft_q_targets_do_not_bootstrap_a_terminal_state_with_no_legal_action():
  """Every action illegal (-inf) at a terminal state: the target is the reward, not
  0 x -inf = NaN; with mixed dtypes the message names the argument."""
  q = jnp.full((2, 1, 3), -jnp.inf).at[1].set(0.0)
  targets = L.soft_q_targets(jnp.ones((2, 1)), jnp.array([[0.0], [0.5]]), q, alpha=0.5)
  np.testing.assert_allclose(targets, [[1.0], [1.0 + 0.5 * 0.5 * np.log(3.0)]], rtol=1e-6)
  with pytest.raises(TypeError, match="`discount_t` must have the dtype of `r_t`"):
    L.soft_q_targets(jnp.ones((2, 1), jnp.bfloat16), jnp.ones((2, 1)), q, alpha=0.5)


def test_soft_q_targets_tend_to_hard_max_targets():
  # |G_soft - G_hard| <= max_s (V_soft - max Q) <= alpha log A: the error of
  # each soft value is discounted (d <= 1) and averaged by the lambda mix.
  r, d, q, mask = _soft_q_inputs(5, 8, (3,))
  fn = jax.jit(_soft_q_lam)
  for lambda_ in [0.0, 0.5, 1.0]:
    hard = ref.soft_q_targets(r, d, q, None, lambda_, mask)
    for alpha, tol in [(1e-2, 1e-2 * np.log(3)), (1e-4, 2e-3)]:
      soft = np.asarray(fn(r, d, q, mask, lambda_, alpha))
      assert np.all(np.isfinite(soft))
      np.testing.assert_allclose(soft, hard, atol=tol + 1e-3)
      assert np.all(soft >= hard - 1e-3)  # V_soft >= max, discounts >= 0


def test_soft_q_targets_finite_for_tiny_alpha_and_huge_q():
  r, d, q, mask = _soft_q_inputs(2, 8, (3,), garble=False)
  q = (1e4 * np.sign(q)).astype(np.float32)
  out = jax.jit(_soft_q_lam)(r, d, q, mask, 0.5, 1e-4)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(
      out, ref.soft_q_targets(r, d, q, None, 0.5, mask), rtol=1e-5, atol=1e-2
  )


# -----------------------------------------------------------------------------
# soft_q_targets: gradients
# -----------------------------------------------------------------------------


def _weighted_soft_q_sum(r, d, q, m, w, lam, stop):
  return jnp.sum(
      w * L.soft_q_targets(r, d, q, alpha=0.5, lambda_=lam, mask=m, stop_target_gradients=stop)
  )


def test_soft_q_targets_stop_gradient():
  r, d, q, mask = _soft_q_inputs(4, 8, (3,), garble=False)
  w = np.random.default_rng(0).normal(size=r.shape).astype(np.float32)
  stopped = jax.jit(jax.grad(functools.partial(_weighted_soft_q_sum, stop=True), argnums=(0, 1, 2)))
  flowing = jax.jit(
      jax.grad(functools.partial(_weighted_soft_q_sum, stop=False), argnums=(0, 1, 2))
  )
  for lam in [0.0, 0.7]:
    for g in stopped(r, d, q, mask, w, lam):
      np.testing.assert_array_equal(g, 0.0)
    assert all(np.any(np.asarray(g) != 0) for g in flowing(r, d, q, mask, w, lam))


def test_static_arguments_traced_by_jit_are_refused_with_how_to_pass_them():
  """`n` and `stop_target_gradients` set the computation: passed through `jax.jit` as traced
  arguments they are refused with the way to pass them (not a tracer's own error)."""
  r, d, q, mask = _soft_q_inputs(4, 8, (3,), garble=False)
  nstep = lambda n: L.soft_nstep_targets(r, d, q, alpha=0.5, n=n, mask=mask)
  with pytest.raises(TypeError, match=r"`n` is static .*as a static argument \(static_argnums"):
    jax.jit(nstep)(3)
  np.testing.assert_allclose(jax.jit(nstep, static_argnums=0)(3), nstep(3), rtol=1e-5, atol=1e-6)
  soft_q = lambda stop: L.soft_q_targets(r, d, q, alpha=0.5, mask=mask, stop_target_gradients=stop)
  nstep_stop = lambda stop: L.soft_nstep_targets(r, d, q, alpha=0.5, n=2, mask=mask,
                                                  stop_target_gradients=stop)  # fmt: skip
  ones, actions = jnp.ones((4, 2)), jnp.zeros((4, 2), jnp.int32)
  pi = jnp.ones((4, 2, 3)) / 3
  vtrace = lambda stop: L.vtrace(ones, ones, ones, 0.9 * ones, ones, stop_target_gradients=stop)
  retrace = lambda stop: L.retrace(pi, pi, actions, actions, ones, 0.9 * ones, pi, ones / 3,
                                   stop_target_gradients=stop)  # fmt: skip
  for fn in (soft_q, nstep_stop, vtrace, retrace):
    fn(True)  # as a Python bool
    with pytest.raises(TypeError, match="`stop_target_gradients` is static"):
      jax.jit(fn)(True)
    with pytest.raises(ValueError, match="`stop_target_gradients` must be True or False, got "
                                         "'False'"):  # fmt: skip
      fn("False")  # would act as True


def test_hyper_parameters_given_as_strs_are_refused_by_name():
  """NumPy parses "2" as 2.0: a str would pass the range checks, and act as a number where
  the loss reads it and fail (or not) later."""
  ones = jnp.ones((4, 3))
  with pytest.raises(ValueError, match="`clip_rho_threshold` must be a number or an array of "
                                       "numbers, got '2'"):  # fmt: skip
    L.vtrace(ones, ones, ones, 0.9 * ones, ones, clip_rho_threshold="2")
  with pytest.raises(ValueError, match="`lambda_` must be a number"):
    L.vtrace(ones, ones, ones, 0.9 * ones, ones, lambda_="0.9")


def test_soft_q_targets_gradient_matches_finite_differences():
  r, d, q, mask = _soft_q_inputs(8, 6, (), n_actions=2, garble=False, p_padding=0.0)
  mask[3] = False
  w = np.random.default_rng(1).normal(size=r.shape)
  grad_fn = jax.jit(
      jax.grad(functools.partial(_weighted_soft_q_sum, stop=False), argnums=(0, 1, 2))
  )
  args = [r.astype(np.float64), d.astype(np.float64), q.astype(np.float64)]
  eps = 1e-6
  for lam in [0.0, 0.4, 1.0]:
    np_total = lambda r64, d64, q64: np.sum(w * ref.soft_q_targets(r64, d64, q64, 0.5, lam, mask))
    grads = grad_fn(r, d, q, mask, w.astype(np.float32), lam)
    for i, g in enumerate(grads):
      fd = np.zeros(args[i].shape)
      for idx in np.ndindex(args[i].shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[i][idx] += eps
        minus[i][idx] -= eps
        fd[idx] = (np_total(*plus) - np_total(*minus)) / (2 * eps)
      np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-4)


# -----------------------------------------------------------------------------
# n-step soft targets and the SQL error
# -----------------------------------------------------------------------------


def _soft_nstep(r, d, q, m, alpha, *, n):
  return L.soft_nstep_targets(r, d, q, alpha=alpha, n=n, mask=m)


@FEW
@given(
    t=T_STRAT, batch=BATCH_STRAT, seed=SEED_STRAT, n=st.integers(1, 6), alpha=st.floats(0.05, 5.0)
)
def test_soft_nstep_targets_match_numpy_reference(t, batch, seed, n, alpha):
  _check_soft_nstep_reference(
      jax.jit(functools.partial(_soft_nstep, n=n)), seed, (t,) + batch, n, alpha
  )


def _check_soft_nstep_reference(fn, seed, shape, n, alpha):
  t, batch = shape[0], shape[1:]
  r, d, q, mask = _soft_q_inputs(seed, t, batch)
  out = np.asarray(fn(r, d, q, mask, alpha))
  assert out.shape == r.shape
  expected = ref.soft_nstep_targets(r, d, q, alpha, n, mask)
  # Real steps only here; the masked steps are covered by
  # `test_soft_nstep_targets_are_zero_at_masked_steps`.
  np.testing.assert_allclose(np.where(mask, out, 0.0), expected, rtol=RTOL, atol=ATOL)


@SOME
@given(t=T_STRAT, batch=BATCH_STRAT, seed=SEED_STRAT)
def test_soft_nstep_identities(t, batch, seed):
  r, d, q, mask = _soft_q_inputs(seed, t, batch)
  rng = np.random.default_rng(seed)
  d_mid = rng.uniform(0.5, 1.0, size=r.shape).astype(np.float32)
  r_clean = np.where(mask, r, 0.1).astype(np.float32)
  q_clean = np.where(mask[..., None], q, 0.2).astype(np.float32)

  @jax.jit
  def compute(r, d, q, mask, r_clean, d_mid, q_clean):
    nstep = lambda n, *a, **kw: L.soft_nstep_targets(*a, alpha=0.5, n=n, **kw)
    lam = lambda lam, *a, **kw: L.soft_q_targets(*a, alpha=0.5, lambda_=lam, **kw)
    clean = (r_clean, d_mid, q_clean)
    return dict(
        n1=nstep(1, r, d, q, mask=mask),
        lam0=lam(0.0, r, d, q, mask=mask),
        clean_long=[nstep(n, *clean) for n in (t, t + 3)],
        clean_lam1=lam(1.0, *clean),
        masked_long=[nstep(n, r, d, q, mask=mask) for n in (t, t + 3)],
        masked_lam1=lam(1.0, r, d, q, mask=mask),
    )

  out = compute(r, d, q, mask, r_clean, d_mid, q_clean)
  # n = 1 is the one-step soft Bellman target (lambda = 0).
  np.testing.assert_allclose(out["n1"], out["lam0"], rtol=1e-6, atol=1e-6)
  # n >= T, no mask: the full return bootstrapped at the end (lambda = 1).
  for long in out["clean_long"]:
    np.testing.assert_allclose(long, out["clean_lam1"], rtol=1e-5, atol=1e-4)
  # ... and with terminations and masked junctions, on the real steps.
  for long in out["masked_long"]:
    np.testing.assert_allclose(np.where(mask, long, 0.0), out["masked_lam1"], rtol=1e-5, atol=1e-4)


def test_soft_nstep_past_the_sequence_length_compiles_as_n_equals_t():
  """A return is cut at the sequence end, so any n >= T is n = T: each of the n - 1 passes
  was traced (n = 400 on T = 5 had not compiled after a minute)."""
  r, d, q, mask = _soft_q_inputs(0, 5, (2,))
  fn = lambda r, d, q, n: L.soft_nstep_targets(r, d, q, alpha=0.5, n=n, mask=mask)  # noqa: E731
  programs = {n: jax.make_jaxpr(functools.partial(fn, n=n))(r, d, q) for n in (5, 1000)}
  assert len(programs[1000].eqns) == len(programs[5].eqns)
  np.testing.assert_array_equal(jax.jit(fn, static_argnames="n")(r, d, q, n=1000),
                                fn(r, d, q, n=5))  # fmt: skip
  td = L.sql_nstep_td_error(q, jnp.zeros(r.shape, jnp.int32), r, d, q, alpha=0.5, n=1000, mask=mask)
  np.testing.assert_array_equal(td, L.sql_nstep_td_error(
      q, jnp.zeros(r.shape, jnp.int32), r, d, q, alpha=0.5, n=5, mask=mask))  # fmt: skip


def test_soft_nstep_splitting_at_junctions_changes_nothing():
  n = 3
  rng = np.random.default_rng(3)
  fn = jax.jit(functools.partial(_soft_nstep, n=n))
  for lengths, lead_masked in [([3, 4], False), ([3, 3], True)]:
    mask, slices = testing.junction_layout(lengths, lead_masked)
    t = mask.size
    r = rng.normal(size=(t, 3)).astype(np.float32)
    d = rng.uniform(0.5, 1.0, size=(t, 3)).astype(np.float32)
    q = rng.normal(size=(t, 3, 3)).astype(np.float32)
    r[~mask], d[~mask], q[~mask] = -1e4, 5.0, 1e4
    joined = np.asarray(fn(r, d, q, np.stack([mask] * 3, 1), 0.5))
    for sl in slices:
      alone = fn(r[sl], d[sl], q[sl], None, 0.5)
      np.testing.assert_allclose(joined[sl], alone, rtol=1e-6, atol=1e-6)


def test_soft_nstep_stop_gradient():
  r, d, q, mask = _soft_q_inputs(9, 8, (3,), garble=False)
  grads = jax.jit(
      jax.grad(
          lambda r, d, q: jnp.sum(L.soft_nstep_targets(r, d, q, alpha=0.5, n=3, mask=mask)),
          argnums=(0, 1, 2),
      )
  )(r, d, q)
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)
  # Without stopping: d G^(n)_s / d r_k is the discount product for k in the
  # window [s, s + n) (and zero across a masked step).
  t = 5
  r1, d1 = np.ones(t, np.float32), np.full(t, 0.5, np.float32)
  q1 = np.zeros((t, 2), np.float32)
  jac = jax.jit(
      jax.jacrev(
          lambda r: L.soft_nstep_targets(r, d1, q1, alpha=1.0, n=2, stop_target_gradients=False)
      )
  )(r1)
  expected = np.zeros((t, t))
  for s in range(t):
    expected[s, s] = 1.0
    if s + 1 < t:
      expected[s, s + 1] = 0.5
  np.testing.assert_allclose(jac, expected, rtol=1e-6)


def _sql_error(q_tm1, a, r, d, q, m, *, n):
  return L.sql_nstep_td_error(q_tm1, a, r, d, q, alpha=0.3, n=n, mask=m)


@SOME
@given(t=T_STRAT, batch=BATCH_STRAT, seed=SEED_STRAT, n=st.integers(1, 5))
def test_sql_nstep_td_error_matches_numpy_reference(t, batch, seed, n):
  _check_sql_reference(jax.jit(functools.partial(_sql_error, n=n)), seed, t, batch, n)


def _check_sql_reference(fn, seed, t, batch, n):
  r, d, q, mask = _soft_q_inputs(seed, t, batch, 4)
  rng = np.random.default_rng(seed + 1)
  q_tm1 = rng.normal(size=q.shape).astype(np.float32)
  a_tm1 = rng.integers(0, 4, size=r.shape).astype(np.int32)
  err = np.asarray(fn(q_tm1, a_tm1, r, d, q, mask))
  q_a = np.take_along_axis(q_tm1, a_tm1[..., None], -1)[..., 0]
  expected = np.where(mask, ref.soft_nstep_targets(r, d, q, 0.3, n, mask) - q_a, 0.0)
  np.testing.assert_allclose(err, expected, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(err[~mask], 0.0)


def test_sql_nstep_td_error_gradients():
  r, d, q, mask = _soft_q_inputs(2, 8, (3,), 4, garble=False)
  rng = np.random.default_rng(0)
  q_tm1 = rng.normal(size=q.shape).astype(np.float32)
  a_tm1 = rng.integers(0, 4, size=r.shape).astype(np.int32)

  def loss(q_tm1, q_t, r):
    err = L.sql_nstep_td_error(q_tm1, a_tm1, r, d, q_t, alpha=0.3, n=2, mask=mask)
    return 0.5 * jnp.sum(jnp.square(err))

  g_q_tm1, g_q_t, g_r = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q_tm1, q, r)
  np.testing.assert_array_equal(g_q_t, 0.0)
  np.testing.assert_array_equal(g_r, 0.0)
  err = L.sql_nstep_td_error(q_tm1, a_tm1, r, d, q, alpha=0.3, n=2, mask=mask)
  expected = -np.asarray(err)[..., None] * np.eye(4)[a_tm1]
  np.testing.assert_allclose(g_q_tm1, expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(g_q_tm1)[~mask], 0.0)


def test_sql_nstep_td_error_n1_is_one_step_soft_td():
  q_tm1 = jnp.array([[1.0, 0.0], [0.5, 2.0], [0.0, 0.0], [1.0, 1.0]])
  a_tm1 = jnp.array([0, 1, 0, 1])
  err = L.sql_nstep_td_error(q_tm1, a_tm1, _R, _D, _Q, alpha=1.0)
  expected = [_R[s] + _D[s] * _v(_Q[s]) - float(q_tm1[s, a_tm1[s]]) for s in range(4)]
  np.testing.assert_allclose(err, expected, rtol=1e-6)


# -----------------------------------------------------------------------------
# SQIL
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.array([1, 0]), np.array([1.0, 0.0]), 1, 1.0])
def test_sqil_rejects_non_bool(bad):
  with pytest.raises(TypeError, match="`is_demonstration`"):
    L.sqil_rewards(bad)
  with pytest.raises(TypeError, match="`is_demonstration`"):
    L.sqil_relabel(np.zeros((3, 2), np.float32), bad)
  with pytest.raises(TypeError, match="`is_demonstration`"):
    jax.jit(L.sqil_rewards)(bad)


@pytest.mark.parametrize("shape", [(4,), (1, 4), (2, 3, 1), (5, 3)])
def test_sqil_relabel_refuses_flags_of_other_shapes(shape):
  # r_t [T=4, B=3]: a per-step [T] (which JAX's own error did not name), or any shape that
  # is not a scalar, [B] or of r_t's rank broadcasting to it.
  with pytest.raises(ValueError, match=r"`is_demonstration` of shape .* must be a scalar"):
    L.sqil_relabel(np.zeros((4, 3), np.float32), np.ones(shape, bool))


def test_sqil_relabel_reads_a_flag_per_sequence_when_t_equals_b():
  r = np.zeros((3, 3), np.float32)
  flags = np.array([True, False, False])  # [B]: the first sequence is a demonstration
  np.testing.assert_array_equal(L.sqil_relabel(r, flags), np.tile([1.0, 0.0, 0.0], (3, 1)))
  np.testing.assert_array_equal(L.sqil_relabel(r, flags[:, None].T), L.sqil_relabel(r, flags))
  np.testing.assert_array_equal(L.sqil_relabel(r, flags[:, None]), np.tile(flags[:, None], 3))
  # One entry is one flag for the whole batch, as a scalar is.
  np.testing.assert_array_equal(L.sqil_relabel(np.zeros((4, 3), np.float32), np.ones(1, bool)),
                                np.ones((4, 3)))  # fmt: skip


def test_sqil_relabel_rejects_integer_rewards():
  with pytest.raises(TypeError, match="`r_t`"):
    L.sqil_relabel(np.zeros((3,), np.int32), True)


# -----------------------------------------------------------------------------
# Bad input: trace-time errors that name the argument.
# -----------------------------------------------------------------------------

_T, _B, _A = 8, 3, 3  # the shapes of the other eager tests: cached ops


def _good_soft_args():
  return dict(
      r_t=np.zeros((_T, _B), np.float32),
      discount_t=np.ones((_T, _B), np.float32),
      q_t=np.zeros((_T, _B, _A), np.float32),
  )


_SOFT_Q_BAD = [
    # (array overrides, hyper-parameter overrides, exception, name)
    (dict(r_t=np.zeros((_T, _B), np.int32)), {}, TypeError, "r_t"),
    (dict(discount_t=np.ones((_T, _B), np.int32)), {}, TypeError, "discount_t"),
    (dict(q_t=np.zeros((_T, _B, _A), np.int32)), {}, TypeError, "q_t"),
    (dict(discount_t=np.ones((_T,), np.float32)), {}, ValueError, "discount_t"),
    (dict(q_t=np.zeros((_T, _B + 1, _A), np.float32)), {}, ValueError, "q_t"),
    (dict(q_t=np.zeros((_T, _B), np.float32)), {}, ValueError, "q_t"),
    (dict(r_t=np.zeros((), np.float32)), {}, ValueError, "r_t"),
    (
        dict(
            r_t=np.zeros((0, _B), np.float32),
            discount_t=np.zeros((0, _B), np.float32),
            q_t=np.zeros((0, _B, _A), np.float32),
        ),
        {},
        ValueError,
        "r_t",
    ),
    (dict(mask=np.ones((_T, _B), np.float32)), {}, TypeError, "mask"),
    (dict(mask=np.ones((_T,), bool)), {}, ValueError, "mask"),
    ({}, dict(alpha=0.0), ValueError, "alpha"),
    ({}, dict(alpha=-1.0), ValueError, "alpha"),
    ({}, dict(alpha=float("nan")), ValueError, "alpha"),
    ({}, dict(lambda_=-0.1), ValueError, "lambda_"),
    ({}, dict(lambda_=1.5), ValueError, "lambda_"),
    ({}, dict(method="loop"), ValueError, "method"),
]


class SoftQVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_value_hand_cases(self):
    q = jnp.array([[1.0, 2.0], [0.0, 0.0]])
    v1 = self.variant(lambda q: L.soft_value(q, 1.0))(q)
    np.testing.assert_allclose(v1, [np.log(np.e + np.e**2), np.log(2.0)], rtol=1e-6)
    v_half = self.variant(lambda q: L.soft_value(q, 0.5))(q)
    np.testing.assert_allclose(
        v_half, [0.5 * np.log(np.e**2 + np.e**4), 0.5 * np.log(2.0)], rtol=1e-6
    )
    assert v1.shape == (2,)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(scale=[1.0, 1e2, 1e4])
  def test_soft_value_finite_and_bounded_for_extreme_inputs(self, scale):
    rng = np.random.default_rng(0)
    q = (scale * rng.uniform(-1, 1, size=(5, 4))).astype(np.float32)
    q[0] = [scale, -scale, scale, -scale]  # exact ties at the extremes
    value_fn = self.variant(L.soft_value)
    grad_fn = jax.jit(jax.grad(_soft_value_sum))
    for alpha in [1e-4, 1e-3, 1e-2, 1.0, 100.0]:
      v = np.asarray(value_fn(q, alpha), np.float64)
      assert np.all(np.isfinite(v))
      q_max = q.max(-1).astype(np.float64)
      # max Q <= V <= max Q + alpha log A (up to float32 rounding of q/alpha).
      tol = 1e-6 * scale + 1e-6 * alpha * 4
      assert np.all(v >= q_max - tol)
      assert np.all(v <= q_max + alpha * np.log(4) + tol)
      np.testing.assert_allclose(v, ref.soft_value(q, alpha), rtol=1e-5, atol=tol)
      grad = grad_fn(q, alpha)
      assert np.all(np.isfinite(grad))
      np.testing.assert_allclose(grad, ref.softmax(q.astype(np.float64) / alpha), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_value_ignores_minus_inf(self):
    q = jnp.array([[1.0, -jnp.inf, 2.0], [-jnp.inf, 0.5, -jnp.inf]])
    v = self.variant(lambda q: L.soft_value(q, 0.7))(q)
    np.testing.assert_allclose(v, [0.7 * np.log(np.exp(1 / 0.7) + np.exp(2 / 0.7)), 0.5], rtol=1e-6)
    grad = jax.jit(jax.grad(lambda q: jnp.sum(L.soft_value(q, 0.7))))(q)
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(np.asarray(grad)[[0, 1, 1], [1, 0, 2]], 0.0)
    np.testing.assert_allclose(np.sum(grad, -1), 1.0, rtol=1e-6)
    all_inf = L.soft_value(jnp.full((2,), -jnp.inf), 1.0)
    assert np.isneginf(all_inf)
    pol = L.soft_policy(q, 0.7)
    np.testing.assert_array_equal(np.asarray(pol)[[0, 1, 1], [1, 0, 2]], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=["scan", "associative"])
  def test_soft_q_targets_hand_lambda_0(self, method):
    fn = self.variant(lambda r, d, q: L.soft_q_targets(r, d, q, alpha=1.0, method=method))
    expected = [_R[s] + _D[s] * _v(_Q[s]) for s in range(4)]
    np.testing.assert_allclose(fn(_R, _D, _Q), expected, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=["scan", "associative"])
  def test_soft_q_targets_hand_lambda_half_with_mask(self, method):
    mask = np.array([True, True, False, True])
    fn = self.variant(
        lambda r, d, q, m: L.soft_q_targets(r, d, q, alpha=1.0, lambda_=0.5, mask=m, method=method)
    )
    g3 = _R[3] + _D[3] * _v(_Q[3])  # last step: full bootstrap
    g2 = 0.0  # masked
    g1 = _R[1] + _D[1] * _v(_Q[1])  # next step masked: trace cut
    g0 = _R[0] + _D[0] * (0.5 * _v(_Q[0]) + 0.5 * g1)
    np.testing.assert_allclose(fn(_R, _D, _Q, mask), [g0, g1, g2, g3], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_q_targets_hand_lambda_1(self):
    fn = self.variant(lambda r, d, q: L.soft_q_targets(r, d, q, alpha=2.0, lambda_=1.0))
    g = [0.0] * 4
    g[3] = _R[3] + _D[3] * _v(_Q[3], 2.0)
    for s in [2, 1, 0]:
      g[s] = _R[s] + _D[s] * g[s + 1]
    np.testing.assert_allclose(fn(_R, _D, _Q), g, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=["scan", "associative"])
  def test_soft_q_targets_matches_numpy_reference_fixed_shapes(self, method):
    fn = self.variant(functools.partial(_soft_q_lam, method=method))
    for i, shape in enumerate(FIXED_SHAPES):
      for lambda_ in [0.0, 0.7, 1.0]:
        _check_soft_q_reference(fn, 100 * i, shape, lambda_, 0.4, 3)

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_nstep_targets_hand_case(self):
    fn = self.variant(lambda r, d, q: L.soft_nstep_targets(r, d, q, alpha=1.0, n=2))
    v = [_v(row) for row in _Q]
    expected = [
        _R[0] + _D[0] * (_R[1] + _D[1] * v[1]),
        _R[1] + _D[1] * (_R[2] + _D[2] * v[2]),
        _R[2] + _D[2] * (_R[3] + _D[3] * v[3]),
        _R[3] + _D[3] * v[3],  # truncated at the sequence end
    ]
    np.testing.assert_allclose(fn(_R, _D, _Q), expected, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_nstep_targets_hand_case_with_mask(self):
    mask = np.array([True, True, False, True])
    fn = self.variant(lambda r, d, q, m: L.soft_nstep_targets(r, d, q, alpha=1.0, n=3, mask=m))
    v = [_v(row) for row in _Q]
    out = np.asarray(fn(_R, _D, _Q, mask))
    np.testing.assert_allclose(
        out[[0, 1, 3]],
        [
            _R[0] + _D[0] * (_R[1] + _D[1] * v[1]),  # stops before masked step 2
            _R[1] + _D[1] * v[1],
            _R[3] + _D[3] * v[3],
        ],
        rtol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_nstep_targets_are_zero_at_masked_steps(self):
    """The docstring: 'targets at times [0, T-1] ... (0 at masked steps)'."""
    mask = np.array([True, True, False, True])
    for n in [1, 2, 3]:
      fn = self.variant(lambda r, d, q, m: L.soft_nstep_targets(r, d, q, alpha=1.0, n=n, mask=m))
      out = np.asarray(fn(_R, _D, _Q, mask))
      assert out[2] == 0.0, f"n={n}: masked step target {out[2]} != 0"

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_nstep_targets_match_numpy_reference_fixed_shapes(self):
    for n in [2, 5]:
      fn = self.variant(functools.partial(_soft_nstep, n=n))
      for i, shape in enumerate(FIXED_SHAPES):
        _check_soft_nstep_reference(fn, 10 * i + n, shape, n, 0.6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sql_nstep_td_error_matches_numpy_reference_fixed_shapes(self):
    for n in [3]:
      fn = self.variant(functools.partial(_sql_error, n=n))
      for i, shape in enumerate(FIXED_SHAPES):
        _check_sql_reference(fn, i + 7 * n, shape[0], shape[1:], n)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sqil_rewards(self):
    demo = np.array([[True, False], [True, False], [False, True]])
    out = self.variant(L.sqil_rewards)(demo)
    assert out.dtype == jnp.float32 and out.shape == (3, 2)
    np.testing.assert_array_equal(out, demo.astype(np.float32))
    out16 = L.sqil_rewards(jnp.asarray(demo), dtype=jnp.bfloat16)
    assert out16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out16, np.float32), demo)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sqil_relabel_broadcasts_to_rewards(self):
    r = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    is_demo = np.array([True, True, False, False])  # [B], half and half
    out = self.variant(L.sqil_relabel)(r, is_demo)
    assert out.shape == r.shape and out.dtype == jnp.float32
    np.testing.assert_array_equal(out, np.broadcast_to([1.0, 1.0, 0.0, 0.0], r.shape))
    np.testing.assert_array_equal(L.sqil_relabel(r, True), np.ones_like(r))
    np.testing.assert_array_equal(L.sqil_relabel(r, False), np.zeros_like(r))
    full = np.zeros(r.shape, bool)
    full[2, 1] = True
    np.testing.assert_array_equal(L.sqil_relabel(r, full), full.astype(r.dtype))
    r16 = jnp.asarray(r, jnp.bfloat16)
    assert L.sqil_relabel(r16, is_demo).dtype == jnp.bfloat16


class SoftQBadInputTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*_SOFT_Q_BAD)
  def test_soft_q_targets_bad_input(self, arrays, hyper, exc, name):
    args = _good_soft_args()
    args.update(arrays)
    mask = args.pop("mask", None)
    kw = dict(alpha=1.0, lambda_=0.5)
    kw.update(hyper)
    fn = lambda r, d, q, m: L.soft_q_targets(r, d, q, mask=m, **kw)
    fn = self.variant(fn)
    with pytest.raises(exc, match=f"`{name}`"):
      fn(args["r_t"], args["discount_t"], args["q_t"], mask)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      *[
          (dict(q_t=np.zeros((_T, _B, _A), np.int32)), {}, TypeError, "q_t"),
          (dict(mask=np.ones((_T, _B), np.int32)), {}, TypeError, "mask"),
          (dict(q_t=np.zeros((_T + 1, _B, _A), np.float32)), {}, ValueError, "q_t"),
          ({}, dict(n=0), ValueError, "n"),
          ({}, dict(n=-2), ValueError, "n"),
          ({}, dict(n=2.0), ValueError, "n"),
          ({}, dict(alpha=0.0), ValueError, "alpha"),
      ]
  )
  def test_soft_nstep_targets_bad_input(self, arrays, hyper, exc, name):
    args = _good_soft_args()
    args.update(arrays)
    mask = args.pop("mask", None)
    kw = dict(alpha=1.0, n=2)
    kw.update(hyper)
    fn = lambda r, d, q, m: L.soft_nstep_targets(r, d, q, mask=m, **kw)
    fn = self.variant(fn)
    with pytest.raises(exc, match=f"`{name}`"):
      fn(args["r_t"], args["discount_t"], args["q_t"], mask)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
      *[
          (dict(q_tm1=np.zeros((_T, _B, _A), np.int32)), {}, TypeError, "q_tm1"),
          (dict(a_tm1=np.zeros((_T, _B), np.float32)), {}, TypeError, "a_tm1"),
          (dict(q_tm1=np.zeros((_T, _B, _A + 1, 1), np.float32)), {}, ValueError, "q_tm1"),
          (dict(q_tm1=np.zeros((_T, _B), np.float32)), {}, ValueError, "q_tm1"),
          (dict(a_tm1=np.zeros((_T,), np.int32)), {}, ValueError, "a_tm1"),
          (dict(q_t=np.zeros((_T, _B, _A), np.int32)), {}, TypeError, "q_t"),
          (dict(mask=np.ones((_T, _B + 1), bool)), {}, ValueError, "mask"),
          ({}, dict(n=0), ValueError, "n"),
          ({}, dict(alpha=-0.5), ValueError, "alpha"),
      ]
  )
  def test_sql_nstep_td_error_bad_input(self, arrays, hyper, exc, name):
    args = _good_soft_args()
    args.update(q_tm1=np.zeros((_T, _B, _A), np.float32), a_tm1=np.zeros((_T, _B), np.int32))
    args.update(arrays)
    mask = args.pop("mask", None)
    kw = dict(alpha=1.0, n=2)
    kw.update(hyper)
    fn = lambda q_tm1, a, r, d, q, m: L.sql_nstep_td_error(q_tm1, a, r, d, q, mask=m, **kw)
    fn = self.variant(fn)
    with pytest.raises(exc, match=f"`{name}`"):
      fn(args["q_tm1"], args["a_tm1"], args["r_t"], args["discount_t"], args["q_t"], mask)

  @chex.variants(with_jit=True, without_jit=True)
  def test_soft_value_bad_input(self):
    wrap = self.variant
    with pytest.raises(TypeError, match="`q`"):
      wrap(lambda q: L.soft_value(q, 1.0))(np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="`q`"):
      wrap(lambda q: L.soft_value(q, 1.0))(np.zeros((), np.float32))
    for alpha in [0.0, -1e-3, float("nan"), np.array([1.0, 0.0])]:
      with pytest.raises(ValueError, match="`alpha`"):
        wrap(lambda q: L.soft_value(q, alpha))(np.zeros((2, 3), np.float32))
      with pytest.raises(ValueError, match="`alpha`"):
        wrap(lambda q: L.soft_policy(q, alpha))(np.zeros((2, 3), np.float32))


def _alpha_calls(value_q, policy_q, next_q, td_q, r, d, a, log_density):
  """Each soft-Q function that takes a temperature, as a function of it alone."""
  return {
      "soft_value": lambda alpha: L.soft_value(value_q, alpha),
      "soft_policy": lambda alpha: L.soft_policy(policy_q, alpha),
      "soft_q_targets": lambda alpha: L.soft_q_targets(r, d, next_q, alpha=alpha),
      "soft_nstep_targets": lambda alpha: L.soft_nstep_targets(r, d, next_q, alpha=alpha, n=2),
      "sql_nstep_td_error": lambda alpha: L.sql_nstep_td_error(td_q, a, r, d, td_q, alpha=alpha),
      "importance_sampled_soft_value": lambda alpha: L.importance_sampled_soft_value(
          value_q, log_density, alpha
      ),
  }


def test_an_infinite_alpha_is_refused_where_it_made_nan():
  """alpha = inf gave 0 x inf = NaN silently (one action, or the recurrences); a concrete
  one is refused, a traced one is not read."""
  q, r, d = jnp.zeros((3, 1)), jnp.zeros(3), jnp.full(3, 0.9)
  a, q2 = jnp.zeros(3, jnp.int32), jnp.zeros((3, 2))
  calls = _alpha_calls(q, q2, q, q2, r, d, a, 0.0)
  for name, fn in calls.items():
    for alpha in (np.inf, jnp.float32(np.inf), jnp.array([1.0, np.inf, 1.0])):  # [3]: per step
      with pytest.raises(ValueError, match=r"`alpha` must be > 0 and finite, got"):
        fn(alpha)
    assert np.isfinite(np.asarray(jax.jit(fn)(jnp.float32(2.0)))).all(), name  # traced


def test_a_rank_one_alpha_or_lambda_is_refused_where_it_would_meet_the_batch_axis():
  # [T] against [T, B] with T == B would broadcast over the batch columns, silently.
  r = jnp.zeros((3, 3))
  q = jnp.zeros((3, 3, 2))
  for kwargs in [{"alpha": jnp.array([0.1, 1.0, 10.0])},
                 {"alpha": 1.0, "lambda_": jnp.array([1.0, 1.0, 0.0])}]:  # fmt: skip
    name = "lambda_" if "lambda_" in kwargs else "alpha"
    with pytest.raises(ValueError, match=rf"`{name}` of shape \(3,\) must be a scalar or have"):
      L.soft_q_targets(r, r, q, **kwargs)
  with pytest.raises(ValueError, match=r"`alpha` of shape \(4,\).*broadcast to their shape"):
    L.soft_q_targets(jnp.zeros((4, 3)), jnp.zeros((4, 3)), jnp.zeros((4, 3, 2)), alpha=jnp.ones(4))
  per_step = L.soft_q_targets(r, r, q, alpha=jnp.full((3, 1), 0.5))
  np.testing.assert_allclose(per_step, L.soft_q_targets(r, r, q, alpha=0.5))


def test_sql_nstep_td_error_refuses_target_q_values_of_another_action_count():
  q_tm1, a = jnp.zeros((4, 3, 2)), jnp.zeros((4, 3), jnp.int32)
  r, d = jnp.zeros((4, 3)), jnp.full((4, 3), 0.9)
  with pytest.raises(ValueError, match=r"`q_t` must have shape \(4, 3, 2\) \(matching `q_tm1`"):
    L.sql_nstep_td_error(q_tm1, a, r, d, jnp.zeros((4, 3, 5)), alpha=1.0, n=2)
  with pytest.raises(TypeError, match="`r_t` must have the dtype of `q_tm1`"):
    L.sql_nstep_td_error(q_tm1.astype(jnp.bfloat16), a, r, d, q_tm1, alpha=1.0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_soft_value_and_policy_do_not_overflow_where_q_over_alpha_would(dtype):
  # 100 / 1e-3 is past float16's maximum (65504): the maximum is subtracted first.
  q = jnp.array([[100.0, 99.0, 0.0]], dtype)
  np.testing.assert_allclose(float(L.soft_value(q, 1e-3)[0]), 100.0, rtol=1e-3)
  np.testing.assert_allclose(np.asarray(L.soft_policy(q, 1e-3), np.float32), [[1, 0, 0]], atol=1e-3)
  samples = jnp.array([[100.0, 99.0]], dtype)
  assert np.isfinite(float(L.importance_sampled_soft_value(samples, 0.0, 1e-3)[0]))


def test_a_terminal_state_of_only_illegal_actions_has_zero_gradient_not_nan():
  q_t = jnp.array([[1.0, 2.0], [-jnp.inf, -jnp.inf]])
  r, d = jnp.zeros(2), jnp.array([0.9, 0.0])
  for fn in (lambda q: L.soft_q_targets(r, d, q, alpha=1.0, stop_target_gradients=False),
             lambda q: L.soft_nstep_targets(r, d, q, alpha=1.0, n=1, stop_target_gradients=False)):  # fmt: skip
    np.testing.assert_array_equal(np.isfinite(fn(q_t)), True)
    grad = np.asarray(jax.grad(lambda q: fn(q).sum())(q_t))
    np.testing.assert_array_equal(grad[1], 0.0)  # terminal: not bootstrapped
    np.testing.assert_allclose(grad[0], 0.9 * jax.nn.softmax(q_t[0]), rtol=1e-6)


def test_soft_targets_refuse_a_discount_outside_the_unit_interval_at_real_steps():
  q_t, r = jnp.zeros((3, 2)), jnp.zeros(3)
  with pytest.raises(
      ValueError, match=r"`discount_t` must be in \[0, 1\].*got 1.5 at index \(1,\)"
  ):
    L.soft_q_targets(r, jnp.array([0.9, 1.5, 0.9]), q_t, alpha=1.0)
  # A masked step's discount is never used: anything goes there.
  mask = jnp.array([True, False, True])
  L.soft_q_targets(r, jnp.array([0.9, 7.0, 0.9]), q_t, alpha=1.0, mask=mask)


def test_static_counts_take_numpy_ints_and_sqil_rewards_a_float_dtype():
  r, d, q = jnp.zeros((4, 2)), jnp.full((4, 2), 0.9), jnp.zeros((4, 2, 3))
  np.testing.assert_array_equal(
      L.soft_nstep_targets(r, d, q, alpha=1.0, n=np.int64(2)),
      L.soft_nstep_targets(r, d, q, alpha=1.0, n=2),
  )
  with pytest.raises(ValueError, match=r"`n` must be an int >= 1, got True"):
    L.soft_nstep_targets(r, d, q, alpha=1.0, n=True)
  with pytest.raises(TypeError, match="`dtype` must be a floating-point dtype, got int32"):
    L.sqil_rewards(jnp.ones(3, bool), jnp.int32)


def test_an_alpha_that_is_zero_or_inf_in_the_inputs_dtype_is_refused():
  """alpha is cast to the inputs' dtype: 1e-8 rounds to 0 in float16 and 1e5 overflows to
  inf, which made NaN soft values, policies and targets ([nan inf] for the targets, where
  float32 gives [1.99 1.99]). A concrete one is refused, naming it, its value and the
  dtype; a traced one is not read; values float16 holds, and bfloat16, still work."""
  f16 = functools.partial(jnp.asarray, dtype=jnp.float16)
  q, r, d = f16(jnp.zeros((2, 3))), f16(jnp.ones(2)), f16(jnp.full(2, 0.99))
  a, q2 = jnp.zeros(2, jnp.int32), f16(jnp.ones((2, 3)))
  calls = _alpha_calls(q, q, q2, q2, r, d, a, f16(0.0))
  for name, fn in calls.items():
    with pytest.raises(ValueError, match=r"^alpha=1e-08 is 0 in float16"):
      fn(1e-8)
    with pytest.raises(ValueError, match=r"^alpha=100000.0 is inf in float16"):
      fn(np.float32(1e5))
    with pytest.raises(ValueError, match=r"^alpha=1e-08 at index \(1,\) is 0 in float16"):
      fn(np.array([1.0, 1e-8]))
    with pytest.raises(ValueError, match=r"^alpha=1e-08 is 0 in float16"):
      jax.jit(lambda: fn(1e-8))()  # closed over: concrete while tracing
    for alpha in (1e-4, 1e4):  # held by float16 (alpha log 3 too)
      assert np.isfinite(np.asarray(fn(alpha), np.float32)).all(), (name, alpha)
    assert np.isfinite(np.asarray(jax.jit(fn)(f16(1.0)), np.float32)).all(), name  # traced
  targets = L.soft_q_targets(*(x.astype(jnp.bfloat16) for x in (r, d, q2)), alpha=1e-8)
  np.testing.assert_allclose(np.asarray(targets, np.float32), 1.99, rtol=1e-2)
  with pytest.raises(ValueError, match=r"^alpha=1e-50 is 0 in float32.*\(pass a value in its "
                                       r"range, so that"):  # fmt: skip
    L.soft_value(jnp.zeros(3), 1e-50)
