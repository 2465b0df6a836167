"""Tests for log-probabilities, importance ratios, entropies and KLs.

Hand cases, float64 NumPy / SciPy references on random inputs (random shapes
via hypothesis), and the numerical edge cases the log-space formulation
exists for: logits differing by 1e4, -inf logits (illegal actions), finite
gradients everywhere.

Forward values run both eagerly and jitted (chex variants: `self.variant` in
`DistributionsVariantsTest` and `BadInputTest`); gradients and the
hypothesis properties run jitted (eager dispatch would recompile each small op
per new shape for no extra coverage).
"""

from absl.testing import parameterized
import chex
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from offpolicy_ac import losses as L
from offpolicy_ac.testing import reference as ref

SHAPES = st.one_of(
    st.tuples(st.integers(1, 16)),
    st.tuples(st.integers(1, 16), st.integers(1, 4)),
    st.tuples(st.integers(1, 16), st.integers(1, 3), st.integers(1, 3)),
)
SEEDS = st.integers(0, 2**31 - 1)
FEW = settings(max_examples=6)
MAX_LOG32 = float(np.log(np.finfo(np.float32).max)) - 1.0


def _logits(rng, shape, n_actions, scale=2.0):
  return (scale * rng.normal(size=shape + (n_actions,))).astype(np.float32)


# -----------------------------------------------------------------------------
# categorical_log_prob
# -----------------------------------------------------------------------------


def test_nan_logits_give_nan_entropy_and_kl_not_zero():
  """-inf logits are impossible actions (0); NaN logits are a diverged policy: NaN."""
  nan = jnp.array([jnp.nan, jnp.nan])
  assert np.isnan(L.categorical_entropy(nan)) and np.isnan(jax.jit(L.categorical_entropy)(nan))
  assert np.isnan(L.categorical_kl(nan, jnp.zeros(2)))
  assert np.isnan(L.categorical_kl(jnp.zeros(2), nan))
  np.testing.assert_allclose(L.categorical_kl(jnp.array([0.0, -jnp.inf]), jnp.zeros(2)),
                             np.log(2.0), rtol=1e-6)  # fmt: skip


@FEW
@given(shape=SHAPES, seed=SEEDS, n_actions=st.integers(1, 5))
def test_categorical_log_prob_matches_numpy(shape, seed, n_actions):
  rng = np.random.default_rng(seed)
  logits = _logits(rng, shape, n_actions)
  actions = rng.integers(0, n_actions, size=shape).astype(np.int32)
  out = jax.jit(L.categorical_log_prob)(logits, actions)
  assert out.shape == shape
  expected = np.take_along_axis(ref.log_softmax(logits), actions[..., None], -1)[..., 0]
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


# -----------------------------------------------------------------------------
# Importance ratios
# -----------------------------------------------------------------------------


@FEW
@given(shape=SHAPES, seed=SEEDS, n_actions=st.integers(1, 5))
def test_categorical_importance_ratios_match_numpy(shape, seed, n_actions):
  rng = np.random.default_rng(seed)
  pi, mu = _logits(rng, shape, n_actions), _logits(rng, shape, n_actions)
  actions = rng.integers(0, n_actions, size=shape).astype(np.int32)
  out = jax.jit(L.categorical_importance_ratios)(pi, mu, actions)
  take = lambda lg: np.take_along_axis(ref.log_softmax(lg), actions[..., None], -1)[..., 0]
  log_rho = take(pi) - take(mu)
  assert out.rho.shape == shape and out.log_rho.shape == shape
  np.testing.assert_allclose(out.log_rho, log_rho, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out.rho, np.exp(log_rho), rtol=1e-4)


def test_importance_ratios_minus_inf_under_mu_only_is_finite():
  out = L.importance_ratios_from_log_probs(jnp.array([-0.5, 0.0]), jnp.array([-jnp.inf, -0.5]))
  assert np.all(np.isfinite(out.rho))
  np.testing.assert_allclose(out.log_rho, [MAX_LOG32, 0.5], rtol=1e-6)


