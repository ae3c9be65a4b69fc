"""Review 38b: a hold's life in time (the clock its trusted deadline is read on).

A holder trusts its hold until ``lease - CLOCK_SKEW`` after the send of its last write, by its
own monotonic clock; every other host takes it over once the stored lease end is
``CLOCK_SKEW`` old by its wall clock. The two agree only if the holder's clock counts every
second the wall clocks count.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem import _clock as clock
from dynasem._engine.hold import stop_renewing
from dynasem._storage import lock_rows
from dynasem.testing import abandon
from tests.engine.test_heartbeat import tokens_on, unique, watching_lost
from tests.support import workers

pytestmark = pytest.mark.django_db(transaction=False)


def host_suspended(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The clocks as Linux shows them after the host slept ``seconds`` (a laptop's lid, an
    EC2 instance hibernated, a VM suspended to disk): the wall clock and CLOCK_BOOTTIME count
    the sleep, CLOCK_MONOTONIC (``time.monotonic``) does not."""
    real_wall, real_gettime = time.time, time.clock_gettime

    def gettime(clk: int) -> float:
        return real_gettime(clk) + (seconds if clk == time.CLOCK_BOOTTIME else 0.0)

    monkeypatch.setattr(clock, "wall_clock", lambda: real_wall() + seconds)
    monkeypatch.setattr(time, "clock_gettime", gettime)


