"""Tests for ACER: Q^ret, the bias-corrected policy objective, the trust region,
the critic losses and the continuous-action pieces (Q^ret / Q^opc, SDN).

References are independent float64 NumPy loops of the paper's algorithms
(`offpolicy_ac.testing.reference.acer_returns`: Algorithm 2's "Q^ret <- r + gamma Q^ret;
Q^ret <- min(1, rho)(Q^ret - Q) + V" going backwards; the objective and its
gradient g written out by hand; z* = g - max(0, (k.g - delta)/|k|^2) k).

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

RTOL, ATOL = 2e-5, 2e-4
T_STRAT = st.integers(1, 16)
BATCH_STRAT = st.one_of(
    st.just(()), st.tuples(st.integers(1, 4)), st.tuples(st.integers(1, 3), st.integers(1, 3))
)
SEEDS = st.integers(0, 2**31 - 1)
FEW = settings(max_examples=6)


def _probs(rng, shape, scale=1.5):
  return ref.softmax(scale * rng.normal(size=shape)).astype(np.float32)


# -----------------------------------------------------------------------------
# Q^ret (discrete)
# -----------------------------------------------------------------------------


def _q_ret_inputs(seed, t, batch=(), n_actions=3, *, garble=True):
  rng = np.random.default_rng(seed)
  shape = (t,) + tuple(batch)
  discount, mask, _ = testing.random_layout(rng, t, batch, junction_discount=7.0, p_padding=0.2)
  a_t = rng.integers(0, n_actions, size=shape).astype(np.int32)
  mu_all = _probs(rng, shape + (n_actions,))
  x = dict(
      q_t=rng.normal(size=shape + (n_actions,)).astype(np.float32),
      a_t=a_t,
      r_t=rng.normal(size=shape).astype(np.float32),
      discount_t=discount.astype(np.float32),
      pi_t=_probs(rng, shape + (n_actions,)),
      mu_t=np.take_along_axis(mu_all, a_t[..., None], -1)[..., 0],
      mask=mask,
  )
  if garble:
    x["q_t"] = testing.garble(rng, x["q_t"], mask)
    x["r_t"] = testing.garble(rng, x["r_t"], mask)
    m = mask[..., None]
    x["pi_t"] = np.where(m, x["pi_t"], rng.uniform(0, 5, x["pi_t"].shape))
    x["mu_t"] = np.where(mask, x["mu_t"], rng.uniform(0, 5, mask.shape))
    x["pi_t"], x["mu_t"] = (x["pi_t"].astype(np.float32), x["mu_t"].astype(np.float32))
  return x


_Q_RET_ARGS = ("q_t", "a_t", "r_t", "discount_t", "pi_t", "mu_t")


def _q_ret(x, *, method="scan"):
  return L.acer_q_ret(*(x[k] for k in _Q_RET_ARGS), mask=x["mask"], method=method)


def _np_q_ret(x):
  return ref.acer_q_ret(*(x[k] for k in _Q_RET_ARGS), mask=x["mask"])


@FEW
@given(t=T_STRAT, batch=BATCH_STRAT, seed=SEEDS, n_actions=st.integers(1, 4))
@pytest.mark.parametrize("method", ["scan", "associative"])
def test_acer_q_ret_matches_algorithm_2(method, t, batch, seed, n_actions):
  x = _q_ret_inputs(seed, t, batch, n_actions)
  out = jax.jit(functools.partial(_q_ret, method=method))(x)
  assert out.shape == (t,) + batch
  np.testing.assert_allclose(out, _np_q_ret(x), rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(np.asarray(out)[~x["mask"]], 0.0)


def test_acer_q_ret_identities():
  x = _q_ret_inputs(1, 8, (3,))
  # It is Retrace's target with lambda = 1, and has no gradient.
  np.testing.assert_allclose(
      jax.jit(_q_ret)(x),
      L.retrace_targets(*(x[k] for k in _Q_RET_ARGS), mask=x["mask"], lambda_=1.0),
      rtol=1e-6,
      atol=1e-6,
  )
  grads = jax.jit(
      jax.grad(lambda q, r, pi: jnp.sum(_q_ret(dict(x, q_t=q, r_t=r, pi_t=pi))), argnums=(0, 1, 2))
  )(x["q_t"], x["r_t"], x["pi_t"])
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)
  # scan and associative agree; [T, B] agrees with [T] and with vmap.
  assoc = jax.jit(functools.partial(_q_ret, method="associative"))(x)
  np.testing.assert_allclose(jax.jit(_q_ret)(x), assoc, rtol=1e-5, atol=1e-5)
  vmapped = jax.jit(jax.vmap(_q_ret, in_axes=1, out_axes=1))(x)
  np.testing.assert_allclose(jax.jit(_q_ret)(x), vmapped, rtol=1e-6, atol=1e-6)
  single_fn = jax.jit(_q_ret)
  for j in range(3):
    col = {k: v[:, j] for k, v in x.items()}
    assert col["q_t"].shape == (8, 3) and col["a_t"].shape == (8,)
    np.testing.assert_allclose(single_fn(col), vmapped[:, j], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_acer_q_ret_splitting_at_junctions_changes_nothing(method):
  fn = jax.jit(functools.partial(_q_ret, method=method))
  for lengths, lead in [([3, 4], False), ([3, 3], True)]:
    mask, slices = testing.junction_layout(lengths, lead)
    x = _q_ret_inputs(5, mask.size, (3,), garble=False)
    x["mask"] = np.stack([mask] * 3, 1)
    x["discount_t"] = np.full(x["mask"].shape, 0.95, np.float32)
    for k in ("q_t", "r_t", "pi_t", "mu_t"):
      x[k] = np.where(
          x["mask"].reshape(x["mask"].shape + (1,) * (x[k].ndim - 2)), x[k], 1e3
      ).astype(np.float32)
    joined = np.asarray(fn(x))
    np.testing.assert_array_equal(joined[~mask], 0.0)
    for sl in slices:
      alone = fn({k: v[sl] for k, v in x.items()} | {"mask": None})
      np.testing.assert_allclose(joined[sl], alone, rtol=1e-6, atol=1e-6)


# -----------------------------------------------------------------------------
# Policy objective with truncation and bias correction
# -----------------------------------------------------------------------------


def _policy_inputs(seed, shape=(8, 3), n_actions=4):
  rng = np.random.default_rng(seed)
  return dict(
      pi=_probs(rng, shape + (n_actions,)),
      mu=_probs(rng, shape + (n_actions,)),
      a=rng.integers(0, n_actions, size=shape).astype(np.int32),
      q=rng.normal(size=shape + (n_actions,)).astype(np.float32),
      q_ret=rng.normal(size=shape).astype(np.float32),
  )


def _objective(x, clip_c):
  return L.acer_policy_objective(x["pi"], x["mu"], x["a"], x["q"], x["q_ret"], clip_c=clip_c)


@FEW
@given(
    t=T_STRAT,
    batch=BATCH_STRAT,
    seed=SEEDS,
    n_actions=st.integers(1, 5),
    clip_c=st.sampled_from([0.5, 1.0, 2.0, 10.0]),
)
def test_acer_policy_objective_and_gradient_match_numpy(t, batch, seed, n_actions, clip_c):
  x = _policy_inputs(seed, (t,) + batch, n_actions)

  def fn(x, clip_c):
    obj = _objective(x, clip_c)
    grads = jax.grad(
        lambda pi, mu, q, q_ret: jnp.sum(
            _objective(dict(x, pi=pi, mu=mu, q=q, q_ret=q_ret), clip_c)
        ),
        argnums=(0, 1, 2, 3),
    )(x["pi"], x["mu"], x["q"], x["q_ret"])
    return obj, grads

  obj, (g_pi, g_mu, g_q, g_q_ret) = jax.jit(fn)(x, clip_c)
  expected_obj, expected_g = ref.acer_policy_objective(
      x["pi"], x["mu"], x["a"], x["q"], x["q_ret"], clip_c
  )
  assert obj.shape == (t,) + batch
  np.testing.assert_allclose(obj, expected_obj, rtol=1e-4, atol=1e-4)
  # The gradient w.r.t. the probabilities is the paper's g.
  np.testing.assert_allclose(g_pi, expected_g, rtol=1e-4, atol=1e-4)
  for g in (g_mu, g_q, g_q_ret):  # every coefficient is a constant
    np.testing.assert_array_equal(g, 0.0)


def test_acer_policy_objective_zero_probabilities_are_finite():
  pi = jnp.array([[0.7, 0.3, 0.0]])  # an action with pi = 0 (not taken)
  mu = jnp.array([[0.1, 0.1, 0.8]])
  q, q_ret, a = jnp.array([[1.0, -1.0, 5.0]]), jnp.array([0.5]), jnp.array([0])
  obj, g = jax.jit(
      jax.value_and_grad(
          lambda pi: jnp.sum(L.acer_policy_objective(pi, mu, a, q, q_ret, clip_c=1.0))
      )
  )(pi)
  assert np.isfinite(obj) and np.all(np.isfinite(g))
  exp_obj, exp_g = ref.acer_policy_objective(np.array([[0.7, 0.3, 1e-30]]), mu, a, q, q_ret, 1.0)
  np.testing.assert_allclose(obj, exp_obj.sum(), rtol=1e-5)
  np.testing.assert_allclose(g[0, :2], exp_g[0, :2], rtol=1e-5)


def test_acer_policy_objective_takes_minus_infinity_where_pi_is_zero():
  """An illegal action (pi 0, Q -inf), which acer_q_ret accepts, made the objective NaN."""
  pi, mu = jnp.array([[0.4, 0.6, 0.0]]), jnp.array([[0.5, 0.4, 0.1]])
  a, q_ret = jnp.array([0]), jnp.array([0.5])
  q = jnp.array([[1.0, 2.0, -jnp.inf]])
  finite_q = q.at[0, 2].set(3.0)  # any finite value: pi gives it no weight
  for fn in (L.acer_policy_objective, jax.jit(L.acer_policy_objective)):
    obj, grad = jax.value_and_grad(lambda p: jnp.sum(fn(p, mu, a, q, q_ret, clip_c=1.0)))(pi)
    exp_obj, exp_grad = jax.value_and_grad(
        lambda p: jnp.sum(fn(p, mu, a, finite_q, q_ret, clip_c=1.0))
    )(pi)
    np.testing.assert_array_equal(obj, exp_obj)
    np.testing.assert_array_equal(grad, exp_grad)
    assert np.isfinite(obj) and np.all(np.isfinite(grad))
  region = L.acer_trust_region_policy_loss(jnp.log(pi), jnp.log(pi), mu, a, q, q_ret)
  assert np.all(np.isfinite(region.surrogate)), region


# -----------------------------------------------------------------------------
# Trust region
# -----------------------------------------------------------------------------


@FEW
@given(
    shape=st.one_of(st.tuples(st.integers(1, 16)), st.tuples(st.integers(1, 8), st.integers(1, 4))),
    dim=st.integers(1, 5),
    seed=SEEDS,
    delta=st.floats(0.0, 3.0),
)
def test_trust_region_projection_properties(shape, dim, seed, delta):
  rng = np.random.default_rng(seed)
  g = rng.normal(size=shape + (dim,)).astype(np.float32)
  k = rng.normal(size=shape + (dim,)).astype(np.float32)
  k[rng.random(size=shape) < 0.1] = 0.0
  z = np.asarray(jax.jit(L.trust_region_projection)(g, k, delta))
  np.testing.assert_allclose(z, ref.trust_region_projection(g, k, delta), rtol=1e-4, atol=1e-5)
  kg = np.sum(k.astype(np.float64) * g, -1)
  kz = np.sum(k.astype(np.float64) * z, -1)
  active = kg > delta
  # Active: the constraint holds with equality; inactive: z = g.
  np.testing.assert_allclose(kz[active], delta, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(z[~active], g[~active])
  assert np.all(kz <= delta + 1e-4 * (1 + np.abs(kg)))


def _tr_inputs(seed, shape=(8, 3), n_actions=4):
  rng = np.random.default_rng(seed)
  x = _policy_inputs(seed, shape, n_actions)
  x["logits"] = (1.5 * rng.normal(size=shape + (n_actions,))).astype(np.float32)
  x["avg_logits"] = (x["logits"] + 0.5 * rng.normal(size=x["logits"].shape)).astype(np.float32)
  return x


def _tr_loss(logits, x, delta, clip_c):
  return L.acer_trust_region_policy_loss(
      logits, x["avg_logits"], x["mu"], x["a"], x["q"], x["q_ret"], clip_c=clip_c, delta=delta
  )


_tr_surrogate_grad = jax.jit(
    jax.grad(lambda logits, x, delta, clip_c: jnp.sum(_tr_loss(logits, x, delta, clip_c).surrogate))
)
_plain_policy_grad = jax.jit(
    jax.grad(
        lambda logits, x, clip_c: -jnp.sum(
            L.acer_policy_objective(
                jax.nn.softmax(logits), x["mu"], x["a"], x["q"], x["q_ret"], clip_c=clip_c
            )
        )
    )
)


@pytest.mark.parametrize("delta", [0.0, 0.5, 1e3])
def test_acer_trust_region_policy_loss_matches_paper(delta):
  for seed, clip_c in [(0, 1.0), (1, 10.0)]:
    x = _tr_inputs(seed)
    f = ref.softmax(x["logits"])
    f_avg = ref.softmax(x["avg_logits"])
    obj, g = ref.acer_policy_objective(f, x["mu"], x["a"], x["q"], x["q_ret"], clip_c)
    k = -f_avg / f  # d KL(f_avg || f) / d f
    z = ref.trust_region_projection(g, k, delta)
    kg = np.sum(k * g, -1)

    out = jax.jit(_tr_loss)(x["logits"], x, delta, clip_c)
    np.testing.assert_array_equal(out.active, kg > delta)
    np.testing.assert_allclose(out.objective, obj, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        out.kl, ref.categorical_kl(x["avg_logits"], x["logits"]), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(out.surrogate, -np.sum(z * f, -1), rtol=1e-4, atol=1e-4)
    # d surrogate / d logits = -J^T z* with J = diag(f) - f f^T.
    grads = _tr_surrogate_grad(x["logits"], x, delta, clip_c)
    expected = -(f * z - f * np.sum(f * z, -1, keepdims=True))
    np.testing.assert_allclose(grads, expected, rtol=1e-4, atol=1e-4)
    if delta == 1e3:  # inactive everywhere: the plain ACER policy gradient
      plain = _plain_policy_grad(x["logits"], x, clip_c)
      np.testing.assert_allclose(grads, plain, rtol=1e-4, atol=1e-5)


# -----------------------------------------------------------------------------
# Critic loss (discrete)
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# Continuous ACER
# -----------------------------------------------------------------------------


def _continuous_inputs(seed, t, batch=(), *, garble=True):
  rng = np.random.default_rng(seed)
  shape = (t,) + tuple(batch)
  discount, mask, _ = testing.random_layout(rng, t, batch, junction_discount=7.0, p_padding=0.2)
  x = dict(
      q_a_t=rng.normal(size=shape),
      v_t=rng.normal(size=shape),
      r_t=rng.normal(size=shape),
      discount_t=discount,
      log_rho_t=rng.normal(scale=1.5, size=shape),
  )
  if garble:
    for k in ("q_a_t", "v_t", "r_t", "log_rho_t"):
      x[k] = testing.garble(rng, x[k], mask, scale=50.0)
  x = {k: v.astype(np.float32) for k, v in x.items()}
  x["mask"] = mask
  return x


_CONT_ARGS = ("q_a_t", "v_t", "r_t", "discount_t", "log_rho_t")


def _continuous(x, *, action_dim, method="scan"):
  return L.acer_continuous_targets(
      *(x[k] for k in _CONT_ARGS), action_dim=action_dim, mask=x["mask"], method=method
  )


def _np_continuous(x, action_dim):
  return ref.acer_continuous_targets(
      *(x[k] for k in _CONT_ARGS), action_dim=action_dim, mask=x["mask"]
  )


@FEW
@given(t=T_STRAT, batch=BATCH_STRAT, seed=SEEDS, action_dim=st.integers(1, 6))
@pytest.mark.parametrize("method", ["scan", "associative"])
def test_acer_continuous_targets_match_algorithm(method, t, batch, seed, action_dim):
  x = _continuous_inputs(seed, t, batch)
  out = jax.jit(functools.partial(_continuous, action_dim=action_dim, method=method))(x)
  q_ret, q_opc = _np_continuous(x, action_dim)
  np.testing.assert_allclose(out.q_ret, q_ret, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(out.q_opc, q_opc, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(np.asarray(out.q_ret)[~x["mask"]], 0.0)
  np.testing.assert_array_equal(np.asarray(out.q_opc)[~x["mask"]], 0.0)


def test_acer_continuous_targets_identities():
  fn = jax.jit(functools.partial(_continuous, action_dim=3))
  x = _continuous_inputs(4, 8, (3,))
  out = fn(x)
  # Targets are constants.
  grads = jax.jit(
      jax.grad(
          lambda q, v, r: jnp.sum(jnp.stack(fn(dict(x, q_a_t=q, v_t=v, r_t=r)))), argnums=(0, 1, 2)
      )
  )(x["q_a_t"], x["v_t"], x["r_t"])
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)
  # rho >= 1 everywhere: c_ret = 1 and Q^ret = Q^opc.
  on = fn(dict(x, log_rho_t=np.abs(x["log_rho_t"])))
  np.testing.assert_allclose(on.q_ret, on.q_opc, rtol=1e-6, atol=1e-6)
  # scan / associative, [T] / vmap.
  assoc = jax.jit(functools.partial(_continuous, action_dim=3, method="associative"))(x)
  np.testing.assert_allclose(out.q_ret, assoc.q_ret, rtol=1e-5, atol=1e-4)
  vm = jax.jit(jax.vmap(functools.partial(_continuous, action_dim=3), in_axes=1, out_axes=1))(x)
  np.testing.assert_allclose(out.q_opc, vm.q_opc, rtol=1e-6, atol=1e-6)
  col = fn({k: v[:, 1] for k, v in x.items()})
  np.testing.assert_allclose(out.q_ret[:, 1], col.q_ret, rtol=1e-6, atol=1e-6)
  # Splitting at junctions.
  mask, slices = testing.junction_layout([3, 4])
  y = _continuous_inputs(6, 8, garble=False)
  y["mask"] = mask
  y["discount_t"] = np.full(8, 0.9, np.float32)
  for k in _CONT_ARGS:
    y[k] = np.where(mask, y[k], 1e3).astype(np.float32)
  joined = fn(y)
  for sl in slices:
    alone = fn({k: v[sl] for k, v in y.items()} | {"mask": None})
    np.testing.assert_allclose(joined.q_ret[sl], alone.q_ret, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(joined.q_opc[sl], alone.q_opc, rtol=1e-6, atol=1e-6)


_CP_ARGS = ("log_pi_a", "log_pi_sample", "log_rho_a", "log_rho_sample", "q_opc", "q_sample", "v")


def _cp_inputs(seed, shape=(8, 3)):
  rng = np.random.default_rng(seed)
  x = {k: rng.normal(size=shape).astype(np.float32) for k in _CP_ARGS}
  x["log_rho_a"] = (2.0 * x["log_rho_a"]).astype(np.float32)
  x["log_rho_sample"] = (2.0 * x["log_rho_sample"]).astype(np.float32)
  return x


def _cp_objective(x, clip_c):
  return L.acer_continuous_policy_objective(*(x[k] for k in _CP_ARGS), clip_c=clip_c)


def test_acer_continuous_policy_objective_extreme_log_rho():
  x = _cp_inputs(0, shape=(4,))
  x["log_rho_a"] = np.array([1e4, -1e4, 0.0, 80.0], np.float32)
  x["log_rho_sample"] = np.array([-1e4, 1e4, 100.0, -100.0], np.float32)
  obj, grads = jax.jit(jax.value_and_grad(lambda x: jnp.sum(_cp_objective(x, 10.0))))(x)
  assert np.isfinite(obj)
  for g in grads.values():
    assert np.all(np.isfinite(g))
  adv_a = x["q_opc"] - x["v"]
  np.testing.assert_allclose(
      grads["log_pi_a"], [10.0 * adv_a[0], 0.0, adv_a[2], 10 * adv_a[3]], rtol=1e-5, atol=1e-30
  )
  adv_s = x["q_sample"] - x["v"]
  np.testing.assert_allclose(grads["log_pi_sample"], [0.0, adv_s[1], adv_s[2], 0.0], rtol=1e-5)


# -----------------------------------------------------------------------------
# Bad input
# -----------------------------------------------------------------------------

_F = np.zeros((8, 3), np.float32)
_FA = np.zeros((8, 3, 4), np.float32)
_I = np.zeros((8, 3), np.int32)
_PER_STEP_OBJECTIVE = dict(objective_fn=lambda s: s.sum(-1), stats=_FA, delta=1.0)


def _q_ret_call(**over):
  kw = dict(q_t=_FA, a_t=_I, r_t=_F, discount_t=_F, pi_t=_FA, mu_t=_F)
  mask = over.pop("mask", None)
  kw.update(over)
  return lambda: L.acer_q_ret(*kw.values(), mask=mask)


def _obj_call(fn=L.acer_policy_objective, clip_c=1.0, **over):
  kw = dict(pi_tm1=_FA, mu_tm1=_FA, a_tm1=_I, q_tm1=_FA, q_ret_tm1=_F)
  kw.update(over)
  return lambda: fn(*kw.values(), clip_c=clip_c)


def _tr_call(delta=1.0, clip_c=1.0, **over):
  kw = dict(logits_tm1=_FA, avg_logits_tm1=_FA, mu_tm1=_FA, a_tm1=_I, q_tm1=_FA, q_ret_tm1=_F)
  kw.update(over)
  return lambda: L.acer_trust_region_policy_loss(*kw.values(), delta=delta, clip_c=clip_c)


def _cont_call(action_dim=2, **over):
  kw = dict(q_a_t=_F, v_t=_F, r_t=_F, discount_t=_F, log_rho_t=_F)
  mask = over.pop("mask", None)
  kw.update(over)
  return lambda: L.acer_continuous_targets(*kw.values(), action_dim=action_dim, mask=mask)


def _cp_call(clip_c=1.0, **over):
  kw = {k: _F for k in _CP_ARGS}
  kw.update(over)
  return lambda: L.acer_continuous_policy_objective(*kw.values(), clip_c=clip_c)


def _cv_call(**over):
  kw = dict(q_tilde_a=_F, v=_F, q_ret=_F, log_rho_a=_F)
  kw.update(over)
  return lambda: L.acer_continuous_value_losses(*kw.values())


_BAD = [
    ("q_ret-q_t-dtype", _q_ret_call(q_t=_FA.astype(np.int32)), TypeError, "q_t"),
    ("q_ret-a_t-dtype", _q_ret_call(a_t=_F), TypeError, "a_t"),
    ("q_ret-pi_t-shape", _q_ret_call(pi_t=_FA[:, :2]), ValueError, "pi_t"),
    ("q_ret-mu_t-shape", _q_ret_call(mu_t=_F[:, :2]), ValueError, "mu_t"),
    ("q_ret-r_t-dtype", _q_ret_call(r_t=_I), TypeError, "r_t"),
    ("q_ret-q_t-rank", _q_ret_call(q_t=_F), ValueError, "q_t"),
    ("q_ret-mask-dtype", _q_ret_call(mask=_I), TypeError, "mask"),
    ("q_ret-mask-shape", _q_ret_call(mask=np.ones((8,), bool)), ValueError, "mask"),
    ("obj-pi-dtype", _obj_call(pi_tm1=_FA.astype(np.int32)), TypeError, "pi_tm1"),
    ("obj-mu-shape", _obj_call(mu_tm1=_FA[..., :3]), ValueError, "mu_tm1"),
    ("obj-q-shape", _obj_call(q_tm1=_FA[:, :2]), ValueError, "q_tm1"),
    ("obj-a-dtype", _obj_call(a_tm1=_F), TypeError, "a_tm1"),
    ("obj-a-shape", _obj_call(a_tm1=_I[:, :2]), ValueError, "a_tm1"),
    ("obj-q_ret-shape", _obj_call(q_ret_tm1=_F[:, :2]), ValueError, "q_ret_tm1"),
    ("obj-pi-rank", _obj_call(pi_tm1=np.zeros((4,), np.float32)), ValueError, "pi_tm1"),
    ("obj-clip_c", _obj_call(clip_c=0.0), ValueError, "clip_c"),
    ("loss-clip_c", _obj_call(fn=L.acer_policy_loss, clip_c=-1.0), ValueError, "clip_c"),
    ("proj-k-shape", lambda: L.trust_region_projection(_F, _F[:, :2], 1.0), ValueError, "k"),
    ("proj-delta", lambda: L.trust_region_projection(_F, _F, -0.1), ValueError, "delta"),
    (
        "surrogate-stats-dtype",
        lambda: L.trust_region_surrogate(lambda s: s, lambda s: s, _I, delta=1.0),
        TypeError,
        "stats",
    ),
    (
        "surrogate-objective-summed",  # one total for every step: the outputs were wrong
        lambda: L.trust_region_surrogate(jnp.sum, lambda s: s.sum(-1), _FA, delta=1.0),
        ValueError,
        r"objective_fn\(stats\)",
    ),
    (
        "surrogate-kl-per-time",
        lambda: L.trust_region_surrogate(kl_fn=lambda s: s.sum((1, 2)), **_PER_STEP_OBJECTIVE),
        ValueError,
        r"kl_fn\(stats\)",
    ),
    ("tr-avg-shape", _tr_call(avg_logits_tm1=_FA[:, :2]), ValueError, "avg_logits_tm1"),
    ("tr-delta", _tr_call(delta=-1.0), ValueError, "delta"),
    ("tr-clip_c", _tr_call(clip_c=0.0), ValueError, "clip_c"),
    ("tr-mu-shape", _tr_call(mu_tm1=_FA[:, :2]), ValueError, "mu_tm1"),
    ("value-q-dtype", lambda: L.acer_value_loss(_FA.astype(np.int32), _I, _F), TypeError, "q_tm1"),
    ("value-a-dtype", lambda: L.acer_value_loss(_FA, _F, _F), TypeError, "a_tm1"),
    ("value-a-shape", lambda: L.acer_value_loss(_FA, _I[:, :2], _F), ValueError, "a_tm1"),
    ("value-q_ret-shape", lambda: L.acer_value_loss(_FA, _I, _F[:, :2]), ValueError, "q_ret_tm1"),
    ("cont-action_dim-0", _cont_call(action_dim=0), ValueError, "action_dim"),
    ("cont-action_dim-float", _cont_call(action_dim=1.5), ValueError, "action_dim"),
    ("cont-log_rho-shape", _cont_call(log_rho_t=_F[:, :2]), ValueError, "log_rho_t"),
    ("cont-log_rho-dtype", _cont_call(log_rho_t=_I), TypeError, "log_rho_t"),
    ("cont-v_t-shape", _cont_call(v_t=_F[:, :2]), ValueError, "v_t"),
    ("cont-q_a_t-dtype", _cont_call(q_a_t=_I), TypeError, "q_a_t"),
    ("cont-mask-shape", _cont_call(mask=np.ones((8, 2), bool)), ValueError, "mask"),
    ("sdn-adv_a-shape", lambda: L.sdn_q_value(_F, _F[:, :2], _FA), ValueError, "adv_a"),
    ("sdn-samples-shape", lambda: L.sdn_q_value(_F, _F, _FA[:, :2]), ValueError, "adv_samples"),
    ("cp-shape", _cp_call(q_sample=_F[:, :2]), ValueError, "q_sample"),
    ("cp-dtype", _cp_call(log_pi_a=_I), TypeError, "log_pi_a"),
    ("cp-clip_c", _cp_call(clip_c=0.0), ValueError, "clip_c"),
    ("cv-shape", _cv_call(log_rho_a=_F[:, :2]), ValueError, "log_rho_a"),
    ("cv-dtype", _cv_call(v=_I), TypeError, "v"),
]


class AcerVariantsTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_q_ret_hand_case(self):
    q_t = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    a_t = jnp.array([1, 0])
    r_t, d_t = jnp.array([1.0, 1.0]), jnp.array([0.9, 0.9])
    pi_t = jnp.array([[0.5, 0.5], [0.25, 0.75]])
    fn = self.variant(lambda mu_t: L.acer_q_ret(q_t, a_t, r_t, d_t, pi_t, mu_t))
    # V(x_1) = 1.5, V(x_2) = 3.75; G_1 = 1 + 0.9 * 3.75 = 4.375.
    # rho_1 = 0.5 / 0.25 = 2 -> c = 1: G_0 = 1 + 0.9 (1.5 + (4.375 - 2)).
    np.testing.assert_allclose(fn(jnp.array([0.25, 0.5])), [4.4875, 4.375], rtol=1e-6)
    # rho_1 = 0.5 / 1.0 -> c = 0.5: G_0 = 1 + 0.9 (1.5 + 0.5 (4.375 - 2)).
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.5])), [3.41875, 4.375], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_q_ret_hand_case_with_mask_and_termination(self):
    q_t = jnp.array([[1.0, 2.0], [9.0, 9.0], [3.0, 4.0], [0.0, 2.0]])
    a_t = jnp.array([1, 0, 0, 1])
    r_t, d_t = jnp.array([1.0, 9.0, 2.0, 0.5]), jnp.array([0.9, 9.0, 0.0, 0.9])
    pi_t = jnp.full((4, 2), 0.5)
    mu_t = jnp.full((4,), 0.5)
    mask = jnp.array([True, False, True, True])
    out = self.variant(lambda m: L.acer_q_ret(q_t, a_t, r_t, d_t, pi_t, mu_t, mask=m))(mask)
    # Step 0 bootstraps from V(x_1) = 1.5 (next step masked); step 2 is a
    # termination (discount 0); step 3 bootstraps from V(x_4) = 1.
    np.testing.assert_allclose(out, [1 + 0.9 * 1.5, 0.0, 2.0, 0.5 + 0.9 * 1.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(method=["scan", "associative"])
  def test_acer_q_ret_matches_algorithm_2_fixed_shapes(self, method):
    fn = self.variant(functools.partial(_q_ret, method=method))
    for i, shape in enumerate([(8, 3)]):  # other shapes: hypothesis, jitted
      x = _q_ret_inputs(i, shape[0], shape[1:])
      np.testing.assert_allclose(fn(x), _np_q_ret(x), rtol=RTOL, atol=ATOL)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_policy_objective_hand_case(self):
    pi, mu = jnp.array([[0.8, 0.2]]), jnp.array([[0.2, 0.8]])
    q, q_ret, a = jnp.array([[1.0, 3.0]]), jnp.array([2.0]), jnp.array([0])
    # rho = [4, 1/4], V = 1.4, c = 2: min(2, 4) (2 - 1.4) log 0.8 plus the
    # correction [1 - 2/4]_+ 0.8 (1 - 1.4) log 0.8 (zero for action 1).
    obj = self.variant(lambda pi: L.acer_policy_objective(pi, mu, a, q, q_ret, clip_c=2.0))(pi)
    np.testing.assert_allclose(obj, [1.04 * np.log(0.8)], rtol=1e-5)
    loss = self.variant(lambda pi: L.acer_policy_loss(pi, mu, a, q, q_ret, clip_c=2.0))(pi)
    np.testing.assert_allclose(loss, -obj, rtol=1e-6)
    # g = [2 * 0.6 / 0.8 + 0.5 * (1 - 1.4), 0].
    g = jax.jit(
        jax.grad(lambda pi: jnp.sum(L.acer_policy_objective(pi, mu, a, q, q_ret, clip_c=2.0)))
    )(pi)
    np.testing.assert_allclose(g, [[1.3, 0.0]], rtol=1e-5, atol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_policy_objective_fixed_shapes(self):
    fn = self.variant(_objective)
    for seed, clip_c in [(0, 1.0), (1, 0.5)]:
      x = _policy_inputs(seed)
      np.testing.assert_allclose(
          fn(x, clip_c),
          ref.acer_policy_objective(x["pi"], x["mu"], x["a"], x["q"], x["q_ret"], clip_c)[0],
          rtol=1e-4,
          atol=1e-4,
      )
      np.testing.assert_allclose(
          self.variant(
              lambda x: L.acer_policy_loss(
                  x["pi"], x["mu"], x["a"], x["q"], x["q_ret"], clip_c=clip_c
              )
          )(x),
          -np.asarray(fn(x, clip_c)),
          rtol=1e-6,
      )

  @chex.variants(with_jit=True, without_jit=True)
  def test_trust_region_projection_hand_cases(self):
    proj = self.variant(lambda g, k: L.trust_region_projection(g, k, 0.5))
    g = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 2.0], [3.0, 4.0]])
    k = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [-1.0, 0.0]])
    z = proj(g, k)
    # Row 0: k.g = 1 > 0.5 -> z = g - 0.5 k, and k.z = delta.
    # Rows 1-3: k.g = 0, k = 0 and k.g = -3 are inside: z = g.
    np.testing.assert_allclose(z, [[0.5, 0.0], [1.0, 0.0], [1.0, 2.0], [3.0, 4.0]], rtol=1e-6)
    z2 = self.variant(lambda g, k: L.trust_region_projection(g, k, 2.0))(
        jnp.array([[1.0, 2.0]]), jnp.array([[2.0, 1.0]])
    )
    # k.g = 4 > 2: z = g - (4 - 2)/5 k = [0.2, 1.6]; k.z = 2.
    np.testing.assert_allclose(z2, [[0.2, 1.6]], rtol=1e-6)
    np.testing.assert_allclose(jnp.sum(z2 * jnp.array([[2.0, 1.0]])), 2.0, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_trust_region_surrogate_gradient_is_minus_z(self):
    rng = np.random.default_rng(0)
    stats = rng.uniform(0.2, 2.0, size=(8, 3, 4)).astype(np.float32)
    c = rng.uniform(0.1, 2.0, size=stats.shape).astype(np.float32)
    b = rng.uniform(0.0, 1.0, size=stats.shape).astype(np.float32)
    objective_fn = lambda s: jnp.sum(c * jnp.log(s), axis=-1)
    kl_fn = lambda s: jnp.sum(b * jnp.square(s), axis=-1)
    g, k = c / stats, 2.0 * b * stats  # per-step gradients
    kg = np.sum(k.astype(np.float64) * g, -1)
    delta = float(np.median(kg))  # about half the steps active (kg > 0 here)
    out = self.variant(lambda s: L.trust_region_surrogate(objective_fn, kl_fn, s, delta=delta))(
        stats
    )
    assert isinstance(out, L.TrustRegionOutput)
    assert out.surrogate.shape == (8, 3)
    np.testing.assert_array_equal(out.active, kg > delta)
    assert 0 < np.sum(out.active) < out.active.size
    np.testing.assert_allclose(out.objective, objective_fn(stats), rtol=1e-6)
    np.testing.assert_allclose(out.kl, kl_fn(stats), rtol=1e-6)
    grads = jax.jit(
        jax.grad(
            lambda s: jnp.sum(
                L.trust_region_surrogate(objective_fn, kl_fn, s, delta=delta).surrogate
            )
        )
    )(stats)
    z = ref.trust_region_projection(g, k, delta)
    np.testing.assert_allclose(grads, -z, rtol=1e-4, atol=1e-5)
    # The reported objective and KL are diagnostics: no gradient.
    for field in ("objective", "kl"):
      gz = jax.jit(
          jax.grad(
              lambda s: jnp.sum(
                  getattr(L.trust_region_surrogate(objective_fn, kl_fn, s, delta=delta), field)
              )
          )
      )(stats)
      np.testing.assert_array_equal(gz, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_trust_region_policy_loss_forward(self):
    x = _tr_inputs(3)
    out = self.variant(_tr_loss)(x["logits"], x, 0.5, 10.0)
    f = ref.softmax(x["logits"])
    obj, _ = ref.acer_policy_objective(f, x["mu"], x["a"], x["q"], x["q_ret"], 10.0)
    np.testing.assert_allclose(out.objective, obj, rtol=1e-4, atol=1e-4)
    assert out.surrogate.shape == (8, 3) and out.active.dtype == jnp.bool_

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_value_loss(self):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(8, 3, 4)).astype(np.float32)
    a = rng.integers(0, 4, size=(8, 3)).astype(np.int32)
    q_ret = rng.normal(size=(8, 3)).astype(np.float32)
    out = self.variant(L.acer_value_loss)(q, a, q_ret)
    q_a = np.take_along_axis(q, a[..., None], -1)[..., 0]
    np.testing.assert_allclose(out, 0.5 * (q_ret - q_a) ** 2, rtol=1e-6)
    g_q, g_ret = jax.jit(
        jax.grad(lambda q, r: jnp.sum(L.acer_value_loss(q, a, r)), argnums=(0, 1))
    )(q, q_ret)
    np.testing.assert_allclose(g_q, -(q_ret - q_a)[..., None] * np.eye(4)[a], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(g_ret, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_continuous_targets_hand_case(self):
    x = dict(
        q_a_t=np.array([1.0, 2.0], np.float32),
        v_t=np.array([0.5, 3.0], np.float32),
        r_t=np.array([1.0, 1.0], np.float32),
        discount_t=np.array([0.9, 0.9], np.float32),
        log_rho_t=np.log(np.array([0.25, 1.0], np.float32)),
        mask=None,
    )
    out = self.variant(functools.partial(_continuous, action_dim=2))(x)
    assert isinstance(out, L.AcerContinuousTargets)
    last = 1.0 + 0.9 * 3.0
    # c_ret = min(1, 0.25^(1/2)) = 0.5; c_opc = 1.
    np.testing.assert_allclose(out.q_ret, [1.0 + 0.9 * (0.5 + 0.5 * (last - 1.0)), last], rtol=1e-6)
    np.testing.assert_allclose(out.q_opc, [1.0 + 0.9 * (0.5 + (last - 1.0)), last], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_continuous_targets_fixed_shapes(self):
    for action_dim in [1, 3]:
      fn = self.variant(functools.partial(_continuous, action_dim=action_dim))
      for i, shape in enumerate([(8, 3)]):  # other shapes: hypothesis, jitted
        x = _continuous_inputs(i, shape[0], shape[1:])
        out = fn(x)
        q_ret, q_opc = _np_continuous(x, action_dim)
        np.testing.assert_allclose(out.q_ret, q_ret, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(out.q_opc, q_opc, rtol=RTOL, atol=ATOL)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sdn_q_value(self):
    out = self.variant(L.sdn_q_value)(
        jnp.array([1.0, 0.0]), jnp.array([2.0, -1.0]), jnp.array([[1.0, 3.0], [0.5, 0.5]])
    )
    np.testing.assert_allclose(out, [1.0, -1.5], rtol=1e-6)
    rng = np.random.default_rng(0)
    v, adv = rng.normal(size=(8, 3)), rng.normal(size=(8, 3))
    samples = rng.normal(size=(8, 3, 5))
    out = self.variant(L.sdn_q_value)(*(np.float32(a) for a in (v, adv, samples)))
    np.testing.assert_allclose(out, v + adv - samples.mean(-1), rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(clip_c=[0.5, 2.0, 10.0])
  def test_acer_continuous_policy_objective(self, clip_c):
    x = _cp_inputs(int(clip_c * 10))
    obj = self.variant(_cp_objective)(x, clip_c)
    exp_obj, g_a, g_s = ref.acer_continuous_policy_objective(
        *(x[k] for k in _CP_ARGS), clip_c=clip_c
    )
    np.testing.assert_allclose(obj, exp_obj, rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(lambda x: jnp.sum(_cp_objective(x, clip_c))))(x)
    np.testing.assert_allclose(grads["log_pi_a"], g_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["log_pi_sample"], g_s, rtol=1e-5, atol=1e-6)
    for k in ("log_rho_a", "log_rho_sample", "q_opc", "q_sample", "v"):
      np.testing.assert_array_equal(grads[k], 0.0, err_msg=k)

  @chex.variants(with_jit=True, without_jit=True)
  def test_acer_continuous_value_losses(self):
    rng = np.random.default_rng(1)
    args = [rng.normal(size=(8, 3)).astype(np.float32) for _ in range(4)]
    args[3] = (2.0 * args[3]).astype(np.float32)  # log_rho_a
    out = self.variant(L.acer_continuous_value_losses)(*args)
    exp, g_q, g_v = ref.acer_continuous_value_losses(*args)
    np.testing.assert_allclose(out, exp, rtol=1e-5, atol=1e-6)
    grads = jax.jit(
        jax.grad(lambda *a: jnp.sum(L.acer_continuous_value_losses(*a)), argnums=(0, 1, 2, 3))
    )(*args)
    np.testing.assert_allclose(grads[0], g_q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[1], g_v, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(grads[2], 0.0)  # Q^ret is a target
    np.testing.assert_array_equal(grads[3], 0.0)  # the ratio is a constant


class AcerBadInputTest(chex.TestCase):
  """Tests run eagerly and jitted: `self.variant` is chex's with_jit or without_jit."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*_BAD)
  def test_bad_input_names_the_argument(self, call, exc, name):
    with pytest.raises(exc, match=f"`{name}`"):
      self.variant(call)()


