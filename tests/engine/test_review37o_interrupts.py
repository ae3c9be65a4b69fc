"""Review (thirty-seventh session, o): holds kept for nobody, or signals lost, on async and
interrupt paths."""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import uuid
from types import FrameType
from typing import Any

import pytest

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