def taken_elsewhere(resource: str) -> Any:
    """Another holder's acquire (its own thread: not a nested acquire of ours), at once."""
    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(semaphore(resource, wait=0).acquire()))
    worker.start()
    worker.join(30)
    assert got, "the other acquire did not take the lock"
    return got[0]


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's clocks")
def test_a_hold_is_not_trusted_through_a_suspend_that_outlasted_its_lease(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host holding a 30 s lease sleeps two minutes. Every other host's wall clock went
    on: the lease ran out and another holder took the lock. The sleeper's deadline was read
    on CLOCK_MONOTONIC, which stops while the host sleeps: on waking it still trusted its
    hold for most of its lease (``held.lost`` False, ``seconds_left()`` about 28 s), its
    block going on beside the new holder's until its heartbeat's next renewal was refused
    (up to a third of the lease later). Two trusted holders."""
    resource = unique("suspend")
    held = semaphore(resource, lease=30).acquire()
    other = None
    try:
        host_suspended(monkeypatch, 120.0)
        other = taken_elsewhere(resource)
        assert tokens_on(resource) == {other.token}
        assert not other.lost
        assert held.seconds_left() == 0, "the sleeper still trusts a lease that ran out"
        assert held.lost
    finally:
        monkeypatch.undo()
        abandon(held)
        if other is not None:
            abandon(other)


def test_a_renewal_answered_past_the_trusted_deadline_raises_lock_lost(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``held.renew()`` whose request took longer than what was left of the hold's trust (a
    slow network, botocore's retries): the renewal is trusted from its send, so the hold's
    deadline stays behind us, and another host may take it over any moment (the stored end
    is a lease from the send). ``renew()`` returned as if it had extended the lease, the
    caller going on with its work (API: ``renew()`` raises ``LockLost`` once the lease ran
    out)."""
    resource = unique("late-renewal")
    held = semaphore(resource, lease=1.5).acquire()  # trusted 1.0 s (CLOCK_SKEW 0.5)
    stop_renewing(held)  # the caller's own renewal only
    real_update = lock_rows.update

    def slow_update(action: dict[str, Any], **kwargs: Any) -> Any:
        time.sleep(1.2)  # on its way past the trust it gives (1.0 s from its send)
        return real_update(action, **kwargs)

    try:
        monkeypatch.setattr(lock_rows, "update", slow_update)
        with pytest.raises(LockLost):
            held.renew()
        assert held.lost and held.seconds_left() == 0
    finally:
        monkeypatch.undo()
        held.release() if not held.lost else abandon(held)


def test_a_hold_whose_renewals_cannot_start_a_thread_is_declared_lost_at_its_deadline(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process at its pids limit (a container's ``pids.max``: threads count) cannot start
    the thread a renewal's request runs in. ``Heartbeat.beat`` let that RuntimeError out,
    and the scheduler tried again every 50 ms (an ERROR logged each time) for as long as the
    hold was not given back: past its deadline too, never declaring the loss. ``lock_lost``
    was never sent (nor a leadership's ``on_lost`` called), so whoever stops its work on it
    went on beside the next holder; a failed renewal is retried until the deadline, then the
    hold is lost, as a throttled one is."""
    resource = unique("no-thread")
    start = threading.Thread.start

    def renewals_cannot_start(thread: threading.Thread) -> None:
        if thread.name == f"dynasem-heartbeat:{resource}:renew":
            raise RuntimeError("can't start new thread")
        start(thread)

    held = semaphore(resource, lease=1.5).acquire()  # trusted 1.0 s (CLOCK_SKEW 0.5)
    try:
        with watching_lost(held.token) as lost:
            monkeypatch.setattr(threading.Thread, "start", renewals_cannot_start)
            assert lost.wait(timeout=3), "lock_lost was never sent"
        assert held._heartbeat is None or held._heartbeat.stopped
    finally:
        monkeypatch.undo()
        abandon(held)


SPAWN = multiprocessing.get_context("spawn")


def test_a_hold_copied_into_a_forked_child_is_not_trusted_once_its_holder_is_taken_over(
    dynamodb_local: str, lock_table: str, tmp_path: Any
) -> None:
    """A process holds (30 s lease) and forks a worker inside its block, which keeps a copy
    of the hold (``held.here`` False). The holder is killed (the OOM killer, SIGKILL); the
    worker lives on. A waiter of this host proves the holder's process ended and takes the
    lock at once, long before the lease the copy was taken under ends: the copy still says
    ``lost`` False and ``seconds_left()`` about 28 s. Without the same-host take-over the
    copy would be sound (nobody takes over before the stored lease end, which is at least
    the copy's deadline plus CLOCK_SKEW); with it, the child can never know when its
    parent is proven dead. Mend proposed: a copy in another process than the one recorded
    in the row is not trusted (``seconds_left()`` 0, ``lost`` True, ``renew()`` refused),
    where a same-host waiter could take it over (an identity was recorded), or documented
    as such; ``fence_db`` work stays safe either way (the fence row orders it)."""
    resource = unique("forked-copy")
    report = str(tmp_path / "child.json")
    out = SPAWN.Queue()
    holder = SPAWN.Process(
        target=workers.hold_and_fork_a_worker,
        args=(dynamodb_local, lock_table, resource, 30.0, report, out),
    )
    holder.start()
    child = 0
    try:
        kind, dead_fence, child = out.get(timeout=60)
        assert kind == "held"
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        with semaphore(resource, wait=5) as other:  # proven dead: taken at once
            assert other.fence > dead_fence
            for _ in range(100):
                if os.path.exists(report):
                    break
                time.sleep(0.05)
            with open(report) as f:
                lost, left = json.load(f)
        assert lost or left == 0, (
            f"the forked child trusted its copy for {left:.1f} s more while another held"
        )
    finally:
        holder.kill()
        holder.join(10)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def test_a_hold_whose_heartbeat_cannot_start_its_thread_is_declared_lost_at_its_deadline(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same pids limit one step earlier: the scheduler cannot start the thread a due
    renewal runs in. It logged an ERROR and tried again every 50 ms, past the hold's
    deadline too, and the loss was never declared: ``lock_lost`` never sent, a
    leadership's ``on_lost`` never called."""
    resource = unique("no-beat")
    start = threading.Thread.start

    def beats_cannot_start(thread: threading.Thread) -> None:
        if thread.name == f"dynasem-heartbeat:{resource}":
            raise RuntimeError("can't start new thread")
        start(thread)

    held = semaphore(resource, lease=1.5).acquire()  # trusted 1.0 s (CLOCK_SKEW 0.5)
    try:
        with watching_lost(held.token) as lost:
            monkeypatch.setattr(threading.Thread, "start", beats_cannot_start)
            assert lost.wait(timeout=3), "lock_lost was never sent"
    finally:
        monkeypatch.undo()
        abandon(held)
