"""Each check runs the target under chex's variants and catches its bug class under each.

Two bugs show under one variant only: a target that masks by multiplying (`mask * x`) returns
NaN at real steps when run eagerly, while under `jit` XLA turns the product into a select and
the NaN is gone; a target that uses NumPy on its inputs runs eagerly and cannot be traced.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import losses
from offpolicy_ac import testing
from offpolicy_ac.testing import checks

EXAMPLES = testing.default_examples(num=3)
LAMBDA = 0.8
BOTH = ("without_jit", "with_jit")


def _next_real(mask):
  return jnp.concatenate([mask[1:], jnp.zeros_like(mask[:1])])


def lambda_return(tr):
  """A λ-return cut at junctions by selecting: right under every variant."""
  lam = jnp.where(_next_real(tr.mask), LAMBDA, 0.0)
  b = jnp.where(tr.mask, tr.r_t + tr.discount_t * (1.0 - lam) * tr.v_t, 0.0)
  a = jnp.where(tr.mask, tr.discount_t * lam, 0.0)
  return jax.lax.stop_gradient(losses.reverse_linear_recurrence(a, b))


def lambda_return_times_mask(tr):
  """The same λ-return masked by multiplying: `0 * nan` is NaN when run eagerly."""
  m = tr.mask.astype(tr.r_t.dtype)
  lam = LAMBDA * _next_real(m)
  b = m * (tr.r_t + tr.discount_t * (1.0 - lam) * tr.v_t)
  a = m * tr.discount_t * lam
  return jax.lax.stop_gradient(losses.reverse_linear_recurrence(a, b))


def lambda_return_on_host(tr):
  """The right λ-return, but the mask is read with NumPy: runs eagerly, cannot be traced."""
  mask = np.asarray(tr.mask)
  lam = np.where(np.concatenate([mask[1:], np.zeros_like(mask[:1])]), LAMBDA, 0.0)
  lam = jnp.asarray(lam, tr.r_t.dtype)
  b = jnp.where(mask, tr.r_t + tr.discount_t * (1.0 - lam) * tr.v_t, 0.0)
  a = jnp.where(mask, tr.discount_t * lam, 0.0)
  return jax.lax.stop_gradient(losses.reverse_linear_recurrence(a, b))


def unmasked_lambda_return(tr):
  """No mask at all: reads through junctions under every variant."""
  a = tr.discount_t * LAMBDA
  b = tr.r_t + tr.discount_t * (1.0 - LAMBDA) * tr.v_t
  return losses.reverse_linear_recurrence(a, b)


def reference(tr):
  """The λ-return as a float64 loop over each column."""
  r, d, v, m = (np.asarray(x, np.float64) for x in (tr.r_t, tr.discount_t, tr.v_t, tr.mask))
  g = np.zeros_like(r)
  for idx in np.ndindex(*r.shape[1:]):
    nxt = 0.0
    for s in reversed(range(r.shape[0])):
      col = (s,) + idx
      if not m[col]:
        nxt = 0.0
        continue
      lam = LAMBDA if s + 1 < r.shape[0] and m[(s + 1,) + idx] else 0.0
      g[col] = nxt = r[col] + d[col] * ((1 - lam) * v[col] + lam * nxt)
  return g


def test_the_default_variants_are_eager_and_jitted():
  assert checks.VARIANTS == BOTH


def test_each_variant_wraps_fn_as_chex_does():
  seen = []

  def fn(tr):
    seen.append(isinstance(tr.r_t, jax.core.Tracer))
    return lambda_return(tr)

  testing.assert_matches_reference(fn, reference, EXAMPLES[0])
  assert seen == [False, True]  # as is, then traced once by jax.jit
  seen.clear()
  testing.assert_matches_reference(fn, reference, EXAMPLES[0], variants=("with_device",))
  assert seen == [False]


# --- the correct λ-return passes every check under both variants ----------------------


@pytest.mark.parametrize("variant", BOTH)
def test_a_correct_lambda_return_passes_every_check(variant):
  testing.assert_junction_split_invariant(lambda_return, EXAMPLES, variants=(variant,))
  testing.assert_masked_steps_ignored(lambda_return, EXAMPLES, variants=(variant,))
  testing.assert_no_gradient_through_targets(lambda_return, EXAMPLES, variants=(variant,))
  testing.assert_truncation_bootstraps(lambda_return, EXAMPLES, variants=(variant,))
  testing.assert_gradient_reaches_predictions(
      lambda tr: lambda_return(tr) - tr.v_tm1, EXAMPLES, wrt=["v_tm1"], variants=(variant,)
  )
  testing.assert_matches_reference(lambda_return, reference, EXAMPLES, variants=(variant,))


# --- multiplying by the mask: shows eagerly only -----------------------------------------


def test_multiplying_by_the_mask_gives_nan_eagerly_and_not_under_jit():
  tr = EXAMPLES[0]
  dirty = tr._replace(r_t=testing.fill_masked(tr.r_t, tr.mask, np.nan))
  real = np.asarray(tr.mask)
  assert np.isnan(np.asarray(lambda_return_times_mask(dirty))[real]).any()
  assert np.isfinite(np.asarray(jax.jit(lambda_return_times_mask)(dirty))[real]).all()


def test_masked_steps_check_catches_multiplying_by_the_mask():
  with pytest.raises(
      AssertionError,
      match=r"assert_masked_steps_ignored: .*chex variant without_jit, nan garbage .* got"
      r" np.float64\(nan\)",
  ):
    testing.assert_masked_steps_ignored(lambda_return_times_mask, EXAMPLES)


def test_docs_testing_shows_the_message_multiplying_by_the_mask_gets():
  import pathlib
  import re

  page = (pathlib.Path(__file__).parents[2] / "docs" / "testing.md").read_text()
  example = page[page.index("## Example: a bug only one variant shows") :]
  shown = re.search(r"\n# (AssertionError: .*?)\n\n", example, re.S).group(1)
  shown = " ".join(line.removeprefix("# ") for line in shown.splitlines())
  with pytest.raises(AssertionError) as raised:
    testing.assert_masked_steps_ignored(lambda_return_times_mask)  # the page's call
  pattern = ".*?".join(re.escape(part) for part in shown.split("..."))
  assert re.match(pattern, f"AssertionError: {raised.value}", re.S), (shown, raised.value)


def test_multiplying_by_the_mask_hides_under_jit_alone():
  # Why the eager variant is in the defaults: jitted alone, the leak is invisible.
  testing.assert_masked_steps_ignored(lambda_return_times_mask, EXAMPLES, variants=("with_jit",))
  with pytest.raises(AssertionError, match="chex variant without_jit"):
    testing.assert_masked_steps_ignored(
        lambda_return_times_mask, EXAMPLES, variants=("without_jit",)
    )


def test_the_other_checks_pass_multiplying_by_the_mask():
  # On clean data the product is right: only garbage at the junctions shows the bug.
  testing.assert_junction_split_invariant(lambda_return_times_mask, EXAMPLES)
  testing.assert_matches_reference(lambda_return_times_mask, reference, EXAMPLES)


# --- reading the mask with NumPy: shows under jit only -----------------------------------


CHECKS = {
    "split": lambda fn, **kw: testing.assert_junction_split_invariant(fn, EXAMPLES, **kw),
    "masked": lambda fn, **kw: testing.assert_masked_steps_ignored(fn, EXAMPLES, **kw),
    "gradient": lambda fn, **kw: testing.assert_no_gradient_through_targets(fn, EXAMPLES, **kw),
    "reference": lambda fn, **kw: testing.assert_matches_reference(fn, reference, EXAMPLES, **kw),
    "truncation": lambda fn, **kw: testing.assert_truncation_bootstraps(fn, EXAMPLES, **kw),
    "reaches": lambda fn, **kw: testing.assert_gradient_reaches_predictions(
        lambda tr: fn(tr) - tr.v_tm1, EXAMPLES, wrt=["v_tm1"], **kw
    ),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_check_catches_a_target_that_cannot_be_traced(name):
  CHECKS[name](lambda_return_on_host, variants=("without_jit",))
  with pytest.raises(
      AssertionError, match=r"chex variant with_jit.*cannot be traced \(TracerArrayConversionError"
  ):
    CHECKS[name](lambda_return_on_host)


# --- every check catches its own bug class under each variant ----------------------------


@pytest.mark.parametrize("variant", BOTH)
def test_split_check_catches_a_recursion_through_junctions(variant):
  with pytest.raises(AssertionError, match=f"chex variant {variant}, .* computed alone"):
    testing.assert_junction_split_invariant(unmasked_lambda_return, EXAMPLES, variants=(variant,))


@pytest.mark.parametrize("variant", BOTH)
def test_masked_check_catches_reading_the_junction(variant):
  with pytest.raises(AssertionError, match=f"chex variant {variant}, huge garbage"):
    testing.assert_masked_steps_ignored(unmasked_lambda_return, EXAMPLES, variants=(variant,))


@pytest.mark.parametrize("variant", BOTH)
def test_gradient_check_catches_a_missing_stop_gradient(variant):
  with pytest.raises(AssertionError, match=f"chex variant {variant}: .* gradient into r_t"):
    testing.assert_no_gradient_through_targets(
        unmasked_lambda_return, EXAMPLES, wrt=["r_t"], variants=(variant,)
    )


@pytest.mark.parametrize("variant", BOTH)
def test_reference_check_catches_a_wrong_lambda(variant):
  wrong = lambda tr: lambda_return(tr) * 1.01  # noqa: E731
  with pytest.raises(AssertionError, match=f"chex variant {variant}: output .* worst"):
    testing.assert_matches_reference(wrong, reference, EXAMPLES, variants=(variant,))


def test_a_failure_carries_chex_report():
  with pytest.raises(AssertionError, match="(?s)chex: .*Values not approximately equal"):
    testing.assert_matches_reference(lambda tr: lambda_return(tr) * 1.01, reference, EXAMPLES)


def test_non_finite_outputs_at_real_steps_fail():
  # A NaN at a real step compares equal to a NaN and would hide any difference.
  nan_target = lambda tr: lambda_return(tr) * jnp.nan  # noqa: E731
  with pytest.raises(AssertionError, match=r"is nan at index .*, an unmasked step"):
    testing.assert_masked_steps_ignored(nan_target, EXAMPLES)
  with pytest.raises(AssertionError, match=r"is nan at index .*, an unmasked step"):
    testing.assert_junction_split_invariant(nan_target, EXAMPLES)


def test_non_finite_outputs_at_masked_steps_fail_the_masked_steps_check():
  """NaN at the masked outputs only: `mask * loss` would be NaN. The split check, which
  compares real steps, lets it pass; the masked-steps check names it."""
  nan_masked = lambda tr: jnp.where(tr.mask, lambda_return(tr), jnp.nan)  # noqa: E731
  testing.assert_junction_split_invariant(nan_masked, EXAMPLES)
  message = r"is nan at index .*, a masked step of the clean example: a loss that multiplies"
  with pytest.raises(AssertionError, match=message):
    testing.assert_masked_steps_ignored(nan_masked, EXAMPLES)


@pytest.mark.parametrize("variants", [(), ("with_pmap",), ("jit",), ("with_jit", "with_jit")])
def test_checks_reject_unknown_variants(variants):
  with pytest.raises(ValueError, match="chex variants"):
    testing.assert_matches_reference(lambda_return, reference, EXAMPLES, variants=variants)


def test_without_chex_the_references_import_and_the_checks_name_the_extra():
  script = (
      "import sys\n"
      "sys.modules['chex'] = None\n"
      "import offpolicy_ac.testing as t\n"  # the references and generators need no chex
      "t.reference.vtrace, t.default_examples\n"
      "try:\n"
      "  t.assert_masked_steps_ignored\n"
      "except ImportError as e:\n"
      "  print(e)\n"
  )
  out = subprocess.run(
      [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
  )
  assert out.stdout.strip() == (
      "offpolicy_ac.testing.checks needs chex, which is not installed: "
      "pip install 'offpolicy_ac[testing]'"
  ), (out.stdout + out.stderr)


def test_with_a_broken_chex_the_checks_show_its_error(tmp_path):
  """chex installed but failing to import: the message quotes chex's own error."""
  (tmp_path / "chex").mkdir()
  (tmp_path / "chex" / "__init__.py").write_text("import toolz_is_not_installed\n")
  script = (
      "import offpolicy_ac.testing as t\n"
      "try:\n"
      "  t.assert_masked_steps_ignored\n"
      "except ImportError as e:\n"
      "  print(e)\n"
  )
  out = subprocess.run(
      [sys.executable, "-c", script],
      capture_output=True,
      text=True,
      check=True,
      timeout=120,
      env={**os.environ, "PYTHONPATH": str(tmp_path)},
  )
  assert out.stdout.strip() == (
      "offpolicy_ac.testing.checks needs chex, which is installed but fails to import "
      "(ModuleNotFoundError: No module named 'toolz_is_not_installed'). "
      "pip install 'offpolicy_ac[testing]' installs it with what it needs"
  ), (out.stdout + out.stderr)


@pytest.mark.parametrize("name", sorted(set(CHECKS) - {"reaches"}))  # "reaches" wraps fn
def test_every_check_refuses_a_target_that_takes_more_than_the_trajectory(name):
  """It failed with a bare TypeError from inside the check."""
  with pytest.raises(TypeError, match=r"fn is called as fn\(traj\) with one Trajectory, but its "
                     r"signature is \(traj, lam\) .*functools.partial"):  # fmt: skip
    CHECKS[name](lambda traj, lam: lambda_return(traj))
  CHECKS[name](lambda traj, lam=LAMBDA: lambda_return(traj))  # a default: fn(traj) works


def test_variants_given_as_one_name_are_refused():
  with pytest.raises(ValueError, match="variants must be a sequence of chex variant names"):
    testing.assert_junction_split_invariant(lambda_return, EXAMPLES, variants="with_jit")
  testing.assert_junction_split_invariant(lambda_return, EXAMPLES, variants=("with_jit",))
