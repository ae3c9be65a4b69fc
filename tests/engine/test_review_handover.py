"""Review of the hand-over (handover, late_handover, push, Held._hand_over): a hand-over must
never reach a waiter nobody is left to use and sit there for its lease, and a push must
never make a waiter hold past what it can trust."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows
from dynasem.exceptions import LimitExceeded, SemaphoreBusy, SemaphoreUnavailable
from tests.support.helpers import queue_of

WAITER_LEASE = 30


def _wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_waiter_whose_last_look_is_throttled_past_its_wait_leaves_no_live_entry(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued waiter's look at the row, throttled through botocore's retries, answers
    after the waiter's wait is over: ``patient_read`` raises ``SemaphoreUnavailable`` out of
    the acquire loop, which only ``push.forget``s the token. Its entry item stays live (for
    its lease), nobody registered a late look: the holder's release hands the lock to a
    waiter that is gone, and the lock is held by nobody for that waiter's whole lease plus
    the skew, while its process lives on."""
    resource = "review:throttled-leaver"
    holder = semaphore(resource, user="holder", lease=30).acquire()
    armed = threading.Event()
    gave_up = threading.Event()
    got: dict[str, Any] = {}
    get = lock_rows.get

    def throttled_get(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "leaver" and armed.is_set():
            armed.clear()
            # botocore's retries of a throttled look: the answer comes past the wait.
            time.sleep(1.6)
            raise LimitExceeded("throttled", "throughput", transient=True)
        return get(*args, **kwargs)

    monkeypatch.setattr(lock_rows, "get", throttled_get)

    def leave() -> None:
        try:
            semaphore(resource, user="leaver", fair=True, wait=1.5, lease=WAITER_LEASE).acquire()
            got["leaver"] = "acquired"
        except (SemaphoreUnavailable, SemaphoreBusy) as exc:
            got["leaver"] = exc
        finally:
            gave_up.set()

    leaver = threading.Thread(target=leave, name="leaver")
    leaver.start()
    _wait_until(lambda: queue_of(resource), 10, "the leaver never put its entry")
    armed.set()
    assert gave_up.wait(10)
    leaver.join(5)
    assert isinstance(got["leaver"], SemaphoreUnavailable), got
    holder.release()
    # The lock is free now (or handed on): a newcomer gets it within a few seconds, not after
    # the leaver's 30 s lease.
    try:
        semaphore(resource, user="next", wait=5).acquire().release()
    except SemaphoreBusy:
        holders = [(h.user_id, h.fence) for h in holds_on(resource)]
        pytest.fail(f"the lock went to a waiter that had given up, and sits there: {holders}")


def test_a_leaver_whose_entry_could_not_be_marked_dead_hands_on_a_later_hand_over(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, waiters_elsewhere: None
) -> None:
    """A waiter gives up; its write marking its entry dead is throttled past botocore's
    retries (the entry items share the hot row's partition). ``late_handover.leave_queue``
    catches that and registers one late look, 2 s on; but the entry stays live for the rest
    of its lease, so a release later than that hands the lock to the leaver. Its push does
    not reach it (a releaser on another host with the default loopback ``PUSH``; here: the
    datagram is lost), and the late look was spent: the lock sits with nobody for the
    leaver's whole lease plus the skew, its process alive."""
    from dynasem._engine import push as wakeup
    from dynasem._storage import queue_entries

    resource = "review:unmarked-leaver"
    holder = semaphore(resource, user="holder", lease=30).acquire()
    drop = queue_entries.drop_entry
    failed: list[Any] = []

    def throttled_drop(*args: Any, **kwargs: Any) -> None:
        if not failed:
            failed.append(args)
            raise LimitExceeded("throttled", "throughput", transient=True)
        drop(*args, **kwargs)

    monkeypatch.setattr(queue_entries, "drop_entry", throttled_drop)
    push = wakeup.push

    def lossy(address: Any, resource: str, token: str, item: Any, **kwargs: Any) -> bool:
        heir = item.holders.get(token)
        if heir is not None and heir.user_id == "leaver":
            return False  # the datagram to the leaver is lost
        return push(address, resource, token, item, **kwargs)

    monkeypatch.setattr(wakeup, "push", lossy)
    with pytest.raises(SemaphoreBusy):
        semaphore(resource, user="leaver", fair=True, wait=1, lease=WAITER_LEASE).acquire()
    assert failed, "the leaver's mark was not throttled"
    time.sleep(wakeup.LATE_LOOK + 0.5)  # the holder works on past the leaver's late look
    holder.release()
    try:
        semaphore(resource, user="next", wait=5).acquire().release()
    except SemaphoreBusy:
        holders = [(h.user_id, h.fence) for h in holds_on(resource)]
        pytest.fail(f"the lock went to a waiter that had given up, and sits there: {holders}")


def test_a_waiter_interrupted_right_after_it_told_the_holder_is_not_handed_the_lock(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or a task's soft time limit) lands in a queued waiter right after it told the
    holder it queued (``hold.queued_behind``), before its first wait for a push: the step
    the driver last saw is the ticket's draw, whose ``leave`` is None (the ticket was not
    known when it was sent). Nothing leaves the queue: no dead entry is put, no late look
    registered, and the word stands in for the entry never put. The lock is handed to the
    interrupted waiter (from the line its word joined), whose push slot is gone: held by
    nobody for its lease plus the skew, its process alive."""
    from dynasem._engine import hold

    resource = "review:told-then-interrupted"
    holder = semaphore(resource, user="holder", lease=30).acquire()
    told = {"w1": threading.Event(), "w2": threading.Event()}
    queued_behind = hold.queued_behind

    def telling(row: Any, waiter: Any) -> bool:
        heard = queued_behind(row, waiter)
        name = threading.current_thread().name
        if name in told:
            told[name].set()
        if name == "w2":
            raise KeyboardInterrupt  # the signal lands just after the word
        return heard

    monkeypatch.setattr(hold, "queued_behind", telling)
    out: dict[str, Any] = {}

    def wait(name: str) -> None:
        try:
            with semaphore(resource, user=name, fair=True, wait=30, lease=WAITER_LEASE):
                out[name] = "held"
        except (Exception, KeyboardInterrupt) as exc:
            out[name] = exc

    w1 = threading.Thread(target=wait, args=("w1",), name="w1")
    w1.start()
    assert told["w1"].wait(10)
    w2 = threading.Thread(target=wait, args=("w2",), name="w2")
    w2.start()
    assert told["w2"].wait(10)
    w2.join(10)
    assert isinstance(out.get("w2"), KeyboardInterrupt), out
    holder.release()
    w1.join(10)
    assert out.get("w1") == "held", out
    try:
        semaphore(resource, user="next", wait=5).acquire().release()
    except SemaphoreBusy:
        holders = [(h.user_id, h.fence) for h in holds_on(resource)]
        pytest.fail(f"the lock went to the interrupted waiter, and sits there: {holders}")


def test_a_line_pushed_by_a_late_datagram_is_as_old_as_its_read(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, waiters_elsewhere: None
) -> None:
    """A hand-over's push carries the line after its heir and that line's age when it was
    sent; the heir reckons the read at ``arrived - line_age``, leaving out the datagram's
    time on the way (words reckon it, by the wall clocks: ``push._heard``). A push 3 s late
    makes a 3 s old line look fresh: the heir hands over from it without a read (LINE_FRESH
    is 1 s), to a waiter that left 2 s before, after that waiter's late look was spent.
    Only its push can tell it then; lost, the lock sits with nobody for its lease."""
    from dynasem._engine import push as wakeup

    monkeypatch.setattr(wakeup, "IN_PROCESS", False)  # datagrams, as between processes
    resource = "review:late-line"
    holder = semaphore(resource, user="holder", lease=30).acquire()
    push = wakeup.push
    delivered = threading.Event()

    def late_or_lost(address: Any, res: str, token: str, item: Any, **kwargs: Any) -> bool:
        heir = item.holders.get(token)
        if heir is not None and heir.user_id == "w2":
            return False  # the datagram to the leaver is lost
        if heir is not None and heir.user_id == "w1":

            def send_late() -> None:
                push(address, res, token, item, **kwargs)
                time.sleep(0.2)
                delivered.set()

            threading.Timer(3.0, send_late).start()  # 3 s on the way
            return True
        return push(address, res, token, item, **kwargs)

    monkeypatch.setattr(wakeup, "push", late_or_lost)
    out: dict[str, Any] = {}

    def w1() -> None:
        try:
            with semaphore(resource, user="w1", fair=True, wait=30, lease=WAITER_LEASE):
                out["w1"] = "held"
                delivered.wait(10)  # works until its late push came
        except Exception as exc:
            out["w1"] = exc

    def w2() -> None:
        try:
            semaphore(resource, user="w2", fair=True, wait=1, lease=WAITER_LEASE).acquire()
            out["w2"] = "held"
        except Exception as exc:
            out["w2"] = exc

    first = threading.Thread(target=w1, name="w1")
    first.start()
    _wait_until(lambda: len(queue_of(resource)) == 1, 10, "w1 never queued")
    second = threading.Thread(target=w2, name="w2")
    second.start()
    _wait_until(lambda: len(queue_of(resource)) == 2, 10, "w2 never queued")
    holder.release()  # to w1, with the line [w2] as read now
    second.join(10)
    assert isinstance(out.get("w2"), SemaphoreBusy), out
    first.join(20)
    assert out.get("w1") == "held", out
    try:
        semaphore(resource, user="next", wait=5).acquire().release()
    except SemaphoreBusy:
        holders = [(h.user_id, h.fence) for h in holds_on(resource)]
        pytest.fail(f"handed from a stale line to a waiter that had left: {holders}")


def test_a_permit_waiter_whose_last_look_is_throttled_past_its_wait_leaves_no_live_entry(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same failure in a semaphore of permit items: the waiter that gave up with
    ``SemaphoreUnavailable`` leaves its entry live, ahead of everyone who queues after it,
    who waits for it (nobody passes a live entry) while a permit is free: for its lease."""
    resource = "review:throttled-permit-leaver"
    holders = [semaphore(resource, limit=9, lease=30).acquire() for _ in range(9)]
    armed = threading.Event()
    gave_up = threading.Event()
    got: dict[str, Any] = {}
    get = lock_rows.get

    def throttled_get(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "leaver" and armed.is_set():
            armed.clear()
            time.sleep(1.6)  # botocore's retries of a throttled look: past the wait
            raise LimitExceeded("throttled", "throughput", transient=True)
        return get(*args, **kwargs)

    monkeypatch.setattr(lock_rows, "get", throttled_get)

    def leave() -> None:
        try:
            sem = semaphore(resource, limit=9, user="leaver", wait=1.5, lease=WAITER_LEASE)
            sem.acquire()
            got["leaver"] = "acquired"
        except (SemaphoreUnavailable, SemaphoreBusy) as exc:
            got["leaver"] = exc
        finally:
            gave_up.set()

    leaver = threading.Thread(target=leave, name="leaver")
    leaver.start()
    _wait_until(lambda: queue_of(resource), 10, "the leaver never put its entry")
    armed.set()
    assert gave_up.wait(10)
    leaver.join(5)
    assert isinstance(got["leaver"], SemaphoreUnavailable), got
    holders.pop().release()
    try:
        semaphore(resource, limit=9, user="next", wait=5).acquire().release()
    except SemaphoreBusy as exc:
        pytest.fail(f"a free permit waits for a waiter that had given up: {exc}")
    finally:
        for held in holders:
            held.release()
