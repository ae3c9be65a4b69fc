"""dynasem._engine.heartbeat on DynamoDB Local: background renewal, stopping, and declaring a loss.

Every hold here has lease=1.5 with CLOCK_SKEW=0.5, so the heartbeat renews every ~0.33 s and a
holder trusts its lease for 1.0 s after the last renewal it sent.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from dynasem import LockLost, SemaphoreBusy, semaphore
from dynasem import _clock as clock
from dynasem._engine import heartbeat
from dynasem._operators import locks as operations
from dynasem.signals import lock_lost
from tests.support.helpers import RequestCounter, break_holds, dynasem_settings

LEASE = 1.5
SKEW = 0.5  # CLOCK_SKEW of the test settings
INTERVAL = (LEASE - SKEW) / 3


class LostLog:
    """lock_lost signals of one token, with the wall time each was received."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.at: list[float] = []

    def __call__(self, sender: Any, token: str | None = None, **kwargs: Any) -> None:
        if token == self.token:
            self.at.append(time.time())

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.at and time.monotonic() < deadline:
            time.sleep(0.01)
        return bool(self.at)


@contextlib.contextmanager
def watching_lost(token: str) -> Iterator[LostLog]:
    log = LostLog(token)
    lock_lost.connect(log, weak=False)
    try:
        yield log
    finally:
        lock_lost.disconnect(log)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def stored_end(resource: str, token: str) -> float:
    (hold,) = [h for h in operations.holds_on(resource) if h.token == token]
    return hold.expires_ms / 1000


def tokens_on(resource: str) -> set[str]:
    return {h.token for h in operations.holds_on(resource)}


def heartbeat_threads(resource: str) -> list[threading.Thread]:
    """The threads renewing holds on ``resource`` right now."""
    name = f"dynasem-heartbeat:{resource[:40]}"
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def heartbeats_of(resource: str) -> list[heartbeat.Heartbeat]:
    """The heartbeats of this process still scheduled (or renewing) for ``resource``."""
    return [hb for hb in heartbeat.scheduled() if hb.held.resource == resource]


def wait_for_renewal(held: Any, timeout: float = 2.0) -> float:
    """Wait until the heartbeat renewed ``held``; return when that renewal was sent."""
    before = held.expires
    deadline = time.monotonic() + timeout
    while held.expires == before:
        assert time.monotonic() < deadline, "the heartbeat did not renew"
        time.sleep(0.005)
    return held.expires.timestamp() - LEASE


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentEndpoint:
    """A TCP server that accepts connections and never answers (a hung network path)."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.server.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.conns.append(self.server.accept()[0])

    def close(self) -> None:
        """Drop every connection: hung requests fail at once (and new ones are refused)."""
        self._stop.set()
        self._thread.join()
        for conn in self.conns:
            conn.close()
        self.server.close()


# Whether this process warmed the engine up (a module global, not a module-scoped fixture: the
# suite runs the tests of a module with one on one xdist worker, tests/support/xdist_groups.py,
# and these need no server of their own).
_warmed = {"warm": False}


@pytest.fixture(autouse=True)
def warm_engine(lock_table: str) -> None:
    """Once per process: a freshly started DynamoDB Local (a cold JVM) can take over a second
    to answer its first requests, longer than these tests' leases can survive."""
    if _warmed["warm"]:
        return
    deadline = time.monotonic() + 10
    for i in range(200):
        started = time.monotonic()
        with semaphore(f"warm-up-{i % 4}", lease=30, wait=5):
            pass
        if (time.monotonic() - started < 0.05 and i >= 20) or time.monotonic() > deadline:
            break
    _warmed["warm"] = True


# ---------------------------------------------------------------------------------------------
# Renewing
# ---------------------------------------------------------------------------------------------


