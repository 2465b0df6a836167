"""Tests for the IMPALA loss and its categorical / Gaussian wrappers.

Hand case; a float64 NumPy loop reference (`offpolicy_ac.testing.reference.impala_loss`, with its
own V-trace loop) on random inputs with terminations, truncations, masked
junctions and step weights; gradients against the closed forms
(d loss / d log_pi = -w pg / sum w, d loss / d v = -2 w_v w (vs - v) / sum w,
d loss / d H = -w_e w / sum w, nothing into targets); identities (pi = mu is
the on-policy advantage, splitting at junctions, [T] / [T, B] / vmap).

Forward values run eagerly and jitted (chex variants, `self.variant`) on fixed shapes;
gradients and the hypothesis properties run jitted.
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

RTOL, ATOL = 1e-4, 1e-4
SCALARS = ("loss", "policy_loss", "value_loss", "entropy", "mean_rho", "clipped_rho_fraction")
BATCH_STRAT = st.one_of(
    st.just(()), st.tuples(st.integers(1, 4)), st.tuples(st.integers(1, 3), st.integers(1, 3))
)
FEW = settings(max_examples=6)
DEFAULT_HP = dict(
    value_weight=0.5,
    entropy_weight=0.01,
    lambda_=1.0,
    clip_rho_threshold=1.0,
    clip_c_threshold=1.0,
    clip_pg_rho_threshold=1.0,
)


def _inputs(seed, t, batch=(), *, garble=True, weights=False):
  """Random IMPALA inputs with terminations / truncations / junctions."""
  rng = np.random.default_rng(seed)
  shape = (t,) + tuple(batch)
  discount, mask, _ = testing.random_layout(rng, t, batch, junction_discount=7.0, p_padding=0.2)
  log_mu = rng.uniform(-3.0, -0.1, size=shape)
  x = dict(
      v_tm1=rng.normal(size=shape),
      v_t=rng.normal(size=shape),
      r_t=rng.normal(size=shape),
      discount_t=discount,
      log_pi_tm1=log_mu + 0.7 * rng.normal(size=shape),
      log_mu_tm1=log_mu,
      entropy_tm1=rng.uniform(0.0, 2.0, size=shape),
  )
  if garble:
    for k in ("v_tm1", "v_t", "r_t", "entropy_tm1"):
      x[k] = testing.garble(rng, x[k], mask)
    for k in ("log_pi_tm1", "log_mu_tm1"):
      x[k] = testing.garble(rng, x[k], mask, scale=30.0)
  x = {k: v.astype(np.float32) for k, v in x.items()}
  x["mask"] = mask
  if weights:
    w = rng.uniform(0.0, 2.0, size=shape)
    w[rng.random(size=shape) < 0.2] = 0.0
    x["weights"] = w.astype(np.float32)
  else:
    x["weights"] = None
  return x


_POS = ("v_tm1", "v_t", "r_t", "discount_t", "log_pi_tm1", "log_mu_tm1", "entropy_tm1")


def _impala(x, hp, *, method="scan", surrogate_clip=None):
  """The loss with all hyper-parameters but the static `surrogate_clip` traced."""
  return L.impala_loss(
      *(x[k] for k in _POS),
      mask=x["mask"],
      weights=x["weights"],
      method=method,
      surrogate_clip=surrogate_clip,
      **hp,
  )


def _np_reference(x, hp, surrogate_clip=None):
  return ref.impala_loss(
      *(x[k] for k in _POS),
      mask=x["mask"],
      weights=x["weights"],
      value_weight=hp["value_weight"],
      entropy_weight=hp["entropy_weight"],
      lambda_=hp["lambda_"],
      clip_rho=hp["clip_rho_threshold"],
      clip_c=hp["clip_c_threshold"],
      clip_pg=hp["clip_pg_rho_threshold"],
      surrogate_clip=surrogate_clip,
  )


def _assert_matches(out, expected, rtol=RTOL, atol=ATOL):
  for k in SCALARS:
    np.testing.assert_allclose(getattr(out, k), expected[k], rtol=rtol, atol=atol, err_msg=k)
  np.testing.assert_allclose(out.pg_advantage, expected["pg_advantage"], rtol=rtol, atol=atol)
  np.testing.assert_allclose(out.vtrace_errors, expected["vtrace_errors"], rtol=rtol, atol=atol)


# -----------------------------------------------------------------------------
# Hand case
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# NumPy reference
# -----------------------------------------------------------------------------


@FEW
@given(
    t=st.integers(1, 16),
    batch=BATCH_STRAT,
    seed=st.integers(0, 2**31),
    weights=st.booleans(),
    lambda_=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    clip_rho=st.sampled_from([0.5, 1.0, 2.0]),
    clip_c=st.sampled_from([0.5, 1.0]),
    clip_pg=st.sampled_from([0.5, 1.0, 3.0]),
    surrogate_clip=st.sampled_from([None, 0.05, 0.2, 0.5]),
)
def test_impala_loss_matches_numpy_reference(
    t, batch, seed, weights, lambda_, clip_rho, clip_c, clip_pg, surrogate_clip
):
  x = _inputs(seed, t, batch, weights=weights)
  hp = dict(
      value_weight=0.7,
      entropy_weight=0.05,
      lambda_=lambda_,
      clip_rho_threshold=clip_rho,
      clip_c_threshold=clip_c,
      clip_pg_rho_threshold=clip_pg,
  )
  out = jax.jit(functools.partial(_impala, surrogate_clip=surrogate_clip))(x, hp)
  assert out.pg_advantage.shape == (t,) + batch
  assert out.loss.shape == ()
  _assert_matches(out, _np_reference(x, hp, surrogate_clip=surrogate_clip))


# -----------------------------------------------------------------------------
# Gradients
# -----------------------------------------------------------------------------


def _loss_grads(x, hp, surrogate_clip=None):
  def loss(v_tm1, v_t, r_t, discount_t, log_pi, log_mu, ent):
    y = dict(
        x,
        v_tm1=v_tm1,
        v_t=v_t,
        r_t=r_t,
        discount_t=discount_t,
        log_pi_tm1=log_pi,
        log_mu_tm1=log_mu,
        entropy_tm1=ent,
    )
    return _impala(y, hp, surrogate_clip=surrogate_clip).loss

  return jax.grad(loss, argnums=tuple(range(7)))(*(x[k] for k in _POS))


@pytest.mark.parametrize("weights", [False, True])
def test_impala_loss_gradients(weights):
  grad_fn = jax.jit(_loss_grads)
  for seed in range(3):
    x = _inputs(seed, 8, (3,), weights=weights)
    hp = dict(
        value_weight=0.7,
        entropy_weight=0.05,
        lambda_=0.9,
        clip_rho_threshold=1.0,
        clip_c_threshold=1.0,
        clip_pg_rho_threshold=1.0,
    )
    g = dict(zip(_POS, grad_fn(x, hp)))
    expected = _np_reference(x, hp)
    np.testing.assert_allclose(g["log_pi_tm1"], expected["grad_log_pi"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g["v_tm1"], expected["grad_v_tm1"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g["entropy_tm1"], expected["grad_entropy"], rtol=1e-5, atol=1e-7)
    # Targets, advantages and ratios are constants.
    for k in ("v_t", "r_t", "discount_t", "log_mu_tm1"):
      np.testing.assert_array_equal(g[k], 0.0, err_msg=k)
    for k in _POS:  # nothing flows from or into a masked step
      np.testing.assert_array_equal(np.asarray(g[k])[~x["mask"]], 0.0)


def test_impala_loss_finite_with_impossible_actions_at_ignored_steps():
  x = _inputs(4, 8, (3,), weights=True)
  x["log_pi_tm1"] = np.where(x["mask"], x["log_pi_tm1"], -np.inf).astype(np.float32)
  x["log_pi_tm1"][x["weights"] == 0] = -np.inf
  out = jax.jit(_impala)(x, DEFAULT_HP)
  assert all(np.isfinite(getattr(out, k)) for k in SCALARS)
  for g in jax.jit(_loss_grads)(x, DEFAULT_HP):
    assert np.all(np.isfinite(g))


# -----------------------------------------------------------------------------
# Identities
# -----------------------------------------------------------------------------


def test_on_policy_advantage_when_pi_equals_mu():
  # rho = 1, lambda = 1: vs is the n-step return bootstrapped where the
  # trace ends and pg_advantage = errors = G - V.
  for seed in range(3):
    x = _inputs(seed, 8, (3,))
    x["log_pi_tm1"] = x["log_mu_tm1"]
    # Consistent values: V(x_{s+1}) is the same number at s (as v_t) and at
    # s + 1 (as v_tm1) wherever step s + 1 is real.
    next_real = np.concatenate([x["mask"][1:], np.zeros((1, 3), bool)])
    x["v_t"][next_real] = x["v_tm1"][1:][next_real[:-1]]
    out = jax.jit(_impala)(x, dict(DEFAULT_HP, clip_pg_rho_threshold=2.0))
    m, r, d, v_t = x["mask"], x["r_t"], x["discount_t"], x["v_t"]
    g = np.zeros(r.shape)
    for j in range(r.shape[1]):
      for s in reversed(range(r.shape[0])):
        if m[s, j]:
          nxt = g[s + 1, j] if s + 1 < r.shape[0] and m[s + 1, j] else v_t[s, j]
          g[s, j] = r[s, j] + d[s, j] * nxt
    adv = np.where(m, g - x["v_tm1"], 0.0)
    np.testing.assert_allclose(out.pg_advantage, adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.vtrace_errors, adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.mean_rho, 1.0, rtol=1e-6)


def test_scan_and_associative_agree():
  for seed in range(3):
    x = _inputs(seed, 12, (2, 2), weights=True)
    hp = dict(DEFAULT_HP, lambda_=0.8)
    a = jax.jit(functools.partial(_impala, method="scan"))(x, hp)
    b = jax.jit(functools.partial(_impala, method="associative"))(x, hp)
    for k in a._fields:
      np.testing.assert_allclose(getattr(a, k), getattr(b, k), rtol=1e-5, atol=1e-5, err_msg=k)


def test_time_major_batch_and_vmap_agree():
  x = _inputs(8, 8, (3,), weights=True)
  hp = dict(DEFAULT_HP, lambda_=0.9)
  batched = jax.jit(_impala)(x, hp)
  vmapped = jax.jit(jax.vmap(_impala, in_axes=(1, None), out_axes=0))(x, hp)
  single_fn = jax.jit(_impala)
  w = np.where(x["mask"], x["weights"], 0.0)
  for j in range(3):
    col = {k: (None if v is None else v[:, j]) for k, v in x.items()}
    assert col["v_tm1"].shape == (8,)
    single = single_fn(col, hp)
    np.testing.assert_allclose(
        batched.pg_advantage[:, j], single.pg_advantage, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
        batched.vtrace_errors[:, j], single.vtrace_errors, rtol=1e-6, atol=1e-6
    )
    for k in single._fields:
      np.testing.assert_allclose(getattr(vmapped, k)[j], getattr(single, k), rtol=1e-6, atol=1e-6)
  # The [T, B] loss is the weight-averaged per-column loss.
  col_w = w.sum(0)
  for k in SCALARS:
    np.testing.assert_allclose(
        getattr(batched, k),
        np.sum(col_w * np.asarray(getattr(vmapped, k))) / col_w.sum(),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_splitting_at_junctions_changes_nothing(method):
  fn = jax.jit(functools.partial(_impala, method=method))
  hp = dict(DEFAULT_HP, lambda_=0.9, clip_rho_threshold=2.0)
  for lengths, lead in [([3, 4], False), ([3, 3], True)]:
    mask, slices = testing.junction_layout(lengths, lead)
    x = _inputs(3, mask.size, garble=False)
    x["mask"] = mask
    x["discount_t"] = np.full(mask.shape, 0.9, np.float32)
    for k in _POS:  # junction garbage
      x[k] = np.where(mask, x[k], 1e3 if k != "discount_t" else 5.0).astype(np.float32)
    joined = fn(x, hp)
    alone = [fn({k: (None if v is None else v[sl]) for k, v in x.items()}, hp) for sl in slices]
    for sl, out in zip(slices, alone):
      np.testing.assert_allclose(joined.pg_advantage[sl], out.pg_advantage, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(joined.vtrace_errors[sl], out.vtrace_errors, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(joined.pg_advantage)[~mask], 0.0)
    sizes = np.array([sl.stop - sl.start for sl in slices], np.float64)
    for k in SCALARS:
      per_episode = np.array([getattr(out, k) for out in alone])
      np.testing.assert_allclose(
          getattr(joined, k),
          np.sum(sizes * per_episode) / sizes.sum(),
          rtol=1e-5,
          atol=1e-6,
          err_msg=k,
      )


# -----------------------------------------------------------------------------
# The clipped surrogate policy term (surrogate_clip)
# -----------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [False, True])
def test_impala_loss_surrogate_gradients(weights):
  hp = dict(DEFAULT_HP, lambda_=0.9, value_weight=0.7, entropy_weight=0.05)
  for seed in range(3):
    x = _inputs(seed, 8, (3,), weights=weights)
    g = dict(zip(_POS, jax.jit(functools.partial(_loss_grads, surrogate_clip=0.2))(x, hp)))
    expected = _np_reference(x, hp, surrogate_clip=0.2)
    # Some steps are clipped (gradient 0) and some are not.
    real = np.where(x["mask"], 1.0 if x["weights"] is None else x["weights"], 0.0) > 0
    assert 0 < np.sum(expected["grad_log_pi"][real] == 0.0) < real.sum()
    np.testing.assert_allclose(g["log_pi_tm1"], expected["grad_log_pi"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g["v_tm1"], expected["grad_v_tm1"], rtol=1e-4, atol=1e-6)
    for k in ("v_t", "r_t", "discount_t", "log_mu_tm1"):
      np.testing.assert_array_equal(g[k], 0.0, err_msg=k)
    for k in _POS:
      np.testing.assert_array_equal(np.asarray(g[k])[~x["mask"]], 0.0)


def test_impala_loss_surrogate_is_the_vtrace_policy_gradient_on_policy():
  # At pi = mu every ratio is 1, inside any clip range: the surrogate's gradient is
  # A grad log pi, V-trace's policy gradient with rho-bar_pg >= 1; the losses differ.
  hp = dict(DEFAULT_HP, lambda_=0.9)
  for seed in range(3):
    x = _inputs(seed, 8, (3,), weights=True)
    x["log_pi_tm1"] = x["log_mu_tm1"]
    plain = jax.jit(_loss_grads)(x, hp)
    clipped = jax.jit(functools.partial(_loss_grads, surrogate_clip=0.2))(x, hp)
    for k, a, b in zip(_POS, plain, clipped):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=k)
    a = jax.jit(_impala)(x, hp)
    b = jax.jit(functools.partial(_impala, surrogate_clip=0.2))(x, hp)
    for k in ("value_loss", "entropy", "mean_rho", "pg_advantage", "vtrace_errors"):
      np.testing.assert_allclose(getattr(a, k), getattr(b, k), rtol=1e-6, err_msg=k)


def test_impala_loss_surrogate_finite_with_impossible_actions_at_ignored_steps():
  x = _inputs(4, 8, (3,), weights=True)
  x["log_pi_tm1"] = np.where(x["mask"], x["log_pi_tm1"], -np.inf).astype(np.float32)
  x["log_mu_tm1"] = np.where(x["mask"], x["log_mu_tm1"], -np.inf).astype(np.float32)
  x["log_pi_tm1"][x["weights"] == 0] = -np.inf
  fn = functools.partial(_impala, surrogate_clip=0.2)
  out = jax.jit(fn)(x, DEFAULT_HP)
  assert all(np.isfinite(getattr(out, k)) for k in SCALARS)
  for g in jax.jit(functools.partial(_loss_grads, surrogate_clip=0.2))(x, DEFAULT_HP):
    assert np.all(np.isfinite(g))


# -----------------------------------------------------------------------------
# Categorical and Gaussian wrappers
# -----------------------------------------------------------------------------


def _categorical_inputs(seed, shape=(8, 3), n_actions=4):
  rng = np.random.default_rng(seed)
  x = _inputs(seed, shape[0], shape[1:], weights=True)
  logits = rng.normal(size=shape + (n_actions,)).astype(np.float32)
  mu_logits = (logits + 0.5 * rng.normal(size=logits.shape)).astype(np.float32)
  logits[..., -1] = -np.inf  # an illegal action, never taken
  actions = rng.integers(0, n_actions - 1, size=shape).astype(np.int32)
  return x, logits, mu_logits, actions


def _categorical_loss(logits, mu_logits, actions, x, hp):
  return L.impala_loss_categorical(
      logits,
      mu_logits,
      actions,
      x["v_tm1"],
      x["v_t"],
      x["r_t"],
      x["discount_t"],
      mask=x["mask"],
      weights=x["weights"],
      **hp,
  )


def test_impala_loss_categorical_gradient_wrt_logits():
  x, logits, mu_logits, actions = _categorical_inputs(1)
  hp = dict(DEFAULT_HP, entropy_weight=0.3)
  g = jax.jit(jax.grad(lambda lg: _categorical_loss(lg, mu_logits, actions, x, hp).loss))(logits)
  assert np.all(np.isfinite(g))
  take = lambda lg: np.take_along_axis(ref.log_softmax(lg), actions[..., None], -1)[..., 0]
  expected = _np_reference(
      dict(
          x,
          log_pi_tm1=take(logits),
          log_mu_tm1=take(mu_logits),
          entropy_tm1=ref.categorical_entropy(logits),
      ),
      hp,
  )
  p = ref.softmax(logits)
  log_p = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
  h = ref.categorical_entropy(logits)[..., None]
  d_log_pi = np.eye(4)[actions] - p  # d log pi(a) / d logits
  d_entropy = -p * (log_p + h)  # d H / d logits
  np.testing.assert_allclose(
      g,
      expected["grad_log_pi"][..., None] * d_log_pi
      + expected["grad_entropy"][..., None] * d_entropy,
      rtol=1e-4,
      atol=1e-6,
  )
  np.testing.assert_array_equal(np.asarray(g)[..., -1], 0.0)


# -----------------------------------------------------------------------------
# step_weights / weighted_mean
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# Bad input
# -----------------------------------------------------------------------------

_GOOD = {k: np.zeros((8, 3), np.float32) for k in _POS}
_SHORT = np.zeros((8, 2), np.float32)
_INT = np.zeros((8, 3), np.int32)

_BAD = [
    # (array overrides, keyword overrides, exception, name)
    (dict(v_tm1=_INT), {}, TypeError, "v_tm1"),
    (dict(v_t=_SHORT), {}, ValueError, "v_t"),
    (dict(r_t=_INT), {}, TypeError, "r_t"),
    (dict(discount_t=_SHORT), {}, ValueError, "discount_t"),
    (dict(log_pi_tm1=_SHORT), {}, ValueError, "log_pi_tm1"),
    (dict(log_pi_tm1=_INT), {}, TypeError, "log_pi_tm1"),
    (dict(log_mu_tm1=_SHORT), {}, ValueError, "log_mu_tm1"),
    (dict(entropy_tm1=_INT), {}, TypeError, "entropy_tm1"),
    (dict(entropy_tm1=np.zeros((8,), np.float32)), {}, ValueError, "entropy_tm1"),
    ({}, dict(mask=np.ones((8, 3), np.float32)), TypeError, "mask"),
    ({}, dict(mask=np.ones((8, 2), bool)), ValueError, "mask"),
    ({}, dict(weights=_SHORT), ValueError, "weights"),
    ({}, dict(weights=_INT), TypeError, "weights"),
    ({}, dict(value_weight=-0.1), ValueError, "value_weight"),
    ({}, dict(entropy_weight=-1.0), ValueError, "entropy_weight"),
    # A weight of inf made the loss inf or NaN.
    ({}, dict(value_weight=np.inf), ValueError, "value_weight"),
    ({}, dict(entropy_weight=np.inf), ValueError, "entropy_weight"),
    # A per-step weight made the "scalar" loss a [T, B] array.
    ({}, dict(value_weight=np.ones((8, 3), np.float32)), ValueError, "value_weight"),
    ({}, dict(entropy_weight=np.full((1, 3), 0.01, np.float32)), ValueError, "entropy_weight"),
    ({}, dict(lambda_=1.01), ValueError, "lambda_"),
    ({}, dict(lambda_=-0.5), ValueError, "lambda_"),
    ({}, dict(clip_rho_threshold=0.0), ValueError, "clip_rho_threshold"),
    ({}, dict(clip_c_threshold=-1.0), ValueError, "clip_c_threshold"),
    ({}, dict(clip_pg_rho_threshold=0.0), ValueError, "clip_pg_rho_threshold"),
    ({}, dict(method="reverse"), ValueError, "method"),
    ({}, dict(surrogate_clip=0.0), ValueError, "surrogate_clip"),
    ({}, dict(surrogate_clip=1.0), ValueError, "surrogate_clip"),
    ({}, dict(surrogate_clip=-0.2), ValueError, "surrogate_clip"),
]


class ImpalaVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_hand_case(self):
    half = np.log(0.5)
    out = self.variant(L.impala_loss)(
        jnp.array([1.0, 2.0]),
        jnp.array([2.0, 3.0]),
        jnp.array([1.0, 1.0]),
        jnp.array([0.5, 0.5]),
        jnp.array([half, half]),
        jnp.array([half, half]),
        jnp.array([0.6, 0.4]),
    )
    # rho = 1: err_1 = 1 + 1.5 - 2 = 0.5; err_0 = (1 + 1 - 1) + 0.5 * 0.5 = 1.25
    # q_0 = 1 + 0.5 * vs_1 = 2.25, q_1 = 1 + 0.5 * 3 = 2.5: pg = [1.25, 0.5].
    np.testing.assert_allclose(out.vtrace_errors, [1.25, 0.5], rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantage, [1.25, 0.5], rtol=1e-6)
    np.testing.assert_allclose(out.policy_loss, 0.875 * np.log(2), rtol=1e-6)
    np.testing.assert_allclose(out.value_loss, (1.25**2 + 0.5**2) / 2, rtol=1e-6)
    np.testing.assert_allclose(out.entropy, 0.5, rtol=1e-6)
    np.testing.assert_allclose(out.loss, 0.875 * np.log(2) + 0.5 * 0.90625 - 0.01 * 0.5, rtol=1e-6)
    np.testing.assert_allclose(out.mean_rho, 1.0, rtol=1e-6)
    np.testing.assert_allclose(out.clipped_rho_fraction, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_hand_case_with_mask_and_weights(self):
    v_tm1, v_t = jnp.array([1.0, 9.0, 0.0]), jnp.array([2.0, 9.0, 1.0])
    r, d = jnp.array([1.0, 9.0, 0.5]), jnp.array([0.5, 9.0, 1.0])
    log_pi = jnp.log(jnp.array([0.5, 0.9, 0.2]))
    log_mu = jnp.log(jnp.array([0.25, 0.1, 0.4]))  # rho = [2, (9), 0.5]
    ent = jnp.array([1.0, 9.0, 2.0])
    mask = jnp.array([True, False, True])
    weights = jnp.array([1.0, 5.0, 3.0])
    out = self.variant(
        lambda *a: L.impala_loss(
            *a,
            mask=mask,
            weights=weights,
            value_weight=1.0,
            entropy_weight=0.1,
            clip_rho_threshold=1.5,
            clip_pg_rho_threshold=0.9,
        )
    )(v_tm1, v_t, r, d, log_pi, log_mu, ent)
    err = [1.5 * (1 + 0.5 * 2 - 1), 0.0, 0.5 * (0.5 + 1.0 * 1 - 0)]
    pg = [0.9 * (2.0 - 1.0), 0.0, 0.5 * (1.5 - 0.0)]
    np.testing.assert_allclose(out.vtrace_errors, err, rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantage, pg, rtol=1e-6)
    w = np.array([1.0, 0.0, 3.0])
    policy = np.sum(w * -np.array(pg) * np.log([0.5, 0.9, 0.2])) / 4
    value = np.sum(w * np.square(err)) / 4
    entropy = (1.0 + 6.0) / 4
    np.testing.assert_allclose(out.policy_loss, policy, rtol=1e-6)
    np.testing.assert_allclose(out.value_loss, value, rtol=1e-6)
    np.testing.assert_allclose(out.entropy, entropy, rtol=1e-6)
    np.testing.assert_allclose(out.loss, policy + value - 0.1 * entropy, rtol=1e-6)
    np.testing.assert_allclose(out.mean_rho, (2.0 + 1.5) / 4, rtol=1e-6)
    np.testing.assert_allclose(out.clipped_rho_fraction, 0.25, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=["scan", "associative"])
  def test_impala_loss_matches_numpy_reference_fixed_shapes(self, method):
    fn = self.variant(functools.partial(_impala, method=method))
    for i, shape in enumerate([(8, 3)]):  # other shapes: hypothesis, jitted
      for weights in [False, True]:
        x = _inputs(10 * i + weights, shape[0], shape[1:], weights=weights)
        hp = dict(DEFAULT_HP, lambda_=0.9, clip_pg_rho_threshold=2.0)
        _assert_matches(fn(x, hp), _np_reference(x, hp))

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_all_masked_is_zero_and_finite(self):
    x = _inputs(5, 8, (3,))
    x["mask"] = np.zeros_like(x["mask"])
    out = self.variant(_impala)(x, DEFAULT_HP)
    for k in SCALARS:
      assert getattr(out, k) == 0.0, k
    np.testing.assert_array_equal(out.pg_advantage, 0.0)
    for g in jax.jit(_loss_grads)(x, DEFAULT_HP):
      np.testing.assert_array_equal(g, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_clipped_surrogate_hand_case(self):
    log_mu = jnp.log(jnp.array([0.2, 0.4, 0.5, 0.6]))
    log_pi = jnp.log(jnp.array([0.3, 0.2, 0.55, 0.3]))
    adv = jnp.array([2.0, 2.0, -1.0, -3.0])
    fn = self.variant(lambda lp: L.clipped_surrogate(lp, log_mu, adv, 0.2))
    # A > 0, r above 1.2: capped at 1.2 A. A > 0, r below 0.8: r A (the min).
    # r inside the range: r A. A < 0, r below 0.8: capped at 0.8 A.
    np.testing.assert_allclose(fn(log_pi), [2.4, 1.0, -1.1, -2.4], rtol=1e-6)
    grad = jax.grad(lambda lp: jnp.sum(fn(lp)))(log_pi)
    # d(r A)/d log pi = r A where the unclipped branch is the min, 0 where the cap holds.
    np.testing.assert_allclose(grad, [0.0, 1.0, -1.1, 0.0], rtol=1e-6)
    # The advantage is a constant: no gradient reaches a critic that computed it.
    surrogate = self.variant(lambda adv: L.clipped_surrogate(log_pi, log_mu, adv, 0.2))
    np.testing.assert_array_equal(jax.grad(lambda a: jnp.sum(surrogate(a)))(adv), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_surrogate_hand_case(self):
    out = self.variant(functools.partial(L.impala_loss, surrogate_clip=0.2))(
        jnp.array([1.0, 2.0]),
        jnp.array([2.0, 3.0]),
        jnp.array([1.0, 1.0]),
        jnp.array([0.5, 0.5]),
        jnp.log(jnp.array([0.6, 0.2])),
        jnp.log(jnp.array([0.4, 0.4])),
        jnp.array([0.6, 0.4]),
    )
    np.testing.assert_allclose(out.vtrace_errors, [1.125, 0.25], rtol=1e-6)
    np.testing.assert_allclose(out.policy_loss, -(1.2 * 1.125 + 0.25) / 2, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(epsilon=[0.1, 0.3])
  def test_impala_loss_surrogate_matches_numpy_reference_eager_and_jitted(self, epsilon):
    x = _inputs(21, 8, (3,), weights=True)
    hp = dict(DEFAULT_HP, lambda_=0.9)
    out = self.variant(functools.partial(_impala, surrogate_clip=epsilon))(x, hp)
    _assert_matches(out, _np_reference(x, hp, surrogate_clip=epsilon))

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_categorical_is_impala_loss_of_the_helpers(self):
    x, logits, mu_logits, actions = _categorical_inputs(0)
    hp = dict(DEFAULT_HP, lambda_=0.9)
    out = self.variant(_categorical_loss)(logits, mu_logits, actions, x, hp)
    y = dict(
        x,
        log_pi_tm1=L.categorical_log_prob(logits, actions),
        log_mu_tm1=L.categorical_log_prob(mu_logits, actions),
        entropy_tm1=L.categorical_entropy(logits),
    )
    expected = self.variant(_impala)(y, hp)
    for k in out._fields:
      np.testing.assert_allclose(
          getattr(out, k), getattr(expected, k), rtol=1e-6, atol=1e-6, err_msg=k
      )
    take = lambda lg: np.take_along_axis(ref.log_softmax(lg), actions[..., None], -1)[..., 0]
    y = dict(
        x,
        log_pi_tm1=take(logits),
        log_mu_tm1=take(mu_logits),
        entropy_tm1=ref.categorical_entropy(logits),
    )
    _assert_matches(out, _np_reference(y, hp))

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_gaussian_is_impala_loss_of_the_helpers(self):
    rng = np.random.default_rng(2)
    x = _inputs(2, 8, (3,), weights=True)
    mean = rng.normal(size=(8, 3, 2)).astype(np.float32)
    log_std = np.array([-0.3, 0.2], np.float32)
    actions = (mean + rng.normal(size=mean.shape)).astype(np.float32)
    log_mu = rng.uniform(-4, -1, size=(8, 3)).astype(np.float32)
    hp = dict(DEFAULT_HP, lambda_=0.9)

    def gaussian_loss(mean, log_std):
      return L.impala_loss_gaussian(
          mean,
          log_std,
          log_mu,
          actions,
          x["v_tm1"],
          x["v_t"],
          x["r_t"],
          x["discount_t"],
          mask=x["mask"],
          weights=x["weights"],
          **hp,
      )

    out = self.variant(gaussian_loss)(mean, log_std)
    full = self.variant(gaussian_loss)(mean, np.broadcast_to(log_std, mean.shape))
    y = dict(
        x,
        log_pi_tm1=L.gaussian_log_prob(mean, log_std, actions),
        log_mu_tm1=log_mu,
        entropy_tm1=L.gaussian_entropy(np.broadcast_to(log_std, mean.shape)),
    )
    expected = self.variant(_impala)(y, hp)
    for k in out._fields:
      np.testing.assert_allclose(
          getattr(out, k), getattr(expected, k), rtol=1e-6, atol=1e-6, err_msg=k
      )
      np.testing.assert_allclose(
          getattr(full, k), getattr(expected, k), rtol=1e-6, atol=1e-6, err_msg=k
      )
    # d loss / d mean = grad_log_pi * (a - m) / sigma^2.
    g_mean = jax.jit(jax.grad(lambda m: gaussian_loss(m, log_std).loss))(mean)
    np_ref = _np_reference(
        dict(y, log_pi_tm1=np.asarray(y["log_pi_tm1"]), entropy_tm1=np.asarray(y["entropy_tm1"])),
        hp,
    )
    np.testing.assert_allclose(
        g_mean,
        np_ref["grad_log_pi"][..., None]
        * (actions - mean)
        / np.exp(2.0 * log_std.astype(np.float64)),
        rtol=1e-4,
        atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_step_weights_and_weighted_mean(self):
    mask = np.array([[True, False], [True, True]])
    w = np.array([[2.0, 3.0], [0.5, 0.0]], np.float32)
    np.testing.assert_array_equal(L.step_weights((2, 2), None, None, jnp.float32), np.ones((2, 2)))
    np.testing.assert_array_equal(
        L.step_weights((2, 2), mask, None, jnp.float32), mask.astype(float)
    )
    sw = L.step_weights((2, 2), mask, w, jnp.float32)
    np.testing.assert_array_equal(sw, [[2.0, 0.0], [0.5, 0.0]])
    assert sw.dtype == jnp.float32
    x = np.array([[1.0, 100.0], [4.0, 7.0]], np.float32)
    np.testing.assert_allclose(self.variant(L.weighted_mean)(x, sw), (2.0 + 2.0) / 2.5, rtol=1e-6)
    assert self.variant(L.weighted_mean)(x, np.zeros_like(x)) == 0.0
    with pytest.raises(TypeError, match="`weights`"):
      L.step_weights((2, 2), mask, w.astype(np.int32), jnp.float32)
    with pytest.raises(ValueError, match="`weights`"):
      L.step_weights((2, 2), mask, w[:1], jnp.float32)
    with pytest.raises(TypeError, match="`mask`"):
      L.step_weights((2, 2), w, None, jnp.float32)


class ImpalaBadInputTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*_BAD)
  def test_impala_loss_bad_input(self, arrays, kwargs, exc, name):
    args = dict(_GOOD, **arrays)
    kw = dict(kwargs)
    mask, weights = kw.pop("mask", None), kw.pop("weights", None)
    fn = lambda args, mask, weights: L.impala_loss(
        *(args[k] for k in _POS), mask=mask, weights=weights, **kw
    )
    with pytest.raises(exc, match=f"`{name}`"):
      self.variant(fn)(args, mask, weights)

  @chex.variants(with_jit=True, without_jit=True)
  def test_impala_loss_categorical_bad_input(self):
    wrap = self.variant
    logits = np.zeros((8, 3, 4), np.float32)
    v = np.zeros((8, 3), np.float32)
    a = np.zeros((8, 3), np.int32)
    with pytest.raises(ValueError, match="`mu_logits_tm1`"):
      wrap(L.impala_loss_categorical)(logits, logits[:, :2], a, v, v, v, v)
    # The errors name the caller's argument, `a_tm1` (before: `actions`, the helper's).
    with pytest.raises(TypeError, match="`a_tm1`"):
      wrap(L.impala_loss_categorical)(logits, logits, v, v, v, v, v)
    with pytest.raises(ValueError, match="`a_tm1`"):
      wrap(L.impala_loss_categorical)(logits, logits, a[:, :2], v, v, v, v)
    with pytest.raises(ValueError, match="`clip_rho_threshold`"):
      wrap(functools.partial(L.impala_loss_categorical, clip_rho_threshold=0.0))(
          logits, logits, a, v, v, v, v
      )


@pytest.mark.parametrize("jit", [False, True])
def test_a_nan_at_a_masked_step_does_not_reach_the_loss(jit):
  """Masked steps are left out of the mean, not multiplied by 0 (0 x NaN is NaN), eagerly
  and jitted alike, with and without step weights."""
  z, r, d = jnp.zeros((3, 1)), jnp.ones((3, 1)), jnp.full((3, 1), 0.9)
  mask = jnp.array([[True], [False], [True]])
  entropy = jnp.ones((3, 1)).at[1].set(jnp.nan)
  loss = jax.jit(L.impala_loss) if jit else L.impala_loss
  plain = loss(z, z, r, d, z, z, entropy, mask=mask).loss
  weighted = loss(z, z, r, d, z, z, entropy, mask=mask, weights=jnp.ones((3, 1))).loss
  clean = loss(z, z, r, d, z, z, jnp.ones((3, 1)), mask=mask).loss
  assert np.isfinite(plain) and plain == weighted == clean
  assert np.isnan(L.weighted_mean(entropy, jnp.ones((3, 1))))  # a real step's NaN stays


def test_surrogate_clip_can_be_traced():
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  logits, mu_logits = jax.random.normal(k1, (5, 3, 4)), jax.random.normal(k2, (5, 3, 4))
  a, v, d = jnp.zeros((5, 3), jnp.int32), jnp.ones((5, 3)), jnp.full((5, 3), 0.9)
  loss = lambda eps: L.impala_loss_categorical(logits, mu_logits, a, v, v, v, d,
                                               surrogate_clip=eps).loss  # fmt: skip
  np.testing.assert_allclose(jax.jit(loss)(0.2), loss(0.2), rtol=1e-5)
  with pytest.raises(ValueError, match="an epsilon in"):
    loss(1.5)


def test_the_categorical_loss_names_an_input_without_the_logits_batch_shape():
  logits = jnp.zeros((5, 3, 4))
  a, v = jnp.zeros((5, 3), jnp.int32), jnp.ones((5, 3))
  with pytest.raises(ValueError, match=r"`r_t` must have shape \(5, 3\) \(matching `a_tm1`"):
    L.impala_loss_categorical(logits, logits, a, v, v, jnp.ones((5, 3, 1)), v)


def test_a_per_step_lambda_must_broadcast_to_the_inputs():
  v = jnp.ones((5, 3))
  with pytest.raises(ValueError, match=r"`lambda_` of shape \(5,\) must be a scalar or have"):
    L.vtrace(v, v, v, v, v, lambda_=jnp.full((5,), 0.9))
  per_step = L.vtrace(v, v, v, v, v, lambda_=jnp.full((5, 1), 0.9)).errors
  np.testing.assert_allclose(per_step, L.vtrace(v, v, v, v, v, lambda_=0.9).errors)


@pytest.mark.parametrize("name", ["lambda_", "clip_rho_threshold", "clip_c_threshold",
                                  "clip_pg_rho_threshold"])  # fmt: skip
def test_a_per_step_hyper_parameter_of_rank_one_is_refused_when_t_equals_b(name):
  # [T] against [T, B] with T == B would broadcast over the batch columns, silently.
  v = jnp.ones((3, 3))
  with pytest.raises(ValueError, match=rf"`{name}` of shape \(3,\) must be a scalar or have"):
    L.vtrace(v, v, v, v, v, **{name: jnp.array([1.0, 1.0, 0.5])})
  with pytest.raises(ValueError, match=rf"`{name}`.*broadcast to their shape \(4, 3\)"):
    L.vtrace(*[jnp.ones((4, 3))] * 5, **{name: jnp.ones((4,))})


def test_array_clip_thresholds_take_the_inputs_dtype():
  v = [jnp.ones((3, 2), jnp.bfloat16)] * 5
  for name in ["clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold"]:
    out = L.vtrace(*v, **{name: jnp.float32(2.0)})
    assert [x.dtype for x in out] == [jnp.bfloat16] * 3, name


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_the_categorical_loss_runs_in_half_precision_near_float32(dtype):
  rng = np.random.default_rng(0)
  T, B, A = 6, 3, 4
  logits, mu_logits = rng.normal(size=(2, T, B, A))
  a = rng.integers(0, A, (T, B))
  v_tm1, v_t, r = rng.normal(size=(3, T, B))
  d = np.full((T, B), 0.9)
  args32 = [jnp.asarray(x, jnp.float32) for x in (logits, mu_logits)]
  rest32 = [jnp.asarray(x, jnp.float32) for x in (v_tm1, v_t, r, d)]
  full = L.impala_loss_categorical(*args32, jnp.asarray(a), *rest32)
  half = L.impala_loss_categorical(*[x.astype(dtype) for x in args32], jnp.asarray(a),
                                   *[x.astype(dtype) for x in rest32])  # fmt: skip
  assert half.loss.dtype == dtype
  np.testing.assert_allclose(float(half.loss), float(full.loss), rtol=0.05, atol=0.02)
  np.testing.assert_allclose(float(half.mean_rho), float(full.mean_rho), rtol=0.05)


def test_mean_rho_stays_finite_when_every_ratio_is_at_the_clamp():
  # Ratios near the dtype's maximum: their sum overflows, their weighted mean does not.
  T, B = 8, 4
  logits = jnp.zeros((T, B, 2)).at[..., 0].set(1e4)
  mu_logits = jnp.zeros((T, B, 2)).at[..., 1].set(1e4)
  v = jnp.zeros((T, B))
  out = L.impala_loss_categorical(logits, mu_logits, jnp.zeros((T, B), jnp.int32), v, v, v,
                                  jnp.full((T, B), 0.9))  # fmt: skip
  assert np.isfinite(float(out.loss)) and np.isfinite(float(out.mean_rho))
  assert float(out.mean_rho) > 1e37


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_weighted_mean_of_many_half_precision_values(dtype):
  # 70,000 weights sum past float16's 65,504: the sums are taken in float32.
  n = 70_000
  got = L.weighted_mean(jnp.full((n,), 2.0, dtype), jnp.ones((n,), dtype))
  assert got.dtype == dtype and float(got) == 2.0
  grad = jax.grad(lambda x: L.weighted_mean(x, jnp.ones((n,), dtype)).astype(jnp.float32))(
      jnp.full((n,), 2.0, dtype)
  )
  np.testing.assert_allclose(np.asarray(grad, np.float32), 1.0 / n, rtol=1e-2)


def test_an_action_the_learner_gives_probability_zero_leaves_the_loss_finite():
  T, B, A = 4, 3, 3
  logits = jnp.zeros((T, B, A)).at[0, 0, 0].set(-jnp.inf)
  a, v = jnp.zeros((T, B), jnp.int32), jnp.ones((T, B))
  mu_logits = jnp.full((T, B, A), 0.1)
  out = L.impala_loss_categorical(logits, mu_logits, a, v, v, v, 0.9 * v)
  assert np.isfinite(float(out.loss)) and np.isfinite(float(out.policy_loss))
  grad = jax.grad(lambda lg: L.impala_loss_categorical(lg, mu_logits, a, v, v, v, 0.9 * v).loss)
  assert np.isfinite(np.asarray(grad(logits))).all()


@pytest.mark.parametrize("surrogate_clip", [None, 0.2])
def test_an_action_both_policies_give_probability_zero_adds_nothing(surrogate_clip):
  """rho = 1 there (both log-probabilities -inf), so the V-trace policy term was
  -A x log pi = inf; the surrogate's was finite."""
  v, log_mu = jnp.ones((4, 2)), jnp.full((4, 2), -0.7)
  log_pi = jnp.full((4, 2), -0.5)
  impossible = dict(
      log_pi_tm1=log_pi.at[1, 0].set(-jnp.inf), log_mu_tm1=log_mu.at[1, 0].set(-jnp.inf)
  )
  kwargs = dict(
      v_tm1=v, v_t=v, r_t=v, discount_t=0.9 * v, entropy_tm1=v, surrogate_clip=surrogate_clip
  )
  out = L.impala_loss(**impossible, **kwargs)
  weights = jnp.ones((4, 2)).at[1, 0].set(0.0)
  without = L.impala_loss(log_pi_tm1=log_pi, log_mu_tm1=log_mu, weights=weights, **kwargs)
  assert np.isfinite(float(out.loss))
  if surrogate_clip is None:  # (the surrogate's term there is -A, with no gradient)
    # The policy loss sums over the other steps (its mean is over all 8: 8/7 of theirs).
    np.testing.assert_allclose(out.policy_loss * 8, without.policy_loss * 7, rtol=1e-5)
  grad = jax.grad(
      lambda lp: L.impala_loss(log_pi_tm1=lp, log_mu_tm1=impossible["log_mu_tm1"], **kwargs).loss
  )(impossible["log_pi_tm1"])
  assert np.isfinite(grad).all() and grad[1, 0] == 0


