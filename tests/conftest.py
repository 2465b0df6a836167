"""Test configuration: strict rank promotion and float64 references.

`jax_numpy_rank_promotion='raise'` makes any implicit broadcast between arrays
of different ranks an error, so a shape mistake cannot hide behind
broadcasting.
"""

import faulthandler
import os
import shutil
import tempfile
from typing import Optional

_CACHE_MARK = "OFFPOLICY_AC_TESTS_JAX_CACHE"


def _cache_for_the_scripts() -> Optional[str]:
  """A persistent compilation cache for the scripts the tests start: a temporary directory
  of this pytest process, removed when its session ends (the scripts' runner would use
  ~/.cache: `training.experiment.enable_compilation_cache`). Many tests launch alike runs,
  which then compile each program once instead of once per launch. This process keeps no
  cache (its compiles are few alike, and storing them costs more than it saves). A
  directory the user set is kept (set and empty: no cache); one a parent pytest process set
  (xdist's controller) is replaced, so that workers do not share one (JAX writes its
  entries without a lock). Returns the directory to give the scripts (None: the user's
  setting)."""
  given = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if given is not None and given != os.environ.get(_CACHE_MARK):
    return None
  path = tempfile.mkdtemp(prefix="offpolicy_ac-tests-jax-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = ""  # read by jax at import: none here
  return path


_scripts_cache = _cache_for_the_scripts()

import jax  # noqa: E402

if _scripts_cache is not None:  # what the tests' subprocesses inherit
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_CACHE_MARK] = _scripts_cache

import pytest  # noqa: E402

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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """The long learning runs (marked slow) and the fresh installs (each pip command has its
  own limit: tests/test_install.py) run without pyproject.toml's faulthandler_timeout."""
  if item.get_closest_marker("slow") or item.get_closest_marker("install"):
    faulthandler.cancel_dump_traceback_later()


def pytest_unconfigure():
  if _scripts_cache is not None:  # (an xdist worker ends without running atexit)
    shutil.rmtree(_scripts_cache, ignore_errors=True)
