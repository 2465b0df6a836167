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
    testing.assert_matches_reference(
        fn, lambda tr: testing.reference.vtrace(
            tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, np.exp(tr.log_rho_tm1), mask=tr.mask))

Modules:
  trajectories: the `Trajectory` layout and NumPy generators (no hypothesis).
  reference: float64 NumPy loop references of every target in `losses`.
  checks: the `assert_...` checks (re-exported here).
  strategies: hypothesis strategies; needs `pip install 'offpolicy_ac[testing]'` and is
    imported on first access.
"""

import importlib

from offpolicy_ac.testing import checks
from offpolicy_ac.testing import reference
from offpolicy_ac.testing import trajectories
from offpolicy_ac.testing.checks import assert_junction_split_invariant
from offpolicy_ac.testing.checks import assert_masked_steps_ignored
from offpolicy_ac.testing.checks import assert_matches_reference
from offpolicy_ac.testing.checks import assert_no_gradient_through_targets
from offpolicy_ac.testing.trajectories import JUNCTION
from offpolicy_ac.testing.trajectories import MID
from offpolicy_ac.testing.trajectories import TERMINATION
from offpolicy_ac.testing.trajectories import TRUNCATION
from offpolicy_ac.testing.trajectories import Trajectory
from offpolicy_ac.testing.trajectories import default_examples
from offpolicy_ac.testing.trajectories import fill_masked
from offpolicy_ac.testing.trajectories import garble
from offpolicy_ac.testing.trajectories import junction_layout
from offpolicy_ac.testing.trajectories import layout_from_kinds
from offpolicy_ac.testing.trajectories import random_layout
from offpolicy_ac.testing.trajectories import random_trajectory
from offpolicy_ac.testing.trajectories import trajectory_from_layout

__all__ = [
    "JUNCTION",
    "MID",
    "TERMINATION",
    "TRUNCATION",
    "Trajectory",
    "assert_junction_split_invariant",
    "assert_masked_steps_ignored",
    "assert_matches_reference",
    "assert_no_gradient_through_targets",
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


def __getattr__(name):
  if name == "strategies":
    return importlib.import_module("offpolicy_ac.testing.strategies")
  raise AttributeError(f"module 'offpolicy_ac.testing' has no attribute {name!r}")