def test_hold_is_renewed_in_background_and_never_taken_over(lock_table: str) -> None:
    resource = unique("hb")
    with semaphore(resource, lease=LEASE, user="alice") as held:
        with watching_lost(held.token) as lost:
            # One renewal first: the heartbeat runs and the engine answers promptly (a cold,
            # CPU-starved DynamoDB Local can take over a second for its first requests).
            wait_for_renewal(held)
            first_end = stored_end(resource, held.token)
            started = time.monotonic()
            # A concurrent acquirer keeps trying for 3 s: 1.5 times lease + skew.
            with pytest.raises(SemaphoreBusy) as raised:
                semaphore(resource, user="bob", wait=3).acquire()
            assert time.monotonic() - started >= 2.9
            assert raised.value.holder_user_id == "alice"
            last_end = stored_end(resource, held.token)
            assert last_end - first_end >= 2.0
            assert tokens_on(resource) == {held.token}
            assert held.expires.timestamp() >= first_end + 2.0
            assert not held.lost
    assert lost.at == []
    assert operations.holds_on(resource) == []


def test_counting_hold_renewed_while_another_holder_ends_later(lock_table: str) -> None:
    resource = unique("pool")
    long = semaphore(resource, limit=2, lease=30).acquire()
    short = semaphore(resource, limit=2, lease=LEASE).acquire()
    wait_for_renewal(short)
    first_end = stored_end(resource, short.token)
    time.sleep(LEASE + SKEW + 0.2)  # past the first lease end + skew
    assert stored_end(resource, short.token) - first_end >= 1.5
    with pytest.raises(SemaphoreBusy):
        semaphore(resource, limit=2, wait=0).acquire()
    assert tokens_on(resource) == {long.token, short.token}
    assert not short.lost
    short.release()
    long.release()
    assert operations.holds_on(resource) == []


def test_several_resources_renewed_together(lock_table: str) -> None:
    a, b = unique("a"), unique("b")
    held = semaphore([a, b], lease=LEASE).acquire()
    wait_for_renewal(held)
    first = {r: stored_end(r, held.token) for r in (a, b)}
    time.sleep(LEASE + SKEW + 0.2)
    for r in (a, b):
        assert stored_end(r, held.token) - first[r] >= 1.5
        with pytest.raises(SemaphoreBusy):
            semaphore(r, wait=0).acquire()
    assert not held.lost
    held.release()
    assert operations.holds_on(a) == [] and operations.holds_on(b) == []


# ---------------------------------------------------------------------------------------------
# Stopping
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["release", "with", "async with"])
def test_heartbeat_stops_after_release(
    lock_table: str, requests_sent: RequestCounter, how: str
) -> None:
    import asyncio

    resource = unique("stop")
    renewed_while_held: list[int] = []
    beating: list[heartbeat.Heartbeat] = []

    def hold_for_a_while() -> None:
        requests_sent.reset()
        time.sleep(2 * INTERVAL + 0.15)
        renewed_while_held.append(requests_sent.calls["UpdateItem"])
        beating.extend(heartbeats_of(resource))

    if how == "release":
        held = semaphore(resource, lease=LEASE).acquire()
        hold_for_a_while()
        held.release()
    elif how == "with":
        with semaphore(resource, lease=LEASE):
            hold_for_a_while()
    else:

        async def main() -> None:
            async with semaphore(resource, lease=LEASE):
                await asyncio.to_thread(hold_for_a_while)

        asyncio.run(main())
    assert renewed_while_held[0] >= 1  # the heartbeat was running
    assert len(beating) == 1
    assert beating[0].stopped  # stopped at once, not at its next renewal
    assert heartbeats_of(resource) == []
    # Of this resource: a hold an earlier test of this worker left may still renew.
    requests_sent.watch(resource)
    requests_sent.reset()
    time.sleep(2 * INTERVAL + 0.15)  # two renewals would have been due
    assert requests_sent.naming == 0
    assert operations.holds_on(resource) == []


# ---------------------------------------------------------------------------------------------
# Losing the hold
# ---------------------------------------------------------------------------------------------


def test_broken_hold_is_declared_lost(lock_table: str) -> None:
    resource = unique("broken")
    held = semaphore(resource, lease=LEASE, user="alice").acquire()
    with watching_lost(held.token) as lost:
        break_holds(resource)
        other = semaphore(resource, wait=0).acquire()
        assert lost.wait(timeout=INTERVAL + 0.5), "the heartbeat did not notice the break"
        assert held.lost
        with pytest.raises(LockLost):
            held.renew()
        with pytest.raises(LockLost):
            held.release()
        time.sleep(INTERVAL + 0.1)
        assert len(lost.at) == 1
    assert tokens_on(resource) == {other.token}
    other.release()


