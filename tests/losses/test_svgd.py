"""Tests for continuous soft Q-learning's losses: the importance-sampled soft value, the
RBF kernel and the Stein variational gradient (Haarnoja et al. 2017, eqs. 10 and 13).

Hand-computed cases and fixed-shape float64 loop references
(`offpolicy_ac.testing.reference`) run eagerly and jitted (chex variants); hypothesis draws
shapes and values for jitted reference comparisons; identities (the discrete soft value,
a constant Q under a uniform proposal, alpha -> 0, autodiff of the kernel) and an SVGD
run towards a Gaussian close the loop.
"""

import math

from absl.testing import parameterized
import chex
from hypothesis import example
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


# -----------------------------------------------------------------------------
# importance_sampled_soft_value
# -----------------------------------------------------------------------------


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


def test_importance_sampled_soft_value_per_state_and_traced_alpha():
  q = np.random.default_rng(3).normal(size=(2, 3, 4)).astype(np.float32)
  alpha = np.array([[0.5, 1.0, 2.0]], np.float32)  # per column, broadcast over the leading axis
  with pytest.raises(ValueError, match=r"`alpha` of shape \(3,\) must be a scalar or have"):
    L.importance_sampled_soft_value(q, 0.3, alpha[0])  # [3] would meet [2, 3]'s last axis
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
# box_mixture_log_density, sample_box_mixture: the soft value's mixture proposal
# -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "center, std", [(0.0, 0.3), (0.95, 0.1), (-0.7, 2.0), (1.0, 0.2), (0.4, 1e4), (-1.0, 1e-3)]
)
def test_box_mixture_density_integrates_to_one_over_the_box(center, std):
  grid = np.linspace(-1.0, 1.0, 200_001)
  log_q = L.box_mixture_log_density(
      jnp.asarray(grid[:, None], jnp.float32)[None], jnp.array([[center]], jnp.float32), std, 0.25
  )[0]
  integral = np.trapezoid(np.exp(np.asarray(log_q, np.float64)), grid)
  np.testing.assert_allclose(integral, 1.0, rtol=1e-4)


