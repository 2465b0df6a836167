"""Each check passes on the library's targets and fails on a deliberately broken one."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from offpolicy_ac import losses
from offpolicy_ac import testing
from offpolicy_ac.testing import reference as ref

EXAMPLES = testing.default_examples(num=3)


def lib_vtrace(tr, **kw):
  rho = jnp.exp(tr.log_rho_tm1)
  return losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, rho, mask=tr.mask, **kw)


def ref_vtrace(tr):
  return ref.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, np.exp(tr.log_rho_tm1), mask=tr.mask)


def rlax_vtrace(tr):
  """rlax's V-trace on [T, *batch]: one vmapped column each, the mask as sample_mask."""
  t, batch = tr.r_t.shape[0], tr.r_t.shape[1:]
  cols = lambda x: jnp.reshape(x, (t, -1))  # noqa: E731
  column = lambda v_tm1, v_t, r_t, d_t, rho, m: rlax.vtrace_td_error_and_advantage(  # noqa: E731
      v_tm1, v_t, r_t, d_t, rho, sample_mask=m
  )
  out = jax.vmap(column, in_axes=1, out_axes=1)(
      cols(tr.v_tm1),
      cols(tr.v_t),
      cols(tr.r_t),
      cols(tr.discount_t),
      cols(jnp.exp(tr.log_rho_tm1)),
      cols(tr.mask),
  )
  return jax.tree_util.tree_map(lambda x: jnp.reshape(x, (t,) + batch), out)


def lib_soft_q(tr):
  return losses.soft_q_targets(tr.r_t, tr.discount_t, tr.q_t, alpha=0.5, lambda_=0.7, mask=tr.mask)


def lib_retrace(tr):
  return losses.retrace_targets(
      tr.q_t, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t, mask=tr.mask, lambda_=0.9
  )


def ref_retrace(tr):
  return ref.retrace(
      tr.q_tm1, tr.q_t, tr.a_tm1, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t, tr.mask, 0.9
  )[1]


def lib_acer_q_ret(tr):
  return losses.acer_q_ret(tr.q_t, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t, mask=tr.mask)


def lib_soft_nstep(tr):
  return losses.soft_nstep_targets(tr.r_t, tr.discount_t, tr.q_t, alpha=0.3, n=3, mask=tr.mask)


def unmasked_lambda_return(tr):
  """A lambda-return written without any mask: it reads through junctions."""
  a = tr.discount_t * 0.8
  b = tr.r_t + tr.discount_t * 0.2 * tr.v_t
  return jax.lax.stop_gradient(losses.reverse_linear_recurrence(a, b, tr.v_t[-1] * 0.0))


LIBRARY_TARGETS = {
    "vtrace": lib_vtrace,
    "soft_q_targets": lib_soft_q,
    "retrace_targets": lib_retrace,
    "acer_q_ret": lib_acer_q_ret,
    "soft_nstep_targets": lib_soft_nstep,
}


# --- assert_junction_split_invariant ----------------------------------------


@pytest.mark.parametrize("name", sorted(LIBRARY_TARGETS))
def test_split_invariance_holds_for_library_targets(name):
  testing.assert_junction_split_invariant(LIBRARY_TARGETS[name], EXAMPLES)


def test_split_invariance_catches_rlax_vtrace_leaking_across_episodes():
  with pytest.raises(AssertionError, match=r"assert_junction_split_invariant: .* worst at index"):
    testing.assert_junction_split_invariant(lambda tr: rlax_vtrace(tr).q_estimate, EXAMPLES)
  # The same data through the library's masked V-trace passes.
  testing.assert_junction_split_invariant(lambda tr: lib_vtrace(tr).q_estimate, EXAMPLES)


def test_rlax_leak_names_the_output():
  with pytest.raises(AssertionError, match=r"output \.(errors|q_estimate) differs"):
    testing.assert_junction_split_invariant(rlax_vtrace, EXAMPLES)


def test_rlax_leak_is_the_bootstrap_before_a_truncation_junction():
  # One column: a truncated episode of 3 steps, the junction, a second episode.
  kind = np.array([0, 0, testing.TRUNCATION, testing.JUNCTION, 0, 0], np.int8)
  d, mask = testing.layout_from_kinds(kind, 0.9)
  tr = testing.trajectory_from_layout(np.random.default_rng(3), d, mask, kind, 2)
  with pytest.raises(AssertionError, match=r"worst at index \(2,\)"):
    testing.assert_junction_split_invariant(lambda tr: rlax_vtrace(tr).q_estimate, tr)


def test_split_invariance_catches_an_unmasked_recursion():
  with pytest.raises(AssertionError, match="steps .* computed alone"):
    testing.assert_junction_split_invariant(unmasked_lambda_return, EXAMPLES)


def test_split_invariance_catches_mixing_between_columns():
  with pytest.raises(AssertionError):
    testing.assert_junction_split_invariant(lambda tr: lib_soft_q(tr) + jnp.mean(tr.v_t), EXAMPLES)


def test_split_invariance_without_junctions_still_separates_columns():
  kind = np.zeros((4, 2), np.int8)
  d, mask = testing.layout_from_kinds(kind, 0.9)
  tr = testing.trajectory_from_layout(np.random.default_rng(0), d, mask, kind)
  testing.assert_junction_split_invariant(lib_soft_q, tr)
  with pytest.raises(AssertionError, match=r"batch index \(\d,\)"):
    testing.assert_junction_split_invariant(lambda tr: lib_soft_q(tr) + jnp.mean(tr.v_t), tr)


def test_checks_reject_reduced_outputs():
  reduced = lambda tr: jnp.mean(lib_soft_q(tr))  # noqa: E731
  with pytest.raises(ValueError, match=r"per step, shaped \[T, \*batch"):
    testing.assert_junction_split_invariant(reduced, EXAMPLES)
  # The reference check too (it compared a reduced loss whole, junction garbage included).
  with pytest.raises(ValueError, match=r"assert_matches_reference: .* per step, shaped"):
    testing.assert_matches_reference(reduced, lambda tr: np.mean(tr.r_t), EXAMPLES)


