"""Planning one acquire step: from what we last saw of a resource, the write to send for it
(take it, join its holders, confirm a hold we only heard of), or who is in our way, or what
must be read first (who waits ahead of us)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import _clock as clock
from .._observability import telemetry
from .._storage import lock_writes, reader_items, records
from .._storage.records import Mode
from . import queue as queueing
from .hold import Held, acquired
from .lockspec import LockSpec
from .queue import live_holders


class Plan:
    """What to send for one resource next, from what we last saw of it."""

    def __init__(
        self,
        action: dict[str, Any] | None = None,
        *,
        busy: Mapping[str, records.Holder | records.Waiter] | None = None,
        fence: int = 0,
        expires_ms: int = 0,
        queued: bool = False,
        load: int | None = None,
        reader: bool = False,
    ):
        self.action = action  # None with busy None: the resource is ours already
        self.busy = busy  # the live holders in our way, when we cannot take it now
        self.fence = fence
        self.expires_ms = expires_ms
        self.queued = queued  # we are in the resource's queue
        # The queue's entries up to this ticket must be read first: who is ahead of us?
        self.load = load
        # The action admits us to a reader item (dynasem._engine.readers): the item's write follows.
        self.reader = reader


def plan(  # noqa: C901, PLR0912  (issue 41: split)
    sem: LockSpec,
    resource: str,
    seen: records.LockItem | None,
    token: str,
    entry: records.Holder,
    stale_ms: int,
    confirm_below_ms: int,
    ticket: int | None = None,
) -> Plan:
    mode, limit = sem.mode, sem.limit
    if seen is not None and seen.slots_used is not None:
        # Its holders are in permit items (a limit above table.permits.INLINE_MAX): read
        # them; if none is live, the row is ours to take back to holders inline.
        if not seen.permits_read:
            return Plan(load=0, queued=ticket is not None)
        if live_holders(seen, stale_ms):
            raise ValueError(
                f"{resource!r} is held with limit={seen.limit}; every holder of one resource "
                f"must use the same limit, not limit={limit}"
            )
        seen = dataclasses.replace(seen, holders={})  # every permit free or dead
    holders = seen.holders if seen is not None else {}
    if token in holders:
        # Ours already: handed to us, or a write of ours was applied but its response was
        # lost. Trusted only until its stored lease end (less the skew): when that is
        # near, or the caller says so, confirm it with a renewal of our own first.
        mine = holders[token]
        ours = Plan(fence=mine.fence, expires_ms=mine.expires_ms)
        if ours.expires_ms < confirm_below_ms:
            item_ms = seen.expires_ms if seen is not None else 0
            ours.action = lock_writes.renew_hold(
                resource,
                token,
                entry.expires_ms,
                raise_item=item_ms <= entry.expires_ms,
                user_id=entry.user_id,
            )
            ours.expires_ms = entry.expires_ms
        return ours
    stored_fence = seen.fence if seen is not None else 0
    if stored_fence >= entry.fence:
        # Our clock is behind: count on instead.
        entry = dataclasses.replace(entry, fence=stored_fence + 1)
    done = Plan(fence=entry.fence, expires_ms=entry.expires_ms, queued=ticket is not None)
    if mode == Mode.SHARED and reader_items.admitted_before(seen, token, stale_ms):
        # Our admission was applied, its answer lost: confirmed, whoever queued since.
        return _admission(done, resource, seen, token, entry, stale_ms, lock_writes.QueueTerms())
    live = live_holders(seen, stale_ms)
    held_now = seen is not None and bool(holders) and seen.expires_ms >= stale_ms
    if seen is not None and held_now:
        joinable = mode != Mode.EXCLUSIVE and seen.mode == mode and seen.limit == limit
        if live and not (joinable and (mode == Mode.SHARED or len(live) < limit)):
            live = queueing.not_proven_dead(live)  # in our way: a look in /proc (same host)
        if live:
            if seen.limit != limit:
                raise ValueError(
                    f"{resource!r} is held with limit={seen.limit}; every holder of one "
                    f"resource must use the same limit, not limit={limit}"
                )
            if not (joinable and (mode == Mode.SHARED or len(live) < limit)):
                return Plan(busy=live, queued=ticket is not None)
    # Its holders would let us in: nobody cuts in line. A taker not in the queue needs
    # nobody live waiting; a queued one needs nobody live ahead of it.
    items = queueing.entries_ahead(seen, ticket, stale_ms)
    if items is None and seen is not None:
        return Plan(load=queueing.upto_of(seen, ticket), queued=ticket is not None)
    ahead = {w.token: w for w in items or ()}
    if ahead:
        return Plan(busy=live or ahead, queued=ticket is not None)
    terms = lock_writes.QueueTerms(
        mine=ticket,
        queue_in=seen.queue_in if seen is not None else 0,
        queue_out=seen.queue_out if seen is not None else 0,
    )
    if mode == Mode.SHARED and len(sem.resources) == 1 and reader_items.wants_item(seen, live):
        return _admission(done, resource, seen, token, entry, stale_ms, terms)
    if seen is None:
        if mode != Mode.EXCLUSIVE:
            # Counting and shared holds usually find others holding: try to join at once.
            done.action = lock_writes.take_room(resource, token, entry, mode=mode, limit=limit)
        else:
            done.action = lock_writes.take_free(
                resource, token, entry, mode=mode, limit=limit, stale_ms=stale_ms, queue=terms
            )
        return done
    if not held_now:
        done.action = lock_writes.take_free(
            resource,
            token,
            entry,
            mode=mode,
            limit=limit,
            stale_ms=stale_ms,
            queue=terms,
            permits_row=seen if seen.slots_used is not None else None,
        )
        return done
    done.action = lock_writes.take_join(
        resource,
        token,
        entry,
        mode=mode,
        limit=limit,
        seen=seen,
        evict=[t for t in holders if t not in live],
        replace=not live,
        queue=terms,
    )
    return done


def _admission(
    done: Plan,
    resource: str,
    seen: records.LockItem | None,
    token: str,
    entry: records.Holder,
    stale_ms: int,
    terms: lock_writes.QueueTerms,
) -> Plan:
    """``done`` with our admission to a reader item (or its confirmation) as its action."""
    assert seen is not None
    done.action = reader_items.admit(
        resource,
        seen=seen,
        token=token,
        expires_ms=entry.expires_ms,
        lease_ms=entry.expires_ms - entry.acquired_ms,
        now_ms=entry.acquired_ms,
        stale_ms=stale_ms,
        queue=terms,
    )
    done.reader = True
    return done


def held_if_trusted(
    sem: LockSpec,
    plans: dict[str, Plan],
    seen: dict[str, records.LockItem | None],
    *,
    token: str,
    user_id: str,
    lease: float,
    skew: float,
    sent_mono: float | None,
    push_cap: float | None,
    margin: float,
) -> Held | None:
    """The hold, if its trusted deadline (read now) is at least ``margin`` ahead; else None
    (then it is confirmed by a renewal first: with less, it would be lost before the
    heartbeat could renew it, its block begun).

    ``sent_mono``: when the write that took (or renewed) the resources with an action
    left (never when its answer came); the others we only saw to be ours, and trust until
    their stored lease end less the skew (a pushed one: nor past ``push_cap``)."""
    mono, now = clock.monotonic(), clock.now_ms()
    ends = [sent_mono + lease - skew] if sent_mono is not None else []
    for plan in plans.values():
        if sent_mono is None or plan.action is None:
            ends.append(mono + (plan.expires_ms - now) / 1000 - skew)
    if push_cap is not None:
        ends.append(push_cap)
    deadline = min(ends)
    if deadline - mono < margin:
        return None
    if telemetry.ON and sent_mono is None and len(sem.resources) == 1:
        telemetry.handed_over(sem, seen.get(sem.resources[0]), token)
    return acquired(
        sem,
        token=token,
        user_id=user_id,
        fences={r: p.fence for r, p in plans.items()},
        lease=lease,
        skew=skew,
        expires_ms=min(p.expires_ms for p in plans.values()),
        sent_mono=deadline - lease + skew,
        item=seen.get(sem.resources[0]) if len(sem.resources) == 1 and seen else None,
    )
