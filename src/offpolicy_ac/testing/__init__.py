"""A property-testing kit for target functions over time-major trajectories.

Test your own target (a return, a TD error, a trace) the way the library tests
its own: on random `[T, *batch]` trajectories with terminations, truncations
and masked auto-reset (junction) steps, against a float64 loop reference, and
with properties any correct target has.

    import jax.numpy as jnp
    import numpy as np
    from offpolicy_ac import losses, testing

    def fn(tr):  # the protocol: fn(Trajectory) -> pytree of [T, *batch, ...]
      return losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t,
                           jnp.exp(tr.log_rho_tm1), mask=tr.mask)

    testing.assert_junction_split_invariant(fn)
    testing.assert_masked_steps_ignored(fn)
    testing.assert_no_gradient_through_targets(lambda tr: fn(tr).errors)
    testing.assert_gradient_reaches_predictions(lambda tr: fn(tr).errors, wrt=["v_tm1"])
    testing.assert_truncation_bootstraps(fn)
    testing.assert_zero_at_masked_steps(lambda tr: fn(tr).errors)
    testing.assert_matches_reference(
        fn, lambda tr: testing.reference.vtrace(
            tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, np.exp(tr.log_rho_tm1), mask=tr.mask))

Each check runs `fn` under chex's variants, without and with `jax.jit` by
default (`variants=("without_jit", "with_jit")`), and compares with chex's
assertions.

Modules:
  trajectories: the `Trajectory` layout and NumPy generators (no extra needed).
  reference: float64 NumPy loop references of every target in `losses` (no extra needed).
  checks: the `assert_...` checks (re-exported here); need chex.
  strategies: hypothesis strategies; need hypothesis.

`checks`, the `assert_...` names and `strategies` are imported on first access;
chex and hypothesis come with `pip install 'offpolicy_ac[testing]'`.
"""

import importlib
from typing import TYPE_CHECKING

from offpolicy_ac.testing import reference
from offpolicy_ac.testing import trajectories
from offpolicy_ac.testing.trajectories import JUNCTION
from offpolicy_ac.testing.trajectories import MID
from offpolicy_ac.testing.trajectories import TERMINATION
from offpolicy_ac.testing.trajectories import TRUNCATION
from offpolicy_ac.testing.trajectories import Trajectory
from offpolicy_ac.testing.trajectories import check_layout
from offpolicy_ac.testing.trajectories import default_examples
from offpolicy_ac.testing.trajectories import fill_masked
from offpolicy_ac.testing.trajectories import garble
from offpolicy_ac.testing.trajectories import junction_layout
from offpolicy_ac.testing.trajectories import layout_from_kinds
from offpolicy_ac.testing.trajectories import random_layout
from offpolicy_ac.testing.trajectories import random_trajectory
from offpolicy_ac.testing.trajectories import trajectory_from_layout

if TYPE_CHECKING:  # for type checkers and the API docs; at run time `__getattr__` loads them
  from offpolicy_ac.testing import checks
  from offpolicy_ac.testing import strategies
  from offpolicy_ac.testing.checks import assert_gradient_reaches_predictions
  from offpolicy_ac.testing.checks import assert_junction_split_invariant
  from offpolicy_ac.testing.checks import assert_masked_steps_get_no_gradient
  from offpolicy_ac.testing.checks import assert_masked_steps_ignored
  from offpolicy_ac.testing.checks import assert_matches_reference
  from offpolicy_ac.testing.checks import assert_no_gradient_through_targets
  from offpolicy_ac.testing.checks import assert_truncation_bootstraps
  from offpolicy_ac.testing.checks import assert_zero_at_masked_steps

__all__ = [
    "JUNCTION",
    "MID",
    "TERMINATION",
    "TRUNCATION",
    "Trajectory",
    "assert_gradient_reaches_predictions",
    "assert_junction_split_invariant",
    "assert_masked_steps_get_no_gradient",
    "assert_masked_steps_ignored",
    "assert_matches_reference",
    "assert_no_gradient_through_targets",
    "assert_truncation_bootstraps",
    "assert_zero_at_masked_steps",
    "check_layout",
    "checks",
    "default_examples",
    "fill_masked",
    "garble",
    "junction_layout",
    "layout_from_kinds",
    "random_layout",
    "random_trajectory",
    "reference",
    "strategies",
    "trajectories",
    "trajectory_from_layout",
]


# Imported on first access: they need the testing extra (chex, hypothesis).
_LAZY_MODULES = ("checks", "strategies")
_CHECKS = (
    "assert_gradient_reaches_predictions",
    "assert_junction_split_invariant",
    "assert_masked_steps_get_no_gradient",
    "assert_masked_steps_ignored",
    "assert_matches_reference",
    "assert_no_gradient_through_targets",
    "assert_truncation_bootstraps",
    "assert_zero_at_masked_steps",
)


def __getattr__(name):
  if name in _LAZY_MODULES:
    return importlib.import_module(f"offpolicy_ac.testing.{name}")
  if name in _CHECKS:
    return getattr(importlib.import_module("offpolicy_ac.testing.checks"), name)
  raise AttributeError(f"module 'offpolicy_ac.testing' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(__all__))