def test_split_failures_name_the_index_in_the_example():
  # A wrong value at step 5 of batch column 0, on the full batch only: the segment of
  # steps 5..9 computed alone differs at its first step, which is (5, 0) in the example.
  ex = testing.default_examples()[1]
  assert ex.r_t.shape == (10, 3) and bool(np.all(ex.mask[5:, 0])) and not ex.mask[4, 0]
  bump = jnp.zeros((10, 3)).at[5, 0].set(1.0)
  bad = lambda tr: lib_soft_q(tr) + (bump if tr.r_t.shape == (10, 3) else 0.0)  # noqa: E731
  with pytest.raises(
      AssertionError, match=r"batch index \(0,\), steps 5\.\.9: .* worst at index \(5, 0\)"
  ) as failure:
    testing.assert_junction_split_invariant(bad, ex, variants=("without_jit",))
  # "got" is the full batch's (the bumped value), "expected" the segment's computed alone.
  number = r"(?:np\.float64\()?([-\d.e]+)"
  found = re.search(rf"got {number}\)?, expected {number}", str(failure.value))
  got, expected = found.groups()
  assert float(got) - float(expected) == pytest.approx(1.0, abs=1e-4)


# --- assert_masked_steps_ignored ---------------------------------------------


@pytest.mark.parametrize("name", sorted(LIBRARY_TARGETS))
def test_masked_garbage_is_ignored_by_library_targets(name):
  testing.assert_masked_steps_ignored(LIBRARY_TARGETS[name], EXAMPLES, garbage=("huge", "nan"))


def test_masked_garbage_catches_multiplying_by_the_mask():
  def times_mask(tr):
    """A lambda-return cut at junctions by multiplying the trace by the next step's mask.

    Right for finite garbage, but 0 * nan is nan: the junction's NaN gets through.
    """
    next_mask = jnp.concatenate([tr.mask[1:], jnp.zeros_like(tr.mask[:1])]).astype(jnp.float32)
    a = 0.8 * tr.discount_t * next_mask
    b = tr.r_t + tr.discount_t * (1.0 - 0.8 * next_mask) * tr.v_t
    return jax.lax.stop_gradient(losses.reverse_linear_recurrence(a, b))

  testing.assert_masked_steps_ignored(times_mask, EXAMPLES, garbage=("huge",))
  with pytest.raises(AssertionError, match="nan garbage"):
    testing.assert_masked_steps_ignored(times_mask, EXAMPLES, garbage=("nan",))
  with pytest.raises(AssertionError, match="inf garbage"):  # 0 * inf is nan too
    testing.assert_masked_steps_ignored(times_mask, EXAMPLES, garbage=("inf",))


def test_masked_garbage_catches_reading_the_junction():
  with pytest.raises(AssertionError, match="assert_masked_steps_ignored"):
    testing.assert_masked_steps_ignored(unmasked_lambda_return, EXAMPLES)


def test_masked_garbage_tolerance_is_scaled_to_the_real_steps_only():
  """A leak of 2e-3 from the junction's reward into the step before it is caught whatever
  fn writes at the junction itself (there the kit's own garbage, up to 1e6, once scaled the
  tolerance)."""

  def leaking(tr, junction_output):
    g = lib_soft_q(tr)
    next_mask = jnp.concatenate([tr.mask[1:], jnp.ones_like(tr.mask[:1])])
    next_r = jnp.concatenate([tr.r_t[1:], jnp.zeros_like(tr.r_t[:1])])
    g = g + jnp.where(tr.mask & ~next_mask, 2e-3 * jnp.clip(next_r, -1.0, 1.0), 0.0)
    return jnp.where(tr.mask, g, tr.r_t if junction_output else 0.0)

  for junction_output in (False, True):
    with pytest.raises(AssertionError, match="assert_masked_steps_ignored"):
      testing.assert_masked_steps_ignored(
          lambda tr: leaking(tr, junction_output), EXAMPLES, garbage=("huge",)
      )


def test_masked_garbage_validates_its_settings():
  with pytest.raises(ValueError, match="unknown"):
    testing.assert_masked_steps_ignored(lib_soft_q, EXAMPLES, fields=["mask"])
  with pytest.raises(ValueError, match="garbage"):
    testing.assert_masked_steps_ignored(lib_soft_q, EXAMPLES, garbage=("zero",))


# --- assert_masked_steps_get_no_gradient -------------------------------------


def one_step_td(tr, double_where):
  """r + gamma * v_t - v_tm1, its outputs selected away at the masked steps; with
  `double_where` its inputs are too, before the arithmetic."""
  if double_where:
    tr = tr._replace(**{f: jnp.where(tr.mask, getattr(tr, f), 0.0)
                        for f in ("r_t", "discount_t", "v_t", "v_tm1")})  # fmt: skip
  return jnp.where(tr.mask, tr.r_t + tr.discount_t * tr.v_t - tr.v_tm1, 0.0)


def test_masked_gradient_holds_for_a_double_where():
  testing.assert_masked_steps_get_no_gradient(lambda tr: one_step_td(tr, True), EXAMPLES)


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_masked_gradient_catches_a_single_where(kind):
  # The value is right (the outputs check passes) but d/dv_t = discount_t * 0 is nan.
  testing.assert_masked_steps_ignored(lambda tr: one_step_td(tr, False), EXAMPLES)
  with pytest.raises(AssertionError, match=f"{kind} garbage.*gradient into"):
    testing.assert_masked_steps_get_no_gradient(
        lambda tr: one_step_td(tr, False), EXAMPLES, garbage=(kind,)
    )


def test_masked_gradient_catches_a_gradient_into_a_masked_step():
  def reads_the_junction(tr):  # a real step reads the next one's v_t, a junction's too
    next_v = jnp.concatenate([tr.v_t[1:], jnp.zeros_like(tr.v_t[:1])])
    return jnp.where(tr.mask, tr.r_t + 1e-3 * next_v, 0.0)

  with pytest.raises(AssertionError, match="gradient into v_t is .* masked step"):
    testing.assert_masked_steps_get_no_gradient(reads_the_junction, EXAMPLES, garbage=("huge",))


def test_masked_gradient_validates_its_settings():
  with pytest.raises(ValueError, match=r"floating fields from .*, got \['a_t'\]"):
    testing.assert_masked_steps_get_no_gradient(lib_soft_q, EXAMPLES, wrt="a_t")
  with pytest.raises(ValueError, match="garbage"):
    testing.assert_masked_steps_get_no_gradient(lib_soft_q, EXAMPLES, garbage=("zero",))


