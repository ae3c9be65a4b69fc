"""The reads: GetItem, Query (of the table or an index), Scan and BatchGetItem."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .expressions import Parsed, resolve
from .requests import Bound, DynamoError, bind, consumed, read_units
from .tables import IndexDef, Plain, Table, plain
from .updates import project
from .values import Invalid, Item, copy_item, item_size, kind_of, normal_item

if TYPE_CHECKING:
    from .dynamodb import SimDynamoDB

PAGE_BYTES = 1024 * 1024  # a Query or Scan reads up to 1 MB a page
MAX_BATCH_GET = 100


def get_item(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    bound = bind(params)
    key = table.key_of(normal_item(params.get("Key") or {}), exact=True)
    consistent = bool(params.get("ConsistentRead"))
    if db.over(table, key[0], "r"):
        raise db.throttled()
    item, size = table.sized(key, None if consistent else db.as_of(db.profile.stale_read))
    units = max(read_units(size, consistent), 1.0 if consistent else 0.5)
    db.spend(table, key[0], "r", units)
    response: dict[str, Any] = {}
    if item is not None:
        paths = bound.projection()
        response["Item"] = copy_item(item if paths is None else project(item, paths))
    return response | consumed(params, table.name, units)


@dataclass
class Page:
    """A Query or Scan page being read."""

    limit: int | None
    filter: Parsed | None
    bound: Bound
    count_only: bool
    items: list[Item] = field(default_factory=list)
    count: int = 0
    scanned: int = 0
    size: int = 0
    last: Item | None = None  # the key of the last item read, if the page stopped early

    def read(self, item: Item, entry: Item, size: int, key: Callable[[], Item]) -> bool:
        """Read one item of ``size`` (``entry``: as the index has it); False: the page is
        full."""
        self.scanned += 1
        self.size += size if entry is item else item_size(entry)
        condition = None if self.filter is None else self.filter.condition
        if condition is None or condition(entry, self.bound.names, self.bound.values):
            self.count += 1
            if not self.count_only:
                paths = self.bound.projection()
                self.items.append(copy_item(entry if paths is None else project(entry, paths)))
        if self.scanned == self.limit or self.size >= PAGE_BYTES:
            self.last = key()
            return False
        return True

    def response(
        self, params: Mapping[str, Any], table: str, units: float, index: str | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.count_only else {"Items": self.items}
        out |= {"Count": self.count, "ScannedCount": self.scanned}
        if self.last is not None:
            out["LastEvaluatedKey"] = self.last
        if index is None:
            return out | consumed(params, table, units)
        return out | consumed(params, table, 0.0, {index: units})


def _page(params: Mapping[str, Any], bound: Bound) -> Page:
    limit = params.get("Limit")
    if limit is not None and int(limit) < 1:
        raise Invalid("Limit must be greater than or equal to 1")
    select = params.get("Select", "ALL_ATTRIBUTES")
    if select == "COUNT" and "ProjectionExpression" in params:
        raise Invalid("Cannot specify the ProjectionExpression when choosing to get only the Count")
    return Page(
        None if limit is None else int(limit),
        bound.get("FilterExpression"),
        bound,
        select == "COUNT",
    )


# -- Query -----------------------------------------------------------------------------------------


@dataclass
class KeyCondition:
    """A Query's key condition: the partition it reads and the sort key range."""

    hash_value: Plain
    low: Any = None  # sort keys from here (None: open)...
    high: Any = None  # ...to here
    test: Callable[[Any], bool] = lambda _: True


def key_condition(table: Table, index: IndexDef | None, bound: Bound) -> KeyCondition:
    parsed = bound.get("KeyConditionExpression")
    if parsed is None:
        raise Invalid(
            "Either the KeyConditions or KeyConditionExpression parameter must be specified in "
            "the request."
        )
    hash_name = table.hash_name if index is None else index.hash_name
    range_name = table.range_name if index is None else index.range_name
    by_key: dict[str, tuple[str, tuple[str, ...]]] = {}
    for op, path, placeholders in parsed.keys:
        name = resolve(path, bound.names)
        if len(name) != 1 or name[0] not in (hash_name, range_name):
            raise Invalid("Query condition missed key schema element")
        if name[0] in by_key:
            raise Invalid("KeyConditionExpressions must only contain one condition per key")
        by_key[str(name[0])] = (op, placeholders)
    if hash_name not in by_key or by_key[hash_name][0] != "=":
        raise Invalid(f"Query condition missed key schema element: {hash_name}")
    value = bound.values[by_key[hash_name][1][0]]
    _typed(table, hash_name, value)
    condition = KeyCondition(plain(value))
    if range_name in by_key:
        _range(table, range_name, *by_key[range_name], bound, condition)
    return condition


