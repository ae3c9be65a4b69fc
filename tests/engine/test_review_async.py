"""Review of the async side (steps.run_async, aacquire, async with, await_push): what a task
leaves behind when its event loop ends without cancelling it."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import heartbeat
from dynasem._engine import push as wakeup
from dynasem._operators.locks import holds_on


def _close_with_pending(loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[None]]) -> None:
    """``loop.run_until_complete(main()); loop.close()`` with a task of main's still pending
    (a background task nobody awaited): the loop is closed, the task is destroyed, its
    coroutine closed by the garbage collector (``GeneratorExit`` at its await)."""
    loop.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tasks.clear()  # the caller keeps no reference: the task is garbage
        gc.collect()


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
