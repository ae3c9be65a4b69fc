"""A simulated DynamoDB: in memory, single-threaded, deterministic, with AWS's semantics.

It answers the low-level requests dynasem sends (``apply(operation, params)``, or a boto3-like
client whose every call is one ``apply``) as DynamoDB (Local) answers them: the same
responses, the same errors (botocore's ClientError subclasses, with ``Item`` on a refusal and
``CancellationReasons`` on a cancelled transaction), the same capacity units. Each request is
applied atomically, at the simulator's ``now()``.

A :class:`Profile` makes it as unkind as AWS, all from the seeded ``rng``, so the same seed and
the same requests at the same simulated times get the same answers:

- eventually consistent reads answer from a version as of ``now() - lag`` (``stale_read``):
  a new item may be missing, a deleted one still there, and two reads may go back in time;
- an index query sees the table as of ``now() - lag`` (``index_lag``), never consistently;
- a partition key past ``throttle_wcu`` / ``throttle_rcu`` units a second is throttled (and a
  share ``throttle_share`` of requests anyway), nothing applied;
- transactions conflict with writes on their items (``transaction_hold``, ``conflict_share``);
- TTL deletes expired items late (``ttl_delay``), from :meth:`SimDynamoDB.expire_ttl`.

    python -m tests.support.sim.dynamodb --bench    # operations a second
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import json
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError, ReadTimeoutError

from dynasem._storage import records

from . import control, reads, writes
from .requests import DynamoError, client_error, exceptions, not_found
from .tables import Key, Record, Table
from .values import Invalid, Item, copy_item, kind_of

ENDPOINT = "http://dynamodb.sim"
TTL_GRACE = 5 * 365 * 86400  # AWS's TTL leaves items expired longer ago than this alone


@dataclasses.dataclass(frozen=True)
class Profile:
    """How unkind the simulated DynamoDB is (seconds, units a second, shares of requests)."""

    stale_read: float = 0.0  # an eventually consistent read lags up to this
    index_lag: float = 0.0  # an index query lags up to this
    throttle_wcu: float = 0.0  # write units a partition key takes a second (0: no limit)
    throttle_rcu: float = 0.0  # read units a partition key takes a second (0: no limit)
    throttle_share: float = 0.0  # a share of requests throttled anyway
    # A transaction holds its items this long: a write to one meanwhile conflicts.
    transaction_hold: float = 0.0
    # A share of transactions cancelled for a conflict (TransactionConflict), and of single
    # writes to items that transactions write (TransactionConflictException): another
    # transaction in flight on them, as the simulator has no concurrency of its own.
    conflict_share: float = 0.0
    ttl_delay: float = 0.0  # TTL deletes an expired item up to this late

    @classmethod
    def kind(cls) -> Profile:
        """DynamoDB Local's kindness: consistent everywhere, no throttling, no conflicts."""
        return cls()

    @classmethod
    def aws(cls) -> Profile:
        """AWS's documented unkindness (and the unkind proxy's ``aws`` profile)."""
        return cls(
            stale_read=1.0,
            index_lag=1.0,
            throttle_wcu=1000.0,
            throttle_rcu=3000.0,
            throttle_share=0.01,
            transaction_hold=0.02,
            conflict_share=0.05,
            ttl_delay=48 * 3600.0,
        )


Handler = Callable[["SimDynamoDB", dict[str, Any]], dict[str, Any]]

HANDLERS: dict[str, Handler] = {
    "GetItem": reads.get_item,
    "Query": reads.query,
    "Scan": reads.scan,
    "BatchGetItem": reads.batch_get_item,
    "PutItem": writes.put_item,
    "UpdateItem": writes.update_item,
    "DeleteItem": writes.delete_item,
    "TransactWriteItems": writes.transact_write_items,
    "CreateTable": control.create_table,
    "DescribeTable": control.describe_table,
    "DeleteTable": control.delete_table,
    "ListTables": control.list_tables,
    "DescribeTimeToLive": control.describe_time_to_live,
    "UpdateTimeToLive": control.update_time_to_live,
}


