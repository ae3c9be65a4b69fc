"""The writes: PutItem, UpdateItem, DeleteItem and TransactWriteItems.

Each is planned first (the new image, computed from the old one without changing it), then
applied: a single write applies its plan, a transaction applies its plans only when every one
of them holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .requests import (
    Bound,
    DynamoError,
    bind,
    check_return,
    consumed,
    index_units,
    read_units,
    refused,
    write_units,
)
from .tables import Key, Record, Table
from .updates import apply_update, check_paths
from .values import MAX_ITEM, Invalid, Item, attribute_size, copy_item, item_size, normal_item

if TYPE_CHECKING:
    from .dynamodb import SimDynamoDB

MAX_TRANSACTION = 100
TOO_BIG = "Item size has exceeded the maximum allowed size"
TOO_BIG_UPDATE = "Item size to update has exceeded the maximum allowed size"


@dataclass
class Plan:
    """One write, planned: the item before and after (``new`` None: deleted), or the refusal
    that stops it."""

    table: Table
    key: Key
    record: Record | None
    old: Item | None
    new: Item | None = None
    touched: set[str] = field(default_factory=set)
    check_only: bool = False  # a transaction's ConditionCheck
    failed: DynamoError | None = None  # the condition failed (or the update was refused)
    invalid: str | None = None  # refused as invalid (a transaction's ValidationError)
    size: int | None = None  # the new image's size

    def table_units(self) -> float:
        """Write units: the larger of the item before and after, at least 1."""
        old = None
        if self.old is not None:
            old = self.record.size if self.record is not None else item_size(self.old)
        new = None if self.new is None else self.size
        if self.new is not None and new is None:
            new = self.size = item_size(self.new)
        return float(max(write_units(old), write_units(new), 1))

    def index_units(self) -> dict[str, float]:
        return index_units(self.table, self.old, self.new)


def _condition(plan: Plan, bound: Bound, params: Mapping[str, Any]) -> bool:
    parsed = bound.get("ConditionExpression")
    if parsed is None or parsed.condition is None:
        return True
    if parsed.condition(plan.old, bound.names, bound.values):
        return True
    plan.failed = refused(params, plan.old)
    return False


def _located(table: Table, key: Key) -> tuple[Record | None, Item | None]:
    record = table.records.get(key)
    return record, None if record is None else record.item


def plan_put(table: Table, params: Mapping[str, Any], bound: Bound) -> Plan:
    item = normal_item(params.get("Item") or {})
    key = table.key_of(item, exact=False)
    size = item_size(item)
    if size > MAX_ITEM:
        raise Invalid(TOO_BIG)
    table.check_index_keys(item, update=False)
    record, old = _located(table, key)
    plan = Plan(table, key, record, old, item, size=size)
    _condition(plan, bound, params)
    return plan


def plan_update(table: Table, params: Mapping[str, Any], bound: Bound) -> Plan:
    key_item = normal_item(params.get("Key") or {})
    key = table.key_of(key_item, exact=True)
    parsed = bound.get("UpdateExpression")
    update = None if parsed is None else parsed.update
    paths = None if update is None else check_paths(update, bound.names, table.key_names())
    record, old = _located(table, key)
    plan = Plan(table, key, record, old)
    if not _condition(plan, bound, params):
        return plan
    if update is None:
        plan.new = dict(old) if old is not None else dict(key_item)
        return plan
    try:
        plan.new, plan.touched = apply_update(
            old, key_item, update, bound.names, bound.values, paths
        )
        plan.size = _size_after(plan, old, plan.new)
        if plan.size > MAX_ITEM:
            raise Invalid(TOO_BIG_UPDATE)
        table.check_index_keys(plan.new, update=True, touched=plan.touched)
    except Invalid as exc:
        plan.invalid, plan.new = str(exc), None
    return plan


def _size_after(plan: Plan, old: Item | None, new: Item) -> int:
    """The new image's size: the old one's, with the attributes the update touched measured
    again (an update shares every other value with the old image)."""
    if old is None or plan.record is None:
        return item_size(new)
    size = plan.record.size
    for name in plan.touched:
        if name in old:
            size -= attribute_size(name, old[name])
        if name in new:
            size += attribute_size(name, new[name])
    return size


def plan_delete(table: Table, params: Mapping[str, Any], bound: Bound) -> Plan:
    key = table.key_of(normal_item(params.get("Key") or {}), exact=True)
    record, old = _located(table, key)
    plan = Plan(table, key, record, old)
    _condition(plan, bound, params)
    return plan


def plan_check(table: Table, params: Mapping[str, Any], bound: Bound) -> Plan:
    if bound.get("ConditionExpression") is None:
        raise Invalid("The ConditionCheck must have a ConditionExpression")
    key = table.key_of(normal_item(params.get("Key") or {}), exact=True)
    record, old = _located(table, key)
    plan = Plan(table, key, record, old, old, check_only=True)
    if not _condition(plan, bound, params) and plan.failed is not None:
        plan.failed.message += "."  # DynamoDB Local's ConditionCheck says it with a full stop
    return plan


# -- single writes ---------------------------------------------------------------------------------


def _single(db: SimDynamoDB, plan: Plan, params: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a planned single write (or raise its refusal); its capacity answer."""
    table = plan.table
    if db.over(table, plan.key[0], "w"):
        raise db.throttled()
    if db.in_transaction(plan.record):
        raise DynamoError("TransactionConflictException", "Transaction is ongoing for the item")
    if plan.failed is not None:
        db.spend(table, plan.key[0], "w", 1.0)
        raise plan.failed
    if plan.invalid is not None:
        raise Invalid(plan.invalid)
    units = plan.table_units()
    db.spend(table, plan.key[0], "w", units)
    asked = params.get("ReturnConsumedCapacity", "NONE") != "NONE"
    indexes = plan.index_units() if asked else None
    db.write(table, plan.key, plan.new, plan.size)
    return consumed(params, table.name, units, indexes) if asked else {}