def test_importance_ratio_gradients():
  rng = np.random.default_rng(0)
  pi, mu = _logits(rng, (8, 3), 3), _logits(rng, (8, 3), 3)
  actions = rng.integers(0, 3, size=(8, 3)).astype(np.int32)

  def total_rho(pi, mu, stop):
    return jnp.sum(L.categorical_importance_ratios(pi, mu, actions, stop_gradient=stop).rho)

  stopped = jax.jit(jax.grad(lambda p, m: total_rho(p, m, True), argnums=(0, 1)))(pi, mu)
  for g in stopped:
    np.testing.assert_array_equal(g, 0.0)
  g_pi, g_mu = jax.jit(jax.grad(lambda p, m: total_rho(p, m, False), argnums=(0, 1)))(pi, mu)
  # d rho / d logits_pi = rho (onehot(a) - softmax(pi)); for mu the negative.
  onehot = np.eye(3)[actions]
  rho = np.exp(
      np.take_along_axis(ref.log_softmax(pi) - ref.log_softmax(mu), actions[..., None], -1)
  )
  np.testing.assert_allclose(g_pi, rho * (onehot - ref.softmax(pi)), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_mu, -rho * (onehot - ref.softmax(mu)), rtol=1e-4, atol=1e-5)


@FEW
@given(shape=SHAPES, seed=SEEDS)
def test_importance_ratios_from_log_probs_match_numpy(shape, seed):
  rng = np.random.default_rng(seed)
  log_pi = rng.uniform(-5, 0, size=shape).astype(np.float32)
  log_mu = rng.uniform(-5, 0, size=shape).astype(np.float32)
  out = jax.jit(L.importance_ratios_from_log_probs)(log_pi, log_mu)
  np.testing.assert_allclose(out.log_rho, log_pi.astype(np.float64) - log_mu, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.rho, np.exp(log_pi.astype(np.float64) - log_mu), rtol=1e-5)


# -----------------------------------------------------------------------------
# Categorical entropy and KL
# -----------------------------------------------------------------------------


def test_categorical_entropy_gradient_finite_with_minus_inf():
  logits = jnp.array([[0.3, -jnp.inf, 1.0, -jnp.inf], [2.0, 0.0, -1.0, 0.5]])
  g = jax.jit(jax.grad(lambda lg: jnp.sum(L.categorical_entropy(lg))))(logits)
  assert np.all(np.isfinite(g))
  np.testing.assert_array_equal(np.asarray(g)[0, [1, 3]], 0.0)
  # dH/dlogits_j = -p_j (log p_j + H), checked on the finite entries.
  for row, grad in zip(np.asarray(logits), np.asarray(g)):
    keep = np.isfinite(row)
    p = ref.softmax(row[keep])
    h = -np.sum(p * np.log(p))
    np.testing.assert_allclose(grad[keep], -p * (np.log(p) + h), atol=1e-6)


