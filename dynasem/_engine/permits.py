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
from collections.abc import Callable
from typing import Any

from .. import _clock as clock
from .._storage import dynamodb, lock_rows, lock_writes, permit_items, queue_entries, records
from ..exceptions import SemaphoreUnavailable
from . import handover, permit_hold, processes, queue, take
from .hold import Held
from .late_handover import give_back_stray
from .lockspec import Attempt, LockSpec
from .queue import MAX_REPLANS, Pace, backoff, busy, too_slow, wait_in_queue
from .steps import Request, Sleep, Steps, Write

# Ambiguous failures (maybe applied) retried with the same token before giving up.
MIN_TRANSIENT_RETRIES = 3
# Renewals that confirm a take whose answer came late, before it is given back instead.
CONFIRM_TRIES = 3
# Takes given back (their answers came too late to trust) before an acquire past its wait
# gives up (too_slow): a take answered late is no busy lock, worth a few tries even at wait=0.
MAX_LATE = 3


def applies(sem: LockSpec) -> bool:
    return permit_items.uses_permits(sem.mode, sem.limit)


@dataclasses.dataclass
class _Plan:
    """The take to send next, or who is in our way."""

    how: str = ""
    slot: int | None = None
    in_way: Any = None
    dead: records.Permit | None = None  # the permit of a holder proven dead, taken over as read


@dataclasses.dataclass
class _Scan:
    """The permits last read: who held them, and when one of them could run out."""

    held: list[records.Permit] = dataclasses.field(default_factory=list)
    # The first of their lease ends: no read can find more before it is over by the skew.
    first_end: int = -1


def acquire_steps(run: Attempt) -> Steps[Held]:
    """The acquire loop of a permit semaphore (see
    :meth:`dynasem._engine.core.Semaphore._acquire_steps` for the shape of steps)."""
    if len(run.sem.resources) > 1:
        return (yield from _acquire_many(run))
    return (yield from _Acquire(run).steps())


