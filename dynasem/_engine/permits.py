"""Counting semaphores of more than ``INLINE_MAX`` permits: holders in permit items of their
own (:mod:`dynasem._storage.permit_items`), so that a take, a renewal and a release each write one
small item whatever the number of holders, and ``limit`` has no ceiling but the table's.

A take writes the row (a fresh fence and a slot: a hint popped, or a slot never used yet;
the queue's terms as for any take, so nobody cuts in line), then the slot's permit. A
release frees the permit, then hints its slot in the row and, if waiters are queued, pushes
the first one, which takes the slot itself (no hand-over of a permit: the waiter's own two
writes). When no hint is left and every slot is in use, the permits are read, page by page,
for one whose holder's lease is over (a dead holder's): only then, and only again once a
holder read could have run out.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from .. import _clock as clock
from .._observability import telemetry
from .._storage import dynamodb, lock_rows, lock_writes, queue_entries, records
from .._storage import permit_items as slots
from .._storage.records import Mode
from ..exceptions import SemaphoreUnavailable
from . import handover as heirs
from . import permit_hold as permit_held
from . import processes
from . import queue as queueing
from .hold import Held, acquired
from .lockspec import LockSpec
from .queue import Pace, backoff, busy, seconds_until_free, too_slow, wait_in_queue
from .steps import Request, Sleep, Steps, Write

logger = logging.getLogger("dynasem")

# Ambiguous failures (maybe applied) retried with the same token before giving up.
MIN_TRANSIENT_RETRIES = 3
# Renewals that confirm a take whose answer came late, before it is given back instead.
CONFIRM_TRIES = 3
# Takes given back (their answers came too late to trust) before an acquire past its wait
# gives up (too_slow): a take answered late is no busy lock, worth a few tries even at wait=0.
MAX_LATE = 3


def applies(sem: LockSpec) -> bool:
    return slots.uses_permits(sem.mode, sem.limit)


class _Plan:
    """The take to send next, or who is in our way."""

    def __init__(
        self,
        how: str = "",
        slot: int | None = None,
        in_way: Any = None,
        dead: records.Permit | None = None,
    ):
        self.how, self.slot, self.in_way = how, slot, in_way
        self.dead = dead  # the permit of a holder proven dead, taken over as read


class _Scan:
    """The permits last read: who held them, and when one of them could run out."""

    def __init__(self) -> None:
        self.held: list[records.Permit] = []
        self.until_ms = 0  # no read before this (ms) can find more

    def due(self, now_ms: int) -> bool:
        return now_ms >= self.until_ms


def acquire_steps(  # noqa: C901, PLR0912, PLR0915  (issue 41: split)
    sem: LockSpec,
    *,
    token: str,
    user_id: str,
    proc: str | None,
    lease: float,
    wait: float,
    skew: float,
    margin: float,
) -> Steps[Held]:
    """The acquire loop of a permit semaphore (see
    :meth:`dynasem._engine.core.Semaphore._acquire_steps`
    for the shape of steps). ``margin``: the trust a hold must have left when it is returned
    (:func:`_trusted`)."""
    timing = _Timing(lease, skew, margin)
    if len(sem.resources) > 1:
        return (yield from _acquire_many(sem, token, user_id, proc, timing, wait))
    resource = sem.resources[0]
    lease_ms, skew_ms = int(lease * 1000), int(skew * 1000)
    deadline = clock.monotonic() + wait
    pace, scan = Pace(), _Scan()
    seen = permit_held.rows.get(resource)
    if seen is None:
        seen = yield from queueing.patient_read(
            functools.partial(lock_rows.get, resource, consistent=False), None, pace, deadline
        )
    seen = seen or records.LockItem(resource=resource)
    failures = replans = 0
    # Our turn was had: a row write of ours moved the queue past us, but the slot it named
    # proved taken (a stale hint). The next take asks nothing of the queue: we keep our place.
    served = False
    while True:
        now = clock.now_ms()
        stale = now - skew_ms
        if queueing.passed(seen, pace.queue_id, pace.ticket):
            pace.ticket = None
        ticket = pace.ticket
        in_way: dict[str, Any] = {}
        if not served:
            ahead = queueing.entries_ahead(seen, ticket, stale)
            if ahead is None:
                upto = queueing.upto_of(seen, ticket)
                # Throttled (a hot key): no news, after a pause (issue 40).
                seen = yield from queueing.patient_read(
                    functools.partial(queue_entries.load_entries, seen, upto), seen, pace, deadline
                )
                continue
            in_way = {w.token: w for w in ahead}
        plan = _Plan(in_way=in_way)
        if not in_way:
            plan = yield from _plan(sem, resource, seen, scan, stale)
        if plan.how:
            # The lease runs from here, after the plan's reads (they may have been slow): a
            # lease end fixed before them could be over when the permit is written.
            sent_mono, now = clock.monotonic(), clock.now_ms()
            # A take of a slot in a permit row counts the row's fence up (the stored one plus
            # one, learnt from the old row); a take that makes the row names one from the clock.
            counted = plan.how in ("pop", "grow", "fence")
            fence = max(clock.new_fence(skew), seen.fence + 1)
            holder = lock_writes.holder_entry(user_id, now + lease_ms, fence, now, False, proc)
            terms = lock_writes.QueueTerms(
                mine=ticket,
                queue_in=seen.queue_in,
                queue_out=seen.queue_out,
                served=served,
            )
            action = slots.take_slot(
                resource,
                how=plan.how,
                fence=None if counted else fence,
                limit=sem.limit,
                queue=terms,
                slot=plan.slot if plan.how == "fence" else None,
                seen_fence=seen.fence,
                stale_ms=stale,
                expires_ms=holder.expires_ms,
                user_id=user_id,
            )
            try:
                old = yield Write(functools.partial(slots.send, action, old=True), token, [])
            except dynamodb.Refused as refused:
                seen = refused.lock or records.LockItem(resource=resource)
                replans += 1
                if replans > queueing.MAX_REPLANS:
                    replans = 0
                    yield Sleep(backoff(2))
                continue
            except SemaphoreUnavailable as exc:
                failures += 1
                if not exc.transient or clock.monotonic() >= deadline:
                    raise
                yield Sleep(min(backoff(failures), max(0.05, deadline - clock.monotonic())))
                continue
            before: records.LockItem = records.lock_item(dict(old or {"pk": resource}))
            if counted:
                fence = before.fence + 1
                holder = dataclasses.replace(holder, fence=fence)
            slot = _slot_taken(plan, before)
            seen = _after_take(before, resource, plan.how, fence, ticket, sem.limit, served)
            permit_held.remember(seen)
            if (
                not served
                and ticket is not None
                and seen.queue_in > ticket
                and (seen.hints or (seen.slots_used or 0) < sem.limit)
            ):
                # Room for the next in line too: tell it now (before our permit's write: its
                # take is of another slot) rather than at its next look.
                yield Request(
                    functools.partial(
                        heirs.push_first,
                        resource,
                        dataclasses.replace(seen, entries=None),
                        readers_only=False,
                    )
                )
            taken = yield from _hold_permit(
                resource, slot, token, holder, stale, deadline, plan.dead
            )
            if not taken:
                # Another holds that slot (a hint gone stale): plan again, keeping our turn.
                served = True
                continue
            trust = yield from _trusted({resource: slot}, token, holder.expires_ms, sent_mono,
                                        timing, deadline)  # fmt: skip
            if trust is None:
                served = True  # given back: plan again, keeping our turn
                continue
            return _held(sem, token, user_id, {resource: fence}, {resource: slot}, timing,
                         trust, seen.listed_s)  # fmt: skip
        # Busy: wait in the queue within the budget (joining it again if our turn was had:
        # its next take asks the queue again).
        served = False
        view = dataclasses.replace(seen, holders={p.token: p.holder for p in scan.held})
        blocked = {resource: plan.in_way or view.holders}
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            if pace.ticket is not None:
                ticket, pace.ticket = pace.ticket, None
                try:
                    yield Request(
                        functools.partial(
                            queue_entries.leave_queue, resource, pace.queue_id, ticket, token=token
                        )
                    )
                except SemaphoreUnavailable:
                    pass  # our entry expires with its lease
                pace.ticket = ticket  # for the estimate: our place when we left
            raise busy(
                sem,
                blocked,
                {resource: view},
                skew=skew,
                user_id=user_id,
                token=token,
                ticket=pace.ticket,
            )
        seen = (
            yield from wait_in_queue(
                sem,
                resource,
                view,
                token=token,
                user_id=user_id,
                lease=lease,
                skew=skew,
                queued=pace.ticket is not None,
                remaining=remaining,
                pace=pace,
            )
        ) or records.LockItem(resource=resource)
        replans = 0


def _plan(
    sem: LockSpec, resource: str, seen: records.LockItem, scan: _Scan, stale: int
) -> Steps[_Plan]:
    """The take to send, from the row as seen (reading the permits when every slot is in use
    and no hint is left), or who is in our way."""
    limit = sem.limit
    if seen.slots_used is None:
        live = queueing.live_holders(seen, stale)
        if live and seen.expires_ms >= stale:
            # Held in the row: an exclusive, shared or few-permit hold (another limit).
            raise _other_limit(resource, seen.limit, limit)
        return _Plan("create", 0)
    if seen.limit != limit:
        held = yield Request(functools.partial(slots.permits, resource))
        if any(not p.free_at(stale) for p in held):
            raise _other_limit(resource, seen.limit, limit)
        return _Plan("reset", 0)
    if seen.hints:
        return _Plan("pop")
    if seen.slots_used < limit:
        return _Plan("grow")
    now = clock.now_ms()
    if not scan.due(now):
        return _Plan(in_way={p.token: p.holder for p in scan.held})
    slot, dead, held = yield Request(
        functools.partial(slots.find_free, resource, seen.slots_used, stale, _proven_dead)
    )
    scan.held = held
    if slot is not None:
        return _Plan("fence", slot, dead=dead)
    skew_ms = now - stale
    scan.until_ms = min((p.holder.expires_ms for p in held), default=now) + skew_ms + 1
    return _Plan(in_way={p.token: p.holder for p in held})


def _proven_dead(permit: records.Permit) -> bool:
    """Has the holder of ``permit`` ended, as this host can prove (same host only)?"""
    return processes.gone(permit.holder.proc)


def _other_limit(resource: str, stored: int, limit: int) -> ValueError:
    return ValueError(
        f"{resource!r} is held with limit={stored}; every holder of one resource must use "
        f"the same limit, not limit={limit}"
    )


def _slot_taken(plan: _Plan, before: records.LockItem) -> int:
    if plan.how == "pop":
        return before.hints[0]
    if plan.how == "grow":
        return before.slots_used or 0
    return plan.slot or 0


def _after_take(
    before: records.LockItem,
    resource: str,
    how: str,
    fence: int,
    ticket: int | None,
    limit: int,
    served: bool = False,
) -> records.LockItem:
    """The row as our take left it (from the row before it; ``served``: a take that left the
    queue as it was)."""
    hints, slots_used = before.hints, before.slots_used or 0
    if how == "pop":
        hints = hints[1:]
    elif how == "grow":
        slots_used += 1
    elif how in ("create", "reset"):
        hints, slots_used = (), 1
    if served:
        queue_out = before.queue_out
    elif ticket is not None:
        queue_out = ticket
    else:
        queue_out = before.queue_in if before.queue_in > before.queue_out else before.queue_out
    return dataclasses.replace(
        before,
        resource=resource,
        fence=fence,
        hints=hints,
        slots_used=slots_used,
        queue_out=queue_out,
        limit=limit,
        mode=Mode.COUNTING,
        holders={},
        entries=None,
    )


def _hold_permit(
    resource: str,
    slot: int,
    token: str,
    holder: records.Holder,
    stale: int,
    deadline: float,
    dead: records.Permit | None = None,
) -> Steps[bool]:
    """The permit's write: True once it is ours; False if another holds the slot."""
    action = slots.take_permit(resource, slot, token, holder, stale_ms=stale, dead=dead)
    undo = functools.partial(permit_held.undo, resource, slot, token)
    failures = 0
    while True:
        try:
            yield Write(functools.partial(slots.send, action), token, [], undo=undo)
            return True
        except dynamodb.Refused:
            return False
        except SemaphoreUnavailable as exc:
            # Maybe applied: the same write again is accepted if it was (it names our token).
            failures += 1
            out_of_time = clock.monotonic() >= deadline and (
                not exc.ambiguous or failures > MIN_TRANSIENT_RETRIES
            )
            if not exc.transient or out_of_time:
                if exc.ambiguous:
                    yield Request(undo)
                raise
            yield Sleep(backoff(failures))


