"""Loading the experiment scripts whose logic lives in the script (evaluate.py, record_demos.py,
plot.py, the benchmarks) as modules, so that tests call their `main` in-process, and the
environment of the script processes that must run on the CPU. The algorithms' settings and
runs are in the package: `offpolicy_ac.presets`."""

import importlib.util
import os
import pathlib
import sys

TESTS = pathlib.Path(__file__).parent
EXPERIMENTS = TESTS.parent / "experiments"


def load_script(name):
  """experiments/<name>.py as a module (registered in sys.modules: dataclasses need it)."""
  spec = importlib.util.spec_from_file_location(f"experiment_{name}", EXPERIMENTS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def cpu_process_env():
  """os.environ (as it is now) with JAX_PLATFORMS=cpu, for a subprocess that must run on the
  CPU also on a GPU machine: jobs of two processes on localhost (standing for two hosts;
  two processes cannot share one GPU, NCCL refuses a duplicate GPU) and runs on several
  forced host devices (XLA_FLAGS=--xla_force_host_platform_device_count adds CPU devices
  only). tests/ leads PYTHONPATH, as pytest's `pythonpath` setting has it, so a test module
  run as such a subprocess imports these helpers too."""
  python_path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
  return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": python_path}