class _Acquire:
    """A permit resource's acquire: plan (the queue ahead, then a slot), take (the row, then
    the permit, then its trust), or wait in line, or give up."""

    def __init__(self, run: Attempt):
        self.run, self.resource = run, run.sem.resources[0]
        self.pace, self.scan = Pace(), _Scan()
        self.seen = records.LockItem(resource=self.resource)
        self.stale = 0
        self.failures = self.replans = 0
        # Our turn was had: a row write of ours moved the queue past us, but the slot it
        # named proved taken (a stale hint). The next take asks nothing of the queue: we
        # keep our place.
        self.served = False
        # The fence of the row last read again before saying it is held with another limit.
        self.rechecked: int | None = None
        # A permit refused us for its fence, above the row's (a row made anew by a take
        # paused over a reap, under a fence drawn before a later holder's): the next take
        # names a fence above it instead of counting from the row's (0: none).
        self.floor = 0

    def steps(self) -> Steps[Held]:
        resource = self.resource
        seen = permit_hold.rows.get(resource)
        if seen is None:
            read = functools.partial(lock_rows.get, resource, consistent=False)
            seen = yield from queue.patient_read(read, None, self.pace, self.run.deadline)
        self.seen = seen or records.LockItem(resource=resource)
        try:
            while True:
                plan = yield from self.plan()
                if plan is None:
                    continue
                if not plan.how:
                    yield from self.wait(plan)
                    continue
                held = yield from self.take(plan)
                if held is not None:
                    return held
        except (ValueError, SemaphoreUnavailable):
            # Held with another limit or mode, or DynamoDB failed a request of our wait: out
            # of the way of the waiters behind us.
            yield from self.leave()
            raise

    def plan(self) -> Steps[_Plan | None]:
        """The take to send, or who is in our way; None: the queue ahead was read, plan
        again."""
        pace, seen = self.pace, self.seen
        self.stale = self.run.stale_ms(clock.now_ms())
        if pace.ticket is not None and queue.before_ticket(seen, pace):
            # The row as it was before our ticket (a stale look): see Acquire.try_take.
            fresh = queue.read_for_ticket(self.resource, seen, pace, self.run.deadline)
            self.seen = (yield from fresh) or records.LockItem(resource=self.resource)
            return None
        if queue.passed(seen, pace.queue_id, pace.ticket):
            pace.ticket = None
            if handed_to(self.run.token, seen):
                # An exclusive holder handed the row to us, its next in line (a queue shared
                # with other limits or modes), which moved the queue past us: we cannot use
                # it. Hand it on now, or it would sit held by nobody for its lease while we
                # (and everyone behind) queued again behind it; then plan from the row anew.
                run = self.run
                yield Request(
                    functools.partial(
                        give_back_stray, run.sem, run.token, seen, lease=run.lease, skew=run.skew
                    )
                )
                row = functools.partial(lock_rows.get, self.resource, consistent=True)
                self.seen = (yield Request(row)) or records.LockItem(resource=self.resource)
                return None
        if not self.served:
            ahead = queue.entries_ahead(seen, pace.ticket, self.stale)
            if ahead is None:
                upto = queue.upto_of(seen, pace.ticket)
                # Throttled (a hot key): no news, after a pause (issue 40).
                read = functools.partial(queue_entries.load_entries, seen, upto)
                self.seen = yield from queue.patient_read(read, seen, pace, self.run.deadline)
                return None
            if ahead:
                return _Plan(in_way={w.token: w for w in ahead})
        try:
            return (yield from _plan(self.run.sem, self.resource, seen, self.scan, self.stale))
        except ValueError:
            if self.rechecked == seen.fence:
                raise
        # Held with another limit or mode, by a row that may be older than the table's (an
        # eventually consistent read, a row this process remembers): read it as it is first.
        row = functools.partial(lock_rows.get, self.resource, consistent=True)
        self.seen = (yield Request(row)) or records.LockItem(resource=self.resource)
        self.rechecked = self.seen.fence
        return None

    def take(self, plan: _Plan) -> Steps[Held | None]:
        """The row's write (a fence, a slot), then the permit's; None: plan again."""
        run, resource, seen, ticket = self.run, self.resource, self.seen, self.pace.ticket
        # The lease runs from here, after the plan's reads (they may have been slow): a
        # lease end fixed before them could be over when the permit is written.
        sent_mono, now = clock.monotonic(), clock.now_ms()
        # A take of a slot in a permit row counts the row's fence up (the stored one plus
        # one, learnt from the old row); a take that makes the row names one from the clock.
        counted = plan.how in ("pop", "grow", "fence") and self.floor <= seen.fence
        fence = max(clock.new_fence(run.skew), seen.fence + 1, self.floor + 1)
        holder = run.holder(now, fence, shared=False)
        if plan.how != "create" and seen.expires_ms < holder.expires_ms:
            if not (yield from self.cover(holder.expires_ms)):
                return None
        terms = lock_writes.QueueTerms(
            mine=ticket, queue_in=seen.queue_in, queue_out=seen.queue_out, served=self.served
        )
        action = _take_slot(run, seen, plan, holder, terms, self.stale, counted, cover=True)
        old = yield from self.send_row(action)
        if old is None:
            return None
        if plan.how == "create" and not old and take.may_be_reaped(sent_mono, now, run.skew):
            # Our create made the row anew, late enough that it may have been reaped since
            # our fence was drawn (below a later holder's, exclusive or not): a fresh fence
            # first, above the stored one, before our permit is written under it.
            holder = dataclasses.replace(holder, fence=clock.new_fence(run.skew))
            refence = permit_items.take_slot(
                resource,
                how="fence",
                fence=holder.fence,
                limit=run.sem.limit,
                queue=lock_writes.QueueTerms(served=True),
                slot=0,
            )
            if (yield from self.send_row(refence)) is None:
                return None  # slot 0 below hw with no permit: free to the next take
        before = records.lock_item(dict(old or {"pk": resource}))
        if counted:
            holder = dataclasses.replace(holder, fence=before.fence + 1)
        self.seen, slot = self.after(before, plan, holder.fence)
        permit_hold.remember(self.seen)
        yield from self.tell_next(ticket)
        if (yield from self.hold_permit(slot, holder, plan.dead)):
            fences, taken = {resource: holder.fence}, {resource: slot}
            sent = (holder.expires_ms, sent_mono)
            held = yield from _held(run, fences, taken, sent)
            if held is not None:
                return held
        # Another holds that slot (a hint gone stale), or the permit was given back (its
        # trust was short): plan again, keeping our turn.
        self.served = True
        return None

    def after(
        self, before: records.LockItem, plan: _Plan, fence: int
    ) -> tuple[records.LockItem, int]:
        """The row as our take of ``plan`` left it (from the row before it; ``served``: a
        take that left the queue as it was), and the slot it took."""
        hints, slots_used, slot = before.hints, before.slots_used or 0, plan.slot or 0
        if plan.how == "pop":
            hints, slot = hints[1:], hints[0]
        elif plan.how == "grow":
            slots_used, slot = slots_used + 1, slots_used
        elif plan.how in ("create", "reset"):
            hints, slots_used = (), 1
        ticket = self.pace.ticket
        queue_out = max(before.queue_in, before.queue_out) if ticket is None else ticket
        row = dataclasses.replace(
            before,
            resource=self.resource,
            fence=fence,
            hints=hints,
            slots_used=slots_used,
            queue_out=before.queue_out if self.served else queue_out,
            limit=self.run.sem.limit,
            mode=records.Mode.COUNTING,
            holders={},
            entries=None,
        )
        return row, slot

    def hold_permit(
        self, slot: int, holder: records.Holder, dead: records.Permit | None
    ) -> Steps[bool]:
        """The permit's write: True once it is ours; False if another holds the slot."""
        run, resource, token = self.run, self.resource, self.run.token
        action = permit_items.take_permit(
            resource, slot, token, holder, stale_ms=self.stale, dead=dead
        )
        undo = functools.partial(permit_hold.undo, resource, slot, token)
        failures, maybe_taken = 0, False
        while True:
            try:
                yield Write(functools.partial(permit_items.send, action), token, [], undo=undo)
                return True
            except dynamodb.Refused as refused:
                permit = records.permit_of(refused.item or {"sk": records.permit_sk(slot)})
                if permit.holder.fence >= holder.fence:
                    self.floor = max(self.floor, permit.holder.fence)
                return False
            except SemaphoreUnavailable as exc:
                # Maybe applied: the same write again is accepted if it was (it names our
                # token).
                failures += 1
                out_of_time = run.remaining() <= 0 and (
                    not exc.ambiguous or failures > MIN_TRANSIENT_RETRIES
                )
                maybe_taken = maybe_taken or exc.ambiguous
                if not exc.transient or out_of_time:
                    # An earlier try may have been applied even if this one never was sent.
                    if maybe_taken:
                        yield Request(undo)
                    raise
                yield Sleep(backoff(failures))

    def send_row(self, action: dict[str, Any]) -> Steps[dict[str, Any] | None]:
        """The row's write; its old item, or None: refused or failed, plan again."""
        try:
            old: dict[str, Any] | None = yield Write(
                functools.partial(permit_items.send, action, old=True), self.run.token, []
            )
            return old or {}
        except dynamodb.Refused as refused:
            self.seen = refused.lock or records.LockItem(resource=self.resource)
            self.replans += 1
            if self.replans > MAX_REPLANS:
                self.replans = 0
                yield Sleep(backoff(2))
        except SemaphoreUnavailable as exc:
            yield from self.failed(exc)
        return None

    def failed(self, exc: SemaphoreUnavailable) -> Steps[None]:
        """A request of the take failed (``exc``): raised again unless for a passing cause
        with time left; else a pause (longer with each failure, within what is left)."""
        self.failures += 1
        if not exc.transient or self.run.remaining() <= 0:
            raise exc
        yield Sleep(min(backoff(self.failures), max(0.05, self.run.remaining())))

    def cover(self, expires_ms: int) -> Steps[bool]:
        """Before a take whose permit will run to ``expires_ms``: the row listed up to then
        (see permit_items.take_slot's ``cover_ms``). False: it failed for a passing reason
        (after a pause): plan again."""
        try:  # (no permit row any more: the take's conditions decide)
            yield Request(functools.partial(permit_hold.cover, self.resource, expires_ms))
        except SemaphoreUnavailable as exc:
            yield from self.failed(exc)
            return False
        return True

    def tell_next(self, ticket: int | None) -> Steps[None]:
        """Room for the next in line too: tell it now (before our permit's write: its take
        is of another slot) rather than at its next look."""
        seen = self.seen
        room = seen.hints or (seen.slots_used or 0) < self.run.sem.limit
        if not self.served and ticket is not None and seen.queue_in > ticket and room:
            row = dataclasses.replace(seen, entries=None)
            yield Request(
                functools.partial(handover.push_first, self.resource, row, readers_only=False)
            )

    def wait(self, plan: _Plan) -> Steps[None]:
        """Busy: wait in the queue within the budget (joining it again if our turn was
        had: its next take asks the queue again); past it, give up."""
        run, pace = self.run, self.pace
        self.served = False
        view = dataclasses.replace(self.seen, holders={p.token: p.holder for p in self.scan.held})
        blocked = {self.resource: plan.in_way or view.holders}
        if run.after:  # a task's retry: its run's permit is waited out (queue.wait_out)
            queue.wait_out(run, {self.resource: view.holders})
        if run.remaining() <= 0:
            yield from self.give_up(blocked, view)
        queued = pace.ticket is not None
        seen = yield from wait_in_queue(run, self.resource, view, queued=queued, pace=pace)
        self.seen = seen or records.LockItem(resource=self.resource)
        self.replans = 0

    def give_up(self, blocked: dict[str, Any], view: records.LockItem) -> Steps[None]:
        ticket = self.pace.ticket
        yield from self.leave()
        raise busy(self.run, blocked, {self.resource: view}, ticket)  # our place when we left

    def leave(self) -> Steps[None]:
        """Leave the queue, if in it. A hand-over in the row that reached us, or reaches us
        later (an exclusive holder hands over to its next in line, whatever that one's mode:
        a queue shared with other limits or modes), is given back: we cannot use it."""
        run, pace = self.run, self.pace
        leave = queue.leaving(run, (pace.queue_id, pace.ticket or 0))
        pace.ticket = None
        if leave is not None:
            yield Request(leave)
        elif run.token in self.seen.holders:  # handed to us, which moved the queue past us
            give_back = functools.partial(
                give_back_stray, run.sem, run.token, self.seen, lease=run.lease, skew=run.skew
            )
            yield Request(give_back)


