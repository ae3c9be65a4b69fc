"""Who comes after a releasing holder: the heirs a hand-over makes holders, what a release
that has none must say about the queue, and the push that tells the first waiter."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from .. import _clock as clock
from .._storage import lock_writes, queue_entries, records
from ..exceptions import SemaphoreUnavailable
from . import processes, push

# The most readers one hand-over admits together: each adds an entry to the row (and to the
# push that carries it), and no more than the row keeps inline (lock_writes.READERS_INLINE:
# past them, every write of a crowd's reader items would pay for a row over 1 KB). Readers
# beyond are let in by those admitted (``push_first``), into reader items.
MAX_ADMIT = 16


def max_admit() -> int:
    return min(MAX_ADMIT, max(1, lock_writes.READERS_INLINE))


Heirs = list[tuple[str, records.Waiter]]


def next_in_line(row: records.LockItem, now_ms: int) -> Heirs:
    """Who takes the lock next, first come first served among the live waiters of ``row``'s
    queue entries: the first one if it is exclusive; else every reader at the head of the
    line, up to the first exclusive waiter (and at most :func:`max_admit`): shared holders
    hold together. A run of readers stops at a ticket with no entry (its waiter's entry not
    put yet, queue.ENTRY_DEFER): admitting the readers after it would pass it."""
    entries = row.entries or ()
    tickets = {w.ticket for w in entries}
    live = [w for w in entries if w.expires_ms > now_ms]
    heirs: Heirs = []
    for waiter in sorted(live, key=lambda w: (w.ticket, w.token)):
        if heirs and not waiter.shared:
            break
        if heirs and any(t not in tickets for t in range(heirs[-1][1].ticket + 1, waiter.ticket)):
            break
        heirs.append((waiter.token, waiter))
        if not waiter.shared or len(heirs) >= max_admit():
            break
    return heirs


def heirs_ahead(ahead: list[records.Waiter], now_ms: int) -> Heirs:
    """The heirs of a lock whose holders are all gone, among the waiters ``ahead`` of a
    waiter that proved them dead (the live entries it read up to its own ticket,
    ``queue.entries_ahead``), as :func:`next_in_line` makes them; none unless the first of
    them is the first heir, and none of them is a process of this host proven ended (a
    read that stopped at such an entry shows it live)."""
    if not ahead:
        return []
    heirs = next_in_line(dataclasses.replace(records.LockItem(), entries=tuple(ahead)), now_ms)
    first = min(w.ticket for w in ahead)
    if not heirs or heirs[0][1].ticket != first:
        return []
    if any(processes.gone(waiter.proc) for _, waiter in heirs):
        return []
    return heirs


def heir_entries(
    heirs: Heirs, fence: int, now_ms: int, lease_ms: int
) -> list[tuple[str, int, records.Holder]]:
    """The holder entries a hand-over writes for ``heirs`` (token, ticket, entry): each with
    its waiter's lease (``lease_ms`` for one that did not record its own) from ``now_ms``,
    and a fence of its own from ``fence`` up."""
    entries = []
    for i, (token, waiter) in enumerate(heirs):
        lease = waiter.lease_ms if waiter.lease_ms is not None else lease_ms
        entry = lock_writes.holder_entry(
            waiter.user_id, now_ms + lease, fence + i, now_ms, waiter.shared, waiter.proc
        )
        entries.append((token, waiter.ticket, entry))
    return entries


# How long the line a hand-over passes on to its heir (push) names the next waiters well enough
# to hand over without a read (seconds from the releaser's read, on its monotonic clock): no
# longer than an eventually consistent read may lag on AWS, and well inside the time a waiter
# that left still gives a hand-over back (push.LATE_LOOK).
LINE_FRESH = 1.0


class Line(NamedTuple):
    """The waiters after a hand-over's heirs as a read showed them (ticket order, dead ones
    too), and when that read was sent (monotonic)."""

    waiters: tuple[records.Waiter, ...] = ()
    read: float = 0.0


NO_LINE = Line()


def heirs_of(
    row: records.LockItem | None, token: str = ""
) -> tuple[Heirs, int, records.LockItem | None, Line]:
    """The heirs of the exclusive hold ``token``: from the line our own hand-over brought
    while it is fresh (no read), else from the queue's entry items, read now if the row says
    waiters came, where the words of waiters that told us (in the line, or come since our
    release began) stand in for the entries they have not written yet. Returns the heirs,
    the ``qout`` a hand-over to them is conditional on, the row with what was read, and the
    line after the heirs, for them."""
    if row is None or not row.waiting:
        return [], 0, row, NO_LINE
    if row.entries is not None:
        return next_in_line(row, clock.now_ms()), row.queue_out, row, NO_LINE
    if row.line and clock.monotonic() - row.line_read <= LINE_FRESH:
        # The same trust as the eventually consistent read below (it is one, passed on): only
        # if the very next tickets are there, every one live as read.
        heirs = _next_tickets(dataclasses.replace(row, entries=row.line))
        if heirs:
            return heirs, row.queue_out, row, _after(row.line, heirs, row.line_read)
    # An eventually consistent read first (half the units of a consistent one). It is taken
    # only if the heirs it shows are the very next tickets after qout, every one there: a
    # waiter that just queued can be missing from it, and skipping its ticket would serve a
    # later one first. A waiter that left a moment ago can still show in it (on AWS, for
    # about a second); a hand-over to it reaches its process by push, or its look at the row
    # 2 s after it left (``push.depart``), which gives the lock back (``give_back_stray``),
    # as for a hand-over that was on its way when it left. A consistent read here would cost
    # every hand-over 0.5 RCU more to spare the rarer leavers' one look (1 RCU), and would
    # still miss a slow write.
    line = row.line

    def told() -> list[records.Waiter]:
        return [*line, *push.words_after(token)]

    read = clock.monotonic()
    quick = queue_entries.load_entries(row, consistent=False, known=told)
    heirs = _next_tickets(quick)
    if heirs:
        return heirs, quick.queue_out, quick, _after(quick.entries, heirs, read)
    read = clock.monotonic()
    row = queue_entries.load_entries(row, known=told)
    heirs = next_in_line(row, clock.now_ms())
    return heirs, row.queue_out, row, _after(row.entries, heirs, read)


def _next_tickets(row: records.LockItem) -> Heirs:
    """The heirs ``row``'s entries show if they hold the tickets ``qout`` + 1, + 2, ...:
    nobody missing or passed over before or among them; else none. Which entries are live is
    judged by the clock once the answer is here, not before the read: a read can take
    botocore's retries and read timeouts (10 s each), and a hand-over to a waiter whose entry
    ran out meanwhile sits with the dead for a lease (sim seed 1034). (An entry such a read
    shows dead may have been renewed since.)"""
    heirs = next_in_line(row, clock.now_ms())
    tickets = [waiter.ticket for _, waiter in heirs]
    first = row.queue_out + 1
    return heirs if heirs and tickets == list(range(first, first + len(tickets))) else []


def _after(entries: tuple[records.Waiter, ...] | None, heirs: Heirs, read: float) -> Line:
    """The line after ``heirs`` among ``entries`` (read at ``read``), for the heir to pass on:
    only after one exclusive heir (readers do not hand over)."""
    if len(heirs) != 1 or heirs[0][1].shared or not entries:
        return NO_LINE
    last = heirs[0][1].ticket
    return Line(tuple(w for w in entries if w.ticket > last), read)


def release_terms(row: records.LockItem | None, skew: float) -> dict[str, Any]:
    """The queue's part of an exclusive holder's plain release (no heir to hand it to):
    nobody may be waiting (a refusal says who came); or every waiter seen is dead: pass
    them. Waiters whose entries have only just run out are left to take it themselves.
    Dead is judged by the clock when the entries were read: a releaser stalled since would
    find entries renewed (or put) meanwhile dead by its clock now, and pass live waiters."""
    if row is None or not row.waiting:
        return {"queue_idle": True}
    stale = min(clock.now_ms(), row.entries_read_ms or clock.now_ms()) - int(skew * 1000)
    if row.entries is not None and row.entries_to >= row.queue_in:
        if all(w.expires_ms < stale for w in row.entries):
            return {"pass_to": row.queue_in}
    return {}


def push_heirs(resource: str, heirs: Heirs, item: records.LockItem, line: Line = NO_LINE) -> None:
    """Push ``item``, the row a hand-over wrote, to each of its ``heirs`` that listens, with
    the ``line`` after them and its age. Older than LINE_FRESH it is not handed over from
    without a read, but its words still stand in for entries not put yet."""
    sent_ms = clock.now_ms()
    age = clock.monotonic() - line.read
    for token, waiter in heirs:
        if waiter.address:
            after = (line.waiters, age)
            push.push(waiter.address, resource, token, item, sent_ms=sent_ms, line=after)


def push_if_free(resource: str, item: records.LockItem | None) -> None:
    """A write left ``item`` (its answer) held by nobody: the first waiter in line is pushed
    it, as a release hands over, instead of finding it free at its next paced look."""
    if item is not None and not item.holders:
        push_first(resource, item, readers_only=False)


def push_first(resource: str, item: records.LockItem, *, readers_only: bool) -> None:
    """Push ``item`` to the first live waiter in line (only if a reader: ``readers_only``),
    reading the queue's first entries if the row says waiters came."""
    if not item.waiting:
        return
    if item.entries is None:
        try:
            item = queue_entries.load_entries(item)
        except SemaphoreUnavailable:
            return  # they read it themselves
    first = next_in_line(item, clock.now_ms())[:1]  # whatever it is: exclusive or not
    if first and (first[0][1].shared or not readers_only):
        push_heirs(resource, first, item)
