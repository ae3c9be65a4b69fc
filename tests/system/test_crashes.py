"""Holders that die or stall, as OS processes on DynamoDB Local."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
from django.test import override_settings

from dynasem import semaphore
from dynasem.conf import settings
from tests.support import workers
from tests.support.fencing import fenced_put

SPAWN = multiprocessing.get_context("spawn")


def test_killed_holder_is_taken_over_within_lease_plus_one_second(dynamodb_local, lock_table):
    lease = 2.0
    out = SPAWN.Queue()
    proc = SPAWN.Process(
        target=workers.hold_until_killed, args=(dynamodb_local, lock_table, "job:1", lease, out)
    )
    proc.start()
    try:
        kind, dead_fence = out.get(timeout=60)
        assert kind == "held"
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        with semaphore("job:1", wait=lease + 5) as held:
            waited = time.monotonic() - killed
            assert held.fence > dead_fence
    finally:
        proc.kill()
        proc.join(10)
    # The lease, the skew the takeover allows for, and one second.
    assert waited <= lease + settings.CLOCK_SKEW + 1.0, waited


def test_paused_holder_loses_its_hold_and_its_fenced_write_is_refused(dynamodb_local, lock_table):
    lease = 1.5
    out, go_on = SPAWN.Queue(), SPAWN.Event()
    proc = SPAWN.Process(
        target=workers.hold_then_pause,
        args=(dynamodb_local, lock_table, "doc:1", lease, out, go_on),
    )
    proc.start()
    try:
        kind, old_fence = out.get(timeout=60)
        assert kind == "held"
        os.kill(proc.pid, signal.SIGSTOP)  # a GC pause, a stalled VM: no heartbeat either
        with semaphore("doc:1", wait=lease + 5, user="next") as held:
            assert held.fence > old_fence
            fenced_put("document", "fresh body", held.fence)
            os.kill(proc.pid, signal.SIGCONT)  # resume before set(): set() waits for waiters
            go_on.set()
            assert out.get(timeout=30) == ("fenced-write", "refused")
            kind, outcome = out.get(timeout=30)
            assert kind == "exit" and outcome.startswith("LockLost"), outcome
            # The stale holder's exit did not remove the current hold.
            from dynasem._operators.locks import holds_on

            assert [h.token for h in holds_on("doc:1")] == [held.token]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_override_settings_reaches_worker_settings(lock_table):
    # The workers read endpoint and table from the environment the fixtures set.
    assert os.environ["DYNASEM_TEST_TABLE"] == lock_table
    with override_settings(DYNASEM=dict(settings.raw, TABLE_NAME=lock_table)):
        assert settings.TABLE_NAME == lock_table


# How often each stalled-waiter scenario runs in one test (the acceptance asks for 20 runs in a
# row: DYNASEM_STALL_RUNS=20 make test PYTEST_ARGS="-k stalled").
STALL_RUNS = int(os.environ.get("DYNASEM_STALL_RUNS", "1"))


def _stopped(pid: int, timeout: float = 10) -> None:
    """Wait until the kernel shows the process stopped (SIGSTOP delivered)."""
    deadline = time.monotonic() + timeout
    while True:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] == "T":
                return
        assert time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.005)


def _queued(resource: str, timeout: float = 60) -> None:
    from tests.support.helpers import queue_of

    deadline = time.monotonic() + timeout
    while not queue_of(resource):
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.02)


@pytest.mark.parametrize("push", ["127.0.0.1", None], ids=["push", "no-push"])
@pytest.mark.parametrize("stall", ["through-hand-over", "after-own-read"])
def test_a_waiter_stalled_through_its_hand_over_never_runs_inside_the_next_hold(
    dynamodb_local, lock_table, push, stall
):
    """W queues; the holder, who has seen the queue, hands W the lock while W is paused (or W
    pauses right after learning it holds, before returning); W's lease and the skew run out and
    X takes the lock legitimately; W resumes while X holds. W must not enter its block before X
    releases (whatever told it it held: a buffered push, a read, a refused write's old item),
    and must get the lock afterwards."""
    lease_w, skew = 1.5, settings.CLOCK_SKEW
    for run in range(STALL_RUNS):
        resource = f"rebuild:{stall}:{push}:{run}"
        holder = semaphore(resource, user="H").acquire()
        out, stopped = SPAWN.Queue(), SPAWN.Event()
        proc = SPAWN.Process(
            target=workers.stall_through_hand_over,
            args=(
                dynamodb_local,
                lock_table,
                resource,
                lease_w,
                push,
                stall == "after-own-read",
                stopped,
                out,
            ),
        )
        proc.start()
        try:
            _queued(resource)
            holder.renew()  # its answer shows the holder the queue: release hands over to W
            if stall == "through-hand-over":
                os.kill(proc.pid, signal.SIGSTOP)
                _stopped(proc.pid)
                holder.release()  # to W, and (with pushes) the item goes to W's socket
                handed = time.monotonic()
            else:
                holder.release()
                handed = time.monotonic()
                assert stopped.wait(30), "W never saw its own hold"
                _stopped(proc.pid)
            # W's handed-over lease and the skew run out: X takes the lock, legitimately.
            time.sleep(max(0.0, handed + lease_w + skew + 0.3 - time.monotonic()))
            x = semaphore(resource, user="X", wait=10).acquire()
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(2.5)  # X works; W runs again meanwhile
            x_end = time.monotonic()
            x.release()
            kind, entered, _left, fence = out.get(timeout=60)
            assert kind == "block"
            assert entered > x_end, (
                f"run {run}: W entered its block {x_end - entered:.2f}s before X released"
            )
            assert fence > x.fence
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.join(30)
            if proc.is_alive():
                proc.kill()


# -- dead holders on this host: taken over at once ----------------------------------------------


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def _stored_holders(resource: str) -> list[str]:
    from dynasem._storage import lock_rows, records

    return list((lock_rows.get(resource) or records.LockItem()).holders)


needs_proc = pytest.mark.skipif(
    not os.path.isdir(f"/proc/{os.getpid()}"), reason="the takeover of dead holders needs Linux"
)


@needs_proc
@pytest.mark.parametrize("reaped", [False, True], ids=["zombie", "reaped"])
def test_a_holder_killed_mid_hold_is_taken_over_at_once_on_its_host(
    dynamodb_local, lock_table, reaped
):
    """A holder with a 60 s lease is SIGKILLed: a waiter on its host takes the resource over at
    once (wait=3 can only succeed by a takeover), whether the dead process is still a zombie
    (its parent, this test, has not reaped it) or gone from /proc."""
    out = SPAWN.Queue()
    proc = SPAWN.Process(
        target=workers.hold_until_killed, args=(dynamodb_local, lock_table, "job:2", 60.0, out)
    )
    proc.start()
    try:
        kind, dead_fence = out.get(timeout=60)
        assert kind == "held"
        [dead_token] = _stored_holders("job:2")
        os.kill(proc.pid, signal.SIGKILL)
        if reaped:
            proc.join(10)
            assert not os.path.exists(f"/proc/{proc.pid}")
        else:
            deadline = time.monotonic() + 10
            while _proc_state(proc.pid) != "Z":
                assert time.monotonic() < deadline, "the killed holder never became a zombie"
                time.sleep(0.005)
        with semaphore("job:2", wait=3, user="next") as held:
            assert held.fence > dead_fence
            # The dead holder's entry went in the same write: we alone hold it.
            assert _stored_holders("job:2") == [held.token] != [dead_token]
    finally:
        proc.kill()
        proc.join(10)


@needs_proc
@pytest.mark.parametrize("push", ["127.0.0.1", None], ids=["push", "no-push"])
def test_a_queued_waiter_takes_over_from_a_holder_that_dies(dynamodb_local, lock_table, push):
    """A waiter queued behind a holder (lease 60 s) that is then SIGKILLed notices it between
    its paced reads and holds the resource well within its wait of 8 s."""
    out, waiter_out = SPAWN.Queue(), SPAWN.Queue()
    holder = SPAWN.Process(
        target=workers.hold_until_killed, args=(dynamodb_local, lock_table, "job:3", 60.0, out)
    )
    holder.start()
    waiter = None
    try:
        kind, dead_fence = out.get(timeout=60)
        assert kind == "held"
        waiter = SPAWN.Process(
            target=workers.take_and_report,
            args=(dynamodb_local, lock_table, "job:3", 8.0, push, waiter_out),
        )
        waiter.start()
        _queued("job:3")
        time.sleep(0.3)  # the waiter sleeps toward its turn
        os.kill(holder.pid, signal.SIGKILL)  # not reaped: a zombie to every other process
        kind, _when, fence, _token = waiter_out.get(timeout=30)
        assert kind == "held", "the waiter gave up: the dead holder was not taken over"
        assert fence > dead_fence
    finally:
        holder.kill()
        holder.join(10)
        if waiter is not None:
            waiter.join(30)
            if waiter.is_alive():
                waiter.kill()


@needs_proc
@pytest.mark.parametrize("paused", [False, True], ids=["running", "stopped"])
def test_a_live_holder_on_this_host_is_never_taken_over(dynamodb_local, lock_table, paused):
    """Its process is there with the start time it recorded, running or SIGSTOPped (a stopped
    process wakes up believing it holds): the waiter waits out its wait and is refused."""
    from dynasem import SemaphoreBusy

    out = SPAWN.Queue()
    proc = SPAWN.Process(
        target=workers.hold_until_killed, args=(dynamodb_local, lock_table, "job:4", 60.0, out)
    )
    proc.start()
    try:
        kind, _fence = out.get(timeout=60)
        assert kind == "held"
        if paused:
            os.kill(proc.pid, signal.SIGSTOP)
            _stopped(proc.pid)
        with pytest.raises(SemaphoreBusy):
            semaphore("job:4", wait=1.5, user="next").acquire()
        assert len(_stored_holders("job:4")) == 1
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.join(10)


@needs_proc
@pytest.mark.parametrize(
    "how", ["exit", "sigterm-handler", "daemon-thread", "forked-child"], ids=str
)
def test_a_process_that_exits_normally_gives_back_what_it_holds(dynamodb_local, lock_table, how):
    """atexit gives back the holds of a process that ends normally (sys.exit, or its own SIGTERM
    handler that exits, as gunicorn's do); a hold a daemon thread is still inside is left (the
    process is gone a moment later: taken over at once on this host); a forked child's exit,
    or its leaving the block it was forked in, never gives back its parent's hold."""
    resource = f"exit:{how}"
    out = SPAWN.Queue()
    proc = SPAWN.Process(
        target=workers.hold_and_exit, args=(dynamodb_local, lock_table, resource, how, out)
    )
    proc.start()
    try:
        kind, _fence = out.get(timeout=60)
        assert kind == "held"
        if how == "forked-child":
            assert out.get(timeout=60) == ("after-child", True)
        if how == "sigterm-handler":
            os.kill(proc.pid, signal.SIGTERM)
        proc.join(30)
        assert proc.exitcode == 0
        if how == "daemon-thread":
            assert len(_stored_holders(resource)) == 1  # left: its block may have been running
            with semaphore(resource, wait=3, user="next"):  # but the process is gone
                pass
        else:
            assert _stored_holders(resource) == []
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
