"""The public API of `offpolicy_ac.losses` and its dependency direction; no import cycles
and no private names reached across modules in the subpackages of `ACYCLIC_PACKAGES`."""

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


# Subpackages whose modules must take part in no import cycle and reach no other module's
# private names. `training` joins once its own cycle is gone.
ACYCLIC_PACKAGES = (
    "envs",
    "agents",
    "losses",
    "networks",
    "analysis",
    "training",
    "presets",
    "testing",
)
PACKAGE_DIR = pathlib.Path(offpolicy_ac.__file__).parent


def _module_files() -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every module of the package (a package is its
  `__init__.py`)."""
  files = {}
  for path in sorted(PACKAGE_DIR.rglob("*.py")):
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return files


def _is_type_checking_block(node) -> bool:
  test = getattr(node, "test", None) if isinstance(node, ast.If) else None
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
  )


def _package_imports(name: str, path: pathlib.Path, modules) -> dict[str, str]:
  """The package's modules that module `name` imports, each with the local name it binds
  (a `from m import f` of a function binds no module: ("m", "")), at module level or
  inside functions alike; `if TYPE_CHECKING:` blocks are skipped (they never run)."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = {}
  stack = [ast.parse(path.read_text(), filename=str(path))]
  while stack:
    node = stack.pop()
    if _is_type_checking_block(node):
      continue
    stack.extend(ast.iter_child_nodes(node))
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name in modules:
          found[alias.name] = alias.asname or ""
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the package, `level - 1` packages up
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
      for alias in node.names:
        if f"{base}.{alias.name}" in modules:  # `from package import module`
          found[f"{base}.{alias.name}"] = alias.asname or alias.name
        elif base in modules:
          found.setdefault(base, "")
  return found


def _import_graph() -> dict[str, set[str]]:
  modules = _module_files()
  return {name: set(_package_imports(name, path, modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle [m0, m1, ..., m0] through each strongly connected component of `graph`
  that has one (Tarjan's algorithm, then a shortest way back to the component's first
  module)."""
  index, low, on_stack, stack, components = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      components.append(set(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  cycles = []
  for component in components:
    start = min(component)
    if len(component) == 1 and start not in graph.get(start, ()):
      continue
    paths, seen = {start: [start]}, set()
    frontier = [start]
    while frontier:  # breadth first, within the component, back to `start`
      v = frontier.pop(0)
      nxt = sorted(graph[v] & component)
      if start in nxt:
        cycles.append(paths[v] + [start])
        break
      for w in nxt:
        if w not in seen:
          seen.add(w)
          paths[w] = paths[v] + [w]
          frontier.append(w)
  return cycles


def _in_acyclic_packages(module: str) -> bool:
  return any(
      module == f"offpolicy_ac.{p}" or module.startswith(f"offpolicy_ac.{p}.")
      for p in ACYCLIC_PACKAGES
  )


def test_cycle_finder_finds_a_cycle_and_only_cycles():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
  assert sorted(_cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
  """No cycle of imports between modules that involves a module of `ACYCLIC_PACKAGES`.

  Every import of the package counts, at module level or inside a function: a function-level
  import is how a cycle is usually hidden, and it still ties the two modules together
  (only `if TYPE_CHECKING:` blocks, which never run, are skipped). An edge goes to the module
  named (`from offpolicy_ac.envs import loss_inputs` is an edge to `offpolicy_ac.envs`, the
  package's `__init__`); that importing a submodule runs its parent's `__init__` is not an
  edge, or every package would be a cycle with its modules.
  """
  cycles = [c for c in _cycles(_import_graph()) if any(map(_in_acyclic_packages, c))]
  assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_names_reached_across_modules():
  """Modules of `ACYCLIC_PACKAGES` take no `_name` of another module: neither
  `from m import _name` nor `m._name` through an imported module (a package's private
  modules, `_x.py`, may import each other's public names)."""
  modules = _module_files()
  reached = []
  for name, path in modules.items():
    if not _in_acyclic_packages(name):
      continue
    tree = ast.parse(path.read_text(), filename=str(path))
    bound = {local: m for m, local in _package_imports(name, path, modules).items() if local}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("offpolicy_ac"):
        for alias in node.names:
          full = f"{node.module}.{alias.name}"
          if alias.name.startswith("_") and full not in modules and alias.name != "__version__":
            reached.append(f"{path.name}:{node.lineno} imports {full}")
      elif (
          isinstance(node, ast.Attribute)
          and isinstance(node.value, ast.Name)
          and node.value.id in bound
          and node.attr.startswith("_")
          and not node.attr.startswith("__")
      ):
        reached.append(f"{path.name}:{node.lineno} reads {bound[node.value.id]}.{node.attr}")
  assert not reached, "private names reached across modules:\n" + "\n".join(sorted(reached))


def test_no_function_is_longer_than_150_lines():
  """Functions a reader can hold in mind: none in the package is over 150 lines (the
  longest are agent factories and rollout backends whose closures share their setup)."""
  long = []
  for path in sorted(PACKAGE_DIR.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > 150:
          long.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} {node.name} ({lines})")
  assert not long, long


def test_dir_of_the_package_lists_every_subpackage():
  assert {"losses", "envs", "agents", "training", "presets", "analysis", "testing"} <= set(
      dir(offpolicy_ac)
  )
