"""Test configuration: strict rank promotion and float64 references.

`jax_numpy_rank_promotion='raise'` makes any implicit broadcast between arrays
of different ranks an error, so a shape mistake cannot hide behind
broadcasting.
"""

import os

# No persistent compilation cache in ~/.cache from the tests (the scripts' runner turns
# it on: `training.experiment.enable_compilation_cache`); set before jax reads it.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "")

import jax  # noqa: E402
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")

try:  # Hypothesis profile: bounded and deterministic in CI.
  from hypothesis import HealthCheck
  from hypothesis import settings

  settings.register_profile(
      "ci",
      max_examples=25,
      deadline=None,
      derandomize=True,
      suppress_health_check=[HealthCheck.too_slow],
  )
  settings.register_profile(
      "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
  )
  settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # pragma: no cover
  pass


@pytest.fixture(autouse=True)
def _strict_rank_promotion():
  with jax.numpy_rank_promotion("raise"):
    yield