# --- assert_no_gradient_through_targets --------------------------------------


def test_no_gradient_holds_for_library_targets():
  testing.assert_no_gradient_through_targets(lambda tr: lib_vtrace(tr).errors, EXAMPLES)
  testing.assert_no_gradient_through_targets(lambda tr: lib_vtrace(tr).q_estimate, EXAMPLES)
  for name in ("soft_q_targets", "retrace_targets", "acer_q_ret", "soft_nstep_targets"):
    testing.assert_no_gradient_through_targets(LIBRARY_TARGETS[name], EXAMPLES[:1])


def test_no_gradient_catches_targets_without_stop_gradient():
  with pytest.raises(AssertionError, match="gradient into .*stop_gradient missing"):
    testing.assert_no_gradient_through_targets(
        lambda tr: lib_vtrace(tr, stop_target_gradients=False).errors, EXAMPLES
    )

  def hand_written(tr):  # a one-step target that forgets its stop_gradient
    return tr.r_t + tr.discount_t * jnp.where(tr.mask, tr.v_t, 0.0)

  with pytest.raises(AssertionError, match="v_t"):
    testing.assert_no_gradient_through_targets(hand_written, EXAMPLES, wrt="v_t")
  testing.assert_no_gradient_through_targets(
      lambda tr: jax.lax.stop_gradient(hand_written(tr)), EXAMPLES, wrt=["v_t"]
  )


def test_no_gradient_validates_wrt():
  with pytest.raises(ValueError, match="floating fields"):
    testing.assert_no_gradient_through_targets(lib_soft_q, EXAMPLES, wrt=["a_t"])


# --- assert_gradient_reaches_predictions ------------------------------------


def lib_retrace_errors(tr):
  return losses.retrace(tr.q_tm1, tr.q_t, tr.a_tm1, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t,
                        tr.mu_t, mask=tr.mask, lambda_=0.9)  # fmt: skip


def ref_retrace_errors(tr):
  return ref.retrace(
      tr.q_tm1, tr.q_t, tr.a_tm1, tr.a_t, tr.r_t, tr.discount_t, tr.pi_t, tr.mu_t, tr.mask, 0.9
  )[0]


def vtrace_value_loss(tr, v_tm1=None):
  """V-trace's per-step value loss 1/2 (v_s - V(x_s))^2 (as `impala_loss` squares it)."""
  v_tm1 = tr.v_tm1 if v_tm1 is None else v_tm1
  return 0.5 * jnp.square(lib_vtrace(tr._replace(v_tm1=v_tm1)).errors)


def soft_q_td_errors(tr):
  """The soft λ-return minus Q(x_s, a_s), 0 at the masked steps."""
  q_a = losses.take_action(tr.q_tm1, tr.a_tm1)
  return jnp.where(tr.mask, lib_soft_q(tr) - q_a, 0.0)


# The library's errors and losses, each with the predictions it trains.
LIBRARY_LOSSES = {
    "vtrace": (lib_vtrace, ["v_tm1"]),  # errors, pg_advantage and q_estimate
    "vtrace_value_loss": (vtrace_value_loss, ["v_tm1"]),
    "retrace": (lib_retrace_errors, ["q_tm1"]),
    "sql_nstep_td_error": (
        lambda tr: losses.sql_nstep_td_error(
            tr.q_tm1, tr.a_tm1, tr.r_t, tr.discount_t, tr.q_t, alpha=0.3, n=3, mask=tr.mask
        ),
        ["q_tm1"],
    ),
    "acer_value_loss": (
        lambda tr: losses.acer_value_loss(tr.q_tm1, tr.a_tm1, lib_acer_q_ret(tr), mask=tr.mask),
        ["q_tm1"],
    ),
    "soft_q_td_errors": (soft_q_td_errors, ["q_tm1"]),
}


def stopped_value_loss(tr):
  """Mutant: V-trace's value loss with an extra stop_gradient on the prediction v_tm1."""
  return vtrace_value_loss(tr, v_tm1=jax.lax.stop_gradient(tr.v_tm1))


def stopped_retrace(tr):
  """Mutant: a copy of `losses.retrace` with an extra stop_gradient on Q(x_s, a_s)."""
  targets = lib_retrace(tr)
  q_a_tm1 = jax.lax.stop_gradient(losses.take_action(tr.q_tm1, tr.a_tm1))
  return jnp.where(tr.mask, targets - q_a_tm1, jnp.zeros((), q_a_tm1.dtype))


@pytest.mark.parametrize("name", sorted(LIBRARY_LOSSES))
def test_gradient_reaches_the_predictions_of_library_losses(name):
  loss, wrt = LIBRARY_LOSSES[name]
  testing.assert_gradient_reaches_predictions(loss, EXAMPLES, wrt=wrt)


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
@pytest.mark.parametrize("mutant, field", [
    (stopped_value_loss, "v_tm1"), (stopped_retrace, "q_tm1")
], ids=["value_loss", "retrace"])  # fmt: skip
def test_gradient_reaches_catches_a_stop_gradient_on_the_prediction(mutant, field, variant):
  with pytest.raises(
      AssertionError,
      match=rf"chex variant {variant}: no gradient reaches {field} at unmasked step \(0,\)",
  ):
    testing.assert_gradient_reaches_predictions(mutant, EXAMPLES, wrt=field, variants=(variant,))


def test_a_stop_gradient_on_the_prediction_passes_the_other_checks():
  """Why the check exists: the mutants' outputs are the library's, and they stop more
  gradient, not less."""
  for mutant in (stopped_value_loss, stopped_retrace):
    testing.assert_junction_split_invariant(mutant, EXAMPLES)
    testing.assert_masked_steps_ignored(mutant, EXAMPLES)
    testing.assert_no_gradient_through_targets(mutant, EXAMPLES)
  testing.assert_matches_reference(stopped_retrace, ref_retrace_errors, EXAMPLES)


@pytest.mark.parametrize("name", sorted(LIBRARY_LOSSES))
def test_library_errors_and_losses_are_zero_at_masked_steps(name):
  testing.assert_zero_at_masked_steps(LIBRARY_LOSSES[name][0], EXAMPLES)


