"""A sixth review: how a holder (or waiter) of this host is known dead, and the datagrams
between processes (hand-over pushes, words).

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import processes
from dynasem._storage import lock_rows

WT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or processes.identity() is None,
    reason="dead holders are recognised on Linux only",
)


class Child(NamedTuple):
    pid: int
    token: str
    own_client: bool


@pytest.fixture
def forked_holder(dynamodb_local: str, lock_table: str) -> Iterator[object]:
    """Start a "uWSGI master" that forks a holder with none of Python's at-fork hooks run
    (tests/support/workers.py); the master has exited when this returns the child."""
    children: list[int] = []

    def start(resource: str, *, lease: float, warm: str = "") -> Child:
        code = (
            "from tests.support.workers import hold_in_a_child_forked_without_hooks as run\n"
            f"run({dynamodb_local!r}, {lock_table!r}, {resource!r}, {lease!r}, {warm!r})\n"
        )
        master = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=WT,
            env={**os.environ, "PYTHONPATH": WT},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert master.stdout is not None
        with master.stdout:
            line = master.stdout.readline()  # the child keeps stderr: not read to its end
        assert master.wait(60) == 0 and line.strip(), "the child did not hold (its stderr)"
        said = json.loads(line)
        children.append(said["pid"])
        return Child(said["pid"], said["token"], said["own_client"])

    yield start
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- a child forked without Python's at-fork hooks (a uWSGI worker) ---------------------------


@linux_only
def test_a_child_forked_without_at_fork_hooks_records_its_own_process(forked_holder) -> None:
    """Its master had probed its identity; the child recorded the master's pid and start time
    (functools.cache, cleared only by an at-fork hook), so once the master was gone a waiter
    of this host took the live child's hold over: two holders. Mend: the probe is cached per
    pid (processes._probe_of)."""
    child = forked_holder("uwsgi:1", lease=60)
    row = lock_rows.get("uwsgi:1")
    assert row is not None and list(row.holders) == [child.token]
    recorded = row.holders[child.token].proc
    assert recorded is not None and recorded.split(processes.SEP)[1] == str(child.pid)
    # Its master has exited; the child holds on.
    with pytest.raises(SemaphoreBusy):
        semaphore("uwsgi:1", wait=0).acquire()
    os.kill(child.pid, 0)  # still running


@linux_only
def test_a_child_forked_without_at_fork_hooks_renews_its_holds(forked_holder) -> None:
    """Its master had held a lock, so its heartbeat's scheduler had a thread; the child kept
    that scheduler (replaced only by an at-fork hook), whose thread did not come along: the
    child's hold was never renewed, and taken over at its lease's end while the child still
    held it (no renewal failed, so no lock_lost either). Mend: a scheduler made in another
    process is replaced before use (heartbeat.later, heartbeat.scheduled)."""
    lease, skew = 1.5, 0.5
    child = forked_holder("uwsgi:2", lease=lease, warm="sync")
    time.sleep(lease + skew + 1.0)  # its lease has run out unless it was renewed
    with pytest.raises(SemaphoreBusy):
        semaphore("uwsgi:2", wait=0).acquire()
    row = lock_rows.get("uwsgi:2")
    assert row is not None and list(row.holders) == [child.token]


@linux_only
@pytest.mark.parametrize("warm", ["sync", "async"])
def test_a_child_forked_without_at_fork_hooks_has_its_own_client_and_threads(
    forked_holder, warm: str
) -> None:
    """Its master had sent requests: the child kept the master's DynamoDB client (reset only
    by an at-fork hook), whose pooled connections every such child of the master shares, so
    one child can read another's answer (a take it did not win, "applied"). With ``async``,
    the master's executor too, whose idle threads did not come along: the child's first
    request was never run, and its acquire waited forever (the child ended, the master
    printed nothing). Mend: a client, or an executor, made in another process is replaced
    before use (dynamodb.get_client, steps.io_executor)."""
    child = forked_holder(f"uwsgi:3{warm}", lease=60, warm=warm)
    assert child.own_client
    row = lock_rows.get(f"uwsgi:3{warm}")
    assert row is not None and list(row.holders) == [child.token]
