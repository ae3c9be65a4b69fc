"""A sixth review: how a holder (or waiter) of this host is known dead, and the datagrams
between processes (hand-over pushes, words).

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import asyncio
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
from dynasem import _clock as clock
from dynasem._engine import processes
from dynasem._storage import lock_rows, lock_writes, records
from tests.support.helpers import enqueue_entry

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
    lease, skew = 3.0, 0.5  # a lease long enough for a renewal on a loaded machine
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


# -- a dead holder of this host, and a waiter of another host first in line -----------------


@pytest.fixture
def dead() -> str:
    """The identity of a process of this host that has ended and been reaped."""
    proc = subprocess.Popen(["sleep", "60"])
    with open(f"/proc/{proc.pid}/stat") as f:
        start = f.read().rpartition(")")[2].split()[19]
    mine = processes.identity()
    assert mine is not None
    recorded = processes.SEP.join([mine.split(processes.SEP)[0], str(proc.pid), start])
    proc.kill()
    proc.wait()
    return recorded


@linux_only
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_dead_holder_ahead_of_another_hosts_waiter_is_handed_on(
    lock_table: str, dead: str, driver: str
) -> None:
    """A holder of this host was killed with most of a minute's lease left. The first in
    line is a waiter of another host (it cannot prove the holder dead: it waits for the
    lease); a waiter of this host, second in line, can prove it, but may not take the lock
    past the first. The lock stayed idle for the lease: nobody handed it on. Mended: such a
    waiter hands the lock to the first live waiter ahead in one write, as a release would
    (conditional on the dead holder's entry unchanged and on ``qout`` as read), pushes it,
    and waits on for its own turn."""
    now = clock.now_ms()
    entry = lock_writes.holder_entry("killed", now + 60_000, clock.new_fence(0.5), now, False, dead)
    lock_rows.update(
        lock_writes.take_free("r:1", "killed", entry, mode="x", limit=1, stale_ms=now - 500)
    )
    elsewhere = records.Waiter(
        clock.new_fence(0), now + 60_000, user_id="elsewhere", lease_ms=60_000, proc=None
    )
    enqueue_entry("r:1", "elsewhere", elsewhere)
    assert processes.gone(dead)
    waiter = semaphore("r:1", fair=True, wait=1.5)
    with pytest.raises(SemaphoreBusy):  # behind the first in line: right
        waiter.acquire() if driver == "sync" else asyncio.run(waiter.aacquire())
    row = lock_rows.get("r:1")
    assert row is not None and list(row.holders) == ["elsewhere"]  # handed on to it


@linux_only
def test_a_hand_on_is_refused_once_the_dead_holders_entry_is_gone(
    lock_table: str, dead: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-on of the test above, its write held back until the dead holder's entry
    was replaced by another's (its lease ended meanwhile and a newcomer took the row): the
    write is refused, and the first waiter is not made a holder beside the newcomer. The
    size of the holders map alone would not have told."""
    now = clock.now_ms()
    entry = lock_writes.holder_entry("killed", now + 60_000, clock.new_fence(0.5), now, False, dead)
    lock_rows.update(
        lock_writes.take_free("r:2", "killed", entry, mode="x", limit=1, stale_ms=now - 500)
    )
    elsewhere = records.Waiter(
        clock.new_fence(0), now + 60_000, user_id="elsewhere", lease_ms=60_000, proc=None
    )
    enqueue_entry("r:2", "elsewhere", elsewhere)
    newcomer = lock_writes.holder_entry("newcomer", now + 60_000, clock.new_fence(0.5), now, False)
    replace = lock_writes.update_action(
        "r:2",
        records.LOCK_SK,
        "REMOVE #h.#k SET #h.#n = :entry",
        "",
        {"#k": "killed", "#n": "newcomer"},
        {":entry": records.holder_value(newcomer)},
    )
    built = lock_writes.hand_on
    sent: list[str] = []

    def hand_on(*args: object, **kwargs: object) -> dict[str, object]:
        if not sent:
            lock_rows.update(replace)  # between the waiter's read and its write
            sent.append("replaced")
        return built(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lock_writes, "hand_on", hand_on)
    with pytest.raises(SemaphoreBusy):
        semaphore("r:2", fair=True, wait=1.5).acquire()
    assert sent == ["replaced"]
    row = lock_rows.get("r:2")
    assert row is not None and list(row.holders) == ["newcomer"], "two holders"
