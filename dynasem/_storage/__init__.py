"""Every DynamoDB request dynasem makes, and nothing else: the reads, writes and index
queries here; the client, sending and errors in :mod:`dynasem._storage.client`; the table itself
in :mod:`dynasem._storage.schema`; the stored format in :mod:`dynasem._storage.records` and the
conditional writes' builders in :mod:`dynasem._storage.lock_writes`. All are re-exported here, so
the
rest of the app speaks to ``table`` only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from ..conf import settings
from ..exceptions import SemaphoreUnavailable, TableMissing
from . import readers
from .claims import adopt_hold, announce_next
from .client import (
    Cancelled,
    Refused,
    WriteConflict,
    _send,
    endpoint_label,
    get_client,
    process_identity,
    quick,
    reset_client,
)
from .job_writes import job_claim, job_finish, job_renew, job_reset
from .lock_writes import (
    QueueTerms,
    force_release,
    give_back,
    hand_over,
    holder_entry,
    renew_hold,
    renew_waiter,
    take_free,
    take_join,
    take_room,
    take_ticket,
)
from .next_runs import NEXT_SK, get_next, register_next, renew_next, withdraw_next
from .permits import with_permits
from .records import (
    BUCKET_S,
    DONE,
    EXPIRES_INDEX,
    FAILED,
    JOB_SK,
    LOCK_SK,
    MAX_TRANSACTION,
    OLD_INDEXES,
    RUNNING,
    SHARDS,
    USER_INDEX,
    Holder,
    IndexEntry,
    JobRow,
    LockItem,
    Waiter,
    bucket_of,
    decode,
    encode,
    entry_item,
    entry_of,
    entry_sk,
    epoch_seconds,
    expires_index_start,
    guessed_free,
    holder_value,
    index_definitions,
    index_entry,
    index_position,
    job_row,
    job_start_key,
    key,
    lock_item,
    old_layout,
    scan_position,
    scan_start,
    shard_of,
    table_definition,
    user_index_start,
    waiter_value,
)
from .schema import (
    create_table,
    delete_table,
    describe_table,
    enable_ttl,
    layout_warning,
    ttl_status,
    upgrade_indexes,
    wait_until_active,
)

__all__ = [
    "adopt_hold",
    "announce_next",
    "readers",
    "with_permits",
    "Holder",
    "IndexEntry",
    "LockItem",
    "old_layout",
    "layout_warning",
    "index_definitions",
    "OLD_INDEXES",
    "BUCKET_S",
    "bucket_of",
    "get_many",
    "MAX_BATCH_GET",
    "upgrade_indexes",
    "Waiter",
    "guessed_free",
    "holder_value",
    "lock_item",
    "stored_item",
    "wire",
    "waiter_value",
    "PUSHED_BEHIND",
    "update_job",
    "user_index_start",
    "expires_index_start",
    "index_position",
    "scan_start",
    "scan_position",
    "JobRow",
    "job_row",
    "get_job",
    "job_start_key",
    "DONE",
    "EXPIRES_INDEX",
    "FAILED",
    "JOB_SK",
    "LOCK_SK",
    "NEXT_SK",
    "MAX_TRANSACTION",
    "RUNNING",
    "SHARDS",
    "USER_INDEX",
    "Cancelled",
    "WriteConflict",
    "QueueTerms",
    "Refused",
    "create_table",
    "decode",
    "delete_expired",
    "delete_table",
    "drop_entry",
    "entry_sk",
    "load_entries",
    "queue_entries",
    "leave_queue",
    "may_be_handed",
    "put_entry",
    "take_ticket",
    "describe_table",
    "enable_ttl",
    "endpoint_label",
    "epoch_seconds",
    "force_release",
    "get",
    "get_client",
    "get_next",
    "give_back",
    "hand_over",
    "holder_entry",
    "iter_expiring",
    "job_claim",
    "job_finish",
    "job_renew",
    "job_reset",
    "process_identity",
    "query_expiring",
    "query_user_page",
    "renew_hold",
    "renew_waiter",
    "quick",
    "register_next",
    "renew_next",
    "reset_client",
    "scan_jobs",
    "shard_of",
    "table_definition",
    "take_free",
    "take_join",
    "take_room",
    "transact",
    "ttl_status",
    "update",
    "wait_until_active",
    "withdraw_next",
]

# ---------------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------------


def update(action: dict[str, Any], *, return_new: bool = False) -> LockItem | None:
    """Send one conditional lock write. Raises :class:`Refused` with the old row."""
    return lock_item(_update(action, return_new))


def update_job(action: dict[str, Any], *, return_new: bool = False) -> JobRow | None:
    """Send one conditional run_once write. Raises :class:`Refused` with the old row."""
    row = _update(action, return_new)
    return None if row is None else job_row(row)


def _update(action: dict[str, Any], return_new: bool) -> dict[str, Any] | None:
    response = _send(
        "update_item",
        TableName=settings.TABLE_NAME,
        ReturnValues="ALL_NEW" if return_new else "NONE",
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
        **action,
    )
    return decode(response.get("Attributes")) if return_new else None


def transact(actions: list[dict[str, Any]]) -> None:
    """Send UpdateItem actions as one all-or-none transaction. Raises :class:`Cancelled`."""
    table = settings.TABLE_NAME
    items = [
        {"Update": dict(a, TableName=table, ReturnValuesOnConditionCheckFailure="ALL_OLD")}
        for a in actions
    ]
    _send("transact_write_items", TransactItems=items)


def get(resource: str, *, consistent: bool = True) -> LockItem | None:
    """One read of a lock row (used only where no write can tell us): strongly consistent,
    unless ``consistent`` is False (half the read units: for a queued waiter's look, which
    only decides when to write, every write being conditional on the row as it is)."""
    return lock_item(_get(resource, LOCK_SK, consistent=consistent))


def stored_item(pk: str, sk: str = LOCK_SK) -> dict[str, Any] | None:
    """A row exactly as stored, decoded to plain Python: for tests and diagnostics, which
    check the stored format itself. The app reads :func:`get` and :func:`get_job`."""
    return _get(pk, sk)


def _get(pk: str, sk: str, *, consistent: bool = True) -> dict[str, Any] | None:
    response = _send(
        "get_item", TableName=settings.TABLE_NAME, Key=key(pk, sk), ConsistentRead=consistent
    )
    return decode(response.get("Item"))


# Entry items one query of the queue reads (a page): the first live one is usually the first.
ENTRY_PAGE = 8


def put_entry(resource: str, qbase: int, waiter: Waiter) -> None:
    """Write our queue entry (its ticket drawn by :func:`take_ticket`): an item of its own,
    so that a crowd of waiters never makes a write to the row dearer."""
    _send("put_item", TableName=settings.TABLE_NAME, Item=entry_item(resource, qbase, waiter))


def drop_entry(resource: str, qbase: int, ticket: int) -> None:
    """Delete our queue entry (we leave the queue): a hand-over then no longer finds us."""
    _send("delete_item", TableName=settings.TABLE_NAME, Key=key(resource, entry_sk(qbase, ticket)))


# After leaving the queue while another holds, how long until we look again whether a
# hand-over to us was on its way (seconds): a releaser reads the queue, then writes.
LEAVE_RECHECK = 0.05


def leave_queue(resource: str, qbase: int, ticket: int, *, token: str) -> LockItem | None:
    """Leave the queue: delete our entry, then read the row (consistently): a hand-over that
    found our entry before it went may have made us the holder; the caller keeps that hold or
    gives it back. While another holds it, a hand-over may still be on its way (the releaser
    read the queue before we left, and has not written yet): we look once more a little
    later."""
    drop_entry(resource, qbase, ticket)
    row = get(resource)
    if may_be_handed(row, qbase, ticket, token):
        time.sleep(LEAVE_RECHECK)
        row = get(resource)
    return row


def may_be_handed(row: LockItem | None, qbase: int, ticket: int, token: str) -> bool:
    """Could a hand-over to the waiter ``token`` (ticket ``ticket`` of the queue ``qbase``)
    that left still land, as far as ``row`` (read after it left) tells? Only if someone
    holds (a holder hands over in its release write) and its turn has not gone by: the
    releaser may have read the line before it left, or read it eventually consistently."""
    return (
        row is not None
        and token not in row.holders
        and bool(row.holders)
        and row.qbase == qbase
        and row.qout < ticket
    )


def _entry_page(
    item: LockItem,
    upto: int,
    limit: int | None,
    start: dict[str, Any] | None,
    consistent: bool = True,
) -> tuple[list[Waiter], dict[str, Any] | None]:
    """One page of the entry items of ``item``'s queue, tickets ``qout`` + 1 to ``upto``
    (consistent unless told: the entries a waiter or a releaser decides from must be current;
    see :func:`dynasem._engine.handover.heirs_of` for the one read that need not be)."""
    lo, hi = entry_sk(item.qbase, item.qout + 1), entry_sk(item.qbase, upto)
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "ConsistentRead": consistent,
        "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
        "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
        "ExpressionAttributeValues": encode({":pk": item.resource, ":lo": lo, ":hi": hi}),
    }
    if limit:
        kwargs["Limit"] = limit
    if start:
        kwargs["ExclusiveStartKey"] = start
    response = _send("query", **kwargs)
    page = [entry_of(decode(i)) for i in response.get("Items", [])]
    return page, response.get("LastEvaluatedKey")


def queue_entries(item: LockItem, most: int | None = None) -> list[Waiter]:
    """Every entry item of ``item``'s queue that has not had its turn (``qout`` + 1 to
    ``qin``), dead ones included, in ticket order: for listings, never for a decision.
    ``most``: the first that many only."""
    found: list[Waiter] = []
    start = None
    while item.qin > item.qout and (most is None or len(found) < most):
        page, start = _entry_page(item, item.qin, most and most - len(found), start)
        found += page
        if not start:
            break
    return found


def load_entries(item: LockItem, upto: int | None = None, *, consistent: bool = True) -> LockItem:
    """``item`` with the entry items of its queue read, from ``qout`` + 1 up to ``upto``
    (default: ``qin``), page by page until the first live one (a lease end at or after now):
    the waiters before it are dead or gone, and whoever decides from it needs to know no
    more. An item with nobody waiting is returned as it is. ``consistent=False``: an
    eventually consistent read (half the read units), which may miss an entry put or show
    one deleted in the last moments."""
    upto = item.qin if upto is None else upto
    if upto <= item.qout:
        return dataclasses.replace(item, entries=(), entries_to=upto)
    now = time.time() * 1000
    found: list[Waiter] = []
    start = None
    while True:
        page, start = _entry_page(item, upto, ENTRY_PAGE, start, consistent)
        found += page
        if not start or any(w.expires_ms >= now for w in page):
            break
    covered = found[-1].ticket if start else upto
    return dataclasses.replace(item, entries=tuple(found), entries_to=covered)


# A push carries the queue up to its recipient and this many entries behind it: what the
# recipient needs (who is ahead of it; whom to hand over to next), not a crowd's every entry.
PUSHED_BEHIND = 16


def wire(item: LockItem, for_token: str | None = None) -> dict[str, Any]:
    """The row as a push carries it (JSON-safe); :func:`lock_item` reads it back.

    ``for_token``: the recipient. A long queue is cut to the entries up to the recipient's
    ticket (so it sees everyone ahead of it) and :data:`PUSHED_BEHIND` after it (its heirs),
    so that a push to the head of a line of hundreds still fits a datagram. A cut queue can
    make a write whose condition counts the queue be refused, never a wrong one succeed."""
    stored = dict(item.stored)
    queue = stored.get("queue")
    if for_token is None or not isinstance(queue, dict) or len(queue) <= PUSHED_BEHIND:
        return stored
    mine = item.queue.get(for_token)
    mine_ticket = mine.ticket if mine is not None else 0
    order = sorted(item.queue.items(), key=lambda entry: entry[1].ticket)
    ahead = [t for t, w in order if w.ticket <= mine_ticket]
    behind = [t for t, w in order if w.ticket > mine_ticket][:PUSHED_BEHIND]
    stored["queue"] = {t: queue[t] for t in ahead + behind if t in queue}
    return stored


# ---------------------------------------------------------------------------------------------
# Reading many rows through the indexes
# ---------------------------------------------------------------------------------------------


def query_expiring(
    shard: int,
    *,
    before: int | None = None,
    since: int | None = None,
    limit: int | None = None,
    start: dict[str, Any] | None = None,
    shared_only: bool = False,
) -> tuple[list[IndexEntry], dict[str, Any] | None]:
    """One page of one shard of the expires index, by ``expires`` (epoch seconds)."""
    names = {"#shard": "shard", "#exp": "expires"}
    values: dict[str, Any] = {":s": shard}
    cond = "#shard = :s"
    if before is not None:
        cond += " AND #exp < :b"
        values[":b"] = before
    elif since is not None:
        cond += " AND #exp >= :a"
        values[":a"] = since
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "IndexName": EXPIRES_INDEX,
        "KeyConditionExpression": cond,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": encode(values),
    }
    if shared_only:
        # Counting and shared rows name only one of their holders in userId.
        kwargs["FilterExpression"] = "#mode <> :x"
        names["#mode"] = "mode"
        kwargs["ExpressionAttributeValues"][":x"] = {"S": "x"}
    return _query(kwargs, limit, start)


def iter_expiring(shard: int, **kwargs: Any) -> Iterator[IndexEntry]:
    start = None
    while True:
        rows, start = query_expiring(shard, start=start, **kwargs)
        yield from rows
        if not start:
            return


def delete_expired(resource: str, cutoff_ms: int, *, resent: bool = False) -> bool:
    """Delete a lock row only if its lease still ended before ``cutoff_ms``; False if it
    survived (or was gone before: deleted by TTL or another reaper).

    ``resent``: an earlier send of this delete went unanswered (a timeout, a 5xx) and may have
    been applied. A refusal then, or after botocore's own re-send (``Refused.retried``), with
    the row gone is our earlier delete's doing: True, not a row that changed since listed.
    The row as it was comes back with the refusal (``ALL_OLD``), at no extra read unit."""
    try:
        _send(
            "delete_item",
            TableName=settings.TABLE_NAME,
            Key=key(resource, LOCK_SK),
            ConditionExpression="#expMs < :cut",
            ExpressionAttributeNames={"#expMs": "expMs"},
            ExpressionAttributeValues=encode({":cut": cutoff_ms}),
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except Refused as refused:
        return (resent or refused.retried) and refused.item is None
    return True


def query_user_page(
    user_id: str, since: int, limit: int | None, start: dict[str, Any] | None
) -> tuple[list[IndexEntry], dict[str, Any] | None]:
    """One page of the userId index: rows whose latest holder is ``user_id`` and whose lease
    ends at or after ``since`` (epoch seconds)."""
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "IndexName": USER_INDEX,
        "KeyConditionExpression": "#uid = :u AND #exp >= :a",
        "ExpressionAttributeNames": {"#uid": "userId", "#exp": "expires"},
        "ExpressionAttributeValues": {":u": {"S": user_id}, ":a": {"N": str(since)}},
    }
    return _query(kwargs, limit, start)


def _query(
    kwargs: dict[str, Any], limit: int | None, start: dict[str, Any] | None
) -> tuple[list[IndexEntry], dict[str, Any] | None]:
    """One page of a Query of one of our indexes: its entries and LastEvaluatedKey. On a table
    not upgraded yet (``dynasem_createtable --upgrade``), of the old index of the same keys
    instead, so listings and reaping keep working until it is."""
    if limit:
        kwargs["Limit"] = limit
    if start:
        kwargs["ExclusiveStartKey"] = start
    try:
        response = _send("query", **kwargs)
    except TableMissing as exc:
        old = dict(zip((USER_INDEX, EXPIRES_INDEX), OLD_INDEXES, strict=True))
        if "lacks an index" not in str(exc) or kwargs["IndexName"] not in old:
            raise
        response = _send("query", **dict(kwargs, IndexName=old[kwargs["IndexName"]]))
    entries = [index_entry(decode(i)) for i in response.get("Items", [])]
    return entries, response.get("LastEvaluatedKey")


# BatchGetItem's limit on the keys of one request.
MAX_BATCH_GET = 100


def get_many(entries: list[IndexEntry], *, consistent: bool = False) -> list[LockItem]:
    """The lock rows of index entries, read from the base table (eventually consistent, as
    the index itself is, unless ``consistent``: twice the read units, for a decision or a
    report of what a write would do), in the entries' order; a row gone meanwhile is left
    out. Each row sorts where its entry did (``listed_s``), which is where a page cursor goes
    on from."""
    found: dict[str, dict[str, Any]] = {}
    wanted = list(dict.fromkeys(e.resource for e in entries))
    for i in range(0, len(wanted), MAX_BATCH_GET):
        keys: list[dict[str, Any]] = [key(r, LOCK_SK) for r in wanted[i : i + MAX_BATCH_GET]]
        for attempt in range(8):
            if not keys:
                break
            if attempt:
                time.sleep(min(0.05 * 2**attempt, 1.0))  # throttled: DynamoDB said try later
            asked: dict[str, Any] = {"Keys": keys}
            if consistent:
                asked["ConsistentRead"] = True
            response = _send("batch_get_item", RequestItems={settings.TABLE_NAME: asked})
            for item in response.get("Responses", {}).get(settings.TABLE_NAME, []):
                row = decode(item)
                found[str(row["pk"])] = row
            keys = response.get("UnprocessedKeys", {}).get(settings.TABLE_NAME, {}).get("Keys", [])
        if keys:
            raise SemaphoreUnavailable(
                f"DynamoDB at {endpoint_label()} left {len(keys)} rows unread (throttled)",
                transient=True,
            )
    rows = []
    for entry in entries:
        row = found.get(entry.resource)
        if row is not None:
            rows.append(dataclasses.replace(lock_item(row), listed_s=entry.listed_s))
    return rows


def scan_jobs(
    prefix: str | None, status: str | None, start: dict[str, Any] | None
) -> tuple[list[JobRow], dict[str, Any] | None]:
    """One Scan page of run_once rows.

    A Scan, because job rows are in no index (they carry no ``expires``); it reads the lock
    rows too, 1 MB a request, which is acceptable for an admin page read by hand. ``status``
    "NEW" means never run or reset (no status stored)."""
    names = {"#sk": "sk"}
    values: dict[str, Any] = {":job": {"S": JOB_SK}}
    conditions = ["#sk = :job"]
    if prefix:
        names["#pk"] = "pk"
        values[":p"] = {"S": prefix}
        conditions.append("begins_with(#pk, :p)")
    if status == "NEW":
        names["#st"] = "status"
        conditions.append("attribute_not_exists(#st)")
    elif status:
        names["#st"] = "status"
        values[":st"] = {"S": status}
        conditions.append("#st = :st")
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "FilterExpression": " AND ".join(conditions),
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    if start:
        kwargs["ExclusiveStartKey"] = start
    response = _send("scan", **kwargs)
    return [job_row(decode(i)) for i in response.get("Items", [])], response.get("LastEvaluatedKey")


def get_job(pk: str) -> JobRow | None:
    """The run_once row of ``pk`` (one consistent read), or None if never run."""
    item = _get(pk, JOB_SK)
    return job_row(item) if item else None