def unmasked_td_errors(tr):
  """Mutant: `soft_q_td_errors` without its select: the junction row's error, bootstrapped
  from the next episode's start, stays in the output."""
  return lib_soft_q(tr) - losses.take_action(tr.q_tm1, tr.a_tm1)


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
def test_zero_at_masked_steps_catches_an_error_left_at_a_junction(variant):
  with pytest.raises(AssertionError, match=rf"chex variant {variant}: output \(the array\) is "
                     r"\S+ at index \(\d+,\), a masked step \(\d+ of \d+ masked entries are "
                     r"not 0\): select it away"):  # fmt: skip
    testing.assert_zero_at_masked_steps(unmasked_td_errors, EXAMPLES, variants=(variant,))


def test_an_output_not_per_step_is_named_with_what_to_return():
  """A reduced loss is told to return targets; a batch-major output (told the same before)
  to return it time-major."""
  traj = testing.random_trajectory(np.random.default_rng(0), t=10, batch_shape=(3,))
  errors = lambda tr: tr.r_t + tr.discount_t * tr.v_t - tr.v_tm1  # noqa: E731
  with pytest.raises(ValueError, match=r"output \(the array\) has shape \(\); .* = \(10, 3\) \+ "
                     r"\(\.\.\.\)\. Return targets, not reduced losses\."):  # fmt: skip
    testing.assert_zero_at_masked_steps(lambda tr: jnp.mean(errors(tr)), [traj])
  with pytest.raises(ValueError, match=r"output \(the array\) has shape \(3, 10\); .* Its leading "
                     r"axes are those of \[T, \*batch\] in another order: return it time-major"):  # fmt: skip
    testing.assert_zero_at_masked_steps(lambda tr: errors(tr).T, [traj])


def td_error_times_mask(tr):
  """Mutant: a one-step TD error zeroed at masked steps by multiplying by the mask, which
  keeps a NaN of the masked data (`0 * nan` is `nan`)."""
  return tr.mask * (tr.r_t + tr.discount_t * tr.v_t - tr.v_tm1)


def test_an_error_multiplied_by_the_mask_fails_both_masked_step_checks():
  """Both passed it: the clean example's masked outputs are 0, and a NaN at a masked step
  of the garbled example reaches only that masked step."""
  with pytest.raises(AssertionError, match=r"nan garbage .* at masked steps: output \(the "
                     r"array\) is nan at index \(\d+,\), a masked step of the garbled example"):  # fmt: skip
    testing.assert_masked_steps_ignored(td_error_times_mask, EXAMPLES, variants=("without_jit",))
  with pytest.raises(AssertionError, match=r", NaN at its masked steps, chex variant without_jit:"
                     r" output \(the array\) is nan at index \(\d+,\), a masked step"):  # fmt: skip
    testing.assert_zero_at_masked_steps(td_error_times_mask, EXAMPLES, variants=("without_jit",))
  selected = lambda tr: jnp.where(tr.mask, td_error_times_mask(tr), 0.0)  # noqa: E731
  testing.assert_masked_steps_ignored(selected, EXAMPLES)
  testing.assert_zero_at_masked_steps(selected, EXAMPLES)


def test_an_error_left_at_a_junction_passes_the_other_checks():
  """Why the check exists: they compare the real steps only."""
  testing.assert_junction_split_invariant(unmasked_td_errors, EXAMPLES)
  testing.assert_masked_steps_ignored(unmasked_td_errors, EXAMPLES)
  testing.assert_masked_steps_get_no_gradient(unmasked_td_errors, EXAMPLES)
  testing.assert_gradient_reaches_predictions(unmasked_td_errors, EXAMPLES, wrt="q_tm1")


def test_gradient_reaches_names_a_non_finite_gradient():
  def single_where(tr):  # the unused branch is sqrt(0): its zero cotangent times inf is nan
    zero = tr.v_tm1 - jax.lax.stop_gradient(tr.v_tm1)
    return jnp.where(tr.mask, lib_vtrace(tr).errors, jnp.sqrt(zero))

  with pytest.raises(
      AssertionError, match=r"gradient into v_tm1 is np.float32\(nan\) at index \(0,\), an unmasked"
  ):
    testing.assert_gradient_reaches_predictions(single_where, EXAMPLES, wrt=["v_tm1"])


def test_gradient_reaches_names_the_field_the_loss_does_not_read():
  with pytest.raises(AssertionError, match="no gradient reaches q_tm1 at unmasked step"):
    testing.assert_gradient_reaches_predictions(vtrace_value_loss, EXAMPLES, wrt=["q_tm1"])


def test_gradient_reaches_validates_wrt():
  with pytest.raises(ValueError, match="floating fields"):
    testing.assert_gradient_reaches_predictions(soft_q_td_errors, EXAMPLES, wrt=["a_tm1"])
  with pytest.raises(ValueError, match="floating fields"):
    testing.assert_gradient_reaches_predictions(soft_q_td_errors, EXAMPLES, wrt=[])


# --- assert_truncation_bootstraps --------------------------------------------


def vtrace_done_at_time_limits(tr):
  """Mutant: V-trace with `discount = gamma * (1 - done)`, `done` taking in truncations."""
  last = (tr.kind == testing.TERMINATION) | (tr.kind == testing.TRUNCATION)
  return lib_vtrace(tr._replace(discount_t=jnp.where(last, 0.0, tr.discount_t)))


def soft_q_cut_at_episode_ends(tr):
  """Mutant: a copy of `losses.soft_q_targets` that bootstraps only where the next step
  is real, so an episode's LAST step never does, truncated or not (nor the window's last
  step: a segment computed alone ends the same way, so the split check passes it)."""
  mask_next = jnp.concatenate([tr.mask[1:], jnp.zeros_like(tr.mask[:1])])
  discount = jnp.where(tr.mask & mask_next, tr.discount_t, 0.0)
  r_t = jnp.where(tr.mask, tr.r_t, 0.0)
  v_t = jnp.where(discount != 0, losses.soft_value(tr.q_t, 0.5), 0.0)
  lam = jnp.where(mask_next, 0.7, 0.0)
  b = jnp.where(tr.mask, r_t + discount * (1.0 - lam) * v_t, 0.0)
  a = jnp.where(tr.mask, discount * lam, 0.0)
  return jax.lax.stop_gradient(losses.reverse_linear_recurrence(a, b))