def put_item(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    return _replace_whole(db, params, plan_put)


def _replace_whole(
    db: SimDynamoDB, params: dict[str, Any], planner: Callable[..., Plan]
) -> dict[str, Any]:
    """A PutItem or DeleteItem: the item replaced whole, the old one returned if asked."""
    table = db.table(params)
    returns = check_return(params, ("NONE", "ALL_OLD"))
    plan = planner(table, params, bind(params))
    response = _single(db, plan, params)
    if returns == "ALL_OLD" and plan.old is not None:
        response["Attributes"] = copy_item(plan.old)
    return response


def update_item(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    returns = check_return(params, ("NONE", "ALL_OLD", "ALL_NEW", "UPDATED_OLD", "UPDATED_NEW"))
    plan = plan_update(table, params, bind(params))
    response = _single(db, plan, params)
    attributes = _returned(returns, plan)
    if attributes:
        response["Attributes"] = copy_item(attributes)
    return response


def _returned(returns: str, plan: Plan) -> Item | None:
    old, new = plan.old, plan.new or {}
    if returns == "ALL_NEW":
        return new
    if returns == "ALL_OLD":
        return old
    if returns == "UPDATED_OLD":
        return None if old is None else {n: old[n] for n in plan.touched if n in old}
    if returns == "UPDATED_NEW":
        return {n: new[n] for n in plan.touched if n in new}
    return None


def delete_item(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    return _replace_whole(db, params, plan_delete)


# -- transactions ----------------------------------------------------------------------------------

ACTIONS = {
    "Put": plan_put,
    "Update": plan_update,
    "Delete": plan_delete,
    "ConditionCheck": plan_check,
}


def transact_write_items(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    actions = params.get("TransactItems") or []
    if len(actions) > MAX_TRANSACTION:
        raise Invalid("Member must have length less than or equal to 100")
    if not actions:
        raise Invalid("Member must have length greater than or equal to 1")
    token = params.get("ClientRequestToken")
    if token is not None and _replayed(db, params, str(token)):
        return {}
    plans = [_plan_action(db, action) for action in actions]
    if len({(p.table.name, p.key) for p in plans}) != len(plans):
        raise Invalid("Transaction request cannot include multiple operations on one item")
    _throttle(db, plans)
    _conflicts(db, plans)
    reasons = [_reason(action, plan) for action, plan in zip(actions, plans, strict=True)]
    if any(r["Code"] != "None" for r in reasons):
        _cancel(reasons)
    response = _commit(db, plans, params)
    if token is not None:  # the token is the applied request's: a cancelled one is not kept
        db.tokens[str(token)] = (_signature(params), db.now())
    return response


def _plan_action(db: SimDynamoDB, action: Mapping[str, Any]) -> Plan:
    if len(action) != 1 or next(iter(action)) not in ACTIONS:
        raise Invalid("TransactItems can only contain one of Check, Put, Update or Delete")
    ((kind, body),) = action.items()
    table = db.table(body)
    check_return(body, ("NONE",))
    return ACTIONS[kind](table, body, bind(body))


def _throttle(db: SimDynamoDB, plans: list[Plan]) -> None:
    throttled = [db.over(p.table, p.key[0], "w") for p in plans]
    if any(throttled):
        reasons = [
            {
                "Code": "ThrottlingError",
                "Message": "Throughput exceeds the current capacity of your table or index.",
            }
            if hit
            else {"Code": "None"}
            for hit in throttled
        ]
        _cancel(reasons)


def _conflicts(db: SimDynamoDB, plans: list[Plan]) -> None:
    busy = [db.held(p.record) for p in plans]
    share = db.profile.conflict_share
    if not any(busy) and share > 0 and db.rng.random() < share:
        busy[db.rng.randrange(len(plans))] = True
        db.counts["transaction conflicts (share)"] += 1
    if any(busy):
        reasons = [
            {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            if hit
            else {"Code": "None"}
            for hit in busy
        ]
        _cancel(reasons)


def _cancel(reasons: list[dict[str, Any]]) -> None:
    codes = ", ".join(r["Code"] for r in reasons)
    message = (
        f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]"
    )
    raise DynamoError(
        "TransactionCanceledException", message, Message=message, CancellationReasons=reasons
    )


def _reason(action: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    if plan.failed is not None:
        reason: dict[str, Any] = {"Code": "ConditionalCheckFailed", "Message": plan.failed.message}
        if "Item" in plan.failed.extra:
            reason["Item"] = plan.failed.extra["Item"]
        return reason
    if plan.invalid is not None:
        return {"Code": "ValidationError", "Message": plan.invalid}
    return {"Code": "None"}


def _commit(db: SimDynamoDB, plans: list[Plan], params: Mapping[str, Any]) -> dict[str, Any]:
    """Apply every planned write; the transaction's capacity: twice each write's (and twice
    a consistent read's for a ConditionCheck)."""
    units: dict[str, float] = {}
    indexes: dict[str, dict[str, float]] = {}
    now = db.now()
    for plan in plans:
        table = plan.table
        if plan.check_only:
            size = 0 if plan.old is None else item_size(plan.old)
            spent = 2 * max(read_units(size, True), 1.0)
        else:
            spent = 2 * plan.table_units()
            for name, u in plan.index_units().items():
                per = indexes.setdefault(table.name, {})
                per[name] = per.get(name, 0.0) + 2 * u
            db.write(table, plan.key, plan.new, plan.size)
        db.spend(table, plan.key[0], "w", spent)
        units[table.name] = units.get(table.name, 0.0) + spent
        record = table.records.get(plan.key)
        if record is not None:
            record.tx_until = now + db.profile.transaction_hold
            record.tx_seen = True
    entries = [consumed(params, name, u, indexes.get(name)) for name, u in units.items()]
    if not any(entries):
        return {}
    return {"ConsumedCapacity": [e["ConsumedCapacity"] for e in entries]}


def _replayed(db: SimDynamoDB, params: Mapping[str, Any], token: str) -> bool:
    """ClientRequestToken: the same request again within 10 minutes succeeds without being
    applied again; another request with that token is refused. Only an applied request's token
    is kept (:func:`transact_write_items`): one cancelled is evaluated afresh when re-sent."""
    seen = db.tokens.get(token)
    if seen is not None and seen[1] > db.now() - 600:
        if seen[0] != _signature(params):
            raise DynamoError(
                "IdempotentParameterMismatchException",
                "Request parameters do not match those of the request with the same idempotency "
                "token",
            )
        return True
    return False


def _signature(params: Mapping[str, Any]) -> str:
    return json.dumps(params.get("TransactItems"), sort_keys=True, default=str)