def handed_to(token: str, seen: records.LockItem) -> bool:
    """Whether ``seen`` shows the row itself handed to ``token``: an exclusive holder's
    hand-over to its next in line, a waiter of ours, which no permit take can use."""
    return token in seen.holders and not seen.permits_read


def _plan(
    sem: LockSpec, resource: str, seen: records.LockItem, scan: _Scan, stale: int
) -> Steps[_Plan]:
    """The take to send, from the row as seen (reading the permits when every slot is in use
    and no hint is left), or who is in our way."""
    limit = sem.limit
    if seen.slots_used is None:
        live = queue.live_holders(seen, stale)
        if live and seen.expires_ms >= stale:
            # Held in the row: an exclusive, shared or few-permit hold (another limit).
            raise take.other_limit(resource, seen, sem.mode, limit)
        return _Plan("create", 0)
    if seen.limit != limit:
        # Its permits read, and fenced if none is live: no take slowed before its permit
        # write can then hold a slot of the old limit.
        fenced = yield Request(functools.partial(permit_items.fenced_permits, seen, stale))
        if queue.live_holders(fenced, stale):
            raise take.other_limit(resource, seen, sem.mode, limit)
        return _Plan("reset", 0)
    if seen.hints:
        return _Plan("pop")
    if seen.slots_used < limit:
        return _Plan("grow")
    if stale <= scan.first_end:
        return _Plan(in_way={p.token: p.holder for p in scan.held})
    slot, dead, held = yield Request(
        functools.partial(permit_items.find_free, resource, seen.slots_used, stale, _proven_dead)
    )
    scan.held = held
    if slot is not None:
        return _Plan("fence", slot, dead=dead)
    # Against ``stale`` (the lease end a take may pass now), not the clock: a pause since it
    # was reckoned must not stretch the time the permits read are trusted to stay held.
    scan.first_end = min((p.holder.expires_ms for p in held), default=clock.now_ms())
    return _Plan(in_way={p.token: p.holder for p in held})


