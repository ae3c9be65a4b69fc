"""dynasem._engine.steps: one step generator, run blocking or under asyncio (no DynamoDB needed)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dynasem._engine import steps as drivers
from dynasem._engine.steps import (
    InQueue,
    Request,
    Sleep,
    Step,
    Steps,
    Write,
    run_async,
    run_sync,
)
from dynasem._storage import dynamodb
from dynasem.exceptions import SemaphoreUnavailable


def steps_with_a_failure() -> Steps[list[Any]]:
    """Sends two requests and a pause; the second request fails and the loop catches it."""
    seen: list[Any] = [(yield Request(lambda: 41 + 1))]
    try:
        yield Request(lambda: 1 / 0)
    except ZeroDivisionError as exc:
        seen.append(type(exc).__name__)
    seen.append((yield Sleep(0.01)))
    seen.append((yield Sleep(0)))
    return seen


def test_run_sync_sends_results_throws_errors_and_sleeps() -> None:
    started = time.monotonic()
    assert run_sync(steps_with_a_failure()) == [42, "ZeroDivisionError", None, None]
    assert time.monotonic() - started >= 0.01


def test_run_async_does_the_same() -> None:
    assert asyncio.run(run_async(steps_with_a_failure())) == [42, "ZeroDivisionError", None, None]


def test_an_error_the_loop_does_not_catch_reaches_the_caller() -> None:
    def steps() -> Steps[None]:
        yield Request(lambda: {}["missing"])

    with pytest.raises(KeyError):
        run_sync(steps())
    with pytest.raises(KeyError):
        asyncio.run(run_async(steps()))


def test_a_cancelled_write_is_waited_for_then_withdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write goes on in its thread; once it ended, what it may have taken is given back."""
    withdrawn: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(drivers, "withdraw", lambda token, rs: withdrawn.append((token, rs)))
    release = threading.Event()
    finished = threading.Event()

    def slow_write() -> None:
        release.wait(5)
        finished.set()

    def steps() -> Steps[None]:
        yield Write(slow_write, "tok", ["a", "b"])

    async def main() -> None:
        task = asyncio.ensure_future(run_async(steps()))
        await asyncio.sleep(0.05)
        task.cancel()
        asyncio.get_running_loop().call_later(0.05, release.set)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert finished.is_set()  # waited for, not left running
    assert withdrawn == [("tok", ["a", "b"])]


def test_a_write_cancelled_twice_is_still_waited_for_then_withdrawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second cancel came while the first's cleanup waited for the write: still, what it
    may have taken is given back only once it ended (sent while it was on its way, the
    give-back would find nothing, and the write land after it)."""
    withdrawn: list[bool] = []
    finished = threading.Event()
    monkeypatch.setattr(drivers, "withdraw", lambda token, rs: withdrawn.append(finished.is_set()))
    release = threading.Event()

    def slow_write() -> None:
        release.wait(5)
        finished.set()

    def steps() -> Steps[None]:
        yield Write(slow_write, "tok", ["a"])

    async def main() -> None:
        task = asyncio.ensure_future(run_async(steps()))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()
        asyncio.get_running_loop().call_later(0.05, release.set)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert withdrawn == [True]  # once, after the write ended


def test_run_io_to_end_runs_a_call_cancelled_in_the_executors_queue() -> None:
    """A call waiting for a busy executor's thread, its caller cancelled twice: it runs all
    the same, and the caller's cancellation is raised once it has."""
    from concurrent.futures import ThreadPoolExecutor

    ran: list[str] = []
    busy = threading.Event()
    one_thread = ThreadPoolExecutor(1)

    async def main() -> None:
        one_thread.submit(busy.wait, 5)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(drivers, "_io", one_thread)
            task = asyncio.ensure_future(drivers.run_io_to_end(ran.append, "released"))
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done() and ran == []
        busy.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ran == ["released"]

    try:
        asyncio.run(main())
    finally:
        busy.set()
        one_thread.shutdown()


async def _cancelled_once_started(steps: Steps[None]) -> None:
    """Drive ``steps`` as a task, cancel it once it is under way, and see it cancelled."""
    task = asyncio.ensure_future(run_async(steps))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    "waiting",
    [
        lambda: Sleep(10),  # paced toward our turn
        # awaiting a pushed hand-over on the loop
        lambda: InQueue(lambda: None, "tok", "res", asend=lambda: asyncio.sleep(10)),
    ],
    ids=["sleep", "awaited-push"],
)
def test_a_cancelled_queued_wait_abandons_its_place(
    monkeypatch: pytest.MonkeyPatch, waiting: Callable[[], Step]
) -> None:
    abandoned: list[str] = []
    monkeypatch.setattr(InQueue, "abandon", lambda self: abandoned.append(self.resource))

    def steps() -> Steps[None]:
        yield InQueue(lambda: None, "tok", "res", write=True)  # joined
        yield waiting()  # waiting for our turn

    asyncio.run(_cancelled_once_started(steps()))
    assert abandoned == ["res"]


