"""The site builds strictly, and its API reference documents every public name.

As rlax's docs build does, this fails naming any public name (a name in a subpackage's
`__all__`) that its API page does not render, or that has no docstring.
"""

import importlib
import pathlib
import re
import zlib

import pytest

import offpolicy_ac

ROOT = pathlib.Path(__file__).parents[2]
API_DIR = ROOT / "docs" / "api"


def _subpackages() -> list[str]:
  """The public subpackages: those `offpolicy_ac` exports, and any with an API page."""
  exported = {n for n in offpolicy_ac.__all__ if not n.startswith("__")}
  return sorted(exported | {p.stem for p in API_DIR.glob("*.md")})


def _inventory(site: pathlib.Path) -> dict[str, str]:
  """objects.inv (Sphinx inventory, version 2): object name -> page URL with anchor."""
  data = (site / "objects.inv").read_bytes()
  header = b"".join(data.split(b"\n", 4)[:4])
  assert b"Sphinx inventory version 2" in header, header
  body = zlib.decompress(data.split(b"\n", 4)[4]).decode()
  entries = {}
  for line in body.splitlines():
    name, _, _, location, _ = line.split(" ", 4)
    entries[name] = location.replace("$", name)
  return entries


def test_every_public_subpackage_has_an_api_page_in_the_nav():
  nav = (ROOT / "mkdocs.yml").read_text()
  for name in _subpackages():
    page = API_DIR / f"{name}.md"
    assert page.exists(), f"offpolicy_ac.{name} has no API page ({page.relative_to(ROOT)})"
    assert f"::: offpolicy_ac.{name}" in page.read_text(), page
    assert f"api/{name}.md" in nav, f"api/{name}.md is not in mkdocs.yml's nav"


@pytest.mark.parametrize("name", _subpackages())
def test_api_page_renders_every_public_name(site_dir, name):
  module = importlib.import_module(f"offpolicy_ac.{name}")
  public = getattr(module, "__all__", None)
  assert public, f"offpolicy_ac.{name} has no __all__"
  inventory = _inventory(site_dir)
  html = (site_dir / "api" / name / "index.html").read_text()
  undocumented = []
  for member in public:
    qualified = f"offpolicy_ac.{name}.{member}"
    location = inventory.get(qualified, "")
    if not location.startswith(f"api/{name}/#") or f'id="{qualified}"' not in html:
      undocumented.append(member)
  assert not undocumented, (
      f"public names of offpolicy_ac.{name} not rendered on docs/api/{name}.md "
      f"(a name without a docstring is not rendered): {undocumented}"
  )


@pytest.mark.parametrize("name", _subpackages())
def test_every_public_name_has_a_docstring(name):
  griffe = pytest.importorskip("griffe")
  module = importlib.import_module(f"offpolicy_ac.{name}")
  package = griffe.load(f"offpolicy_ac.{name}", search_paths=[str(ROOT / "src")])
  missing = []
  for member in module.__all__:
    obj = package[member]
    docstring = obj.docstring.value.strip() if obj.docstring else ""
    if not docstring:
      missing.append(member)
  assert not missing, f"public names of offpolicy_ac.{name} without a docstring: {missing}"


def test_vtrace_is_rendered_with_its_signature(site_dir):
  html = (site_dir / "api" / "losses" / "index.html").read_text()
  match = re.search(
      r'id="offpolicy_ac\.losses\.vtrace".*?class="doc-signature[^"]*">(.*?)</code>', html, re.S
  )
  assert match, "vtrace has no signature on the losses page"
  text = re.sub(r"<[^>]+>", "", match.group(1))
  for argument in ("v_tm1", "rho_tm1", "clip_pg_rho_threshold", "stop_target_gradients"):
    assert argument in text, f"vtrace's rendered signature lacks {argument}"
  assert "VTraceOutput" in text


def test_site_has_no_internal_links_to_missing_pages(site_dir):
  # mkdocs --strict already rejects links to missing docs; this checks the rendered pages
  # do not link to files the build did not produce (e.g. renamed pages).
  broken = []
  for page in site_dir.rglob("*.html"):
    if page.name == "404.html":  # links from the site root, wherever the site is served
      continue
    for href in re.findall(r'href="([^"#:?]+)(?:#[^"]*)?"', page.read_text()):
      target = (page.parent / href).resolve()
      if href.endswith("/"):
        target = target / "index.html"
      if not target.exists():
        broken.append(f"{page.relative_to(site_dir)} -> {href}")
  assert not broken, broken
