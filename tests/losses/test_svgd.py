"""Tests for continuous soft Q-learning's losses: the importance-sampled soft value, the
RBF kernel and the Stein variational gradient (Haarnoja et al. 2017, eqs. 10 and 13).

Hand-computed cases and fixed-shape float64 loop references
(`offpolicy_ac.testing.reference`) run eagerly and jitted (`maybe_jit`); hypothesis draws
shapes and values for jitted reference comparisons; identities (the discrete soft value,
a constant Q under a uniform proposal, alpha -> 0, autodiff of the kernel) and an SVGD
run towards a Gaussian close the loop.
"""

import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import losses as L
from offpolicy_ac.testing import reference as ref
from offpolicy_ac.testing import strategies

RTOL, ATOL = 2e-5, 2e-5
FEW = settings(max_examples=6, deadline=None)


@pytest.fixture(params=[False, True], ids=["eager", "jit"], scope="module")
def maybe_jit(request):
  """Runs a test both eagerly and under `jax.jit`."""
  return jax.jit if request.param else (lambda f: f)


# -----------------------------------------------------------------------------
# importance_sampled_soft_value
# -----------------------------------------------------------------------------


def test_importance_sampled_soft_value_hand_cases(maybe_jit):
  fn = maybe_jit(L.importance_sampled_soft_value)
  q = jnp.array([[1.0, 2.0], [0.0, 0.0]])
  np.testing.assert_allclose(
      fn(q, 0.0, 1.0), [np.log((np.e + np.e**2) / 2), 0.0], rtol=1e-6, atol=1e-7
  )
  # q'(a) = 1/2 on both samples: V = alpha log mean(2 exp(q / alpha)).
  log_p = jnp.full((2, 2), -np.log(2.0))
  np.testing.assert_allclose(
      fn(q, log_p, 0.5), [0.5 * np.log(np.e**2 + np.e**4), 0.5 * np.log(2.0)], rtol=1e-6
  )