def _proven_dead(permit: records.Permit) -> bool:
    """Has the holder of ``permit`` ended, as this host can prove (same host only)?"""
    return processes.gone(permit.holder.proc)


def _take_slot(
    run: Attempt,
    row: records.LockItem,
    plan: _Plan,
    holder: records.Holder,
    terms: lock_writes.QueueTerms,
    stale: int,
    counted: bool,
    *,
    cover: bool = False,
) -> dict[str, Any]:
    """The row's write of a take of ``plan`` (``holder``: ours, its fence named unless
    ``counted`` up from the stored one; ``cover``: the permit's write follows in a write of
    its own, so the row must be listed past its lease end already)."""
    return permit_items.take_slot(
        row.resource,
        how=plan.how,
        fence=None if counted else holder.fence,
        limit=run.sem.limit,
        queue=terms,
        slot=plan.slot,
        seen=row,
        holder=holder,
        stale_ms=stale,
        cover_ms=holder.expires_ms if cover and plan.how != "create" else None,
    )


def count_late(run: Attempt, resource: str) -> None:
    """A take given back, its answer too late to trust: ``too_slow`` once ``MAX_LATE`` were
    and the wait is over."""
    run.late += 1
    if run.late >= MAX_LATE and run.remaining() <= 0:
        raise too_slow(resource, run.lease, run.skew)


