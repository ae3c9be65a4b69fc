"""Readers in reader items (:mod:`dynasem._storage.reader_items`): when a shared acquire takes an
item instead of joining the row's holders, what it does once the row admitted it (its item,
its trust), and the write-off of dead readers by a writer that waits on them."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from .. import _clock as clock
from .._storage import (
    dynamodb,
    lock_rows,
    lock_writes,
    permit_items,
    queue_entries,
    reader_items,
    records,
)
from ..conf import settings
from ..exceptions import SemaphoreUnavailable
from . import handover, permit_hold, permits, processes, queue, reader_hold, take
from .hold import Held
from .lockspec import Attempt, LockSpec
from .steps import Request, Sleep, Steps, Write

# Tries of a reader item's write that failed in transit (the same write again is harmless).
ITEM_TRIES = 4
# Rows a process remembers seeing unchanged while it waits to write their readers off.
MAX_WATCHED = 1024
# A row of at most this many readers counted is looked at once as soon as it holds a writer
# up (its readers may all be proven dead on this host); a larger one only after a lease.
FEW = 16
# (table, resource, epoch, fence, rc) -> when a look is due (the row unchanged for a lease),
# and the early look (FEW), monotonic seconds. The table too: the same row on another table
# (a test's own, after TABLE_NAME changed) is another row, not one seen unchanged since.
_watched: dict[tuple[str, str, int, int, int], tuple[float, float]] = {}
# When (monotonic) a look first found a row of readers at its (epoch, fence): every join moves
# the fence, a count-down does not; the write-off's wait runs from here through count-downs
# (a reader leaving extends no hold; simulation seed 2009: a wait restarted by each one).
_since: dict[tuple[str, str, int, int], float] = {}


def _key(seen: records.LockItem) -> tuple[str, str, int, int, int]:
    """What :data:`_watched` knows ``seen`` by: its table, resource, epoch, fence and count."""
    return (settings.TABLE_NAME, seen.resource, seen.reader_epoch, seen.fence, seen.reader_count)


def admitted(
    run: Attempt, row: records.LockItem, *, expires_ms: int, now_ms: int, sent_mono: float
) -> Steps[Held | None]:
    """The row admitted us (``row``: as our write left it): our item, trusted until
    ``lease - skew`` after that write left. None: less than ``margin`` of that was left
    once the item was written (its answer, or the admission's, came late): given back, to
    be admitted again; or the item's write was refused, an operator (or the reaper) having
    broken it between a send of it that was applied and the next (its answer lost): the
    break counted us down, and we are admitted again (as a refused take plans again). A
    renewal could not confirm it: an item written after its epoch was written off would
    renew as well, and claims nothing."""
    resource, token = row.resource, run.token
    holder = lock_writes.holder_entry(run.user_id, expires_ms, row.fence, now_ms, True, run.proc)
    undo = functools.partial(
        reader_hold.undo,
        resource,
        row.reader_epoch,
        token,
        counted=sent_mono,
        skew=run.skew,
        fence=row.fence,
    )
    action = reader_items.put_reader(resource, token, holder, row.reader_epoch)
    failures, resent = 0, list[bool]()
    while True:
        try:
            send = functools.partial(reader_items.send, action, resent=resent)
            yield Write(send, token, [], undo=undo)
            if any(resent):  # botocore sent it again: a try may still land
                run.stray.add(resource)
            break
        except dynamodb.Refused as refused:
            if refused.retried:  # an earlier try may still land
                run.stray.add(resource)
            # Broken meanwhile (a tombstone of our fence): no hold. Our mark off the row
            # first, or the next plan would confirm the admission the break counted down.
            yield Request(
                functools.partial(reader_hold.forget_admission, resource, row.reader_epoch, token)
            )
            return None
        except SemaphoreUnavailable as exc:
            failures += 1
            if exc.ambiguous:  # a try may still land, whatever comes of this admission
                run.stray.add(resource)
            if not exc.transient or failures >= ITEM_TRIES:
                yield Request(undo)
                raise
            yield Sleep(queue.backoff(failures))
    if sent_mono + run.lease - run.skew - clock.monotonic() < run.margin:
        yield Request(undo)
        return None
    reader_hold.remember(row)
    item = dataclasses.replace(row, entries=None)
    members = {
        "epochs": {resource: row.reader_epoch},
        "covers": {resource: row.holders[reader_items.SENTINEL].expires_ms},
        # A try of an item's write of ours may still be on its way: the release bars it.
        "late": run.stray & {resource},
    }
    fences = {resource: row.fence}
    return take.hold(
        run, fences, expires_ms, sent_mono, item=item, cls=reader_hold.ReaderHeld, **members
    )


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
    a crowd of writers behind them does not read them at every change). The row is watched
    from the first look that finds the readers among those in the way: an inline holder
    lapsing beside them leaves the row as it was."""
    if seen is None or reader_items.SENTINEL not in blocking or seen.guessed:
        return False
    first = not seen.waiting if ticket is None else seen.queue_out >= ticket - 1
    key = _key(seen)
    mono = clock.monotonic()
    if key not in _watched:
        if len(_watched) >= MAX_WATCHED:
            _watched.clear()
            _since.clear()
        early = mono if seen.reader_count <= FEW and first else math.inf
        since = _since.setdefault(key[:4], mono)
        # Every admission stamps the sentinel with its time: none came since (on the
        # admitter's clock, within CLOCK_SKEW of ours), however late our first look was (a
        # writer whose requests failed for a while; simulation seed 387).
        sentinel = seen.holders.get(reader_items.SENTINEL)
        if sentinel is not None and sentinel.acquired_ms:
            stamped = mono + (sentinel.acquired_ms + skew * 1000 - clock.now_ms()) / 1000
            since = min(since, stamped)
        _watched[key] = (since + seen.reader_lease_ms / 1000 + skew, early)
    due, early = _watched[key]
    return set(blocking) == {reader_items.SENTINEL} and mono >= min(due, early)


def write_off_at(seen: records.LockItem | None) -> float | None:
    """When (monotonic) a write-off of ``seen``'s readers falls due, if a look has started
    watching it (:func:`write_off_due`) and that is still ahead: a writer asleep in line
    looks again then, not at a renewal of its entry later."""
    if seen is None:
        return None
    watched = _watched.get(_key(seen))
    return watched[0] if watched is not None and watched[0] > clock.monotonic() else None


def try_write_off(seen: records.LockItem | None, skew: float) -> records.LockItem | None:
    """Write off ``seen``'s readers if none of its epoch is live (read consistently now);
    each dead one's item is deleted first (a reader that renewed meanwhile refuses it).
    Before the row has sat unchanged for a lease, only if every reader counted has an item
    (none can be on its way) and each was proven dead. Returns the row as it is now (or as
    the refusal showed it)."""
    if seen is None:
        return None
    resource = seen.resource
    key = _key(seen)
    due, _ = _watched.get(key, (0.0, math.inf))
    _watched[key] = (due, math.inf)  # the early look is had
    now = clock.now_ms()
    stale = now - int(skew * 1000)
    found = [r for r in reader_items.readers(resource) if r.epoch == seen.reader_epoch]
    live = [r for r in found if r.holder.expires_ms >= stale and not processes.gone(r.holder.proc)]
    if live:
        # Not all dead: the next look is due when the first of the live ones may be (its
        # lease end as read, and the skew). Due again at once, a writer behind readers that
        # hold on would read their items in a loop, past its own wait.
        first_end = min(r.holder.expires_ms for r in live)
        _watched[key] = (clock.monotonic() + (first_end - now) / 1000 + skew, math.inf)
        return seen
    if clock.monotonic() < due and len(found) != seen.reader_count:
        return seen
    for reader in found:
        try:
            reader_items.drop_reader(resource, reader.token, reader.holder.expires_ms)
        except dynamodb.Refused:
            return lock_rows.get(resource)  # it renewed: alive after all
    _watched.pop(key, None)
    _since.pop(key[:4], None)
    try:
        after = lock_rows.update(reader_items.write_off(resource, seen), return_new=True)
    except dynamodb.Refused as refused:
        after = refused.lock
    else:
        if after is not None:
            # As the last reader's count-down does: the first in line may be a writer asleep
            # until a push or its next look, seconds away (simulation seed 20001, readers).
            handover.push_first(resource, after, readers_only=False)
    reader_hold.remember(after)
    return after


def last_seen(sem: LockSpec) -> dict[str, records.LockItem | None]:
    """A shared acquire's first view of its resource: the row as this process last saw it
    with reader items (its first write then is an admission), else nothing (a join)."""
    if sem.mode != records.Mode.SHARED or len(sem.resources) != 1:
        return {}
    seen = reader_hold.rows.get(sem.resources[0])
    return {} if seen is None else {seen.resource: seen}


def items_for(sem: LockSpec, seen: Mapping[str, records.LockItem | None], stale_ms: int) -> bool:
    """Whether a shared acquire of several resources takes reader items (in each of them):
    when any of its rows, as seen, would give a reader of that resource alone an item."""
    if sem.mode != records.Mode.SHARED or len(sem.resources) < 2:
        return False
    return any(
        reader_items.wants_item(row, queue.live_holders(row, stale_ms)) for row in seen.values()
    )


def acquire_many(run: Attempt) -> Steps[Held]:
    """Readers of several resources in reader items, all or none: read the rows, then one
    transaction of an admission (a named fence: a transaction returns nothing) and an item
    for each. No queue (as for any multi-resource take); nobody waiting may be passed.
    Trusted from the transaction's send: with less than ``margin`` of that left at its
    answer, given back and taken again (``permits.MAX_LATE`` times past the wait: too
    slow)."""
    read = functools.partial(permits.read_row, run)
    admissible = functools.partial(_admissible, run)
    admissions = functools.partial(_admissions, run)
    return (yield from permits.all_or_none(run, read, admissible, admissions))


def _admissible(
    run: Attempt, seen: dict[str, records.LockItem], stale: int, pace: queue.Pace
) -> Steps[tuple[dict[str, records.LockItem], dict[str, queue.Blocking]]]:
    """The rows a reader may be admitted to now (their queues read, if waited on), and who
    is in the way in the others. A throttled read is no news (issue 40)."""
    blocked: dict[str, queue.Blocking] = {}
    rows: dict[str, records.LockItem] = {}
    for r, row in seen.items():
        if row.slots_used is not None and not row.permits_read:
            # A counting semaphore's permit row: its permits read and, none live, fenced
            # out, before readers take it, as any other mode does (core's plans alike).
            fenced = functools.partial(permit_items.fenced_permits, row, stale)
            row = yield from queue.patient_read(fenced, row, pace, run.deadline)
            if not row.permits_read:  # still throttled: who holds is not known
                blocked[r] = {}
                continue
        live = queue.live_holders(row, stale)
        if live and (row.mode != records.Mode.SHARED or row.slots_used is not None):
            blocked[r] = live
            continue
        if row.waiting:
            read = functools.partial(queue_entries.load_entries, row)
            row = yield from queue.patient_read(read, row, pace, run.deadline)
            ahead = queue.entries_ahead(row, None, stale)
            if ahead is None or ahead:  # None: still throttled, who waits is not known
                blocked[r] = {w.token: w for w in ahead or ()}
                continue
        rows[r] = row
    return rows, blocked


def _admissions(
    run: Attempt, rows: dict[str, records.LockItem], now: int, stale: int
) -> tuple[list[dict[str, Any]], Callable[[], None], permits.Finish]:
    """The transaction's actions (an admission and an item for each), the undo of what it
    may have admitted, and what makes the hold of it once applied."""
    lease_ms = int(run.lease * 1000)
    expires = now + lease_ms
    actions, epochs, fences = [], {}, {}
    for r, row in rows.items():
        fences[r] = max(clock.new_fence(run.skew), row.fence + 1)
        epochs[r] = reader_items.epoch_of(row, stale, now)
        terms = lock_writes.QueueTerms(queue_in=row.queue_in, queue_out=row.queue_out)
        admission = reader_items.admit(
            r,
            seen=row,
            token=run.token,
            expires_ms=expires,
            lease_ms=lease_ms,
            now_ms=now,
            stale_ms=stale,
            queue=terms,
            fence=fences[r],
            limit=run.sem.limit,
            user_id=run.user_id,
        )
        holder = run.holder(now, fences[r], shared=True)
        actions += [admission, reader_items.put_reader(r, run.token, holder, epochs[r])]
    # Unanswered, the transaction may not have been applied: a reader it may not have
    # counted is not counted down on a doubt (reader_hold.undo's ``counted``).
    undo = functools.partial(permit_hold.undo_many, epochs, run.token, reader_hold.undo)

    def finish(expires_ms: int, sent_mono: float) -> Steps[Held | None]:
        if sent_mono + run.lease - run.skew - clock.monotonic() < run.margin:
            # Paused or answered late, near its trust's end: given back (counted, as
            # applied), and taken again.
            counted = functools.partial(reader_hold.undo, counted=sent_mono, skew=run.skew)
            yield Request(functools.partial(permit_hold.undo_many, epochs, run.token, counted))
            permits.count_late(run, run.sem.resources[0])
            return None
        covers = {r: reader_items.covers_to(expires_ms, row) for r, row in rows.items()}
        cls = reader_hold.ReaderHeld
        return take.hold(run, fences, expires_ms, sent_mono, cls=cls, epochs=epochs, covers=covers)

    return actions, undo, finish
