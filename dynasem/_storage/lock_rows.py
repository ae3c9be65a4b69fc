"""Reading and writing lock rows (``sk = lock``): the conditional update, the all-or-none
transaction, the consistent or eventually consistent read, the reaper's conditional delete, and
the row as a push carries it."""

from __future__ import annotations

from typing import Any

from ..conf import settings
from ..exceptions import SemaphoreUnavailable
from . import dynamodb, records
from .records import LOCK_SK, LockItem, decode, key, lock_item


def update(action: dict[str, Any], *, return_new: bool = False) -> LockItem | None:
    """Send one conditional lock write. Raises :class:`Refused` with the old row."""
    row = update_item(action, return_new)
    return None if row is None else lock_item(row)


def update_item(action: dict[str, Any], return_new: bool) -> dict[str, Any] | None:
    returns = {"ReturnValues": "ALL_NEW" if return_new else "NONE"}
    request = {"TableName": settings.TABLE_NAME, **returns, **dynamodb.REFUSED_OLD, **action}
    response = dynamodb.send_request("update_item", **request)
    return decode(response.get("Attributes")) if return_new else None


def transact(actions: list[dict[str, Any]]) -> None:
    """Send UpdateItem actions as one all-or-none transaction. Raises :class:`Cancelled`."""
    refused = {"TableName": settings.TABLE_NAME, **dynamodb.REFUSED_OLD}
    items = [{"Update": action | refused} for action in actions]
    dynamodb.send_request("transact_write_items", TransactItems=items)


def get(resource: str, *, consistent: bool = True) -> LockItem | None:
    """One read of a lock row (used only where no write can tell us): strongly consistent,
    unless ``consistent`` is False (half the read units: for a queued waiter's look, which
    only decides when to write, every write being conditional on the row as it is)."""
    row = get_item(resource, LOCK_SK, consistent=consistent)
    return None if row is None else lock_item(row)


def get_item(pk: str, sk: str = LOCK_SK, *, consistent: bool = True) -> dict[str, Any] | None:
    """An item exactly as stored, decoded to plain Python (tests and diagnostics check the
    stored format itself with it; the app reads :func:`get` and
    :func:`~dynasem._storage.job_rows.get_job`)."""
    response = dynamodb.send_to_table("get_item", Key=key(pk, sk), ConsistentRead=consistent)
    return decode(response.get("Item"))


def broken_by(pk: str, sk: str, breaker: str) -> bool:
    """Whether the item at ``sk`` is the tombstone of the break whose word is ``breaker``: a
    break whose answer was lost tells by it that it was applied (one consistent read; False
    when that read fails too)."""
    try:
        item = get_item(pk, sk)
    except SemaphoreUnavailable:
        return False
    return records.broken_by(item, breaker)


def wire(item: LockItem) -> dict[str, Any]:
    """The row as a push carries it (JSON-safe); :func:`lock_item` reads it back."""
    return dict(item.stored)


def delete_expired(resource: str, cutoff_ms: int, *, resent: bool = False) -> bool:
    """Delete a lock row only if its lease still ended before ``cutoff_ms`` and its
    ``expires`` bucket did too (as the reaper's listing asks; an index entry may lag its row,
    and a take late past CLOCK_SKEW is re-fenced only once its bucket has passed:
    take.may_be_reaped); False if it survived (or was gone before: deleted by TTL or another
    reaper).

    ``resent``: an earlier send of this delete went unanswered (a timeout, a 5xx) and may have
    been applied. A refusal then, or after botocore's own re-send (``Refused.retried``), with
    the row gone is our earlier delete's doing: True, not a row that changed since listed.
    The row as it was comes back with the refusal (``ALL_OLD``), at no extra read unit."""
    try:
        condition = "#expMs < :cut AND #exp < :before"
        request = {"Key": key(resource, LOCK_SK), "ConditionExpression": condition}
        values = {":cut": cutoff_ms, ":before": cutoff_ms // 1000}
        dynamodb.send_to_table("delete_item", values, **request, **dynamodb.REFUSED_OLD)
    except dynamodb.Refused as refused:
        return (resent or refused.retried) and refused.item is None
    return True
