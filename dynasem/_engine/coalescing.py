"""Coalesced re-runs (``semaphore(..., coalesce=True)``): at most one run going and one next.

A purge-and-rebuild asked for N times while one runs needs neither N runs in turn nor N-1
refusals, but one more run that starts after the last request arrived. So a busy caller:

* registers as *the next run* with one conditional write of the resource's ``next`` item
  (:mod:`dynasem._storage.next_runs`), then waits for the hold (``wait``) and runs; or
* finding a next run registered that has not started yet, returns at once with
  :class:`~dynasem.exceptions.Coalesced` (a view answers 202 Accepted): that run starts after
  this call arrived, so it covers this call's work.

"Has not started" is read from fences, in the write's own condition: a registration records
the resource's fence as read after its caller arrived (``af``); every hold taken later has a
larger fence. A caller reads the fence afresh (one consistent read) and registers on the
condition that no registration's lease is running with ``af`` at least that fence. If the
registered run took the lock since (or anyone did), the fence read is larger and the caller
replaces it as the next; if not, the registered run is still to start, after this caller's
read. A stale read only errs towards one run more, never one less.

The registration has a lease, renewed by the heartbeat while the next run waits: a next
runner that dies is replaced by the first busy caller after its lease (less CLOCK_SKEW) has
passed. One that gives up (its ``wait`` ran out) or fails withdraws it. Exclusive semaphores
of one resource only: "running" must mean one run.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import _clock as clock
from .._observability import telemetry
from .._observability.logs import facts
from .._storage import lock_rows, next_runs
from .._storage.records import Mode
from ..exceptions import Coalesced, LockLost, SemaphoreBusy, SemaphoreUnavailable
from . import heartbeat, resend
from .arguments import resolve_timing, user_id_of
from .steps import from_receiver, run_io_taking, run_io_to_end

logger = logging.getLogger("dynasem")
_T = TypeVar("_T")

__all__ = ["acquire", "aacquire", "check_coalescing", "Registration"]


def check_coalescing(mode: Mode, resources: Any, wait: float | None) -> None:
    """A ValueError unless semaphores like this can coalesce (at construction, and at each
    acquire before its first request: see :func:`checked_wait`)."""
    if mode != Mode.EXCLUSIVE:
        kind = mode.name.lower()  # not the stored letter: "not a s one"
        raise ValueError(
            f"coalesce=True needs an exclusive semaphore (limit=1, shared=False), not a {kind} "
            "one: a next run comes after the one run going"
        )
    if isinstance(resources, list | tuple) and len(resources) > 1:
        raise ValueError(
            f"coalesce=True takes one resource, not {len(resources)}: a next run is registered "
            "per resource"
        )
    if wait == 0:
        raise ValueError(
            "coalesce=True needs a wait above 0 (wait=0, or DYNASEM['WAIT'] = 0 with wait=None):"
            " the next run waits for the one going; e.g. wait=math.inf"
        )


def checked_wait(sem: Any) -> float:
    """The wait of this acquisition of ``sem``; a ValueError before any request is sent if it
    is 0. ``wait=None`` reads the WAIT setting here, at every acquire, not at construction: a
    decorator is made at import, maybe before the settings are final. Refused whether the
    lock is free or busy, so the mistake shows on the first call, not on the first busy one."""
    _, wait, _ = resolve_timing(sem.lease, sem.wait)
    check_coalescing(sem.mode, sem.resources, wait)
    return wait


class Registration:
    """Our registration as the next run, while we wait: its lease renewed by the heartbeat
    (which reads ``resource``, ``lease``, ``skew``, ``seconds_left``, ``renew`` and
    ``check_deadline``, as of a hold)."""

    def __init__(
        self, resource: str, token: str, lease: float, skew: float, sent: float, name: str | None
    ):
        # name: the lock's name in telemetry (renewals run on the heartbeat thread)
        self.resource, self.token, self.name = resource, token, name
        self.lease, self.skew = lease, skew
        self._deadline = sent + lease - skew
        self._replaced = False  # a renewal was refused: the item is another's for good
        self._heartbeat: heartbeat.Heartbeat | None = None  # renewed once started

    def start(self) -> None:
        """Renewed by the heartbeat from now on (once the caller's guard has it)."""
        self._heartbeat = heartbeat.Heartbeat(self)  # first: stop() finds it from here on
        self._heartbeat.start()

    def seconds_left(self) -> float:
        return max(0.0, self._deadline - clock.monotonic())

    def check_deadline(self) -> None:
        """Nothing to declare: a registration that ran out is replaced, and we run anyway."""

    def renew(self) -> None:
        sent = clock.monotonic()
        until_ms = clock.now_ms() + int(self.lease * 1000)
        with telemetry.naming(self.name):
            renewed = next_runs.renew_next(self.resource, self.token, until_ms)
        if not renewed:
            # Replaced: the fence moved on (someone took the lock meanwhile) or our lease ran
            # out. We still run when our turn comes; the heartbeat stops here.
            self._replaced = True
            raise LockLost(self.resource, "replaced as the next run")
        self._deadline = sent + self.lease - self.skew

    def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def withdraw(self) -> None:
        self.stop()
        if self._replaced:
            # A renewal was refused: the item is another caller's (tokens never come back),
            # so a delete conditional on ours could only be refused: not sent (1 WCU).
            return
        # Sent again while it fails for a passing cause (throttled: the row's partition is
        # the busy lock's), as a give-back is: left, it would answer every busy caller
        # Coalesced for the rest of its lease, for a run that never comes.
        send = functools.partial(next_runs.withdraw_next, self.resource, self.token)
        try:
            with telemetry.naming(self.name):
                resend.patiently(send, gave_up=self._not_withdrawn)
        except Exception as exc:  # its lease ends it anyway
            self._not_withdrawn(exc)

    def _not_withdrawn(self, why: Exception) -> None:
        ex = facts(self.resource, token=self.token, outcome="withdraw_failed", reason=why)
        logger.warning("dynasem: could not withdraw the next run of %r", self.resource, extra=ex)


def register(
    sem: Any, busy: SemaphoreBusy, made: list[Registration] | None = None
) -> Registration | None:
    """Register as ``sem``'s next run after ``busy``, or raise :class:`Coalesced`; None when
    the lock row is gone (reaped since it was busy), or its read or the registration failed
    for a transient cause (withdrawn if it may have been applied): we wait as a plain
    waiter, unregistered.

    Not registered with a fence from our clock instead: above every fence handed out
    before, it is also above those a clock behind ours (within CLOCK_SKEW) hands out for a
    while after, our own run's among them if it is handed over to us from such a host: a
    caller arriving while we run would read a fence at most ours and be answered Coalesced
    by a run that had already begun. Unregistered, nobody is coalesced on our account: at
    worst one run more, never one less."""
    lease, _, skew = resolve_timing(sem.lease, sem.wait)
    resource = sem.resources[0]
    try:
        row = lock_rows.get(resource)  # consistent: the fence as it is now that we have arrived
    except SemaphoreUnavailable as failure:
        if failure.transient:
            return None  # throttled, or unanswered: we wait unregistered, as below
        raise
    if row is None:
        return None
    token = uuid.uuid4().hex
    sent, now = clock.monotonic(), clock.now_ms()
    after_fence = row.fence
    times = {"until_ms": now + int(lease * 1000), "stale_ms": now - int(skew * 1000)}
    user_id, holder = user_id_of(sem.user), busy.holder_user_id
    name = telemetry.lock_name(sem) if telemetry.ON else None
    registration = None
    try:
        other = next_runs.register_next(
            resource, token=token, user_id=user_id, after_fence=after_fence, **times
        )
        if other is None:
            # In the caller's guard before its heartbeat starts: an interrupt from here on
            # withdraws it, never leaves it renewed for nobody.
            registration = Registration(resource, token, lease, skew, sent, name)
            if made is not None:
                made.append(registration)
    except BaseException as failure:
        if made is not None and registration in made:
            made.remove(registration)  # withdrawn here, not twice
        # Maybe applied, its answer lost (every attempt unanswered, or an interrupt): a
        # registration left live for its lease, with nobody to run it, would answer every
        # busy caller meanwhile Coalesced, and none would run after them.
        if not isinstance(failure, SemaphoreUnavailable) or failure.ambiguous:
            withdraw = functools.partial(next_runs.withdraw_next, resource, token)
            resend.undone(withdraw, resource, token)
        if isinstance(failure, SemaphoreUnavailable) and failure.transient:
            return None  # throttled, or unanswered: we wait unregistered (one run more)
        raise
    if registration is None:
        said = "dynasem: %r is busy and its next run is registered: coalesced"
        logger.info(said, resource, extra=facts(resource, outcome="coalesced", holder=holder))
        raise Coalesced(resource, busy.retry_after, holder, other)
    registration.start()
    ex = facts(resource, token=token, outcome="registered", holder=holder)
    logger.info("dynasem: %r is busy: registered as its next run", resource, extra=ex)
    return registration


def acquire(sem: Any, attempt: Callable[[float, bool], _T]) -> _T:
    """``sem``'s hold: at once if free, else as the next run; :class:`Coalesced` if there is
    one. ``attempt(wait, first)`` acquires, waiting up to ``wait`` seconds; only the
    ``first`` sends ``lock_busy`` if it gives up (one per call: the early one, which says
    the call may still run as the next; the later give-up raises without it)."""
    wait = checked_wait(sem)
    made: list[Registration] = []  # registered: withdrawn if anything stops us from here
    try:
        try:
            return attempt(0, True)
        except SemaphoreBusy as busy:
            if isinstance(busy, Coalesced) or from_receiver(busy):
                raise  # a receiver's (lock_acquired, lock_busy): not our lock's answer
            registration = register(sem, busy, made)
        if registration is None:
            return attempt(wait, False)
        held = attempt(wait, False)
        # Taken: its fence marks it as started; nothing to delete. Inside the guard: an
        # interrupt as the turn came (the hold given back by the block's entry guard) must
        # not leave the registration renewed by its heartbeat for a run that never ran.
        registration.stop()
    except BaseException:
        for registered in made:  # an interrupt as it registered too (its heartbeat runs)
            registered.withdraw()
        raise
    return held


async def aacquire(sem: Any, attempt: Callable[[float, bool], Awaitable[_T]]) -> _T:
    """:func:`acquire` for async code: the registration's requests in dynasem's executor."""
    wait = checked_wait(sem)
    try:
        return await attempt(0, True)
    except SemaphoreBusy as busy:
        if isinstance(busy, Coalesced) or from_receiver(busy):
            raise  # a receiver's (lock_acquired, lock_busy): not our lock's answer
        # Cancelled meanwhile (a client gone, the loop ending), the registration made in its
        # thread must still be withdrawn, not left renewed with nobody to run.
        registration = await run_io_taking(functools.partial(register, sem, busy), _withdrawn)
    if registration is None:
        return await attempt(wait, False)
    try:
        held = await attempt(wait, False)
    except BaseException:
        registration.stop()  # at once, whatever happens to the request below
        await run_io_to_end(registration.withdraw)
        raise
    registration.stop()
    return held


def _withdrawn(made: Registration | None) -> None:
    """A registration cut off by a cancel, withdrawn (None: the row was gone, nothing was
    registered)."""
    if made is not None:
        made.withdraw()  # its heartbeat stopped first
