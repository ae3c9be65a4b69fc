"""A hand-over that reaches a waiter after it left the queue (dynasem._engine.late_handover),
pushes on, every party in this process: a waiter whose task was cancelled, or whom Ctrl-C
interrupted, leaves as one whose wait ran out does. Its process hands the lock on to the next
waiter as soon as it learns of the hand-over (its push, its late look at the row, or its own
leaving), rather than leave it held by nobody for the leaver's whole lease, or release it to
nobody in particular (the next waiter then learns of it only at its own next look).

A waiter that left and a hand-over still on its way to it: the releaser read the line before
the waiter left (or read it eventually consistently), and its write lands later. The write
is held up here, request by request; what is checked is who the lock went to, and how (the
hand-over writes and the heirs they named)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import push as wakeup
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_writes, queue_entries
from tests.support.helpers import queue_of

# The leaver's lease: a hand-over to it that nobody hands on sits there that long (plus the
# skew). The next waiter waits longer than that, so that it gets the lock either way.
LEAVER_LEASE = 30
NEXT_WAIT = 60
HOWS = ["cancel", "interrupt"]
LEAVER: dict[str, Any] = {"lease": LEAVER_LEASE, "user": "leaver"}


def _wait_for_queue(resource: str, size: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(queue_of(resource)) < size:
        assert time.monotonic() < deadline, f"queue never reached {size}: {queue_of(resource)}"
        time.sleep(0.02)


class Line:
    """The holder, then the leaver in line behind it (a thread: its task is cancelled, or
    Ctrl-C interrupts it, once the next waiter is in line behind it), then the next waiter
    (a thread). Records the heirs of every hand-over write (by user), in order."""

    def __init__(self, resource: str, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.resource, self.how = resource, how
        self.holder = semaphore(resource, user="holder").acquire()
        self.out: dict[str, Any] = {}
        self.queued = threading.Event()  # the next waiter is in line behind the leaver
        self.left = threading.Event()  # the leaver is out of acquire()
        self.heirs: list[list[str]] = []
        build = lock_writes.hand_over

        def hand_over(resource: str, token: str, heirs: Any, **terms: Any) -> Any:
            self.heirs.append([holder.user_id for _, _, holder in heirs])
            return build(resource, token, heirs, **terms)

        monkeypatch.setattr(lock_writes, "hand_over", hand_over)
        if how == "interrupt":
            wait = wakeup.wait

            def interrupted(token: str, seconds: float, **kwargs: Any) -> Any:
                if threading.current_thread().name == "leaver":
                    if self.queued.is_set():
                        raise KeyboardInterrupt  # Ctrl-C while it waits for its turn
                    seconds = min(seconds, 0.05)  # (not later than the next waiter queued)
                return wait(token, seconds, **kwargs)

            monkeypatch.setattr(wakeup, "wait", interrupted)
        self.leaver = threading.Thread(target=self._leave, name="leaver")
        self.leaver.start()
        _wait_for_queue(resource, 1)
        self.next = threading.Thread(target=self._next, name="next")
        self.next.start()
        _wait_for_queue(resource, 2)
        self.queued.set()

    def _leave(self) -> None:
        try:
            if self.how == "cancel":
                asyncio.run(self._cancelled())
            else:
                semaphore(self.resource, fair=True, wait=NEXT_WAIT, **LEAVER).acquire()
            self.out["leaver"] = "acquired"
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            self.out["leaver"] = type(exc).__name__
        finally:
            self.left.set()

    async def _cancelled(self) -> None:
        sem = semaphore(self.resource, fair=True, wait=NEXT_WAIT, **LEAVER)
        task = asyncio.ensure_future(sem.aacquire())
        while not self.queued.is_set():
            await asyncio.sleep(0.02)
        task.cancel()
        await task

    def _next(self) -> None:
        try:
            with semaphore(self.resource, fair=True, wait=NEXT_WAIT, user="next") as held:
                self.out["next"] = held.fence
        except Exception as exc:  # reported to the test
            self.out["next"] = exc

    def check(self) -> None:
        """The leaver left without the lock; the lock went from the holder to the leaver,
        then, handed on by the leaver's process in one write, to the next waiter."""
        self.leaver.join(NEXT_WAIT)
        self.next.join(NEXT_WAIT + 30)
        left = "CancelledError" if self.how == "cancel" else "KeyboardInterrupt"
        assert self.out["leaver"] == left, self.out
        assert isinstance(self.out.get("next"), int), self.out
        assert self.out["next"] > self.holder.fence
        assert self.heirs == [["leaver"], ["next"]], (
            f"the hand-over to the waiter that had left was not handed on: {self.heirs}"
        )