@FEW
@given(shape=SHAPES, seed=SEEDS, n_actions=st.integers(1, 5))
def test_categorical_entropy_and_kl_match_numpy(shape, seed, n_actions):
  rng = np.random.default_rng(seed)
  p, q = _logits(rng, shape, n_actions), _logits(rng, shape, n_actions)
  p[rng.random(size=p.shape) < 0.2] = -np.inf  # some illegal actions ...
  p[..., 0] = np.where(np.all(np.isinf(p), -1), 0.0, p[..., 0])  # not all
  ent, kl, kl_self = jax.jit(
      lambda p, q: (L.categorical_entropy(p), L.categorical_kl(p, q), L.categorical_kl(p, p))
  )(p, q)
  assert ent.shape == shape and kl.shape == shape
  np.testing.assert_allclose(ent, ref.categorical_entropy(p), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(kl, ref.categorical_kl(p, q), rtol=1e-4, atol=1e-5)
  assert np.all(np.asarray(kl) >= -1e-6)
  np.testing.assert_allclose(kl_self, 0.0, atol=1e-6)
  assert np.all(np.asarray(ent) <= np.log(n_actions) + 1e-5)


# -----------------------------------------------------------------------------
# Gaussians
# -----------------------------------------------------------------------------


@FEW
@given(shape=SHAPES, seed=SEEDS, dim=st.integers(1, 4))
def test_gaussian_log_prob_and_entropy_match_scipy(shape, seed, dim):
  rng = np.random.default_rng(seed)
  mean = rng.normal(size=shape + (dim,)).astype(np.float32)
  log_std = rng.uniform(-2, 1, size=shape + (dim,)).astype(np.float32)
  actions = (mean + np.exp(log_std) * rng.normal(size=mean.shape)).astype(np.float32)
  log_prob, ent = jax.jit(lambda m, s, a: (L.gaussian_log_prob(m, s, a), L.gaussian_entropy(s)))(
      mean, log_std, actions
  )
  assert log_prob.shape == shape and ent.shape == shape
  np.testing.assert_allclose(
      log_prob,
      scipy.stats.norm.logpdf(actions, mean, np.exp(log_std)).sum(-1),
      rtol=1e-5,
      atol=1e-4,
  )
  np.testing.assert_allclose(
      ent, scipy.stats.norm.entropy(0.0, np.exp(log_std)).sum(-1), rtol=1e-5, atol=1e-5
  )


@FEW
@given(shape=SHAPES, seed=SEEDS, dim=st.integers(1, 4))
def test_gaussian_kl_matches_closed_form(shape, seed, dim):
  rng = np.random.default_rng(seed)
  args = [
      rng.normal(size=shape + (dim,)).astype(np.float32),
      rng.uniform(-1, 1, size=shape + (dim,)).astype(np.float32),
      rng.normal(size=shape + (dim,)).astype(np.float32),
      rng.uniform(-1, 1, size=shape + (dim,)).astype(np.float32),
  ]
  kl, kl_self = jax.jit(
      lambda mp, sp, mq, sq: (L.gaussian_kl(mp, sp, mq, sq), L.gaussian_kl(mp, sp, mp, sp))
  )(*args)
  assert kl.shape == shape
  np.testing.assert_allclose(kl, ref.gaussian_kl(*args), rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(kl) >= -1e-6)
  np.testing.assert_allclose(kl_self, 0.0, atol=1e-6)


def test_gaussian_kl_matches_monte_carlo():
  rng = np.random.default_rng(0)
  mp, sp = np.array([0.3, -1.0], np.float32), np.array([-0.2, 0.4], np.float32)
  mq, sq = np.array([-0.5, 0.0], np.float32), np.array([0.1, -0.3], np.float32)
  x = mp + np.exp(sp) * rng.normal(size=(400_000, 2))
  log_ratio = (
      scipy.stats.norm.logpdf(x, mp, np.exp(sp)) - scipy.stats.norm.logpdf(x, mq, np.exp(sq))
  ).sum(-1)
  mc, se = log_ratio.mean(), log_ratio.std() / np.sqrt(log_ratio.size)
  kl = float(L.gaussian_kl(mp, sp, mq, sq))
  assert abs(kl - mc) < 5 * se, (kl, mc, se)


# -----------------------------------------------------------------------------
# Bad input
# -----------------------------------------------------------------------------

_F = np.zeros((8, 3, 4), np.float32)
_A = np.zeros((8, 3), np.int32)

_BAD = [
    (L.categorical_log_prob, (_F.astype(np.int32), _A), TypeError, "logits"),
    (L.categorical_log_prob, (_F, _A.astype(np.float32)), TypeError, "actions"),
    (L.categorical_log_prob, (_F, _A[:, :2]), ValueError, "actions"),
    (
        L.categorical_log_prob,
        (np.zeros((), np.float32), np.zeros((), np.int32)),
        ValueError,
        "logits",
    ),
    (L.categorical_importance_ratios, (_F, _F[:, :2], _A), ValueError, "mu_logits"),
    (L.categorical_importance_ratios, (_F, _F, _A[:, :2]), ValueError, "actions"),
    (L.importance_ratios_from_log_probs, (_A, _A.astype(np.float32)), TypeError, "log_pi"),
    (L.importance_ratios_from_log_probs, (_A.astype(np.float32), _A), TypeError, "log_mu"),
    (
        L.importance_ratios_from_log_probs,
        (_A.astype(np.float32), _A[:, :2].astype(np.float32)),
        ValueError,
        "log_mu",
    ),
    (L.categorical_entropy, (_F.astype(np.int32),), TypeError, "logits"),
    (L.categorical_entropy, (np.zeros((), np.float32),), ValueError, "logits"),
    (L.categorical_kl, (_F, _F[:, :2]), ValueError, "q_logits"),
    (L.categorical_kl, (_F.astype(np.int32), _F.astype(np.int32)), TypeError, "p_logits"),
    (L.gaussian_log_prob, (_F.astype(np.int32), _F, _F), TypeError, "mean"),
    (L.gaussian_log_prob, (_F, _F, _F.astype(np.int32)), TypeError, "actions"),
    (L.gaussian_log_prob, (_F, _F, _F[:, :2]), ValueError, "actions"),
    (L.gaussian_log_prob, (_F, _F.astype(np.int32), _F), TypeError, "log_std"),
    (L.gaussian_log_prob, (_F, _F[:, :2], _F), ValueError, "log_std"),
    (L.gaussian_entropy, (_F.astype(np.int32),), TypeError, "log_std"),
    (L.gaussian_kl, (_F, _F, _F, _F[:, :2]), ValueError, "log_std_q"),
    # Same rank, broadcastable: must not silently return a [8, 3] result.
    (L.gaussian_kl, (_F[:, :1], _F[:, :1], _F[:, :1], _F), ValueError, "log_std_q"),
    (L.gaussian_kl, (_F, _F, _F[:, :2], _F), ValueError, "mean_q"),
    (L.gaussian_kl, (_F.astype(np.int32), _F, _F, _F), TypeError, "mean_p"),
]


class BadInputTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      (f"_{f.__name__}_{n}_{e.__name__}_{i}", f, args, e, n)
      for i, (f, args, e, n) in enumerate(_BAD)
  )
  def test_bad_input_names_the_argument(self, fn, args, exc, name):
    with pytest.raises(exc, match=f"`{name}`"):
      self.variant(fn)(*args)