TRUNCATION_TARGETS = {
    **LIBRARY_TARGETS,
    "one_step_soft_q": lambda tr: losses.soft_q_targets(
        tr.r_t, tr.discount_t, tr.q_t, alpha=0.5, mask=tr.mask
    ),
    "vtrace_lambda_0": lambda tr: lib_vtrace(tr, lambda_=0.0),
    "values_shifted_by_one": lambda tr: lambda_return_from_values(tr),
}


@pytest.mark.parametrize("name", sorted(TRUNCATION_TARGETS))
def test_truncation_bootstraps_in_library_targets(name):
  testing.assert_truncation_bootstraps(TRUNCATION_TARGETS[name], EXAMPLES)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_truncation_bootstraps_in_half_precision(dtype):
  rng = np.random.default_rng(4)
  examples = [testing.random_trajectory(rng, 10, (3,), 3, dtype=dtype) for _ in range(3)]
  testing.assert_truncation_bootstraps(lib_vtrace, examples)
  testing.assert_truncation_bootstraps(lib_soft_q, examples)


def test_truncation_bootstraps_passes_correct_targets_at_gamma_zero_or_tiny():
  """At gamma 0 a truncation does not bootstrap at all, and at gamma 1e-9 its bootstrap is
  below any tolerance: a correct target is not required to change there."""
  for gamma in (0.0, 1e-9):
    rng = np.random.default_rng(5)
    examples = [testing.random_trajectory(rng, 10, (3,), 3, p_truncation=0.4, gamma=gamma)
                for _ in range(3)]  # fmt: skip
    assert any((ex.kind == testing.TRUNCATION).any() for ex in examples)
    testing.assert_truncation_bootstraps(lib_vtrace, examples)
    testing.assert_truncation_bootstraps(lib_soft_q, examples)
  # The mutant is still caught when gamma is small but the move shows.
  rng = np.random.default_rng(5)
  examples = [testing.random_trajectory(rng, 10, (3,), 3, p_truncation=0.4, gamma=1e-3,
                                        dtype=np.float64) for _ in range(3)]  # fmt: skip
  with pytest.raises(AssertionError, match="unchanged at truncated step"):
    testing.assert_truncation_bootstraps(vtrace_done_at_time_limits, examples)


def soft_q_ignoring_terminations(tr):
  """Mutant: soft-Q targets with discount gamma at every real step, terminations too."""
  return lib_soft_q(tr._replace(discount_t=jnp.where(tr.mask, 0.9, tr.discount_t)))


_UNCHANGED_AT_THE_TRUNCATION = (
    r": output {} is unchanged at truncated step \(2,\) .*\(v_t and q_t at step \(2,\),"
    r" v_tm1 and q_tm1 at the junction row after it\)"
)

_CHANGED_BY_THE_TERMINATION = (
    r", the final observations of the terminated steps \[\(7,\)\] moved .* a termination must"
    r" not bootstrap.* differs"
)


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
@pytest.mark.parametrize("mutant, message", [
    (vtrace_done_at_time_limits, _UNCHANGED_AT_THE_TRUNCATION.format(r"\.errors")),
    (soft_q_cut_at_episode_ends, _UNCHANGED_AT_THE_TRUNCATION.format(r"\(the array\)")),
    (soft_q_ignoring_terminations, _CHANGED_BY_THE_TERMINATION),
], ids=["vtrace_time_limit_as_termination", "soft_q_time_limit_as_termination",
        "soft_q_termination_bootstraps"])  # fmt: skip
def test_truncation_bootstraps_catches_a_wrong_bootstrap_at_an_episode_end(
    mutant, message, variant
):
  with pytest.raises(AssertionError, match=rf"chex variant {variant}" + message):
    testing.assert_truncation_bootstraps(mutant, EXAMPLES, variants=(variant,))


def test_a_time_limit_taken_for_a_termination_passes_the_structural_checks():
  """Why the check exists: the episode is cut at the right step, only its bootstrap is
  lost; the reference alone saw it."""
  for mutant in (vtrace_done_at_time_limits, soft_q_cut_at_episode_ends):
    testing.assert_junction_split_invariant(mutant, EXAMPLES)
    testing.assert_masked_steps_ignored(mutant, EXAMPLES)
  testing.assert_no_gradient_through_targets(
      lambda tr: vtrace_done_at_time_limits(tr).errors, EXAMPLES
  )
  with pytest.raises(AssertionError, match="assert_matches_reference"):
    testing.assert_matches_reference(vtrace_done_at_time_limits, ref_vtrace, EXAMPLES)


def test_truncation_bootstraps_validates_perturbation():
  for perturbation in (0.0, -1.0, np.inf, np.nan):
    with pytest.raises(ValueError, match="perturbation"):
      testing.assert_truncation_bootstraps(lib_soft_q, EXAMPLES, perturbation=perturbation)


# --- assert_matches_reference ------------------------------------------------


def test_matches_reference_for_library_targets():
  testing.assert_matches_reference(lib_vtrace, ref_vtrace, EXAMPLES)
  testing.assert_matches_reference(lib_retrace, ref_retrace, EXAMPLES)
  testing.assert_matches_reference(
      lib_soft_q,
      lambda tr: ref.soft_q_targets(tr.r_t, tr.discount_t, tr.q_t, 0.5, 0.7, tr.mask),
      EXAMPLES,
      compare_masked=True,  # the library's targets are zero there, as the reference's
  )


def test_matches_reference_catches_a_wrong_target_and_names_it():
  wrong = lambda tr: lib_vtrace(tr, clip_pg_rho_threshold=0.5)  # noqa: E731
  with pytest.raises(
      AssertionError, match=r"chex variant without_jit: output \.pg_advantage differs .*worst"
  ):
    testing.assert_matches_reference(wrong, ref_vtrace, EXAMPLES)


def test_matches_reference_fails_where_both_sides_are_nan():
  """chex takes NaN as close to NaN: a NaN output at a compared step fails on its own."""
  nan_target = lambda tr: jnp.log(tr.r_t * 0) * 0  # noqa: E731
  nan_reference = lambda tr: np.full(np.shape(tr.r_t), np.nan)  # noqa: E731
  with pytest.raises(
      AssertionError, match=r"output \(the array\) is NaN at index \(0,\), and so is the expected"
  ):
    testing.assert_matches_reference(nan_target, nan_reference, EXAMPLES[0])


