"""The public API of `offpolicy_ac.losses` and its dependency direction."""

import ast
import importlib
import inspect
import pathlib
import subprocess
import sys

import pytest

import offpolicy_ac
from offpolicy_ac import losses

LOSSES_DIR = pathlib.Path(losses.__file__).parent
# Contract: `losses` is pure jax + chex (numpy is jax's array protocol).
ALLOWED_THIRD_PARTY = {"jax", "chex", "numpy"}

# Contract 1 names that other parts of the package rely on.
CONTRACT_NAMES = {
    "vtrace",
    "VTraceOutput",
    "retrace",
    "soft_value",
    "soft_q_targets",
}


def test_package_exposes_losses():
  assert offpolicy_ac.losses is importlib.import_module("offpolicy_ac.losses")
  assert "losses" in offpolicy_ac.__all__


@pytest.mark.parametrize("name", losses.__all__)
def test_every_exported_name_imports_and_is_callable_or_a_type(name):
  module = importlib.import_module("offpolicy_ac.losses")
  obj = getattr(module, name)
  assert callable(obj) or isinstance(obj, type)
  assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"
  exec(f"from offpolicy_ac.losses import {name}", {})  # pylint: disable=exec-used


def test_all_is_complete_and_unique():
  assert len(set(losses.__all__)) == len(losses.__all__)
  assert CONTRACT_NAMES <= set(losses.__all__)
  public = {n for n, v in vars(losses).items() if not n.startswith("_") and not inspect.ismodule(v)}
  assert public == set(losses.__all__), public ^ set(losses.__all__)


def test_exported_functions_live_in_private_modules():
  for name in losses.__all__:
    mod = getattr(losses, name).__module__
    assert mod.startswith("offpolicy_ac.losses._"), (name, mod)


def test_output_types_are_named_tuples():
  for name in (
      "VTraceOutput",
      "ImpalaLossOutput",
      "ImportanceRatios",
      "TrustRegionOutput",
      "AcerContinuousTargets",
      "RbfKernelOutput",
  ):
    cls = getattr(losses, name)
    assert issubclass(cls, tuple) and hasattr(cls, "_fields"), name


def _imports(path):
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, 0, alias.name
    elif isinstance(node, ast.ImportFrom):
      yield node.lineno, node.level, node.module or ""


@pytest.mark.parametrize("path", sorted(LOSSES_DIR.glob("*.py")), ids=lambda p: p.name)
def test_losses_imports_nothing_else_from_the_package(path):
  for lineno, level, module in _imports(path):
    where = f"{path.name}:{lineno}"
    if level:  # relative: must stay inside `losses` (`from . import x`)
      assert level == 1, f"{where} relative import leaves losses/"
      continue
    top = module.split(".")[0]
    if top == "offpolicy_ac":
      assert module == "offpolicy_ac.losses" or module.startswith(
          "offpolicy_ac.losses."
      ), f"{where} imports {module}"
    else:
      assert (
          top in ALLOWED_THIRD_PARTY or top in sys.stdlib_module_names or top == "__future__"
      ), f"{where} imports {module}"


def test_importing_losses_loads_no_other_subpackage():
  # `offpolicy_ac/__init__` may import other subpackages; the losses modules
  # themselves must not: load them under a bare package stub, without running
  # the package `__init__`, and list what else of the package got imported.
  script = (
      "import pathlib, sys, types\n"
      f"root = pathlib.Path({str(LOSSES_DIR.parent)!r})\n"
      "pkg = types.ModuleType('offpolicy_ac')\n"
      "pkg.__path__ = [str(root)]\n"
      "sys.modules['offpolicy_ac'] = pkg\n"
      "import offpolicy_ac.losses\n"
      "print(sorted(m for m in sys.modules if m.startswith('offpolicy_ac.')\n"
      "             and not m.startswith('offpolicy_ac.losses')))\n"
  )
  out = subprocess.run(
      [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
  )
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
