"""Reading many lock rows through the indexes (``expires`` and ``userId``): the pages of a
query, and the rows behind index entries."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from ..conf import settings
from ..exceptions import SemaphoreUnavailable
from . import dynamodb
from .dynamodb import (
    endpoint_label,
)
from .records import (
    EXPIRES_INDEX,
    LOCK_SK,
    USER_INDEX,
    IndexEntry,
    LockItem,
    Mode,
    decode,
    encode,
    index_entry,
    key,
    lock_item,
)


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
        "KeyConditionExpression": cond,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": encode(values),
    }
    if shared_only:
        # Counting and shared rows name only one of their holders in userId.
        kwargs["FilterExpression"] = "#mode <> :x"
        names["#mode"] = "mode"
        kwargs["ExpressionAttributeValues"][":x"] = {"S": Mode.EXCLUSIVE.value}
    return _query(EXPIRES_INDEX, kwargs, limit, start)


def iter_expiring(shard: int, **kwargs: Any) -> Iterator[IndexEntry]:
    start = None
    while True:
        rows, start = query_expiring(shard, start=start, **kwargs)
        yield from rows
        if not start:
            return


def query_user_page(
    user_id: str, since: int, limit: int | None, start: dict[str, Any] | None
) -> tuple[list[IndexEntry], dict[str, Any] | None]:
    """One page of the userId index: rows whose latest holder is ``user_id`` and whose lease
    ends at or after ``since`` (epoch seconds)."""
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "KeyConditionExpression": "#uid = :u AND #exp >= :a",
        "ExpressionAttributeNames": {"#uid": "userId", "#exp": "expires"},
        "ExpressionAttributeValues": {":u": {"S": user_id}, ":a": {"N": str(since)}},
    }
    return _query(USER_INDEX, kwargs, limit, start)


def _query(
    index: str, kwargs: dict[str, Any], limit: int | None, start: dict[str, Any] | None
) -> tuple[list[IndexEntry], dict[str, Any] | None]:
    """One page of a Query of one of our indexes: its entries and LastEvaluatedKey."""
    kwargs["IndexName"] = index
    if limit:
        kwargs["Limit"] = limit
    if start:
        kwargs["ExclusiveStartKey"] = start
    response = dynamodb.send_request("query", **kwargs)
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
            response = dynamodb.send_request(
                "batch_get_item", RequestItems={settings.TABLE_NAME: asked}
            )
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
