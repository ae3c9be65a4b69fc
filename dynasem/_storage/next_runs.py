"""The next-run registration of a coalescing semaphore (:mod:`dynasem._engine.coalescing`):
one small item per resource beside its lock row (:class:`~dynasem._storage.records.NextRun`,
``sk = "next"``): the registered caller's token and user, the resource's fence seen when it
registered (the hold it comes after), its lease end and a TTL. It is in neither index, and
its writes cost the item alone (1 WCU)."""

from __future__ import annotations

from typing import Any

from . import dynamodb
from .records import NEXT_SK, NextRun, from_item, key, next_run_item

# DynamoDB's TTL deletes an item days after this at the earliest: a registration whose lease
# has passed is ignored by its fields alone; the TTL only clears away idle resources' items.
TTL_AFTER_S = 3600


def register_next(
    resource: str, *, token: str, user_id: str, after_fence: int, until_ms: int, stale_ms: int
) -> str | None:
    """Register ``token`` as the next run, unless a registration is there that has not run
    yet: one made after the same or a later fence (``af >= after_fence``) whose lease is not
    over (``un >= stale_ms``). None when registered; else the registered one's user id."""
    run = NextRun(token, user_id, after_fence, until_ms, until_ms // 1000 + TTL_AFTER_S)
    condition = "attribute_not_exists(#pk) OR #un < :stale OR #af < :af"
    request = {"Item": next_run_item(resource, run), "ConditionExpression": condition}
    values = {":stale": stale_ms, ":af": after_fence}
    try:
        dynamodb.send_to_table("put_item", values, **request, **dynamodb.REFUSED_OLD)
    except dynamodb.Refused as refused:
        there = from_item(NextRun, refused.item or {})
        if there.token == token:
            return None  # our own write, applied, whose answer was lost
        return there.user_id or "unknown"
    return None


def renew_next(resource: str, token: str, until_ms: int) -> bool:
    """Push the registration's lease on; False if it is not ours any more (replaced)."""
    values = {":un": until_ms, ":exp": until_ms // 1000 + TTL_AFTER_S}
    update = "SET #un = :un, #exp = :exp"
    return _if_ours("update_item", resource, token, values, UpdateExpression=update)


def withdraw_next(resource: str, token: str) -> None:
    """Delete the registration if it is still ours (the next run gave up or failed)."""
    _if_ours("delete_item", resource, token, {})


def _if_ours(
    operation: str, resource: str, token: str, values: dict[str, Any], **request: Any
) -> bool:
    """``operation`` on the registration, conditional on its token being ``token``; False
    when it was refused (replaced, or gone)."""
    request |= {"Key": key(resource, NEXT_SK), "ConditionExpression": "#k = :k"}
    try:
        dynamodb.send_to_table(operation, {":k": token, **values}, **request)
    except dynamodb.Refused:
        return False
    return True