def test_importance_sampled_soft_value_of_a_discrete_uniform_proposal_is_the_soft_value():
  """Sampling each of M actions once with q' = 1/M sums over all of them: soft_value."""
  q = np.random.default_rng(0).normal(size=(4, 3, 5)).astype(np.float32)
  for alpha in (0.1, 1.0, 3.0):
    np.testing.assert_allclose(
        L.importance_sampled_soft_value(q, -np.log(5.0), alpha),
        L.soft_value(q, alpha),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("d", [1, 3])
def test_importance_sampled_soft_value_of_a_constant_q_under_a_uniform_proposal(d):
  """V = alpha log |A| + Q for Q constant and actions uniform in [-1, 1]^d (|A| = 2^d)."""
  q = jnp.full((3, 16), 0.7)
  for alpha in (0.01, 0.5, 2.0):
    v = L.importance_sampled_soft_value(q, -d * np.log(2.0), alpha)
    np.testing.assert_allclose(v, 0.7 + alpha * d * np.log(2.0), rtol=1e-5)


def test_importance_sampled_soft_value_tends_to_the_max_as_alpha_vanishes():
  rng = np.random.default_rng(1)
  q = rng.normal(size=(5, 16)).astype(np.float32)
  log_p = np.float32(-np.log(4.0))
  gaps = []
  for alpha in (1.0, 0.1, 1e-2, 1e-3, 1e-4):
    v = np.asarray(L.importance_sampled_soft_value(q, log_p, alpha), np.float64)
    # max Q - alpha (log M + log q') <= V <= max Q - alpha log q'.
    low = q.max(-1) - alpha * (np.log(16) + log_p)
    high = q.max(-1) - alpha * log_p
    assert np.all(v >= low - 1e-5) and np.all(v <= high + 1e-5)
    gaps.append(np.max(np.abs(v - q.max(-1))))
  assert gaps[-1] < 1e-3 and gaps == sorted(gaps, reverse=True)


@pytest.mark.parametrize("scale", [1.0, 1e2, 1e4])
def test_importance_sampled_soft_value_is_finite_for_extreme_inputs(maybe_jit, scale):
  q = (scale * np.random.default_rng(2).uniform(-1, 1, size=(4, 8))).astype(np.float32)
  fn = maybe_jit(L.importance_sampled_soft_value)
  grad_fn = jax.jit(jax.grad(lambda q, a: jnp.sum(L.importance_sampled_soft_value(q, 0.0, a))))
  for alpha in (1e-4, 1e-2, 1.0, 100.0):
    v = fn(q, -1.0, alpha)
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(
        v, ref.importance_sampled_soft_value(q, -1.0, alpha), rtol=1e-5, atol=1e-6 * scale
    )
    # The gradient w.r.t. Q is the self-normalised importance weight of each sample.
    np.testing.assert_allclose(grad_fn(q, alpha), ref.softmax(q / alpha), atol=1e-5)


def test_importance_sampled_soft_value_per_state_and_traced_alpha():
  q = np.random.default_rng(3).normal(size=(2, 3, 4)).astype(np.float32)
  alpha = np.array([0.5, 1.0, 2.0], np.float32)  # per column, broadcast over the leading axis
  np.testing.assert_allclose(
      L.importance_sampled_soft_value(q, 0.3, alpha),
      ref.importance_sampled_soft_value(q, 0.3, alpha),
      rtol=RTOL,
      atol=ATOL,
  )
  alphas = jnp.array([0.1, 1.0, 10.0])
  v = jax.jit(jax.vmap(lambda a: L.importance_sampled_soft_value(q, 0.3, a)))(alphas)
  for k, a in enumerate([0.1, 1.0, 10.0]):
    np.testing.assert_allclose(
        v[k], ref.importance_sampled_soft_value(q, 0.3, a), rtol=RTOL, atol=ATOL
    )


@FEW
@given(
    lead=strategies.batch_shapes(max_rank=3),
    m=st.integers(1, 20),
    alpha=st.floats(0.01, 10.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_importance_sampled_soft_value_matches_numpy_reference(lead, m, alpha, seed):
  rng = np.random.default_rng(seed)
  q = (5 * rng.normal(size=lead + (m,))).astype(np.float32)
  log_p = rng.normal(size=lead + (m,)).astype(np.float32)
  v = jax.jit(L.importance_sampled_soft_value)(q, log_p, alpha)
  assert v.shape == lead and v.dtype == jnp.float32
  np.testing.assert_allclose(
      v, ref.importance_sampled_soft_value(q, log_p, alpha), rtol=1e-5, atol=1e-4
  )


# -----------------------------------------------------------------------------
# rbf_kernel
# -----------------------------------------------------------------------------


def test_rbf_kernel_hand_cases(maybe_jit):
  fn = maybe_jit(L.rbf_kernel)
  # K = M = 1, d = 1: h = 1 / log 2, so kappa = exp(-log 2) = 1/2, grad = -2 (1) log 2 / 2.
  out = fn(jnp.array([[1.0]]), jnp.array([[0.0]]))
  np.testing.assert_allclose(out.kappa, [[0.5]], rtol=1e-6)
  np.testing.assert_allclose(out.grad_x, [[[-np.log(2.0)]]], rtol=1e-6)
  # Coinciding particles: the bandwidth floor gives kappa = 1 and no gradient.
  out = fn(jnp.array([[0.3, -0.2]]), jnp.array([[0.3, -0.2]]))
  np.testing.assert_allclose(out.kappa, [[1.0]])
  np.testing.assert_array_equal(out.grad_x, np.zeros((1, 1, 2)))
  # A given bandwidth h = 1: kappa = exp(-|x - y|^2).
  out = maybe_jit(lambda x, y: L.rbf_kernel(x, y, 1.0))(
      jnp.array([[0.0], [1.0]]), jnp.array([[0.0]])
  )
  np.testing.assert_allclose(out.kappa, [[1.0], [np.exp(-1.0)]], rtol=1e-6)
  np.testing.assert_allclose(out.grad_x, [[[0.0]], [[-2 * np.exp(-1.0)]]], rtol=1e-6)


def test_rbf_kernel_matches_numpy_reference_fixed_shapes(maybe_jit):
  rng = np.random.default_rng(4)
  x = rng.normal(size=(3, 5, 2)).astype(np.float32)
  y = rng.normal(size=(3, 4, 2)).astype(np.float32)
  for bandwidth in (None, 0.7, np.array([0.5, 1.0, 2.0], np.float32)):
    out = maybe_jit(lambda x, y: L.rbf_kernel(x, y, bandwidth))(x, y)
    kappa, grad = ref.rbf_kernel(x, y, bandwidth)
    assert out.kappa.shape == (3, 5, 4) and out.grad_x.shape == (3, 5, 4, 2)
    np.testing.assert_allclose(out.kappa, kappa, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.grad_x, grad, rtol=RTOL, atol=ATOL)


@FEW
@given(
    lead=strategies.batch_shapes(max_rank=2),
    k=st.integers(1, 8),
    m=st.integers(1, 8),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_rbf_kernel_matches_numpy_reference(lead, k, m, d, seed):
  rng = np.random.default_rng(seed)
  x = rng.uniform(-1, 1, size=lead + (k, d)).astype(np.float32)
  y = rng.uniform(-1, 1, size=lead + (m, d)).astype(np.float32)
  out = jax.jit(L.rbf_kernel)(x, y)
  kappa, grad = ref.rbf_kernel(x, y)
  np.testing.assert_allclose(out.kappa, kappa, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out.grad_x, grad, rtol=1e-4, atol=1e-4)


def test_rbf_kernel_gradient_is_autodiff_with_the_bandwidth_held_constant():
  """grad_x is d kappa / d x with the median bandwidth stop-gradiented."""
  rng = np.random.default_rng(5)
  x = rng.normal(size=(2, 4, 3)).astype(np.float32)
  y = rng.normal(size=(2, 6, 3)).astype(np.float32)
  w = rng.normal(size=(2, 4, 6)).astype(np.float32)
  out = L.rbf_kernel(x, y)
  auto = jax.jit(jax.grad(lambda x: jnp.sum(w * L.rbf_kernel(x, y).kappa)))(x)
  np.testing.assert_allclose(auto, np.sum(w[..., None] * out.grad_x, axis=-2), rtol=1e-4, atol=1e-5)


# -----------------------------------------------------------------------------
# svgd_direction
# -----------------------------------------------------------------------------


def test_svgd_direction_hand_cases(maybe_jit):
  fn = maybe_jit(L.svgd_direction)
  # K = M = 1, x = 1, y = 0: phi = kappa g + grad_x = g / 2 - log 2.
  phi = fn(jnp.array([[1.0]]), jnp.array([[3.0]]), jnp.array([[0.0]]))
  np.testing.assert_allclose(phi, [[1.5 - np.log(2.0)]], rtol=1e-6)
  # K = 2 at 0 and 2, M = 1 at 1 (d = 1): squared distances 1 and 1, h = 1 / log 3, both
  # kappa = 1/3; the repulsive terms +-2 log(3) / 3 cancel: phi = (1/3) (g_0 + g_1) / 2.
  phi = fn(jnp.array([[0.0], [2.0]]), jnp.array([[1.0], [3.0]]), jnp.array([[1.0]]))
  np.testing.assert_allclose(phi, [[2.0 / 3.0]], rtol=1e-6)
  # A single particle where p is flat (g = 0) is pushed away from the fixed one.
  phi = fn(jnp.array([[0.0]]), jnp.array([[0.0]]), jnp.array([[0.5]]))
  assert float(phi[0, 0]) > 0


def test_svgd_direction_matches_numpy_reference_fixed_shapes(maybe_jit):
  rng = np.random.default_rng(6)
  fixed = rng.uniform(-1, 1, size=(4, 3, 8, 2)).astype(np.float32)
  grad_log_p = rng.normal(size=(4, 3, 8, 2)).astype(np.float32)
  updated = rng.uniform(-1, 1, size=(4, 3, 8, 2)).astype(np.float32)
  phi = maybe_jit(L.svgd_direction)(fixed, grad_log_p, updated)
  assert phi.shape == updated.shape
  np.testing.assert_allclose(
      phi, ref.svgd_direction(fixed, grad_log_p, updated), rtol=1e-4, atol=1e-5
  )


@FEW
@given(
    lead=strategies.batch_shapes(max_rank=2),
    k=st.integers(1, 8),
    m=st.integers(1, 8),
    d=st.integers(1, 3),
    bandwidth=st.one_of(st.none(), st.floats(0.05, 5.0)),
    seed=st.integers(0, 2**31 - 1),
)
def test_svgd_direction_matches_numpy_reference(lead, k, m, d, bandwidth, seed):
  rng = np.random.default_rng(seed)
  fixed = rng.uniform(-1, 1, size=lead + (k, d)).astype(np.float32)
  grad_log_p = (3 * rng.normal(size=lead + (k, d))).astype(np.float32)
  updated = rng.uniform(-1, 1, size=lead + (m, d)).astype(np.float32)
  phi = jax.jit(lambda *a: L.svgd_direction(*a, bandwidth=bandwidth))(fixed, grad_log_p, updated)
  np.testing.assert_allclose(
      phi, ref.svgd_direction(fixed, grad_log_p, updated, bandwidth), rtol=1e-4, atol=1e-4
  )


def test_svgd_particles_move_to_a_gaussian_target():
  """SVGD steps a <- a + eps phi(a) with p = N(mu, sigma^2) carry 64 particles started
  far away to roughly the target's mean and spread (2-d, all particles fixed and updated)."""
  mu, sigma = np.array([[1.0, -0.5]], np.float32), 0.5
  a = jax.random.normal(jax.random.PRNGKey(0), (64, 2)) * 0.1 + 3.0

  @jax.jit
  def step(a, _):
    grad_log_p = -(a - mu) / sigma**2
    return a + 0.05 * L.svgd_direction(a, grad_log_p, a), None

  a, _ = jax.lax.scan(step, a, None, length=1000)
  np.testing.assert_allclose(np.mean(a, 0), mu[0], atol=0.05)
  std = np.std(np.asarray(a), 0)
  assert np.all((0.6 * sigma < std) & (std < 1.4 * sigma)), std


# -----------------------------------------------------------------------------
# Errors
# -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, name",
    [
        ((jnp.float32(1.0), 0.0, 1.0), "q_samples"),
        ((jnp.zeros((2, 3)), jnp.zeros((2, 4)), 1.0), "log_proposal"),
        ((jnp.zeros((2, 3)), jnp.zeros((2, 3, 1)), 1.0), "log_proposal"),
        ((jnp.zeros((2, 3)), 0.0, 0.0), "alpha"),
        ((jnp.zeros((2, 3)), 0.0, -1.0), "alpha"),
        ((jnp.zeros((2, 3)), 0.0, jnp.ones(3)), "alpha"),
    ],
)
def test_importance_sampled_soft_value_rejects_bad_input(args, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    L.importance_sampled_soft_value(*args)


@pytest.mark.parametrize(
    "fn, args, name",
    [
        (L.rbf_kernel, (jnp.zeros(3), jnp.zeros((2, 3))), "x"),
        (L.rbf_kernel, (jnp.zeros((2, 3)), jnp.zeros((2, 2))), "y"),
        (L.rbf_kernel, (jnp.zeros((4, 2, 3)), jnp.zeros((5, 2, 3))), "y"),
        (L.rbf_kernel, (jnp.zeros((2, 3)), jnp.zeros((2, 3)), 0.0), "bandwidth"),
        (L.rbf_kernel, (jnp.zeros((4, 2, 3)), jnp.zeros((4, 2, 3)), jnp.ones(3)), "bandwidth"),
        (L.svgd_direction, (jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(3)), "updated_actions"),
        (L.svgd_direction, (jnp.zeros((2, 3)), jnp.zeros((2, 2)), jnp.zeros((1, 3))), "grad_log_p"),
        (L.svgd_direction, (jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((1, 2))), "updated"),
    ],
)
def test_kernel_and_svgd_reject_bad_input(fn, args, name):
  with pytest.raises(ValueError, match=f"`{name}"):
    fn(*args)


def test_validation_skips_traced_hyper_parameters():
  q = jnp.zeros((2, 3))
  v = jax.jit(L.importance_sampled_soft_value)(q, 0.0, jnp.float32(2.0))
  np.testing.assert_allclose(v, 0.0, atol=1e-6)
  out = jax.jit(L.rbf_kernel)(jnp.zeros((2, 1)), jnp.ones((2, 1)), jnp.float32(1.0))
  np.testing.assert_allclose(out.kappa, math.exp(-1.0), rtol=1e-6)
