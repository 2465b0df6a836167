"""The scripts keep JAX's persistent compilation cache: a second launch of the same run
loads its programs instead of compiling them."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]

pytest.importorskip("gymnax")


def _launch(run_dir, env):
  cmd = [sys.executable, str(ROOT / "experiments" / "impala.py"), "--env-id",
         "gymnax:CartPole-v1", "--total-env-steps", "640", "--num-envs", "4",
         "--unroll-length", "8", "--log-every", "320", "--eval-every", "640",
         "--eval-episodes", "2", "--run-dir", str(run_dir)]  # fmt: skip
  subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=300)


def _files(directory):
  return sorted(p.name for p in directory.rglob("*") if p.is_file())


def test_a_second_launch_compiles_nothing_new(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env["JAX_RAISE_PERSISTENT_CACHE_ERRORS"] = "1"  # a cache that fails fails the run
  # Every program stored, however fast it compiles: with the 0.2 s threshold, one that
  # compiles in about that time is stored by one launch and not the other.
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
  cache = tmp_path / "cache" / "offpolicy_ac" / "jax"
  _launch(tmp_path / "first", env)
  stored = _files(cache)
  assert stored, "the first launch stored no programs"
  _launch(tmp_path / "second", env)
  assert _files(cache) == stored  # every program of the second launch was a cache hit


def test_an_empty_cache_variable_turns_the_cache_off(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
  env["JAX_COMPILATION_CACHE_DIR"] = ""
  _launch(tmp_path / "run", env)
  assert not (tmp_path / "cache" / "offpolicy_ac").exists()


@pytest.fixture
def cache_config():
  """JAX's process-wide cache settings, restored after the test."""
  import jax

  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {name: getattr(jax.config, name) for name in names}
  yield jax.config
  for name, value in before.items():
    jax.config.update(name, value)


def test_a_directory_chosen_in_code_is_kept(monkeypatch, cache_config):
  from offpolicy_ac.training.experiment import enable_compilation_cache

  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  cache_config.update("jax_compilation_cache_dir", "/some/where")
  assert enable_compilation_cache() == "/some/where"
  assert cache_config.jax_compilation_cache_dir == "/some/where"
  cache_config.update("jax_compilation_cache_dir", "")  # set and empty: no cache
  assert enable_compilation_cache() is None
  assert cache_config.jax_compilation_cache_dir is None


def test_a_directory_from_the_environment_also_lowers_the_minimum_compile_time(
    monkeypatch, cache_config
):
  """JAX stores only programs that compiled for 1 s by default: the runner lowers that to
  0.2 s wherever the directory comes from (a user's JAX_COMPILATION_CACHE_DIR included)."""
  from offpolicy_ac.training.experiment import enable_compilation_cache

  monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
  cache_config.update("jax_compilation_cache_dir", "/from/the/environment")
  cache_config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  assert enable_compilation_cache() == "/from/the/environment"
  assert cache_config.jax_persistent_cache_min_compile_time_secs == 0.2
  cache_config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1.0")  # the user's
  enable_compilation_cache()
  assert cache_config.jax_persistent_cache_min_compile_time_secs == 1.0