def _held(
    run: Attempt,
    fences: dict[str, int],
    taken: dict[str, int],
    sent: tuple[int, float],
) -> Steps[Held | None]:
    """The hold of the permits ``taken`` (ours, as written by a take sent at ``sent``: its
    lease end and monotonic time), trusted from the take's own send, if at least
    ``run.margin`` of its trust is left (its answer, or a retry's, can come long after it
    was applied: a host cut off from DynamoDB); else from a renewal's, conditional on our
    token (nobody held the permit meanwhile), the row raised first as a renewal does. None:
    not confirmed (taken over after our lease ran out, or every renewal answered as late),
    whatever is still ours given back (:func:`count_late`)."""
    expires_ms, sent_mono = sent
    undo = functools.partial(permit_hold.undo_many, taken, run.token)
    for _ in range(CONFIRM_TRIES):
        if sent_mono + run.lease - run.skew - clock.monotonic() >= run.margin:
            held = take.hold(
                run, fences, expires_ms, sent_mono, cls=permit_hold.PermitHeld, slots=taken
            )
            assert isinstance(held, permit_hold.PermitHeld)
            listed = records.bucket_of(expires_ms)  # as the take's write required (cover_ms)
            for resource in taken:
                held.raise_row(resource, expires_ms, listed)
            return held
        sent_mono, expires_ms = clock.monotonic(), clock.now_ms() + int(run.lease * 1000)
        try:
            for resource, slot in taken.items():
                raise_row = functools.partial(permit_hold.cover, resource, expires_ms, slot)
                if not (yield Request(raise_row)):
                    raise dynamodb.Refused(None)  # no permit row that counts our slot
                renewal = permit_items.renew_permit(resource, slot, run.token, expires_ms)
                yield Write(functools.partial(permit_items.send, renewal), run.token, [], undo=undo)
        except (dynamodb.Refused, SemaphoreUnavailable):
            break
    yield Request(undo)
    count_late(run, next(iter(taken)))
    return None


