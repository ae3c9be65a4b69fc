"""Every measured figure a page states comes from a recorded run (benchmarks/results.py).

A page quotes a recorded figure (``<!-- fig cost.ratio_1s_same -->0.91×<!-- /fig -->``); the
benchmark that measured it rewrites the quote whenever it runs. This test fails on a quote no
recorded result backs, a quote that differs from its result, a result measured under an
older protocol version, and a measured figure typed by hand: a decimal ratio (``0.91×``)
anywhere, or a number with a unit (ms, s, %, WCU, requests, refusals...) in a paragraph, list
item or table row that says it was measured (measured, measurement, p50/p95/p99, median, in
the same run, side by side), outside code blocks and quotes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import results  # noqa: E402

# Dated logs of runs, each entry naming its command and commit: what was measured then,
# kept as it was (the changelog; RELIABILITY.md's runs; BENCHMARKS.md, whose sections the
# benchmark scripts write themselves).
LOGS = {"docs/changelog.md", "docs/RELIABILITY.md", "docs/BENCHMARKS.md"}
# Pages whose figures are still typed by hand, to move to recorded results (issue 44). Each
# must still hold one: a page fixed leaves this list.
NOT_YET: set[str] = set()

CODE = re.compile(r"^```.*?^```", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CLAIM = re.compile(
    r"\b(measured|measurements?|p50|p95|p99|median|in the same run|side by side)\b", re.I
)
RATIO = re.compile(r"(?<![\w.])\d+\.\d+\s*×")
NUMBER = r"(?<![\w.$])\d[\d,]*(?:\.\d+)?(?:\s*[–-]\s*\d[\d,]*(?:\.\d+)?)?"
UNIT = r"\s*(?:ms|µs|s\b|%|WCU|RCU|requests|acquisitions|refusals|retries|of \d+)"
MEASURE = re.compile(NUMBER + UNIT)
# A paragraph, a list item or a table row: where a claim of measuring reaches.
ITEM = re.compile(r"\n\s*(?=[-|*]\s|\d+\.\s)")


def hand_typed(text: str) -> list[str]:
    """The measured figures ``text`` (a page's Markdown) states outside quotes and code."""
    prose = COMMENT.sub(" ", CODE.sub(" ", results.QUOTE.sub("FIGURE", text)))
    found = []
    for paragraph in re.split(r"\n\s*\n", prose):
        for sentence in ITEM.split(paragraph):
            flat = " ".join(sentence.split())
            hits = RATIO.findall(flat)
            if CLAIM.search(flat):
                hits += MEASURE.findall(flat)
            found += [f"{hit.strip()!r} in: {flat[:160]}" for hit in hits]
    return found


def test_every_quote_matches_a_result_recorded_on_this_protocol() -> None:
    assert results.quote_problems() == []


def test_no_page_states_a_measured_figure_by_hand() -> None:
    problems, still = [], set()
    for page in results.pages():
        rel = str(page.relative_to(ROOT))
        if rel in LOGS:
            continue
        found = hand_typed(page.read_text())
        if rel in NOT_YET:
            if found:
                still.add(rel)
            continue
        problems += [f"{rel}: {hit}" for hit in found]
    assert not problems, "typed by hand, quote a recorded result instead:\n" + "\n".join(problems)
    assert still == NOT_YET, f"no hand-typed figure left on {NOT_YET - still}: take it off NOT_YET"


def test_a_hand_typed_figure_is_found_and_a_quoted_one_is_not() -> None:
    typed = "Measured with 2 workers: 60 of 60 ran in 31–37 s, 0.7–1.2 refusals per task."
    assert len(hand_typed(typed)) == 3  # 60 of 60, 31–37 s, 0.7–1.2 refusals
    assert hand_typed("It costs 0.91× the peer's dollars.") != []
    quoted = "It costs <!-- fig cost.ratio_1s_same -->0.91×<!-- /fig --> the peer's dollars."
    assert hand_typed(quoted) == []
    stated = "The lease is 60 s and a refused write costs 1 WCU."  # settings and rules
    assert hand_typed(stated) == []
    code = "```python\nmeasured = 3.5  # 12 ms\n```"
    assert hand_typed(code) == []


def test_recording_a_result_rewrites_every_quote_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    page.write_text("Costs <!-- fig demo.ratio -->1.00×<!-- /fig --> the peer's.\n")
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(results, "pages", lambda: [page])
    path = results.record("demo", {"ratio": "0.42×"}, machine="this one", command="demo.py")
    assert page.read_text() == "Costs <!-- fig demo.ratio -->0.42×<!-- /fig --> the peer's.\n"
    data = json.loads(path.read_text())
    assert data["protocol"] == results.protocol_version() and data["commit"]
    assert results.quote_problems() == []
    page.write_text(page.read_text().replace("0.42×", "0.40×"))  # typed over by hand
    assert [p for p in results.quote_problems() if "says '0.40×'" in p]