class _Timing:
    """An acquire's lease and CLOCK_SKEW (seconds), the trust a hold it returns must have
    left (``margin``: see :func:`_trusted`), and how many of its takes were given back for
    that."""

    def __init__(self, lease: float, skew: float, margin: float):
        self.lease, self.skew, self.margin = lease, skew, margin
        self.late = 0

    def left(self, sent_mono: float) -> float:
        """The trust left of a lease set by a write sent at ``sent_mono`` (monotonic)."""
        return sent_mono + self.lease - self.skew - clock.monotonic()


def _trusted(
    taken: dict[str, int],
    token: str,
    expires_ms: int,
    sent_mono: float,
    timing: _Timing,
    deadline: float,
) -> Steps[tuple[int, float] | None]:
    """The lease end and send time the permits ``taken`` (ours, as written by a take sent
    at ``sent_mono``) are trusted from: the take's own, if at least ``timing.margin`` of its
    trust is left (its answer, or a retry's, can come long after it was applied: a host cut
    off from DynamoDB); else a renewal's, conditional on our token (nobody held the permit
    meanwhile). None: not confirmed (taken over after our lease ran out, or every renewal
    answered as late), whatever is still ours given back. Raises ``too_slow`` once
    ``MAX_LATE`` were given back and the wait is over."""
    undo = functools.partial(permit_held.undo_many, taken, token)
    for _ in range(CONFIRM_TRIES):
        if timing.left(sent_mono) >= timing.margin:
            return expires_ms, sent_mono
        sent_mono, expires_ms = clock.monotonic(), clock.now_ms() + int(timing.lease * 1000)
        try:
            for resource, slot in taken.items():
                renewal = slots.renew_permit(resource, slot, token, expires_ms)
                yield Write(functools.partial(slots.send, renewal), token, [], undo=undo)
        except (dynamodb.Refused, SemaphoreUnavailable):
            break
    yield Request(undo)
    timing.late += 1
    if timing.late >= MAX_LATE and clock.monotonic() >= deadline:
        raise too_slow(next(iter(taken)), timing.lease, timing.skew)
    return None