def test_matches_reference_refuses_complex_outputs_on_either_side():
  """A complex array cast to float64 lost its imaginary part: `r + 5j` passed against `r`."""
  real = lambda tr: tr.r_t  # noqa: E731
  with pytest.raises(
      ValueError, match=r"output \(the array\) is complex \(complex64\).*two outputs"
  ):
    testing.assert_matches_reference(lambda tr: tr.r_t + 5j, real, EXAMPLES[0])
  with pytest.raises(ValueError, match=r"the reference's output 0 is complex \(complex64\)"):
    testing.assert_matches_reference(real, lambda tr: np.asarray(tr.r_t) + 5j, EXAMPLES[0])
  zeroed = lambda tr: jnp.where(tr.mask, tr.r_t, 0.0) + 7j  # noqa: E731
  with pytest.raises(ValueError, match=r"assert_zero_at_masked_steps: output .* is complex"):
    testing.assert_zero_at_masked_steps(zeroed, EXAMPLES[0])


def test_matches_reference_counts_and_shows_compared_entries_only():
  """An infinite reference: the masked entries (not compared) were counted as differing,
  and the worst one shown was a masked step's; equal infinities are close."""
  tr = EXAMPLES[0]
  real = np.asarray(tr.mask, bool)
  inf = lambda x: np.full(np.shape(x.r_t), np.inf)  # noqa: E731
  with pytest.raises(AssertionError) as failed:
    testing.assert_matches_reference(lambda x: x.r_t, inf, tr)
  first = int(np.argmax(real))
  assert (
      f"differs at {int(real.sum())} of {int(real.sum())} compared entries; worst at "
      f"index ({first},)" in str(failed.value)
      and "(not finite)" in str(failed.value)
  )
  testing.assert_matches_reference(lambda x: jnp.full_like(x.r_t, jnp.inf), inf, tr)


def test_matches_reference_checks_the_reference_is_a_function_of_one_trajectory():
  fn = lambda tr: tr.r_t  # noqa: E731
  with pytest.raises(TypeError, match=r"reference must be a function reference\(traj\)"):
    testing.assert_matches_reference(fn, None, EXAMPLES[0])
  with pytest.raises(TypeError, match=r"reference is called as reference\(traj\) with one"):
    testing.assert_matches_reference(fn, lambda tr, g: tr.r_t, EXAMPLES[0])


def test_matches_reference_runs_the_jitted_function():
  calls = []

  def fn(tr):
    calls.append(isinstance(tr.r_t, jax.core.Tracer))
    return lib_soft_q(tr)

  def reference(tr):
    return ref.soft_q_targets(tr.r_t, tr.discount_t, tr.q_t, 0.5, 0.7, tr.mask)

  testing.assert_matches_reference(fn, reference, EXAMPLES[0])
  assert calls == [False, True]
  with pytest.raises(AssertionError, match="1 arrays, the reference 2"):
    testing.assert_matches_reference(fn, lambda tr: (reference(tr), reference(tr)), EXAMPLES[0])


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_matches_reference_default_tolerance_fits_half_precision(dtype):
  """A correct target on half-precision trajectories is a few epsilons off the float64
  reference (1e-4 failed it); a target that is wrong still fails."""
  examples = [
      testing.random_trajectory(np.random.default_rng(seed), 12, (3,), 3, dtype=dtype)
      for seed in range(4)
  ]
  testing.assert_matches_reference(lib_vtrace, ref_vtrace, examples)
  testing.assert_matches_reference(lib_retrace, ref_retrace, examples)
  wrong = lambda tr: lib_vtrace(tr, clip_pg_rho_threshold=0.5)  # noqa: E731
  with pytest.raises(AssertionError, match=r"output \.pg_advantage differs"):
    testing.assert_matches_reference(wrong, ref_vtrace, examples)


def test_matches_reference_tolerance_is_scaled_to_the_data():
  tr = EXAMPLES[0]
  big = lambda x: 1e4 * lib_soft_q(x)  # noqa: E731
  expected = lambda x: 1e4 * ref.soft_q_targets(x.r_t, x.discount_t, x.q_t, 0.5, 0.7, x.mask)  # noqa: E731
  testing.assert_matches_reference(big, expected, tr)
  with pytest.raises(AssertionError):
    testing.assert_matches_reference(lambda x: big(x) * (1 + 1e-3), expected, tr)


def test_the_protocol_adapter_of_docs_testing_passes_the_checks_it_says():
  """docs/testing.md's template adapter passes every check but the one the page names."""
  import pathlib
  import re

  page = (pathlib.Path(__file__).parents[2] / "docs" / "testing.md").read_text()
  protocol = page[page.index("## The protocol") : page.index("## The checks")]
  namespace = {}
  exec(re.search(r"```python\n(.*?)```", protocol, re.S).group(1), namespace)  # noqa: S102
  fn = namespace["fn"]
  testing.assert_junction_split_invariant(fn)
  testing.assert_masked_steps_ignored(fn, garbage=("huge", "nan", "inf"))
  testing.assert_masked_steps_get_no_gradient(fn)
  testing.assert_no_gradient_through_targets(lambda tr: fn(tr).errors)
  testing.assert_gradient_reaches_predictions(fn, wrt=["v_tm1"])
  testing.assert_truncation_bootstraps(fn)
  with pytest.raises(AssertionError, match="carry a gradient into log_rho_tm1"):
    testing.assert_no_gradient_through_targets(fn)


def lambda_return_from_values(tr, lam=0.8, shifted=True):
  """A λ-return that bootstraps from `values[1:]`, as the library's agents pass values: at
  a truncation it reads the junction row's `v_tm1`, the final observation's value.
  `shifted=False` reads `v_t` (equal: the values are chained)."""
  values = jnp.concatenate([tr.v_tm1, tr.v_t[-1:]])[1:] if shifted else tr.v_t
  nxt = jnp.concatenate([tr.mask[1:], jnp.zeros_like(tr.mask[:1])])
  lam = jnp.where(nxt, lam, 0.0)
  discount = jnp.where(tr.mask, tr.discount_t, 0.0)
  b = jnp.where(tr.mask, tr.r_t + discount * (1.0 - lam) * values, 0.0)
  return losses.reverse_linear_recurrence(jnp.where(tr.mask, discount * lam, 0.0), b)


