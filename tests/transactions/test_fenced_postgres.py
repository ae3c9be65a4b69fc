"""Fenced transactions on PostgreSQL with real processes (tests/support/fence_worker.py).

A holder A purges and rebuilds a project's rows and stalls for longer than its lease; B takes
the lock over and purges and rebuilds the same rows. A stalls (a) after its block's last check,
in its ``COMMIT``, or (b) after acquiring, before its transaction's first statement, resumed
while B's transaction is open. Without a fence the two rebuilds' rows end up side by side;
with ``fence_db=True`` (or ``held.fence_transaction()``) the project is whole after every run,
and A either committed before B's first statement went on (B's purge deletes A's committed
rows) or rolled back with LockLost.

The cluster is Debian's PostgreSQL, started for this module on a free loopback port
(tests/support/servers.py); without it (and no root to install it) the module is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import fence_worker
from tests.support.servers import ServerUnavailable, postgresql

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (test dependencies)")

SPAWN = multiprocessing.get_context("spawn")
RUNS = 20  # of each stall, with the fence
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        # Not under pytest's temporary folder: the postgres user must reach it (mode 0700).
        workdir = Path(tempfile.mkdtemp(prefix="dynasem-fenced-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        try:
            url = stack.enter_context(postgresql(workdir, "dynasem_fenced"))
        except ServerUnavailable as exc:
            pytest.skip(f"no PostgreSQL here: {exc}")
        env = {**os.environ, "DYNASEM_TEST_DATABASE_URL": url}
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v0", "--settings=tests.support.settings"],
            check=True,
            cwd=REPO,
            env=env,
        )
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("CREATE TABLE fence_work (project int, label text, n int)")
        yield url


class Worker:
    def __init__(self, endpoint: str, table_name: str, url: str, name: str) -> None:
        self.pipe, theirs = SPAWN.Pipe()
        self.url, self.name = url, name
        self.proc = SPAWN.Process(
            target=fence_worker.serve,
            args=(endpoint, table_name, url, theirs, name),
            daemon=True,
        )
        self.proc.start()
        self.steps: list[tuple[str, Any]] = []

    def start(self, *job: Any) -> None:
        self.steps = []
        self.pipe.send(job)

    def _recv(self, deadline: float, waiting_for: str) -> tuple[str, Any]:
        if not self.pipe.poll(max(0.0, deadline - time.monotonic())):
            raise AssertionError(f"no {waiting_for!r} from the worker in time: {self.steps}")
        step: tuple[str, Any] = self.pipe.recv()
        self.steps.append(step)
        if step[0] == "error":
            raise AssertionError(f"worker failed: {step[1]} after {self.steps}")
        return step

    def expect(self, kind: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            step = self._recv(deadline, kind)
            if step[0] == kind:
                return step[1]

    def outcome(self, timeout: float = 30) -> str:
        """How the rebuild ended: done, or lost (LockLost in the block or at release)."""
        deadline = time.monotonic() + timeout
        while True:
            for kind, _ in self.steps:
                if kind in ("done", "lost"):
                    return kind
            self._recv(deadline, "done or lost")

    def ended(self) -> bool:
        """Whether the rebuild has reported its end (what came so far, without waiting)."""
        while self.pipe.poll(0):
            self._recv(time.monotonic(), "a step")
        return any(kind in ("done", "lost") for kind, _ in self.steps)

    def waits_on_a_lock(self) -> bool:
        """Whether its statement in PostgreSQL waits on another transaction's lock."""
        with psycopg.connect(self.url, autocommit=True) as db:
            found = db.execute(
                "SELECT 1 FROM pg_stat_activity"
                " WHERE application_name = %s AND wait_event_type = 'Lock'",
                [self.name],
            ).fetchone()
        return found is not None

    def said(self, kind: str) -> list[Any]:
        return [value for k, value in self.steps if k == kind]

    def wait_stopped(self) -> None:
        self.expect("stalling")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "T":
                return
            time.sleep(0.01)
        raise AssertionError("the worker did not stop itself")

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
        with contextlib.suppress(OSError):
            self.pipe.send(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


@pytest.fixture
def pairs(lock_table: str, dynamodb_local: str, database_url: str) -> Iterator[list[list[Worker]]]:
    """Two pairs (A, B) of workers: the two kinds of stall run side by side, on projects and
    resources of their own."""
    workers = [
        Worker(dynamodb_local, lock_table, database_url, f"dynasem-fence-worker-{n}")
        for n in range(4)
    ]
    try:
        yield [workers[:2], workers[2:]]
    finally:
        for worker in workers:
            worker.close()


def side_by_side(*calls: Any) -> None:
    """Run each call in a thread of its own; raise the first failure."""
    failures: list[BaseException] = []

    def run(call: Any) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - raised below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def seed(url: str, project: int) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DELETE FROM fence_work WHERE project = %s", [project])
        rows = [(project, "seed", n) for n in range(fence_worker.ROWS)]
        with db.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO fence_work (project, label, n) VALUES (%s, %s, %s)", rows
            )


