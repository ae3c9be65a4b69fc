"""Review of the async side (steps.run_async, aacquire, async with, await_push): what a task
leaves behind when its event loop ends without cancelling it."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
import weakref
from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import heartbeat
from dynasem._engine import push as wakeup
from dynasem._operators.locks import holds_on
from tests.support.helpers import queue_of


def _close_with_pending(loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[None]]) -> None:
    """``loop.run_until_complete(main()); loop.close()`` with a task of main's still pending
    (a background task nobody awaited): the loop is closed, the task is destroyed, its
    coroutine closed by the garbage collector (``GeneratorExit`` at its await)."""
    loop.close()
    refs = [weakref.ref(task) for task in tasks]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tasks.clear()  # the caller keeps no reference: the task is garbage
        # Unless a request of its is still on its way in a thread: that request's callback
        # holds the task until the request ends (then its wake-up meets the closed loop), and
        # only a collection after that destroys it. Until then it is a live waiter in line,
        # and may be handed the lock (the session's note, 2026-12-07).
        deadline = time.monotonic() + 10
        gc.collect()
        while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
            time.sleep(0.01)
            gc.collect()
    assert all(ref() is None for ref in refs), "the task was never destroyed"


def test_a_hold_whose_task_is_destroyed_with_its_loop_is_given_back(lock_table: str) -> None:
    """A task inside ``async with semaphore(...)`` when its loop is closed (not cancelled:
    ``loop.close()`` after ``run_until_complete``) is destroyed; its coroutine is closed, and
    ``__aexit__`` runs with ``GeneratorExit``, outside any running loop. The give-back needs
    a running loop (``run_io_to_end``): it raises, the hold is never given back, and its
    heartbeat renews it for nobody for as long as the process lives."""
    resource = "loop:closed:held"
    loop = asyncio.new_event_loop()
    entered = asyncio.Event()

    async def body() -> None:
        async with semaphore(resource, lease=2, user="gone"):
            entered.set()
            await asyncio.sleep(3600)

    tasks = [loop.create_task(body())]
    loop.run_until_complete(entered.wait())
    _close_with_pending(loop, tasks)
    time.sleep(2.5)  # past the lease: only renewals could keep it
    renewed = [hb for hb in heartbeat.scheduled() if hb.held.resource == resource]
    try:
        held = semaphore(resource, wait=0.5, user="next").acquire()
    except SemaphoreBusy:
        held = None
    finally:
        for hb in renewed:  # the test's own clean-up, either way
            hb.held._stop_heartbeat()
    if held is not None:
        held.release()
    assert not renewed, "the destroyed task's hold is still renewed"
    assert held is not None, f"held for nobody: {holds_on(resource)}"


def test_a_waiter_whose_task_is_destroyed_with_its_loop_leaves_the_line(lock_table: str) -> None:
    """A task waiting in line when its loop is closed: its coroutine closed by the garbage
    collector, the driver's cleanup (leave the line) needs a running loop, and does not run;
    its place in line stays, and the holder's release hands the lock to it: held for nobody
    for the gone waiter's lease, while its process lives on."""
    resource = "loop:closed:waiting"
    holder = semaphore(resource, lease=30, user="holder").acquire()
    loop = asyncio.new_event_loop()

    async def wait_in_line() -> None:
        await semaphore(resource, fair=True, wait=60, lease=30, user="gone").aacquire()

    async def awaiting_its_push() -> None:
        """Queued, its entry put (ENTRY_DEFER), and waiting on the loop for a push again."""
        await asyncio.sleep(0.5)
        while not any(slot.waker is not None for slot in wakeup._listener.slots.values()):
            await asyncio.sleep(0.005)

    tasks = [loop.create_task(wait_in_line())]
    loop.run_until_complete(awaiting_its_push())
    _close_with_pending(loop, tasks)
    holder.release()
    time.sleep(2.5)  # any late look would be over
    try:
        held = semaphore(resource, wait=1, user="next").acquire()
    except SemaphoreBusy as exc:
        pytest.fail(f"held for nobody after the loop closed: {exc}")
    held.release()