def _acquire_many(run: Attempt) -> Steps[Held]:
    """Several permit resources, all or none: read their rows, then one transaction of a row
    write and a permit write for each. No queue (as for any multi-resource take)."""
    scans = {r: _Scan() for r in run.sem.resources}
    read = functools.partial(read_row, run)
    plan = functools.partial(_plan_many, run, scans)
    takes = functools.partial(_takes, run)
    return (yield from all_or_none(run, read, plan, takes, refused=_stale_hints))


def _stale_hints(
    plans: tuple[dict[str, records.LockItem], dict[str, _Plan]], cancelled: dynamodb.Cancelled
) -> Steps[None]:
    """A take of several refused: each permit it meant to take at a hint, refused (held),
    has that hint dropped from its row. Else every try would pop the same hint again, and be
    refused with it, for as long as that slot's holder holds it, other permits free or not."""
    seen, slot_plans = plans
    for i, r in enumerate(seen):
        reasons = cancelled.reasons[2 * i : 2 * i + 2]
        plan = slot_plans.get(r)
        if plan is None or plan.how != "pop" or plan.slot is None or len(reasons) < 2:
            continue
        if reasons[1][0] == "ConditionalCheckFailed" and reasons[0][0] != "ConditionalCheckFailed":
            try:
                yield Request(
                    functools.partial(lock_rows.update, permit_items.drop_hint(r, plan.slot))
                )
            except (dynamodb.Refused, SemaphoreUnavailable):
                pass  # popped or changed meanwhile: the next plan reads the row again


def read_row(run: Attempt, resource: str, pace: Pace) -> Steps[records.LockItem | None]:
    """A row read by a take of several resources in items (permits, reader items).
    Throttled (a hot key): no news, after a pause (issue 40)."""
    get = functools.partial(lock_rows.get, resource)
    return (yield from queue.patient_read(get, None, pace, run.deadline))


def _plan_many(
    run: Attempt,
    scans: dict[str, _Scan],
    seen: dict[str, records.LockItem],
    stale: int,
    pace: Pace,
) -> Steps[tuple[tuple[dict[str, records.LockItem], dict[str, _Plan]], dict[str, Any]]]:
    """Each resource's take (its queue read first, if waited on), with the rows as read,
    and who is in the way."""
    plans: dict[str, _Plan] = {}
    blocked: dict[str, Any] = {}
    for r, row in seen.items():
        ahead: list[records.Waiter] | None = []
        if row.waiting:
            read = functools.partial(queue_entries.load_entries, row)
            row = seen[r] = yield from queue.patient_read(read, row, pace, run.deadline)
            ahead = queue.entries_ahead(row, None, stale)  # None: still throttled, not known
        plan = _Plan(in_way={w.token: w for w in ahead or ()})
        if ahead == []:
            plan = yield from _plan(run.sem, r, row, scans[r], stale)
        if plan.how == "pop":
            plan.slot = row.hints[0]
        elif plan.how == "grow":
            plan.slot = row.slots_used
        # The row listed past the lease we are about to take (a second on, for the time
        # until the transaction leaves): its write requires it (see _takes).
        cover = clock.now_ms() + int(run.lease * 1000) + 1000
        if plan.how not in ("", "create") and row.expires_ms < cover:
            raise_it = functools.partial(permit_hold.cover, r, cover)
            yield from queue.patient_read(raise_it, 0, pace, run.deadline)
        if plan.how:
            plans[r] = plan
        else:
            blocked[r] = plan.in_way
    return (seen, plans), blocked