class SimDynamoDB:
    """The simulated DynamoDB (see the module's docstring). ``now()``: the simulator's true
    time in seconds (version visibility, throttling buckets, TTL)."""

    def __init__(
        self, rng: random.Random, now: Callable[[], float], profile: Profile | None = None
    ) -> None:
        self.rng, self.now = rng, now
        self.profile = profile or Profile.kind()
        self.tables: dict[str, Table] = {}
        # How long old versions stay readable (the longest lag).
        self.horizon = max(self.profile.stale_read, self.profile.index_lag)
        self.counts: collections.Counter[str] = collections.Counter()  # unkindness dealt
        self._buckets: dict[tuple[str, Any, str], tuple[float, float]] = {}
        self._deleted: collections.deque[tuple[float, Table, Record]] = collections.deque()
        self._ttl: list[tuple[float, int, str, Key, float]] = []
        self._seq = 0
        self.tokens: dict[str, tuple[str, float]] = {}  # ClientRequestToken -> (request, when)

    # -- the one entry -------------------------------------------------------------------------

    def apply(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Apply one request (``operation`` as "UpdateItem", ``params`` as boto3's low-level
        client takes them) atomically; its answer as that client returns it. Raises
        botocore's ClientError (its modeled subclass) as DynamoDB would."""
        handler = HANDLERS.get(operation)
        try:
            if handler is None:
                raise DynamoError("UnknownOperationException", f"unsupported: {operation}")
            response = handler(self, dict(params))
        except Invalid as exc:
            raise client_error(DynamoError("ValidationException", str(exc)), operation) from None
        except DynamoError as exc:
            raise client_error(exc, operation) from None
        response["ResponseMetadata"] = {
            "HTTPStatusCode": 200,
            "HTTPHeaders": {},
            "RetryAttempts": 0,
        }
        return response

    def lose(self, operation: str, params: Mapping[str, Any]) -> Exception:
        """Apply a request whose answer is lost: the exception a client then raises (a read
        timeout), whatever the request did (applied, refused or not)."""
        try:
            self.apply(operation, params)
        except ClientError:
            pass
        return ReadTimeoutError(endpoint_url=ENDPOINT)

    def client(
        self,
        before: Callable[[str, dict[str, Any]], None] | None = None,
        after: Callable[[str, dict[str, Any], Any], None] | None = None,
    ) -> SimClient:
        """A boto3-like low-level client; ``before(operation, params)`` runs before each
        call, ``after(operation, params, response or exception)`` after it."""
        return SimClient(self, before, after)

    # -- state -----------------------------------------------------------------------------------

    def table(self, params: Mapping[str, Any]) -> Table:
        table = self.tables.get(str(params.get("TableName")))
        if table is None:
            raise not_found()
        return table

    def write(self, table: Table, key: Key, image: Item | None, size: int | None = None) -> Record:
        """``image`` (None: deleted; ``size``: its size if known) is the item from now on: its
        versions, its index entries, its TTL."""
        now = self.now()
        record = table.write(key, image, now, self.horizon, size)
        if image is None and self.horizon > 0:
            self._deleted.append((now, table, record))
        while self._deleted and self._deleted[0][0] <= now - self.horizon:
            _, old_table, old = self._deleted.popleft()
            old_table.forget(old, now, self.horizon)
        if image is not None and table.ttl_enabled:
            self.watch_ttl(table, record)
        return record

    def watch_ttl(self, table: Table, record: Record) -> None:
        item = record.item
        value = (
            None if item is None or table.ttl_attribute is None else item.get(table.ttl_attribute)
        )
        if value is None or kind_of(value) != "N":
            return
        expires = float(value["N"])
        self._seq += 1
        heapq.heappush(self._ttl, (expires, self._seq, table.name, record.key, expires))

    def as_of(self, lag: float) -> float | None:
        """When a read lagging up to ``lag`` sees the table (None: now, consistently)."""
        if lag <= 0:
            return None
        self.counts["lagged reads"] += 1
        return self.now() - self.rng.uniform(0.0, lag)

    # -- unkindness ------------------------------------------------------------------------------

    def over(self, table: Table, partition: Any, kind: str) -> bool:
        """Whether a request on ``partition`` (its hash key value) of ``table`` is throttled:
        its units of this second are used up (``kind`` "r" or "w"), or by the share."""
        share = self.profile.throttle_share
        if share > 0 and self.rng.random() < share:
            self.counts["throttled (share)"] += 1
            return True
        limit = self.profile.throttle_rcu if kind == "r" else self.profile.throttle_wcu
        if limit <= 0:
            return False
        bucket = (table.name, partition, kind)
        used, at = self._buckets.get(bucket, (0.0, 0.0))
        now = self.now()
        used = max(0.0, used - (now - at) * limit)
        self._buckets[bucket] = (used, now)
        if used >= limit:
            self.counts["throttled (partition)"] += 1
            return True
        return False

    def spend(self, table: Table, partition: Any, kind: str, units: float) -> None:
        limit = self.profile.throttle_rcu if kind == "r" else self.profile.throttle_wcu
        if limit <= 0:
            return
        bucket = (table.name, partition, kind)
        used, at = self._buckets.get(bucket, (0.0, 0.0))
        now = self.now()
        self._buckets[bucket] = (max(0.0, used - (now - at) * limit) + units, now)

    def throttled(self) -> DynamoError:
        if self.rng.random() < 0.5:
            return DynamoError(
                "ProvisionedThroughputExceededException",
                "The level of configured provisioned throughput for the table was exceeded. "
                "Consider increasing your provisioning level with the UpdateTable API.",
            )
        return DynamoError(
            "ThrottlingException",
            "Throughput exceeds the current capacity of your table or index. DynamoDB is "
            "automatically scaling your table or index so please try again shortly. If "
            "exceptions persist, check if you have a hot key: "
            "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/"
            "bp-partition-key-design.html.",
        )

    def held(self, record: Record | None) -> bool:
        """Whether a transaction holds ``record``: one applied less than ``transaction_hold``
        ago (a two-phase commit holds its items longer than its answer takes)."""
        if record is None or record.tx_until <= self.now():
            return False
        self.counts["transaction conflicts (held)"] += 1
        return True

    def in_transaction(self, record: Record | None) -> bool:
        """Whether a single write on ``record`` meets a transaction on it: one held, or (by
        the share, for an item transactions write) one in flight."""
        if record is None:
            return False
        if self.held(record):
            return True
        share = self.profile.conflict_share
        if share > 0 and record.tx_seen and self.rng.random() < share:
            self.counts["transaction conflicts (share)"] += 1
            return True
        return False

    # -- TTL and invariants ---------------------------------------------------------------------

    def expire_ttl(self, deleted: list[tuple[str, str]] | None = None) -> int:
        """Delete the items whose TTL attribute (epoch seconds) has passed, each only once it
        is past by a delay of its own (drawn once, up to ``ttl_delay``); how many. The keys
        (hash and range key values) deleted are appended to ``deleted``."""
        now, count = self.now(), 0
        while self._ttl and self._ttl[0][0] <= now:
            _, _, name, key, expires = heapq.heappop(self._ttl)
            table = self.tables.get(name)
            record = None if table is None else table.records.get(key)
            if table is None or record is None or not table.ttl_enabled:
                continue
            if _ttl_of(table, record.item) != expires or expires < now - TTL_GRACE:
                continue  # rewritten since (its new TTL is watched), or too old for TTL
            if record.ttl_delay is None:
                delay = self.profile.ttl_delay
                record.ttl_delay = self.rng.uniform(0.0, delay) if delay > 0 else 0.0
            if expires + record.ttl_delay > now:
                self._seq += 1
                due = expires + record.ttl_delay
                heapq.heappush(self._ttl, (due, self._seq, name, key, expires))
                continue
            self.write(table, key, None)
            count += 1
            if deleted is not None:
                deleted.append((str(key[0]), str(key[1])))
        self.counts["deleted by TTL"] += count
        return count

    def peek(self, key: Mapping[str, Any], table: str | None = None) -> dict[str, Any] | None:
        """The item at ``key`` as stored now (wire format, a copy), without a request: no rng
        drawn, no capacity counted (the simulator's monitor reads every written row so).
        ``table``: the only table when not named."""
        found = self.tables[table] if table is not None else next(iter(self.tables.values()))
        item = found.get(found.key_of(dict(key), exact=True))
        return None if item is None else copy_item(item)

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every table's current items (consistent; copies): table -> :func:`item_key` ->
        item in the wire format."""
        found: dict[str, dict[str, dict[str, Any]]] = {}
        for name, table in self.tables.items():
            items = found[name] = {}
            for record in table.scan_order():
                if record.item is not None:
                    items[item_key(table, record.item)] = copy_item(record.item)
        return found


def item_key(table: Table, item: Mapping[str, Any]) -> str:
    """An item's key as :meth:`SimDynamoDB.snapshot` names it: the JSON list of its key
    attributes' values as the wire carries them (``'["resource", "lock"]'``)."""
    return json.dumps([_raw(item[name]) for name in table.key_names()])


def _raw(value: Mapping[str, Any]) -> Any:
    raw = next(iter(value.values()))
    return raw.hex() if isinstance(raw, bytes) else raw


def _ttl_of(table: Table, item: Item | None) -> float | None:
    if item is None or table.ttl_attribute is None:
        return None
    value = item.get(table.ttl_attribute)
    return float(value["N"]) if value is not None and "N" in value else None


# -- the client ------------------------------------------------------------------------------------


class _Waiter:
    def __init__(self, client: SimClient, exists: bool) -> None:
        self.client, self.exists = client, exists

    def wait(self, **kwargs: Any) -> None:
        """A table is created (or deleted) at once: one look, as botocore's first attempt."""
        kwargs.pop("WaiterConfig", None)
        try:
            self.client.describe_table(**kwargs)
            found = True
        except ClientError:
            found = False
        if found != self.exists:
            raise RuntimeError(f"waiter: table {kwargs.get('TableName')!r} exists={found}")


class SimClient:
    """A boto3-like low-level DynamoDB client: each call is one :meth:`SimDynamoDB.apply`
    (looked up at each call: a runtime may replace it), between the ``before`` and ``after``
    hooks."""

    def __init__(
        self,
        db: SimDynamoDB,
        before: Callable[[str, dict[str, Any]], None] | None,
        after: Callable[[str, dict[str, Any], Any], None] | None,
    ) -> None:
        self._db, self._before, self._after = db, before, after
        self.meta = _Meta()

    @property
    def exceptions(self) -> Any:
        """botocore's own exception classes "
        "(``client.exceptions.ConditionalCheckFailedException``)."""
        return exceptions()

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        if self._before is not None:
            self._before(operation, params)
        try:
            response = self._db.apply(operation, params)
        except ClientError as exc:
            if self._after is not None:
                self._after(operation, params, exc)
            raise
        if self._after is not None:
            self._after(operation, params, response)
        return response

    def get_item(self, **params: Any) -> dict[str, Any]:
        return self.call("GetItem", params)

    def put_item(self, **params: Any) -> dict[str, Any]:
        return self.call("PutItem", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        return self.call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        return self.call("DeleteItem", params)

    def query(self, **params: Any) -> dict[str, Any]:
        return self.call("Query", params)

    def scan(self, **params: Any) -> dict[str, Any]:
        return self.call("Scan", params)

    def batch_get_item(self, **params: Any) -> dict[str, Any]:
        return self.call("BatchGetItem", params)

    def transact_write_items(self, **params: Any) -> dict[str, Any]:
        return self.call("TransactWriteItems", params)

    def create_table(self, **params: Any) -> dict[str, Any]:
        return self.call("CreateTable", params)

    def describe_table(self, **params: Any) -> dict[str, Any]:
        return self.call("DescribeTable", params)

    def delete_table(self, **params: Any) -> dict[str, Any]:
        return self.call("DeleteTable", params)

    def list_tables(self, **params: Any) -> dict[str, Any]:
        return self.call("ListTables", params)

    def describe_time_to_live(self, **params: Any) -> dict[str, Any]:
        return self.call("DescribeTimeToLive", params)

    def update_time_to_live(self, **params: Any) -> dict[str, Any]:
        return self.call("UpdateTimeToLive", params)

    def get_waiter(self, name: str) -> _Waiter:
        if name not in ("table_exists", "table_not_exists"):
            raise ValueError(f"the simulated client has no waiter {name!r}")
        return _Waiter(self, name == "table_exists")

    def close(self) -> None:
        pass


@dataclasses.dataclass
class _Meta:
    region_name: str = "us-east-1"
    endpoint_url: str = ENDPOINT
    service_name: str = "dynamodb"


# -- speed -----------------------------------------------------------------------------------------

BENCH_TABLE = records.table_definition("bench")  # dynasem's own table, as the bench sends to
# A take of a free lock and its release, written as dynasem writes them (lock_writes.py).
TAKE = (
    "SET #h = :h, #mode = :mode, #fence = :fence, #uid = if_not_exists(#uid, :uid), "
    "#exp = :exp, #expMs = :expMs",
    "(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale) AND "
    "(attribute_not_exists(#fence) OR #fence < :fence) AND "
    "(attribute_not_exists(#qin) OR #qin = #qout)",
)
RELEASE = ("REMOVE #h.#t SET #lastToken = :tok, #expMs = :now", "attribute_exists(#h.#t)")
NAMES = {"#h": "holders", "#mode": "mode", "#fence": "fence", "#uid": "userId"}
NAMES |= {"#exp": "expires", "#expMs": "expMs", "#qin": "qin", "#qout": "qout"}


def _take(client: SimClient, n: int) -> None:
    token = f"t{n}"
    holder = {"M": {"u": {"S": "user"}, "e": {"N": str(10_000 + n)}, "f": {"N": str(n + 1)}}}
    values = {":h": {"M": {token: holder}}, ":mode": {"S": "x"}, ":fence": {"N": str(n + 1)}}
    values |= {":uid": {"S": "user"}, ":exp": {"N": "900"}, ":expMs": {"N": str(10_000 + n)}}
    values |= {":zero": {"N": "0"}, ":stale": {"N": str(n)}}
    names = {k: v for k, v in NAMES.items() if k in TAKE[0] + TAKE[1]}
    client.update_item(
        TableName="bench", Key={"pk": {"S": f"r{n % 100}"}, "sk": {"S": "lock"}},
        UpdateExpression=TAKE[0], ConditionExpression=TAKE[1], ExpressionAttributeNames=names,
        ExpressionAttributeValues=values, ReturnValues="NONE",
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )  # fmt: skip
    client.update_item(
        TableName="bench", Key={"pk": {"S": f"r{n % 100}"}, "sk": {"S": "lock"}},
        UpdateExpression=RELEASE[0], ConditionExpression=RELEASE[1],
        ExpressionAttributeNames={"#h": "holders", "#t": token, "#lastToken": "lastToken",
                                  "#expMs": "expMs"},
        ExpressionAttributeValues={":tok": {"S": token}, ":now": {"N": str(n)}},
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )  # fmt: skip


def _read(client: SimClient, n: int) -> None:
    key = {"pk": {"S": f"r{n % 100}"}, "sk": {"S": "lock"}}
    client.get_item(TableName="bench", Key=key, ConsistentRead=True)


def bench(seconds: float = 3.0, profile: Profile | None = None) -> dict[str, float]:
    """Requests a second (of this process's CPU time: the machine may be shared) of one
    simulated DynamoDB: take-and-release pairs (two conditional UpdateItems each, as dynasem
    writes them; counted as two) and consistent GetItems."""
    clock = [1_000_000.0]
    db = SimDynamoDB(random.Random(1), lambda: clock[0], profile)
    client = db.client()
    client.create_table(**BENCH_TABLE)
    results = {}
    for name, step, per in (("UpdateItem (take, release)", _take, 2), ("GetItem", _read, 1)):
        done, start = 0, time.process_time()
        while time.process_time() - start < seconds / 2:
            for _ in range(100):
                clock[0] += 0.001
                try:
                    step(client, done)
                except ClientError:
                    pass  # refused, throttled, a conflict: answered all the same
                done += 1
        results[name] = done * per / (time.process_time() - start)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="the simulated DynamoDB")
    parser.add_argument("--bench", action="store_true", help="measure operations a second")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--aws", action="store_true", help="with Profile.aws()")
    args = parser.parse_args()
    if args.bench:
        profile = Profile.aws() if args.aws else Profile.kind()
        for name, rate in bench(args.seconds, profile).items():
            print(f"{name}: {rate:,.0f} requests/s")


if __name__ == "__main__":
    main()