def _typed(table: Table, name: str, value: Mapping[str, Any]) -> None:
    if kind_of(dict(value)) != table.attribute_type(name):
        raise Invalid(
            "One or more parameter values were invalid: Condition parameter type does not match "
            "schema type"
        )


def _range(
    table: Table,
    name: str,
    op: str,
    placeholders: tuple[str, ...],
    bound: Bound,
    condition: KeyCondition,
) -> None:
    values = [bound.values[p] for p in placeholders]
    for value in values:
        _typed(table, name, value)
    keys: list[Any] = [plain(v) for v in values]
    if op == "begins_with":
        prefix = keys[0]
        condition.low = prefix
        condition.test = lambda k: k.startswith(prefix)
    elif op == "BETWEEN":
        if keys[0] > keys[1]:
            low, high = (f"{{{kind_of(dict(v))}:{next(iter(v.values()))}}}" for v in values)
            raise Invalid(
                "Invalid KeyConditionExpression: The BETWEEN operator requires upper bound to be "
                f"greater than or equal to lower bound; lower bound operand: AttributeValue: "
                f"{low}, upper bound operand: AttributeValue: {high}"
            )
        condition.low, condition.high = keys
        condition.test = lambda k: keys[0] <= k <= keys[1]
    elif op == "=":
        condition.low = condition.high = keys[0]
    elif op in ("<", "<="):
        condition.high = keys[0]
        condition.test = (lambda k: k < keys[0]) if op == "<" else (lambda k: k <= keys[0])
    else:
        condition.low = keys[0]
        condition.test = (lambda k: k > keys[0]) if op == ">" else (lambda k: k >= keys[0])