@pytest.mark.parametrize("how", ["interrupt", "cancel"])
def test_an_interrupted_queued_wait_leaves_its_place_before_the_loop_is_closed(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Closing the loop ends the wait (core then forgets the waiter's push mailbox): it
    leaves the queue first, so that a hand-over still on its way finds it leaving, to be
    handed on at once (push.depart), not gone."""
    order: list[str] = []
    monkeypatch.setattr(InQueue, "abandon", lambda self: order.append("left"))

    def interrupt() -> None:
        raise KeyboardInterrupt

    def steps() -> Steps[None]:
        try:
            yield InQueue(lambda: None, "tok", "res", write=True)  # joined
            yield Request(interrupt) if how == "interrupt" else Sleep(10)
        finally:
            order.append("closed")

    if how == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            run_sync(steps())
    else:
        asyncio.run(_cancelled_once_started(steps()))
    assert order == ["left", "closed"]


def _interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("how", ["interrupt", "cancel"])
def test_an_interrupt_at_a_later_step_gives_back_what_a_write_took(how: str) -> None:
    """A take landed (or may have: its answer lost), then the caller is interrupted at a step
    that writes nothing (a back-off, a read, a wait): what it took is given back, as for an
    interrupt during the write itself, or it would stay held by nobody for its lease."""
    undone: list[str] = []

    def steps() -> Steps[None]:
        yield Write(lambda: None, "tok", [], undo=lambda: undone.append("taken"))
        try:
            yield Write(
                lambda: _raise(ambiguous=True), "tok", [], undo=lambda: undone.append("lost")
            )
        except SemaphoreUnavailable:
            pass
        try:
            yield Write(lambda: _raise(refused=True), "tok", [], undo=lambda: undone.append("no"))
        except dynamodb.Refused:
            pass  # refused: applied nothing, the one before may have
        yield Request(_interrupt) if how == "interrupt" else Sleep(10)

    if how == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            run_sync(steps())
    else:
        asyncio.run(_cancelled_once_started(steps()))
    assert undone == ["lost"]  # the last write that may have applied: it covers what did


def test_a_write_that_applied_nothing_is_not_undone() -> None:
    undone: list[str] = []

    def steps() -> Steps[None]:
        for kind in ("refused", "cancelled", "throttled"):
            try:
                send = functools.partial(_raise, **{kind: True})
                yield Write(send, "tok", [], undo=undone.clear)
            except (dynamodb.Refused, dynamodb.Cancelled, SemaphoreUnavailable):
                undone.append(kind)
        yield Request(_interrupt)

    with pytest.raises(KeyboardInterrupt):
        run_sync(steps())
    assert undone == ["refused", "cancelled", "throttled"]


def _raise(
    *,
    ambiguous: bool = False,
    refused: bool = False,
    cancelled: bool = False,
    throttled: bool = False,
) -> None:
    if refused:
        raise dynamodb.Refused(None)
    if cancelled:
        raise dynamodb.Cancelled([("TransactionConflict", None)])
    raise SemaphoreUnavailable("lost", transient=True, ambiguous=ambiguous)


def test_an_awaitable_queued_step_is_awaited_on_the_loop_not_sent_in_a_thread() -> None:
    """A wait for a pushed hand-over: blocking code sends it (an Event wait in its thread),
    async code awaits it on the event loop, holding no thread."""
    threads: list[str] = []

    def blocking() -> str:
        threads.append(threading.current_thread().name)
        return "sent"

    async def awaited() -> str:
        threads.append(threading.current_thread().name)
        return "awaited"

    def steps() -> Steps[Any]:
        return (yield InQueue(blocking, "tok", "res", asend=awaited))

    assert run_sync(steps()) == "sent"
    assert asyncio.run(run_async(steps())) == "awaited"
    assert threads == [threading.current_thread().name] * 2


def test_async_requests_run_in_dynasems_own_threads_with_the_callers_context() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def request() -> tuple[str, str]:
        return threading.current_thread().name, var.get()

    def steps() -> Steps[Any]:
        return (yield Request(request))

    async def main() -> tuple[str, str]:
        var.set("the caller's")
        return await run_async(steps())

    name, value = asyncio.run(main())
    assert name.startswith("dynasem-io")
    assert value == "the caller's"


@pytest.mark.parametrize("applied", [True, False])
def test_a_withdrawal_is_not_sent_twice_for_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """Interrupted during a write after an earlier one of the same rows took something: the
    interrupted write's withdrawal of our token, applied, gave back the earlier one's too.
    Sending it again would be refused for certain (1 WCU for nothing; the simulator's
    interrupt fault counted one in about 500 interrupts). Not applied (refused: nothing of
    ours there, or given up), the earlier write's is still sent."""
    withdrawn: list[tuple[str, tuple[str, ...]]] = []

    def withdraw(token: str, resources: list[str]) -> bool:
        withdrawn.append((token, tuple(resources)))
        return applied

    monkeypatch.setattr(drivers, "withdraw", withdraw)

    def steps() -> Steps[None]:
        yield Write(lambda: None, "tok", ["r"])  # took the row
        yield Write(_interrupt, "tok", ["r"])  # a later write of it, interrupted

    with pytest.raises(KeyboardInterrupt):
        run_sync(steps())
    assert withdrawn == [("tok", ("r",))] * (1 if applied else 2)