def _takes(
    run: Attempt,
    plans: tuple[dict[str, records.LockItem], dict[str, _Plan]],
    now: int,
    stale: int,
) -> tuple[list[dict[str, Any]], Callable[[], None], Finish]:
    """The transaction's actions (a row write and a permit write each), the undo of what
    it may have taken, and what makes the hold of it once applied."""
    seen, slot_plans = plans
    actions: list[dict[str, Any]] = []
    fences: dict[str, int] = {}
    taken: dict[str, int] = {}
    for r, row in seen.items():
        plan = slot_plans[r]
        fences[r] = max(clock.new_fence(run.skew), row.fence + 1)
        holder = run.holder(now, fences[r], shared=False)
        terms = lock_writes.QueueTerms(queue_in=row.queue_in, queue_out=row.queue_out)
        taken[r] = plan.slot or 0
        permit = permit_items.take_permit(
            r, taken[r], run.token, holder, stale_ms=stale, dead=plan.dead
        )
        actions += [_take_slot(run, row, plan, holder, terms, stale, False, cover=True), permit]

    def finish(expires_ms: int, sent_mono: float) -> Steps[Held | None]:
        return (yield from _held(run, fences, taken, (expires_ms, sent_mono)))

    return actions, functools.partial(permit_hold.undo_many, taken, run.token), finish


# Makes the hold of an applied transaction (from its lease end and send time), or None:
# given back, take again.
Finish = Callable[[int, float], Steps[Held | None]]


def all_or_none(
    run: Attempt,
    read: Callable[[str, Pace], Steps[records.LockItem | None]],
    plan: Callable[[dict[str, records.LockItem], int, Pace], Steps[tuple[Any, dict[str, Any]]]],
    takes: Callable[[Any, int, int], tuple[list[dict[str, Any]], Callable[[], None], Finish]],
    refused: Callable[[Any, dynamodb.Cancelled], Steps[None]] | None = None,
) -> Steps[Held]:
    """A take of several resources in items of their own (permits, reader items), all or
    none: ``read`` each row, ``plan`` the takes (or who is in the way: a pause, or busy past
    the wait), then one transaction of ``takes``' actions. A conflict with another
    transaction, or a failure in transit (whatever may have been applied withdrawn by the
    undo), and it plans again after a pause; it raises past the wait or on a failure not
    transient; past the wait, also after more than MAX_REPLANS refusals (busy: every plan
    met a change, or one that never holds); ``refused`` hears of each refusal (the plans,
    the transaction's reasons) before the next plan. Once applied, the hold ``takes`` makes
    of it (none: given back, again)."""
    resources = run.sem.resources  # at most half a transaction's actions (check_several)
    sleeps = failures = refusals = 0
    pace = Pace()
    while True:
        seen: dict[str, records.LockItem] = {}
        for r in resources:
            seen[r] = (yield from read(r, pace)) or records.LockItem(resource=r)
        stale = run.stale_ms(clock.now_ms())
        plans, blocked = yield from plan(seen, stale, pace)
        if blocked:
            if run.after:  # a task's retry: its run's holds are waited out (queue.wait_out)
                queue.wait_out(run, blocked)
            sleeps += 1
            yield from queue.back_off(run, blocked, seen, sleeps)
            continue
        # The lease runs from here, after the reads above (they may have been slow).
        sent_mono, now = clock.monotonic(), clock.now_ms()
        actions, undo, finish = takes(plans, now, stale)
        try:
            yield Write(functools.partial(lock_rows.transact, actions), run.token, [], undo=undo)
        except dynamodb.Cancelled as cancelled:
            refusals += 1
            if run.remaining() <= 0 and refusals > queue.MAX_REPLANS:
                raise queue.busy(run, {r: {} for r in resources}, seen) from None
            if refused is not None:
                yield from refused(plans, cancelled)
            yield Sleep(backoff(1))
            continue
        except SemaphoreUnavailable as exc:
            failures += 1
            if exc.ambiguous:
                yield Request(undo)
            if not exc.transient or run.remaining() <= 0:
                raise
            yield Sleep(backoff(failures))
            continue
        held = yield from finish(now + int(run.lease * 1000), sent_mono)
        if held is not None:
            return held