def _on_policy_log_probs(n=4096, n_actions=6, seed=0):
  """log pi and log mu of the same policy computed two ways (logits shifted by a
  constant: the same distribution), as an actor and a learner do: equal up to ulps."""
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.normal(0, 3, (n, n_actions)), jnp.float32)
  actions = jnp.asarray(rng.integers(0, n_actions, n), jnp.int32)
  log_pi = L.categorical_log_prob(logits, actions)
  log_mu = L.categorical_log_prob(logits + 7.3, actions)
  return log_pi, log_mu


def test_on_policy_impala_loss_reports_no_clipped_ratios():
  log_pi, log_mu = _on_policy_log_probs(n=512)
  shape = log_pi.shape
  zeros, ones = jnp.zeros(shape), jnp.ones(shape)
  out = jax.jit(L.impala_loss)(zeros, zeros, ones, 0.9 * ones, log_pi, log_mu, zeros)
  assert float(out.clipped_rho_fraction) == 0.0
  np.testing.assert_allclose(float(out.mean_rho), 1.0, rtol=1e-6)


def test_exceeds_threshold_rejects_negative_rtol():
  with pytest.raises(ValueError, match="rtol"):
    L.exceeds_threshold(jnp.ones(3), 1.0, rtol=-1e-5)


class DistributionsVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_categorical_log_prob_hand_case(self):
    logits = jnp.array([[0.0, np.log(3.0)], [1.0, 1.0], [0.0, -jnp.inf]])
    actions = jnp.array([1, 0, 0])
    out = self.variant(L.categorical_log_prob)(logits, actions)
    np.testing.assert_allclose(out, np.log([0.75, 0.5, 1.0]), rtol=1e-6, atol=1e-7)
    out_inf = L.categorical_log_prob(logits[2:], jnp.array([1]))
    assert np.isneginf(out_inf[0])

  @chex.variants(with_jit=True, without_jit=True)
  def test_categorical_importance_ratios_hand_case(self):
    pi_logits = jnp.log(jnp.array([[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]]))
    mu_logits = jnp.log(jnp.array([[0.25, 0.25, 0.5], [0.2, 0.2, 0.6]]))
    actions = jnp.array([0, 2])
    out = self.variant(L.categorical_importance_ratios)(pi_logits, mu_logits, actions)
    assert isinstance(out, L.ImportanceRatios)
    np.testing.assert_allclose(out.rho, [2.0, 0.5], rtol=1e-5)
    np.testing.assert_allclose(out.log_rho, np.log([2.0, 0.5]), rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_importance_ratios_finite_for_logits_differing_by_1e4(self):
    pi = jnp.array([[0.0, 1e4], [1e4, 0.0], [0.0, 1e4], [5e3, -5e3]])
    mu = jnp.array([[1e4, 0.0], [0.0, 1e4], [0.0, 1e4], [-5e3, 5e3]])
    actions = jnp.array([1, 1, 1, 0])
    out = self.variant(L.categorical_importance_ratios)(pi, mu, actions)
    assert np.all(np.isfinite(out.rho)) and np.all(np.isfinite(out.log_rho))
    # True log-ratios: +1e4, -1e4, 0, +1e4: clamped to the finite range.
    np.testing.assert_allclose(out.log_rho, [MAX_LOG32, -MAX_LOG32, 0.0, MAX_LOG32], rtol=1e-6)
    np.testing.assert_allclose(
        out.rho, np.exp(np.asarray(out.log_rho, np.float64)), rtol=1e-5, atol=1e-37
    )  # subnormals may flush
    assert out.rho[0] > 1e37 and out.rho[1] < 1e-37 and out.rho[2] == 1.0
    # Products with clip thresholds stay finite.
    assert np.isfinite(np.float32(out.rho[0]) * np.float32(2.0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_importance_ratios_minus_inf_under_pi_gives_zero(self):
    pi = jnp.array([[0.0, -jnp.inf, 1.0], [0.0, -jnp.inf, 1.0]])
    mu = jnp.array([[0.0, 0.0, 0.0], [0.0, -jnp.inf, 1.0]])
    actions = jnp.array([1, 1])
    out = self.variant(L.categorical_importance_ratios)(pi, mu, actions)
    # Impossible under pi only: rho = 0; impossible under both: log_rho = 0.
    np.testing.assert_array_equal(out.rho, [0.0, 1.0])
    assert np.all(np.isfinite(out.log_rho)) and out.log_rho[1] == 0.0

    def total_rho(pi, mu):
      return jnp.sum(L.categorical_importance_ratios(pi, mu, actions, stop_gradient=False).rho)

    g_pi, g_mu = jax.jit(jax.grad(total_rho, argnums=(0, 1)))(pi, mu)
    finite = np.isfinite(np.asarray(pi))
    assert np.all(np.isfinite(np.asarray(g_pi)[finite]))
    assert np.all(np.isfinite(np.asarray(g_mu)[np.isfinite(np.asarray(mu))]))

  @chex.variants(with_jit=True, without_jit=True)
  def test_categorical_entropy_hand_cases(self):
    logits = jnp.array(
        [
            [0.0, 0.0, 0.0, 0.0],
            [0.0, -jnp.inf, 0.0, -jnp.inf],
            [100.0, 0.0, 0.0, 0.0],
            [np.log(0.5), np.log(0.25), np.log(0.25), -jnp.inf],
        ]
    )
    out = self.variant(L.categorical_entropy)(logits)
    np.testing.assert_allclose(
        out, [np.log(4), np.log(2), 0.0, 1.5 * np.log(2)], rtol=1e-5, atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_categorical_kl_hand_case(self):
    p = jnp.log(jnp.array([[0.5, 0.5], [1.0, 0.0]]))
    q = jnp.log(jnp.array([[0.25, 0.75], [0.5, 0.5]]))
    out = self.variant(L.categorical_kl)(p, q)
    np.testing.assert_allclose(
        out, [0.5 * np.log(2) + 0.5 * np.log(0.5 / 0.75), np.log(2)], rtol=1e-5
    )
    g = jax.jit(jax.grad(lambda p, q: jnp.sum(L.categorical_kl(p, q)), argnums=(0, 1)))(p, q)
    assert all(np.all(np.isfinite(np.asarray(x)[np.isfinite(np.asarray(p))])) for x in g)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gaussian_log_prob_broadcast_log_std(self):
    rng = np.random.default_rng(2)
    mean = rng.normal(size=(8, 3, 2)).astype(np.float32)
    actions = rng.normal(size=(8, 3, 2)).astype(np.float32)
    log_std = np.array([-0.5, 0.3], np.float32)
    out = self.variant(L.gaussian_log_prob)(mean, log_std, actions)
    full = self.variant(L.gaussian_log_prob)(mean, np.broadcast_to(log_std, mean.shape), actions)
    np.testing.assert_allclose(out, full, rtol=1e-6)
    np.testing.assert_allclose(
        out, scipy.stats.norm.logpdf(actions, mean, np.exp(log_std)).sum(-1), rtol=1e-5
    )
    # Gradients: d/dmean = (a - m) / s^2; d/dlog_std = z^2 - 1.
    g_mean, g_log_std = jax.jit(
        jax.grad(lambda m, s: jnp.sum(L.gaussian_log_prob(m, s, actions)), argnums=(0, 1))
    )(mean, log_std)
    var = np.exp(2.0 * log_std.astype(np.float64))
    np.testing.assert_allclose(g_mean, (actions - mean) / var, rtol=1e-5, atol=1e-5)
    z2 = (actions - mean.astype(np.float64)) ** 2 / var
    np.testing.assert_allclose(g_log_std, np.sum(z2 - 1.0, axis=(0, 1)), rtol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_exceeds_threshold_is_false_on_on_policy_ratios(self):
    log_pi, log_mu = _on_policy_log_probs()
    rho = L.importance_ratios_from_log_probs(log_pi, log_mu).rho
    assert float(jnp.max(jnp.abs(rho - 1.0))) < 1e-5
    # The float noise the tolerance is for: a plain comparison counts part of these.
    assert int(jnp.sum(rho > 1.0)) > 0
    assert not bool(jnp.any(self.variant(L.exceeds_threshold)(rho, 1.0)))

  @chex.variants(with_jit=True, without_jit=True)
  def test_exceeds_threshold_counts_ratios_clearly_above(self):
    rho = jnp.array([0.5, 1.0, 1.0 + 1e-7, 1.0 + 1e-4, 1.5, 2.0, 3.0], jnp.float32)
    np.testing.assert_array_equal(
        self.variant(L.exceeds_threshold)(rho, 1.0), [False, False, False, True, True, True, True]
    )
    np.testing.assert_array_equal(
        self.variant(L.exceeds_threshold)(rho, 2.0), [False] * 5 + [False, True]
    )
    # rtol=0 is the plain comparison.
    assert bool(L.exceeds_threshold(jnp.float32(1.0 + 1e-7), 1.0, rtol=0.0))
    log_pi = jnp.log(jnp.array([0.9, 0.5, 0.2, 0.2]))
    log_mu = jnp.log(jnp.array([0.3, 0.5, 0.2, 0.4]))  # rho = [3, 1, 1, 0.5]
    zeros, ones = jnp.zeros(4), jnp.ones(4)
    out = L.impala_loss(zeros, zeros, ones, 0.9 * ones, log_pi, log_mu, zeros)
    assert float(out.clipped_rho_fraction) == 0.25


def test_ratio_helpers_refuse_mixed_dtypes_and_thresholds_of_another_rank():
  x = jnp.zeros((3, 3))
  with pytest.raises(TypeError, match="`log_mu` must have the dtype of `log_pi`"):
    L.importance_ratios_from_log_probs(x, x.astype(jnp.bfloat16))
  with pytest.raises(ValueError, match=r"`threshold` of shape \(3,\) must be a scalar or have"):
    L.exceeds_threshold(jnp.ones((3, 3)), jnp.ones(3))  # [T] would meet the batch axis
  with pytest.raises(ValueError, match=r"`threshold` must be > 0"):
    L.exceeds_threshold(jnp.ones((3, 3)), -1.0)
  assert L.exceeds_threshold(jnp.ones((3, 3)), jnp.full((3, 1), 0.5)).all()


def test_exceeds_threshold_refuses_a_threshold_that_is_zero_in_the_ratios_dtype():
  # 1e-8 is 0 in float16: every positive ratio would count as clipped.
  rho = jnp.ones(3, jnp.float16)
  with pytest.raises(ValueError, match=r"^threshold=1e-08 is 0 in float16"):
    L.exceeds_threshold(rho, 1e-8)
  assert not bool(jnp.any(L.exceeds_threshold(rho, 1e5)))  # inf: nothing exceeds it