def test_trust_region_loss_is_nan_at_an_out_of_range_action_under_jit():
  # The objective's NaN has no gradient of its own (a `where` picks it): z* carries it.
  T, B, A = 4, 2, 3
  logits = jax.random.normal(jax.random.PRNGKey(0), (T, B, A))
  mu, q, q_ret = jax.nn.softmax(logits + 1.0), 2.0 * logits, jnp.ones((T, B))
  bad = jnp.zeros((T, B), jnp.int32).at[0, 0].set(5)
  loss = jax.jit(lambda lg, a: L.acer_trust_region_policy_loss(lg, lg, mu, a, q, q_ret))
  surrogate = np.asarray(loss(logits, bad).surrogate)
  assert np.isnan(surrogate[0, 0]) and np.isfinite(np.delete(surrogate.ravel(), 0)).all()
  grad = jax.grad(lambda lg: jnp.sum(loss(lg, bad).surrogate))(logits)
  assert np.isnan(np.asarray(grad)[0, 0]).all()
  good = jax.grad(lambda lg: jnp.sum(loss(lg, jnp.zeros_like(bad)).surrogate))(logits)
  assert np.isfinite(np.asarray(good)).all()


def test_acer_array_hyper_parameters_are_per_step_with_the_inputs_rank():
  rng = np.random.default_rng(0)
  T = B = A = 3  # a [T] value would meet the batch axis, silently
  pi, mu = _probs(rng, (T, B, A)), _probs(rng, (T, B, A))
  q = rng.normal(size=(T, B, A)).astype(np.float32)
  a = rng.integers(0, A, (T, B)).astype(np.int32)
  q_ret = rng.normal(size=(T, B)).astype(np.float32)
  clip_c = np.array([0.5, 1.0, 2.0], np.float32)
  got = L.acer_policy_objective(pi, mu, a, q, q_ret, clip_c=clip_c[:, None])
  for t in range(T):  # each step with its own scalar c
    want = L.acer_policy_objective(pi[t:t + 1], mu[t:t + 1], a[t:t + 1], q[t:t + 1],
                                   q_ret[t:t + 1], clip_c=float(clip_c[t]))  # fmt: skip
    np.testing.assert_allclose(got[t], want[0], rtol=1e-6)
  with pytest.raises(ValueError, match=r"`clip_c` of shape \(3,\) must be a scalar or have"):
    L.acer_policy_objective(pi, mu, a, q, q_ret, clip_c=clip_c)
  g, k = rng.normal(size=(2, T, B, A)).astype(np.float32)
  delta = np.array([0.0, 1.0, 10.0], np.float32)
  got = L.trust_region_projection(g, k, delta[:, None])
  for t in range(T):
    np.testing.assert_allclose(got[t], L.trust_region_projection(g[t], k[t], delta[t]), rtol=1e-6)
  with pytest.raises(ValueError, match=r"`delta` of shape \(3,\) must be a scalar or have"):
    L.trust_region_projection(g, k, delta)
  x = jnp.zeros((T, B))
  with pytest.raises(ValueError, match=r"`clip_c` of shape \(3,\) must be a scalar or have"):
    L.acer_continuous_policy_objective(x, x, x, x, x, x, x, clip_c=jnp.asarray(clip_c))