@FEW
@given(
    lead=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    m=st.integers(1, 6),
    d=st.integers(1, 4),
    std=st.floats(0.05, 3.0),
    f=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
@example(lead=(), m=1, d=3, std=0.0546875, f=0.0, seed=0)  # the density underflows float64
def test_box_mixture_log_density_matches_numpy_reference_random(lead, m, d, std, f, seed):
  rng = np.random.default_rng(seed)
  a = rng.uniform(-1.0, 1.0, lead + (m, d)).astype(np.float32)
  c = rng.uniform(-0.99, 0.99, lead + (d,)).astype(np.float32)
  got = jax.jit(L.box_mixture_log_density, static_argnums=(2, 3))(a, c, std, f)
  want = ref.box_mixture_log_density(a, c, std, f)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("std", [1e8, 1e30])
def test_a_proposal_far_wider_than_the_box_is_the_uniform_one(std):
  """Its truncated normal is flat on the box: log q' = -d log 2 (the normal's mass in the
  box, a difference of CDFs, rounded to 0 at std 1e8: log q' was +inf)."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.uniform(-1.0, 1.0, (4, 6, 3)), jnp.float32)
  c = jnp.asarray(rng.uniform(-1.0, 1.0, (4, 3)), jnp.float32).at[0].set(1.0)
  for f in (0.0, 0.5):
    log_q = L.box_mixture_log_density(a, c, std, f)
    np.testing.assert_allclose(log_q, -3 * np.log(2.0), rtol=1e-5)
  samples = L.sample_box_mixture(jax.random.PRNGKey(0), c, std, 2, 2)
  assert bool(jnp.all(jnp.isfinite(samples)) & jnp.all(jnp.abs(samples) <= 1.0))
  for bad in (float("inf"), float("nan")):
    with pytest.raises(ValueError, match="`std` must be > 0 and finite, got"):
      L.box_mixture_log_density(a, c, bad, 0.5)
    with pytest.raises(ValueError, match="`std` must be > 0 and finite, got"):
      L.sample_box_mixture(jax.random.PRNGKey(0), c, bad, 2, 2)


def test_sample_box_mixture_refuses_an_array_std_as_its_density_does():
  """std [3, 1] was spread over the samples instead of the batch: row 0 (std 1e-4) drew a
  sample 0.098 from its center 0 (and other shapes failed deep in JAX)."""
  center = jnp.zeros((3, 1))
  for std in (jnp.array([[1e-4], [1e-4], [0.5]]), jnp.full((1,), 0.3)):
    for call in (lambda: L.sample_box_mixture(jax.random.PRNGKey(0), center, std, 0, 3),
                 lambda: L.box_mixture_log_density(jnp.zeros((3, 2, 1)), center, std, 0.5)):  # fmt: skip
      with pytest.raises(ValueError, match=r"`std` must be a scalar \(one width for every"):
        call()


def test_sample_box_mixture_draws_uniform_then_truncated_normal_samples():
  center = jnp.array([[0.9, -0.3], [0.0, 0.5]])
  a = jax.jit(L.sample_box_mixture, static_argnums=(3, 4))(
      jax.random.PRNGKey(0), center, 0.1, 20_000, 20_000
  )
  assert a.shape == (2, 40_000, 2)
  assert bool(jnp.all(jnp.abs(a) <= 1.0))
  uniform, normal = np.asarray(a[:, :20_000]), np.asarray(a[:, 20_000:])
  np.testing.assert_allclose(uniform.mean(axis=1), 0.0, atol=0.02)
  np.testing.assert_allclose(uniform.var(axis=1), 1.0 / 3.0, atol=0.01)
  # Around the centre; at 0.9 the box cuts the normal at 1 sigma above the mean.
  np.testing.assert_allclose(normal[1].mean(axis=0), [0.0, 0.5], atol=0.005)
  np.testing.assert_allclose(normal[1].std(axis=0), [0.1, 0.1], rtol=0.03)
  assert normal[0, :, 0].max() <= 1.0 and normal[0, :, 0].mean() < 0.9


def test_box_mixture_refuses_actions_and_centres_outside_the_box():
  """Outside [-1, 1]^d the sampler would draw from the opposite face and the density
  would be the uniform one's: both are refused, for concrete values."""
  key, inside = jax.random.PRNGKey(0), jnp.zeros((2, 2))
  with pytest.raises(ValueError, match=r"`center` must be in \[-1, 1\] \(the box\), got 5.0"):
    L.sample_box_mixture(key, inside.at[1, 0].set(5.0), 0.3, 0, 3)
  with pytest.raises(ValueError, match=r"`actions` must be in \[-1, 1\] \(the box\), got -1.5"):
    L.box_mixture_log_density(jnp.full((2, 3, 2), -1.5), inside, 0.3, 0.5)
  with pytest.raises(ValueError, match=r"`center` must be in \[-1, 1\] \(the box\), got 1.0099"):
    L.box_mixture_log_density(jnp.zeros((2, 3, 2)), inside.at[0, 1].set(1.01), 0.3, 0.5)


def _soft_value_by_quadrature(q_fn, alpha, d):
  """alpha log of the integral of exp(Q / alpha) over [-1, 1]^d, d = 1 or 2, by a grid."""
  grid = np.linspace(-1.0, 1.0, 2001)
  points = grid[:, None] if d == 1 else np.stack(np.meshgrid(grid, grid), -1).reshape(-1, 2)
  z = q_fn(points) / alpha
  m = z.max()
  cell = (grid[1] - grid[0]) ** d
  return alpha * (m + math.log(np.exp(z - m).sum() * cell))


def test_mixture_proposal_estimates_a_peaked_soft_value_far_better_than_uniform():
  """exp(Q / alpha) concentrated near a* (as SQIL's Q at demonstrated actions): with 16
  samples the uniform proposal underestimates V; the mixture around a nearby centre is
  unbiased in exp and close."""
  d, alpha, peak = 2, 0.05, np.array([0.3, -0.6])
  q_np = lambda a: 10.0 - 40.0 * np.sum((a - peak) ** 2, -1)  # noqa: E731
  exact = _soft_value_by_quadrature(q_np, alpha, d)
  peak_j = jnp.asarray(peak, jnp.float32)
  q_j = lambda a: 10.0 - 40.0 * jnp.sum((a - peak_j[None, None]) ** 2, -1)  # noqa: E731
  keys = jax.random.split(jax.random.PRNGKey(0), 2000)
  center = jnp.broadcast_to(jnp.array([0.35, -0.55]), (2000, d))

  uniform = jax.vmap(lambda k: jax.random.uniform(k, (16, d), minval=-1.0, maxval=1.0))(keys)
  v_uniform = L.importance_sampled_soft_value(q_j(uniform), -d * math.log(2.0), alpha)
  mixture = jax.vmap(lambda k, c: L.sample_box_mixture(k, c, 0.1, 8, 8))(keys, center)
  log_q = L.box_mixture_log_density(mixture, center, 0.1, 0.5)
  v_mixture = L.importance_sampled_soft_value(q_j(mixture), log_q, alpha)

  err_uniform = np.median(np.abs(np.asarray(v_uniform) - exact))
  err_mixture = np.median(np.abs(np.asarray(v_mixture) - exact))
  # Measured: 0.05 and 2.0 (the peak's width is 0.025, the proposal's 0.1, off by 0.07).
  assert err_mixture < 0.1 and err_uniform > 1.0, (err_mixture, err_uniform)
  assert np.median(np.asarray(v_uniform)) < exact - 1.0  # the uniform estimate falls short
  # Unbiased in exp(V / alpha): the mean of exp((V - exact) / alpha) is about 1.
  ratio = np.mean(np.exp((np.asarray(v_mixture, np.float64) - exact) / alpha))
  np.testing.assert_allclose(ratio, 1.0, rtol=0.05)


@pytest.mark.parametrize(
    "args, name",
    [
        ((jnp.zeros(3), jnp.zeros(3), 0.1, 0.5), "actions"),
        ((jnp.zeros((2, 3)), jnp.zeros(2), 0.1, 0.5), "center"),
        ((jnp.zeros((2, 3)), jnp.zeros(3), 0.0, 0.5), "std"),
        ((jnp.zeros((2, 3)), jnp.zeros(3), jnp.full(3, 0.1), 0.5), "std"),  # one per dim
        ((jnp.zeros((2, 3)), jnp.zeros(3), 0.1, 1.5), "uniform_fraction"),
    ],
)
def test_box_mixture_log_density_rejects_bad_input(args, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    L.box_mixture_log_density(*args)


def test_box_mixture_log_density_takes_a_traced_std():
  """A swept or learned width: math.log of a tracer raised ConcretizationTypeError."""
  actions = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (5, 2)), jnp.float32)
  center = jnp.array([0.2, -0.4])
  traced = jax.jit(lambda std: L.box_mixture_log_density(actions, center, std, 0.5))
  for std in (0.05, 0.3, 2.0):
    np.testing.assert_allclose(
        traced(jnp.float32(std)), L.box_mixture_log_density(actions, center, std, 0.5),
        rtol=1e-6, atol=1e-6,
    )  # fmt: skip


