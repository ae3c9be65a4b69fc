"""Reading many lock rows through the indexes (``expires`` and ``userId``): the pages of a
query, and the rows behind index entries."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..conf import settings
from ..exceptions import SemaphoreUnavailable
from . import dynamodb, records
from .records import LOCK_SK, IndexEntry, LockItem, decode, from_item, key, lock_item


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
    values: dict[str, Any] = {":s": shard}
    condition = "#shard = :s"
    if before is not None:
        condition += " AND #exp < :b"
        values[":b"] = before
    elif since is not None:
        condition += " AND #exp >= :a"
        values[":a"] = since
    request = {"IndexName": records.EXPIRES_INDEX, "KeyConditionExpression": condition}
    if shared_only:  # counting and shared rows name only one of their holders in userId
        values[":x"] = records.Mode.EXCLUSIVE.value
        request["FilterExpression"] = "#mode <> :x"
    items, last = dynamodb.page("query", limit, start, values=values, **request)
    return [from_item(IndexEntry, item) for item in items], last


def query_user_page(
    user_id: str, since: int, limit: int | None, start: dict[str, Any] | None
) -> tuple[list[IndexEntry], dict[str, Any] | None]:
    """One page of the userId index: rows whose latest holder is ``user_id`` and whose lease
    ends at or after ``since`` (epoch seconds)."""
    values, condition = {":u": user_id, ":a": since}, "#uid = :u AND #exp >= :a"
    request = {"IndexName": records.USER_INDEX, "KeyConditionExpression": condition}
    items, last = dynamodb.page("query", limit, start, values=values, **request)
    return [from_item(IndexEntry, item) for item in items], last


# BatchGetItem's limit on the keys of one request.
MAX_BATCH_GET = 100


def get_many(
    entries: list[IndexEntry], *, consistent: bool = False, as_listed: bool = True
) -> list[LockItem]:
    """The lock rows of index entries, read from the base table (eventually consistent, as
    the index itself is, unless ``consistent``: twice the read units, for a decision or a
    report of what a write would do), in the entries' order; a row gone meanwhile is left
    out. Each row sorts where its entry did (``listed_s``), which is where a page cursor goes
    on from; not ``as_listed``: each keeps its own stored ``expires`` (what a condition on
    the row reads, where an index entry may lag it)."""
    found: dict[str, LockItem] = {}
    table = settings.TABLE_NAME
    wanted = list(dict.fromkeys(e.resource for e in entries))
    for i in range(0, len(wanted), MAX_BATCH_GET):
        keys: list[dict[str, Any]] = [key(r, LOCK_SK) for r in wanted[i : i + MAX_BATCH_GET]]
        for attempt in range(8):
            if not keys:
                break
            if attempt:
                time.sleep(min(0.05 * 2**attempt, 1.0))  # throttled: DynamoDB said try later
            asked = {"Keys": keys, **({"ConsistentRead": True} if consistent else {})}
            response = dynamodb.send_request("batch_get_item", RequestItems={table: asked})
            rows = response.get("Responses", {}).get(table, [])
            found |= {row.resource: row for row in (lock_item(decode(item)) for item in rows)}
            keys = response.get("UnprocessedKeys", {}).get(table, {}).get("Keys", [])
        if keys:
            raise SemaphoreUnavailable(
                f"DynamoDB at {dynamodb.endpoint_label()} left {len(keys)} rows unread (throttled)",
                transient=True,
            )
    # Each row sorts where its entry did.
    listed = [(found[e.resource], e.listed_s) for e in entries if e.resource in found]
    if not as_listed:
        return [row for row, _ in listed]
    return [dataclasses.replace(row, listed_s=listed_s) for row, listed_s in listed]
