"""What every request shares: DynamoDB's errors as botocore raises them, a request's
expressions bound to its names and values, and capacity units as DynamoDB counts them."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import botocore.session
from botocore.exceptions import ClientError

from .expressions import Parsed, parse, resolve
from .tables import IndexDef, Table
from .values import Invalid, Item, Value, item_size, normal


class DynamoError(Exception):
    """An error DynamoDB answers with: its code, message and extra fields
    (``Item``, ``CancellationReasons``...)."""

    def __init__(self, code: str, message: str, status: int = 400, **extra: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status, self.extra = code, message, status, extra


def not_found() -> DynamoError:
    return DynamoError("ResourceNotFoundException", "Cannot do operations on a non-existent table")


@functools.cache
def exceptions() -> Any:
    """botocore's exception classes of the DynamoDB client (``client.exceptions``)."""
    session = botocore.session.get_session()
    client = session.create_client(
        "dynamodb",
        region_name="us-east-1",
        aws_access_key_id="sim",
        aws_secret_access_key="sim",
        endpoint_url="http://127.0.0.1:9",
    )
    return client.exceptions


def client_error(error: DynamoError, operation: str) -> ClientError:
    """The exception botocore raises for ``error`` (its modeled subclass of ClientError)."""
    response: dict[str, Any] = {
        "Error": {"Message": error.message, "Code": error.code},
        "ResponseMetadata": {"HTTPStatusCode": error.status, "HTTPHeaders": {}, "RetryAttempts": 0},
        **error.extra,
    }
    kind = exceptions().from_code(error.code)
    exc: ClientError = kind(response, operation)
    return exc


# -- expressions bound to a request ----------------------------------------------------------------

KINDS = (
    "KeyConditionExpression",
    "FilterExpression",
    "ProjectionExpression",
    "ConditionExpression",
    "UpdateExpression",
)


@dataclass
class Bound:
    """A request's expressions, parsed, with its names and (normalized) values."""

    parsed: dict[str, Parsed]
    names: Mapping[str, str]
    values: Mapping[str, Value]

    def get(self, kind: str) -> Parsed | None:
        return self.parsed.get(kind)

    def projection(self) -> list[tuple[str | int, ...]] | None:
        parsed = self.parsed.get("ProjectionExpression")
        if parsed is None:
            return None
        return [resolve(p, self.names) for p in parsed.paths]


# The expressions of a request (by their texts), parsed, with every placeholder they use.
_bound: dict[tuple[tuple[str, str], ...], tuple[dict[str, Parsed], frozenset[str], frozenset[str]]]
_bound = {}


def _expressions(
    params: Mapping[str, Any],
) -> tuple[dict[str, Parsed], frozenset[str], frozenset[str]]:
    texts = tuple((k, params[k]) for k in KINDS if params.get(k) is not None)
    known = _bound.get(texts)
    if known is None:
        parsed = {k: parse(text, k) for k, text in texts}
        names = frozenset().union(*(e.names for e in parsed.values()))
        values = frozenset().union(*(e.values for e in parsed.values()))
        if len(_bound) > 50_000:
            _bound.clear()
        known = _bound[texts] = (parsed, names, values)
    return known


def bind(params: Mapping[str, Any]) -> Bound:
    """Parse the request's expressions and check its placeholders as DynamoDB does: each one
    used must be given, each one given must be used."""
    parsed, used_names, used_values = _expressions(params)
    names: Mapping[str, str] = params.get("ExpressionAttributeNames") or {}
    raw_values: Mapping[str, Any] = params.get("ExpressionAttributeValues") or {}
    if names.keys() != used_names or raw_values.keys() != used_values:
        _placeholders(params, parsed, names, raw_values, used_names, used_values)
    return Bound(parsed, names, _values(raw_values))


def _placeholders(
    params: Mapping[str, Any],
    parsed: dict[str, Parsed],
    names: Mapping[str, str],
    values: Mapping[str, Any],
    used_names: frozenset[str],
    used_values: frozenset[str],
) -> None:
    """Refuse placeholders used and not given, or given and not used (DynamoDB's messages)."""
    if "ExpressionAttributeNames" in params and not names:
        raise Invalid("ExpressionAttributeNames must not be empty")
    if "ExpressionAttributeValues" in params and not values:
        raise Invalid("ExpressionAttributeValues must not be empty")
    for kind, expression in parsed.items():
        for name in sorted(expression.names - names.keys()):
            raise Invalid(
                f"Invalid {kind}: An expression attribute name used in the document path is not "
                f"defined; attribute name: {name}"
            )
        for value in sorted(expression.values - values.keys()):
            raise Invalid(
                f"Invalid {kind}: An expression attribute value used in expression is not "
                f"defined; attribute value: {value}"
            )
    if unused := names.keys() - used_names:
        keys = ", ".join(sorted(unused))
        raise Invalid(
            f"Value provided in ExpressionAttributeNames unused in expressions: keys: {{{keys}}}"
        )
    if unused := values.keys() - used_values:
        keys = ", ".join(sorted(unused))
        raise Invalid(
            f"Value provided in ExpressionAttributeValues unused in expressions: keys: {{{keys}}}"
        )


