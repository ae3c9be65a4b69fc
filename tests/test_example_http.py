"""The example project end to end through real HTTP: gunicorn (2 workers of 16 threads) on
PostgreSQL with ``ATOMIC_REQUESTS``, the locks on DynamoDB Local (tests/example_server.py).

30 logged-in clients POST the coalesced, fenced rebuild of one project at the same moment:
at most two rebuilds run, every request is answered 200 (it ran) or 202 (a rebuild that
started after it arrived is queued), every 202 request did arrive before the last rebuild
started, and the project ends whole (one rebuild's rows, each number once)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.example_server import Client, example_env, example_project
from tests.servers import ServerUnavailable, postgresql

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (test dependencies)")
pytest.importorskip("gunicorn", reason="gunicorn is not installed (test dependencies)")
pytest.importorskip("environ", reason="django-environ is not installed (the demo extra)")

ROWS = 30
CLIENTS = 30


@pytest.fixture(scope="module")
def served(dynamodb_local: str) -> Iterator[tuple[int, str]]:
    """The example project's port and its database's URL."""
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="dynasem-example-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        try:
            url = stack.enter_context(postgresql(workdir, "dynasem_example"))
        except ServerUnavailable as exc:
            pytest.skip(f"no PostgreSQL here: {exc}")
        env = example_env(
            url,
            dynamodb_local,
            f"example-{uuid.uuid4().hex[:8]}",
            DEMO_REBUILD_SECONDS=1.0,  # every request of the burst arrives during the first
            DEMO_ISSUES_PER_PROJECT=ROWS,
        )
        port = stack.enter_context(example_project(env, workers=2, threads=16))
        yield port, url


def test_thirty_concurrent_coalesced_rebuilds_run_at_most_twice_and_end_whole(
    served: tuple[int, str],
) -> None:
    port, url = served
    clients = [Client(port) for _ in range(CLIENTS)]
    for client in clients:
        client.login()
    start = threading.Barrier(CLIENTS)
    answers: list[tuple[float, int, bytes]] = []

    def post(client: Client) -> None:
        start.wait()
        sent = time.time()
        status, body = client.post_rebuild("rebuild-coalesced", 1)
        answers.append((sent, status, body))

    threads = [threading.Thread(target=post, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    statuses = sorted(status for _, status, _ in answers)
    assert len(answers) == CLIENTS and set(statuses) <= {200, 202}, statuses
    runs: list[dict[str, Any]] = [json.loads(body) for _, status, body in answers if status == 200]
    assert 1 <= len(runs) <= 2, statuses
    assert statuses.count(202) == CLIENTS - len(runs)
    # Every request answered 202 is covered by a rebuild that started after it was sent.
    last = max(runs, key=lambda run: run["started"])
    last_started = datetime.fromisoformat(last["started"]).timestamp()
    for sent, status, body in answers:
        if status == 202:
            assert sent < last_started, (sent, last_started)
            assert b"a run that starts after this request is queued" in body
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute("SELECT rebuild, number FROM projects_issue WHERE project = 1").fetchall()
        fences = db.execute("SELECT resource, fence FROM dynasem_fence").fetchall()
    assert {rebuild for rebuild, _ in rows} == {last["rebuild"]}
    assert sorted(number for _, number in rows) == list(range(1, ROWS + 1))
    # The rebuilds' transactions were fenced: the last one's fence is the one stored.
    assert fences == [("tbl_issues:1", last["fence"])]
