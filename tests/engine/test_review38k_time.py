"""Review 38k: a second look at a hold's life in time (the clocks its deadlines are read and
waited on)."""

from __future__ import annotations

import importlib
import sys
import threading
import time
from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem import _clock as clock
from dynasem._engine.heartbeat import Heartbeat
from dynasem._engine.hold import stop_renewing
from dynasem._storage import lock_rows
from dynasem.testing import abandon
from tests.engine.test_heartbeat import unique, watching_lost
from tests.engine.test_review38b_time import host_suspended, taken_elsewhere
from tests.support.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's clocks")
def test_a_suspend_past_the_lease_is_declared_lost_at_once_on_waking(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host holding a 30 s lease sleeps two minutes; another host takes the lock over.
    ``held.lost`` says True on waking (its deadline is on CLOCK_BOOTTIME), but the
    heartbeat's scheduler kept its due times on CLOCK_MONOTONIC, which did not count the
    sleep: the next renewal, and with it ``lock_lost`` (a leadership's ``on_lost``), came
    only when the old renewal's pause ran out on that clock, up to a third of the lease after
    waking, while whoever stops its work on ``lock_lost`` went on beside the new holder."""
    resource = unique("suspend-beat")
    held = semaphore(resource, lease=30).acquire()
    other = None
    try:
        with watching_lost(held.token) as lost:
            host_suspended(monkeypatch, 120.0)
            other = taken_elsewhere(resource)
            assert lost.wait(timeout=3), "lock_lost waited for the renewal's old due time"
    finally:
        monkeypatch.undo()
        abandon(held)
        if other is not None:
            abandon(other)


def test_on_macos_the_trusted_clock_counts_a_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS has no CLOCK_BOOTTIME, and ``_clock`` fell back to ``time.monotonic``, which
    there is ``mach_absolute_time``: it stops while the Mac sleeps (a closed lid), as Linux's
    CLOCK_MONOTONIC does, so a sleeping holder woke trusting a hold another host took over.
    macOS's ``clock_gettime(CLOCK_MONOTONIC)`` counts the sleep (its man page; the clock that
    does not is CLOCK_UPTIME_RAW)."""
    slept = 120.0
    real_gettime, real_monotonic = time.clock_gettime, time.monotonic

    def gettime(clk: int) -> float:  # macOS's CLOCK_MONOTONIC: the sleep counted
        return real_gettime(clk) + (slept if clk == time.CLOCK_MONOTONIC else 0.0)

    before = real_monotonic()
    try:
        monkeypatch.setattr(sys, "platform", "darwin")
        monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
        monkeypatch.setattr(time, "clock_gettime", gettime)
        importlib.reload(clock)
        assert clock.monotonic() - before >= slept, "the trusted clock did not count the sleep"
    finally:
        monkeypatch.undo()
        importlib.reload(clock)


def waiting_in(function: str, thread: threading.Thread) -> bool:
    """``thread``'s innermost Python frame is ``function`` (blocked in a C call there, its
    timeout already reckoned)."""
    frame = sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code.co_name == function


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's clocks")
def test_a_renewal_hanging_through_a_suspend_is_declared_lost_on_waking(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal's request hangs (a dead endpoint): the heartbeat waits for it until the
    hold's deadline, ``join(seconds_left())``. That wait is counted on CLOCK_MONOTONIC: the
    host suspended meanwhile woke past the lease, but the join went on for what was left of
    the lease before the sleep, and ``lock_lost`` came that much late (up to a whole lease)
    while another host held the lock."""
    resource = unique("suspend-renewal")
    held = semaphore(resource, lease=30).acquire()
    stop_renewing(held)  # its heartbeat is the one below, in its renewal now
    hanging, answered = threading.Event(), threading.Event()
    real_update = lock_rows.update

    def hangs(action: dict[str, Any], **kwargs: Any) -> Any:
        hanging.set()
        answered.wait(30)
        return real_update(action, **kwargs)

    beat = threading.Thread(target=Heartbeat(held).beat, daemon=True)
    try:
        with watching_lost(held.token) as lost:
            monkeypatch.setattr(lock_rows, "update", hangs)
            beat.start()
            assert hanging.wait(10)
            wait_for(lambda: waiting_in("join", beat), 10, "the heartbeat waits for its renewal")
            monkeypatch.setattr(lock_rows, "update", real_update)
            host_suspended(monkeypatch, 120.0)  # another host may take the lock over now
            assert lost.wait(timeout=3), "lock_lost waited for the lease left before the sleep"
    finally:
        answered.set()
        beat.join(10)
        monkeypatch.undo()
        abandon(held)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's clocks")
def test_a_renew_waiting_behind_a_hanging_renewal_through_a_suspend_raises_on_waking(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``held.renew()`` waits for the heartbeat's renewal in flight (a dead endpoint) only
    while the hold can be trusted: ``_lock.acquire(timeout=seconds_left())``, a timeout on
    CLOCK_MONOTONIC. The host suspended meanwhile woke past its lease, the heartbeat
    declared the loss, and the caller's ``renew()`` still waited for what was left of the
    lease before the sleep before raising ``LockLost`` (the API: it raises once the lease ran
    out)."""
    resource = unique("suspend-renew")
    held = semaphore(resource, lease=30).acquire()
    stop_renewing(held)
    hanging, answered = threading.Event(), threading.Event()
    real_update = lock_rows.update

    def hangs(action: dict[str, Any], **kwargs: Any) -> Any:
        hanging.set()
        answered.wait(30)
        return real_update(action, **kwargs)

    raised: list[BaseException] = []

    def renew() -> None:
        try:
            held.renew()
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    beat = threading.Thread(target=Heartbeat(held).beat, daemon=True)
    caller = threading.Thread(target=renew, daemon=True)
    try:
        monkeypatch.setattr(lock_rows, "update", hangs)
        beat.start()
        assert hanging.wait(10)
        caller.start()
        wait_for(lambda: waiting_in("_renew", caller), 10, "renew() waits for the lock")
        host_suspended(monkeypatch, 120.0)
        caller.join(3)
        assert [type(e) for e in raised] == [LockLost], "renew() waited on past the lease"
    finally:
        answered.set()
        beat.join(10)
        caller.join(10)
        monkeypatch.undo()
        abandon(held)
