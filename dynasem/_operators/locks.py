"""What operators do to holds (list, break), shared by the CLI and the admin (the reaper is
reaper.py)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from .. import _clock as clock
from .._engine import arguments, core, handover, permit_hold, reader_hold
from .._observability.logs import facts
from .._storage import (
    dynamodb,
    index_queries,
    lock_rows,
    lock_writes,
    permit_items,
    queue_entries,
    reader_items,
    records,
)
from .._storage.records import Mode
from ..exceptions import SemaphoreUnavailable
from ..signals import lock_released
from . import cursors, listing

logger = logging.getLogger("dynasem")


def aware(ms: int) -> datetime:
    """Milliseconds since the epoch as an aware datetime (UTC)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True)
class HoldInfo:
    """One holder of one resource, as stored."""

    resource: str
    token: str
    user_id: str
    fence: int
    mode: Mode
    limit: int
    acquired_ms: int
    expires_ms: int
    queue_depth: int = 0

    @property
    def expires(self) -> datetime:
        return aware(self.expires_ms)

    @property
    def acquired(self) -> datetime:
        return aware(self.acquired_ms)

    @property
    def kind(self) -> str:
        if self.mode == Mode.SHARED:
            return "shared"
        if self.mode == Mode.COUNTING:
            return f"slot of {self.limit}"
        return "exclusive"

    def as_dict(self) -> dict[str, Any]:
        shown = ("resource", "user_id", "kind", "fence", "token", "acquired", "expires")
        out = {name: getattr(self, name) for name in (*shown, "queue_depth")}
        return {**out, "acquired": self.acquired.isoformat(), "expires": self.expires.isoformat()}


# A page of the lock list shows at most this many holds of one resource: its permits and
# reader items are read no further (beside 2,000 readers: 1.5 RCU and 22 lines, not 34 RCU
# and 2,000 lines); active_holds and a user's filter read them all.
HOLDS_PER_RESOURCE = 20
# The resource page shows this many of its holders at a time (resource_state's ``most``).
HOLDS_PER_PAGE = 500


def _expanded(
    item: records.LockItem,
    *,
    consistent: bool = False,
    most: int | None = None,
    after_sk: str | None = None,
) -> records.LockItem:
    """A row with the holders it keeps in items of their own (permits, readers) read in
    (``most``: no further than that many, ``holders_next`` says where the rest begin;
    ``after_sk``: those after a ``holders_next``, without the row's own)."""
    found = permit_items.with_permits(item, consistent=consistent, most=most, after_sk=after_sk)
    return reader_items.with_readers(found, consistent=consistent, most=most, after_sk=after_sk)


def holds_of(item: records.LockItem, *, min_expires_ms: int | None) -> list[HoldInfo]:
    """The row's holds (those whose lease ends at ``min_expires_ms`` or later), by token."""
    hold = functools.partial(
        HoldInfo, item.resource, mode=item.mode, limit=item.limit, queue_depth=_waiting(item)
    )
    return [
        hold(token, h.user_id, h.fence, acquired_ms=h.acquired_ms, expires_ms=h.expires_ms)
        for token, h in sorted(item.holders.items())
        if min_expires_ms is None or h.expires_ms >= min_expires_ms
    ]


def _waiting(item: records.LockItem) -> int:
    """The waiters a listing shows for a row, from the row alone: the tickets out that have
    not had their turn (a waiter that left, or died, counts until the next turn passes it:
    :func:`queue_depth` reads the entries)."""
    return max(0, item.queue_in - item.queue_out)


# ---------------------------------------------------------------------------------------------
# Listing holds, a page at a time
# ---------------------------------------------------------------------------------------------
#
# Holds are read through the indexes by lease end, so idle rows (released, or expired and not
# yet reaped) cost nothing unless asked for. Each index range is a "stream" read in its own
# order (``expires`` ascending); a page merges the streams by ``expires`` and remembers, per
# stream, the last row it took. That row's key is the stream's ExclusiveStartKey on the next
# page: DynamoDB's LastEvaluatedKey, cut where the page ended. Nothing is loaded in full.
# Rows move in an index while one pages through it (a renewal pushes ``expires``): as in any
# live listing, a hold renewed between two pages may show on both or on neither.

