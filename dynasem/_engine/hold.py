"""A hold's life: :class:`Held` renews it, gives it back (handing it straight to the first
waiter, or to the readers at the head of the line, when there are any) and tells when it is
lost. Read top-down: what users read, renewing, releasing (hand-over, then plain release)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar, copy_context
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

from django.dispatch import Signal

from .. import _clock as clock
from .._observability import telemetry
from .._observability.logs import facts
from .._storage import claims, dynamodb, lock_rows, lock_writes, records
from .._storage.records import Mode
from .._transactions import commit, fencing
from ..exceptions import LockLost, SemaphoreUnavailable
from ..signals import lock_acquired, lock_lost, lock_released
from . import handover, push, resend
from .heartbeat import LOOK_EVERY, Heartbeat, close_connections
from .lockspec import LockSpec
from .steps import (
    Announce,
    announce,
    announced_after,
    closing,
    from_receiver,
    io_executor,
    on_event_loop,
    receiving,
    release_to_end,
    run_io,
    run_io_to_end,
    send_or_keep,
)

logger = logging.getLogger("dynasem")

_T = TypeVar("_T")
_NOTHING = contextlib.nullcontext()


@contextlib.contextmanager
def _owned(lock: threading.RLock) -> Iterator[None]:
    """Release ``lock``, acquired already, at the end of the block."""
    try:
        yield
    finally:
        lock.release()


# A plain release of a hold older than this (seconds) asks for the item back, to push the
# first of any waiters that queued after we last saw the queue.
WAKE_AFTER = 0.05
TAKEN_OVER = "another holder took it over, or it was broken by an operator"
# A child forked inside a block has a copy of the hold, never trusted: if the holder's own
# process dies, a waiter of its host proves it dead and takes the lock at once, long before
# the lease the copy knows of ends, and nothing tells the child when that happens.
FORKED = (
    "this process is a child forked inside the block: the hold is its parent's, which may "
    "die and be taken over by a waiter of its host at any moment"
)


class Held:
    """One acquisition, as ``acquire()`` returns it, renewed by the heartbeat while it lives:
    ``resource`` (``resources`` if several), ``fence`` (``fences``; larger than every earlier
    holder's), ``token``, ``user_id``, ``expires`` (UTC); ``arenew``, ``arelease`` for async."""

    # A loss's give-back by renew() (_give_back_lost), each set on the instance when it happens:
    _row_refused = False  # a write of ours was refused: the row is not ours
    _given_back_lost = False  # given back by renew() as it found the hold lost
    # A renew() found the hold lost as it waited for a renewal in flight: that renewal,
    # finding it lost too, gives the row back.
    _give_back_asked = False
    _renewers_waiting = 0  # renew() callers waiting for a renewal in flight (_renew)

    def __init__(
        self,
        semaphore: LockSpec,
        *,
        token: str,
        user_id: str,
        fences: dict[str, int],
        lease: float,
        skew: float,
        expires_ms: int,
        sent_mono: float,
    ):
        self.semaphore = semaphore
        self.resources = list(semaphore.resources)
        self.token, self.user_id, self.fences = token, user_id, fences
        self.lease, self.skew = lease, skew
        self._expires_ms = expires_ms
        self._lock = threading.RLock()  # serialises renew/release requests
        self._state_lock = threading.Lock()  # guards _lost, _renewers_waiting: never across I/O
        # Guards each read-and-write of _row (the line words join, in the listener's thread or a
        # waiter's, while a renewal observes the row): never held across a request.
        self._row_lock = threading.Lock()
        self._lost: str | None = None
        # Told of the loss before lock_lost is sent: dynasem's own listeners (a lead), which
        # must not depend on a project's receivers connected before them, any of which may raise.
        self._lost_watchers: list[Callable[[], None]] = []
        # Its fence_db blocks' records (reentry.Block) whose transaction is open, innermost
        # last (fencing.begin, end, cut_short).
        self.fenced: list[Any] = []
        self._released = False
        # Its release was interrupted before it began: left to its lease (re-entered no more).
        self.left_to_lease = False
        # Taken by async code run for a sync thread inside a transaction (async_to_sync):
        # an async release runs on that thread, after its commit (steps.release_to_end).
        self.follows_caller = False
        self._pending_commit = False  # given back, waiting for the transaction to end
        self._heartbeat: Heartbeat | None = None
        self._taken_mono = clock.monotonic()
        # When max_hold ends the hold whatever renewals do (never: inf; max_hold is above 0).
        self._max_hold_end = self._taken_mono + (semaphore.max_hold or math.inf)
        self._deadline = min(sent_mono + lease - skew, self._max_hold_end)
        self._row: records.LockItem | None = None  # the row as we last saw it: its queue
        self._hold_avg: int | None = None
        # A write of ours that got no answer may have been applied: a hand-over (see
        # _hand_over; only a hold of one resource hands over), or a release sent again after
        # an ambiguous failure. A refusal of the release that follows is then no proof of a loss.
        self._unanswered = False
        self.unreleased = False  # a release of ours gave up (said so): it expires
        self._giving_back_mono = math.inf  # when the release began (see _released_by)
        # Who took it: at exit, only holds of threads that ended are given back (shutdown.py).
        self.thread = threading.current_thread()
        # The thread in whose transaction it waits for the commit, once given back inside one.
        self.pending_in: threading.Thread | None = None
        self._pid = os.getpid()  # a forked child's copy is its parent's hold, not the child's
        # Acquisitions of it in all: nested acquires in the same thread or task re-enter it
        # (reentry.py); only the last release gives it back.
        self.depth = 1
        # A unique task's run that enqueued its retry: the retry's claim token, which this
        # hold becomes at the run's end instead of being given back (dynasem._background.unique).
        self.handed_on: str | None = None
        self.telemetry_context: Any = None  # the acquire's span (telemetry.py links to it)
        self._handover: tuple[int, int, int, int] | None = None  # when, to how many, fence
        self._told: str | None = None  # the waiter of this process that told us it is next
        # The hand-over write sent last (its heirs, their first fence, the line after them):
        # one that was applied though its answer was lost is pushed from the refusal that
        # shows it (_wake_next).
        self._handing: tuple[handover.Heirs, int, handover.Line] | None = None

    # -- what users read ---------------------------------------------------------------------

    @property
    def resource(self) -> str:
        return self.resources[0]

    @property
    def fence(self) -> int:
        return self.fences[self.resource]

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self._expires_ms / 1000, tz=UTC)

    @property
    def lost(self) -> bool:
        """True once the hold is known not to be ours any more (or its lease ran out); always
        in a child forked inside the block (see :data:`FORKED`)."""
        self.check_deadline()
        return self._lost is not None or not self.here

    @property
    def released(self) -> bool:
        return self._released

    @property
    def pending_commit(self) -> bool:
        """True while the hold waits for its transaction to end before it is given back."""
        return self._pending_commit

    @property
    def here(self) -> bool:
        """Whether this process took the hold: a child forked inside its block has a copy
        that is its parent's (re-entry and a transaction's taking it again skip it)."""
        return os.getpid() == self._pid

    def seconds_left(self) -> float:
        """How long we may still trust the hold without renewing (our clock, skew allowed);
        0 once it is known lost (broken, taken over, a newer fence found), deadline or not,
        and in a child forked inside the block (see :data:`FORKED`)."""
        if self._lost is not None or not self.here:
            return 0.0
        return max(0.0, self._deadline - clock.monotonic())

    def __repr__(self) -> str:
        return f"<Held {self.resources!r} fence={self.fence} user={self.user_id!r}>"

    def fence_transaction(self, using: str | None = None) -> None:
        """Make the open transaction of ``using`` (the semaphore's ``using`` if None) refuse
        to land after a newer holder's: writes this hold's fence first in it, kept locked
        until it ends; raises ``LockLost`` if a newer holder's fence is there. See the how-to
        guide "Transactions and fencing"."""
        fencing.fence_transaction(self, using if using is not None else self.semaphore.using)

    # -- losing it ---------------------------------------------------------------------------

    def check_deadline(self) -> None:
        if not self.here:
            # A copy in a child forked inside the block: never renewed there, its deadline
            # passes while the parent still holds; the child tells no loss of the parent's.
            return
        if self._lost is None and not self._released and clock.monotonic() >= self._deadline:
            if not self._given_in_time():
                self._mark_lost(self._deadline_reason())

    def _given_in_time(self) -> bool:
        """Its release began within the lease: the work under it ended in time, though the
        release may still wait for a renewal in flight (one that hangs on a network cut)."""
        return self._giving_back_mono < self._deadline

    def _lost_by_refusal(self, reason: str, resource: str | None = None) -> NoReturn:
        """A write of ours was refused, the hold not ours: lost for ``reason`` if the refusal
        came while we trusted it. After our deadline, the write may have arrived after it too
        (a partition, a pause), and another holder taken over only then: the lease ran out;
        unless the release had begun by then (the heartbeat's renewal in flight past it).
        ``resource``: the one of several whose write was refused, named in the reason."""
        self._row_refused = True
        if resource is not None and len(self.resources) > 1:
            reason = f"{reason} ({resource!r})"
        if clock.monotonic() >= self._deadline:
            if self._given_in_time():
                raise LockLost(self.resource, "it was released")
            reason = self._deadline_reason()
        self._mark_lost(reason)
        self._raise_lost()

    def _deadline_reason(self) -> str:
        if clock.monotonic() >= self._max_hold_end:
            return f"it was held for max_hold={self.semaphore.max_hold:g}s"
        return "its lease ran out before it could be renewed"

    def _mark_lost(self, reason: str) -> None:
        with self._state_lock:
            if self._lost is not None:
                return
            self._lost = reason
        self._stop_heartbeat()
        ex = self._facts("lost", reason)
        logger.warning("dynasem: lost the hold on %r: %s", self.resource, reason, extra=ex)
        if telemetry.ON:
            telemetry.lost(self, reason)
        try:
            for watcher in list(self._lost_watchers):
                watcher()
        finally:
            told = functools.partial(self._tell_lost, reason, self._pending_commit)
            if on_event_loop():
                # Found by async code on its event loop's thread (``held.lost`` read past the
                # deadline): sent from a thread of dynasem's executor; there a sync receiver
                # could not use the ORM (it raised out of ``held.lost``), nor Django's
                # ``send`` run an async one.
                io_executor().submit(copy_context().run, self._told_quietly, told)
            else:
                told()

    def _tell_lost(self, reason: str, pending_commit: bool) -> None:
        # pending_commit: its block had ended, its transaction had not: the transaction's
        # work may still commit after another holder took over.
        self._send(lock_lost, reason=reason, pending_commit=pending_commit)

    def _told_quietly(self, told: Callable[[], None]) -> None:
        """``told()``, in a thread of its own: a receiver's exception is logged (nobody is
        there to raise it to)."""
        try:
            told()
        except Exception as exc:
            message = "dynasem: a lock_lost receiver raised for %r: %r"
            logger.warning(message, self.resource, exc, extra=self._facts("receiver_failed", exc))
        finally:
            close_connections()  # a receiver's, in a thread of dynasem's executor

    def _facts(self, outcome: str, reason: object = None) -> dict[str, Any]:
        """``extra`` for a log record about this hold."""
        return facts(
            self.resource, token=self.token, fence=self.fence, outcome=outcome, reason=reason
        )

    def _raise_lost(self) -> NoReturn:
        raise LockLost(self.resource, self._lost or (FORKED if not self.here else "unknown"))

    def raise_if_lost(self) -> None:
        """Raise ``LockLost`` (with the reason it was lost) if the hold is known lost, or its
        lease ran out."""
        if self.lost:
            self._raise_lost()

    def found_lost(self, reason: str, resource: str | None = None) -> NoReturn:
        """Another holder's trace was found (outside DynamoDB: a newer fence in a database):
        mark the hold lost for ``reason`` and raise ``LockLost`` for ``resource`` (the hold's
        if None)."""
        self._mark_lost(reason)
        raise LockLost(resource or self.resource, reason)

    def _send(self, signal: Signal, **more: Any) -> None:
        self._announce(signal, **more).send()

    def _announce(
        self, signal: Signal, undo: Callable[[], None] | None = None, **more: Any
    ) -> Announce:
        """``signal`` about this hold (``more``: its own arguments), as a step of the acquire
        loop (``undo``: what gives the hold back if it fails)."""
        return announce(
            signal,
            undo=undo,
            sender=self.semaphore.signal_sender,
            resource=self.resource,
            user_id=self.user_id,
            token=self.token,
            fence=self.fence,
            **more,
        )

    # -- renewing ----------------------------------------------------------------------------

    def renew(self) -> None:
        """Extend the lease now (the heartbeat does this by itself while the hold lives).
        ``LockLost`` if the hold is lost; its row, which may still name us (a renewal answered
        past its trust wrote a whole lease from its send), is given back first."""
        self._renew(give_back=True)

    def _renew_in_background(self) -> None:
        """The heartbeat's renewal: a loss it finds is told (``lock_lost``), and the row left
        to the block's end. The block runs on until it learns of the loss (a lead's command
        is being stopped): given back now, the next holder would work beside it."""
        self._renew(give_back=False)

    def _renew(self, *, give_back: bool) -> None:
        # A renewal of the heartbeat's may hang on an unreachable endpoint, holding the lock,
        # for as long as botocore's timeouts allow: wait for it only while the hold can be
        # trusted. Past the deadline the hold is lost, whatever that renewal answers later.
        # In slices: a lock's timeout runs on CLOCK_MONOTONIC, which stops while the host
        # sleeps, the deadline's clock does not. A renew() waiting is counted (under
        # _state_lock): told of a loss the renewal in flight finds, it has it give the row back.
        if give_back:
            with self._state_lock:
                self._renewers_waiting += 1
        try:
            while not self._lock.acquire(timeout=min(self.seconds_left(), LOOK_EVERY)):
                try:
                    self._check_ours()
                except LockLost:
                    # The row is given back by the renewal we waited for (it holds the lock).
                    self._give_back_asked |= give_back
                    raise
        finally:
            if give_back:
                with self._state_lock:
                    self._renewers_waiting -= 1
        try:
            self._check_ours()
            with telemetry.renewing(self) if telemetry.ON else _NOTHING:
                self._renew_once()
            # Trusted from its send: answered past our deadline, it extended nothing we may
            # trust (the stored end is a lease from the send: another may take over now).
            self.raise_if_lost()
        except Exception as exc:
            # Asked by a renew() told of the loss as it waited for us (or waiting still, and
            # told once it looks), whatever our end: a failure (its answer lost) may have
            # been applied, a whole lease from its send.
            with self._state_lock:
                asked = self._give_back_asked or (self._renewers_waiting and self._lost is not None)
            if asked or (give_back and isinstance(exc, LockLost)):
                self._give_back_lost()
            raise
        finally:
            self._lock.release()

    def _give_back_lost(self) -> None:
        """``renew()`` found the hold lost, and tells its caller, who then has nothing left to
        release: the row, ours still unless a write of ours was refused (the rows of several
        still ours, whichever one refused it: renewed just before), is given back now
        (under ``_lock``: no renewal or hand-over of ours meanwhile), conditional on our token
        as a release is, so that nobody waits out its stored end for nobody. Best effort: a
        failure leaves it to its lease, as before. Not a hold waiting for its transaction's
        end, which gives it back (its work is not committed yet), nor one whose release has
        begun (in another thread, waiting for this lock): that release gives it back, says
        it was released (``lock_released``) or raises the loss to the block's end."""
        if self._pending_commit or not self.here:
            return
        if self._row_refused and len(self.resources) == 1:
            return  # not ours: the others of several may be (each released on our token)
        if self._giving_back_mono < math.inf or not self._ended():
            return
        self._given_back_lost = True
        try:
            self._give_back()
        except Exception as exc:
            self._log_unreleased(self.resources, exc)

    async def arenew(self) -> None:
        await run_io(self.renew)

    def _check_ours(self) -> None:
        if not self.here:
            raise LockLost(self.resource, FORKED)
        self.check_deadline()
        if self._released or self._given_in_time():  # released, or being released
            raise LockLost(self.resource, "it was released")
        if self._lost is not None:
            self._raise_lost()

    def _renew_once(self) -> None:
        """Extend the lease to a whole one from now (never past max_hold: others may take
        over CLOCK_SKEW after it, by their clocks), if that extends our trust at all.

        A stored end later than that (written by a clock ahead of ours, or before ours
        stepped back) is confirmed as it is: it is still a whole lease from now."""
        sent_mono = clock.monotonic()
        lease = min(self.lease, self._max_hold_end - sent_mono + self.skew)
        expires = clock.now_ms() + int(lease * 1000)
        trusted = min(sent_mono + lease - self.skew, self._max_hold_end)
        if expires <= self._expires_ms:
            if trusted <= self._deadline:
                return  # nothing to extend (max_hold: the stored lease lasts past it)
            expires = self._expires_ms
        self._renew_to(expires)
        self._expires_ms = expires
        self._deadline = max(self._deadline, trusted)

    def _renew_to(self, expires: int) -> None:
        """Write the lease end ``expires`` to every row of the hold; LockLost if not ours.

        Each row in a write of its own: each is conditional on our token by itself, and all
        or none gains nothing (a row not ours loses the hold either way), while a transaction
        bills two write units a row. The trust comes only once every row has it (the caller
        raises the deadline after this returns)."""
        # An exclusive row's one holder is named in userId (its first renewal moves the index
        # key, once). Not a counting or shared row's: its holders renew in turn, and each
        # would move the key again (2 index write units a renewal); the listings find such
        # rows' holders through the expires shards, never through userId.
        user_id = self.user_id if self.semaphore.mode == Mode.EXCLUSIVE else None
        for resource in self.resources:
            self._renew_row(resource, expires, user_id)

    def _renew_row(self, resource: str, expires: int, user_id: str | None) -> None:
        raise_item = True
        while True:
            action = lock_writes.renew_hold(
                resource, self.token, expires, raise_item=raise_item, user_id=user_id
            )
            try:
                item = lock_rows.update(action, return_new=len(self.resources) == 1)
            except dynamodb.Refused as refused:
                old = refused.lock
                if not raise_item or old is None or self.token not in old.holders:
                    self._lost_by_refusal(TAKEN_OVER, resource)
                # Ours still; another holder's later lease end stands as the item's expiry.
                raise_item = False
                continue
            self._observe(item)
            return

    # -- releasing ---------------------------------------------------------------------------

    def release(self) -> None:
        """Give back this acquisition's hold only. Raises ``LockLost`` if it was not ours
        any more (after cleaning up whatever is still ours).

        Inside ``transaction.atomic`` (unless the semaphore has ``on_commit=False``) the hold
        is given back after the outermost transaction of its database commits, or at once
        when that rolls back; the lease is renewed until then. A hold already known lost
        raises now, while the transaction can still roll back.

        A nested acquire that re-entered this hold ("Nested acquires" in the how-to guides)
        gives back nothing: only the outermost release does (raising LockLost if lost)."""
        if self._released:
            if self._given_back_lost:  # by renew(), as it raised
                self._raise_lost()
            return
        if self._pending_commit:
            # Taken again in its transaction (pending_hold): a block that ends with it lost
            # raises, so that the transaction rolls back, as its first block's end would.
            if self.depth > 1:
                self.depth -= 1
            self.raise_if_lost()
            return
        if self.depth > 1:
            self.depth -= 1
            if self.lost:
                self._raise_lost()
            return
        try:
            sem = self.semaphore
            if sem.on_commit and not self.lost:
                # Pending first: a transaction that can never commit ends it at once. Its
                # transaction is this thread's (release_all leaves it while this thread runs).
                self.pending_in = threading.current_thread()
                self._pending_commit = True
                if commit.after_transaction(
                    sem.using, self._after_transaction, self.resource, owner=self
                ):
                    return
                self._pending_commit = False
            self._release_now()
        except BaseException as exc:
            self._cut_short(exc)
            raise

    def _cut_short(self, exc: BaseException) -> None:
        """``release()`` raised ``exc`` (an interrupt: Ctrl-C, a task's time limit; or an
        error) before the give-back began: its block has ended, and its exit does not run
        again. Left to its lease (given back at exit), renewed and re-entered no more; unless
        it is being given back, was lost, or waits for its transaction's end after all."""
        if isinstance(exc, LockLost) or self._released or self._giving_back_mono < math.inf:
            return
        if self._pending_commit:
            if any(owner is self for owner in commit.pending_owners()):
                return  # its transaction's end gives it back
            self._pending_commit = False
        self.left_to_lease = True
        self._stop_heartbeat()
        _left.add(self)

    async def arelease(self) -> None:
        await announced_after(release_to_end(self.release, on_caller=self.follows_caller))

    def _after_transaction(self, committed: bool) -> None:
        if self.depth > 1 and not self._released:
            # Taken again in the transaction (pending_hold) and not released by its end (an
            # ``acquire()`` kept past it): its holder still works under it and gives it back.
            self.depth -= 1
            self._pending_commit = False
            return
        try:
            self._release_now()
        except LockLost as exc:
            if committed:
                # lock_lost was sent (with pending_commit=True) when the loss was found.
                level, outcome = logging.ERROR, "committed_after_loss"
                message = (
                    "dynasem: the transaction that held %r committed after the hold was lost "
                    "(%s): another holder may have worked on the same data before this "
                    "commit; fence such writes with held.fence"
                )
            else:
                level, outcome = logging.WARNING, "rolled_back_after_loss"
                message = "dynasem: the hold on %r was lost (%s) before its transaction rolled back"
            ex = self._facts(outcome, exc.reason)
            logger.log(level, message, self.resource, exc.reason, extra=ex)
        except Exception as exc:
            if not from_receiver(exc):
                raise  # the give-back's own failure: commit.py logs it
            message = "dynasem: a lock_released receiver raised after the transaction for %r: %r"
            logger.warning(message, self.resource, exc, extra=self._facts("receiver_failed", exc))
        finally:
            self._pending_commit = False

    def _ended(self) -> bool:
        """The hold's end begins (under ``_lock``): released from now, renewed no more; False
        if it had ended already."""
        if self._released:
            return False
        self._released = True
        self._stop_heartbeat()
        _left.discard(self)  # an interrupted release given back after all
        return True

    def _release_now(self) -> None:
        if os.getpid() != self._pid:
            # A child forked inside the block leaves it (sys.exit, a return): the parent is
            # still in it, and gives the hold back itself.
            self._released = True
            return
        # Begun now, though a renewal in flight may keep the lock for a while; not begun if
        # that wait is interrupted (a signal's exception): then the deadline is the loss,
        # the heartbeat stopped and the hold re-entered no more (a ``with`` block's exit does
        # not run again: renewed on, or re-entered by the next acquire here, the hold would
        # be kept for nobody); a release() again still gives it back.
        before = self._giving_back_mono
        self._giving_back_mono = min(before, clock.monotonic())
        try:
            self._lock.acquire()
        except BaseException:
            self._giving_back_mono = before
            self.left_to_lease = True
            self._stop_heartbeat()
            _left.add(self)  # given back at exit (shutdown.py), if not released again first
            raise
        with _owned(self._lock):
            if not self._ended():
                if self._given_back_lost:  # by renew(), as it raised, before we began
                    self._raise_lost()
                return
            given: bool | None = None
            lost_before = False
            try:
                with telemetry.releasing(self) if telemetry.ON else _NOTHING:
                    lost_before = self._lost is not None or self._giving_back_mono >= self._deadline
                    given = self._give_back()
                    self._lost_if_refused(given, lost_before)
            except BaseException:
                if given is None:
                    # Cut short (Ctrl-C, a task's time limit) in the give-back, whose write
                    # may have been sent or not, or before it, as its telemetry span started.
                    # Given back again at exit (shutdown.py), where a refusal of it is no
                    # proof of a loss.
                    self._unanswered = True
                    _left.add(self)
                else:
                    self._answered_despite(given, lost_before)
                raise
            if self._lost is not None:
                self._raise_lost()
        if lock_released.receivers:  # else nobody to tell (Signal.send's own first test)
            send_or_keep(self._announce(lock_released))  # an async caller's: sent by it

    def _lost_if_refused(self, given: bool, lost_before: bool) -> None:
        if self._lost is None and (lost_before or not given):
            # Begun past the deadline, the lease ran out first, whoever holds now.
            self._mark_lost(self._deadline_reason() if lost_before else TAKEN_OVER)

    def _answered_despite(self, given: bool, lost_before: bool) -> None:
        """The give-back was answered (``given``), and an interrupt came after it (a signal's
        exception at the next line, a span processor's ``on_end`` as its span ended): the
        loss still marked and lock_lost sent, or lock_released sent, before the interrupt
        goes on (a receiver's exception logged, not raised in its stead). Either was
        dropped: ``held.lost`` said False, and a receiver's ledger kept the lock held."""
        try:
            self._lost_if_refused(given, lost_before)
            if self._lost is None:
                send_or_keep(self._announce(lock_released))  # an async caller's: sent by it
        except Exception as exc:
            message = "dynasem: a receiver raised for %r as its release was interrupted: %r"
            logger.warning(message, self.resource, exc, extra=self._facts("receiver_failed", exc))

    def become_claim(self, token: str, queue_lease: float) -> None:
        """A unique task's run that enqueued its retry ends: instead of being given back, the
        hold becomes the retry's claim ``token`` for ``queue_lease`` seconds (no process, no
        heartbeat: :mod:`dynasem._background.unique`). ``LockLost`` if it was lost first."""
        with self._lock:
            if not self._ended():
                if self._given_back_lost:  # by renew(), as it raised: as release() says
                    self._raise_lost()
                return
            now_ms = clock.now_ms()
            entry = records.Holder(
                self.user_id, now_ms + int(queue_lease * 1000), self.fence, now_ms
            )
            adoption = claims.adopt_hold(self.resource, self.token, token, entry, as_announced=True)
            failed: list[SemaphoreUnavailable] = []
            try:
                # Sent again while throttled, as any give-back (resend.py): the hold has ended
                # (renewed no more), and a retry waits for it until its lease runs out.
                sent = resend.patiently(
                    functools.partial(lock_rows.update, adoption), math.inf, failed.append
                )
            except dynamodb.Refused as refused:
                holders = refused.lock.holders if refused.lock is not None else {}
                if token in holders:  # applied, its answer lost
                    return
                # Applied, its answer lost, and the retry's run adopted the claim before the
                # re-send came: our fence, under another token (a claim and its adoptions keep
                # the fence of the hold they came from; every other take draws a larger one).
                if any(h.fence == self.fence for t, h in holders.items() if t != self.token):
                    return
                # Still ours, its retry withdrawn (revoked before it ran): given back.
                if self.token in holders and self._give_back():
                    return
                self._mark_lost("another holder took it over before the run ended")
                raise LockLost(self.resource, "it was lost before the run ended") from None
            if not sent:
                raise failed[0]

    def hand_on(self, item: records.LockItem) -> bool:
        """Give back, to the next waiter if any, a hold a hand-over (``item``) made for a waiter
        that had left the queue (:mod:`dynasem._engine.late_handover`): never used, it was held
        for no time of its own, so the queue's average hold stays as it is."""
        self._observe(item)
        self._taken_mono -= (item.hold_ms or 0) / 1000
        self._released = True
        self._giving_back_mono = clock.monotonic()
        return self._give_back()

    def _give_back(self) -> bool:
        """Send the release; True if every resource was ours until now."""
        for _ in range(3):
            handed = self._hand_over()
            if handed is not None:
                return handed
            terms = handover.release_terms(self._row, self.skew) if self._hands_over else {}
            released = self._plain_release(terms)
            if released is not None:
                return released
            # Refused, still ours: waiters came since we last looked. Hand it to them.
        return bool(self._plain_release({}))

    @property
    def _hands_over(self) -> bool:
        """Only an exclusive hold of one resource hands over, and says who may still wait."""
        return self.semaphore.mode == Mode.EXCLUSIVE and len(self.resources) == 1

    def heard_of(
        self, row: records.LockItem, waiter: records.Waiter, *, sent: float | None = None
    ) -> bool:
        """``waiter`` queued behind us (``row``: the row its ticket left): it goes into the
        line we hand over from, in ticket order, or starts one if it is first in line. Our
        release then hands the lock over from this line as from one a push brought, instead
        of being refused for a waiter it did not know of, or reading the queue once the line
        ran out (a round trip, and a refused write's unit). ``sent``: when the word was given
        (monotonic, by our reckoning; None: now, by a waiter of this process); a line is
        trusted for as long as a pushed one from its first read, and a waiter that left
        meanwhile gives back a hand-over that reaches it (``push.depart``). The first in line
        of our own process is forgotten at once when it stops waiting
        (:meth:`_forget_heir_gone`). Once we have ended, the word goes to our heir
        (``push.after_release``). False if we do not hand over: the word is of no use."""
        if not self._hands_over:
            return False
        if self._released:  # the word is for our heir, if we hand over
            when = clock.monotonic() if sent is None else sent
            push.after_release(self.token, self.resource, row, waiter, when)
            return True
        with self._row_lock:
            self._join_line(row, waiter, sent)
        return True

    def _join_line(self, row: records.LockItem, waiter: records.Waiter, sent: float | None) -> None:
        known = self._row
        if known is None or known.queue_id != row.queue_id or known.queue_out < row.queue_out:
            known = row  # the waiter's row is the newer (known.line: none)
        if waiter.ticket <= known.queue_out or any(w.ticket == waiter.ticket for w in known.line):
            return  # its turn went by, or known
        # Into the line we know, in ticket order, trusted from when the line was read or its
        # oldest word was given: a word held up on its way (a datagram, a word passed on)
        # makes the line no younger than itself. A word may come before the word of a waiter
        # ahead, or behind waiters we do not know of: the hand-over checks the line has
        # nobody missing before its heir, and else reads the queue, where the line stands in
        # for entries its waiters have not written yet (queue.ENTRY_DEFER).
        given = clock.monotonic() if sent is None else sent
        read = min(known.line_read, given) if known.line else given
        if not known.line and waiter.ticket == known.queue_out + 1:
            self._told = waiter.token if sent is None else None
        line = tuple(sorted((*known.line, waiter), key=lambda w: w.ticket))
        queue_in = max(known.queue_in, waiter.ticket)
        self._row = dataclasses.replace(known, line=line, line_read=read, queue_in=queue_in)

    def _forget_heir_gone(self) -> None:
        """The waiter of this process we were told of has stopped waiting (it gave up, or was
        interrupted): the line it told us of is no more (the queue is read instead)."""
        told = self._told
        if told is not None and not push.listening(told):
            self._told = None
            with self._row_lock:
                row = self._row
                if row is not None and any(w.token == told for w in row.line):
                    self._row = dataclasses.replace(row, line=())

    def _observe(self, item: records.LockItem | None) -> None:
        with self._row_lock:
            self._observe_row(item)

    def _observe_row(self, item: records.LockItem | None) -> None:
        if item is not None:
            known = self._row
            if known is not None and known.line and not item.line:
                # A newer row of the queue we heard of: the words still waiting stay ours.
                same = known.queue_id == item.queue_id
                line = tuple(w for w in known.line if same and w.ticket > item.queue_out)
                item = dataclasses.replace(item, line=line, line_read=known.line_read)
            self._row = item
            if item.hold_ms is not None:
                self._hold_avg = item.hold_ms

    def _hold_ms(self) -> int:
        mine = int((clock.monotonic() - self._taken_mono) * 1000)
        return mine if self._hold_avg is None else (3 * self._hold_avg + mine) // 4

    # -- releasing: the hand-over ------------------------------------------------------------

    def _hand_over(self) -> bool | None:
        """Release straight to the first waiter (or the readers at the head of the line), in
        one write. None: no heir, or they left (then a plain release follows)."""
        fence = self.fence
        for _ in range(3):
            if self._lost is not None or not self._hands_over:
                return None
            self._forget_heir_gone()
            try:
                heirs, queue_out, self._row, line = handover.heirs_of(self._row, self.token)
            except SemaphoreUnavailable:
                # The queue could not be read (throttled still after the retries): a plain
                # release follows, and the first waiter takes the lock at its next look.
                return None
            if not heirs:
                return None
            # Every heir a fence of its own, above every earlier one (ours, the stored one).
            fence = max(clock.new_fence(self.skew), fence + 1)
            self._handing = (heirs, fence, line)
            try:
                item = self._send_hand_over(heirs, queue_out, fence)
            except dynamodb.Refused as refused:
                old = refused.lock
                if old is None or self.token not in old.holders:
                    return self._released_by(old, refused.retried or self._unanswered, True)
                # An heir left (or the stored fence was ahead): again with the line as it is.
                self._observe(old)
                fence = max(fence, old.fence)
                continue
            except SemaphoreUnavailable:
                # Maybe applied, its answer lost: the heir may even have held and given back
                # since, so a refusal of the plain release that follows is no proof of a loss.
                self._unanswered = True
                return None
            if item is not None:
                handover.push_heirs(self.resource, heirs, item, line)
            if len(heirs) == 1 and not heirs[0][1].shared:
                push.handed(self.resource, self.token, heirs[0][0], heirs[0][1].address)
            return True
        return None

    def _send_hand_over(
        self, heirs: handover.Heirs, queue_out: int, fence: int
    ) -> records.LockItem | None:
        """The hand-over write: ``heirs`` hold from now, with fences from ``fence`` up, if the
        queue is still at ``queue_out``; the row it wrote."""
        entries = handover.heir_entries(heirs, fence, clock.now_ms(), int(self.lease * 1000))
        mode = Mode.SHARED if heirs[0][1].shared else None
        terms: dict[str, Any] = {"hold_ms": self._hold_ms(), "mode": mode, "queue_out": queue_out}
        started_ns = time.time_ns()
        write = lock_writes.hand_over(self.resource, self.token, entries, **terms)
        item = lock_rows.update(write, return_new=True)
        if telemetry.ON:
            self._handover = (started_ns, time.time_ns(), len(heirs), fence)
        return item

    # -- releasing: the plain release --------------------------------------------------------

    def _plain_release(self, terms: dict[str, Any]) -> bool | None:
        """A release to nobody in particular; True if every resource was ours until now.
        None: refused by ``terms`` (waiters came: one resource only), the hold still ours.

        Each row in a write of its own: none needs the others', each is conditional on our
        token by itself, and a transaction would bill two write units a row (and be throttled
        whole by one hot row). Each is sent again after a pause while it fails for a passing
        cause; given up, the work is done and the lease will lapse by itself: never fail the
        caller for a release DynamoDB could not take."""
        pending = list(self.resources)
        hold_ms = self._hold_ms() if len(pending) == 1 else None
        started = clock.monotonic()
        ok = True
        failures = 0
        while True:
            left: list[str] = []
            why: object = None
            passing = True
            for resource in pending:
                try:
                    self._send_release(resource, terms, hold_ms)
                except dynamodb.Refused as refused:
                    old = refused.lock
                    if terms and old is not None and self.token in old.holders:
                        self._observe(old)
                        return None
                    ok = self._released_by(old, refused.retried or self._unanswered, True) and ok
                except SemaphoreUnavailable as exc:
                    self._unanswered |= exc.ambiguous
                    why, passing = exc, passing and resend.passing(exc)
                    left.append(resource)
            pending = left
            if not pending:
                return ok
            failures += 1
            if not self._paused(passing, failures, started, pending, why):
                return ok

    def _item_given_back(self, resource: str, send: Callable[[], object]) -> bool:
        """``send`` the release of one of our items (a reader's, a permit's), sent again
        after a pause while it fails for a passing cause, as a row's release is (above).
        False: given up (said so). Raises Refused, ``retried`` set if an attempt before may
        have been applied."""
        gave_up = functools.partial(self._log_unreleased, resource)
        return resend.patiently(send, self._deadline, gave_up)

    def _send_release(self, resource: str, terms: dict[str, Any], hold_ms: int | None) -> None:
        # A released row may be reaped once its expMs is CLOCK_SKEW old: never before every
        # in-tolerance clock reads past our fence's time, or a fresh fence made after the
        # reap could be smaller than ours.
        now = max(clock.now_ms(), self.fences[resource] // 1000)
        sole = self.semaphore.mode == Mode.EXCLUSIVE
        terms = dict(terms, sole=sole, hold_ms=hold_ms, lease_end_ms=self._expires_ms)
        action = lock_writes.give_back(resource, self.token, now, **terms)
        # Only a hold long enough for waiters to have come unseen asks for the item back (its
        # decoding costs the uncontended path ~10 % of its CPU): if waiters are queued (ones
        # we did not know of when we could have handed over), the first one is pushed the
        # item, so it takes the lock now instead of at its next paced read.
        waiting = self._row is not None and self._row.waiting
        look = waiting or clock.monotonic() - self._taken_mono > WAKE_AFTER
        handover.push_if_free(resource, lock_rows.update(action, return_new=look))

    def _paused(
        self, passing: bool, failures: int, started: float, pending: str | list[str], why: object
    ) -> bool:
        """Paused before sending a release again that failed for a passing cause (throttled,
        or another request's transaction on a row); False: given up, and said so (another
        failure, or RELEASE_PATIENCE or the hold's deadline reached by then: resend.paused)."""
        if resend.paused(passing, failures, started, self._deadline):
            return True
        self._log_unreleased(pending, why)
        return False

    def _log_unreleased(self, resources: str | list[str], why: object) -> None:
        self.unreleased = True
        ex = facts(resources, token=self.token, outcome="release_failed", reason=why)
        logger.warning("dynasem: could not release %r (%s); it expires", resources, why, extra=ex)

    def _released_by(self, old: records.LockItem | None, retried: bool, wake: bool = False) -> bool:
        """Was the hold ours until the release began, though a release write was refused
        (just now) with our token gone? (A release begun after the deadline is lost all the
        same: ``_release_now``.) ``wake``: if a write of this release did it, whoever comes
        next is pushed the row as the refusal shows it (:meth:`_wake_next`)."""
        old = old or records.LockItem()
        if self.token in old.holders or old.broken_token == self.token:
            return False
        if old.last_token == self.token:
            if wake:
                self._wake_next(old)
            return True
        return self._gone_after_work(retried)

    def _wake_next(self, old: records.LockItem) -> None:
        """A release write of ours was applied, its answer lost, and a write sent again was
        refused with ``old``, the row as ours left it: push it as its answer would have been
        (a hand-over's heirs, still holding under the fences it gave them; else the first
        waiter of a lock left free), or the lock stands idle until the next one's paced look."""
        resource = old.resource or self.resource
        handing = self._handing
        if handing is not None:
            heirs, fence, line = handing
            mine = [old.holders.get(token) for token, _ in heirs]
            if all(h is not None and h.fence == fence + i for i, h in enumerate(mine)):
                handover.push_heirs(resource, heirs, old, line)
                if len(heirs) == 1 and not heirs[0][1].shared:
                    push.handed(resource, self.token, heirs[0][0], heirs[0][1].address)
                return
        handover.push_if_free(resource, old)

    def _gone_after_work(self, retried: bool) -> bool:
        """A release write, refused just now, found the hold gone, no operator's break seen:
        was it ours until the release began? If botocore sent the write again (or an earlier
        write of this release got no answer), it went by our own release, which may have
        been applied, or after our lease ran out. Else after our lease ran out, if the
        refusal came after our deadline: a write may arrive that late (one sent into a
        partition, delivered by TCP when it heals; the three-host soak: answered 3-7 s after
        it left), so only a refusal within our trust proves a takeover (clocks within
        CLOCK_SKEW). The lease's end was the release then, as for a release DynamoDB could
        not take (_paused)."""
        late = clock.monotonic() >= self._deadline
        return self._given_in_time() and (retried or late)

    # -- heartbeat ---------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._heartbeat = Heartbeat(self, renew=self._renew_in_background)
        self._heartbeat.start()

    def _stop_heartbeat(self) -> None:
        hb, self._heartbeat = self._heartbeat, None
        if hb is not None:
            hb.stop()


# Holds whose release an interrupt cut short, before or during its write, in a process that
# goes on: left to their lease, but given back at a normal exit (shutdown.release_all).
_left: set[Held] = set()


def left_holds() -> list[Held]:
    """The holds of this process whose release an interrupt cut short (their blocks ended)."""
    return [held for held in list(_left) if held.here]


def forget_left() -> None:
    """Forget the holds whose release was cut short (a test's, on its own table)."""
    _left.clear()


def give_back_left(held: Held) -> bool:
    """Best effort (at exit): give back ``held``, whose release an interrupt cut short, once
    more; True if it was given back (or had been: the write cut short had landed)."""
    _left.discard(held)
    try:
        with held._lock:  # a renewal in flight: until it is answered
            held._released = True
            held._stop_heartbeat()
            given = held._give_back()
    except Exception as exc:
        message = "dynasem: could not give back %r at exit: %s"
        logger.warning(message, held.resource, exc, extra=held._facts("give_back_failed", exc))
        return False
    if given:
        try:
            held._send(lock_released)
        except Exception as exc:  # a receiver's: the holds after this one are still to go
            message = "dynasem: a lock_released receiver raised at exit for %r: %r"
            logger.warning(message, held.resource, exc, extra=held._facts("receiver_failed", exc))
    return given


def start_renewing(held: Held) -> None:
    """Renew ``held``, a hold taken by other means (a unique task's adopted claim), from now
    on: the heartbeat keeps it until it is given back. Nothing is announced."""
    held._start_heartbeat()


def confirm(held: Held) -> None:
    """Renew ``held``, a hold taken by other means (a unique task's adopted claim), with a
    write of our own now, its deadline past or near (the answer that took it came late: a
    pause, a slow network): trusted a lease from this write's send if it is still ours; else
    ``LockLost`` (the lease may have run out, and another holder taken over, meanwhile)."""
    with held._lock:
        held._renew_once()


def when_lost(held: Held, told: Callable[[], None]) -> None:
    """Call ``told()`` once ``held`` is found lost, before ``lock_lost`` is sent (Django's
    ``send`` stops at the first receiver that raises: a project's, connected at start-up,
    would keep a receiver of dynasem's own from hearing it). ``told`` may come from the
    heartbeat's thread."""
    held._lost_watchers.append(told)


def exit_cut_short(held: Held, depth: int, exc: BaseException) -> None:
    """A block's exit raised ``exc`` (an interrupt: a signal's exception) with ``held``'s
    release not begun (at ``leave``'s or ``release``'s first line, ahead of its guard):
    ``depth`` is what the hold counted as the block was left. The block's exit does not run
    again: a nested block gives back its depth (else the outer block's exit would give back
    nothing, for good); an outermost one leaves the hold as an interrupted release does
    (:meth:`Held._cut_short`: left to its lease, renewed and re-entered no more). A
    ``fence_db`` block's transaction that its end never closed rolls back."""
    held = getattr(held, "outer", held)  # a nested acquire's view: the hold itself
    if not (isinstance(exc, LockLost) or held._released or held.depth != depth):
        # Its release neither ran nor began (it would have seen to it).
        if depth > 1:
            held.depth -= 1
        else:
            held._cut_short(exc)
    fencing.cut_short(held, exc)  # a fence_db block's transaction its end() never closed


def stop_renewing(held: Held) -> None:
    """Renew ``held`` no more (what its process dying would do): its lease runs out as it
    stands; nothing is released or written. ``dynasem.testing.abandon``."""
    held._stop_heartbeat()


def abandon(held: Held) -> None:
    """Leave ``held`` as its process dying would (``dynasem.testing.abandon``): renewed no
    more, re-entered by no block of the thread that took it (a dead process's lock is busy
    for everyone), nothing released or written; ``release()`` still gives it back."""
    held = getattr(held, "outer", held)  # a nested acquire's view: the hold itself
    held._stop_heartbeat()
    held.left_to_lease = True


def acquired(
    semaphore: LockSpec, *, item: records.LockItem | None, cls: type[Held] = Held, **terms: Any
) -> Held:
    """A hold just taken (``terms``: :class:`Held`'s): learn the queue from ``item`` (the
    resource as last seen, one resource only), let the next reader join a shared hold,
    start renewing it. The acquire loop then announces it (:func:`announced`)."""
    held = cls(semaphore, **terms)
    try:
        undelivered(held)
        held._observe(item)
        if item is not None and semaphore.mode == Mode.SHARED:
            # The first waiter in line a reader too: it can join us now (it then pushes the
            # next one when it has joined).
            _let_next_reader_in(held.resource, item)
        # Renewed from now: a receiver of lock_acquired runs before the caller has the hold,
        # and one that takes longer than the hold's trusted window would hand it over lapsed.
        held._start_heartbeat()
        if held._hands_over:
            push.holding(held)
    except BaseException:
        # An interrupt came before the caller got the hold: nobody will use it, so give it
        # back now rather than leave it held for a whole lease.
        give_back_unused(held)
        raise
    return held


def announced(held: Held) -> Announce | None:
    """``lock_acquired`` for ``held``, a hold just taken, as the acquire loop's last step:
    sent before its caller has the hold (as Django's own async code sends a signal, for an
    async acquire). A receiver that raises, or an interrupt meanwhile, gives the hold back
    (its caller never has it) and ends the acquire with that exception. None when no
    receiver is connected (Signal.send's own first test): no step (an interrupt after the
    loop's end is the acquire's ``delivering``'s, which gives the hold back as well)."""
    if not lock_acquired.receivers:
        return None
    undo = functools.partial(give_back_unused, held)
    return held._announce(lock_acquired, undo, fences=held.fences)


def _let_next_reader_in(resource: str, item: records.LockItem) -> None:
    """Push ``item`` to the first waiter in its line if that is a reader, without delaying
    the hold just taken: its trust was checked already and runs on, and a read of the line
    can take botocore's retries (the soak with two threads a worker once had a reader's block
    begin past its lease after such a read), so a line not read yet is read on a thread of
    its own."""
    if not item.waiting:
        return
    if item.entries is not None:  # nothing to read: a datagram at most
        handover.push_first(resource, item, readers_only=True)
        return
    try:
        threading.Thread(
            target=_push_first_quietly, args=(resource, item), name="dynasem-let-in", daemon=True
        ).start()
    except RuntimeError as exc:  # "can't start new thread" (a pids limit): a push is a hint
        logger.debug(
            "dynasem: could not let the next reader in on %r: %s",
            resource,
            exc,
            extra=facts(resource, outcome="let_in_failed", reason=exc),
        )


def _push_first_quietly(resource: str, item: records.LockItem) -> None:
    try:
        handover.push_first(resource, item, readers_only=True)
    except Exception as exc:  # the reader reads the row itself at its next look
        logger.debug(
            "dynasem: could not let the next reader in on %r: %s",
            resource,
            exc,
            extra=facts(resource, outcome="let_in_failed", reason=exc),
        )


def queued_behind(row: records.LockItem, waiter: records.Waiter) -> bool:
    """A waiter of this process joined the queue of ``row`` (as its ticket left it) behind
    one exclusive holder: that holder is told (:meth:`Held.heard_of`) if it is a hold of
    this process, or one this process handed the lock to (``push.tell_holder``). A reader
    waits to be let in with the readers after it."""
    if waiter.shared or len(row.holders) != 1:
        return False
    if not push.listening(waiter.token):
        return False  # it could not tell the holder, or give back a hand-over, when it left
    return push.tell_holder(row.resource, next(iter(row.holders)), row, waiter)


class _Box(list["Held"]):
    """The holds an outermost acquire has made (or re-entered) that its caller does not have
    yet, who makes it (``owner``: the asyncio task, else the thread), how deep in receivers
    of dynasem's signals (``level``: :func:`steps.receiving`), and the box that was open in
    this context when it was made (``outer``)."""

    __slots__ = ("closed", "level", "outer", "owner")

    def __init__(self, outer: _Box | None) -> None:
        super().__init__()
        self.owner = _maker()
        self.level = receiving()
        self.outer = outer
        self.closed = False  # its acquire is over: skipped by whoever still links to it


def running_task() -> asyncio.Task[Any] | None:
    """The task running here, None outside one: asyncio's own look at the running loop (in
    its __all__, for libraries) returns None where current_task() would raise, and a raise
    per call cost the sync path several a cycle."""
    return None if asyncio._get_running_loop() is None else asyncio.current_task()


def _maker() -> object:
    task = running_task()
    return task if task is not None else threading.current_thread()


def _boxes() -> Iterator[_Box]:
    """The boxes open in this context, the innermost first. The closed ones passed on the way
    are unlinked: in a context that tasks share, a box opened while another task's was open
    links to it, and that one, closed since but not the innermost then, stayed linked. Each
    acquire's box linked to every earlier one for the life of the tasks, closed ones kept
    their tasks, and every acquire walked them all."""
    box = _open_from(_undelivered.get())
    while box is not None:
        yield box
        box.outer = _open_from(box.outer)
        box = box.outer


def _open_from(box: _Box | None) -> _Box | None:
    """``box``, or the first box open outside it."""
    while box is not None and box.closed:
        box = box.outer
    return box


def _own_box() -> _Box | None:
    """The innermost box this task or thread made. A context copied into another task or
    thread has the boxes of the acquires under way where it was copied; one shared by
    several tasks (Django's ``Signal.asend`` runs async receivers as tasks of one copied
    context) has each one's: a hold goes into its own maker's box, never another's."""
    me = _maker()
    return next((box for box in _boxes() if box.owner is me), None)


def _guarded() -> bool:
    """Whether an acquire under way in this task or thread guards what is taken now: a
    block's entry around its acquire. A hold taken in another task or thread (a task a
    lock_acquired receiver starts, a receiver Django runs in a task of its own or through
    sync_to_async) is not that acquire's: its failure must not give it back while the other
    task or thread holds it. Nor is one that a receiver of its signal (``lock_acquired``,
    run in its thread) takes: its hold is the receiver's (a block the receiver entered and
    left, re-entering a lock an outer block holds, gave its level back; counted again, the
    outer block's hold was released)."""
    box = _own_box()
    return box is not None and box.level == receiving()


def _open_box() -> _Box:
    box = _Box(_open_from(_undelivered.get()))
    _undelivered.set(box)
    return box


def _close_box(box: _Box) -> None:
    """``box``'s acquire is over. Not reset to what was there before it by a token: in a
    context that tasks share, another's box may have been opened over it since (reset, it
    went out with ours, and that acquire's holds went into no box)."""
    box.closed = True
    box.owner = None  # a box still linked keeps no task (nor thread) that ended
    if _undelivered.get() is box:
        _undelivered.set(_open_from(box.outer))


# The boxes of the acquires under way in this context, the innermost one (:func:`delivering`).
_undelivered: ContextVar[_Box | None] = ContextVar("dynasem_undelivered", default=None)


def undelivered(held: Held) -> None:
    """``held`` was made, or re-entered, for the acquire under way here: given back if an
    interrupt comes before its caller has it (:func:`delivering`)."""
    box = _own_box()
    if box is not None:
        box.append(held)


def delivering(take: Callable[[], _T]) -> _T:
    """``take()`` (an acquire, or a ``with`` block's entry), the holds it makes given back if
    an interrupt (Ctrl-C, a signal handler's exception such as a task's time limit) comes
    anywhere before it returns: between the acquire loop's end and the block's entry, the
    hold is nobody's, and its heartbeat would renew it as long as the process lives. Inside
    another one (a block's entry around its acquire), that one guards it. Only the return
    itself, as in any ``with`` statement of CPython's, is left."""
    if _guarded():
        return take()
    box = _open_box()
    try:
        done = take()
        box.clear()
        return done
    except BaseException:
        for held in list(box):
            give_back_unused(held)
        raise
    finally:
        _close_box(box)


async def adelivering(take: Callable[[], Awaitable[_T]]) -> _T:
    """:func:`delivering` for async code (a cancelled task too), the holds given back in
    dynasem's executor."""
    if _guarded():
        return await take()
    box = _open_box()
    try:
        done = await take()
        box.clear()
        return done
    except BaseException as exc:
        if closing(exc):  # nothing can be awaited any more (steps.closing)
            for held in list(box):
                give_back_unused(held)
            raise
        again = await _agive_back_unused(box)
        if again is not None:
            raise again from exc  # a cancel that came meanwhile goes on, as it did
        raise
    finally:
        # Closed by the garbage collector, in another context than its task's: marked
        # closed only (that context's box is another).
        _close_box(box)


async def _agive_back_unused(box: list[Held]) -> asyncio.CancelledError | None:
    """Every hold in ``box`` given back in dynasem's executor, and the cancel that came
    meanwhile, if any: each give-back runs to its end (``run_io_to_end``), and a second cancel
    in one of them stopped the loop, the later holds renewed by their heartbeat for nobody as
    long as the process lived."""
    again: asyncio.CancelledError | None = None
    for held in list(box):
        try:
            given = run_io_to_end(give_back_unused, held)
            await announced_after(given, functools.partial(_receiver_failed, held))
        except asyncio.CancelledError as cancel:
            again = again or cancel
    return again


def _receiver_failed(held: Held, exc: Exception) -> None:
    message = "dynasem: a lock_released receiver raised for unused hold on %r: %r"
    logger.warning(message, held.resource, exc, extra=held._facts("receiver_failed", exc))


def give_back_unused(held: Held) -> None:
    """Best effort: release a hold its caller never got to use (no waiting for a commit)."""
    held = getattr(held, "outer", held)  # a nested acquire's view: the hold itself
    for box in _boxes():
        if any(h is held for h in box):
            box.remove(held)  # given back once
            break
    if held.depth > 1:
        held.depth -= 1  # a nested acquire's: the outer one still uses it
        return
    held._stop_heartbeat()
    try:
        held._release_now()
    except Exception as exc:
        message = "dynasem: could not give back unused hold on %r: %s"
        logger.warning(message, held.resource, exc, extra=held._facts("give_back_failed", exc))