def test_a_hold_known_lost_has_no_seconds_left(lock_table: str) -> None:
    """Long work is told to watch ``held.seconds_left()`` (docs/how-to/failures.md): once the
    hold is known lost (broken, taken over) before its deadline, it says 0, as ``lost`` does,
    not what is left of a lease that is no longer ours."""
    resource = unique("broken-left")
    held = semaphore(resource, lease=6, user="alice").acquire()
    break_holds(resource)
    other = semaphore(resource, wait=0).acquire()
    with pytest.raises(LockLost):
        held.renew()  # refused: what the heartbeat's next renewal finds
    assert held.lost
    assert held.seconds_left() == 0
    other.release()


def test_unreachable_endpoint_loses_hold_no_earlier_than_lease_minus_skew(
    lock_table: str,
) -> None:
    resource = unique("dead")
    held = semaphore(resource, lease=LEASE).acquire()
    with watching_lost(held.token) as lost:
        wait_for_renewal(held)
        # The trust its answered renewals earned (a renewal in flight now may be answered
        # after the deadline on a loaded machine: the loss is declared at the deadline all
        # the same, while held.expires takes that renewal's later lease end).
        switched = time.time()
        trusted_until = switched + held.seconds_left()
        assert 0 <= trusted_until - switched <= LEASE - SKEW
        dead = dynasem_settings(f"http://127.0.0.1:{closed_port()}", lock_table)
        with override_settings(DYNASEM=dead):
            assert lost.wait(timeout=3 * LEASE), "the loss was never declared"
            # Not before the holder's own trust ran out...
            assert lost.at[0] >= trusted_until - 0.005
            # ...and before another holder could take the hold over.
            last_renewal = held.expires.timestamp() - LEASE  # when the last one was sent
            assert lost.at[0] - last_renewal < LEASE + SKEW
            assert held.lost
            with pytest.raises(LockLost):
                held.renew()
        with pytest.raises(LockLost):
            held.renew()
        with pytest.raises(LockLost):
            held.release()
        assert len(lost.at) == 1
    assert heartbeats_of(resource) == []
    # release still gave back what was ours: nobody had taken it over.
    assert operations.holds_on(resource) == []


def test_short_outage_does_not_lose_hold(lock_table: str, caplog: pytest.LogCaptureFixture) -> None:
    resource = unique("blip")
    # A longer lease than the module's: a 1 s trust window is too thin for the timing of this
    # test on a loaded 2-core machine (each settings change rebuilds the boto3 client).
    lease = 4.0
    interval = (lease - SKEW) / 3
    held = semaphore(resource, lease=lease).acquire()
    caplog.set_level(logging.INFO, logger="dynasem")
    with watching_lost(held.token) as lost:
        wait_for_renewal(held, timeout=5.0)
        outage_started = time.time()
        dead = dynasem_settings(f"http://127.0.0.1:{closed_port()}", lock_table)
        with override_settings(DYNASEM=dead):
            # The outage lasts until a renewal fell in it (a loaded machine may be late to
            # send one), and no longer than two renewals' time.
            until = time.monotonic() + 2 * interval
            while not (failed := any("retrying" in r.getMessage() for r in caplog.records)):
                if time.monotonic() > until:
                    break
                time.sleep(0.02)
        assert failed, "no renewal failed"
        time.sleep(lease)  # well past the trust of the last renewal before the outage
        assert lost.at == []
        assert not held.lost
        assert stored_end(resource, held.token) > outage_started + lease + 1.0
        held.renew()
        held.release()
        assert lost.at == []
    assert operations.holds_on(resource) == []