# What every list read through the indexes says of itself (the admin's lock list,
# ``dynasem_locks``): DynamoDB updates a global secondary index asynchronously, and the rows
# behind its entries are read eventually consistently (half the read units). A resource's own
# page, ``dynasem_locks RESOURCE`` and every break read the row consistently.
INDEX_NOTE = (
    "Listed from DynamoDB's indexes, which are updated asynchronously: a change of the last "
    "seconds may not show yet."
)

# Rounds of requests one page may spend (one round = one request per stream). A filter that
# matches little (a resource prefix among many expired rows) then returns a short page with a
# link to the next one instead of reading on.
PAGE_ROUNDS = 3


@dataclass(frozen=True)
class LockRow:
    """One stored lock row as listed, with the holds shown (no holds: an idle row)."""

    resource: str
    fence: int
    expires_ms: int
    queue_depth: int
    holds: tuple[HoldInfo, ...]
    # More holders are stored than ``holds`` shows (a page lists at most
    # ``holds_per_resource`` of one resource: see lock_page).
    more_holds: bool = False

    @property
    def expires(self) -> datetime:
        return aware(self.expires_ms)


@dataclass(frozen=True)
class LockPage:
    """A page of :func:`lock_page`: its rows and the cursor of the next page (or None)."""

    rows: list[LockRow]
    next_cursor: str | None

    @property
    def holds(self) -> list[HoldInfo]:
        return [hold for row in self.rows for hold in row.holds]


def _rows(
    merged: Iterator[records.IndexEntry],
    size: int | None,
    *,
    user_id: str | None,
    prefix: str | None,
    include_expired: bool,
    most: int | None = None,
) -> list[LockRow]:
    """The listed rows of the merged index entries, ``size`` of them (None: until the entries
    run out), read from the base table a batch at a time, leaving out those outside ``prefix``
    unread. Every entry taken (a stream's cursor moves past it) is shown or left out here,
    never skipped. ``most``: the holders kept in items read per row (None: all)."""
    floor_ms = None if include_expired else clock.now_ms()
    rows: list[LockRow] = []
    finished = False
    # Only as many index entries as the page has room for at a time.
    while not finished and (size is None or len(rows) < size):
        count = index_queries.MAX_BATCH_GET if size is None else size - len(rows)
        entries = list(itertools.islice(merged, count))
        wanted = [e for e in entries if not prefix or e.resource.startswith(prefix)]
        for item in index_queries.get_many(wanted):
            row = _row(_expanded(item, most=most), user_id, floor_ms, include_expired)
            rows += [row] if row is not None else []
        finished = len(entries) < count
    return rows


def _row(
    item: records.LockItem, user_id: str | None, floor_ms: int | None, idle_too: bool
) -> LockRow | None:
    """The row as listed, or None when it shows nothing under these filters."""
    holds = [
        hold
        for hold in holds_of(item, min_expires_ms=floor_ms)
        if user_id is None or hold.user_id == user_id
    ]
    more = item.holders_next is not None
    if not holds and not more and not (idle_too and user_id is None and not item.holders):
        return None
    waiting = _waiting(item)
    return LockRow(item.resource, item.fence, item.expires_ms, waiting, tuple(holds), more)