def _values(raw: Mapping[str, Any]) -> dict[str, Value]:
    try:
        return {name: normal(value) for name, value in raw.items()}
    except Invalid:
        for name, value in raw.items():  # again, to say which one
            try:
                normal(value)
            except Invalid as exc:
                raise Invalid(
                    f"ExpressionAttributeValues contains invalid value: {exc} for key {name}"
                ) from None
        raise


def check_return(params: Mapping[str, Any], allowed: tuple[str, ...]) -> str:
    returns = params.get("ReturnValues", "NONE") or "NONE"
    if returns not in allowed:
        raise Invalid("Return values set to invalid value")
    failure = params.get("ReturnValuesOnConditionCheckFailure", "NONE") or "NONE"
    if failure not in ("NONE", "ALL_OLD"):
        raise Invalid("Return values on condition check failure set to invalid value")
    return str(returns)


def refused(params: Mapping[str, Any], old: Item | None) -> DynamoError:
    """ConditionalCheckFailedException, with the item as it was if asked (and there)."""
    extra: dict[str, Any] = {}
    if params.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and old is not None:
        from .values import copy_item

        extra["Item"] = copy_item(old)
    return DynamoError("ConditionalCheckFailedException", "The conditional request failed", **extra)


# -- capacity --------------------------------------------------------------------------------------


def write_units(size: int | None) -> int:
    """Write units for an item of ``size`` bytes (None: no item): 1 per KB, at least 1."""
    return 0 if size is None else max(1, math.ceil(size / 1024))


def read_units(size: int, consistent: bool) -> float:
    """Read units for ``size`` bytes read: one (half, eventually consistent) per 4 KB."""
    return math.ceil(size / 4096) * (1.0 if consistent else 0.5)


def index_units(table: Table, old: Item | None, new: Item | None) -> dict[str, float]:
    """Write units per index for an item going from ``old`` to ``new`` (None: none): an entry
    put, deleted, rewritten (a projected attribute changed), or moved (its index key changed:
    a delete and a put)."""
    units: dict[str, float] = {}
    for index in table.indexes.values():
        if old is not None and new is not None and _same_entry(table, index, old, new):
            continue
        before = None if old is None else table.entry(index, old)
        after = None if new is None else table.entry(index, new)
        spent = _entry_units(index, before, after)
        if spent:
            units[index.name] = float(spent)
    return units


def _same_entry(table: Table, index: IndexDef, old: Item, new: Item) -> bool:
    """Whether the entry is surely unchanged: every attribute it projects is the very same
    value (an update shares what it leaves alone), so no size need be measured."""
    if index.projection == "ALL":
        return old.keys() == new.keys() and all(old[n] is new[n] for n in old)
    names = index.keys() + table.key_names() + index.include
    return all(old.get(n) is new.get(n) for n in names)


def _entry_units(index: IndexDef, before: Item | None, after: Item | None) -> int:
    if before is None and after is None:
        return 0
    if before is None or after is None:
        return write_units(item_size(before or after or {}))
    moved = any(before.get(k) != after.get(k) for k in index.keys())
    if moved:
        return write_units(item_size(before)) + write_units(item_size(after))
    if before == after:
        return 0
    return max(write_units(item_size(before)), write_units(item_size(after)))


def consumed(
    params: Mapping[str, Any],
    table: str,
    units: float,
    indexes: Mapping[str, float] | None = None,
    *,
    listed: bool = False,
) -> dict[str, Any]:
    """The response's ``ConsumedCapacity`` entry, as asked (nothing if not asked)."""
    asked = params.get("ReturnConsumedCapacity", "NONE")
    if asked not in ("TOTAL", "INDEXES"):
        return {}
    indexes = indexes or {}
    entry: dict[str, Any] = {"TableName": table, "CapacityUnits": units + sum(indexes.values())}
    if asked == "INDEXES":
        entry["Table"] = {"CapacityUnits": units}
        if indexes:
            entry["GlobalSecondaryIndexes"] = {k: {"CapacityUnits": v} for k, v in indexes.items()}
    return {"ConsumedCapacity": [entry] if listed else entry}
