"""Garbage at masked steps (NaN, +-inf) reaches no gradient at the real steps.

`jnp.where(mask, f(x), 0)` hides a masked NaN from the value but not from the gradient
(0 * f'(nan) is nan): every loss replaces such inputs before any arithmetic.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import losses
from offpolicy_ac import testing

EXAMPLES = testing.default_examples(num=3)  # batch ranks 0, 1, 2, each with junctions
GARBAGE = ("nan", "inf")


def _rho(tr):
  # The ratios themselves, not exp(log_rho): the adapter's own exp(inf) would have a NaN
  # gradient. Between 0 and 2, so that the truncations at 1 act.
  return 2.0 * tr.mu_t


TARGETS = {
    "vtrace": lambda tr, sg: losses.vtrace(
        tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, _rho(tr), mask=tr.mask, lambda_=0.9,
        stop_target_gradients=sg),
    "general_off_policy_returns": lambda tr, sg: losses.general_off_policy_returns(
        tr.q_t[..., 0], tr.v_t, tr.r_t, tr.discount_t, tr.mu_t, mask=tr.mask,
        stop_target_gradients=sg),
    "retrace_targets": lambda tr, sg: losses.retrace_targets(
        tr.q_t, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t, mask=tr.mask, lambda_=0.9,
        stop_target_gradients=sg),
    "retrace": lambda tr, sg: losses.retrace(
        tr.q_tm1, tr.q_t, tr.a_tm1, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t,
        mask=tr.mask, stop_target_gradients=sg),
    "soft_q_targets": lambda tr, sg: losses.soft_q_targets(
        tr.r_t, tr.discount_t, tr.q_t, alpha=0.5, lambda_=0.7, mask=tr.mask,
        stop_target_gradients=sg),
    "soft_nstep_targets": lambda tr, sg: losses.soft_nstep_targets(
        tr.r_t, tr.discount_t, tr.q_t, alpha=0.3, n=3, mask=tr.mask, stop_target_gradients=sg),
    "sql_nstep_td_error": lambda tr, sg: losses.sql_nstep_td_error(
        tr.q_tm1, tr.a_tm1, tr.r_t, tr.discount_t, tr.q_t, alpha=0.3, n=2, mask=tr.mask,
        stop_target_gradients=sg),
    # No stop_target_gradients argument: the targets are always constants.
    "acer_q_ret": lambda tr, sg: losses.acer_q_ret(
        tr.q_t, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t, mask=tr.mask),
    "acer_continuous_targets": lambda tr, sg: losses.acer_continuous_targets(
        tr.q_t[..., 0], tr.v_t, tr.r_t, tr.discount_t, tr.log_rho_tm1, action_dim=2,
        mask=tr.mask),
}  # fmt: skip
WITHOUT_SG_ARGUMENT = ("acer_q_ret", "acer_continuous_targets")


@pytest.mark.parametrize(
    "name, sg",
    [(name, sg) for name in sorted(TARGETS) for sg in (True, False)
     if sg or name not in WITHOUT_SG_ARGUMENT],
)  # fmt: skip
def test_masked_garbage_changes_no_gradient(name, sg):
  testing.assert_masked_steps_get_no_gradient(
      lambda tr: TARGETS[name](tr, sg), EXAMPLES, garbage=GARBAGE
  )


def _garbled(inputs, mask, value):
  """`inputs` (a dict of [T, ...] or [T, ..., A] arrays) with `value` at the masked steps."""
  return {k: jnp.asarray(testing.fill_masked(x, mask, value)) for k, x in inputs.items()}


def _assert_same_finite_gradients(loss, inputs, mask):
  """The gradient of the scalar `loss(inputs)` is finite, 0 at the masked steps and the
  clean inputs' gradient, with NaN, inf and -inf at the masked steps of every input."""
  grad = jax.jit(jax.grad(loss))
  clean = grad({k: jnp.asarray(x) for k, x in inputs.items()})
  for value in (np.nan, np.inf, -np.inf):
    dirty = grad(_garbled(inputs, mask, value))
    for k in inputs:
      g = np.asarray(dirty[k])
      assert np.all(np.isfinite(g)), (k, value)
      m = testing.fill_masked(np.ones(g.shape, bool), mask, False)
      assert np.all(g[~m] == 0), (k, value)
      np.testing.assert_allclose(g, np.asarray(clean[k]), rtol=1e-5, atol=1e-6, err_msg=k)