def test_hung_endpoint_loss_declared_before_takeover_is_possible(lock_table: str) -> None:
    resource = unique("hung")
    held = semaphore(resource, lease=LEASE).acquire()
    silent = SilentEndpoint()
    lost_now: list[bool] = []
    try:
        with watching_lost(held.token) as lost:
            last_renewal = wait_for_renewal(held)
            with override_settings(DYNASEM=dynasem_settings(silent.url, lock_table)):
                # From lease + skew after the last renewal on, anyone may take it over.
                time.sleep(max(0.0, last_renewal + LEASE + SKEW - time.time()))
                signalled = bool(lost.at)
                reader = threading.Thread(target=lambda: lost_now.append(held.lost), daemon=True)
                reader.start()
                reader.join(0.3)
                read = list(lost_now)
                silent.close()  # let the hung renewal fail, so the heartbeat ends
                reader.join(5)
                for t in heartbeat_threads(resource):
                    t.join(5)
    finally:
        silent.close()
        with contextlib.suppress(LockLost):
            held.release()
    assert signalled, "lock_lost was not sent before another holder could take over"
    assert read == [True], "held.lost did not answer promptly"


def test_renew_behind_a_hung_renewal_raises_lock_lost_by_the_deadline(lock_table: str) -> None:
    """A holder cut off from DynamoDB (its packets silently dropped): the heartbeat's renewal
    hangs, holding the hold's request lock, for as long as botocore's timeouts allow (tens of
    seconds). The block's own ``renew()`` must not queue behind it past the deadline: it
    raises LockLost by then, as the API promises. (Found by tests/system/test_hosts.py, where a
    partitioned holder's ``renew()`` hung until the link healed.)"""
    resource = unique("hung-renew")
    held = semaphore(resource, lease=LEASE).acquire()
    silent = SilentEndpoint()
    outcome: list[tuple[str, float]] = []

    def renew() -> None:
        try:
            held.renew()
            outcome.append(("renewed", time.monotonic()))
        except LockLost:
            outcome.append(("LockLost", time.monotonic()))

    try:
        wait_for_renewal(held)
        with override_settings(DYNASEM=dynasem_settings(silent.url, lock_table)):
            # The next renewal of the heartbeat's hangs on the silent endpoint.
            deadline = time.monotonic() + held.seconds_left()
            renewing = f"dynasem-heartbeat:{resource[:40]}:renew"
            while not any(t.name == renewing for t in threading.enumerate()):
                assert time.monotonic() < deadline, "the heartbeat did not try to renew"
                time.sleep(0.005)
            time.sleep(0.05)  # it has taken the hold's request lock and sent its request
            caller = threading.Thread(target=renew, daemon=True)
            caller.start()
            caller.join(held.seconds_left() + 0.5)
            answered = list(outcome)
            silent.close()  # let the hung requests fail, so the heartbeat ends
            caller.join(5)
            for t in heartbeat_threads(resource):
                t.join(5)
    finally:
        silent.close()
        with contextlib.suppress(LockLost):
            held.release()
    assert answered, "renew() was still waiting for the hung renewal after the deadline"
    assert answered[0][0] == "LockLost"
    assert answered[0][1] >= deadline - 0.01


class InterruptedWait:
    """A hold's request lock whose wait, in the calling thread only, is ended by a Ctrl-C
    (as a signal's exception ends a blocking acquire): a renewal in flight held it."""

    def __init__(self, lock: Any) -> None:
        self.lock, self.caller = lock, threading.get_ident()

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        if threading.get_ident() == self.caller:
            raise KeyboardInterrupt
        return bool(self.lock.acquire(*args, **kwargs))

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def release_interrupted_behind_a_renewal(resource: str, how: str) -> Any:
    """A hold of ``resource`` whose release (``release()``, or a ``with`` block's exit: ``how``)
    Ctrl-C cut short as it waited for the heartbeat's renewal; its request lock put back."""
    sem = semaphore(resource, lease=LEASE)
    if how == "release":
        held = sem.acquire()
        wait_for_renewal(held)
        held._lock = InterruptedWait(held._lock)  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            held.release()
    else:
        with pytest.raises(KeyboardInterrupt), sem as held:
            wait_for_renewal(held)
            held._lock = InterruptedWait(held._lock)  # type: ignore[assignment]
    held._lock = held._lock.lock  # type: ignore[attr-defined]
    return held


