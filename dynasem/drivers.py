"""The drivers of the acquire loop: it is a generator of steps (a request to send, a pause to
sleep), so one loop serves blocking code (:func:`run_sync`) and asyncio (:func:`run_async`,
requests in a thread, pauses as ``asyncio.sleep``, cleanup when the caller is cancelled)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from . import clock, table
from .exceptions import SemaphoreUnavailable

if TYPE_CHECKING:
    from .core import Semaphore

_T = TypeVar("_T")


def withdraw(token: str, resources: list[str]) -> None:
    """Best effort: release whatever an unanswered write of ours may have taken."""
    for resource in resources:
        try:
            table.update(table.give_back(resource, token, clock.now_ms(), sole=False))
        except (table.Refused, SemaphoreUnavailable):
            pass


def run_sync(steps: Generator[Any, Any, _T]) -> _T:
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            value: _T = stop.value  # what the generator returned
            return value
        result, error = None, None
        if callable(step):
            try:
                result = step()
            except Exception as exc:  # handed back to the loop, which decides
                error = exc
        elif step:
            time.sleep(step)


class InQueue:
    """A step of a queued wait: if its caller is cancelled, the queue entry must go (or a
    releasing holder would hand the lock to a waiter nobody is left to use)."""

    def __init__(
        self,
        fn: Callable[[], Any],
        sem: Semaphore,
        token: str,
        resource: str,
        *,
        write: bool = False,
    ):
        self.fn, self.sem, self.token, self.resource = fn, sem, token, resource
        self.write = write  # the enqueue itself (a wait for a push is not)

    def __call__(self) -> Any:
        return self.fn()

    def abandon(self) -> None:
        try:
            table.update(table.dequeue(self.resource, self.token))
        except table.Refused as refused:
            if self.token in ((refused.old or {}).get("holders") or {}):
                withdraw(self.token, [self.resource])  # handed to us meanwhile
        except SemaphoreUnavailable:
            pass  # the entry expires with its lease


class Write:
    """An acquire write, with what to withdraw if its caller is cancelled meanwhile."""

    def __init__(self, send: Callable[[], Any], sem: Semaphore, token: str, resources: list[str]):
        self.send, self.sem, self.token, self.resources = send, sem, token, resources

    def __call__(self) -> Any:
        return self.send()


async def run_async(steps: Generator[Any, Any, _T]) -> _T:
    result: Any = None
    error: BaseException | None = None
    queued: InQueue | None = None  # we may be in a resource's queue
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            value: _T = stop.value  # what the generator returned
            return value
        result, error = None, None
        if isinstance(step, InQueue):
            queued = step
        try:
            if callable(step):
                request = asyncio.ensure_future(asyncio.to_thread(step))
                try:
                    result = await asyncio.shield(request)
                except asyncio.CancelledError:
                    if isinstance(step, Write) or getattr(step, "write", False):
                        await asyncio.wait([request])  # it goes on in its thread: let it end
                    if isinstance(step, Write):
                        # The write may have landed: give back whatever it took, or the
                        # hold would sit there for a whole lease.
                        await asyncio.to_thread(withdraw, step.token, step.resources)
                    raise
                except Exception as exc:
                    error = exc
            elif step:
                await asyncio.sleep(step)
        except asyncio.CancelledError:
            if queued is not None:
                await asyncio.to_thread(queued.abandon)
            raise