def lock_page(
    *,
    user_id: str | None = None,
    prefix: str | None = None,
    include_expired: bool = False,
    cursor: str | None = None,
    size: int = 100,
    holds_per_resource: int | None = HOLDS_PER_RESOURCE,
) -> LockPage:
    """One page of lock rows, soonest lease end first: the rows with live holds (with
    ``include_expired``, also rows whose leases ran out and idle rows not yet reaped).

    Reads one page of each ``expires`` index shard (and of the userId index for ``user_id``),
    never the whole table; ``cursor`` is a previous page's ``next_cursor`` under the same
    filters. Raises :class:`cursors.BadCursor` (a ValueError) for a cursor it did not write
    for them. A row shows at most ``holds_per_resource`` of the holders
    a resource keeps in items (permits, readers; None: all), and says ``more_holds`` when
    there are more; filtered by ``user_id``, every one is read."""
    if size < 1:
        raise ValueError(f"size must be at least 1, not {size!r}")
    if holds_per_resource is not None and holds_per_resource < 1:
        raise ValueError(f"holds_per_resource must be at least 1, not {holds_per_resource!r}")
    names = {f"s{i}" for i in range(records.SHARDS)} | ({"u"} if user_id is not None else set())
    # A cursor goes on only under the filters it was written for: under others its positions
    # (and lower bound) would skip rows or repeat them.
    signed_for = cursors.purpose("locks", user_id, prefix, include_expired)
    if cursor:
        state = cursors.decode_cursor(cursor, names, signed_for)
        # The lower bound of the first page, kept: a position below a later bound would be
        # "outside the query's boundaries" to DynamoDB.
        since, positions = state["t"], state["p"]
    else:
        since, positions = (0 if include_expired else clock.now_ms() // 1000), {}
    streams = listing.open_streams(user_id, since, positions)
    merged = listing.merged(streams, size, PAGE_ROUNDS * len(streams))
    most = None if user_id is not None else holds_per_resource
    rows = _rows(
        merged, size, user_id=user_id, prefix=prefix, include_expired=include_expired, most=most
    )
    states = {s.name: s.state for s in streams}
    done = all(v == "done" for v in states.values())
    next_cursor = None if done else cursors.encode_cursor({"t": since, "p": states}, signed_for)
    return LockPage(rows, next_cursor)


def active_holds(
    *, user_id: str | None = None, prefix: str | None = None, include_expired: bool = False
) -> list[HoldInfo]:
    """Every live hold (or, with ``include_expired``, also those whose lease ran out but whose
    rows are still there), by resource, read through the indexes."""
    since = 0 if include_expired else clock.now_ms() // 1000
    merged = listing.merged(listing.open_streams(user_id, since, {}), None, None)
    rows = _rows(merged, None, user_id=user_id, prefix=prefix, include_expired=include_expired)
    return sorted((h for row in rows for h in row.holds), key=lambda h: (h.resource, h.acquired_ms))


def holds_on(resource: str) -> list[HoldInfo]:
    """Every holder of one resource, live or not (one consistent read)."""
    item = lock_rows.get(arguments.check_resource(resource))
    return holds_of(_expanded(item, consistent=True), min_expires_ms=None) if item else []


@dataclass(frozen=True)
class ResourceState:
    """One resource as an operator looks at it: its holders and its queue, from one read of
    its row (and of its queue's entries)."""

    resource: str
    holds: list[HoldInfo]
    waiters: list[records.Waiter]  # live ones, first in line first
    fence: int = 0  # the last fence handed out
    # More holders than ``holds`` (a page of them): pass it as ``holds_after`` for the next.
    holds_next: str | None = None
    # Tickets out after the last entry read (``most`` of them were): waiters, or the
    # tickets of waiters that left or died, further back in line.
    waiters_beyond: int = 0


def resource_state(
    resource: str, *, holds_after: str | None = None, most: int | None = None
) -> ResourceState:
    """The holders of ``resource`` (live or not; with ``most``, no more than that many of
    those kept in permit or reader items, from ``holds_after`` on: a previous state's
    ``holds_next``) and every live waiter, first in line first (with ``most``, of the first
    that many tickets in line; ``waiters_beyond`` counts the tickets after them), from
    consistent reads: the row, then its queue's entries."""
    item = lock_rows.get(arguments.check_resource(resource))
    if item is None:
        return ResourceState(resource, [], [])
    if holds_after is not None and not holds_after.startswith(
        (records.PERMIT_PREFIX, records.READER_PREFIX)
    ):
        raise ValueError(f"holds_after is a previous page's holds_next, not {holds_after!r}")
    item = _expanded(item, consistent=True, most=most, after_sk=holds_after)
    now = clock.now_ms()
    entries = queue_entries.queue_entries(item, most)
    beyond = item.queue_in - entries[-1].ticket if most is not None and len(entries) >= most else 0
    waiters = [w for w in entries if w.expires_ms >= now]
    holds = holds_of(item, min_expires_ms=None)
    return ResourceState(resource, holds, waiters, item.fence, item.holders_next, beyond)


def waiters_on(resource: str) -> list[records.Waiter]:
    """Every live waiter queued for ``resource``, first in line first (consistent reads:
    the row, then its queue's entries). Each has ``ticket``, ``user_id``, ``shared``,
    ``token`` and ``since_ms`` (when it queued, in milliseconds since the epoch, or
    ``None``)."""
    return resource_state(resource).waiters


def held_with(hold: HoldInfo) -> list[str]:
    """The other resources taken in the same acquisition as ``hold`` (the same token), as the
    userId index finds its user's rows; live holds only."""
    return sorted(
        h.resource
        for h in active_holds(user_id=hold.user_id)
        if h.token == hold.token and h.resource != hold.resource
    )


def queue_depth(resource: str) -> int:
    """How many live waiters are queued for ``resource``: ``len(waiters_on(resource))``."""
    return len(waiters_on(resource))


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C (SIGINT) held back until the block ends, in the main thread: a break's writes
    (a reader's tombstone, then its count-down; a permit's, then its slot's hint) must not
    be cut between them by an operator's Ctrl-C, as nothing else finishes them. Elsewhere
    (a web server's threads) nothing changes: no Ctrl-C comes there."""
    held: list[tuple[int, FrameType | None]] = []
    try:
        before = signal.getsignal(signal.SIGINT)
        if before is None:  # a handler not set from Python: left alone
            raise ValueError("no Python handler")
        signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    except (ValueError, OSError):  # not the main thread (no Ctrl-C comes here), or no signals
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if held and callable(before):
            before(*held[0])
        elif held and before == signal.SIG_DFL:
            raise KeyboardInterrupt


def break_hold(
    resource: str,
    token: str,
    *,
    user_id: str | None = None,
    fence: int | None = None,
) -> bool:
    """Break one hold, only if that very token still holds (a hold taken meanwhile survives),
    under ``fence`` if given (in the row, a permit or a reader item: the same token admitted
    again since the operator's read holds under a new fence, and survives too).
    Sends ``lock_released`` (with ``broken=True`` and the holder's ``user_id`` and ``fence``
    where the caller knows them); False if the token no longer held the resource."""
    if token == reader_items.SENTINEL:
        return False  # it stands for the reader items: each is broken by its own token
    try:
        row = lock_rows.update(lock_writes.force_release(resource, token, fence), return_new=True)
    except SemaphoreUnavailable as exc:
        # Unanswered (the operators' client sends once): applied, it is made, and only this
        # break would push the first waiter (asleep until the broken lease's end).
        handover.push_if_free(resource, _broken_unanswered(resource, token, exc))
    except dynamodb.Refused as refused:
        old = refused.lock
        if old is None:
            return False
        if refused.retried and _broken_in(old, token):
            # botocore's re-send of our own break, applied, its answer lost: refused by it.
            handover.push_if_free(resource, old)
        else:
            with uninterrupted():
                if reader_items.has_readers(old):
                    if not reader_hold.break_reader(resource, token, fence=fence):
                        return False
                elif old.slots_used is None or not permit_hold.break_permit(
                    resource, token, fence=fence
                ):
                    return False
    else:
        handover.push_if_free(resource, row)  # handed over as a release is
    # The break is made: a receiver that raises (its own database down) must not make the
    # caller take it for not made (dynasem_release stopped before recording it, and before
    # the holds after it; the admin's page a 500).
    answers = lock_released.send_robust(
        sender=core.Semaphore,
        resource=resource,
        user_id=user_id,
        token=token,
        fence=fence,
        broken=True,
    )
    for receiver, answer in answers:
        if isinstance(answer, Exception):
            message = "dynasem: a lock_released receiver %r raised for a break on %r: %r"
            ex = facts(resource, token=token, fence=fence, outcome="receiver_failed", reason=answer)
            logger.warning(message, receiver, resource, answer, extra=ex)
    return True


def _broken_unanswered(
    resource: str, token: str, unanswered: SemaphoreUnavailable
) -> records.LockItem:
    """The row after a break of ``token`` in it that went ``unanswered``, read consistently,
    if it shows the break applied: the token gone, named as broken (``brokenToken``), not as
    given back (``lastToken``). Else ``unanswered`` is raised again."""
    if not unanswered.ambiguous:
        raise unanswered
    try:
        row = lock_rows.get(resource)
    except SemaphoreUnavailable:
        raise unanswered from None
    if row is None or not _broken_in(row, token):
        raise unanswered
    return row


def _broken_in(row: records.LockItem, token: str) -> bool:
    """``row`` shows a break of ``token`` in it applied: the token gone, named as broken
    (``brokenToken``), not as given back (``lastToken``)."""
    return token not in row.holders and row.broken_token == token and row.last_token != token


def matching(holds: list[HoldInfo], token: str | None, fence: int | str | None) -> list[HoldInfo]:
    """The holds an operator names (the admin's break, ``dynasem_release``): those whose token
    starts with ``token`` (the first characters shown: logs.shown_token) and whose fence is
    ``fence``; either left out (None or empty) matches all."""
    return [
        hold
        for hold in holds
        if hold.token.startswith(token or "")
        and (fence in (None, "") or str(hold.fence) == str(fence))
    ]