def test_a_reader_cancelled_as_its_admission_lands_leaves_no_count(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async reader (reader items) cancelled while its admission's row write is in flight:
    the driver waits for the write's answer (applied: ``rc + 1``, the row's mark ours), and
    gives it back; the item's write was never sent. The undo counts the reader down only if
    the row's mark is still its admission's, and a reader admitted meanwhile moved it (any
    busy shared resource): the count stays, with no reader. Once every real reader has left,
    a writer waits for a write-off, a lease and the skew after the row last changed, though
    every process lives. The driver knows the admission landed and the item was never sent:
    nothing else can have counted it down (a break or a release needs the item; a write-off
    moves the epoch on, which the count-down's condition checks)."""
    from dynasem._storage import lock_rows, lock_writes, reader_items

    monkeypatch.setattr(lock_writes, "READERS_INLINE", 1)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 1)
    resource = "doc:cancelled"
    holds = [semaphore(resource, shared=True, lease=30, user=f"r{i}").acquire() for i in range(2)]
    update = lock_rows.update
    armed, landed, go = [True], threading.Event(), threading.Event()

    def held_up(action: dict[str, Any], **kwargs: Any) -> Any:
        answer = update(action, **kwargs)
        admission = action["Key"]["sk"]["S"] == "lock" and "#rc" in action["UpdateExpression"]
        if admission and armed:
            armed.clear()
            landed.set()
            go.wait(5)  # its answer held up on the way back
        return answer

    monkeypatch.setattr(lock_rows, "update", held_up)

    async def main() -> None:
        sem = semaphore(resource, shared=True, lease=30, user="cancelled")
        task = asyncio.ensure_future(sem.aacquire())
        assert await asyncio.to_thread(landed.wait, 5), "the admission was never sent"
        # Another reader admitted meanwhile: the row's mark is its admission's now.
        later = semaphore(resource, shared=True, lease=30, user="later")
        holds.append(await asyncio.to_thread(later.acquire))
        task.cancel()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    row = lock_rows.get(resource)
    left = (row.reader_count if row else None, len(holds))
    for held in holds:  # every real reader leaves: nobody holds it now
        held.release()
    try:
        semaphore(resource, wait=0.5, lease=30, user="writer").acquire().release()
    except SemaphoreBusy as busy:
        pytest.fail(
            f"no reader holds it, yet a writer is busy ({busy}): the cancelled admission left "
            f"its count (rc {left[0]} for {left[1]} readers before they left)"
        )


def test_a_waiter_cancelled_as_its_ticket_is_drawn_leaves_no_gap_in_the_line(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async waiter cancelled while its ticket's draw is on its way: the driver waits for
    the draw's answer (applied: the ticket is drawn), but its cleanup leaves the line only
    from a place the loop had learnt, and the loop never saw that answer. The ticket has no
    entry, no word and no dead mark: every waiter behind it, and every releaser, takes it for
    a waiter between its two writes and waits JOIN_GRACE (1 s) before passing it. The
    driver had the ticket in hand: marking it dead would cost the line nothing."""
    from dynasem._storage import lock_rows, queue_entries

    # The gap's cost made long (5 s, not 1 s), so that the bound below, which must leave a
    # loaded machine's round trips room (the release and the hand-over, each up to a second on
    # CI), still tells a lock handed on at once from one that waited for the gap.
    monkeypatch.setattr(queue_entries, "JOIN_GRACE", 5.0)
    resource = "line:cancelled-draw"
    holder = semaphore(resource, lease=30, user="holder").acquire()
    update = lock_rows.update
    armed, landed, go = [True], threading.Event(), threading.Event()

    def held_up(action: dict[str, Any], **kwargs: Any) -> Any:
        answer = update(action, **kwargs)
        if armed and "ADD #qin" in action.get("UpdateExpression", ""):
            armed.clear()
            landed.set()
            go.wait(5)  # its answer held up on the way back
        return answer

    monkeypatch.setattr(lock_rows, "update", held_up)

    async def cancelled_waiter() -> None:
        sem = semaphore(resource, fair=True, wait=30, lease=30, user="cancelled")
        task = asyncio.ensure_future(sem.aacquire())
        assert await asyncio.to_thread(landed.wait, 5), "the ticket was never drawn"
        task.cancel()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_waiter())
    got: list[float] = []

    def next_waiter() -> None:
        held = semaphore(resource, fair=True, wait=10, lease=30, user="next").acquire()
        got.append(time.monotonic())
        held.release()

    waiter = threading.Thread(target=next_waiter)
    waiter.start()
    # Queued behind the gap, its entry put (a fixed 0.5 s sleep stood in for it: on a loaded
    # machine the waiter could still be on its way, and the idle time then counted its start).
    deadline = time.monotonic() + 10
    while not any(w.user_id == "next" for w in queue_of(resource).values()):
        assert time.monotonic() < deadline, "the next waiter never queued"
        time.sleep(0.02)
    released = time.monotonic()
    holder.release()
    waiter.join(10)
    assert got, "the next waiter never got the lock"
    idle = got[0] - released
    assert idle < queue_entries.JOIN_GRACE / 2, (
        f"the lock stood idle {idle:.2f}s for the cancelled waiter's ticket"
    )