def _held(
    sem: LockSpec,
    token: str,
    user_id: str,
    fences: dict[str, int],
    taken: dict[str, int],
    timing: _Timing,
    trust: tuple[int, float],
    listed_s: int | None,
) -> Held:
    expires_ms, sent_mono = trust
    held = acquired(
        sem,
        token=token,
        user_id=user_id,
        fences=fences,
        lease=timing.lease,
        skew=timing.skew,
        expires_ms=expires_ms,
        sent_mono=sent_mono,
        item=None,
        cls=permit_held.PermitHeld,
    )
    assert isinstance(held, permit_held.PermitHeld)
    held.slots = taken
    for resource in taken:
        held.raise_row(resource, expires_ms, listed_s)
    return held


def _acquire_many(  # noqa: C901, PLR0912, PLR0915  (issue 41: split)
    sem: LockSpec,
    token: str,
    user_id: str,
    proc: str | None,
    timing: _Timing,
    wait: float,
) -> Steps[Held]:
    """Several permit resources, all or none: read their rows, then one transaction of a row
    write and a permit write for each. No queue (as for any multi-resource take)."""
    resources = sem.resources
    if len(resources) * 2 > records.MAX_TRANSACTION:
        raise ValueError(
            f"at most {records.MAX_TRANSACTION // 2} resources of limit > {slots.INLINE_MAX} can "
            f"be taken at once (DynamoDB's transaction limit of {records.MAX_TRANSACTION} "
            f"actions: two each), not {len(resources)}"
        )
    lease, skew = timing.lease, timing.skew
    lease_ms, skew_ms = int(lease * 1000), int(skew * 1000)
    deadline = clock.monotonic() + wait
    scans = {r: _Scan() for r in resources}
    sleeps = failures = 0
    pace = Pace()
    while True:
        seen: dict[str, records.LockItem | None] = {}
        for r in resources:
            # Throttled (a hot key): no news, after a pause (issue 40).
            got = yield from queueing.patient_read(
                functools.partial(lock_rows.get, r), None, pace, deadline
            )
            seen[r] = got or records.LockItem(resource=r)
        stale = clock.now_ms() - skew_ms
        plans: dict[str, _Plan] = {}
        blocked: dict[str, Any] = {}
        for r in resources:
            row = seen[r] or records.LockItem(resource=r)
            in_way: dict[str, Any] = {}
            if row.waiting:
                row = yield from queueing.patient_read(
                    functools.partial(queue_entries.load_entries, row), row, pace, deadline
                )
                seen[r] = row
                in_way = {w.token: w for w in queueing.entries_ahead(row, None, stale) or ()}
            plan = _Plan(in_way=in_way)
            if not in_way:
                plan = yield from _plan(sem, r, row, scans[r], stale)
            if plan.how == "pop":
                plan.slot = row.hints[0]
            elif plan.how == "grow":
                plan.slot = row.slots_used
            if plan.how:
                plans[r] = plan
            else:
                blocked[r] = plan.in_way
        if not blocked:
            # The lease runs from here, after the reads above (they may have been slow).
            sent_mono, now = clock.monotonic(), clock.now_ms()
            fences, actions, taken = {}, [], {}
            expires_ms = now + lease_ms
            for r in resources:
                row, plan = seen[r] or records.LockItem(resource=r), plans[r]
                fences[r] = max(clock.new_fence(skew), row.fence + 1)
                holder = lock_writes.holder_entry(user_id, expires_ms, fences[r], now, False, proc)
                terms = lock_writes.QueueTerms(queue_in=row.queue_in, queue_out=row.queue_out)
                actions.append(
                    slots.take_slot(
                        r,
                        how=plan.how,
                        fence=fences[r],
                        limit=sem.limit,
                        queue=terms,
                        slot=plan.slot,
                        seen_hw=row.slots_used,
                        seen_fence=row.fence,
                        stale_ms=stale,
                        expires_ms=expires_ms,
                        user_id=user_id,
                    )
                )
                taken[r] = plan.slot or 0
                actions.append(
                    slots.take_permit(r, taken[r], token, holder, stale_ms=stale, dead=plan.dead)
                )
            undo = functools.partial(permit_held.undo_many, taken, token)
            again = yield from all_or_none(actions, token, undo, deadline, failures)
            if again is not None:
                failures = again
                continue
            trust = yield from _trusted(taken, token, expires_ms, sent_mono, timing, deadline)
            if trust is None:
                continue  # given back: read the rows again
            return _held(sem, token, user_id, fences, taken, timing, trust, None)
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            raise busy(sem, blocked, seen, skew=skew, user_id=user_id, token=token)
        sleeps += 1
        if telemetry.ON:
            telemetry.waiting()  # the span's wait event, once (core's loop may have sent it)
        until_free = seconds_until_free(blocked, skew)
        yield Sleep(max(0.0, min(backoff(sleeps), until_free + 0.005, remaining)))


def all_or_none(
    actions: list[dict[str, Any]],
    token: str,
    undo: Callable[[], None],
    deadline: float,
    failures: int,
) -> Steps[int | None]:
    """The one transaction of a take of several resources (items of their own: permits,
    reader items). None once applied; else the failures so far, after a pause: plan again
    (a conflict with another transaction; a failure in transit, whatever may have been
    applied withdrawn by ``undo``). Raises past ``deadline`` or on a failure not transient."""
    try:
        yield Write(functools.partial(lock_rows.transact, actions), token, [], undo=undo)
        return None
    except dynamodb.Cancelled:
        yield Sleep(backoff(1))
        return failures
    except SemaphoreUnavailable as exc:
        failures += 1
        if exc.ambiguous:
            yield Request(undo)
        if not exc.transient or clock.monotonic() >= deadline:
            raise
        yield Sleep(backoff(failures))
        return failures
