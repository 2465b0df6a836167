"""The public names of `offpolicy_ac.testing` and what it depends on."""

import ast
import pathlib
import sys

import pytest

import offpolicy_ac
from offpolicy_ac import testing

TESTING_DIR = pathlib.Path(testing.__file__).parent


def test_testing_is_a_lazy_subpackage():
  assert "testing" in offpolicy_ac.__all__
  assert offpolicy_ac.testing is testing


@pytest.mark.parametrize("name", testing.__all__)
def test_every_exported_name_resolves_and_is_documented(name):
  obj = getattr(testing, name)
  if isinstance(obj, int):  # the step-kind constants
    return
  assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"


def test_all_is_complete_and_unique():
  assert len(set(testing.__all__)) == len(testing.__all__)
  public = {
      n for n in vars(testing) if not n.startswith("_") and n not in {"importlib", "TYPE_CHECKING"}
  }
  lazy = {"checks", "strategies"} | {n for n in testing.__all__ if n.startswith("assert_")}
  assert public | lazy == set(testing.__all__), public ^ set(testing.__all__)
  assert set(testing.__all__) <= set(dir(testing))


def test_the_checks_and_strategies_load_on_first_access():
  # They need the testing extra (chex, hypothesis); the rest of the kit needs neither.
  from offpolicy_ac.testing import checks

  assert testing.checks is checks
  assert testing.assert_masked_steps_ignored is checks.assert_masked_steps_ignored


@pytest.mark.parametrize("path", sorted(TESTING_DIR.glob("*.py")), ids=lambda p: p.name)
def test_testing_imports_only_numpy_jax_hypothesis_chex_and_itself(path):
  allowed = {"numpy", "jax", "hypothesis", "chex"}
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      modules = [node.module or ""]
    else:
      continue
    for module in modules:
      top = module.split(".")[0]
      if top == "offpolicy_ac":
        # `_extras` (the standard library only) words the error of a missing extra.
        allowed_here = module.startswith("offpolicy_ac.testing") or module == "offpolicy_ac._extras"
        assert allowed_here, f"{path.name} imports {module}"
      else:
        assert top in allowed or top in sys.stdlib_module_names, f"{path.name} imports {module}"