def test_acer_objectives_stay_finite_in_float16_where_mu_is_zero():
  # eps = 1e-8 rounds to 0 in float16: the floor is float16's smallest normal number.
  pi = jnp.full((1, 1, 3), 1 / 3, jnp.float16)
  mu = jnp.array([[[0.5, 0.5, 0.0]]], jnp.float16)
  q = jnp.array([[[1.0, 2.0, 3.0]]], jnp.float16)
  a, q_ret = jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), jnp.float16)
  half = L.acer_policy_objective(pi, mu, a, q, q_ret)
  full = L.acer_policy_objective(*(x.astype(jnp.float32) for x in (pi, mu)), a,
                                 q.astype(jnp.float32), q_ret.astype(jnp.float32))  # fmt: skip
  assert half.dtype == jnp.float16
  np.testing.assert_allclose(float(half[0, 0]), float(full[0, 0]), rtol=1e-2)
  loss = L.acer_trust_region_policy_loss(jnp.log(pi), jnp.log(pi), mu, a, q, q_ret)
  assert np.isfinite(np.asarray(loss.surrogate, np.float32)).all()
  targets = L.retrace_targets(q, a, jnp.ones((1, 1), jnp.float16), jnp.full((1, 1), 0.9, jnp.float16),
                              pi, jnp.zeros((1, 1), jnp.float16), eps=0.0)  # fmt: skip
  assert np.isfinite(np.asarray(targets, np.float32)).all()


