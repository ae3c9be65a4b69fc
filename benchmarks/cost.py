"""What AWS bills: capacity units per lock operation, dynasem beside python-dynamodb-lock.

    .venv/bin/python benchmarks/cost.py [--no-doc]

AWS bills capacity units, not requests: a write costs ceil(item size / 1 KB) write units on
the base table plus, for each GSI, a put when the row enters it, a delete when it leaves, a
delete plus a put when its key changes, 1 when only projected attributes change and 0 when
nothing projected changes; a read costs ceil(size / 4 KB) read units (half for an eventually
consistent one). DynamoDB Local reports base and per-index units when a request asks for them
(``ReturnConsumedCapacity="INDEXES"``, added here by a botocore hook on every client), by
those rules, for the requests that succeed. Two things it does not report, which AWS bills and
this script adds: a write refused by its condition costs 1 write unit (charged to the base
table), and a transaction costs twice the units of its writes (DynamoDB Local reports them
once).

Every scenario runs on one DynamoDB Local, dynasem and the peer side by side, one operation
at a time, so each request is attributed to the operation that sent it (a request from a
heartbeat thread would be too: none fires, the leases are long). The dollar figures use the
on-demand prices below for holds of 1 s and of 5 minutes with each library's production
defaults (dynasem: LEASE 60 s, CLOCK_SKEW 5 s, a renewal every (60 - 5) / 3 s; the peer:
lease 30 s, a heartbeat every 5 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import results  # noqa: E402

# On-demand prices, us-east-1 (per million request units), as published by AWS since the
# November 2024 price cut and quoted in the issue that asked for this script (2026-11).
PRICE_DATE = "2026-11 (on-demand, us-east-1)"
WRITE_PRICE = 0.625  # $ per million write request units
READ_PRICE = 0.125  # $ per million read request units

# Production defaults that decide how often each library renews a hold.
DYNASEM_RENEW_EVERY = (60 - 5) / 3  # LEASE 60 s, CLOCK_SKEW 5 s: every third of lease - skew
PEER_RENEW_EVERY = 5.0  # python-dynamodb-lock's default heartbeat_period

CAPACITY_OPS = {
    "GetItem",
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "Query",
    "Scan",
    "TransactWriteItems",
    "BatchGetItem",
    "BatchWriteItem",
}
WRITE_OPS = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


@dataclass
class Units:
    """Capacity units of one operation: writes and reads on the base table, writes per index,
    and the requests by name."""

    wcu: float = 0.0
    rcu: float = 0.0
    index_wcu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    refused: int = 0

    @property
    def total_wcu(self) -> float:
        return self.wcu + sum(self.index_wcu.values())

    def dollars_per_million(self) -> float:
        return self.total_wcu * WRITE_PRICE + self.rcu * READ_PRICE

    def add(self, other: Units, times: float = 1.0) -> None:
        self.wcu += other.wcu * times
        self.rcu += other.rcu * times
        for name, value in other.index_wcu.items():
            self.index_wcu[name] += value * times
        for name, count in other.requests.items():
            self.requests[name] += int(count * times)
        self.refused += int(other.refused * times)


class Meter:
    """Asks every request of the clients it is attached to for its consumed capacity, and adds
    it up for the operation being measured (``with meter.measure() as units``)."""

    def __init__(self) -> None:
        self._current: Units | None = None
        self._lock = threading.Lock()

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build.dynamodb", self._ask)
        client.meta.events.register("after-call.dynamodb", self._count)

    def _ask(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in CAPACITY_OPS:
            params["ReturnConsumedCapacity"] = "INDEXES"

    def _count(self, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        with self._lock:
            units = self._current
            if units is None:
                return
            name = model.name
            units.requests[name] += 1
            code = (parsed.get("Error") or {}).get("Code")
            factor = 2.0 if name == "TransactWriteItems" else 1.0
            if code == "ConditionalCheckFailedException":
                units.wcu += 1.0  # AWS bills a refused conditional write 1 write unit
                units.refused += 1
                return
            if code == "TransactionCanceledException":
                reasons = parsed.get("CancellationReasons") or [{}]
                units.wcu += factor * len(reasons)  # each item's refusal, doubled
                units.refused += 1
                return
            consumed = parsed.get("ConsumedCapacity")
            for entry in consumed if isinstance(consumed, list) else [consumed or {}]:
                table = (entry.get("Table") or {}).get("CapacityUnits", 0.0)
                if name in WRITE_OPS:
                    units.wcu += factor * table
                else:
                    units.rcu += table
                for index, value in (entry.get("GlobalSecondaryIndexes") or {}).items():
                    if name in WRITE_OPS:
                        units.index_wcu[index] += factor * value.get("CapacityUnits", 0.0)
                    else:
                        units.rcu += value.get("CapacityUnits", 0.0)

    @contextlib.contextmanager
    def measure(self) -> Iterator[Units]:
        units = Units()
        with self._lock:
            self._current = units
        try:
            yield units
        finally:
            with self._lock:
                self._current = None


def _row(name: str, units: Units, per: float = 1.0) -> dict[str, Any]:
    def f(x: float) -> float:
        return round(x / per, 2)

    return {
        "operation": name,
        "requests": ", ".join(f"{k} {v / per:g}" for k, v in sorted(units.requests.items())),
        "base WCU": f(units.wcu),
        "index WCU": {k: f(v) for k, v in sorted(units.index_wcu.items())},
        "RCU": f(units.rcu),
        "total WCU": f(units.total_wcu),
        "refused": units.refused / per,
    }


def dynasem_scenarios(meter: Meter, endpoint: str) -> tuple[list[dict[str, Any]], dict[str, Units]]:
    from django.core.management import call_command

    from dynasem import Coalesced, SemaphoreBusy, run_once, semaphore
    from dynasem._operators import locks as operations
    from dynasem._storage import dynamodb, records
    from dynasem.conf import settings

    meter.attach(dynamodb.get_client())
    looker = common.raw_client(endpoint)  # this script's own looks: not metered
    rows: list[dict[str, Any]] = []
    kept: dict[str, Units] = {}

    def record(name: str, units: Units, per: float = 1.0, key: str | None = None) -> None:
        rows.append(_row(name, units, per))
        if key is not None:
            scaled = Units()
            scaled.add(units, 1 / per)
            kept[key] = scaled

    with meter.measure() as u:
        held = semaphore("c:new", user="alice").acquire()
    record("acquire, new row", u, key="acquire_new")
    time.sleep(1.1)  # a real renewal moves the lease end past a whole second
    with meter.measure() as u:
        held.renew()
    record("renewal", u, key="renew")
    # A renewal whose lease end passes into the next expires bucket moves both index keys:
    # measured with 1 s buckets for a moment (BUCKET_S is read at each write).
    from dynasem._storage import records as stored

    wide, stored.BUCKET_S = stored.BUCKET_S, 1
    try:
        time.sleep(1.1)
        with meter.measure() as u:
            held.renew()
    finally:
        stored.BUCKET_S = wide
    record(f"renewal into the next expires bucket (once per {wide} s held)", u, key="renew_cross")
    held.renew()  # back to a wide bucket (not measured)
    with meter.measure() as u:
        held.release()
    record("release", u, key="release")
    with meter.measure() as u:
        held = semaphore("c:new", user="alice").acquire()
    record("acquire, idle row, same holder as last time", u, key="acquire_same")
    held.release()
    with meter.measure() as u:
        held = semaphore("c:new", user="bob").acquire()
    record("acquire, idle row, another holder", u, key="acquire_other")
    with meter.measure() as u, contextlib.suppress(SemaphoreBusy):
        common.apart(semaphore("c:new", user="carol", wait=0))
    record("refused acquire (busy, wait=0)", u, key="refused")
    with meter.measure() as u, contextlib.suppress(SemaphoreBusy):
        common.apart(semaphore("c:new", user="carol", wait=0))
    record("refused again (busy, wait=0, found busy lately: a read first)", u)
    time.sleep(1.1)  # a real renewal moves the lease end past a whole second
    with meter.measure() as u:
        held.renew()
    record(
        "first renewal of a hold by another holder (its user moves into the userId index)",
        u,
        key="renew_other",
    )
    held.release()

    # A queued waiter handed the lock: join, the hand-over release, the heir's release.
    holder = semaphore("c:queue", user="alice").acquire()
    out: dict[str, Any] = {}
    go = threading.Event()

    def waiter() -> None:
        with semaphore("c:queue", user="bob", wait=30, fair=True) as w:
            out["fence"] = w.fence
            go.wait(30)

    with meter.measure() as u:
        thread = threading.Thread(target=waiter)
        thread.start()
        deadline = time.monotonic() + 10
        while "qin" not in looker.get_item(
            TableName=settings.TABLE_NAME,
            Key={"pk": {"S": "c:queue"}, "sk": {"S": records.LOCK_SK}},
        ).get("Item", {}):
            if time.monotonic() > deadline:
                raise RuntimeError("the waiter never queued")
            time.sleep(0.02)
        time.sleep(0.3)  # its entry is written, its client has parsed the answers
    record("a waiter: refused take, then joins the queue", u)
    holder.renew()  # the holder sees the queue
    with meter.measure() as u:
        holder.release()
        while "fence" not in out:
            time.sleep(0.01)
    record("hand-over release (the heir holds by push; any paced read of its own counted)", u)
    with meter.measure() as u:
        go.set()
        thread.join(10)
    record("release by the heir", u)

    with meter.measure() as u:
        a = semaphore("c:pool", limit=3, user="alice").acquire()
    record("counting (limit 3): first holder", u)
    with meter.measure() as u:
        b = common.apart(semaphore("c:pool", limit=3, user="bob"))
    record("counting (limit 3): second holder joins", u)
    with meter.measure() as u:
        b.release()
    record("counting: a holder leaves, another stays", u)
    a.release()
    with meter.measure() as u:
        a = semaphore("c:doc", shared=True, user="alice").acquire()
        b = common.apart(semaphore("c:doc", shared=True, user="bob"))
        b.release()
        a.release()
    record("shared: two readers take and release (per reader)", u, per=2)
    with meter.measure() as u:
        pair = semaphore(["c:x", "c:y"], user="alice").acquire()
        pair.release()
    record("two resources at once: acquire (one transaction) + release (a write a row)", u)

    with meter.measure() as u, run_once("c:job", user="alice"):
        pass
    record("run_once: claim + DONE", u)

    # Coalescing (coalesce=True): a burst while one run goes.
    running = semaphore("c:co", user="alice").acquire()
    ran = threading.Event()

    def next_run() -> None:
        with semaphore("c:co", user="bob", wait=30, coalesce=True, fair=True):
            ran.set()

    with meter.measure() as u:
        nxt = threading.Thread(target=next_run)
        nxt.start()
        deadline = time.monotonic() + 10
        while "qin" not in looker.get_item(
            TableName=settings.TABLE_NAME, Key={"pk": {"S": "c:co"}, "sk": {"S": records.LOCK_SK}}
        ).get("Item", {}):
            if time.monotonic() > deadline:
                raise RuntimeError("the next run never queued")
            time.sleep(0.02)
        time.sleep(0.3)
    record("coalesce: the next run (refused take, fence read, registration, joins the queue)", u)
    with meter.measure() as u, contextlib.suppress(Coalesced):
        common.apart(semaphore("c:co", user="carol", wait=30, coalesce=True))
    record(
        "coalesce: a further busy caller, answered at once (Coalesced, 202; any paced look "
        "of the waiting next run counted)",
        u,
    )
    running.release()
    ran.wait(10)
    nxt.join(10)

    # Unique tasks (dynasem._background.unique): the hold a task's key gets from enqueue to run's
    # end.
    from dynasem._background.unique import Taken, adopt, claim, end_run

    with meter.measure() as u:
        taken = claim("c:unique", "task-1", queue_lease=600)
    record("unique task: the claim at enqueue", u)
    with meter.measure() as u, contextlib.suppress(Taken):
        claim("c:unique", "task-2", queue_lease=600)
    record("unique task: an enqueue refused (queued or running)", u)
    with meter.measure() as u:
        run = adopt(taken)
    record("unique task: the worker adopts it (run lease, its own token)", u)
    with meter.measure() as u:
        run.renew()
    record("unique task: a renewal while it runs", u)
    with meter.measure() as u:
        end_run(run, queue_lease=600)
    record("unique task: given back at the run's end", u)

    # Reaping: rows released long enough ago, one Query page per shard plus one write each.
    n = 50
    for i in range(n):
        semaphore(f"c:reap:{i}", user="alice").acquire().release()
    # A reap finds a row once its expires bucket (of the lease end it had) has passed: run it
    # with this process's clock that much ahead (dynasem reads clock.wall_clock at call time).
    from dynasem import _clock as clock

    real_clock = clock.wall_clock
    clock.wall_clock = lambda: real_clock() + stored.BUCKET_S + 120
    said = io.StringIO()
    try:
        with meter.measure() as u:
            call_command("dynasem_reap", stdout=said)
    finally:
        clock.wall_clock = real_clock
    deleted = int(re.search(r"Deleted (\d+)", said.getvalue()).group(1))  # type: ignore[union-attr]
    record(f"reap, per row ({deleted} idle rows)", u, per=deleted)

    live = [semaphore(f"c:admin:{i}", user="alice").acquire() for i in range(20)]
    with meter.measure() as u:
        operations.lock_page(size=100)
    record("admin lock list, first page (20 live holds)", u)
    with meter.measure() as u:
        operations.lock_page(user_id="alice", size=100)
    record("admin lock list filtered by user", u)
    for h in live:
        h.release()
    return rows, kept


def peer_scenarios(meter: Meter, endpoint: str) -> tuple[list[dict[str, Any]], dict[str, Units]]:
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockError

    name = common.new_name("cost-peer")
    common.create_peer_table(endpoint, name)
    resource = common.peer_resource(endpoint)
    meter.attach(resource.meta.client)
    peer = common.peer_client(resource, name)
    rows: list[dict[str, Any]] = []
    kept: dict[str, Units] = {}

    def record(label: str, units: Units, key: str | None = None) -> None:
        rows.append(_row(label, units))
        if key is not None:
            kept[key] = units

    try:
        with meter.measure() as u:
            lock = peer.acquire_lock("c:new", retry_period=timedelta(milliseconds=10))
        record("acquire, new row", u, key="acquire_new")
        with meter.measure() as u:
            peer._send_heartbeat(lock)  # what its heartbeat thread sends
        record("renewal (heartbeat)", u, key="renew")
        with meter.measure() as u:
            lock.release()
        record("release", u, key="release")
        with meter.measure() as u:
            lock = peer.acquire_lock("c:new", retry_period=timedelta(milliseconds=10))
        record("acquire again (row deleted on release)", u, key="acquire_same")
        with meter.measure() as u, contextlib.suppress(DynamoDBLockError):
            peer.acquire_lock(
                "c:new",
                retry_period=timedelta(milliseconds=10),
                retry_timeout=timedelta(milliseconds=1),
            )
        record("refused acquire (busy, no wait)", u, key="refused")
        lock.release()
    finally:
        peer.close()
    return rows, kept


def dollars(
    units: dict[str, Units], hold: float, renew_every: float, acquire: str, bucket: float
) -> float:
    """$ per million holds of ``hold`` seconds: acquire + release + the renewals meanwhile,
    of which ``hold / bucket`` on average (the lease end moves ``hold`` seconds) pass into the
    next expires bucket (``bucket`` 0: no buckets)."""
    total = Units()
    total.add(units[acquire])
    total.add(units["release"])
    renewals = math.floor(hold / renew_every)
    if renewals and acquire == "acquire_other" and "renew_other" in units:
        # A take leaves the row's userId as it was; the hold's first renewal moves it.
        total.add(units["renew_other"])
        renewals -= 1
    crossings = min(renewals, hold / bucket) if bucket and "renew_cross" in units else 0.0
    total.add(units["renew"], renewals - crossings)
    if crossings:
        total.add(units["renew_cross"], crossings)
    return total.dollars_per_million()


def _table(rows: list[dict[str, Any]], indexes: list[str]) -> str:
    head = ["operation", "requests", "base WCU", *[f"{i} WCU" for i in indexes], "total WCU", "RCU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["operation"],
            r["requests"],
            f"{r['base WCU']:g}",
            *[f"{r['index WCU'].get(i, 0):g}" for i in indexes],
            f"{r['total WCU']:g}",
            f"{r['RCU']:g}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    common.require_peer()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    meter = Meter()
    with common.engine() as ddb:
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-cost"))
        common.create_dynasem_table()
        d_rows, d = dynasem_scenarios(meter, ddb.endpoint_url)
        p_rows, p = peer_scenarios(meter, ddb.endpoint_url)

    from dynasem._storage import records

    d_indexes = [records.USER_INDEX, records.EXPIRES_INDEX]
    summary = [
        ("1 s hold, same holder re-takes", 1.0, "acquire_same", "acquire_same"),
        ("1 s hold, another holder each time", 1.0, "acquire_other", "acquire_same"),
        ("1 s hold on a new row", 1.0, "acquire_new", "acquire_new"),
        ("5-minute hold, same holder", 300.0, "acquire_same", "acquire_same"),
        ("5-minute hold, another holder", 300.0, "acquire_other", "acquire_same"),
    ]
    lines = [
        "| hold | dynasem $/M | python-dynamodb-lock $/M | ratio |",
        "|---|---|---|---|",
    ]
    slugs = ("1s_same", "1s_other", "1s_new_row", "5min_same", "5min_other")
    figures: dict[str, str] = {}
    for slug, (label, hold, d_acq, p_acq) in zip(slugs, summary, strict=True):
        dy = dollars(d, hold, DYNASEM_RENEW_EVERY, d_acq, records.BUCKET_S)
        pe = dollars(p, hold, PEER_RENEW_EVERY, p_acq, 0)
        lines.append(f"| {label} | ${dy:.2f} | ${pe:.2f} | {dy / pe:.2f}x |")
        figures |= {f"usd_{slug}": f"${dy:.2f}", f"peer_usd_{slug}": f"${pe:.2f}"}
        figures[f"ratio_{slug}"] = f"{dy / pe:.2f}×"
    cycle = (d["acquire_same"], d["release"])
    figures["uncontended_requests"] = f"{sum(sum(u.requests.values()) for u in cycle)}"
    figures["uncontended_wcu"] = f"{sum(u.total_wcu for u in cycle):g}"
    text = "\n".join(
        [
            f"Run {started}; prices {PRICE_DATE}: ${WRITE_PRICE} per million write units, "
            f"${READ_PRICE} per million read units. Refused conditional writes charged 1 "
            "write unit, transactions 2x (DynamoDB Local reports neither).",
            "",
            "dynasem, capacity units per operation:",
            "",
            _table(d_rows, d_indexes),
            "",
            "python-dynamodb-lock, capacity units per operation:",
            "",
            _table(p_rows, []),
            "",
            f"Dollars per million holds (dynasem renews every {DYNASEM_RENEW_EVERY:.1f} s, "
            f"{records.BUCKET_S} s buckets; the peer every {PEER_RENEW_EVERY:g} s):",
            "",
            *lines,
        ]
    )
    print(text)
    if not args.no_doc:
        body = "\n\n".join(
            [
                "## What it costs on AWS (capacity units)",
                common._fill(f"Measured {started} on: {common.machine()}."),
                f"Command: `{common.command()}`",
                text,
            ]
        )
        common.write_section("cost", body)
        results.record("cost", figures, machine=common.machine(), command=common.command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
