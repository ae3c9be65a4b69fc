"""The drivers of the acquire loop. The loop is a generator of steps (:class:`Request`,
:class:`Sleep`, :class:`Write`, :class:`InQueue`, :class:`Announce`), so one loop serves
blocking code (:func:`run_sync`) and asyncio (:func:`run_async`: requests in a thread of
dynasem's own executor, pauses as ``asyncio.sleep``, a wait for a pushed hand-over awaited on
the event loop, a signal sent as Django's own async code sends one, cleanup when the caller
is cancelled).

A waiting coroutine holds no thread: only a request in flight does, and in
:func:`io_executor`, never in the loop's default executor. That one is the application's
(``asyncio.to_thread``, ``sync_to_async`` with ``thread_sensitive=False``), ``min(32, cpus +
4)`` threads: 6 on a 2-core host. Waits that blocked its threads once left the lock idle for
seconds between holders while the application's own calls queued behind them."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import AsyncToSync, sync_to_async
from django.dispatch import Signal

from .. import _clock as clock
from .._observability.logs import facts
from .._storage import dynamodb, lock_rows, lock_writes
from .._transactions import commit
from ..exceptions import SemaphoreError, SemaphoreUnavailable
from . import handover, resend

_T = TypeVar("_T")

logger = logging.getLogger("dynasem")

# The threads of io_executor(): as many as the DynamoDB client's connection pool
# (``max_pool_connections`` in table/client.py), so a request never waits there for a
# connection. A thread is started only when no idle one is free, and only requests run in
# them: waits are asyncio's.
IO_THREADS = 32

_io: ThreadPoolExecutor | None = None
_io_lock = threading.Lock()
_io_pid = os.getpid()  # the process _io (and _io_lock) are of


def io_executor() -> ThreadPoolExecutor:
    """The executor dynasem's blocking requests run in for async callers (``dynasem-io``
    threads), made on first use; a forked child makes its own. So does a child forked by C
    code that runs none of Python's at-fork hooks (a uWSGI worker): its parent's executor
    counts idle threads that did not come along, and would never run a request."""
    global _io
    if _io_pid != os.getpid():
        _after_fork()
    with _io_lock:
        if _io is None:
            _io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="dynasem-io")
        return _io


async def run_io(func: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """``asyncio.to_thread`` on :func:`io_executor`: ``func`` runs in one of its threads with
    the caller's context (contextvars: Django's connections, the entered holds)."""
    return await submit_io(func, *args, **kwargs)


async def run_io_to_end(func: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """:func:`run_io` for what must not be left undone: a release, a give-back, the cleanup
    of an interrupted acquire, a write in flight. It runs to its end even if the caller is
    cancelled meanwhile (again: the first cancel is often what began the cleanup), and a
    cancellation is raised once it has ended. With :func:`run_io`, a cancel while the call
    waited for a thread of a busy executor dropped it unrun: a released block's hold stayed,
    renewed by its heartbeat, for nobody, as long as the process lived."""
    done = submit_io(func, *args, **kwargs)
    if await ended(done):
        error = None if done.cancelled() else done.exception()
        raise asyncio.CancelledError() from error
    return done.result()


def on_event_loop() -> bool:
    """Whether this thread runs an event loop (async code called us): a sync signal receiver
    run here could not use the ORM, and Django's ``send`` could not run an async one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def sync_caller() -> Any:
    """The executor of the sync thread this coroutine runs for (``async_to_sync``: a sync
    view calling async code), if it runs for one and it still takes work; else None."""
    caller = getattr(AsyncToSync.executors, "current", None)
    return None if caller is None or getattr(caller, "_broken", False) else caller


async def caller_in_transaction(using: str | None) -> bool:
    """Whether the sync thread this coroutine runs for is inside a transaction of ``using``:
    its ``sync_to_async`` work (Django's async ORM) runs on that thread, and commits with
    that transaction, so a hold taken now is given back after that commit, on that thread
    (:func:`release_to_end`). Asked before the acquire: after it, the question could wait
    behind a call of that thread that waits for the hold itself."""
    caller = sync_caller()
    if caller is None:
        return False
    loop = asyncio.get_running_loop()
    try:
        asked = loop.run_in_executor(caller, functools.partial(commit.open_transaction, using))
    except RuntimeError:  # that thread's executor quit meanwhile
        return False
    return (await asked) is not None


