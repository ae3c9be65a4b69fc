"""Readers in reader items (:mod:`dynasem._storage.reader_items`): when a shared acquire takes an
item instead of joining the row's holders, what it does once the row admitted it (its item,
its trust), and the write-off of dead readers by a writer that waits on them."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

from .. import _clock as clock
from .._observability import telemetry
from .._storage import dynamodb, lock_rows, lock_writes, queue_entries, records
from .._storage import reader_items as items
from .._storage.records import Mode
from ..exceptions import SemaphoreUnavailable
from . import permits, processes
from . import queue as queueing
from . import reader_hold as reader_held
from .hold import Held, acquired
from .lockspec import LockSpec
from .queue import backoff, busy, seconds_until_free, too_slow
from .steps import Request, Sleep, Steps, Write

# Tries of a reader item's write that failed in transit (the same write again is harmless).
ITEM_TRIES = 4
# Rows a process remembers seeing unchanged while it waits to write their readers off.
MAX_WATCHED = 1024
# A row of at most this many readers counted is looked at once as soon as it holds a writer
# up (its readers may all be proven dead on this host); a larger one only after a lease.
FEW = 16
# (resource, epoch, fence, rc) -> when a look is due (the row unchanged for a lease), and
# the early look (FEW), monotonic seconds.
_watched: dict[tuple[str, int, int, int], tuple[float, float]] = {}


def admitted(
    sem: LockSpec,
    row: records.LockItem,
    *,
    token: str,
    user_id: str,
    proc: str | None,
    expires_ms: int,
    now_ms: int,
    sent_mono: float,
    lease: float,
    skew: float,
    margin: float,
) -> Steps[Held | None]:
    """The row admitted us (``row``: as our write left it): our item, trusted until
    ``lease - skew`` after that write left. None: less than ``margin`` of that was left
    once the item was written (its answer, or the admission's, came late): given back, to
    be admitted again. A renewal could not confirm it: an item written after its epoch was
    written off would renew as well, and claims nothing."""
    resource = row.resource
    holder = lock_writes.holder_entry(user_id, expires_ms, row.fence, now_ms, True, proc)
    undo = functools.partial(reader_held.undo, resource, token, row.reader_epoch)
    action = items.put_reader(resource, token, holder, row.reader_epoch)
    failures = 0
    while True:
        try:
            yield Write(functools.partial(items.send, action), token, [], undo=undo)
            break
        except SemaphoreUnavailable as exc:
            failures += 1
            if not exc.transient or failures >= ITEM_TRIES:
                yield Request(undo)
                raise
            yield Sleep(backoff(failures))
    if sent_mono + lease - skew - clock.monotonic() < margin:
        yield Request(undo)
        return None
    reader_held.remember(row)
    held = acquired(
        sem,
        token=token,
        user_id=user_id,
        fences={resource: row.fence},
        lease=lease,
        skew=skew,
        expires_ms=expires_ms,
        sent_mono=sent_mono,
        item=dataclasses.replace(row, entries=None),
        cls=reader_held.ReaderHeld,
    )
    assert isinstance(held, reader_held.ReaderHeld)
    held.covers = {resource: row.holders[items.SENTINEL].expires_ms}
    held.epochs = {resource: row.reader_epoch}
    return held


def write_off_due(
    seen: records.LockItem | None,
    blocking: Mapping[str, object],
    skew: float,
    ticket: int | None = None,
) -> bool:
    """Whether a writer held up only by ``seen``'s reader items may look whether they are all
    dead: once it has seen the row unchanged for the epoch's longest lease and the skew; or,
    first in line (``ticket``: ours, if we are queued), at once, one look per state of a row
    of a few readers (all of whom may be proven dead on this host before their leases end;
    a crowd of writers behind them does not read them at every change)."""
    if seen is None or set(blocking) != {items.SENTINEL} or seen.guessed:
        return False
    first = not seen.waiting if ticket is None else seen.queue_out >= ticket - 1
    key = (seen.resource, seen.reader_epoch, seen.fence, seen.reader_count)
    mono = clock.monotonic()
    if key not in _watched:
        if len(_watched) >= MAX_WATCHED:
            _watched.clear()
        early = mono if seen.reader_count <= FEW and first else math.inf
        _watched[key] = (mono + seen.reader_lease_ms / 1000 + skew, early)
    due, early = _watched[key]
    return mono >= min(due, early)


def try_write_off(seen: records.LockItem | None, skew: float) -> records.LockItem | None:
    """Write off ``seen``'s readers if none of its epoch is live (read consistently now);
    each dead one's item is deleted first (a reader that renewed meanwhile refuses it).
    Before the row has sat unchanged for a lease, only if every reader counted has an item
    (none can be on its way) and each was proven dead. Returns the row as it is now (or as
    the refusal showed it)."""
    if seen is None:
        return None
    resource = seen.resource
    key = (resource, seen.reader_epoch, seen.fence, seen.reader_count)
    due, _ = _watched.get(key, (0.0, math.inf))
    _watched[key] = (due, math.inf)  # the early look is had
    now = clock.now_ms()
    stale = now - int(skew * 1000)
    found = [r for r in items.readers(resource) if r.epoch == seen.reader_epoch]
    live = [r for r in found if r.holder.expires_ms >= stale and not processes.gone(r.holder.proc)]
    if live or (clock.monotonic() < due and len(found) != seen.reader_count):
        return seen
    for reader in found:
        try:
            items.delete(items.drop_reader(resource, reader.token, reader.holder.expires_ms))
        except dynamodb.Refused:
            return lock_rows.get(resource)  # it renewed: alive after all
    _watched.pop(key, None)
    try:
        after = lock_rows.update(items.write_off(resource, seen), return_new=True)
    except dynamodb.Refused as refused:
        after = refused.lock
    reader_held.remember(after)
    return after


def last_seen(sem: LockSpec) -> dict[str, records.LockItem | None]:
    """A shared acquire's first view of its resource: the row as this process last saw it
    with reader items (its first write then is an admission), else nothing (a join)."""
    if sem.mode != Mode.SHARED or len(sem.resources) != 1:
        return {}
    seen = reader_held.rows.get(sem.resources[0])
    return {} if seen is None else {seen.resource: seen}


def items_for(sem: LockSpec, seen: Mapping[str, records.LockItem | None], stale_ms: int) -> bool:
    """Whether a shared acquire of several resources takes reader items (in each of them):
    when any of its rows, as seen, would give a reader of that resource alone an item."""
    if sem.mode != Mode.SHARED or len(sem.resources) < 2:
        return False
    return any(items.wants_item(row, queueing.live_holders(row, stale_ms)) for row in seen.values())


def acquire_many(  # noqa: C901, PLR0912, PLR0915  (issue 41: split)
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
    """Readers of several resources in reader items, all or none: read the rows, then one
    transaction of an admission (a named fence: a transaction returns nothing) and an item
    for each. No queue (as for any multi-resource take); nobody waiting may be passed.
    Trusted from the transaction's send: with less than ``margin`` of that left at its
    answer, given back and taken again (``permits.MAX_LATE`` times past the wait: too
    slow)."""
    resources = sem.resources
    if len(resources) * 2 > records.MAX_TRANSACTION:
        raise ValueError(
            f"at most {records.MAX_TRANSACTION // 2} resources can be read at once among many "
            f"readers (DynamoDB's transaction limit of {records.MAX_TRANSACTION} actions: two "
            f"each), not {len(resources)}"
        )
    lease_ms, skew_ms = int(lease * 1000), int(skew * 1000)
    deadline = clock.monotonic() + wait
    sleeps = failures = late = 0
    while True:
        seen: dict[str, records.LockItem | None] = {}
        for r in resources:
            seen[r] = (yield Request(functools.partial(lock_rows.get, r))) or records.LockItem(
                resource=r
            )
        stale = clock.now_ms() - skew_ms
        blocked: dict[str, Mapping[str, records.Holder | records.Waiter]] = {}
        rows: dict[str, records.LockItem] = {}
        for r in resources:
            row = seen[r] or records.LockItem(resource=r)
            live = queueing.live_holders(row, stale)
            if live and (row.mode != Mode.SHARED or row.slots_used is not None):
                blocked[r] = live
                continue
            if row.waiting:
                row = yield Request(functools.partial(queue_entries.load_entries, row))
                ahead = {w.token: w for w in queueing.entries_ahead(row, None, stale) or ()}
                if ahead:
                    blocked[r] = ahead
            rows[r] = row
        if not blocked:
            # The lease runs from here, after the reads above (they may have been slow).
            sent_mono, now = clock.monotonic(), clock.now_ms()
            expires = now + lease_ms
            actions, epochs, fences = [], {}, {}
            for r, row in rows.items():
                fences[r] = max(clock.new_fence(skew), row.fence + 1)
                epochs[r] = items.epoch_of(row, stale, now)
                terms = lock_writes.QueueTerms(queue_in=row.queue_in, queue_out=row.queue_out)
                actions.append(
                    items.admit(
                        r, seen=row, token=token, expires_ms=expires, lease_ms=lease_ms,
                        now_ms=now, stale_ms=stale, queue=terms, fence=fences[r],
                        limit=sem.limit, user_id=user_id,
                    )
                )  # fmt: skip
                holder = lock_writes.holder_entry(user_id, expires, fences[r], now, True, proc)
                actions.append(items.put_reader(r, token, holder, epochs[r]))
            undo = functools.partial(reader_held.undo_many, epochs, token)
            again = yield from permits.all_or_none(actions, token, undo, deadline, failures)
            if again is not None:
                failures = again
                continue
            if sent_mono + lease - skew - clock.monotonic() < margin:
                yield Request(undo)  # paused or answered late, near its trust's end: again
                late += 1
                if late >= permits.MAX_LATE and clock.monotonic() >= deadline:
                    raise too_slow(sem.resources[0], lease, skew)
                continue
            held = acquired(
                sem,
                token=token,
                user_id=user_id,
                fences=fences,
                lease=lease,
                skew=skew,
                expires_ms=expires,
                sent_mono=sent_mono,
                item=None,
                cls=reader_held.ReaderHeld,
            )
            assert isinstance(held, reader_held.ReaderHeld)
            held.covers = {r: items.covers_to(expires, row) for r, row in rows.items()}
            held.epochs = epochs
            return held
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            raise busy(sem, blocked, seen, skew=skew, user_id=user_id, token=token)
        sleeps += 1
        if telemetry.ON:
            telemetry.waiting()  # the span's wait event, once (core's loop may have sent it)
        until_free = seconds_until_free(blocked, skew)
        yield Sleep(max(0.0, min(backoff(sleeps), until_free + 0.005, remaining)))
