"""An engine as unkind as AWS: an HTTP proxy in front of DynamoDB Local.

DynamoDB Local answers every read consistently, updates its indexes in the same write, never
throttles, never cancels a transaction for a conflict and never loses an answer. DynamoDB
does all of these, as documented (read consistency, GSI propagation, partition throughput
limits, transaction conflicts, 500s and timeouts that botocore retries). This proxy speaks
DynamoDB's JSON protocol on a free port (every interface, so network-namespace hosts reach it
through their gateway), forwards to DynamoDB Local and makes its answers as unkind as AWS's:

- **Eventually consistent reads.** Every table ``T`` has two *replicas* in DynamoDB Local
  (``T.unkind-r1``, ``T.unkind-r2``, same key schema and indexes) that receive each write's
  resulting item late: each replica applies each version after its own delay (up to
  ``stale`` s, a share ``spike_share`` of them up to ``spike`` s), in order per item, as a
  storage replica applies its log. A read without ``ConsistentRead`` (``GetItem``, ``Query``,
  ``Scan``, ``BatchGetItem``) goes to the leader or one of the two replicas, picked per
  request: it may return an older version of the item than the previous read returned, or
  miss an item written a moment ago. DynamoDB Local evaluates every expression itself.
- **Lagging indexes.** A query on a global secondary index always goes to a replica: an entry
  is missing after its item was written, and still there, with its old projection, after
  the item changed or was deleted, for the replica's lag.
- **Throttling** (``ProvisionedThroughputExceededException``, ``ThrottlingException``): a
  partition key that passes ``partition_wcu`` WCU/s or ``partition_rcu`` RCU/s (1,000 and
  3,000 on AWS; the units DynamoDB Local reports for each request, a bucket of one second per
  key) and a share ``throttle_share`` of all requests.
- **Transaction conflicts**: a transaction touching an item that another write (or
  transaction) is applying at that moment is cancelled (``TransactionCanceledException``,
  reason ``TransactionConflict``), a single write on an item inside an ongoing transaction
  gets ``TransactionConflictException``; transactions hold their items ``transaction_hold``
  s longer than DynamoDB Local takes (a two-phase commit is slower than one write), and a
  share ``conflict_share`` of transactions is cancelled for a conflict anyway.
- **Ambiguous answers**: a share ``lost_share`` of writes is applied and its answer lost (a
  500, a connection closed without an answer, or an answer later than the client's read
  timeout); botocore sends them again.
- **Latency**: most requests a few ms, p99 ~100 ms, a share ``latency_spike_share`` of 1-3 s.

Deterministic per seed: each decision comes from a generator seeded by (seed, operation, item,
n-th such request on that item), so the same requests in the same order per item get the same
answers. Every request is journalled (``journal``: one JSON line each: what was asked, what was
decided, the status) so a failure can be read back and replayed from its seed.

    python -m tests.support.unkind --upstream http://127.0.0.1:8000 [--port P] [--seed N]
    [--profile aws]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

REPLICAS = ("unkind-r1", "unkind-r2")
PREFIX = "DynamoDB_20120810."
READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem"})
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})


@dataclasses.dataclass(frozen=True)
class Profile:
    """How unkind the engine is (seconds, shares of requests)."""

    stale: float = 1.0  # a replica applies a version up to this late...
    spike_share: float = 0.002  # ...and this share of versions...
    spike: float = 10.0  # ...up to this late
    partition_wcu: float = 1000.0
    partition_rcu: float = 3000.0
    throttle_share: float = 0.0
    conflict_share: float = 0.0
    transaction_hold: float = 0.02
    lost_share: float = 0.0
    lost_timeout: float = 10.5  # past the main client's read timeout (10 s)
    latency: bool = True
    latency_spike_share: float = 0.0005


PROFILES = {
    # The suite's tests: stale reads and lagging indexes at AWS's bounds, conflicts, a few
    # throttles and lost answers, latency without the spikes of seconds (tests time their
    # own waits; the soaks get the spikes).
    "suite": Profile(
        spike_share=0.001,
        throttle_share=0.01,
        conflict_share=0.05,
        lost_share=0.005,
        lost_timeout=2.5,
        latency_spike_share=0.0,
    ),  # fmt: skip
    # The soaks: everything at the bounds.
    "aws": Profile(throttle_share=0.01, conflict_share=0.05, lost_share=0.005),
    # Only stale reads and lagging indexes (the acceptance test of the engine itself).
    "lag": Profile(latency=False),
    # Only throttling, by the share given on the command line and the partition limits.
    "throttle": Profile(stale=0.0, spike_share=0.0, transaction_hold=0.0, latency=False),
}


def profile(name: str, **overrides: Any) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unkind profile {name!r}: one of {', '.join(PROFILES)}")
    return dataclasses.replace(PROFILES[name], **overrides)


# ---------------------------------------------------------------------------------------------
# DynamoDB Local, the leader
# ---------------------------------------------------------------------------------------------


class Upstream:
    """DynamoDB Local: one keep-alive connection per thread."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._local = threading.local()

    def send(self, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        for attempt in range(3):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, 30)
            try:
                conn.request("POST", "/", body, {**headers, "X-Amz-Target": PREFIX + target})
                answer = conn.getresponse()
                return answer.status, answer.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def call(self, target: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/x-amz-json-1.0", "Authorization": SIGNATURE}
        status, body = self.send(target, json.dumps(request).encode(), headers)
        return status, json.loads(body or b"{}")


# DynamoDB Local checks only that a request is signed, not by whom.
SIGNATURE = (
    "AWS4-HMAC-SHA256 Credential=dummy/20260101/us-east-1/dynamodb/aws4_request, "
    "SignedHeaders=host;x-amz-date, Signature=0"
)


def replica(table: str, r: str) -> str:
    return f"{table}.{r}"


def is_replica(table: str) -> bool:
    return table.endswith(tuple("." + r for r in REPLICAS))


# ---------------------------------------------------------------------------------------------
# The replicas: each version of an item, applied late, in order per item
# ---------------------------------------------------------------------------------------------


class Replicas:
    """Applies every captured version of an item to each replica after a delay of its own."""

    WORKERS = 4

    def __init__(self, upstream: Upstream, prof: Profile, seed: int) -> None:
        self.upstream, self.prof, self.seed = upstream, prof, seed
        self._due: dict[tuple[str, str, str], float] = {}  # (replica, table, item) -> last due
        self._heaps: list[list[tuple[float, int, str, dict[str, Any]]]] = [
            [] for _ in range(self.WORKERS)
        ]
        self._cv = [threading.Condition() for _ in range(self.WORKERS)]
        self._seq = 0
        self._lock = threading.Lock()
        self.lag_max = 0.0
        self.applied = 0
        for i in range(self.WORKERS):
            threading.Thread(target=self._work, args=(i,), daemon=True).start()

    def delay(self, rng: random.Random) -> float:
        if rng.random() < self.prof.spike_share:
            return rng.uniform(self.prof.stale, self.prof.spike)
        # Most versions arrive within tens of ms; the tail reaches the bound.
        return min(self.prof.stale, rng.expovariate(8.0 / max(self.prof.stale, 1e-9)))

    def version(
        self, table: str, item: str, key: dict[str, Any], image: dict[str, Any] | None, n: int
    ) -> None:
        """Item ``key`` of ``table`` is now ``image`` (None: deleted), its ``n``-th version."""
        now = time.monotonic()
        for r in REPLICAS:
            rng = random.Random(f"{self.seed}:replica:{r}:{table}:{item}:{n}")
            with self._lock:
                due = max(now + self.delay(rng), self._due.get((r, table, item), 0.0))
                self._due[(r, table, item)] = due
                self._seq += 1
                seq = self._seq
            request = (
                {"TableName": replica(table, r), "Item": image}
                if image is not None
                else {"TableName": replica(table, r), "Key": key}
            )
            worker = zlib.crc32(item.encode()) % self.WORKERS
            with self._cv[worker]:
                heapq.heappush(self._heaps[worker], (due, seq, str(now), request))
                self._cv[worker].notify()

    def _work(self, i: int) -> None:
        heap, cv = self._heaps[i], self._cv[i]
        while True:
            with cv:
                while not heap or heap[0][0] > time.monotonic():
                    cv.wait(None if not heap else heap[0][0] - time.monotonic())
                due, _, written, request = heapq.heappop(heap)
            target = "PutItem" if "Item" in request else "DeleteItem"
            with contextlib.suppress(Exception):
                self.upstream.call(target, request)
            self.applied += 1
            self.lag_max = max(self.lag_max, time.monotonic() - float(written))

    def pending(self) -> int:
        return sum(len(h) for h in self._heaps)


# ---------------------------------------------------------------------------------------------
# Throughput: a bucket of one second per partition key
# ---------------------------------------------------------------------------------------------


class Buckets:
    """Units per partition key and second, as DynamoDB's per-partition limits count them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (units, at)

    def over(self, key: tuple[str, str], limit: float) -> bool:
        with self._lock:
            units, at = self._used.get(key, (0.0, 0.0))
            now = time.monotonic()
            units = max(0.0, units - (now - at) * limit)  # drains at the limit per second
            self._used[key] = (units, now)
            return units >= limit

    def spend(self, key: tuple[str, str], units: float, limit: float) -> None:
        with self._lock:
            used, at = self._used.get(key, (0.0, 0.0))
            now = time.monotonic()
            self._used[key] = (max(0.0, used - (now - at) * limit) + units, now)


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class Answer(Exception):
    """Answer the client with this instead of forwarding (an error DynamoDB would send)."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(kind)
        self.status, self.kind = status, kind
        self.body = {"__type": kind, "message": message, **extra}


def throttled(rng: random.Random, what: str) -> Answer:
    if rng.random() < 0.5:
        return Answer(
            400,
            "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
            f"The level of configured provisioned throughput for the table was exceeded ({what})",
        )
    return Answer(
        400,
        "com.amazon.coral.availability#ThrottlingException",
        f"Rate of requests exceeds the allowed throughput ({what})",
    )


class Engine:
    def __init__(self, upstream: str, prof: Profile, seed: int, journal: str | None) -> None:
        self.upstream = Upstream(upstream)
        self.prof, self.seed = prof, seed
        self.replicas = Replicas(self.upstream, prof, seed)
        self.buckets = Buckets()
        self._keys: dict[str, tuple[str, str | None, dict[str, str]]] = {}
        self._keys_lock = threading.Lock()
        self._items: dict[str, threading.Lock] = {}  # item -> held while a write applies
        self._in_transaction: set[str] = set()
        self._versions: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._count_lock = threading.Lock()
        self._journal = open(journal, "a", buffering=1) if journal else None  # noqa: SIM115
        self._journal_lock = threading.Lock()
        self.stats: dict[str, int] = {}

    # -- bookkeeping -------------------------------------------------------------------------

    def rng(self, *what: object) -> random.Random:
        """The generator of the n-th request on ``what``: the same per seed and order."""
        name = ":".join(map(str, what))
        with self._count_lock:
            n = self._counts[name] = self._counts.get(name, 0) + 1
        return random.Random(f"{self.seed}:{name}:{n}")

    def count(self, what: str) -> None:
        with self._count_lock:
            self.stats[what] = self.stats.get(what, 0) + 1

    def journal(self, **entry: Any) -> None:
        if self._journal is not None:
            line = json.dumps({"t": round(time.time(), 6), **entry}, default=str)
            with self._journal_lock:
                self._journal.write(line + "\n")

    def keys(self, table: str) -> tuple[str, str | None, dict[str, str]]:
        """(hash key, range key, index -> its hash key) of ``table``; its replicas made."""
        with self._keys_lock:
            known = self._keys.get(table)
        if known is not None:
            return known
        status, desc = self.upstream.call("DescribeTable", {"TableName": table})
        if status != 200:
            raise Answer(status, desc.get("__type", ""), desc.get("message", ""))
        schema = desc["Table"]
        found = _key_names(schema)
        self._make_replicas(schema)
        with self._keys_lock:
            self._keys[table] = found
        return found

    def _make_replicas(self, schema: dict[str, Any]) -> None:
        table = schema["TableName"]
        definition = _definition(schema)
        for r in REPLICAS:
            status, answer = self.upstream.call(
                "CreateTable", {**definition, "TableName": replica(table, r)}
            )
            if status != 200 and "ResourceInUse" not in answer.get("__type", ""):
                raise RuntimeError(f"cannot make replica {r} of {table}: {answer}")
        # A table made before the proxy saw it: its items are in every replica from the start.
        start: dict[str, Any] | None = None
        while True:
            request: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
            if start:
                request["ExclusiveStartKey"] = start
            _, page = self.upstream.call("Scan", request)
            for item in page.get("Items", []):
                for r in REPLICAS:
                    self.upstream.call("PutItem", {"TableName": replica(table, r), "Item": item})
            start = page.get("LastEvaluatedKey")
            if not start:
                return

    def forget(self, table: str) -> None:
        with self._keys_lock:
            self._keys.pop(table, None)

    def item_of(self, table: str, key: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The item's name and its key alone (an ``Item`` or a ``Key`` given)."""
        hash_key, range_key, _ = self.keys(table)
        only = {k: key[k] for k in (hash_key, range_key) if k is not None and k in key}
        return json.dumps([table, only], sort_keys=True), only

    def lock_of(self, item: str) -> threading.Lock:
        with self._count_lock:
            lock = self._items.get(item)
            if lock is None:
                lock = self._items[item] = threading.Lock()
            return lock

    def capture(self, table: str, item: str, key: dict[str, Any]) -> None:
        """The item as the write left it, read from the leader (the caller holds its lock, so
        versions are captured in the order they were written), sent to the replicas."""
        status, answer = self.upstream.call(
            "GetItem", {"TableName": table, "Key": key, "ConsistentRead": True}
        )
        if status != 200:
            return
        with self._count_lock:
            n = self._versions[item] = self._versions.get(item, 0) + 1
        self.replicas.version(table, item, key, answer.get("Item"), n)

    # -- one request ---------------------------------------------------------------------------

    def handle(self, target: str, request: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
        """(status, answer, how: "" to answer, or "drop" / "timeout" to lose the answer)."""
        subject = _subject(request)
        if "Item" in request and "TableName" in request:
            with contextlib.suppress(Answer, KeyError):
                subject = self.item_of(request["TableName"], request["Item"])[0]
        rng = self.rng(target, subject)
        entry: dict[str, Any] = {"op": target, "subject": subject}
        try:
            self.wait(rng, entry, "before")
            if rng.random() < self.prof.throttle_share:
                self.count("throttled (share)")
                entry["throttled"] = "share"
                raise throttled(rng, "share")
            if target in READS:
                status, answer = self.read(target, request, rng, entry)
            elif target in WRITES:
                status, answer = self.write(target, request, rng, entry)
            elif target == "TransactWriteItems":
                status, answer = self.transact(request, rng, entry)
            elif target == "BatchWriteItem":
                status, answer = self.batch_write(request)
            else:
                status, answer = self.control(target, request)
        except Answer as exc:
            status, answer = exc.status, exc.body
        entry["status"] = status
        if status != 200:
            entry["error"] = answer.get("__type", "").rpartition("#")[2]
        how = ""
        if (target in WRITES or target == "TransactWriteItems") and (
            rng.random() < self.prof.lost_share
        ):
            how = rng.choice(("500", "drop", "timeout"))
            entry["lost"] = how
            self.count(f"lost answer ({how})")
            if how == "500":
                status, answer = (
                    500,
                    {
                        "__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
                        "message": "Internal server error (the write was applied; unkind engine)",
                    },
                )
                how = ""
        else:
            self.wait(rng, entry, "after")
        self.journal(**entry)
        return status, answer, how

    def wait(self, rng: random.Random, entry: dict[str, Any], when: str) -> None:
        """Latency: a few ms mostly, p99 ~100 ms, and rare spikes of 1-3 s."""
        if not self.prof.latency:
            return
        x = rng.random()
        if x < self.prof.latency_spike_share:
            pause = rng.uniform(1.0, 3.0)
            self.count("latency spike")
        elif x < 0.01:
            pause = rng.uniform(0.03, 0.15)
        elif x < 0.1:
            pause = rng.uniform(0.003, 0.03)
        else:
            pause = rng.uniform(0.0, 0.002)
        if pause > 0.01:
            entry[f"wait_{when}"] = round(pause, 4)
        time.sleep(pause)

    def read(
        self, target: str, request: dict[str, Any], rng: random.Random, entry: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if target == "BatchGetItem":
            return self.batch_get(request, rng, entry)
        table = request["TableName"]
        hash_key, _, indexes = self.keys(table)
        index = request.get("IndexName")
        partition = _partition(request, indexes.get(index, "") if index else hash_key)
        bucket = (f"{table}/{index or ''}", f"read:{partition}")
        if partition and self.buckets.over(bucket, self.prof.partition_rcu):
            self.count("throttled (partition RCU)")
            entry["throttled"] = "partition"
            raise throttled(rng, f"partition {partition} over {self.prof.partition_rcu:g} RCU/s")
        to = None
        if index or not request.get("ConsistentRead"):
            # An index is never consistent; a plain read: the leader or a replica.
            to = rng.choice(REPLICAS if index else (None, *REPLICAS))
        entry["replica"] = to or "leader"
        sent = dict(request, TableName=replica(table, to) if to else table)
        status, answer, units = self.forward(target, sent)
        if partition:
            self.buckets.spend(bucket, units, self.prof.partition_rcu)
        return status, _rename_back(answer, request)

    def batch_get(
        self, request: dict[str, Any], rng: random.Random, entry: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        names: dict[str, str] = {}
        items: dict[str, Any] = {}
        for table, ask in request["RequestItems"].items():
            self.keys(table)
            to = None if ask.get("ConsistentRead") else rng.choice((None, *REPLICAS))
            names[replica(table, to) if to else table] = table
            items[replica(table, to) if to else table] = ask
        entry["replica"] = sorted(names)
        status, answer, _ = self.forward("BatchGetItem", dict(request, RequestItems=items))
        for field in ("Responses", "UnprocessedKeys"):
            if field in answer:
                answer[field] = {names.get(t, t): v for t, v in answer[field].items()}
        return status, _rename_back(answer, request)

    def forward(self, target: str, request: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        """Send to DynamoDB Local, always asking for the units consumed (to count them)."""
        asked = request.get("ReturnConsumedCapacity", "NONE")
        status, answer = self.upstream.call(
            target, {**request, "ReturnConsumedCapacity": "TOTAL" if asked == "NONE" else asked}
        )
        units = _units(answer.get("ConsumedCapacity"))
        if asked == "NONE":
            answer.pop("ConsumedCapacity", None)
        return status, answer, units

    def write(
        self, target: str, request: dict[str, Any], rng: random.Random, entry: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        table = request["TableName"]
        item, key = self.item_of(table, request.get("Key") or request["Item"])
        bucket = (table, "write:" + json.dumps(key[self.keys(table)[0]], sort_keys=True))
        if self.buckets.over(bucket, self.prof.partition_wcu):
            self.count("throttled (partition WCU)")
            entry["throttled"] = "partition"
            raise throttled(rng, f"partition over {self.prof.partition_wcu:g} WCU/s")
        if item in self._in_transaction:
            self.count("transaction conflict (write)")
            raise Answer(
                400,
                "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                "Transaction is ongoing for the item",
            )
        with self.lock_of(item):
            status, answer, units = self.forward(target, request)
            if status == 200:
                self.capture(table, item, key)
        self.buckets.spend(bucket, max(units, 1.0), self.prof.partition_wcu)
        return status, _rename_back(answer, request)

    def transact(
        self, request: dict[str, Any], rng: random.Random, entry: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        touched = []
        for action in request["TransactItems"]:
            ((kind, body),) = action.items()
            item, key = self.item_of(body["TableName"], body.get("Key") or body["Item"])
            touched.append((kind, body["TableName"], item, key))
        held: list[threading.Lock] = []
        busy = [
            i for i, (_, _, item, _) in enumerate(touched)
            if item in self._in_transaction or not _take(self.lock_of(item), held)
        ]  # fmt: skip
        if not busy and rng.random() < self.prof.conflict_share:
            busy = [rng.randrange(len(touched))]
            self.count("transaction conflict (share)")
        elif busy:
            self.count("transaction conflict (concurrent)")
        try:
            if busy:
                entry["conflict"] = busy
                raise _conflict(len(touched), busy)
            self._in_transaction.update(item for _, _, item, _ in touched)
            try:
                status, answer, _ = self.forward("TransactWriteItems", request)
                if status == 200:
                    for kind, table, item, key in touched:
                        if kind != "ConditionCheck":
                            self.capture(table, item, key)
                # A two-phase commit holds its items longer than DynamoDB Local's one write.
                time.sleep(rng.uniform(self.prof.transaction_hold / 2, self.prof.transaction_hold))
            finally:
                self._in_transaction.difference_update(item for _, _, item, _ in touched)
        finally:
            for lock in held:
                lock.release()
        return status, _rename_back(answer, request)

    def batch_write(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Each item written (not left unprocessed) reaches the replicas late, as any write."""
        status, answer, _ = self.forward("BatchWriteItem", request)
        if status != 200:
            return status, answer
        left = answer.get("UnprocessedItems", {})
        for table, writes in request["RequestItems"].items():
            for write in writes:
                if write in left.get(table, []):
                    continue
                ((kind, body),) = write.items()
                item, key = self.item_of(table, body.get("Key") or body["Item"])
                with self.lock_of(item):
                    self.capture(table, item, key)
        return status, answer

    def control(self, target: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Tables: their replicas follow; listings do not show them."""
        status, answer, _ = self.forward(target, request)
        table = request.get("TableName", "")
        if status != 200:
            return status, answer
        if target == "CreateTable":
            self.keys(table)
        elif target == "DeleteTable":
            self.forget(table)
            for r in REPLICAS:
                self.upstream.call("DeleteTable", {"TableName": replica(table, r)})
        elif target == "UpdateTable" and "GlobalSecondaryIndexUpdates" in request:
            self.forget(table)
            for r in REPLICAS:
                self.upstream.call("UpdateTable", dict(request, TableName=replica(table, r)))
        elif target == "ListTables":
            answer["TableNames"] = [t for t in answer["TableNames"] if not is_replica(t)]
        return status, answer


def _conflict(count: int, busy: list[int]) -> Answer:
    codes = ["TransactionConflict" if i in busy else "None" for i in range(count)]
    return Answer(
        400,
        "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "Transaction cancelled, please refer cancellation reasons for specific reasons "
        f"[{', '.join(codes)}]",
        CancellationReasons=[
            {"Code": c, "Message": "Transaction is ongoing for the item"}
            if c != "None"
            else {"Code": c}
            for c in codes
        ],
    )


def _take(lock: threading.Lock, held: list[threading.Lock]) -> bool:
    if lock in held:
        return True
    if lock.acquire(blocking=False):
        held.append(lock)
        return True
    return False


def _subject(request: dict[str, Any]) -> str:
    """What a request is about, for its generator and the journal: table and item or index."""
    table = request.get("TableName", "")
    if "Key" in request:
        return f"{table}:{json.dumps(request['Key'], sort_keys=True)}"
    if "Item" in request:
        return f"{table}:item"
    if "IndexName" in request:
        return f"{table}/{request['IndexName']}"
    if "KeyConditionExpression" in request:
        return f"{table}:{json.dumps(request.get('ExpressionAttributeValues'), sort_keys=True)}"
    return table or ",".join(sorted(request.get("RequestItems", {})))


_EQUALS = re.compile(r"(#?[A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)")


def _partition(request: dict[str, Any], hash_key: str) -> str:
    """The partition key a Query or GetItem reads ("" for a Scan)."""
    if "Key" in request:
        return json.dumps(request["Key"].get(hash_key), sort_keys=True)
    names = request.get("ExpressionAttributeNames", {})
    for name, value in _EQUALS.findall(request.get("KeyConditionExpression", "")):
        if names.get(name, name) == hash_key:
            return json.dumps(request.get("ExpressionAttributeValues", {}).get(value))
    return ""


def _units(consumed: Any) -> float:
    if isinstance(consumed, dict):
        return float(consumed.get("CapacityUnits", 0.0))
    if isinstance(consumed, list):
        return sum(_units(c) for c in consumed)
    return 0.0


def _rename_back(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A replica's name never reaches the client (ConsumedCapacity names the table)."""
    consumed = answer.get("ConsumedCapacity")
    for c in consumed if isinstance(consumed, list) else [consumed] if consumed else []:
        name = c.get("TableName", "")
        if is_replica(name):
            c["TableName"] = name.rpartition(".")[0]
    return answer


def _key_names(schema: dict[str, Any]) -> tuple[str, str | None, dict[str, str]]:
    def names(key_schema: list[dict[str, str]]) -> tuple[str, str | None]:
        kinds = {k["KeyType"]: k["AttributeName"] for k in key_schema}
        return kinds["HASH"], kinds.get("RANGE")

    hash_key, range_key = names(schema["KeySchema"])
    indexes = {
        g["IndexName"]: names(g["KeySchema"])[0]
        for g in schema.get("GlobalSecondaryIndexes", []) + schema.get("LocalSecondaryIndexes", [])
    }
    return hash_key, range_key, indexes


def _definition(schema: dict[str, Any]) -> dict[str, Any]:
    """A CreateTable request for a table like ``schema`` (a DescribeTable's Table)."""
    definition: dict[str, Any] = {
        "AttributeDefinitions": schema["AttributeDefinitions"],
        "KeySchema": schema["KeySchema"],
        "BillingMode": "PAY_PER_REQUEST",
    }
    indexes = [
        {k: g[k] for k in ("IndexName", "KeySchema", "Projection")}
        for g in schema.get("GlobalSecondaryIndexes", [])
    ]
    if indexes:
        definition["GlobalSecondaryIndexes"] = indexes
    return definition


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm and the
    # client's delayed ACK add 40 ms to every answer on a kept-alive connection.
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        """``GET /unkind`` answers the engine's counts (tests and soaks report them)."""
        engine = self.server.engine
        body = json.dumps(
            {
                "seed": engine.seed,
                "profile": dataclasses.asdict(engine.prof),
                "counts": engine.stats,
                "replica_versions_applied": engine.replicas.applied,
                "replica_versions_pending": engine.replicas.pending(),
                "replica_lag_max": round(engine.replicas.lag_max, 3),
                "in_transaction": len(engine._in_transaction),
            }
        ).encode()
        self._answer(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client went away mid-request (the soaks kill theirs)
            self.close_connection = True
            return
        target = (self.headers.get("X-Amz-Target") or "").removeprefix(PREFIX)
        engine = self.server.engine
        try:
            request = json.loads(raw or b"{}")
            status, answer, how = engine.handle(target, request)
        except Exception as exc:  # the engine's own fault: say so, as a 500 would
            status, answer, how = 500, {"__type": "InternalServerError", "message": repr(exc)}, ""
            engine.count("engine error")
            print(f"unkind: {target}: {exc!r} on {raw[:300]!r}", file=sys.stderr, flush=True)
        if how == "timeout":
            time.sleep(engine.prof.lost_timeout)
        if how:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._answer(status, json.dumps(answer).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-crc32", str(zlib.crc32(body)))
        self.send_header("x-amzn-RequestId", f"unkind-{time.monotonic_ns()}")
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, port: int, engine: Engine) -> None:
        self.engine = engine
        super().__init__(("0.0.0.0", port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed or timed out mid-request (the soaks SIGKILL theirs): not news.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="DynamoDB Local's URL")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", default="suite", choices=sorted(PROFILES))
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="a field of the profile, e.g. throttle_share=0.2",
    )  # fmt: skip
    parser.add_argument("--journal", help="append one JSON line per request to this file")
    args = parser.parse_args(argv)
    overrides = {}
    for pair in args.set:
        field, _, value = pair.partition("=")
        overrides[field] = type(getattr(PROFILES[args.profile], field))(
            value if field != "latency" else value.lower() in ("1", "true", "yes")
        )
    engine = Engine(args.upstream, profile(args.profile, **overrides), args.seed, args.journal)
    server = Server(args.port, engine)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"unkind: listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        print(f"unkind: {json.dumps(engine.stats, sort_keys=True)}", flush=True)


class UnkindDynamoDB:
    """The engine, as a process of its own in front of ``upstream`` (DynamoDB Local's URL);
    a context manager like ``tests.support.dynamodb_local.DynamoDBLocal``. Its settings come from
    the arguments, else ``$DYNASEM_UNKIND_SEED``, ``$DYNASEM_UNKIND_PROFILE`` and
    ``$DYNASEM_UNKIND_SET`` (``field=value,field=value``)."""

    def __init__(
        self,
        upstream: str,
        *,
        seed: int | None = None,
        profile_name: str | None = None,
        overrides: dict[str, Any] | None = None,
        journal: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.seed = seed if seed is not None else int(os.environ.get("DYNASEM_UNKIND_SEED", "1"))
        self.profile = profile_name or os.environ.get("DYNASEM_UNKIND_PROFILE", "suite")
        sets = [p for p in os.environ.get("DYNASEM_UNKIND_SET", "").split(",") if p]
        sets += [f"{k}={v}" for k, v in (overrides or {}).items()]
        self.sets = sets
        self.journal = journal or os.environ.get("DYNASEM_UNKIND_JOURNAL")
        self.process: subprocess.Popen[str] | None = None
        self.port: int | None = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the unkind engine is not running")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UnkindDynamoDB:
        cmd = [sys.executable, "-m", "tests.support.unkind", "--upstream", self.upstream,
               "--seed", str(self.seed), "--profile", self.profile]  # fmt: skip
        for pair in self.sets:
            cmd += ["--set", pair]
        if self.journal:
            cmd += ["--journal", self.journal]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.process = subprocess.Popen(
            cmd, cwd=root, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("unkind: listening on "):
            self.stop()
            raise RuntimeError(f"the unkind engine did not start: {line!r}")
        self.port = int(line.rsplit(" ", 1)[1])
        return self

    def stats(self) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/unkind")
            return dict(json.loads(conn.getresponse().read()))
        finally:
            conn.close()

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> UnkindDynamoDB:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


if __name__ == "__main__":
    main()