async def on_caller(func: Callable[[], object]) -> None:
    """Run ``func`` on the sync thread this coroutine runs for (``async_to_sync``), in its
    transactions; nothing if there is none (or its executor quit)."""
    caller = sync_caller()
    if caller is None:
        return
    loop = asyncio.get_running_loop()
    try:
        done = loop.run_in_executor(caller, contextvars.copy_context().run, func)
    except RuntimeError:  # that thread's executor quit meanwhile
        return
    await done


async def release_to_end(func: Callable[..., _T], /, *args: Any, on_caller: bool) -> _T:
    """:func:`run_io_to_end` for a release; ``on_caller`` (a hold taken while the sync
    thread this coroutine runs for was in a transaction: :func:`caller_in_transaction`): on
    that thread, where the release waits for that transaction's commit, as a ``with``
    block's does (in a thread of :func:`io_executor`, in no transaction, it gave the hold back
    before the work it protects was committed). Else in dynasem's executor: that thread may
    be busy with a call that waits for this very hold."""
    caller = sync_caller() if on_caller else None
    if caller is None:
        return await run_io_to_end(func, *args)
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, func, *args)
    try:
        done = loop.run_in_executor(caller, call)
    except RuntimeError:  # that thread's executor quit meanwhile
        return await run_io_to_end(func, *args)
    if await ended(done):
        error = None if done.cancelled() else done.exception()
        raise asyncio.CancelledError() from error
    return done.result()


async def run_io_taking(take: Callable[[], _T], give_back: Callable[[_T], object]) -> _T:
    """:func:`run_io` of a call that may take something (a claim, a hold): cancelled meanwhile,
    it is waited for all the same, and what it took is given back (``give_back`` of what it
    returned, run to its end) before the cancellation is raised. With :func:`run_io`, the call
    went on in its thread after the cancel, and what it took was kept for nobody."""
    taking = submit_io(take)
    if not await ended(taking):
        return taking.result()
    if not taking.cancelled() and taking.exception() is None:
        # A hold given back: lock_released sent here, as an async release's is; a
        # receiver's exception logged, the cancel goes on.
        await announced_after(run_io_to_end(give_back, taking.result()), ending=True)
    raise asyncio.CancelledError()


def submit_io(func: Callable[..., _T], /, *args: Any, **kwargs: Any) -> asyncio.Future[_T]:
    """:func:`run_io`'s call, begun: a future of the running loop, for a caller that must see
    how the call ended even if it is cancelled meanwhile (see :func:`ended`). No task: when
    ``asyncio.run`` ends, it cancels the tasks left, and a task of the call, cancelled, would
    end before the call did, which went on in its thread: what it took was left unseen."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
    return loop.run_in_executor(io_executor(), call)


async def ended(future: asyncio.Future[Any]) -> bool:
    """Wait for ``future`` to end, whatever cancels the caller meanwhile (``asyncio.wait``
    leaves the future be); True if the caller was cancelled: it must raise that then."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def _after_fork() -> None:
    global _io, _io_lock, _io_pid
    _io = None  # the parent's threads did not come along
    _io_lock = threading.Lock()  # a thread of the parent may have held it
    _io_pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def withdraw(token: str, resources: list[str]) -> bool:
    """Best effort: release whatever an unanswered write of ours may have taken (sent again
    while it fails for a passing cause, as a release is). True: every one was given back (our
    token was there, and is gone)."""
    done = True
    for resource in resources:
        given = resend.undone(functools.partial(_give_back, resource, token), resource, token)
        done = given and done
    return done


