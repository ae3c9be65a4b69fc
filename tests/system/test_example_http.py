"""The example project end to end through real HTTP: gunicorn (2 workers of 16 threads) on
PostgreSQL with ``ATOMIC_REQUESTS``, the locks on DynamoDB Local (tests/support/example_server.py).

30 logged-in clients POST the coalesced, fenced rebuild of one project at the same moment:
at most two rebuilds run, every request is answered 200 (it ran) or 202 (a rebuild that
started after it arrived is queued), every 202 request did arrive before the last rebuild
started, and the project ends whole (one rebuild's rows, each number once)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import django
import pytest
from django.test import override_settings

from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows, records
from tests.support.example_server import REPO, Client, example_env, example_project
from tests.support.helpers import dynasem_settings, wait_for
from tests.support.servers import ServerUnavailable, postgresql, stop

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (test dependencies)")
pytest.importorskip("gunicorn", reason="gunicorn is not installed (test dependencies)")
pytest.importorskip("environ", reason="django-environ is not installed (the demo extra)")

ROWS = 30
CLIENTS = 30
HAS_TASKS_DB = django.VERSION >= (6, 0) and importlib.util.find_spec("django_tasks_db") is not None


@pytest.fixture(scope="module")
def database(dynamodb_local: str) -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="dynasem-example-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        try:
            yield stack.enter_context(postgresql(workdir, "dynasem_example"))
        except ServerUnavailable as exc:
            pytest.skip(f"no PostgreSQL here: {exc}")


@pytest.fixture(scope="module")
def served(dynamodb_local: str, database: str) -> Iterator[tuple[int, str]]:
    """The example project's port and its database's URL."""
    with contextlib.ExitStack() as stack:
        url = database
        env = example_env(
            url,
            dynamodb_local,
            f"example-{uuid.uuid4().hex[:8]}",
            DEMO_REBUILD_SECONDS=1.0,  # every request of the burst arrives during the first
            DEMO_ISSUES_PER_PROJECT=ROWS,
            DEMO_TASKS_WORKER=HAS_TASKS_DB,
        )
        port = stack.enter_context(example_project(env, workers=2, threads=16)).port
        if HAS_TASKS_DB:  # the background rebuilds' worker
            worker = subprocess.Popen(
                [sys.executable, "manage.py", "db_worker", "--interval", "0.1"]
                + ["--no-startup-delay"],
                cwd=REPO,
                env=env,
            )
            stack.callback(stop, worker)
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


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _lock_of(endpoint: str, table: str, resource: str = "tbl_issues:2") -> tuple[bool, bool]:
    """Whether ``resource`` is held, and whether a next run is registered, both live now,
    as the example project's lock table says."""
    now_ms = time.time() * 1000
    with override_settings(DYNASEM=dynasem_settings(endpoint, table)):
        held = any(hold.expires_ms > now_ms for hold in holds_on(resource))
        item = lock_rows.get_item(resource, records.NEXT_SK)
    return held, item is not None and records.from_item(records.NextRun, item).until_ms > now_ms


@pytest.mark.serial  # a kill timed against the run lease under gunicorn: run alone
def test_a_next_run_killed_while_waiting_is_replaced_through_http(
    dynamodb_local: str, database: str
) -> None:
    """Two servers on one database and lock table (two hosts), leases of 2 s: a rebuild runs
    on the first (6 s), the next run registers on the second, whose workers are then
    SIGKILLed. Busy requests are answered 202 until the dead next run's lease (and
    CLOCK_SKEW) is over; then one becomes the next run itself and rebuilds after the running
    one, and the project ends whole with its rows."""
    import os
    import signal

    table = f"example-{uuid.uuid4().hex[:8]}"
    env = example_env(
        database,
        dynamodb_local,
        table,
        # Long enough for the next run to register, and the first busy caller after the kill
        # to come, while it goes: 4 s were not, 1 run of 3 on two loaded cores.
        DEMO_REBUILD_SECONDS=6.0,
        DEMO_ISSUES_PER_PROJECT=ROWS,
        DYNASEM_LEASE=2,
        DYNASEM_CLOCK_SKEW=0.5,
    )
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(example_project(env, workers=1, threads=8))
        other = stack.enter_context(example_project(env, workers=1, threads=8))
        answers: dict[str, tuple[float, int, bytes]] = {}

        clients = {"running": Client(one.port), "doomed": Client(other.port)}
        clients["late"] = Client(one.port)  # the busy callers after the kill
        for client in clients.values():
            client.login()

        def post(name: str) -> None:
            client = clients[name]
            sent = time.time()
            try:
                answers[name] = (sent, *client.post_rebuild("rebuild-coalesced", 2))
            except OSError:  # its worker was killed under it
                answers[name] = (sent, -1, b"")

        running = threading.Thread(target=post, args=("running",))
        running.start()
        # Waited for as they happen in the lock table, not for fixed times (1.5 s, then 1 s:
        # on two loaded cores a request can take longer to get there).
        wait_for(lambda: _lock_of(dynamodb_local, table)[0], 60, "the first rebuild holds")
        doomed = threading.Thread(target=post, args=("doomed",))
        doomed.start()
        wait_for(lambda: _lock_of(dynamodb_local, table)[1], 60, "the next run registered")
        for worker in children_of(other.pid):
            os.kill(worker, signal.SIGKILL)  # the next run's server dies
        killed = time.time()
        late: list[tuple[float, int, bytes]] = []
        client = clients["late"]
        while True:  # busy callers: coalesced until the dead one's lease is over
            sent = time.time()
            status, body = client.post_rebuild("rebuild-coalesced", 2)
            late.append((sent, status, body))
            if status != 202:
                break
            # Its registration was renewed just before the kill: its lease of 2 s and
            # CLOCK_SKEW, then it is replaced (a 202 after that would be a bug).
            assert sent - killed < 2 + 0.5 + 0.5, "the dead next run was not replaced"
            time.sleep(0.2)
        running.join(60)
        doomed.join(60)
    assert answers["running"][1] == 200
    assert answers["doomed"][1] != 200  # its worker died
    replacement = late[-1]
    assert replacement[1] == 200, replacement
    # Before it, the dead next run's registration still counted: those callers got 202.
    assert late[:-1] and all(status == 202 for _, status, _ in late[:-1]), late
    run = json.loads(replacement[2])
    first = json.loads(answers["running"][2])
    assert run["started"] >= first["finished"]  # it ran after the running one, not beside it
    with psycopg.connect(database, autocommit=True) as db:
        rows = db.execute("SELECT rebuild, number FROM projects_issue WHERE project = 2").fetchall()
    assert {rebuild for rebuild, _ in rows} == {run["rebuild"]}
    assert sorted(number for _, number in rows) == list(range(1, ROWS + 1))


