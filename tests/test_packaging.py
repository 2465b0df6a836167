"""The package's metadata: one version, dependencies that match the imports, license files."""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import offpolicy_ac

ROOT = pathlib.Path(__file__).parents[1]
SRC = ROOT / "src" / "offpolicy_ac"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Subpackages that may import what an extra provides: {subpackage: extra}.
EXTRA_SUBPACKAGES = {"testing": "testing"}
# Modules src/ imports only where a feature asks for them: {module: extra}.
OPTIONAL_IMPORTS = {"wandb": "track", "gymnax": "jax-envs", "brax": "jax-envs"}


def requirement_name(requirement: str) -> str:
  """'jax[cuda12]>=0.9,<0.12' -> 'jax' (normalised as PyPI does)."""
  name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
  return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(paths) -> set[str]:
  """Top-level names of the absolute imports in `paths`, standard library excluded."""
  names = set()
  for path in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names.update(alias.name.split(".")[0] for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names.add(node.module.split(".")[0])
  return {n for n in names if n not in sys.stdlib_module_names and n != "offpolicy_ac"}


def distributions(modules: set[str]) -> set[str]:
  """The installed distributions that provide `modules`."""
  provided = importlib.metadata.packages_distributions()
  missing = sorted(m for m in modules if m not in provided)
  assert not missing, f"imported but not installed by any distribution: {missing}"
  return {requirement_name(d) for m in modules for d in provided[m]}


def declared(extra: str | None = None) -> set[str]:
  project = PYPROJECT["project"]
  reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
  return {requirement_name(r) for r in reqs}


def test_runtime_dependencies_match_the_imports():
  core = [p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in EXTRA_SUBPACKAGES]
  needed = distributions(imported_modules(core) - set(OPTIONAL_IMPORTS))
  runtime = declared()
  assert needed <= runtime, f"imported by src/ but not declared: {sorted(needed - runtime)}"
  # Declared runtime dependencies are used by src/ or by the experiment scripts, except the
  # pins of what those use: jaxlib (jax's), pandas (below 3, for rliable's bootstrap) and
  # imageio-ffmpeg (imageio's MP4 writer).
  scripts = distributions(imported_modules((ROOT / "experiments").glob("*.py")))
  unused = runtime - needed - scripts - {"jaxlib", "pandas", "imageio-ffmpeg"}
  assert not unused, f"declared but imported nowhere: {sorted(unused)}"
  # Test-only packages are not runtime dependencies.
  assert not {"rlax", "chex", "hypothesis", "pytest"} & runtime


def test_optional_imports_are_in_their_extra():
  for module, extra in OPTIONAL_IMPORTS.items():
    assert distributions({module}) <= declared(extra), (module, extra)


def test_extra_subpackages_need_only_their_extra():
  for subpackage, extra in EXTRA_SUBPACKAGES.items():
    needed = distributions(imported_modules((SRC / subpackage).rglob("*.py")))
    allowed = declared() | declared(extra)
    assert needed <= allowed, f"{subpackage} imports {sorted(needed - allowed)}"


def test_one_version():
  version = offpolicy_ac.__version__
  assert importlib.metadata.version("offpolicy_ac") == version
  assert "version" in PYPROJECT["project"]["dynamic"]
  assert f"\nversion: {version}\n" in (ROOT / "CITATION.cff").read_text()
  changelog = (ROOT / "CHANGELOG.md").read_text()
  assert re.search(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.M).group(1) == version


def test_license_and_typing_marker():
  assert "Apache License" in (ROOT / "LICENSE").read_text()
  assert PYPROJECT["project"]["license"] == "Apache-2.0"
  assert (SRC / "py.typed").is_file()
  assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["offpolicy_ac"]


def test_the_gpu_extras_pin_jax_as_the_runtime_does():
  """`cuda` and `cuda13` bring jax's CUDA 12 and CUDA 13 plugins under the runtime's jax
  range, and jaxlib's range is jax's."""
  pins = {requirement_name(r): r for r in PYPROJECT["project"]["dependencies"]}
  jax_range = pins["jax"][len("jax") :]
  assert pins["jaxlib"] == f"jaxlib{jax_range}"
  extras = PYPROJECT["project"]["optional-dependencies"]
  assert extras["cuda"] == [f"jax[cuda12]{jax_range}"]
  assert extras["cuda13"] == [f"jax[cuda13]{jax_range}"]