def _give_back(resource: str, token: str) -> None:
    now = clock.now_ms()  # sent again, the time it is sent
    # A waiter may have queued behind the hold it withdraws: pushed, as by a release.
    action = lock_writes.give_back(resource, token, now, sole=False)
    handover.push_if_free(resource, lock_rows.update(action, return_new=True))


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
    # What gives back what this write may have taken, if not a release of ``resources``
    # by ``token`` (a permit: see dynasem._engine.permits).
    undo: Callable[[], None] | None = None
    # What gives back what it took when it is known applied (its answer came) and nothing
    # after it was sent: an async caller cancelled while it was on its way (the driver waits
    # for the answer). None: ``undo`` (or the withdrawal) as for any interrupt.
    landed: Callable[[], None] | None = None

    def give_back(self, landed: bool = False) -> bool:
        """Give back what this write may have taken (``landed``: it was applied, and nothing
        after it was sent). True: a withdrawal of our token from every row it wrote,
        applied (nothing of ours is left there)."""
        if landed and self.landed is not None:
            self.landed()
            return False
        if self.undo is not None:
            self.undo()
            return False
        return withdraw(self.token, self.resources)

    def covers(self, other: Write) -> bool:
        """Whether this write's give-back gives back whatever ``other`` may have taken too:
        both withdraw our token from rows, and ``other``'s rows are among this one's."""
        same = self.undo is None and other.undo is None and self.token == other.token
        return same and set(other.resources) <= set(self.resources)


@dataclass(frozen=True, slots=True)
class InQueue:
    """A step of a queued wait: if its caller is cancelled, the queue entry must go (or a
    releasing holder would hand the lock to a waiter nobody is left to use), and a hand-over
    that reached it, or is still on its way, is handed on to the next waiter."""

    send: Callable[[], Any]
    token: str
    resource: str
    write: bool = False  # the enqueue itself (a wait for a push is not)
    # The same step for async callers, awaited on the event loop instead of sent in a thread
    # (a wait for a push: a coroutine waits with no thread).
    asend: Callable[[], Awaitable[Any]] | None = None
    # What leaves the queue if the caller is interrupted (dynasem._engine.late_handover's
    # abandon); None before our ticket is known: a ticket drawn without an entry is passed by
    # the next turn.
    leave: Callable[[], None] | None = None

    def abandon(self) -> None:
        if self.leave is not None:
            self.leave()


@dataclass(frozen=True, slots=True)
class Announce:
    """Send ``signal`` about the acquire's end, before its caller has it (a new hold's
    ``lock_acquired``, a busy acquire's ``lock_busy``). A receiver's exception (or an interrupt
    while it runs) ends the acquire with it, once ``undo`` (if any: the hold announced) has
    given back what the acquire took. Blocking, ``signal.send``; under asyncio as Django's
    own async code sends one (:meth:`asend`): on the event loop's thread, a sync receiver
    that used the ORM raised ``SynchronousOnlyOperation``."""

    signal: Signal
    arguments: dict[str, Any]  # sender= and the signal's keyword arguments
    undo: Callable[[], None] | None = None

    def send(self) -> None:
        if not self.signal.receivers:
            return  # nobody listens (Signal.send's own first test): nothing runs, nor counts
        reset = _receiving.set(_receiving.get() + 1)
        try:
            self.signal.send(**self.arguments)
        finally:
            _receiving.reset(reset)

    async def asend(self) -> None:
        """``Signal.asend`` (Django 5.0+): sync receivers in ``sync_to_async``
        (thread-sensitive: the request's thread, or the sync thread this coroutine runs for
        under ``async_to_sync``), async ones awaited on the loop. Django 4.2 has no
        ``asend``: ``send`` in ``sync_to_async``, as its own async code does, only if
        anyone listens (as ``asend`` does): else every async acquire would hop to the sync
        thread, and one run by ``asyncio.run`` on that very thread would wait for itself."""
        if not self.signal.receivers:
            return  # as send()
        asend = getattr(self.signal, "asend", None)
        reset = _receiving.set(_receiving.get() + 1)
        try:
            if asend is not None:
                await asend(**self.arguments)
            elif self.signal.has_listeners(self.arguments.get("sender")):
                await sync_to_async(self.send)()
        finally:
            # Closed by the garbage collector, in another context than its task's.
            with contextlib.suppress(ValueError):
                _receiving.reset(reset)