def _impala_inputs(tr):
  return {k: getattr(tr, k) for k in ("v_tm1", "v_t", "r_t", "discount_t")}


@pytest.mark.parametrize("surrogate_clip", [None, 0.2])
@pytest.mark.parametrize("tr", EXAMPLES[1:], ids=["rank1", "rank2"])
def test_impala_loss_categorical_gradients_ignore_masked_logits(tr, surrogate_clip):
  inputs = dict(_impala_inputs(tr), logits=tr.q_tm1, mu_logits=tr.q_t)

  def loss(p):
    return losses.impala_loss_categorical(
        p["logits"], p["mu_logits"], tr.a_tm1, p["v_tm1"], p["v_t"], p["r_t"], p["discount_t"],
        mask=tr.mask, surrogate_clip=surrogate_clip, lambda_=0.9).loss  # fmt: skip

  _assert_same_finite_gradients(loss, inputs, tr.mask)


@pytest.mark.parametrize("shared_log_std", [False, True], ids=["per_step", "shared"])
@pytest.mark.parametrize("tr", EXAMPLES[1:], ids=["rank1", "rank2"])
def test_impala_loss_gaussian_gradients_ignore_masked_steps(tr, shared_log_std):
  rng = np.random.default_rng(0)
  shape = tr.r_t.shape + (2,)
  inputs = dict(_impala_inputs(tr), log_mu=tr.log_rho_tm1,
                mean=rng.normal(size=shape), a=rng.normal(size=shape))  # fmt: skip
  inputs = {k: np.asarray(x, np.float32) for k, x in inputs.items()}
  log_std = jnp.asarray([0.1, -0.2]) if shared_log_std else None
  if not shared_log_std:
    inputs["log_std"] = 0.1 * rng.normal(size=shape).astype(np.float32)

  def loss(p, log_std=log_std):
    return losses.impala_loss_gaussian(
        p["mean"], p.get("log_std", log_std), p["log_mu"], p["a"], p["v_tm1"], p["v_t"],
        p["r_t"], p["discount_t"], mask=tr.mask).loss  # fmt: skip

  _assert_same_finite_gradients(loss, inputs, tr.mask)
  if shared_log_std:  # a [D] parameter, read at every step: no NaN from the masked ones
    g = jax.grad(lambda s: loss(_garbled(inputs, tr.mask, np.nan), s))(log_std)
    np.testing.assert_allclose(g, jax.grad(lambda s: loss(inputs, s))(log_std), rtol=1e-5)


def _probabilities(logits):
  return np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1))


def _acer_discrete_inputs(tr):
  return {"pi": tr.pi_t, "mu": _probabilities(tr.q_t), "logits": tr.q_tm1,
          "avg_logits": tr.q_t, "q": tr.q_tm1, "q_ret": tr.v_tm1}  # fmt: skip


def _acer_continuous_inputs(tr):
  rng = np.random.default_rng(1)
  names = ("log_pi_a", "log_pi_sample", "log_rho_a", "log_rho_sample", "q_opc", "q_sample",
           "v", "q_tilde_a", "q_ret")  # fmt: skip
  return {k: rng.normal(size=tr.r_t.shape).astype(np.float32) for k in names}