@pytest.mark.parametrize("how", ["release", "with"])
def test_a_release_interrupted_waiting_for_a_renewal_renews_no_more(
    lock_table: str, requests_sent: RequestCounter, how: str
) -> None:
    """Ctrl-C as the release waits for the heartbeat's renewal in flight (the hold's request
    lock: a renewal hanging on a cut network): the release has not begun, and the hold is
    left to its lease, but renewed no more: a ``with`` block's exit is not run again, and
    nobody would give it back (before the fix the heartbeat renewed it on, for nobody, until
    max_hold). A ``release()`` again still gives it back. Found by the simulator: seed 2 of
    long_readers, partitions with --interrupts 0.3."""
    resource = unique("int-release")
    held = release_interrupted_behind_a_renewal(resource, how)
    assert heartbeats_of(resource) == []
    end = stored_end(resource, held.token)
    requests_sent.watch(resource)
    requests_sent.reset()
    time.sleep(2 * INTERVAL + 0.15)  # two renewals would have been due
    assert requests_sent.naming == 0
    assert stored_end(resource, held.token) == end
    held.release()  # given back after all
    assert tokens_on(resource) == set()


@pytest.mark.reentry
def test_a_hold_whose_release_was_interrupted_is_not_reentered(lock_table: str) -> None:
    """The same interrupt (its release not begun): the thread's next acquire of the resource
    must not re-enter that hold, renewed no more, its block then giving back nothing (before
    the fix it did: depth 2, the hold kept past its end, and with the heartbeat still on,
    kept for good). It waits for the lease instead. Found by the simulator: seed 10 of
    renewing, deaf with --interrupts 0.5."""
    resource = unique("int-reenter")
    with pytest.raises(KeyboardInterrupt), semaphore(resource, lease=LEASE) as held:
        held._lock = InterruptedWait(held._lock)  # type: ignore[assignment]
    held._lock = held._lock.lock  # type: ignore[attr-defined]
    with semaphore(resource, lease=LEASE, wait=3 * LEASE) as again:
        # A hold of its own, once the interrupted one's lease ran out.
        assert again.token != held.token and again.depth == 1
        assert tokens_on(resource) == {again.token}
    assert tokens_on(resource) == set()


def test_many_holds_share_one_scheduler_thread(lock_table: str) -> None:
    resources = [unique(f"many-{i}") for i in range(12)]
    holds = [semaphore(r, lease=LEASE).acquire() for r in resources]
    try:
        for held in holds:
            wait_for_renewal(held)
        schedulers = [t for t in threading.enumerate() if t.name == "dynasem-heartbeat"]
        assert len(schedulers) == 1
        assert {hb.held.resource for hb in heartbeat.scheduled()} >= set(resources)
        assert not any(held.lost for held in holds)
    finally:
        for held in holds:
            held.release()
    assert not any(heartbeats_of(r) for r in resources)