# How deep in the receivers of signals dynasem sends (an Announce's) this code runs: a sync
# receiver runs in the acquiring (or releasing) thread, in its context.
_receiving: contextvars.ContextVar[int] = contextvars.ContextVar("dynasem_receiving", default=0)


def receiving() -> int:
    """How deep in receivers of dynasem's signals this code runs (0: in none). An acquire a
    receiver makes is its own, delivered to it: never one of the holds the acquire (or
    release) that sent the signal gives back if it fails (:func:`hold.delivering`)."""
    return _receiving.get()


def announce(
    signal: Signal, /, *, undo: Callable[[], None] | None = None, **arguments: Any
) -> Announce:
    """The step that sends ``signal`` with ``arguments`` (``sender=`` among them)."""
    return Announce(signal, arguments, undo)


class _Later:
    """The announces a release made while an async caller ran it in a thread
    (:func:`announced_after`), kept for that caller to send once it has ended. Closed then: a
    release run later (a transaction's commit) sends its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[Announce] | None = []

    def keep(self, step: Announce) -> bool:
        with self._lock:
            if self._kept is None:
                return False
            self._kept.append(step)
            return True

    def close(self) -> list[Announce]:
        with self._lock:
            kept, self._kept = self._kept or [], None
            return kept


_later: contextvars.ContextVar[_Later | None] = contextvars.ContextVar(
    "dynasem_announced_later", default=None
)


def send_or_keep(step: Announce) -> None:
    """Send ``step`` (a release's ``lock_released``) now; in a release an async caller runs in
    a thread, once that release has ended, by that caller (:func:`announced_after`)."""
    later = _later.get()
    if later is None or not later.keep(step):
        try:
            step.send()
        except Exception as exc:
            # A receiver's, the release made: marked, so that a caller that logs it (a
            # commit's give-back, a unique claim's) does not take it for the release's.
            setattr(exc, _RECEIVERS, True)
            raise


async def announced_after(
    call: Awaitable[_T], failed: Callable[[Exception], None] | None = None, *, ending: bool = False
) -> _T:
    """Await ``call`` (a release run in a thread: :func:`release_to_end`), then send what it
    announced there as Django's async code sends a signal (:meth:`Announce.asend`), as an
    acquire's are. Sent in a thread of :func:`io_executor`, a sync receiver's ORM query
    opened a connection there that Django never closes (one per thread, for good), and an
    async receiver was not awaited. ``failed``: what a receiver's exception is given to
    instead of being raised (a block that raised: its own exception goes on). A release that
    ended with an exception (a cancel while it ran in its thread) raises that one, a
    receiver's logged: raised in its stead, it swallowed the cancel, as no sync release can.
    So does ``ending``: the caller ends with an exception of its own (a cancel it took)."""
    later = _Later()
    reset = _later.set(later)
    ended_well = False
    try:
        done = await call
        ended_well = True
        return done
    finally:
        _later.reset(reset)
        for step in later.close():
            try:
                await step.asend()
            except Exception as exc:
                if failed is not None:
                    failed(exc)
                elif ended_well and not ending:
                    raise
                else:
                    _receiver_failed(step, exc)


def _receiver_failed(step: Step, exc: Exception) -> None:
    """A lock_released receiver raised as a release, or an acquire's clean-up, ended with
    an exception of its own (a cancel, a lock_acquired receiver's): logged, that one goes on.
    ``step``: the release's announce, or the acquire's step that was interrupted."""
    args = step.arguments if isinstance(step, Announce) else {}
    resource, token, fence = args.get("resource"), args.get("token"), args.get("fence")
    ex = facts(resource, token=token, fence=fence, outcome="receiver_failed")
    message = "dynasem: a lock_released receiver raised for %r as its release ended otherwise: %r"
    logger.warning(message, resource, exc, extra=ex, exc_info=exc)


# What the acquire loop yields; it is sent back a request's result (None after a pause).
Step = Request | Sleep | Write | InQueue | Announce
Steps = Generator[Step, Any, _T]


class _Landed(asyncio.CancelledError):
    """The caller was cancelled while a write was on its way, and the write was applied (its
    answer came): what it took is given back knowing so (:attr:`Write.landed`)."""


def _interrupted(
    step: Step, queued: InQueue | None, taken: Write | None = None, landed: bool = False
) -> None:
    """The caller is interrupted (Ctrl-C, a cancelled task) during ``step``: leave nothing
    behind. A write may have landed: give back whatever it took, or the hold would sit there
    for a whole lease; an entry in a queue must go, or a releasing holder would hand the lock
    to a waiter nobody is left to use. ``taken``: an earlier write that may have taken
    something (interrupted at a step after it: a back-off, a read, a wait), given back too,
    once the queue is left (a hand-over that reached us there is handed on, not dropped).
    Every give-back is conditional on our token: one of what is no longer ours is refused.
    ``taken``'s is not sent when ``step``'s withdrew our token from the same rows already:
    it would be refused for certain (1 WCU for nothing), as the queue was left meanwhile (a
    hand-over that reached us there was handed on by leaving it). During an
    :class:`Announce` of a hold, the loop is over: what it took is that hold, given back."""
    if isinstance(step, Announce):
        if step.undo is not None:
            step.undo()
        return
    given_back = step.give_back(landed) if isinstance(step, Write) else False
    if queued is not None:
        queued.abandon()
    if taken is not None and taken is not step:
        if not (given_back and isinstance(step, Write) and step.covers(taken)):
            taken.give_back()


def _may_have_taken(step: Step, error: Exception | None) -> bool:
    """Whether ``step``, answered with ``error`` (None: applied), is a write that may hold
    something of ours: applied, or failed in a way that may hide an applied attempt."""
    if not isinstance(step, Write) or (step.undo is None and not step.resources):
        return False
    if isinstance(error, (dynamodb.Refused, dynamodb.Cancelled)):
        return error.retried  # refused, unless an attempt before it may have been applied
    if isinstance(error, SemaphoreUnavailable):
        return error.ambiguous
    return True


def run_sync(steps: Steps[_T]) -> _T:
    """Run the acquire loop blocking: :func:`_drive`'s coroutine, which never suspends when
    ``blocking`` (every step is performed in place), run to its end in one ``send``."""
    drive = _drive(steps, blocking=True)
    try:
        drive.send(None)
    except StopIteration as stop:
        value: _T = stop.value  # what the loop returned
        return value
    raise RuntimeError("a blocking step suspended the acquire loop")  # cannot happen


async def run_async(steps: Steps[_T]) -> _T:
    """Run the acquire loop under asyncio (see :func:`_perform`)."""
    return await _drive(steps, blocking=False)


async def _drive(steps: Steps[_T], *, blocking: bool) -> _T:
    """The one loop of both drivers: sends each step's result into the acquire loop (or
    throws its error in), and leaves nothing behind if the caller is interrupted."""
    result: Any = None
    error: BaseException | None = None
    queued: InQueue | None = None  # we may be in a resource's queue
    taken: Write | None = None  # the last write that may hold something of ours
    step: Step | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
            if isinstance(step, InQueue):
                queued = step
            result, error = await _perform(step, blocking=blocking)
            if _may_have_taken(step, error):
                assert isinstance(step, Write)
                taken = step
        except StopIteration as stop:
            value: _T = stop.value  # what the generator returned
            return value
        except BaseException as exc:  # Ctrl-C, SystemExit, cancelled, a soft time limit
            if isinstance(exc, _OWN) and not isinstance(step, Announce):
                raise  # the loop's own answer (busy, unavailable): it cleaned up what it had
            # Interrupted during ``step``, or inside the loop after it (then it is over); or
            # a receiver of an announced hold raised. Leave the queue before the loop is
            # closed: closing it stops our push slot (core's ``push.forget``), and a
            # hand-over still on its way to us must find it (``push.depart``) to be handed
            # on at once.
            try:
                landed = isinstance(exc, _Landed)
                if step is None or (isinstance(step, Announce) and step.undo is None):
                    pass  # nothing taken; or busy announced: the loop gave back what it had
                elif blocking or closing(exc):
                    _interrupted(step, queued, taken)
                else:
                    # A hold announced, given back: lock_released sent here, as an async
                    # release's is; a receiver's exception logged, the acquire's goes on.
                    cleanup = run_io_to_end(_interrupted, step, queued, taken, landed)
                    await announced_after(cleanup, functools.partial(_receiver_failed, step))
            finally:
                steps.close()
            if isinstance(exc, _Landed):
                raise asyncio.CancelledError() from None  # as any cancel (matched by type)
            raise


def closing(exc: BaseException | None) -> bool:
    """Whether ``exc`` closes the coroutine it is raised in (``coro.close()``): the garbage
    collector's, when a task was destroyed pending (its loop closed without cancelling it,
    as ``loop.run_until_complete(main()); loop.close()`` leaves main's background tasks), in
    whatever thread and context it runs, maybe with no loop running. Such a coroutine can
    await nothing more: what must not be left undone is done in place, blocking."""
    return isinstance(exc, GeneratorExit)


# What the loop raises as its answer, having cleaned up what it had (busy, unavailable, a
# bad argument); any other exception out of it (a signal handler's at any line, as Celery's
# SoftTimeLimitExceeded, an Exception; a request's error the loop does not know, thrown in)
# is an interrupt, cleaned up as Ctrl-C is: a write of ours that landed is given back.
_OWN = (SemaphoreError, ValueError, TypeError)


async def _perform(step: Step, *, blocking: bool) -> tuple[Any, Exception | None]:
    """One step: its result, or the error the loop decides on. Blocking, in place; under
    asyncio, a pause or a wait for a push on the event loop, a request in
    :func:`io_executor`; a signal as Django's own async code sends one. A receiver's
    exception is not the loop's to decide on: it ends the acquire (:func:`_drive`)."""
    if isinstance(step, Announce):
        await _announce(step, blocking=blocking)
        return None, None
    if isinstance(step, Sleep):
        if step.seconds and blocking:
            time.sleep(step.seconds)
        elif step.seconds:
            await asyncio.sleep(step.seconds)
        return None, None
    try:
        if blocking:
            return step.send(), None
        if isinstance(step, InQueue) and step.asend is not None:
            return await step.asend(), None
        if isinstance(step, Write):
            # Cancelled, it goes on in its thread: the cleanup must know how it ended.
            done = submit_io(step.send)
            if await ended(done):
                error = None if done.cancelled() else done.exception()
                if error is None and not done.cancelled():
                    raise _Landed()
                raise asyncio.CancelledError() from error
            return done.result(), None
        if isinstance(step, InQueue) and step.write:
            return await run_io_to_end(step.send), None
        return await run_io(step.send), None
    except Exception as exc:  # handed back to the loop, which decides
        return None, exc


async def _announce(step: Announce, *, blocking: bool) -> None:
    try:
        if blocking:
            step.send()
        else:
            await step.asend()
    except Exception as exc:
        # A receiver's: marked, so that a caller of the loop that reads its answers (a
        # coalesced acquire's SemaphoreBusy) does not take it for the loop's own.
        setattr(exc, _RECEIVERS, True)
        raise


# The attribute that marks an exception raised by a signal's receiver (see from_receiver).
_RECEIVERS = "_dynasem_from_receiver"


def from_receiver(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a receiver of an acquire's ``lock_acquired`` or
    ``lock_busy`` (an :class:`Announce`), not by the acquire loop: a ``SemaphoreBusy`` of a
    receiver that took another lock says nothing of this acquire's lock; or by a receiver of
    a release's ``lock_released`` (:func:`send_or_keep`), the hold given back."""
    return getattr(exc, _RECEIVERS, False) is True