@pytest.mark.parametrize("name", ["log_pi_tm1", "log_mu_tm1"])
def test_a_nan_log_probability_is_named(name):
  """Refused as "`rho_tm1` must be >= 0 ... got nan", a ratio the caller never passed."""
  x = jnp.ones((3, 2))
  args = dict(
      v_tm1=x, v_t=x, r_t=x, discount_t=0.9 * x, log_pi_tm1=-x, log_mu_tm1=-x, entropy_tm1=x
  )
  with pytest.raises(
      ValueError, match=rf"`{name}` must be a number, not NaN, got nan at index \(2, 1\)"
  ):
    L.impala_loss(**dict(args, **{name: (-x).at[2, 1].set(jnp.nan)}))
  # A masked step's log-probabilities may hold anything.
  L.impala_loss(**dict(args, **{name: (-x).at[2, 1].set(jnp.nan)}), mask=x.at[2, 1].set(0) > 0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_the_gaussian_loss_runs_in_half_precision(dtype):
  x, y = jnp.zeros((4, 2, 3), dtype), jnp.zeros((4, 2), dtype)
  assert L.gaussian_log_prob(x, x, x).dtype == dtype and L.gaussian_entropy(x).dtype == dtype
  out = L.impala_loss_gaussian(x, x[0, 0], y, x, y, y, y, y + 0.9)
  assert out.loss.dtype == dtype and np.isfinite(float(out.loss))
  with pytest.raises(TypeError, match="`log_pi_tm1` must have the dtype of `v_tm1`"):
    L.impala_loss(y, y, y, y, y.astype(jnp.float32), y, y)


def test_a_float16_value_loss_is_finite_where_one_squared_error_is_not():
  # 300^2 = 90,000 is past float16's maximum; the mean over 8 steps (11,250) is not.
  v = jnp.zeros((4, 2), jnp.float16)
  r = v.at[-1, 0].set(300.0)  # the only error: no discount carries it to earlier steps
  logits = jnp.zeros((4, 2, 2), jnp.float16)
  half = L.impala_loss_categorical(logits, logits, jnp.zeros((4, 2), jnp.int32), v, v, r, v)
  full = L.impala_loss_categorical(*(x.astype(jnp.float32) for x in (logits, logits)),
                                   jnp.zeros((4, 2), jnp.int32),
                                   *(x.astype(jnp.float32) for x in (v, v, r, v)))  # fmt: skip
  assert float(full.value_loss) == 11_250.0
  assert half.value_loss.dtype == jnp.float16
  np.testing.assert_allclose(float(half.value_loss), float(full.value_loss), rtol=1e-3)


def test_clipped_surrogate_checks_its_shapes_and_epsilon():
  z = jnp.zeros((3, 3))
  with pytest.raises(ValueError, match=r"`advantage` must have shape \(3, 3\)"):
    L.clipped_surrogate(z, z, jnp.arange(3.0), 0.2)  # [T] would meet the batch axis
  with pytest.raises(ValueError, match=r"`epsilon` must be a number in \(0, 1\), got 1.5"):
    L.clipped_surrogate(z, z + 1, jnp.ones_like(z), 1.5)
  # Not a number: a str (a TypeError comparing it), an array (float() of it), a bool.
  for bad in ("0.2", np.array([0.2]), True, None):
    with pytest.raises(ValueError, match=r"`epsilon` must be a number in \(0, 1\), got"):
      L.clipped_surrogate(z, z + 1, jnp.ones_like(z), bad)
    if bad is not None:
      with pytest.raises(ValueError, match=r"`surrogate_clip` must be None or a number, got"):
        L.check_surrogate_clip(bad)
  L.clipped_surrogate(z, z + 1, jnp.ones_like(z), np.float32(0.2))  # a 0-d number is one
  L.check_surrogate_clip(np.asarray(0.2))


def test_eager_estimators_refuse_bad_values_at_real_steps_only():
  v = jnp.zeros((3, 2))
  d = jnp.full((3, 2), 0.9)
  with pytest.raises(
      ValueError, match=r"`discount_t` must be in \[0, 1\].*got 1.5 at index \(1, 0\)"
  ):
    L.vtrace(v, v, v, d.at[1, 0].set(1.5), jnp.ones((3, 2)))
  with pytest.raises(ValueError, match=r"`discount_t` must be in \[0, 1\].*got nan"):
    L.retrace_targets(jnp.zeros((3, 2, 2)), jnp.zeros((3, 2), jnp.int32), v,
                      d.at[2, 1].set(jnp.nan), jnp.full((3, 2, 2), 0.5), jnp.full((3, 2), 0.5))  # fmt: skip
  with pytest.raises(ValueError, match=r"`rho_tm1` must be >= 0 \(importance ratios\)"):
    L.vtrace(v, v, v, d, jnp.ones((3, 2)).at[0, 1].set(-1.0))
  with pytest.raises(ValueError, match=r"`c_t` must be >= 0 \(trace coefficients\)"):
    L.general_off_policy_returns(v, v, v, d, jnp.ones((3, 2)).at[0, 0].set(-0.5))
  with pytest.raises(ValueError, match=r"`weights` must be >= 0, got -1.0 at index \(2, 1\)"):
    L.impala_loss(v, v, v, d, v, v, v, weights=jnp.ones((3, 2)).at[2, 1].set(-1.0))
  # Masked steps may hold anything (the testing kit's garbage); under jit nothing is read.
  mask = jnp.ones((3, 2), bool).at[1, 0].set(False)
  L.vtrace(v, v, v, d.at[1, 0].set(7.0), jnp.ones((3, 2)).at[1, 0].set(-3.0), mask=mask)
  jax.jit(L.vtrace)(v, v, v, d.at[1, 0].set(1.5), jnp.ones((3, 2)))


def test_the_gaussian_loss_names_its_own_arguments():
  # The checks of gaussian_log_prob named its arguments (`actions`, `log_std`).
  x, y = jnp.zeros((4, 2, 3)), jnp.zeros((4, 2))
  with pytest.raises(TypeError, match="`a_tm1` must have a floating"):
    L.impala_loss_gaussian(x, x, y, x.astype(jnp.int32), y, y, y, y)
  with pytest.raises(TypeError, match="`log_std_tm1` must have a floating"):
    L.impala_loss_gaussian(x, x.astype(jnp.int32), y, x, y, y, y, y)
  with pytest.raises(ValueError, match=r"`log_std_tm1` must have shape \(4, 2, 3\) or \(3,\)"):
    L.impala_loss_gaussian(x, x[0], y, x, y, y, y, y)


@pytest.mark.parametrize("which", ["categorical", "gaussian"])
def test_a_wrapper_names_itself_for_a_keyword_impala_loss_does_not_take(which):
  """Python's own error named impala_loss, which the user never called."""
  t, b, a = 3, 2, 2
  zeros = lambda *shape: jnp.zeros(shape)  # noqa: E731
  values = (zeros(t, b), zeros(t, b), zeros(t, b), zeros(t, b))
  if which == "categorical":
    call = functools.partial(L.impala_loss_categorical, zeros(t, b, a), zeros(t, b, a),
                             jnp.zeros((t, b), jnp.int32), *values)  # fmt: skip
  else:
    call = functools.partial(L.impala_loss_gaussian, zeros(t, b, a), zeros(t, b, a),
                             zeros(t, b), zeros(t, b, a), *values)  # fmt: skip
  refusal = rf"^impala_loss_{which}\(\) got an unexpected keyword argument 'gamma'; its "
  refusal += "keywords are those of impala_loss: mask, weights,"
  with pytest.raises(TypeError, match=refusal):
    call(gamma=0.9)
  assert np.isfinite(call(entropy_weight=0.1, lambda_=0.9).loss)


@pytest.mark.parametrize("odd", ["r_t", "log_pi_tm1", "entropy_tm1"])
def test_a_mis_shaped_per_step_input_is_the_one_named(odd):
  """The per-step inputs were checked against `r_t`'s shape: a mis-shaped `r_t` was
  reported as `log_pi_tm1` of the wrong shape."""
  args = dict.fromkeys(["v_tm1", "v_t", "r_t", "log_pi_tm1", "log_mu_tm1", "entropy_tm1"],
                       jnp.zeros((5, 3)))  # fmt: skip
  args[odd] = jnp.zeros((4, 3))
  with pytest.raises(ValueError, match=rf"^`{odd}` must have shape \(5, 3\)"):
    L.impala_loss(discount_t=jnp.ones((5, 3)), **args)


def test_numpy_float64_hyper_parameters_keep_float32_losses_float32_under_x64():
  """Under `jax_enable_x64` a NumPy float64 weight, threshold or epsilon made the float32
  losses float64 (`vtrace` already cast its hyper-parameters to the inputs' dtype)."""
  h = np.float64
  hyper = dict(value_weight=h(0.5), entropy_weight=h(0.01), lambda_=h(0.9))
  hyper.update(dict.fromkeys(["clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold"],
                             h(1.0)))  # fmt: skip
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):  # a context: x64 does not leak into the other tests
    f32 = lambda *shape: jnp.asarray(rng.uniform(-1.0, 0.0, shape), jnp.float32)
    v, r, log_p, d = f32(4, 2), f32(4, 2), f32(4, 2), jnp.full((4, 2), 0.9, jnp.float32)
    a = jnp.zeros((4, 2), jnp.int32)
    for surrogate_clip in (None, h(0.2)):
      kwargs = dict(hyper, surrogate_clip=surrogate_clip)
      outs = {
          "impala_loss": L.impala_loss(v, v, r, d, log_p, log_p, -log_p, **kwargs),
          "impala_loss_categorical": L.impala_loss_categorical(
              f32(4, 2, 3), f32(4, 2, 3), a, v, v, r, d, **kwargs
          ),
          "impala_loss_gaussian": L.impala_loss_gaussian(
              f32(4, 2, 2), f32(2), log_p, f32(4, 2, 2), v, v, r, d, **kwargs
          ),
      }
      for name, out in outs.items():
        for field, x in out._asdict().items():
          assert x.dtype == jnp.float32, (name, surrogate_clip, field, x.dtype)
    assert L.clipped_surrogate(log_p, log_p, r, h(0.2)).dtype == jnp.float32
