"""The documentation site, built once per test session with `mkdocs build --strict`."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory) -> pathlib.Path:
  """The built site (`mkdocs build --strict`: any warning fails the build)."""
  pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
  site = tmp_path_factory.mktemp("docs") / "site"
  out = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml")]
      + ["-d", str(site)],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
      env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
  )
  if out.returncode != 0:
    pytest.fail(f"mkdocs build --strict failed:\n{out.stdout}\n{out.stderr}", pytrace=False)
  return site
