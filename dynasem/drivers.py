"""The drivers of the acquire loop. The loop is a generator of steps (:class:`Request`,
:class:`Sleep`, :class:`Write`, :class:`InQueue`), so one loop serves blocking code
(:func:`run_sync`) and asyncio (:func:`run_async`: requests in a thread, pauses as
``asyncio.sleep``, cleanup when the caller is cancelled)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from . import clock, table
from .exceptions import SemaphoreUnavailable

_T = TypeVar("_T")


def withdraw(token: str, resources: list[str]) -> None:
    """Best effort: release whatever an unanswered write of ours may have taken."""
    for resource in resources:
        try:
            table.update(table.give_back(resource, token, clock.now_ms(), sole=False))
        except (table.Refused, SemaphoreUnavailable):
            pass


@dataclass(frozen=True, slots=True)
class Request:
    """Send a request: the loop is sent back its result, or has its exception thrown in."""

    send: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause for ``seconds`` (nothing when 0)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Write:
    """An acquire write, with what to withdraw if its caller is cancelled meanwhile."""

    send: Callable[[], Any]
    token: str
    resources: list[str]


@dataclass(frozen=True, slots=True)
class InQueue:
    """A step of a queued wait: if its caller is cancelled, the queue entry must go (or a
    releasing holder would hand the lock to a waiter nobody is left to use)."""

    send: Callable[[], Any]
    token: str
    resource: str
    write: bool = False  # the enqueue itself (a wait for a push is not)

    def abandon(self) -> None:
        try:
            table.update(table.dequeue(self.resource, self.token))
        except table.Refused as refused:
            gone = refused.lock
            if gone is not None and self.token in gone.holders:
                withdraw(self.token, [self.resource])  # handed to us meanwhile
        except SemaphoreUnavailable:
            pass  # the entry expires with its lease


# What the acquire loop yields; it is sent back a request's result (None after a pause).
Step = Request | Sleep | Write | InQueue
Steps = Generator[Step, Any, _T]


def _interrupted(step: Step, queued: InQueue | None) -> None:
    """The caller is interrupted (Ctrl-C, a cancelled task) during ``step``: leave nothing
    behind. A write may have landed: give back whatever it took, or the hold would sit there
    for a whole lease; an entry in a queue must go, or a releasing holder would hand the lock
    to a waiter nobody is left to use."""
    if isinstance(step, Write):
        withdraw(step.token, step.resources)
    if queued is not None:
        queued.abandon()


def run_sync(steps: Steps[_T]) -> _T:
    result: Any = None
    error: BaseException | None = None
    queued: InQueue | None = None  # we may be in a resource's queue
    step: Step | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            value: _T = stop.value  # what the generator returned
            return value
        except Exception:
            raise  # the loop's own answer (busy, unavailable): it cleaned up what it had
        except BaseException:  # interrupted inside the loop, after the last step
            if step is not None:
                _interrupted(step, queued)
            raise
        result, error = None, None
        if isinstance(step, InQueue):
            queued = step
        try:
            if isinstance(step, Sleep):
                if step.seconds:
                    time.sleep(step.seconds)
            else:
                try:
                    result = step.send()
                except Exception as exc:  # handed back to the loop, which decides
                    error = exc
        except BaseException:  # KeyboardInterrupt, SystemExit: not for the loop to decide
            steps.close()
            _interrupted(step, queued)
            raise


async def run_async(steps: Steps[_T]) -> _T:
    result: Any = None
    error: BaseException | None = None
    queued: InQueue | None = None  # we may be in a resource's queue
    step: Step | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            value: _T = stop.value  # what the generator returned
            return value
        except Exception:
            raise
        except BaseException:
            if step is not None:
                await asyncio.to_thread(_interrupted, step, queued)
            raise
        result, error = None, None
        if isinstance(step, InQueue):
            queued = step
        try:
            if isinstance(step, Sleep):
                if step.seconds:
                    await asyncio.sleep(step.seconds)
            else:
                request = asyncio.ensure_future(asyncio.to_thread(step.send))
                try:
                    result = await asyncio.shield(request)
                except asyncio.CancelledError:
                    if isinstance(step, Write) or (isinstance(step, InQueue) and step.write):
                        await asyncio.wait([request])  # it goes on in its thread: let it end
                    raise
                except Exception as exc:
                    error = exc
        except BaseException:  # cancelled (or interrupted)
            steps.close()
            await asyncio.to_thread(_interrupted, step, queued)
            raise