def test_a_traced_uniform_fraction_is_refused_as_static():
  """The fraction picks the density's form (f = 0, f = 1, a mixture) while tracing: traced
  by `jit` or `vmap` it gave a bare TracerBoolConversionError."""
  actions = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (5, 2)), jnp.float32)
  density = lambda f: L.box_mixture_log_density(actions, jnp.zeros(2), 0.3, f)
  for traced, f in ((jax.jit(density), jnp.float32(0.5)), (jax.vmap(density), jnp.full(2, 0.5))):
    with pytest.raises(TypeError, match=r"`uniform_fraction` is static .*static argument"):
      traced(f)
  np.testing.assert_allclose(jax.jit(density, static_argnums=0)(0.5), density(0.5), rtol=1e-6)


@pytest.mark.parametrize(
    "args, name",
    [
        ((jnp.zeros(()), 0.1, 1, 1), "center"),
        ((jnp.zeros(3), 0.0, 1, 1), "std"),
        ((jnp.zeros(3), 0.1, -1, 1), "num_uniform"),
        ((jnp.zeros(3), 0.1, 1, 2.0), "num_normal"),
    ],
)
def test_sample_box_mixture_rejects_bad_input(args, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    L.sample_box_mixture(jax.random.PRNGKey(0), *args)


# -----------------------------------------------------------------------------
# rbf_kernel
# -----------------------------------------------------------------------------


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


class SvgdVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_importance_sampled_soft_value_hand_cases(self):
    fn = self.variant(L.importance_sampled_soft_value)
    q = jnp.array([[1.0, 2.0], [0.0, 0.0]])
    np.testing.assert_allclose(
        fn(q, 0.0, 1.0), [np.log((np.e + np.e**2) / 2), 0.0], rtol=1e-6, atol=1e-7
    )
    # q'(a) = 1/2 on both samples: V = alpha log mean(2 exp(q / alpha)).
    log_p = jnp.full((2, 2), -np.log(2.0))
    np.testing.assert_allclose(
        fn(q, log_p, 0.5), [0.5 * np.log(np.e**2 + np.e**4), 0.5 * np.log(2.0)], rtol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(scale=[1.0, 1e2, 1e4])
  def test_importance_sampled_soft_value_is_finite_for_extreme_inputs(self, scale):
    q = (scale * np.random.default_rng(2).uniform(-1, 1, size=(4, 8))).astype(np.float32)
    fn = self.variant(L.importance_sampled_soft_value)
    grad_fn = jax.jit(jax.grad(lambda q, a: jnp.sum(L.importance_sampled_soft_value(q, 0.0, a))))
    for alpha in (1e-4, 1e-2, 1.0, 100.0):
      v = fn(q, -1.0, alpha)
      assert np.all(np.isfinite(v))
      np.testing.assert_allclose(
          v, ref.importance_sampled_soft_value(q, -1.0, alpha), rtol=1e-5, atol=1e-6 * scale
      )
      # The gradient w.r.t. Q is the self-normalised importance weight of each sample.
      np.testing.assert_allclose(grad_fn(q, alpha), ref.softmax(q / alpha), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_box_mixture_log_density_hand_cases(self):
    a = jnp.array([[0.0]])
    density = self.variant(lambda a, c: L.box_mixture_log_density(a, c, 1.0, 0.0))(a, jnp.zeros(1))
    np.testing.assert_allclose(density, [math.log(0.3989423 / 0.6826895)], rtol=1e-5)
    # f = 1 is the uniform density 2^-d wherever the normal puts its mass.
    a = jnp.array([[0.9, -0.9, 0.0], [0.0, 0.0, 0.0]])
    uniform = L.box_mixture_log_density(a, jnp.full(3, 0.5), 0.01, 1.0)
    np.testing.assert_allclose(uniform, [-3 * math.log(2.0)] * 2, rtol=1e-6)
    # f = 1/2: log(1/2 * 1/2 + 1/2 * TN(0)).
    half = L.box_mixture_log_density(jnp.array([[0.0]]), jnp.zeros(1), 1.0, 0.5)
    np.testing.assert_allclose(half, [math.log(0.25 + 0.5 * 0.3989423 / 0.6826895)], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*[((), 3, 1, 0.5), ((2,), 5, 3, 0.0), ((2, 3), 4, 2, 0.75)])
  def test_box_mixture_log_density_matches_numpy_reference(self, lead, m, d, f):
    rng = np.random.default_rng(m * d)
    a = rng.uniform(-1.0, 1.0, lead + (m, d)).astype(np.float32)
    c = rng.uniform(-0.99, 0.99, lead + (d,)).astype(np.float32)
    got = self.variant(lambda a, c: L.box_mixture_log_density(a, c, 0.2, f))(a, c)
    want = ref.box_mixture_log_density(a, c, 0.2, f)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rbf_kernel_hand_cases(self):
    fn = self.variant(L.rbf_kernel)
    # K = M = 1, d = 1: h = 1 / log 2, so kappa = exp(-log 2) = 1/2, grad = -2 (1) log 2 / 2.
    out = fn(jnp.array([[1.0]]), jnp.array([[0.0]]))
    np.testing.assert_allclose(out.kappa, [[0.5]], rtol=1e-6)
    np.testing.assert_allclose(out.grad_x, [[[-np.log(2.0)]]], rtol=1e-6)
    # Coinciding particles: the bandwidth floor gives kappa = 1 and no gradient.
    out = fn(jnp.array([[0.3, -0.2]]), jnp.array([[0.3, -0.2]]))
    np.testing.assert_allclose(out.kappa, [[1.0]])
    np.testing.assert_array_equal(out.grad_x, np.zeros((1, 1, 2)))
    # A given bandwidth h = 1: kappa = exp(-|x - y|^2).
    out = self.variant(lambda x, y: L.rbf_kernel(x, y, 1.0))(
        jnp.array([[0.0], [1.0]]), jnp.array([[0.0]])
    )
    np.testing.assert_allclose(out.kappa, [[1.0], [np.exp(-1.0)]], rtol=1e-6)
    np.testing.assert_allclose(out.grad_x, [[[0.0]], [[-2 * np.exp(-1.0)]]], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rbf_kernel_matches_numpy_reference_fixed_shapes(self):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 5, 2)).astype(np.float32)
    y = rng.normal(size=(3, 4, 2)).astype(np.float32)
    for bandwidth in (None, 0.7, np.array([0.5, 1.0, 2.0], np.float32)):
      out = self.variant(lambda x, y: L.rbf_kernel(x, y, bandwidth))(x, y)
      kappa, grad = ref.rbf_kernel(x, y, bandwidth)
      assert out.kappa.shape == (3, 5, 4) and out.grad_x.shape == (3, 5, 4, 2)
      np.testing.assert_allclose(out.kappa, kappa, rtol=RTOL, atol=ATOL)
      np.testing.assert_allclose(out.grad_x, grad, rtol=RTOL, atol=ATOL)

  @chex.variants(with_jit=True, without_jit=True)
  def test_svgd_direction_hand_cases(self):
    fn = self.variant(L.svgd_direction)
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

  @chex.variants(with_jit=True, without_jit=True)
  def test_svgd_direction_matches_numpy_reference_fixed_shapes(self):
    rng = np.random.default_rng(6)
    fixed = rng.uniform(-1, 1, size=(4, 3, 8, 2)).astype(np.float32)
    grad_log_p = rng.normal(size=(4, 3, 8, 2)).astype(np.float32)
    updated = rng.uniform(-1, 1, size=(4, 3, 8, 2)).astype(np.float32)
    phi = self.variant(L.svgd_direction)(fixed, grad_log_p, updated)
    assert phi.shape == updated.shape
    np.testing.assert_allclose(
        phi, ref.svgd_direction(fixed, grad_log_p, updated), rtol=1e-4, atol=1e-5
    )


def test_an_rbf_bandwidth_of_another_rank_is_refused():
  x = jnp.zeros((3, 4, 2))  # [B, K, d]: a bandwidth per state is [3]; [4] would not fit
  L.rbf_kernel(x, x, bandwidth=jnp.ones(3))
  with pytest.raises(ValueError, match=r"`bandwidth` of shape \(1, 3\) must be a scalar or have"):
    L.rbf_kernel(x, x, bandwidth=jnp.ones((1, 3)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_box_mixture_samples_take_the_centre_dtype_and_numpy_counts(dtype):
  center = jnp.zeros((2, 3), dtype)
  samples = L.sample_box_mixture(jax.random.PRNGKey(0), center, 0.3, np.int64(2), 3)
  assert samples.shape == (2, 5, 3) and samples.dtype == dtype


def test_box_mixture_samples_stay_float32_with_a_numpy_float64_std_under_x64():
  """Contract 1: a NumPy float64 hyper-parameter leaves float32 outputs float32 (the std
  was used as given, and the samples came out float64)."""
  with jax.enable_x64(True):  # a context: x64 does not leak into the other tests
    center = jnp.zeros((4, 2), jnp.float32)
    samples = L.sample_box_mixture(jax.random.PRNGKey(0), center, np.float64(0.3), 2, 2)
  assert samples.dtype == jnp.float32


@pytest.mark.parametrize("bandwidth", [None, 1.0])
def test_an_empty_batch_of_particle_sets_gives_empty_kernels_and_directions(bandwidth):
  """Contract 1: B = 0 gives empty outputs, eagerly and under jit (the adaptive bandwidth
  reshaped the [0, K, M] distances with -1: ZeroDivisionError)."""
  x = jnp.zeros((0, 4, 2))
  for call in (lambda f, *a: f(*a), lambda f, *a: jax.jit(f)(*a)):
    kernel = call(lambda x: L.rbf_kernel(x, x, bandwidth), x)
    assert kernel.kappa.shape == (0, 4, 4) and kernel.grad_x.shape == (0, 4, 4, 2)
    assert call(lambda x: L.svgd_direction(x, x, x, bandwidth), x).shape == (0, 4, 2)


def test_box_mixture_density_in_bfloat16_and_empty_particle_axes_are_refused():
  actions = jax.random.uniform(jax.random.PRNGKey(0), (2, 5, 3), minval=-1.0, maxval=1.0)
  center = jnp.zeros((2, 3))
  full = L.box_mixture_log_density(actions, center, 0.3, 0.5)
  half = L.box_mixture_log_density(actions.astype(jnp.bfloat16), center.astype(jnp.bfloat16),
                                   0.3, 0.5)  # fmt: skip
  assert half.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(half, np.float32), full, rtol=2e-2, atol=2e-2)
  with pytest.raises(ValueError, match="`q_samples` has no samples"):
    L.importance_sampled_soft_value(jnp.zeros((2, 0)), 0.0, 1.0)
  with pytest.raises(ValueError, match="`fixed_actions` has no particles"):
    L.svgd_direction(jnp.zeros((0, 2)), jnp.zeros((0, 2)), jnp.zeros((3, 2)))
  with pytest.raises(ValueError, match="`q` has no actions"):
    L.soft_value(jnp.zeros((2, 0)), 1.0)
  with pytest.raises(ValueError, match="`adv_samples` has no samples"):
    L.sdn_q_value(jnp.zeros(2), jnp.zeros(2), jnp.zeros((2, 0)))


def test_a_bandwidth_or_std_that_is_zero_or_inf_in_the_inputs_dtype_is_refused():
  """They are cast to the inputs' dtype (the density to at least float32): a bandwidth of
  1e-8 is 0 in float16 (kappa = exp(-0 / 0) = NaN), a std of 1e-8 makes the sampler's
  bounds (-1 - mu) / 0 NaN at mu = -1, and one of 1e5 is inf (mu + inf x 0 = NaN)."""
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (4, 2)), jnp.float16)
  with pytest.raises(ValueError, match=r"^bandwidth=1e-08 is 0 in float16"):
    L.rbf_kernel(x, x, bandwidth=1e-8)
  assert np.isfinite(np.asarray(L.rbf_kernel(x, x, bandwidth=1e-4).kappa, np.float32)).all()
  c = jnp.full((1, 2), -1.0, jnp.float16)
  for std, becomes in ((1e-8, "0"), (1e5, "inf")):
    with pytest.raises(ValueError, match=rf"^std={std!r} is {becomes} in float16"):
      L.sample_box_mixture(jax.random.PRNGKey(0), c, std, 2, 2)
  with pytest.raises(ValueError, match=r"^std=1e-50 is 0 in float32"):
    L.box_mixture_log_density(x[None], c, 1e-50, 0.5)  # evaluated in float32
  assert np.isfinite(np.asarray(L.box_mixture_log_density(x[None], c, 1e-8, 0.5))).all()
