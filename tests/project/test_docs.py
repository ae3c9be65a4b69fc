"""Every example of the documentation runs: each ```python block of README.md and of docs/,
in page order, through Sybil, on dynasem.testing's embedded engine (a fresh table for the
module), as a user's Django project would run it (re-entry on, as in production).

A block that cannot run on its own says so right above it, with its reason, and is reported
as skipped with that reason: ``<!-- skip: next "a settings fragment" -->``. Setup a page
needs but should not show (a stand-in for the user's ``rebuild()``) goes in an
``<!-- invisible-code-block: python ... -->`` comment before the block. A block sees what the
blocks above it on the same page defined, so each test first runs the blocks before its own
that have not run yet.

Every fenced block names its language, and a block in any other language than Python is one
of those listed in NOT_PYTHON (a shell command, a query, a policy): nothing that looks like
Python escapes the run by being left untagged.
"""

from __future__ import annotations

import re
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sybil", reason="Sybil (the `docs` dependency group) is not installed")

from sybil import Document, Example  # noqa: E402
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser  # noqa: E402

from dynasem.testing import fresh_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "docs").is_dir():  # an unpacked sdist carries tests/, not docs/
    pytest.skip(
        "docs/ is not here (an sdist): the examples run from a checkout", allow_module_level=True
    )
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Fenced blocks in these languages are not Python and are not run: shell commands, PromQL,
# an IAM policy (tests/project/test_iam_policy.py reads it), text output, diagrams.
NOT_PYTHON = {"sh", "console", "promql", "json", "text", "ini", "toml", "yaml", "diff"}

PARSERS = [PythonCodeBlockParser(), SkipParser()]
_DOCUMENTS: dict[Path, Document] = {}
_DONE: dict[Path, int] = {}  # how many of a page's examples have run (or been tried)


def document(path: Path) -> Document:
    if path not in _DOCUMENTS:
        found = Document.parse(str(path), *PARSERS)
        # The page's module name: Celery names tasks after their module, and two pages may
        # both define a reindex task.
        stem = re.sub(r"\W", "_", str(path.relative_to(ROOT).with_suffix("")))
        found.namespace["__name__"] = f"docs_{stem}"
        _DOCUMENTS[path] = found
    return _DOCUMENTS[path]


def is_code(example: Example) -> bool:
    """A code block (its parsed form is its source), not a skip directive."""
    return not isinstance(example.parsed, tuple)


def examples() -> Iterator[Any]:
    for path in PAGES:
        for index, example in enumerate(document(path)):
            if is_code(example):
                where = f"{path.relative_to(ROOT)}:{example.line}"
                yield pytest.param(path, index, id=where)


EXAMPLES = list(examples())


@pytest.fixture(scope="module")
def docs_table() -> Iterator[str]:
    with fresh_table(WAIT=0) as name:
        yield name


@pytest.mark.reentry
@pytest.mark.django_db
@pytest.mark.serial  # a page's examples build on each other, in one process's order
@pytest.mark.parametrize(("path", "index"), EXAMPLES)
def test_example_runs(path: Path, index: int, docs_table: str) -> None:
    page = list(document(path))
    # The blocks above this one on its page, that have not run yet (this test alone, or -k).
    while _DONE.get(path, 0) < index:
        earlier = page[_DONE.get(path, 0)]
        _DONE[path] = _DONE.get(path, 0) + 1
        try:
            earlier.evaluate()
        except unittest.SkipTest:
            pass
        except Exception as exc:  # pragma: no cover - the earlier block's own test says more
            pytest.fail(f"an earlier example of {path.name}, line {earlier.line}, fails: {exc!r}")
    _DONE[path] = index + 1
    page[index].evaluate()


def test_the_pages_have_examples_to_run() -> None:
    """The collector finds the pages' blocks (it would pass vacuously on none)."""
    assert len(EXAMPLES) >= 20
    assert any("tutorial.md" in str(p.values[0]) for p in EXAMPLES)


FENCE = re.compile(r"^(`{3,})(.*)$")


def fences(path: Path) -> Iterator[tuple[int, str]]:
    """(line, language) of each opening fence of a Markdown page."""
    open_fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line.strip())
        if not match:
            continue
        if open_fence is None:
            open_fence = match.group(1)
            yield number, match.group(2).strip()
        elif match.group(1) == open_fence and not match.group(2).strip():
            open_fence = None


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_block_names_its_language(path: Path) -> None:
    for number, language in fences(path):
        assert language, f"{path.name}:{number}: a fenced block without a language"
        assert language == "python" or language in NOT_PYTHON, (
            f"{path.name}:{number}: a ```{language} block: Python blocks are run "
            f"(```python), other languages are one of {sorted(NOT_PYTHON)}"
        )


def test_a_broken_example_fails(tmp_path: Path) -> None:
    """What a changed signature does to an example: its block raises, so its test fails."""
    page = tmp_path / "broken.md"
    page.write_text(
        "```python\nfrom dynasem import semaphore\n\n"
        'semaphore("r", no_such_argument=1)\n```\n'
        '<!-- skip: next "a fragment" -->\n```python\nundefined_name\n```\n'
    )
    found = list(Document.parse(str(page), *PARSERS))
    with pytest.raises(TypeError, match="no_such_argument"):
        found[0].evaluate()
    found[1].evaluate()  # the skip directive
    with pytest.raises(unittest.SkipTest, match="a fragment"):
        found[2].evaluate()


def slug(heading: str) -> str:
    """The anchor MkDocs (and GitHub) gives a heading: lower case, words joined by -."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", text)


def test_the_readme_is_a_landing_page_whose_links_lead_somewhere() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) <= 150, "the README is the landing page: the rest is on the site"
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 30
    for link in local:
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.exists(), f"README.md links to {link}, which is not there"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"README.md: no #{anchor} in {target}"
