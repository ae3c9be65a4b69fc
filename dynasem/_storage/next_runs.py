"""The next-run registration of a coalescing semaphore (:mod:`dynasem._engine.coalescing`): one
small
item per resource beside its lock row, ``sk = "next"``.

It carries the registered caller's token ``k`` and user ``u``, the resource's fence ``af``
seen when it registered (the hold it comes after), the end of its lease ``un`` (ms) and a TTL
``expires`` (s). It carries no ``userId`` nor ``shard``: it is in neither index, and its
writes cost the item alone (1 WCU)."""

from __future__ import annotations

from ..conf import settings
from . import dynamodb
from .dynamodb import Refused
from .records import decode, encode, key

NEXT_SK = "next"
# DynamoDB's TTL deletes an item days after this at the earliest: a registration whose lease
# has passed is ignored by its fields alone; the TTL only clears away idle resources' items.
TTL_AFTER_S = 3600

_NAMES = {"#pk": "pk", "#un": "un", "#af": "af"}


def register_next(
    resource: str,
    *,
    token: str,
    user_id: str,
    after_fence: int,
    until_ms: int,
    stale_ms: int,
) -> str | None:
    """Register ``token`` as the next run, unless a registration is there that has not run
    yet: one made after the same or a later fence (``af >= after_fence``) whose lease is not
    over (``un >= stale_ms``). None when registered; else the registered one's user id."""
    try:
        dynamodb.send_request(
            "put_item",
            TableName=settings.TABLE_NAME,
            Item=encode(
                {
                    **_plain_key(resource),
                    "k": token,
                    "u": user_id,
                    "af": after_fence,
                    "un": until_ms,
                    "expires": until_ms // 1000 + TTL_AFTER_S,
                }
            ),
            ConditionExpression="attribute_not_exists(#pk) OR #un < :stale OR #af < :af",
            ExpressionAttributeNames=_NAMES,
            ExpressionAttributeValues=encode({":stale": stale_ms, ":af": after_fence}),
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except Refused as refused:
        item = refused.item or {}
        if item.get("k") == token:
            return None  # our own write, applied, whose answer was lost
        return str(item.get("u") or "unknown")
    return None


def renew_next(resource: str, token: str, until_ms: int) -> bool:
    """Push the registration's lease on; False if it is not ours any more (replaced)."""
    return _if_ours(
        "update_item",
        resource,
        token,
        UpdateExpression="SET #un = :un, #ex = :ex",
        names={"#un": "un", "#ex": "expires"},
        values={":un": until_ms, ":ex": until_ms // 1000 + TTL_AFTER_S},
    )


def withdraw_next(resource: str, token: str) -> None:
    """Delete the registration if it is still ours (the next run gave up or failed)."""
    _if_ours("delete_item", resource, token)


def _if_ours(
    operation: str,
    resource: str,
    token: str,
    *,
    names: dict[str, str] | None = None,
    values: dict[str, object] | None = None,
    **request: object,
) -> bool:
    """``operation`` on the registration, conditional on its token being ``token``; False
    when it was refused (replaced, or gone)."""
    try:
        dynamodb.send_request(
            operation,
            TableName=settings.TABLE_NAME,
            Key=key(resource, NEXT_SK),
            ConditionExpression="#k = :k",
            ExpressionAttributeNames={"#k": "k", **(names or {})},
            ExpressionAttributeValues=encode({":k": token, **(values or {})}),
            **request,
        )
    except Refused:
        return False
    return True


def get_next(resource: str) -> dict[str, object] | None:
    """The registration as stored (one consistent read), or None."""
    response = dynamodb.send_request(
        "get_item", TableName=settings.TABLE_NAME, Key=key(resource, NEXT_SK), ConsistentRead=True
    )
    item = response.get("Item")
    return decode(item) if item else None


def _plain_key(resource: str) -> dict[str, str]:
    return {"pk": resource, "sk": NEXT_SK}
