"""The built site in a real headless browser: Debian's Chromium driven by Playwright.

The home page, the `offpolicy_ac.losses` API page and a notebook page are opened from a
local HTTP server; each must show its text, load every asset of the site itself (no 404),
and log no console error. Screenshots of the three pages are saved to
`$TEST_ARTIFACTS/docs/` when `TEST_ARTIFACTS` is set, else to the test's temporary
directory. The browser is `$CHROMIUM_PATH`, else `/usr/bin/chromium` or `chromium` on PATH;
without one (Debian: `apt-get install chromium`) the test is skipped, saying so.
"""

import functools
import http.server
import json
import os
import pathlib
import shutil
import threading
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).parents[2]
NOTEBOOK = ROOT / "notebooks" / "compose_losses.ipynb"

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# (path, name of the screenshot, texts the page must show)
PAGES = [
    ("", "home", ["offpolicy_ac", "Quick start", "Install"]),
    ("api/losses/", "api_losses", ["vtrace", "clip_pg_rho_threshold", "VTraceOutput"]),
    ("notebooks/compose_losses/", "notebook_compose_losses", ["vtrace"]),
]


def _chromium() -> str:
  """The browser: $CHROMIUM_PATH if set, else Debian's /usr/bin/chromium or one on PATH."""
  if os.environ.get("CHROMIUM_PATH"):
    candidates = [os.environ["CHROMIUM_PATH"]]
  else:
    candidates = ["/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")]
  for candidate in candidates:
    if candidate and os.access(candidate, os.X_OK):
      return candidate
  pytest.skip(
      f"no Chromium browser installed (looked for {[c for c in candidates if c]}); on Debian: "
      "apt-get install chromium (or set CHROMIUM_PATH)"
  )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  """Serves the site and records every request's path and status."""

  log: list

  def log_request(self, code="-", size="-"):
    self.log.append((urllib.parse.urlsplit(self.path).path, int(code)))

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    pass


@pytest.fixture(scope="session")
def chromium_path() -> str:
  """The browser's executable (checked before the site is built)."""
  pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
  return _chromium()


@pytest.fixture
def served_site(site_dir):
  """(base URL, request log) of an HTTP server on localhost serving the built site."""
  log = []
  handler = functools.partial(
      type("Handler", (_QuietHandler,), {"log": log}), directory=str(site_dir)
  )
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/", log
  finally:
    server.shutdown()
    server.server_close()


@pytest.fixture
def artifacts_dir(tmp_path) -> pathlib.Path:
  root = os.environ.get("TEST_ARTIFACTS")
  path = pathlib.Path(root) / "docs" if root else tmp_path / "screenshots"
  path.mkdir(parents=True, exist_ok=True)
  return path


def test_pages_render_in_chromium(chromium_path, served_site, artifacts_dir, tmp_path):
  from playwright import sync_api  # pylint: disable=import-outside-toplevel

  base, server_log = served_site
  origin = base.rstrip("/")
  problems = []
  with sync_api.sync_playwright() as playwright:
    context = playwright.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"),  # a fresh user data dir
        executable_path=chromium_path,
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": 1280, "height": 900},
    )
    try:
      page = context.new_page()
      page.on(
          "console",
          lambda m: m.type == "error" and problems.append(f"console error: {m.text} {m.location}"),
      )
      page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
      page.on(
          "response",
          lambda r: r.url.startswith(origin)
          and r.status >= 400
          and problems.append(f"HTTP {r.status}: {r.url}"),
      )
      page.on(
          "requestfailed",
          lambda r: r.url.startswith(origin) and problems.append(f"request failed: {r.url}"),
      )
      for path, name, texts in PAGES:
        response = page.goto(base + path, wait_until="networkidle")
        assert response is not None and response.status == 200, (path, response)
        body = page.inner_text("body")
        for text in texts:
          assert text in body, f"{path or 'home page'} does not show {text!r}"
        page.screenshot(path=str(artifacts_dir / f"{name}.png"), full_page=False)
        if path.startswith("notebooks/"):
          cells = json.loads(NOTEBOOK.read_text())["cells"]
          has_outputs = any(c.get("outputs") for c in cells if c["cell_type"] == "code")
          assert page.locator(".jp-Cell").count() >= len(cells), "notebook cells not rendered"
          if has_outputs:  # committed outputs are shown, not re-executed away
            assert page.locator(".jp-OutputArea-output").count() > 0, "no cell output shown"
        if path == "api/losses/":
          signature = page.locator('[id="offpolicy_ac.losses.vtrace"] ~ .doc-signature').first
          assert signature.is_visible()
          assert "rho_tm1" in signature.inner_text()
    finally:
      context.close()
  assert not problems, "\n".join(problems)
  not_found = [p for p, code in server_log if code >= 400]
  assert not not_found, f"the site requested files it does not have: {not_found}"
  for _, name, _ in PAGES:
    assert (artifacts_dir / f"{name}.png").stat().st_size > 0