def query(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    name = params.get("IndexName")
    index = None if name is None else table.indexes.get(name)
    if name is not None and index is None:
        raise Invalid(f"The table does not have the specified index: {name}")
    if index is not None and params.get("ConsistentRead"):
        raise Invalid("Consistent reads are not supported on global secondary indexes")
    bound = bind(params)
    page = _page(params, bound)
    _filter_keys(table, index, bound)
    condition = key_condition(table, index, bound)
    if db.over(table, condition.hash_value, "r"):
        raise db.throttled()
    forward = params.get("ScanIndexForward", True) is not False
    start = params.get("ExclusiveStartKey")
    if index is None:
        consistent = bool(params.get("ConsistentRead"))
        when = None if consistent else db.as_of(db.profile.stale_read)
        rows = _table_rows(table, condition, forward, start, when)
    else:
        consistent = False
        when = db.as_of(db.profile.index_lag)
        rows = _index_rows(table, index, condition, forward, start, when)
    for item, entry, size, key in rows:
        if not page.read(item, entry, size, key):
            break
    units = read_units(page.size, consistent)
    db.spend(table, condition.hash_value, "r", units)
    return page.response(params, table.name, units, None if index is None else index.name)


def _filter_keys(table: Table, index: IndexDef | None, bound: Bound) -> None:
    parsed = bound.get("FilterExpression")
    if parsed is None:
        return
    keys = set(table.key_names() if index is None else index.keys())
    for head in sorted(parsed.heads):
        name = bound.names.get(head, head) if head.startswith("#") else head
        if name in keys:
            raise Invalid(
                f"Filter Expression can only contain non-primary key attributes: Primary key "
                f"attribute: {name}"
            )


Row = tuple[Item, Item, int, Callable[[], Item]]  # the item, its entry, the item's size


def _table_rows(
    table: Table, condition: KeyCondition, forward: bool, start: Any, when: float | None
) -> Iterator[Row]:
    keys = table.partition_keys(condition.hash_value, condition.low, condition.high)
    if start is not None:
        after = table.key_of(normal_item(start), exact=False)[1]
        keys = (
            keys[bisect.bisect_right(keys, after) :]
            if forward
            else keys[: bisect.bisect_left(keys, after)]
        )
    if not forward:
        keys = keys[::-1]
    partition = table.partitions.get(condition.hash_value)
    for sort_key in keys:
        if not condition.test(sort_key) or partition is None:
            continue
        record = partition.records.get(sort_key)
        item, size = (None, 0) if record is None else record.sized_at(when)
        if item is not None:
            yield item, item, size, _key_of(table, item)


def _index_rows(
    table: Table,
    index: IndexDef,
    condition: KeyCondition,
    forward: bool,
    start: Any,
    when: float | None,
) -> Iterator[Row]:
    entries = table.index_entries(index, condition.hash_value, when)
    if not forward:
        entries.reverse()
    position = None
    if start is not None:
        start_item = normal_item(start)
        record = table.records.get(table.key_of(start_item, exact=False))
        ranged = None if index.range_name is None else plain(start_item[index.range_name])
        order = b"" if record is None else record.order
        position = (ranged, order)
    names = set(table.key_names()) | set(index.keys())
    for ranged, order, entry, item, size in entries:
        if ranged is not None and not (condition.test(ranged) and _within(ranged, condition)):
            continue
        if position is not None:
            here = (ranged, order)
            if (forward and here <= position) or (not forward and here >= position):
                continue
        yield item, entry, size, _entry_key(entry, names)


def _key_of(table: Table, item: Item) -> Callable[[], Item]:
    return lambda: table.key_item(item)


def _entry_key(entry: Item, names: set[str]) -> Callable[[], Item]:
    return lambda: {n: entry[n] for n in names if n in entry}


def _within(value: Any, condition: KeyCondition) -> bool:
    low: Any
    high: Any
    low, high = condition.low, condition.high
    return (low is None or value >= low) and (high is None or value <= high)


# -- Scan ------------------------------------------------------------------------------------------


def scan(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    if params.get("IndexName") is not None or params.get("TotalSegments") is not None:
        raise DynamoError("ValidationException", "the simulator scans whole tables only")
    bound = bind(params)
    page = _page(params, bound)
    consistent = bool(params.get("ConsistentRead"))
    when = None if consistent else db.as_of(db.profile.stale_read)
    start = params.get("ExclusiveStartKey")
    position = None
    if start is not None:
        key = table.key_of(normal_item(start), exact=False)
        position = (table.partitions[key[0]].order if key[0] in table.partitions else b"", key[1])
    for record in table.scan_order():
        if position is not None:
            here = (table.partitions[record.key[0]].order, record.key[1])
            if here <= position:
                continue
        item, size = record.sized_at(when)
        if item is not None and not page.read(item, item, size, _key_of(table, item)):
            break
    units = read_units(page.size, consistent)
    return page.response(params, table.name, units, None)


# -- BatchGetItem ----------------------------------------------------------------------------------


def batch_get_item(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    asked: Mapping[str, Any] = params.get("RequestItems") or {}
    if sum(len(a.get("Keys", [])) for a in asked.values()) > MAX_BATCH_GET:
        raise Invalid("Too many items requested for the BatchGetItem call")
    responses: dict[str, list[Item]] = {}
    unprocessed: dict[str, Any] = {}
    capacities = []
    for name, ask in asked.items():
        table = db.table({"TableName": name})
        found, left, units = _batch_table(db, table, ask)
        responses[name] = found
        if left:
            unprocessed[name] = {**ask, "Keys": left}
        capacities.append(consumed(params, name, units))
    if (
        unprocessed
        and not any(responses.values())
        and all(len(unprocessed[n]["Keys"]) == len(a.get("Keys", [])) for n, a in asked.items())
    ):
        raise db.throttled()
    out: dict[str, Any] = {"Responses": responses, "UnprocessedKeys": unprocessed}
    if any(capacities):
        out["ConsumedCapacity"] = [c["ConsumedCapacity"] for c in capacities if c]
    return out


def _batch_table(
    db: SimDynamoDB, table: Table, ask: Mapping[str, Any]
) -> tuple[list[Item], list[Any], float]:
    bound = bind(ask)
    consistent = bool(ask.get("ConsistentRead"))
    keys = [normal_item(k) for k in ask.get("Keys", [])]
    parsed = [table.key_of(k, exact=True) for k in keys]
    if len(set(parsed)) != len(parsed):
        raise Invalid("Provided list of item keys contains duplicates")
    when = None if consistent else db.as_of(db.profile.stale_read)
    found, left, units = [], [], 0.0
    paths = bound.projection()
    for raw, key in zip(ask.get("Keys", []), parsed, strict=True):
        if db.over(table, key[0], "r"):
            left.append(raw)
            continue
        item, size = table.sized(key, when)
        if item is None:
            continue
        spent = read_units(size, consistent)
        db.spend(table, key[0], "r", spent)
        units += spent
        found.append(copy_item(item if paths is None else project(item, paths)))
    return found, left, units
