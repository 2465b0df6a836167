"""Loading the experiment scripts as modules (tests call their `main` in-process)."""

import importlib.util
import pathlib
import sys

EXPERIMENTS = pathlib.Path(__file__).parents[1] / "experiments"


def load_script(name):
  """experiments/<name>.py as a module (registered in sys.modules: dataclasses need it)."""
  spec = importlib.util.spec_from_file_location(f"experiment_{name}", EXPERIMENTS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module