def test_a_target_reading_values_shifted_by_one_passes_every_check():
  """The junction row's predictions are the final observation's values (chained), not
  garbage: bootstrapping a truncation from them is right (it was a false alarm)."""
  reference = lambda tr: lambda_return_from_values(tr, shifted=False)  # noqa: E731
  testing.assert_matches_reference(lambda_return_from_values, reference)
  testing.assert_junction_split_invariant(lambda_return_from_values)
  testing.assert_masked_steps_ignored(lambda_return_from_values, garbage=("huge", "nan", "inf"))
  testing.assert_masked_steps_get_no_gradient(lambda_return_from_values)
  # Asked for, the predictions are garbled too, and the shifted read is caught.
  with pytest.raises(AssertionError, match=r"huge garbage in \['v_tm1'\]"):
    testing.assert_masked_steps_ignored(lambda_return_from_values, fields=["v_tm1"])


def test_gradient_checks_take_bfloat16_trajectories():
  rng = np.random.default_rng(1)
  examples = [testing.random_trajectory(rng, 8, (2,), 3, dtype=jnp.bfloat16) for _ in range(2)]
  errors = lambda tr: lib_vtrace(tr).errors  # noqa: E731
  testing.assert_no_gradient_through_targets(errors, examples, wrt=["v_t"])
  testing.assert_masked_steps_get_no_gradient(lambda tr: lib_soft_q(tr), examples)
  infinite = lambda tr: jnp.where(tr.kind == testing.TERMINATION, jnp.inf, errors(tr))  # noqa: E731
  with pytest.raises(AssertionError, match=r"is inf at index .*, an unmasked step"):
    testing.assert_junction_split_invariant(infinite, examples)


def test_huge_garbage_stays_finite_in_float16(recwarn):
  rng = np.random.default_rng(2)
  examples = [testing.random_trajectory(rng, 8, (2,), 3, dtype=np.float16) for _ in range(2)]
  testing.assert_masked_steps_ignored(lib_soft_q, examples, garbage=("huge",))
  assert not [w for w in recwarn if "overflow" in str(w.message)]


def test_outputs_cast_down_are_held_to_the_trajectorys_precision():
  """A float32 trajectory and bfloat16 outputs: the tolerance is float32's, so a wrong λ
  (0.85 for 0.9) does not hide in bfloat16's 0.0625."""
  reference = lambda tr: ref.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,  # noqa: E731
                                    np.exp(tr.log_rho_tm1), mask=tr.mask, lambda_=0.9)  # fmt: skip
  cast = lambda lam: lambda tr: jax.tree_util.tree_map(  # noqa: E731
      lambda x: x.astype(jnp.bfloat16), lib_vtrace(tr, lambda_=lam)
  )
  with pytest.raises(AssertionError, match="differs"):
    testing.assert_matches_reference(cast(0.85), reference, EXAMPLES)
  with pytest.raises(AssertionError, match="tolerance 0.000"):  # bfloat16 rounding alone
    testing.assert_matches_reference(cast(0.9), reference, EXAMPLES)


@pytest.mark.parametrize("kinds, fragment", [
    ([0, testing.TRUNCATION, 0, 0], r"step \(2,\) .*: a LAST step is followed by a real step"),
    ([0, 7], r"step \(1,\) .*: kind 7 is not"),
])  # fmt: skip
def test_layouts_no_environment_makes_are_refused(kinds, fragment):
  kind = np.asarray(kinds, np.int8)
  with pytest.raises(ValueError, match=fragment):
    testing.layout_from_kinds(kind, 0.9)
  with pytest.raises(ValueError, match=fragment):
    testing.trajectory_from_layout(np.random.default_rng(0), np.full(kind.shape, 0.9),
                                   kind != testing.JUNCTION, kind)  # fmt: skip
  good = np.asarray([testing.JUNCTION, 0, testing.TERMINATION, testing.JUNCTION, 0], np.int8)
  testing.check_layout(good != testing.JUNCTION, good)
  padded = np.asarray([0, testing.TERMINATION, testing.JUNCTION, testing.JUNCTION, 0], np.int8)
  testing.check_layout(np.asarray([True, True, False, False, False]), padded)  # padding
  with pytest.raises(ValueError, match=r"step \(3,\) .*: a JUNCTION is unmasked"):
    testing.check_layout(np.asarray([True, True, False, True, True]), padded)


def test_float64_data_without_x64_is_held_to_float32s_tolerance():
  """JAX computes float64 data in float32 unless x64 is on: a correct target passes."""
  assert not jax.config.jax_enable_x64
  rng = np.random.default_rng(5)
  examples = [testing.random_trajectory(rng, 8, (2,), 3, dtype=np.float64) for _ in range(2)]
  testing.assert_matches_reference(lib_vtrace, ref_vtrace, examples)
  testing.assert_junction_split_invariant(lib_soft_q, examples)


# --- tolerances and the references' validation -------------------------------

TOLERANT_CHECKS = {
    "assert_junction_split_invariant": lambda **kw: testing.assert_junction_split_invariant(
        lib_soft_q, EXAMPLES[0], **kw
    ),
    "assert_masked_steps_ignored": lambda **kw: testing.assert_masked_steps_ignored(
        lib_soft_q, EXAMPLES[0], **kw
    ),
    "assert_masked_steps_get_no_gradient": lambda **kw: (
        testing.assert_masked_steps_get_no_gradient(lambda tr: one_step_td(tr, True), EXAMPLES[0],
                                                    **kw)  # fmt: skip
    ),
    "assert_matches_reference": lambda **kw: testing.assert_matches_reference(
        lib_vtrace, ref_vtrace, EXAMPLES[0], **kw
    ),
    "assert_truncation_bootstraps": lambda **kw: testing.assert_truncation_bootstraps(
        lib_soft_q, EXAMPLES[0], **kw
    ),
    "assert_no_gradient_through_targets": lambda **kw: (
        testing.assert_no_gradient_through_targets(lib_soft_q, EXAMPLES[0], **kw)
    ),
}