def rows_of(url: str, project: int) -> list[tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as db:
        found = db.execute(
            "SELECT label, n FROM fence_work WHERE project = %s ORDER BY label, n", [project]
        ).fetchall()
    return [(label, n) for label, n in found]


def whole(rows: list[tuple[str, int]]) -> bool:
    """Exactly one rebuild's rows, each number once."""
    labels = {label for label, _ in rows}
    return len(labels) == 1 and sorted(n for _, n in rows) == list(range(fence_worker.ROWS))


def taken_over(resource: str, stale_fence: int, timeout: float = 15) -> None:
    """Wait until another hold than A's (fence ``stale_fence``) holds ``resource`` in DynamoDB
    (B with fence_db reports nothing until its first statement is through)."""
    from dynasem._operators.locks import holds_on

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(h.fence > stale_fence for h in holds_on(resource)):
            return
        time.sleep(0.05)
    raise AssertionError(f"nobody took {resource!r} over from fence {stale_fence}")


def until(condition: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


def stall_in_commit(pair: list[Worker], url: str, project: int, how: str) -> dict[str, Any]:
    """(a): A stalls in its COMMIT after its last check; B takes over, its first statement
    waits (on A's row locks) while A is stopped; then A goes on."""
    a, b = pair
    resource = f"tbl_issues:{project}"
    seed(url, project)
    a.start(resource, project, "A", how, "commit", False)
    a.wait_stopped()
    b.start(resource, project, "B", how, None, False)
    taken_over(resource, a.said("acquired")[0])
    until(b.waits_on_a_lock, "B's first statement waiting on A's locks")
    a.resume()
    return {"a": a.outcome(), "b": b.outcome(), "rows": rows_of(url, project)}


def stall_before_first_statement(
    pair: list[Worker], url: str, project: int, how: str
) -> dict[str, Any]:
    """(b): A stalls after acquiring, before its first statement; B takes over and is halfway
    through its rebuild, its transaction open, when A goes on."""
    a, b = pair
    resource = f"tbl_issues:{project}"
    seed(url, project)
    a.start(resource, project, "A", how, "first", False)
    a.wait_stopped()
    b.start(resource, project, "B", how, None, True)
    b.expect("halfway", timeout=15)
    a.resume()
    # B's transaction stays open until A's statement waits on it (or A has given up).
    until(lambda: a.waits_on_a_lock() or a.ended(), "A's statement waiting on B's locks")
    b.pipe.send("go")
    return {"a": a.outcome(), "b": b.outcome(), "rows": rows_of(url, project)}


def test_without_a_fence_the_stale_rebuild_lands_beside_the_new_one(
    pairs: list[list[Worker]], database_url: str
) -> None:
    """What fence_db prevents: the lock alone cannot stop a stale holder's transaction."""

    def runs_of(stall: Any, pair: list[Worker], first_project: int) -> None:
        for project in (first_project, first_project + 1):
            run = stall(pair, database_url, project, "none")
            labels = {label for label, _ in run["rows"]}
            assert labels == {"A", "B"} and len(run["rows"]) == 2 * fence_worker.ROWS, run
            assert pair[0].said("committed"), "A's stale transaction committed"

    side_by_side(
        lambda: runs_of(stall_in_commit, pairs[0], 1),
        lambda: runs_of(stall_before_first_statement, pairs[1], 11),
    )


def test_with_a_fence_every_stall_ends_whole(pairs: list[list[Worker]], database_url: str) -> None:
    """RUNS of each kind of stall, side by side, alternating fence_db=True and
    held.fence_transaction()."""

    def in_commit(pair: list[Worker]) -> None:
        a, b = pair
        for run_no in range(RUNS):
            how = "fence_db" if run_no % 2 == 0 else "explicit"
            run = stall_in_commit(pair, database_url, 100 + run_no, how)
            assert whole(run["rows"]) and run["rows"][0][0] == "B", (how, run, a.steps, b.steps)
            # A committed while B's first statement waited: B's purge found A's rows.
            assert a.said("committed") and b.said("purged") == [fence_worker.ROWS], (
                a.steps,
                b.steps,
            )
            assert run["b"] == "done"

    def before_first_statement(pair: list[Worker]) -> None:
        a, b = pair
        for run_no in range(RUNS):
            how = "fence_db" if run_no % 2 == 0 else "explicit"
            run = stall_before_first_statement(pair, database_url, 200 + run_no, how)
            assert whole(run["rows"]) and run["rows"][0][0] == "B", (how, run, a.steps, b.steps)
            # A's transaction wrote nothing and committed nothing: refused at its fence.
            assert run["a"] == "lost" and not a.said("purged") and not a.said("committed"), a.steps
            assert "newer than this hold's" in a.said("lost")[0], a.steps
            assert run["b"] == "done"

    side_by_side(lambda: in_commit(pairs[0]), lambda: before_first_statement(pairs[1]))
