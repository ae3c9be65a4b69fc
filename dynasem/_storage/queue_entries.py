"""The queue's entry items (one per waiter, ``sk = q#<qbase>#<ticket>``): putting and dropping
ours, leaving the queue, and reading the entries ahead of a ticket page by page."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import _clock as clock
from . import dynamodb, lock_rows, lock_writes
from .records import LockItem, Waiter, entry_item, entry_sk, from_item

# Entry items one query of the queue reads (a page): the first live one is usually the first.
ENTRY_PAGE = 8


def put_entry(resource: str, queue_id: int, waiter: Waiter) -> None:
    """Write our queue entry (its ticket drawn by :func:`take_ticket`): an item of its own,
    so that a crowd of waiters never makes a write to the row dearer."""
    dynamodb.send_to_table("put_item", Item=entry_item(resource, queue_id, waiter))


def drop_entry(resource: str, queue_id: int, ticket: int) -> None:
    """Mark our queue entry dead (we leave the queue): a hand-over then passes us. Not a
    delete: a ticket with no entry may be a waiter whose entry is still on its way, which
    nobody passes at once (:data:`JOIN_GRACE`); a dead entry is passed without a wait. The
    same unit as a delete; the entry goes with its TTL as a served one does."""
    lock_rows.update(lock_writes.mark_left(resource, queue_id, ticket, clock.now_ms()))


# After leaving the queue while another holds, how long until we look again whether a
# hand-over to us was on its way (seconds): a releaser reads the queue, then writes.
LEAVE_RECHECK = 0.05


def leave_queue(resource: str, queue_id: int, ticket: int, *, token: str) -> LockItem | None:
    """Leave the queue: delete our entry, then read the row (consistently): a hand-over that
    found our entry before it went may have made us the holder; the caller keeps that hold or
    gives it back. While another holds it, a hand-over may still be on its way (the releaser
    read the queue before we left, and has not written yet): we look once more a little
    later."""
    drop_entry(resource, queue_id, ticket)
    row = lock_rows.get(resource)
    if may_be_handed(row, queue_id, ticket, token):
        time.sleep(LEAVE_RECHECK)
        row = lock_rows.get(resource)
    return row


def may_be_handed(row: LockItem | None, queue_id: int, ticket: int, token: str) -> bool:
    """Could a hand-over to the waiter ``token`` (ticket ``ticket`` of the queue ``qbase``)
    that left still land, as far as ``row`` (read after it left) tells? Only if someone
    holds (a holder hands over in its release write) and its turn has not gone by: the
    releaser may have read the line before it left, or read it eventually consistently."""
    if row is None or token in row.holders or not row.holders:
        return False
    return row.queue_id == queue_id and row.queue_out < ticket


def _entry_page(
    item: LockItem, upto: int, limit: int | None, start: dict[str, Any] | None, consistent: bool
) -> tuple[list[Waiter], dict[str, Any] | None]:
    """One page of the entry items of ``item``'s queue, tickets ``qout`` + 1 to ``upto``
    (``consistent`` but once: the entries a waiter or a releaser decides from must be current;
    see :func:`dynasem._engine.handover.heirs_of` for the one read that need not be)."""
    lo, hi = entry_sk(item.queue_id, item.queue_out + 1), entry_sk(item.queue_id, upto)
    values = {":pk": item.resource, ":lo": lo, ":hi": hi}
    condition = "#pk = :pk AND #sk BETWEEN :lo AND :hi"
    request = {"ConsistentRead": consistent, "KeyConditionExpression": condition}
    items, last = dynamodb.page("query", limit, start, values=values, **request)
    return [from_item(Waiter, entry) for entry in items], last


def queue_entries(item: LockItem, most: int | None = None) -> list[Waiter]:
    """Every entry item of ``item``'s queue that has not had its turn (``qout`` + 1 to
    ``qin``), dead ones included, in ticket order: for listings, never for a decision.
    ``most``: the first that many only."""
    found: list[Waiter] = []
    start = None
    while item.queue_in > item.queue_out and (most is None or len(found) < most):
        page, start = _entry_page(item, item.queue_in, most and most - len(found), start, True)
        found += page
        if not start:
            break
    return found


def load_entries(
    item: LockItem,
    upto: int | None = None,
    *,
    consistent: bool = True,
    known: Callable[[], Iterable[Waiter]] | None = None,
) -> LockItem:
    """``item`` with the entry items of its queue read, from ``qout`` + 1 up to ``upto``
    (default: ``qin``), page by page until the first live one (a lease end at or after now):
    the waiters before it are dead or gone, and whoever decides from it needs to know no
    more. An item with nobody waiting is returned as it is. ``consistent=False``: an
    eventually consistent read (half the read units), which may miss an entry put or show
    one deleted in the last moments.

    A consistent read that finds a ticket before the first live entry with no entry at all
    reads again, after growing pauses, until that ticket has been missing for
    :data:`JOIN_GRACE`: its waiter draws the ticket and puts its entry in two writes, and
    whoever decides from a read taken between them would pass it (serve a later ticket
    first). A ticket still missing then is passed: its waiter died between the two writes,
    or its entry ran out long ago and TTL took it (a waiter that leaves marks its entry dead
    instead, :func:`drop_entry`).

    ``known``: the waiters a holder heard of by their word (asked again at each read): each
    stands in for its entry where the read found none, as a waiter that told the holder puts
    its entry only if it is still waiting a while later (``queue.ENTRY_DEFER``)."""
    upto = item.queue_in if upto is None else upto
    if upto <= item.queue_out:
        return dataclasses.replace(item, entries=(), entries_to=upto)
    pause, until = JOIN_PAUSE, None
    while True:
        read = _read_entries(item, upto, consistent)
        if known is not None:
            read = _with_known(read, known())
        wait = _young_gap(read) if consistent else 0.0
        now = clock.monotonic()
        until = now + wait if until is None else until  # no longer than its first read says
        wait = min(wait, until - now)
        if wait <= 0:
            return read
        time.sleep(min(pause, wait))
        pause *= 2


# How long a drawn ticket may show no entry item before a consistent read passes it (seconds,
# on our monotonic clock): its waiter puts the entry right after the draw's answer, one
# request later, or a few of botocore's retries later when throttled. The first re-read
# comes JOIN_PAUSE after the gap was seen, each next one twice as late.
JOIN_GRACE = 1.0
JOIN_PAUSE = 0.02
# When tickets were first seen missing, per queue ((resource, qbase)): (monotonic, ticket)
# pairs, oldest first, tickets growing: at that time a read found no entry for that ticket
# (and for every missing one below it). The last few pairs of the last many queues only:
# a pair forgotten makes a wait again, never a pass sooner.
_missing: dict[tuple[str, int], list[tuple[float, int]]] = {}
MISSING_QUEUES = 4096
MISSING_PAIRS = 16


def _read_entries(item: LockItem, upto: int, consistent: bool) -> LockItem:
    now = clock.now_ms()
    found: list[Waiter] = []
    start = None
    while True:
        page, start = _entry_page(item, upto, ENTRY_PAGE, start, consistent)
        found += page
        if not start or any(w.expires_ms >= now for w in page):
            break
    covered = found[-1].ticket if start else upto
    return dataclasses.replace(item, entries=tuple(found), entries_to=covered, entries_read_ms=now)


def _with_known(read: LockItem, known: Iterable[Waiter]) -> LockItem:
    """``read`` with the ``known`` waiters whose tickets it covers and found no entry for."""
    there = {w.ticket for w in read.entries or ()}
    more = {
        w.ticket: w
        for w in known
        if read.queue_out < w.ticket <= read.entries_to and w.ticket not in there
    }
    if not more:
        return read
    entries = sorted((*(read.entries or ()), *more.values()), key=lambda w: w.ticket)
    return dataclasses.replace(read, entries=tuple(entries))


def _young_gap(read: LockItem) -> float:
    """How long until every ticket ``read`` shows with no entry before its first live one
    has been missing :data:`JOIN_GRACE` (0: none is younger). The highest missing ticket
    decides: every read that found it missing found those below it missing too (an entry,
    once put, stays until long after its lease: a leaver marks it dead), so they have been
    missing at least as long."""
    now_ms, now = clock.now_ms(), clock.monotonic()
    entries = read.entries or ()
    live = next((w.ticket for w in entries if w.expires_ms >= now_ms), read.entries_to + 1)
    there = {w.ticket for w in entries}
    highest = next((t for t in range(live - 1, read.queue_out, -1) if t not in there), None)
    if highest is None:
        return 0.0
    if len(_missing) > MISSING_QUEUES:
        _missing.clear()
    pairs = _missing.setdefault((read.resource, read.queue_id), [])
    if not pairs or pairs[-1][1] < highest:
        pairs.append((now, highest))
        del pairs[:-MISSING_PAIRS]
    since = next(seen for seen, ticket in pairs if ticket >= highest)
    return since + JOIN_GRACE - now