# The ACER per-step losses, each as loss(inputs, tr, mask) -> [T, ...].
ACER_PER_STEP = {
    "acer_policy_objective": (_acer_discrete_inputs, lambda p, tr, mask: (
        losses.acer_policy_objective(p["pi"], p["mu"], tr.a_tm1, p["q"], p["q_ret"],
                                     clip_c=0.8, mask=mask))),
    "acer_policy_loss": (_acer_discrete_inputs, lambda p, tr, mask: losses.acer_policy_loss(
        p["pi"], p["mu"], tr.a_tm1, p["q"], p["q_ret"], clip_c=1.2, mask=mask)),
    "acer_trust_region_policy_loss": (_acer_discrete_inputs, lambda p, tr, mask: (
        losses.acer_trust_region_policy_loss(
            p["logits"], p["avg_logits"], p["mu"], tr.a_tm1, p["q"], p["q_ret"], clip_c=0.8,
            delta=0.1, mask=mask).surrogate)),
    "acer_value_loss": (_acer_discrete_inputs, lambda p, tr, mask: losses.acer_value_loss(
        p["q"], tr.a_tm1, p["q_ret"], mask=mask)),
    "acer_continuous_policy_objective": (_acer_continuous_inputs, lambda p, tr, mask: (
        losses.acer_continuous_policy_objective(
            p["log_pi_a"], p["log_pi_sample"], p["log_rho_a"], p["log_rho_sample"], p["q_opc"],
            p["q_sample"], p["v"], clip_c=0.5, mask=mask))),
    "acer_continuous_value_losses": (_acer_continuous_inputs, lambda p, tr, mask: (
        losses.acer_continuous_value_losses(p["q_tilde_a"], p["v"], p["q_ret"], p["log_rho_a"],
                                            mask=mask))),
    # A generic objective and KL that read garbage of their own at the masked steps.
    "trust_region_surrogate": (_acer_discrete_inputs, lambda p, tr, mask: (
        losses.trust_region_surrogate(
            lambda s: jnp.sum(s * p["q"], axis=-1), lambda s: jnp.sum(s * s * p["pi"], axis=-1),
            p["logits"], delta=0.05, mask=mask).surrogate)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ACER_PER_STEP))
@pytest.mark.parametrize("tr", EXAMPLES[1:], ids=["rank1", "rank2"])
def test_acer_per_step_losses_ignore_masked_steps(name, tr):
  make_inputs, per_step = ACER_PER_STEP[name]
  inputs = make_inputs(tr)
  w = jnp.asarray(tr.mask, jnp.float32)
  _assert_same_finite_gradients(
      lambda p: losses.weighted_mean(per_step(p, tr, tr.mask), w), inputs, tr.mask
  )
  # The values: those of the unmasked computation at the real steps, 0 at the masked ones.
  clean = {k: jnp.asarray(x) for k, x in inputs.items()}
  unmasked = np.asarray(per_step(clean, tr, None))
  masked = np.asarray(per_step(_garbled(inputs, tr.mask, np.nan), tr, tr.mask))
  np.testing.assert_allclose(masked[tr.mask], unmasked[tr.mask], rtol=1e-6)
  assert np.all(masked[~tr.mask] == 0)


def test_acer_mask_of_another_shape_is_refused():
  tr = EXAMPLES[1]
  with pytest.raises(ValueError, match="mask.*`a_tm1`"):
    losses.acer_value_loss(tr.q_tm1, tr.a_tm1, tr.v_tm1, mask=tr.mask[:, :1])


def test_acer_value_loss_is_0_at_a_masked_step_whose_action_is_out_of_range():
  # Under jit the range is not checked: the selected Q is NaN there, the loss 0.
  q, a = jnp.zeros((3, 2)), jnp.asarray([0, 7, 1])
  mask = jnp.asarray([True, False, True])
  loss = jax.jit(lambda q, a: losses.acer_value_loss(q, a, jnp.ones(3), mask=mask))(q, a)
  np.testing.assert_array_equal(loss, [0.5, 0.0, 0.5])
