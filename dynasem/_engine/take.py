"""Planning one acquire step: from what we last saw of a resource, the write to send for it
(take it, join its holders, confirm a hold we only heard of), or who is in our way, or what
must be read first (who waits ahead of us)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import _clock as clock
from .._observability import telemetry
from .._storage import lock_writes, reader_items, records
from .._storage.records import Mode
from . import handover, queue
from .hold import Held, acquired
from .lockspec import Attempt, LockSpec
from .queue import live_holders


@dataclass
class Plan:
    """What to send for one resource next, from what we last saw of it."""

    action: dict[str, Any] | None = None  # None with busy None: the resource is ours already
    # The live holders in our way, when we cannot take it now.
    busy: Mapping[str, records.Holder | records.Waiter] | None = None
    fence: int = 0
    expires_ms: int = 0
    queued: bool = False  # we are in the resource's queue
    # The queue's entries up to this ticket must be read first: who is ahead of us?
    load: int | None = None
    # The action admits us to a reader item (dynasem._engine.readers): the item's write follows;
    # the epoch it admits us to.
    reader: bool = False
    epoch: int = 0
    # The action confirms a hold of ours (a renewal), it takes nothing.
    renewal: bool = False
    # Busy behind live waiters, the holders all gone (proven dead on this host): the write
    # that hands the lock on to the first of them (``heirs``), as their release would have.
    hand_on: dict[str, Any] | None = None
    heirs: handover.Heirs = dataclasses.field(default_factory=list)


def plan(
    sem: LockSpec,
    resource: str,
    seen: records.LockItem | None,
    token: str,
    entry: records.Holder,
    stale_ms: int,
    confirm_below_ms: int,
    ticket: int | None = None,
    refence: bool = False,
) -> Plan:
    """The write to send for ``resource`` from ``seen`` (``entry``: our holder entry, its
    fence from the clock), or who is in our way, or what must be read first. ``refence``: a
    hold of ours found in ``seen`` is confirmed under a fresh fence (its own may have been
    drawn too long before its take landed: see ``core.Acquire.write``)."""
    planning = _Planning(sem, resource, seen, token, entry, stale_ms, refence)
    return planning.plan(confirm_below_ms, ticket)


def may_be_reaped(drawn_mono: float, drawn_ms: int, skew: float) -> bool:
    """Whether a row may have been deleted (reaped, or by TTL) since a fence was drawn at
    ``drawn_mono`` (wall: ``drawn_ms``) and made anew by our take, under that fence, below
    one drawn after it. Within CLOCK_SKEW of the draw, no: a fence is the draw's wall time
    plus CLOCK_SKEW, and a row is deleted only once its ``expMs``, never earlier than its
    last fence's time, is CLOCK_SKEW old. Nor before the end of the draw's ``expires``
    bucket: a row is reaped (or expires) only once its bucket has passed, and its bucket
    never ends before its last fence's time, which for a fence above ours is past our
    draw. So a hold is confirmed under a fresh fence only when its take's answer came
    after both (once in 15 minutes at most, for a take slower than CLOCK_SKEW)."""
    skew_ms = int(skew * 1000)
    if clock.monotonic() - drawn_mono <= skew:
        return False
    return clock.now_ms() + skew_ms >= records.bucket_of(drawn_ms - skew_ms) * 1000


def other_limit(resource: str, seen: records.LockItem, mode: Mode, limit: int) -> ValueError:
    """The ValueError of a take whose limit (or kind) is not the holders' of ``seen``: each
    side named as it was asked for (a shared hold stores limit 1, which its holders never
    named)."""
    held = {Mode.SHARED: "shared", Mode.EXCLUSIVE: "exclusive (limit=1)"}.get(
        seen.mode, f"with limit={seen.limit}"
    )
    asked = "shared=True" if mode == Mode.SHARED else f"limit={limit}"
    return ValueError(
        f"{resource!r} is held {held}; every holder of one resource must use the same limit "
        f"(or all be shared), not {asked}"
    )


@dataclass
class _Planning:
    """The plan of one resource: the semaphore, the resource as seen, our token and holder
    entry, and the lease end before which a holder may be taken over."""

    sem: LockSpec
    resource: str
    seen: records.LockItem | None
    token: str
    entry: records.Holder
    stale_ms: int
    refence: bool = False

    def plan(self, confirm_below_ms: int, ticket: int | None) -> Plan:
        sem, resource, token, stale_ms = self.sem, self.resource, self.token, self.stale_ms
        queued, seen = ticket is not None, self.seen
        if seen is not None and seen.slots_used is not None:
            # Its holders are in permit items (a limit above permit_items.INLINE_MAX): read
            # them; if none is live, the row is ours to take back to holders inline.
            if not seen.permits_read:
                return Plan(load=0, queued=queued)
            if live_holders(seen, stale_ms):
                raise other_limit(resource, seen, sem.mode, sem.limit)
            seen = self.seen = dataclasses.replace(seen, holders={})  # every permit free or dead
        holders = seen.holders if seen is not None else {}
        if seen is not None and token in holders:
            return self.ours(seen, confirm_below_ms)
        if seen is not None and seen.fence >= self.entry.fence:
            # Our clock is behind: count on instead.
            self.entry = dataclasses.replace(self.entry, fence=seen.fence + 1)
        done = Plan(fence=self.entry.fence, expires_ms=self.entry.expires_ms, queued=queued)
        if sem.mode == Mode.SHARED and reader_items.admitted_before(seen, token, stale_ms):
            # Our admission was applied, its answer lost: confirmed, whoever queued since.
            return self.admission(done, seen, lock_writes.QueueTerms())
        live = live_holders(seen, stale_ms)
        held_now = seen is not None and bool(holders) and seen.expires_ms >= stale_ms
        if seen is not None and held_now:
            live, in_way = self.in_way(seen, live)
            if in_way:
                return Plan(busy=live, queued=queued)
        # Its holders would let us in: nobody cuts in line. A taker not in the queue needs
        # nobody live waiting; a queued one needs nobody live ahead of it.
        ahead = queue.entries_ahead(seen, ticket, stale_ms)
        if ahead is None and seen is not None:
            return Plan(load=queue.upto_of(seen, ticket), queued=queued)
        if ahead:
            waiting = Plan(busy=live or {w.token: w for w in ahead}, queued=queued)
            self.hand_on(waiting, ahead, gone=held_now and not live)
            return waiting
        terms = lock_writes.QueueTerms(
            mine=ticket,
            queue_in=seen.queue_in if seen is not None else 0,
            queue_out=seen.queue_out if seen is not None else 0,
        )
        if (
            sem.mode == Mode.SHARED
            and len(sem.resources) == 1
            and reader_items.wants_item(seen, live)
        ):
            return self.admission(done, seen, terms)
        done.action = self.take(live, held_now, terms)
        return done

    def ours(self, seen: records.LockItem, confirm_below_ms: int) -> Plan:
        """Ours already: handed to us, or a write of ours was applied but its response was
        lost. Trusted only until its stored lease end (less the skew): when that is near,
        or the caller says so, confirm it with a renewal of our own first, of the entry of
        the fence we saw (a stale read may show an entry of ours that was taken over and
        handed to us again since, under a later fence: then the renewal is refused, and the
        refusal shows the entry as it is)."""
        mine, entry = seen.holders[self.token], self.entry
        ours = Plan(fence=mine.fence, expires_ms=mine.expires_ms)
        if ours.expires_ms < confirm_below_ms or self.refence:
            refence = max(entry.fence, seen.fence + 1) if self.refence else None
            ours.action = lock_writes.renew_hold(
                self.resource,
                self.token,
                entry.expires_ms,
                raise_item=seen.expires_ms <= entry.expires_ms,
                user_id=entry.user_id,
                fence=mine.fence,
                refence=refence,
            )
            ours.expires_ms, ours.renewal = entry.expires_ms, True
            if refence is not None:
                ours.fence = refence
        return ours

    def in_way(
        self, seen: records.LockItem, live: dict[str, records.Holder]
    ) -> tuple[dict[str, records.Holder], bool]:
        """The live holders of a held row, less those proven dead when they keep us out, and
        whether they keep us out (else we join them)."""
        sem = self.sem
        joinable = sem.mode != Mode.EXCLUSIVE and seen.mode == sem.mode and seen.limit == sem.limit

        def room(holders: Mapping[str, records.Holder]) -> bool:
            return joinable and (sem.mode == Mode.SHARED or len(holders) < sem.limit)

        if live and not room(live):
            live = queue.not_proven_dead(live)  # in our way: a look in /proc (same host)
        if live and seen.limit != sem.limit:
            raise other_limit(self.resource, seen, sem.mode, sem.limit)
        return live, bool(live) and not room(live)

    def hand_on(self, waiting: Plan, ahead: list[records.Waiter], *, gone: bool) -> None:
        """Live waiters are ``ahead`` of us, and (``gone``) the holder seen, whose lease is
        not over, is proven dead (its process ended, on this host): ``waiting`` (busy behind
        them) with the write that hands the lock to the first of them, as its release would
        have. A waiter of another host cannot prove the holder dead: it would wait for the
        lease. Exclusive rows only, as only an exclusive hold hands over."""
        seen = self.seen
        if not gone or seen is None or seen.mode != Mode.EXCLUSIVE or len(seen.holders) != 1:
            return
        now = clock.now_ms()
        heirs = handover.heirs_ahead(ahead, now)
        if not heirs:
            return
        own_lease_ms = self.entry.expires_ms - self.entry.acquired_ms  # for an heir with none
        entries = handover.heir_entries(heirs, self.entry.fence, now, own_lease_ms)
        dead = {token: holder.expires_ms for token, holder in seen.holders.items()}
        mode = Mode.SHARED if heirs[0][1].shared else None
        waiting.hand_on = lock_writes.hand_on(
            self.resource, dead, entries, mode=mode, queue_out=seen.queue_out
        )
        waiting.heirs = heirs

    def take(
        self, live: dict[str, records.Holder], held_now: bool, terms: lock_writes.QueueTerms
    ) -> dict[str, Any]:
        """The take itself: of a row free (or of dead holders), or joining its live holders."""
        mode, limit, seen = self.sem.mode, self.sem.limit, self.seen
        resource, token, entry = self.resource, self.token, self.entry
        if seen is None and mode != Mode.EXCLUSIVE:
            # Counting and shared holds usually find others holding: try to join at once.
            return lock_writes.take_room(resource, token, entry, mode=mode, limit=limit)
        if seen is None or not held_now:
            return lock_writes.take_free(
                resource,
                token,
                entry,
                mode=mode,
                limit=limit,
                stale_ms=self.stale_ms,
                queue=terms,
                permits_row=seen if seen is not None and seen.slots_used is not None else None,
            )
        return lock_writes.take_join(
            resource,
            token,
            entry,
            mode=mode,
            limit=limit,
            seen=seen,
            evict=[t for t in seen.holders if t not in live],
            replace=not live,
            queue=terms,
        )

    def admission(
        self, done: Plan, seen: records.LockItem | None, terms: lock_writes.QueueTerms
    ) -> Plan:
        """``done`` with our admission to a reader item (or its confirmation) as its action."""
        assert seen is not None
        entry = self.entry
        done.action = reader_items.admit(
            self.resource,
            seen=seen,
            token=self.token,
            expires_ms=entry.expires_ms,
            lease_ms=entry.expires_ms - entry.acquired_ms,
            now_ms=entry.acquired_ms,
            stale_ms=self.stale_ms,
            queue=terms,
        )
        done.reader = True
        done.epoch = reader_items.epoch_of(seen, self.stale_ms, entry.acquired_ms)
        return done


def held_if_trusted(
    run: Attempt,
    plans: dict[str, Plan],
    seen: dict[str, records.LockItem | None],
    *,
    sent_mono: float | None,
    push_cap: float | None,
) -> Held | None:
    """The hold, if its trusted deadline (read now) is at least ``run.margin`` ahead; else
    None (then it is confirmed by a renewal first: with less, it would be lost before the
    heartbeat could renew it, its block begun).

    ``sent_mono``: when the write that took (or renewed) the resources with an action
    left (never when its answer came); the others we only saw to be ours, and trust until
    their stored lease end less the skew (a pushed one: nor past ``push_cap``)."""
    sem, lease, skew = run.sem, run.lease, run.skew
    mono, now = clock.monotonic(), clock.now_ms()
    ends = [sent_mono + lease - skew] if sent_mono is not None else []
    for plan in plans.values():
        if sent_mono is None or plan.action is None:
            ends.append(mono + (plan.expires_ms - now) / 1000 - skew)
    if push_cap is not None:
        ends.append(push_cap)
    deadline = min(ends)
    if deadline - mono < run.margin:
        return None
    one = len(sem.resources) == 1
    if telemetry.ON and sent_mono is None and one:
        telemetry.handed_over(sem, seen.get(sem.resources[0]), run.token)
    return hold(
        run,
        {r: p.fence for r, p in plans.items()},
        min(p.expires_ms for p in plans.values()),
        deadline - lease + skew,
        item=seen.get(sem.resources[0]) if one and seen else None,
    )


def hold(
    run: Attempt,
    fences: dict[str, int],
    expires_ms: int,
    sent_mono: float,
    *,
    item: records.LockItem | None = None,
    cls: type[Held] = Held,
    **members: Any,
) -> Held:
    """The hold ``run`` took (:func:`dynasem._engine.hold.acquired`); ``members``: what a
    hold of permits or reader items holds (``slots``, ``epochs``: what it gives back, set
    before a ``lock_acquired`` receiver can raise)."""
    ours = {"token": run.token, "user_id": run.user_id, "lease": run.lease, "skew": run.skew}
    times = {"expires_ms": expires_ms, "sent_mono": sent_mono}
    return acquired(run.sem, item=item, cls=cls, fences=fences, **ours, **times, **members)
