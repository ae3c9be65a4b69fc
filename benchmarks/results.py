"""Recorded results, and the pages that quote them: no measured figure is typed by hand.

A benchmark records what it measured with :func:`record`: ``benchmarks/results/NAME.json``
holds the figures (each the text a page shows, e.g. ``"0.91×"``) with the machine, the
versions, the commit, the command, the seed and the protocol version it ran on. A page
quotes a figure inline, in Markdown that renders as the text alone (on GitHub and in the
docs site)::

    <!-- fig cost.ratio_1s -->0.91×<!-- /fig -->

Recording rewrites every quote of that result in README.md and docs/ (:func:`update_pages`),
so re-running a benchmark updates every page that quotes it; ``python -m benchmarks.results``
does the same from the files. tests/project/test_figures.py fails on a quote no result backs,
a quote whose text differs from its result, a result recorded under an older
``PROTOCOL_VERSION`` (a change to what is written or in which order: the figures measured an
older protocol), and a measured figure typed by hand on a page.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
QUOTE = re.compile(r"<!-- fig (?P<name>[a-z_]+)\.(?P<key>[a-z0-9_]+) -->(?P<text>.*?)<!-- /fig -->")
REQUIRED = ("benchmark", "measured", "commit", "protocol", "machine", "command", "figures")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def protocol_version() -> int:
    from dynasem._storage.records import PROTOCOL_VERSION

    return PROTOCOL_VERSION


def _git(*args: str) -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    return ""


def record(
    name: str,
    figures: dict[str, str],
    *,
    machine: str,
    command: str,
    seed: int | None = None,
) -> Path:
    """Write ``benchmarks/results/NAME.json`` and update every page that quotes it."""
    data = {
        "benchmark": name,
        "measured": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        # Uncommitted changes to the library when it ran: the commit alone does not say what
        # was measured.
        "dirty": bool(_git("status", "--porcelain", "--", "dynasem")),
        "protocol": protocol_version(),
        "machine": machine,
        "command": command,
        "seed": seed,
        "figures": figures,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    changed = update_pages()
    print(f"\nrecorded {path}; quotes updated in {len(changed)} page(s)")
    return path


def load() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


def update_pages() -> list[Path]:
    """Rewrite every quote of a recorded figure with its recorded text; the pages changed."""
    results = load()

    def text_of(match: re.Match[str]) -> str:
        figure = results.get(match["name"], {}).get("figures", {}).get(match["key"])
        text = match["text"] if figure is None else figure
        return f"<!-- fig {match['name']}.{match['key']} -->{text}<!-- /fig -->"

    changed = []
    for page in pages():
        before = page.read_text()
        after = QUOTE.sub(text_of, before)
        if after != before:
            page.write_text(after)
            changed.append(page)
    return changed


def quote_problems() -> list[str]:
    """Quotes no result backs, quotes that differ from their result, and results of another
    protocol version or missing what a result must say."""
    results, problems = load(), []
    current = protocol_version()
    for name, data in results.items():
        missing = [k for k in REQUIRED if not data.get(k)]
        if missing:
            problems.append(f"benchmarks/results/{name}.json lacks {', '.join(missing)}")
        if data.get("protocol") != current:
            problems.append(
                f"benchmarks/results/{name}.json was measured on protocol version "
                f"{data.get('protocol')}, the code is on {current}: run again "
                f"`{data.get('command') or f'benchmarks/{name}.py'}`"
            )
    for page in pages():
        rel = page.relative_to(REPO) if page.is_relative_to(REPO) else page
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in QUOTE.finditer(line):
                figures = results.get(match["name"], {}).get("figures", {})
                where = f"{rel}:{number}: {match['name']}.{match['key']}"
                if match["key"] not in figures:
                    problems.append(f"{where} is quoted but no recorded result has it")
                elif figures[match["key"]] != match["text"]:
                    problems.append(
                        f"{where} says {match['text']!r}, its result {figures[match['key']]!r}: "
                        "run python -m benchmarks.results"
                    )
    return problems


if __name__ == "__main__":
    for page in update_pages():
        print(f"updated {page.relative_to(REPO)}")
    found = quote_problems()
    print("\n".join(found) or "every quote matches its recorded result")
    sys.exit(1 if found else 0)
