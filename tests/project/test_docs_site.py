"""The documentation site builds with no warning and reads in a browser.

``mkdocs build --strict`` (what ``make docs`` runs) turns every warning into a failure: a
broken link or anchor, a page left out of the navigation, a reference mkdocstrings cannot
resolve. The built site is then served on a free loopback port and opened in Debian's
Chromium (tests/operators/test_browser.py's fixtures): the home page with its navigation beside the
text, and a reference page generated from the code (the settings table, the API).
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mkdocs", reason="MkDocs (the `docs` dependency group) is not installed")
pytest.importorskip("playwright", reason="Playwright is not installed")

from dynasem.conf import DEFAULTS  # noqa: E402
from tests.operators.test_browser import browser_page, chromium  # noqa: E402, F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "mkdocs.yml").is_file():  # an unpacked sdist carries tests/, not the site
    pytest.skip(
        "mkdocs.yml is not here (an sdist): the site builds from a checkout",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    return site


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    handler = partial(_QuietHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def test_every_page_of_the_navigation_is_built(built_site: Path) -> None:
    for page in (
        "index.html",
        "tutorial/index.html",
        "reference/settings/index.html",
        "reference/api/index.html",
        "how-to/aws/index.html",
        "RELIABILITY/index.html",
    ):
        assert (built_site / page).is_file(), page


def test_home_and_a_reference_page_in_a_browser(site_url: str, browser_page: Any) -> None:  # noqa: F811
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(site_url + "/")
    heading = page.locator("article h1").first
    assert heading.inner_text().strip().rstrip("¶") == "dynasem"  # ¶: its permalink
    nav = page.locator("nav.md-nav--primary").first
    assert nav.get_by_text("Tutorial").first.is_visible()
    # The navigation sits beside the text, not above or over it.
    nav_box, text_box = nav.bounding_box(), page.locator("article").first.bounding_box()
    assert nav_box and text_box
    assert nav_box["x"] + nav_box["width"] <= text_box["x"] + 1
    assert text_box["x"] + text_box["width"] <= 1280

    page.get_by_role("link", name="settings").first.click()
    page.wait_for_url("**/reference/settings/")
    table = page.locator("article table").first
    rows = table.locator("tbody tr")
    keys = [rows.nth(i).locator("td").first.inner_text().strip() for i in range(rows.count())]
    assert keys == list(DEFAULTS), "the settings table is the code's DEFAULTS, in order"
    box = table.bounding_box()
    assert box and box["x"] + box["width"] <= 1280, "the table fits the window"

    page.goto(site_url + "/reference/api/")
    # The reference generated from the docstrings: semaphore()'s own entry.
    assert page.locator("article [id='dynasem.semaphore']").first.is_visible()


HOW_TO = sorted(p.stem for p in (ROOT / "docs" / "how-to").glob("*.md"))
SCREEN = {"width": 1280, "height": 800}  # a laptop's browser window
PROSE_BEFORE_RECIPE = 90  # words between the title and the first code block, at most


@pytest.mark.parametrize("name", HOW_TO)
def test_a_how_to_page_opens_with_its_recipe(site_url: str, browser_page: Any, name: str) -> None:  # noqa: F811
    """A how-to guide is a recipe (Diátaxis): at 1280 px its first screen holds the code that
    does the task, after a sentence or two that says what the task is; the mechanics come
    later or in the explanation pages."""
    page = browser_page
    page.set_viewport_size(SCREEN)
    page.goto(f"{site_url}/how-to/{name}/")
    code = page.locator("article pre")
    assert code.count(), f"how-to/{name}.md has no code block: a recipe shows the code"
    box = code.first.bounding_box()
    assert box is not None
    shown = min(box["height"], 100)  # its first lines at least
    assert box["y"] + shown <= SCREEN["height"], (
        f"how-to/{name}.md: its first code block starts {box['y']:.0f} px down, below the "
        f"first screen ({SCREEN['height']} px)"
    )
    overflow = code.first.evaluate("pre => pre.querySelector('code').scrollWidth - pre.clientWidth")
    assert overflow <= 1, (
        f"how-to/{name}.md: its first code block is {overflow:.0f} px wider than the page "
        "shows: shorten its lines (comments above a line, not after it)"
    )
    words = page.evaluate(
        """() => {
            const article = document.querySelector("article");
            const first = article.querySelector("pre");
            let words = 0;
            for (const el of article.querySelectorAll("p, li, td, blockquote")) {
                if (el.compareDocumentPosition(first) & Node.DOCUMENT_POSITION_FOLLOWING
                    && !el.contains(first)) {
                    words += el.innerText.split(/\\s+/).filter(Boolean).length;
                }
            }
            return words;
        }"""
    )
    assert words <= PROSE_BEFORE_RECIPE, (
        f"how-to/{name}.md: {words} words before its first code block: open with the task "
        "and its code, then the choices"
    )
