"""Review (thirty-seventh session, o): holds kept for nobody, or signals lost, on async and
interrupt paths."""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time
import uuid
from types import FrameType
from typing import Any

import pytest
from django.db import connections

from dynasem import _clock as clock
from dynasem import semaphore
from dynasem._engine import heartbeat
from dynasem._engine import hold as holds_module
from dynasem._operators.locks import break_hold as operations_break
from dynasem._operators.locks import holds_on
from dynasem.signals import lock_lost


def _resource(kind: str) -> str:
    return f"r37o-{kind}-{uuid.uuid4().hex[:8]}"


def test_a_second_cancel_in_the_give_back_of_undelivered_holds_gives_back_every_one(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async acquire that made several holds (here three, taken inside one outer
    ``adelivering``, as a lock_acquired receiver's acquire joins its caller's) is cancelled
    before its caller has them; a second cancel comes while the first is given back. The
    others must be given back too (or at least renewed no more): the loop stopped at the
    second cancel, and they were renewed by their heartbeat for nobody as long as the
    process lived."""
    names = [_resource(str(i)) for i in range(3)]
    started, go_on = threading.Event(), threading.Event()
    release_now = holds_module.Held._release_now

    def slow_release(self: Any) -> None:
        if self.resource == names[0]:
            started.set()
            go_on.wait(10)
        release_now(self)

    monkeypatch.setattr(holds_module.Held, "_release_now", slow_release)
    taken: list[Any] = []

    async def take() -> None:
        for name in names:
            taken.append(await semaphore(name, lease=30).aacquire())
        await asyncio.sleep(30)  # cancelled here, before its caller has the holds

    async def main() -> None:
        task = asyncio.ensure_future(holds_module.adelivering(take))
        while len(taken) < len(names):
            await asyncio.sleep(0.01)
        task.cancel()
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()  # again, as the first hold is given back
        await asyncio.sleep(0.05)
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    renewed = [hb.held.resource for hb in heartbeat.scheduled() if hb.held.resource in names]
    kept = [name for name in names if holds_on(name)]
    for held in taken:  # whatever the outcome, nothing left for the next test
        if not held.released:
            held.release()
    assert renewed == [], f"renewed for nobody: {renewed}"
    assert kept == [], f"not given back: {kept}"


def _interrupt_at(code: Any, line_text: str) -> Any:
    """A trace function that raises KeyboardInterrupt (as a signal handler's exception
    would) as ``code`` reaches the line after the first one whose text holds ``line_text``."""
    lines, first = inspect.getsourcelines(code)
    target = first + 1 + next(i for i, text in enumerate(lines) if line_text in text)

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target:
            sys.settrace(None)
            frame.f_trace = None
            raise KeyboardInterrupt
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is code.__code__ else None

    return tracer


def test_an_interrupt_between_a_refused_give_back_and_its_loss_still_sends_lock_lost(
    lock_table: str,
) -> None:
    """A release refused (another holder took the lock over: the hold was lost) and an
    interrupt at the very next line, before the loss is marked: the interrupt goes on, and
    the hold is known lost and lock_lost sent first. Neither was: ``held.lost`` said False,
    and a receiver that stops work done under a lost lock never heard of it."""
    name = _resource("lost")
    held = semaphore(name, lease=30).acquire()
    operations_break(name, held.token)
    thief = semaphore(name, lease=30).acquire()
    heard: list[str] = []

    def lost(sender: Any, resource: str, **kwargs: Any) -> None:
        heard.append(resource)

    lock_lost.connect(lost, weak=False, dispatch_uid="review37o-lost")
    sys.settrace(_interrupt_at(holds_module.Held._release_now, "given = self._give_back()"))
    try:
        with pytest.raises(KeyboardInterrupt):
            held.release()
    finally:
        sys.settrace(None)
        lock_lost.disconnect(dispatch_uid="review37o-lost")
        thief.release()
    assert held.lost
    assert heard == [name]


@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_a_lock_lost_receivers_connection_in_a_heartbeat_thread_is_closed(
    lock_table: str,
) -> None:
    """The heartbeat finds the hold lost (its renewal refused: another holder took over)
    and sends lock_lost in its renewal's thread, one started for that renewal. A receiver's
    ORM query opened a connection there that Django never closes: each loss left one open
    (on PostgreSQL a server session) until the garbage collector found the thread's
    connection handler, so a DynamoDB outage that loses every hold of a process at once
    opened as many at once. dynasem closes the connections of its own thread once sent."""
    name = _resource("hb-conn")
    held = semaphore(name, lease=3).acquire()
    seen: list[tuple[str, Any]] = []
    done = threading.Event()

    def query(sender: Any, **kwargs: Any) -> None:
        db = connections["file"]
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append((threading.current_thread().name, db))
        done.set()

    lock_lost.connect(query, weak=False, dispatch_uid="review37o-hb-conn")
    try:
        operations_break(name, held.token)
        thief = semaphore(name, lease=30).acquire()
        assert done.wait(10), "the heartbeat never found the loss"
        thief.release()
        time.sleep(0.2)  # the renewal's thread ends
    finally:
        lock_lost.disconnect(dispatch_uid="review37o-hb-conn")
    [(thread, db)] = seen
    assert thread.startswith("dynasem-heartbeat"), thread
    assert db.connection is None, f"its connection left open in {thread}"


@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_a_lock_lost_receivers_connection_in_dynasems_executor_is_closed(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async code reads ``held.lost`` past the deadline on its event loop's thread: lock_lost
    is sent in a thread of dynasem's executor, one that lives as long as the process. A
    receiver's ORM query opened a connection there that nobody closed: open for good, and
    stale past a database restart (Django reconnects only where a request begins or ends),
    so that receiver failed there from then on."""
    name = _resource("ex-conn")
    held = semaphore(name, lease=30).acquire()
    holds_module.stop_renewing(held)
    seen: list[tuple[str, Any]] = []
    done = threading.Event()

    def query(sender: Any, **kwargs: Any) -> None:
        db = connections["file"]
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append((threading.current_thread().name, db))
        done.set()

    async def look() -> bool:
        return held.lost

    lock_lost.connect(query, weak=False, dispatch_uid="review37o-ex-conn")
    real = clock.monotonic
    monkeypatch.setattr(clock, "monotonic", lambda: real() + 60)
    try:
        assert asyncio.run(look())
        assert done.wait(10), "lock_lost was never sent"
        time.sleep(0.2)  # the receiver's send ends
    finally:
        monkeypatch.undo()
        lock_lost.disconnect(dispatch_uid="review37o-ex-conn")
        operations_break(name, held.token)
    [(thread, db)] = seen
    assert thread != threading.current_thread().name, thread
    assert db.connection is None, f"its connection left open in {thread}"
