"""The reaper (``dynasem_reap``): rows whose lease ended more than CLOCK_SKEW ago deleted,
found through the expires index; dead holders' permits and reader items freed. Every delete and
break is conditional on what was read, so an index that lags costs a refused write, never a
live hold; a write whose answer was lost is told apart from a row that changed since."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _clock as clock
from .._engine import arguments, permit_hold, reader_hold
from .._storage import dynamodb, index_queries, lock_rows, permit_items, reader_items, records
from ..exceptions import SemaphoreUnavailable
from .locks import uninterrupted

_T = TypeVar("_T")


@dataclass(frozen=True)
class ReapFailure:
    """A delete or break the reap could not make (DynamoDB unreachable, throttled still after
    the tries, an answer lost): left for the next reap (or, a lock row, for TTL)."""

    resource: str  # "" for the listing of permit and reader rows
    item: str  # "row", "permit", "reader", or "listing"
    error: str
    # An attempt went unanswered (a timeout, a 5xx): it may have been applied all the same.
    maybe_applied: bool


@dataclass
class ReapResult:
    found: int = 0  # rows the expires index listed as expired
    deleted: int = 0
    # Rows listed but changed since the index listed them (taken again, renewed, released
    # late; or gone): their conditional delete was refused (in a dry run: would be).
    survived: int = 0
    # Permits (counting semaphores of many permits) and reader items of dead holders freed.
    permits: int = 0
    # Permits and reader items read dead whose holder renewed (or left) before the break:
    # refused, as read, and kept.
    permits_kept: int = 0
    # What failed; the reap went on with the rest.
    failed: list[ReapFailure] = dataclasses.field(default_factory=list)

    def count(self, outcome: bool | ReapFailure, done: str, kept: str) -> None:
        """One delete or break counted: failed, made (the count ``done``), or refused because
        what it was conditional on changed (the count ``kept``)."""
        if isinstance(outcome, ReapFailure):
            self.failed.append(outcome)
        else:
            name = done if outcome else kept
            setattr(self, name, getattr(self, name) + 1)


# Sends of one reaper delete or break: the first, then after 50, 100 and 200 ms, the schedule
# botocore's retries keep for the locks' client. Each send goes through the quick client (one
# attempt, 2 s to answer), so dynasem itself knows which send went unanswered (botocore tells
# only the last one's error) and a hung endpoint costs seconds a row, not 40.
REAP_SENDS = 4


def _sent(send: Callable[[bool], _T], *, resend_unanswered: bool = True) -> _T:
    """``send(resent)`` on the quick client, sent again after a transient error: one never
    applied (throttled, no connection) always; one unanswered only if ``resend_unanswered``
    (a read, or a write that tells an earlier send's doing from a change by someone else,
    told by ``resent``). Raises the last error when it gives up, ``ambiguous`` if any send
    went unanswered: a throttled request must not end the reap where the locks' client
    would have retried it."""
    unanswered = False
    for attempt in range(REAP_SENDS):
        if attempt:
            time.sleep(0.05 * 2 ** (attempt - 1))
        try:
            with dynamodb.quick():
                return send(unanswered)
        except SemaphoreUnavailable as exc:
            unanswered = unanswered or exc.ambiguous
            last = attempt + 1 == REAP_SENDS
            if last or not exc.transient or (exc.ambiguous and not resend_unanswered):
                exc.ambiguous = unanswered
                raise
    raise AssertionError("unreachable: the last send returns or raises")


def _read(read: Callable[[], _T]) -> _T:
    """A read of the reaper's, sent as :func:`_sent` sends (a read applies nothing)."""
    return _sent(lambda _resent: read())


def _write(
    send: Callable[[bool], bool], resource: str, item: str, *, resend_unanswered: bool = False
) -> bool | ReapFailure:
    """A delete or break of the reaper's (:func:`_sent`): its answer, or why it failed."""
    try:
        return _sent(send, resend_unanswered=resend_unanswered)
    except SemaphoreUnavailable as exc:
        return ReapFailure(resource, item, str(exc), maybe_applied=exc.ambiguous)


def _expiring(shard: int, **kwargs: Any) -> Iterator[records.IndexEntry]:
    """The rows of ``shard`` the ``expires`` index lists as expiring
    (:func:`index_queries.query_expiring`), page after page, each read by :func:`_read`."""
    start = None
    while True:
        page = functools.partial(index_queries.query_expiring, shard, start=start, **kwargs)
        rows, start = _read(page)
        yield from rows
        if not start:
            return


def _delete_row(resource: str, cutoff_ms: int) -> bool | ReapFailure:
    """One expired row's conditional delete, in a reaper's thread."""
    delete = functools.partial(lock_rows.delete_expired, resource, cutoff_ms)
    return _write(lambda resent: delete(resent=resent), resource, "row", resend_unanswered=True)