@pytest.mark.skipif(not HAS_TASKS_DB, reason="django-tasks-db (dev dependency group, Django 6)")
def test_background_rebuilds_enqueue_once_while_one_is_queued_or_running(
    served: tuple[int, str],
) -> None:
    """The example's unique task through HTTP and a db_worker: ten POSTs while the first
    rebuild is queued or running enqueue it once; once it is done, the next POST enqueues."""
    port, url = served
    client = Client(port)
    client.login()
    answers = [client.post_rebuild("rebuild-in-background", 3) for _ in range(10)]
    assert [status for status, _ in answers] == [202] * 10
    bodies = [json.loads(body) for _, body in answers]
    assert [b["enqueued"] for b in bodies] == [True] + [False] * 9, bodies
    task_id = bodies[0]["task_id"]
    deadline = time.monotonic() + 60
    with psycopg.connect(url, autocommit=True) as db:
        while True:
            (status,) = db.execute(
                "SELECT status FROM django_tasks_database_dbtaskresult WHERE id = %s", [task_id]
            ).fetchone() or ("missing",)
            if status in ("SUCCESSFUL", "FAILED"):
                break
            assert time.monotonic() < deadline, f"the background rebuild is still {status}"
            time.sleep(0.1)
        assert status == "SUCCESSFUL"
        rows = db.execute("SELECT number, rebuild FROM projects_issue WHERE project = 3").fetchall()
        (enqueued,) = db.execute(
            "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE task_path LIKE %s",
            ["%rebuild_in_background"],
        ).fetchone()
    assert enqueued == 1  # ten POSTs, one task
    assert sorted(n for n, _ in rows) == list(range(1, ROWS + 1))  # whole
    assert len({r for _, r in rows}) == 1  # one rebuild's rows
    again = json.loads(client.post_rebuild("rebuild-in-background", 3)[1])
    assert again["enqueued"] is True  # the key was given back at the task's end


def test_metrics_show_the_423s_and_the_waits_by_lock_name(
    dynamodb_local: str, database: str
) -> None:
    """/metrics (OpenTelemetry's Prometheus exporter, one worker: a scrape shows its own
    process): two rebuilds of one project at once, one 200 and one 423; the scrape shows
    both outcomes under the decorator's key template, never the project's id."""
    pytest.importorskip("opentelemetry.exporter.prometheus", reason="the otel dependency group")
    env = example_env(
        database,
        dynamodb_local,
        f"example-{uuid.uuid4().hex[:8]}",
        DEMO_REBUILD_SECONDS=1.0,
        DEMO_ISSUES_PER_PROJECT=ROWS,
        DEMO_TASKS_WORKER=False,
    )
    with example_project(env, workers=1, threads=4) as served:
        client = Client(served.port)
        client.login()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            statuses = sorted(pool.map(lambda _: client.rebuild("rebuild", 5), range(2)))
        assert statuses == [200, 423]
        status, body = client.request("GET", "/metrics")
    assert status == 200
    text = body.decode()
    lock = 'dynasem_lock_name="tbl_issues:{project_id}"'
    counts = {
        outcome: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dynasem_lock_acquire_duration_seconds_count{") and lock in line
        for outcome in ("acquired", "busy")
        if f'dynasem_lock_outcome="{outcome}"' in line
    }
    assert counts == {"acquired": 1.0, "busy": 1.0}, text
    assert "dynasem_dynamodb_consumed_capacity" in text
    assert 'tbl_issues:5"' not in text  # the raw key stays out