def test_acer_dtype_errors_name_the_arguments_given():
  x = jnp.zeros((4, 2))
  with pytest.raises(TypeError, match="`log_rho_t` must have the dtype of `r_t`"):
    L.acer_continuous_targets(x, x, x, x, x.astype(jnp.bfloat16), action_dim=2)


@pytest.mark.parametrize("name", ["pi_tm1", "mu_tm1"])
def test_acer_policy_objective_refuses_what_is_not_a_probability(name):
  # log_softmax passed for softmax: every entry < 0, read as probability 0, gave an
  # objective and a gradient of exactly 0.
  rng = np.random.default_rng(0)
  T, B, A = 3, 2, 4
  probs = {"pi_tm1": _probs(rng, (T, B, A)), "mu_tm1": _probs(rng, (T, B, A))}
  probs[name] = np.log(probs[name])
  a = rng.integers(0, A, (T, B)).astype(np.int32)
  q = rng.normal(size=(T, B, A)).astype(np.float32)
  q_ret = rng.normal(size=(T, B)).astype(np.float32)
  with pytest.raises(ValueError, match=f"`{name}` must be in \\[0, 1\\] \\(probabilities\\)"):
    L.acer_policy_objective(probs["pi_tm1"], probs["mu_tm1"], a, q, q_ret)
  probs[name] = np.exp(probs[name]) * 4  # unnormalised: an entry above 1
  with pytest.raises(ValueError, match=f"`{name}` must be in \\[0, 1\\] \\(probabilities\\)"):
    L.acer_policy_objective(probs["pi_tm1"], probs["mu_tm1"], a, q, q_ret)