def _held_up(line: Line, monkeypatch: pytest.MonkeyPatch, until: Callable[[], object]) -> None:
    """The holder's hand-over write (its heir chosen: the leaver) waits for ``until``."""
    build = lock_writes.hand_over
    releaser = threading.current_thread()

    def slow(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is releaser and not line.heirs:
            assert line.left.wait(NEXT_WAIT), "the leaver never left"
            until()
        return build(*args, **kwargs)

    monkeypatch.setattr(lock_writes, "hand_over", slow)


@pytest.mark.parametrize("how", HOWS)
def test_a_hand_over_landing_after_the_leavers_late_look_is_handed_on_by_its_push(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The hand-over lands after the leaver's late look found nothing: only its push can tell
    # the leaver's process of it (else the lock sat with nobody for the leaver's lease).
    looked = threading.Event()
    beat = wakeup._Slot.beat

    def late_look(slot: Any) -> None:
        beat(slot)
        looked.set()

    monkeypatch.setattr(wakeup._Slot, "beat", late_look)
    line = Line(f"late:after-look-{how}", how, monkeypatch)
    _held_up(line, monkeypatch, lambda: looked.wait(30))
    line.holder.release()
    assert looked.is_set(), "the leaver never looked at the row again"
    line.check()


@pytest.mark.parametrize("how", HOWS)
def test_a_hand_over_whose_push_is_lost_is_handed_on_by_the_late_look(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The hand-over lands after the leaver left, its push to the leaver is lost: the leaver's
    # late look at the row finds the hold, and hands it on (a release to nobody in particular
    # would leave the next waiter to learn of it at its own next look).
    push = wakeup.push

    def lossy(address: Any, resource: str, token: str, item: Any, **kwargs: Any) -> bool:
        heir = item.holders.get(token)
        if heir is not None and heir.user_id == "leaver":
            return False
        return push(address, resource, token, item, **kwargs)

    monkeypatch.setattr(wakeup, "push", lossy)
    line = Line(f"late:push-lost-{how}", how, monkeypatch)
    _held_up(line, monkeypatch, lambda: None)
    line.holder.release()
    line.check()


@pytest.mark.parametrize("how", HOWS)
def test_a_hand_over_landing_while_an_interrupted_waiter_leaves_is_handed_on(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The hand-over lands as the interrupted waiter leaves the queue: the row it reads after
    # it left names it the holder. Nobody is left to use that hold (a waiter whose wait ran
    # out keeps it): it is handed on, not released to nobody in particular.
    line = Line(f"late:while-leaving-{how}", how, monkeypatch)
    leave = queue_entries.leave_queue

    def releasing_first(*args: Any, **kwargs: Any) -> Any:
        if not line.heirs:
            line.holder.release()  # hands over to the leaver, its entry still there
        return leave(*args, **kwargs)

    monkeypatch.setattr(queue_entries, "leave_queue", releasing_first)
    line.check()


def test_a_waiter_whose_wait_ran_out_keeps_a_hand_over_that_reached_it(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hand-over lands just as the waiter, its wait over, leaves the queue: the row it
    # reads as it leaves names it the holder. It returns holding, as if the look just before
    # had found it so (not busy, with the lock held by nobody for its whole lease).
    holder = semaphore("late:kept", lease=30).acquire()
    leave, released = queue_entries.leave_queue, threading.Event()

    def releasing_first(*args: Any, **kwargs: Any) -> Any:
        if not released.is_set():
            released.set()
            holder.release()  # hands over to the waiter, its entry still there
        return leave(*args, **kwargs)

    monkeypatch.setattr(queue_entries, "leave_queue", releasing_first)
    with semaphore("late:kept", wait=0.5, fair=True, user="kept") as held:
        assert released.is_set()
        assert held.fence > holder.fence and held.seconds_left() > 0
        assert [h.token for h in holds_on("late:kept")] == [held.token]
    assert holds_on("late:kept") == []
    assert not holder.lost