@pytest.mark.parametrize("value", [-1e-3, np.nan, np.inf, "1e-3"])
@pytest.mark.parametrize("check", sorted(TOLERANT_CHECKS))
def test_checks_refuse_a_negative_or_non_finite_tolerance(check, value):
  """A negative or NaN tolerance failed a correct target (an AssertionError that blamed the
  target), an infinite one passed any target; now each is refused by name."""
  names = ["atol"] if check == "assert_no_gradient_through_targets" else ["rtol", "atol"]
  for name in names:
    with pytest.raises(ValueError, match=rf"^{check}: {name} must be a finite number >= 0"):
      TOLERANT_CHECKS[check](**{name: value})
  TOLERANT_CHECKS[check](**{name: 1e-3 for name in names})  # a valid one still runs the check


T3 = np.zeros(3, np.float32)
BAD_DISCOUNT = np.array([0.9, 1.5, 0.9], np.float32)
Q3, PI3 = np.zeros((3, 2), np.float32), np.full((3, 2), 0.5, np.float32)
A3 = np.zeros(3, np.int32)
# (what is bad, the library's call, the reference's call): each must raise the same message.
REFUSED_BY_BOTH = [
    ("vtrace discount", lambda: losses.vtrace(T3, T3, T3, BAD_DISCOUNT, T3 + 1),
     lambda: ref.vtrace(T3, T3, T3, BAD_DISCOUNT, T3 + 1)),
    ("vtrace lambda_", lambda: losses.vtrace(T3, T3, T3, T3, T3, lambda_=1.5),
     lambda: ref.vtrace(T3, T3, T3, T3, T3, lambda_=1.5)),
    ("vtrace clip_c_threshold", lambda: losses.vtrace(T3, T3, T3, T3, T3, clip_c_threshold=0.0),
     lambda: ref.vtrace(T3, T3, T3, T3, T3, clip_c_threshold=0.0)),
    ("general_off_policy_returns discount",
     lambda: losses.general_off_policy_returns(T3, T3, T3, -BAD_DISCOUNT, T3),
     lambda: ref.general_off_policy_returns(T3, T3, T3, -BAD_DISCOUNT, T3)),
    ("retrace lambda_",
     lambda: losses.retrace(Q3, Q3, A3, A3, T3, T3, PI3, T3 + 0.5, lambda_=-0.1),
     lambda: ref.retrace(Q3, Q3, A3, A3, T3, T3, PI3, T3 + 0.5, lambda_=-0.1)),
    ("acer_q_ret discount", lambda: losses.acer_q_ret(Q3, A3, T3, BAD_DISCOUNT, PI3, T3 + 0.5),
     lambda: ref.acer_q_ret(Q3, A3, T3, BAD_DISCOUNT, PI3, T3 + 0.5)),
    ("acer_policy_objective clip_c",
     lambda: losses.acer_policy_objective(PI3, PI3, A3, Q3, T3, clip_c=-1.0),
     lambda: ref.acer_policy_objective(PI3, PI3, A3, Q3, T3, clip_c=-1.0)),
    ("trust_region_projection delta", lambda: losses.trust_region_projection(Q3, Q3, -1.0),
     lambda: ref.trust_region_projection(Q3, Q3, -1.0)),
    ("soft_value alpha", lambda: losses.soft_value(Q3, np.inf), lambda: ref.soft_value(Q3, np.inf)),
    ("soft_q_targets alpha", lambda: losses.soft_q_targets(T3, T3, Q3, alpha=0.0),
     lambda: ref.soft_q_targets(T3, T3, Q3, 0.0)),
    ("soft_q_targets discount", lambda: losses.soft_q_targets(T3, BAD_DISCOUNT, Q3, alpha=1.0),
     lambda: ref.soft_q_targets(T3, BAD_DISCOUNT, Q3, 1.0)),
    ("soft_nstep_targets alpha", lambda: losses.soft_nstep_targets(T3, T3, Q3, alpha=np.nan, n=2),
     lambda: ref.soft_nstep_targets(T3, T3, Q3, np.nan, 2)),
    ("soft_nstep_targets n 0", lambda: losses.soft_nstep_targets(T3, T3, Q3, alpha=1.0, n=0),
     lambda: ref.soft_nstep_targets(T3, T3, Q3, 1.0, 0)),
    ("soft_nstep_targets n 2.5",
     lambda: losses.soft_nstep_targets(T3, T3, Q3, alpha=1.0, n=2.5),
     lambda: ref.soft_nstep_targets(T3, T3, Q3, 1.0, 2.5)),
    ("acer_continuous_targets action_dim",
     lambda: losses.acer_continuous_targets(T3, T3, T3, T3, T3, action_dim=0),
     lambda: ref.acer_continuous_targets(T3, T3, T3, T3, T3, 0)),
    ("importance_sampled_soft_value alpha",
     lambda: losses.importance_sampled_soft_value(Q3, 0.0, np.inf),
     lambda: ref.importance_sampled_soft_value(Q3, 0.0, np.inf)),
]  # fmt: skip


@pytest.mark.parametrize("what, library, reference", REFUSED_BY_BOTH,
                         ids=[c[0] for c in REFUSED_BY_BOTH])  # fmt: skip
def test_references_refuse_what_the_library_refuses_with_its_message(what, library, reference):
  """The float64 references computed what the library refuses (a discount outside [0, 1],
  lambda outside [0, 1], a threshold or alpha <= 0 or infinite, a count n or action_dim
  below 1): numbers, NaN, or zeros."""
  with pytest.raises(ValueError) as refused:
    library()
  with pytest.raises(ValueError, match=f"^{re.escape(str(refused.value))}$"):
    reference()


def test_references_read_a_masked_steps_discount_as_the_library_does():
  mask = np.array([True, False, True])
  ref.vtrace(T3, T3, T3, np.array([0.9, 7.0, 0.9]), T3 + 1, mask=mask)  # never used: accepted
  with pytest.raises(ValueError, match=r"`discount_t` must be in \[0, 1\].* at index \(0,\)"):
    ref.vtrace(T3, T3, T3, np.array([7.0, 0.9, 0.9]), T3 + 1, mask=mask)