def test_acer_value_loss_refuses_integer_targets():
  q, a = np.zeros((3, 2, 4), np.float32), np.zeros((3, 2), np.int32)
  with pytest.raises(TypeError, match="`q_ret_tm1`"):
    L.acer_value_loss(q, a, np.ones((3, 2), np.int32))


def test_numpy_float64_hyper_parameters_keep_float32_outputs_float32_under_x64():
  """Under `jax_enable_x64` a NumPy float64 `clip_c` or `delta` made the float32 ACER
  objectives float64 (Retrace and V-trace already cast theirs to the inputs' dtype)."""
  h = np.float64
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):  # a context: x64 does not leak into the other tests
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    logits, q, v = f32(4, 2, 3), f32(4, 2, 3), f32(4, 2)
    pi = jax.nn.softmax(logits, axis=-1)
    a, d = jnp.zeros((4, 2), jnp.int32), jnp.full((4, 2), 0.9, jnp.float32)
    outs = {
        "acer_q_ret": L.acer_q_ret(q, a, v, d, pi, jnp.full((4, 2), 0.5, jnp.float32), eps=h(1e-8)),
        "acer_policy_objective": L.acer_policy_objective(
            pi, pi, a, q, v, clip_c=h(10.0), eps=h(1e-8)
        ),
        "acer_policy_loss": L.acer_policy_loss(pi, pi, a, q, v, clip_c=h(0.5)),
        "acer_trust_region_policy_loss": L.acer_trust_region_policy_loss(
            logits, f32(4, 2, 3), pi, a, q, v, clip_c=h(0.5), delta=h(0.1)
        ),
        "trust_region_projection": L.trust_region_projection(q, f32(4, 2, 3), h(0.1)),
        "acer_continuous_policy_objective": L.acer_continuous_policy_objective(
            v, v, v, v, v, v, v, clip_c=h(0.5)
        ),
    }
    for name, out in outs.items():
      for x in jax.tree.leaves(out):
        assert x.dtype in (jnp.float32, jnp.bool_), (name, x.dtype)


def test_a_clip_c_that_is_zero_in_the_inputs_dtype_is_refused():
  """clip_c is cast to the inputs' dtype: 1e-8 is 0 in float16 (a truncation at 0, which
  the contract refuses: log c = -inf in the continuous objective). A concrete one is
  refused, naming it, its value and the dtype."""
  pi = jnp.full((1, 1, 3), 1 / 3, jnp.float16)
  q = jnp.array([[[1.0, 2.0, 3.0]]], jnp.float16)
  a, q_ret = jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), jnp.float16)
  x = jnp.zeros((2, 3), jnp.float16)
  calls = [
      lambda c: L.acer_policy_objective(pi, pi, a, q, q_ret, clip_c=c),
      lambda c: L.acer_continuous_policy_objective(x, x, x, x, x, x, x, clip_c=c),
  ]
  for fn in calls:
    with pytest.raises(ValueError, match=r"^clip_c=1e-08 is 0 in float16"):
      fn(1e-8)
    assert np.isfinite(np.asarray(fn(1e-4), np.float32)).all()
    assert np.isfinite(np.asarray(fn(1e5), np.float32)).all()  # inf: truncates nothing