class ShortLeftHold:
    """A hold with less time left than one renewal interval (handed over, or found late)."""

    def __init__(self, lease: float, skew: float, left: float) -> None:
        self.resource = unique("short-left")
        self.lease, self.skew = lease, skew
        self._deadline = time.monotonic() + left
        self.renewed: list[float] = []
        self.started = time.monotonic()

    def seconds_left(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def check_deadline(self) -> None:
        pass

    def renew(self) -> None:
        self.renewed.append(time.monotonic() - self.started)
        self._deadline = time.monotonic() + self.lease - self.skew


def test_first_renewal_comes_before_a_short_deadline() -> None:
    held = ShortLeftHold(lease=3.0, skew=0.5, left=0.4)
    beat = heartbeat.Heartbeat(held)
    assert beat.interval > 0.4
    beat.start()
    try:
        deadline = time.monotonic() + 2
        while not held.renewed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        beat.stop()
    assert held.renewed and held.renewed[0] < 0.4


class Beat:
    """A scheduler task that records when it ran and runs once."""

    def __init__(self, name: str) -> None:
        self.name, self.held, self.stopped = name, None, False
        self.ran: list[float] = []

    def beat(self) -> float | None:
        self.ran.append(time.monotonic())
        return None


class CountingCondition(threading.Condition):
    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_short_holds_do_not_wake_the_scheduler_thread() -> None:
    """A task added and stopped before it is due, as every hold given back before its first
    renewal is, wakes the scheduler's thread only if it is due before the thread's next look:
    a burst of short holds costs no thread switch each (before: one notify per hold)."""
    scheduler = heartbeat._Scheduler()
    scheduler._cond = cond = CountingCondition()
    first = Beat("first")
    scheduler.add(first, 0.05)  # starts the thread, which runs it
    deadline = time.monotonic() + 2
    while not first.ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.ran
    for i in range(50):
        task = Beat(f"short-{i}")
        scheduler.add(task, heartbeat.LOOK_EVERY + 2)
        busy_until = time.perf_counter() + 0.002  # the block, keeping the GIL (the thread
        while time.perf_counter() < busy_until:  # woken could not look before the release)
            pass
        task.stopped = True
        time.sleep(0.003)  # the release request, waiting on its socket
    assert cond.notified <= 3, cond.notified


def test_a_task_due_before_the_next_look_runs_on_time_and_one_after_it_too() -> None:
    scheduler = heartbeat._Scheduler()
    early, late = Beat("early"), Beat("late")
    scheduler.add(Beat("start"), 0.0)
    time.sleep(0.2)  # the thread sleeps until its next look
    added = time.monotonic()
    scheduler.add(late, heartbeat.LOOK_EVERY + 0.3)
    scheduler.add(early, 0.1)
    deadline = added + heartbeat.LOOK_EVERY + 3
    while not late.ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert early.ran and late.ran
    assert 0.1 <= early.ran[0] - added < 0.1 + 0.5
    assert heartbeat.LOOK_EVERY + 0.3 <= late.ran[0] - added < heartbeat.LOOK_EVERY + 0.3 + 0.5


def test_an_idle_scheduler_sleeps_until_a_task_comes_and_runs_it_on_time() -> None:
    scheduler = heartbeat._Scheduler()
    scheduler.add(Beat("start"), 0.0)
    deadline = time.monotonic() + 3 * heartbeat.LOOK_EVERY + 2
    while scheduler._wakes_at != math.inf and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scheduler._wakes_at == math.inf  # nothing came for a whole look
    task = Beat("after-idle")
    added = time.monotonic()
    scheduler.add(task, 0.2)
    while not task.ran and time.monotonic() < added + 3:
        time.sleep(0.01)
    assert task.ran and 0.2 <= task.ran[0] - added < 0.7


def test_scheduler_survives_a_thread_that_cannot_start(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = semaphore(unique("first"), lease=LEASE).acquire()
    start = threading.Thread.start
    failed: list[str] = []

    def start_failing_once(thread: threading.Thread) -> None:
        if thread.name.startswith("dynasem-heartbeat:") and not failed:
            failed.append(thread.name)
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_failing_once)
    try:
        with watching_lost(first.token) as lost:
            wait_for_renewal(first, timeout=3)  # the renewal after the failed start
            second = semaphore(unique("second"), lease=LEASE).acquire()
            wait_for_renewal(second, timeout=3)
            assert lost.at == []
    finally:
        monkeypatch.setattr(threading.Thread, "start", start)
    assert failed, "no renewal thread start failed: the test did not test anything"
    assert [t for t in threading.enumerate() if t.name == "dynasem-heartbeat"]
    first.release()
    second.release()


# ---------------------------------------------------------------------------------------------
# max_hold: a hung holder cannot keep the lock forever
# ---------------------------------------------------------------------------------------------

MAX_HOLD = 2.0


def test_max_hold_renews_until_then_and_declares_the_hold_lost(holds):
    resource = unique("max-hold")
    taken_wall = time.time()
    held = semaphore(resource, lease=LEASE, max_hold=MAX_HOLD).acquire()
    holds.append(held)
    with watching_lost(held.token) as lost:
        # Renewed past its first lease (which ends after 1.5 s): still ours.
        time.sleep(LEASE - SKEW + 0.3)
        assert not held.lost and tokens_on(resource) == {held.token}
        assert lost.wait(timeout=MAX_HOLD + 3)
    assert held.lost
    # Never renewed to end later than max_hold after it was taken (allowing CLOCK_SKEW).
    assert stored_end(resource, held.token) <= taken_wall + MAX_HOLD + SKEW + 0.2
    # Nobody released it, yet another holder gets it once that lease end has passed.
    other = semaphore(resource, wait=MAX_HOLD + 2 * SKEW + 1).acquire()
    holds.append(other)
    assert tokens_on(resource) == {other.token}
    with pytest.raises(LockLost, match="max_hold=2s"):
        held.release()
    assert tokens_on(resource) == {other.token}  # its late release took nothing of theirs


def test_max_hold_shorter_than_the_lease_sends_no_renewal(holds, requests_sent):
    resource = unique("max-hold-short")
    held = semaphore(resource, lease=5, max_hold=0.5).acquire()
    holds.append(held)
    requests_sent.reset()
    time.sleep(1.0)
    assert held.lost
    assert requests_sent.total == 0  # the lease from the acquire already lasts past max_hold
    # A block that outlives max_hold ends with LockLost, like one whose lease ran out.
    with pytest.raises(LockLost, match="max_hold"):
        with semaphore(unique("max-hold-block"), lease=5, max_hold=0.5) as again:
            time.sleep(1.0)
    assert again.lost


@pytest.mark.parametrize("kind", [{}, {"limit": 3}, {"shared": True}], ids=repr)
def test_a_lease_stored_by_a_clock_ahead_of_ours_is_renewed_not_lost(
    kind, holds, dynamodb_local, lock_table, monkeypatch
):
    # Our wall clock steps back 1.8 s (within CLOCK_SKEW=2) right after the take: for 1.8 s
    # "now + lease" is below the lease end stored. The trusted deadline (1.5 s after the
    # take) must still move on with each renewal, the stored end confirmed as it is.
    resource = unique("clock-stepped-back")
    lease = 3.5
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, CLOCK_SKEW=2)):
        monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + 1.8)
        held = semaphore(resource, lease=lease, **kind).acquire()
        holds.append(held)
        stored = stored_end(resource, held.token)
        monkeypatch.setattr(clock, "wall_clock", time.time)
        with watching_lost(held.token) as lost:
            time.sleep(2.5)  # renewals at ~0.5 s, 1.0 s, 1.5 s: the first two confirm
            assert lost.at == [] and not held.lost
            assert held.seconds_left() > 0.5
            assert tokens_on(resource) == {held.token}
            time.sleep(1.0)  # renewed past the end stored at the take
            assert stored_end(resource, held.token) > stored
        held.release()
    assert tokens_on(resource) == set()


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (float("inf"), ValueError), ("10", TypeError)],
)
def test_bad_max_hold_is_refused_naming_it(bad, error):
    with pytest.raises(error, match="max_hold"):
        semaphore("x", max_hold=bad)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_scheduler_whose_thread_died_starts_another_for_the_next_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler's thread ended by an exception of its own loop (a clock read that raised,
    a MemoryError): before, every later task waited on a thread that was gone, and no hold of
    the process was renewed again, each lost at its deadline."""
    scheduler = heartbeat._Scheduler()
    scheduler.add(Beat("start"), 0.0)
    thread = scheduler._thread
    assert thread is not None
    real = heartbeat.clock.monotonic

    def raises_in_the_scheduler() -> float:
        if threading.current_thread() is thread:
            raise RuntimeError("a clock read that failed")
        return real()

    monkeypatch.setattr(heartbeat.clock, "monotonic", raises_in_the_scheduler)
    with scheduler._cond:
        scheduler._cond.notify()
    thread.join(heartbeat.LOOK_EVERY + 2)
    assert not thread.is_alive()
    monkeypatch.setattr(heartbeat.clock, "monotonic", real)
    task = Beat("after")
    scheduler.add(task, 0.0)
    deadline = time.monotonic() + 3
    while not task.ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert task.ran