def reap(
    *,
    dry_run: bool = False,
    workers: int = 16,
    progress: Callable[[ReapResult], None] | None = None,
    found: Callable[[records.IndexEntry], None] | None = None,
    result: ReapResult | None = None,
) -> ReapResult:
    """Delete rows whose lease ended more than CLOCK_SKEW ago and whose 15-minute expires
    bucket has passed (records.BUCKET_S: the index lists a row by its bucket, so that renewals
    move no index key), found through the expires index (never a Scan) and deleted each on
    condition it is still expired (the condition is
    DynamoDB's, on the row as it is: an index entry that lags behind its row costs a refused
    delete, never a live hold), in parallel. ``found`` is called with each row found (in a
    dry run: each row it would delete, its row read consistently). A delete or break that
    fails is in ``failed``, and the reap goes on; a failed listing of the expires index
    raises (SemaphoreUnavailable), once the deletes of the rows it listed before are made and
    counted in ``result`` (pass one to read them then)."""
    cutoff_ms = clock.now_ms() - int(arguments.skew_setting() * 1000)
    before_s = cutoff_ms // 1000
    result = ReapResult() if result is None else result
    shards = range(records.SHARDS)
    candidates = (row for shard in shards for row in _expiring(shard, before=before_s))
    if dry_run:
        _would_reap(candidates, cutoff_ms, result, found)
        _reap_permits(cutoff_ms, result, dry_run=True)
        return result
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dynasem-reap") as pool:
        futures = []
        try:
            for row in candidates:
                result.found += 1
                if found is not None:
                    found(row)
                # In the caller's context (its telemetry span, its settings overrides).
                run = contextvars.copy_context().run
                futures.append(pool.submit(run, _delete_row, row.resource, cutoff_ms))
        finally:  # a listing that failed partway: the deletes already sent counted first
            for i, future in enumerate(futures, 1):
                result.count(future.result(), "deleted", "survived")
                if progress is not None and (i % 500 == 0 or i == len(futures)):
                    progress(result)
    _reap_permits(cutoff_ms, result, dry_run=False)
    return result


def _would_reap(
    listed: Iterator[records.IndexEntry],
    cutoff_ms: int,
    result: ReapResult,
    found: Callable[[records.IndexEntry], None] | None,
) -> None:
    """A dry run's count: of the rows the index lists, those whose row, read consistently,
    the delete's condition would take (``found`` is called with each); the others changed
    since the index listed them. One read unit per row, less than the delete it stands for:
    an index lagging behind its rows must not make a dry run list a live lock."""
    before_s = cutoff_ms // 1000
    read = functools.partial(index_queries.get_many, consistent=True, as_listed=False)

    def reaped(row: records.LockItem) -> bool:
        # As delete_expired's condition reads it: the row's own expires, not its entry's (an
        # index lagging behind the row lists it under an older bucket).
        listed_s = row.listed_s
        return 0 < row.expires_ms < cutoff_ms and listed_s is not None and listed_s < before_s

    while batch := list(itertools.islice(listed, index_queries.MAX_BATCH_GET)):
        result.found += len(batch)
        expired = {row.resource for row in _read(functools.partial(read, batch)) if reaped(row)}
        for entry in batch:
            if entry.resource not in expired:
                result.survived += 1
            elif found is not None:
                found(entry)


def _reap_permits(cutoff_ms: int, result: ReapResult, *, dry_run: bool) -> None:
    """Free the permits whose holder's lease ended before ``cutoff_ms``, in the rows of
    counting semaphores of many permits still listed (such a row stays listed while any of
    its permits may be live, so the rows above are not reaped): each conditional on the
    permit being as read, its slot hinted. Counts those freed (in a dry run: would be), and
    those that changed between the read and the break (renewed or given back: kept)."""
    try:
        entries = [
            entry
            for shard in range(records.SHARDS)
            for entry in _expiring(shard, since=cutoff_ms // 1000, shared_only=True)
        ]
        rows = _read(functools.partial(index_queries.get_many, entries))
    except SemaphoreUnavailable as exc:
        result.failed.append(ReapFailure("", "listing", str(exc), maybe_applied=False))
        return
    for row in rows:
        try:
            _reap_items(row, cutoff_ms, result, dry_run=dry_run)
        except SemaphoreUnavailable as exc:  # reading its items
            result.failed.append(ReapFailure(row.resource, "listing", str(exc), False))


def _reap_items(
    row: records.LockItem, cutoff_ms: int, result: ReapResult, *, dry_run: bool
) -> None:
    """The dead readers and permits of one row (see :func:`_reap_permits`). A break re-sent
    after an unanswered one would be refused, as the break of a holder that renewed is: it is
    not re-sent, and fails as maybe applied."""
    kinds: list[tuple[str, Callable[..., list[Any]], Callable[..., bool]]] = []
    if reader_items.has_readers(row):
        kinds.append(("reader", reader_items.readers, reader_hold.break_reader))
    if row.slots_used is not None:
        kinds.append(("permit", permit_items.permits, permit_hold.break_permit))
    dead = [
        (item, functools.partial(free, row.resource, held.token, held))
        for item, listed, free in kinds
        for held in _read(functools.partial(listed, row.resource))
        if held.token and held.holder.expires_ms < cutoff_ms
    ]
    for item, break_dead in dead:
        if dry_run:
            outcome: bool | ReapFailure = True
        else:
            with uninterrupted():  # a reader's tombstone never without its count-down
                outcome = _write(_once(break_dead), row.resource, item)
        result.count(outcome, "permits", "permits_kept")


def _once(free: Callable[[], bool]) -> Callable[[bool], bool]:
    """A break of a dead holder's item, as :func:`_write` sends it (it is never re-sent after
    an unanswered send: see :func:`_reap_items`)."""
    return lambda _resent: free()
