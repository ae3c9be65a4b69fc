"""Reaping 10,000 expired rows, and listing active holds beside 10,000 idle rows.

    .venv/bin/python benchmarks/reap_and_list.py [--rows 10000] [--active 20]

One DynamoDB Local, one dynasem table (``dynasem_createtable``; TTL then turned off so the
engine's own TTL sweep cannot race what is measured). Rows are written straight in dynasem's
format with ``BatchWriteItem`` (what ``lock_writes.take_free`` / ``lock_writes.give_back`` store:
``pk``, ``sk`` = ``"lock"``, ``holders``, ``mode``, ``limit``, ``fence``, ``userId``, ``expires``,
``expMs``, ``shard``), not through dynasem's API, which would take minutes for 10,000 leases.

Reap: ``--rows`` rows whose only holder's lease ended two minutes ago (a holder that died).

* baseline: one thread, ``Scan`` (filter ``expMs < cutoff``) page by page, and for each row a
  ``DeleteItem`` conditional on ``expMs < cutoff`` (the condition dynasem's reaper uses, so a
  row re-acquired meanwhile survives);
* dynasem: ``dynasem._operators.reaper.reap()`` (the expires index, sharded, 16 delete threads).

Also reported: CPU seconds used meanwhile by this process (all threads) and by the JVM.

Both run once unmeasured on 1,000 rows first (JIT warm-up), then on the same ``--rows`` rows
(written again between the two). Reported: seconds, requests by operation, items read.

List: ``dynasem._operators.locks.active_holds()`` with ``--active`` live holds (taken with
``semaphore(...).acquire()``, lease 60 s) and nothing else, then again after ``--rows`` idle
rows (released 1 s to 10 min ago: no holders) were added. Requests and items read per call
(``Count``/``ScannedCount`` of each Query or Scan, read in an ``after-call`` hook: DynamoDB
Local does not report consumed capacity), and the median time of ``--repeat`` calls. For
scale, one filtered ``Scan`` of the same table is shown too.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def lock_rows(prefix: str, count: int, *, idle: bool) -> list[dict[str, Any]]:
    """Rows as dynasem stores them: an expired exclusive hold, or an idle (released) row."""
    from dynasem._storage import lock_writes, records

    now = int(time.time() * 1000)
    rows = []
    for i in range(count):
        pk = f"{prefix}-{i:05d}"
        fence = (now - 600_000 + i) * 1000
        if idle:
            released = now - 1_000 - (i * 599_000) // max(1, count)  # 1 s .. 10 min ago
            item = {
                "pk": pk,
                "sk": records.LOCK_SK,
                "holders": {},
                "mode": "x",
                "limit": 1,
                "fence": fence,
                "lastToken": uuid.uuid4().hex,
                "expires": records.epoch_seconds(released),
                "expMs": released,
                "shard": records.shard_of(pk),
            }
        else:
            ends = now - 120_000  # the holder died; its lease ended two minutes ago
            token = uuid.uuid4().hex
            item = {
                "pk": pk,
                "sk": records.LOCK_SK,
                "holders": {
                    token: records.holder_value(
                        lock_writes.holder_entry(
                            f"host:{1000 + i}", ends, fence, ends - 60_000, False
                        )
                    )
                },
                "mode": "x",
                "limit": 1,
                "fence": fence,
                "userId": f"host:{1000 + i}",
                "expires": records.epoch_seconds(ends),
                "expMs": ends,
                "shard": records.shard_of(pk),
            }
        rows.append(item)
    return rows


def batch_write(client: Any, table_name: str, rows: list[dict[str, Any]]) -> None:
    from boto3.dynamodb.types import TypeSerializer

    ser = TypeSerializer()
    requests = [
        {"PutRequest": {"Item": {k: ser.serialize(v) for k, v in row.items()}}} for row in rows
    ]
    chunks = [requests[i : i + 25] for i in range(0, len(requests), 25)]

    def write(chunk: list[dict[str, Any]]) -> None:
        pending = {table_name: chunk}
        for attempt in range(50):
            left = client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
            if not left:
                return
            pending = left
            time.sleep(min(0.5, 0.01 * 2**attempt))
        raise RuntimeError("BatchWriteItem kept leaving items unprocessed")

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(write, chunks))


def scan_and_delete(client: Any, table_name: str, cutoff_ms: int) -> tuple[int, int]:
    """The baseline reaper: one thread, Scan + conditional DeleteItem per expired row."""
    from botocore.exceptions import ClientError

    deleted = survived = 0
    start = None
    while True:
        kwargs: dict[str, Any] = {
            "TableName": table_name,
            "FilterExpression": "#expMs < :cut",
            "ExpressionAttributeNames": {"#expMs": "expMs"},
            "ExpressionAttributeValues": {":cut": {"N": str(cutoff_ms)}},
            "ProjectionExpression": "pk, sk",
        }
        if start:
            kwargs["ExclusiveStartKey"] = start
        page = client.scan(**kwargs)
        for item in page.get("Items", []):
            try:
                client.delete_item(
                    TableName=table_name,
                    Key={"pk": item["pk"], "sk": item["sk"]},
                    ConditionExpression="#expMs < :cut",
                    ExpressionAttributeNames={"#expMs": "expMs"},
                    ExpressionAttributeValues={":cut": {"N": str(cutoff_ms)}},
                )
                deleted += 1
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                survived += 1
        start = page.get("LastEvaluatedKey")
        if not start:
            return deleted, survived


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=20)
    parser.add_argument("--warmup-rows", type=int, default=1_000)
    parser.add_argument(
        "--workers", type=int, default=16, help="reap(workers=N); 16 is its default"
    )
    parser.add_argument("--repeat", type=int, default=15, help="listing calls timed per state")
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    with common.engine() as ddb:
        endpoint = ddb.endpoint_url
        common.setup_dynasem(endpoint, common.new_name("bench-reap"))
        common.create_dynasem_table()
        from dynasem import _clock as clock
        from dynasem import semaphore
        from dynasem._operators import locks as operations
        from dynasem._operators import reaper as reaping
        from dynasem.conf import settings

        name = settings.TABLE_NAME
        writer = common.raw_client(endpoint)  # not counted: setting the scene
        dyn_counter = common.RequestCounter()
        common.dynasem_client(dyn_counter)
        base_counter = common.RequestCounter()
        base = common.raw_client(endpoint, base_counter)

        def cutoff() -> int:
            return clock.now_ms() - int(settings.CLOCK_SKEW * 1000)

        jvm = ddb.process.pid

        def measure(counter: common.RequestCounter, run: Any) -> dict[str, Any]:
            counter.reset()
            cpu0, jvm0, t0 = common.process_cpu(), common.process_cpu(jvm), time.perf_counter()
            deleted = run()
            return {
                "time": time.perf_counter() - t0,
                "client_cpu": common.process_cpu() - cpu0,
                "engine_cpu": common.process_cpu(jvm) - jvm0,
                "requests": counter.snapshot(),
                "deleted": deleted,
            }

        def reap_baseline() -> dict[str, Any]:
            return measure(base_counter, lambda: scan_and_delete(base, name, cutoff())[0])

        def reap_dynasem() -> dict[str, Any]:
            return measure(dyn_counter, lambda: reaping.reap(workers=args.workers).deleted)

        # -- reap ----------------------------------------------------------------------------
        measured: dict[str, dict[str, Any]] = {}
        for phase, rows in (("warm-up", args.warmup_rows), ("run", args.rows)):
            for label, reap in (("baseline", reap_baseline), ("dynasem", reap_dynasem)):
                print(f"{phase}: writing {rows} expired rows ...", flush=True)
                batch_write(writer, name, lock_rows("expired", rows, idle=False))
                print(f"{phase}: reaping them with {label} ...", flush=True)
                m = reap()
                if m["deleted"] != rows:
                    raise RuntimeError(f"{label} deleted {m['deleted']} rows, not {rows}")
                print(
                    f"  {m['time']:.2f} s, {common.all_calls(m['requests'])} requests",
                    flush=True,
                )
                if phase == "run":
                    measured[label] = m
        left = writer.scan(TableName=name, Select="COUNT")["Count"]
        if left:
            raise RuntimeError(f"{left} rows left in the table after the reaps")

        # -- list ----------------------------------------------------------------------------
        helds = [
            semaphore(f"active-{i:02d}", lease=60, wait=0).acquire() for i in range(args.active)
        ]

        def listing(state: str) -> dict[str, Any]:
            operations.active_holds()  # one unmeasured call
            times, snaps = [], []
            for _ in range(args.repeat):
                dyn_counter.reset()
                t0 = time.perf_counter()
                holds = operations.active_holds()
                times.append(time.perf_counter() - t0)
                snaps.append(dyn_counter.snapshot())
                if len(holds) != args.active:
                    raise RuntimeError(f"{state}: listed {len(holds)} holds, not {args.active}")
            base_counter.reset()
            t0 = time.perf_counter()
            start = None
            while True:  # for scale: what one filtered Scan of the table reads
                kwargs: dict[str, Any] = {
                    "TableName": name,
                    "FilterExpression": "#expMs >= :now",
                    "ExpressionAttributeNames": {"#expMs": "expMs"},
                    "ExpressionAttributeValues": {":now": {"N": str(clock.now_ms())}},
                }
                if start:
                    kwargs["ExclusiveStartKey"] = start
                start = base.scan(**kwargs).get("LastEvaluatedKey")
                if not start:
                    break
            scan_time = time.perf_counter() - t0
            merged = common.merge(snaps)
            return {
                "time": common.percentile(times, 50),
                "requests": common.work_calls(merged) / args.repeat,
                "heartbeat": common.heartbeat_calls(merged),
                "ops": common.by_operation(merged, args.repeat),
                "read": merged["items_read"] / args.repeat,
                "scan_requests": common.work_calls(base_counter.snapshot()),
                "scan_read": base_counter.snapshot()["items_read"],
                "scan_time": scan_time,
            }

        print(f"listing with {args.active} active holds only ...", flush=True)
        only = listing("active only")
        print(f"writing {args.rows} idle rows ...", flush=True)
        batch_write(writer, name, lock_rows("idle", args.rows, idle=True))
        print(f"listing with {args.active} active holds + {args.rows} idle rows ...", flush=True)
        crowded = listing("with idle rows")
        for held in helds:
            held.release()

    # -- report --------------------------------------------------------------------------------
    b, d = measured["baseline"], measured["dynasem"]
    b_time, d_time = b["time"], d["time"]
    b_snap, d_snap = b["requests"], d["requests"]
    reap_rows = []
    for label, m in (
        ("Scan + DeleteItem, 1 thread (baseline)", b),
        (f"dynasem `reaping.reap(workers={args.workers})`", d),
    ):
        reap_rows.append(
            [
                label,
                f"{m['time']:.2f} s",
                common.fmt(args.rows / m["time"], 0),
                common.all_calls(m["requests"]),
                common.by_operation(m["requests"]),
                m["requests"]["items_read"],
                f"{m['client_cpu']:.2f} s / {m['engine_cpu']:.2f} s",
                f"{(m['client_cpu'] + m['engine_cpu']) / args.rows * 1000:.2f} ms",
                f"{b_time / m['time']:.2f}x",
            ]
        )
    reap_md = common.table_md(
        [
            "reaper",
            "time",
            "rows/s",
            "requests",
            "by operation",
            "items read",
            "CPU client / engine",
            "CPU per row",
            "speed-up",
        ],
        reap_rows,
    )
    list_rows = []
    for label, st in (
        (f"{args.active} active holds only", only),
        (f"{args.active} active + {args.rows} idle rows", crowded),
    ):
        list_rows.append(
            [
                label,
                common.fmt(st["requests"], 1),
                st["ops"],
                common.fmt(st["read"], 1),
                common.ms(st["time"]),
                f"{st['scan_requests']} / {st['scan_read']} / {common.ms(st['scan_time'])}",
            ]
        )
    req_ratio = crowded["requests"] / only["requests"]
    read_ratio = crowded["read"] / max(1e-9, only["read"])
    time_ratio = crowded["time"] / only["time"]
    list_rows.append(
        [
            "ratio (with idle / active only)",
            f"{req_ratio:.2f}x",
            "",
            f"{read_ratio:.2f}x",
            f"{time_ratio:.2f}x",
            "",
        ]
    )
    list_md = common.table_md(
        [
            "table holds",
            "requests/call",
            "by operation",
            "items read/call",
            "median time",
            "for scale: one Scan (requests / items read / time)",
        ],
        list_rows,
    )
    print(f"\nreap {args.rows} expired rows\n")
    print(reap_md)
    print(f"\nlist active holds (`operations.active_holds()`, {args.repeat} calls per state)\n")
    print(list_md)
    print(
        f"\nratios: reap speed-up {b_time / d_time:.2f}x, requests dynasem/baseline "
        f"{common.all_calls(d_snap) / common.all_calls(b_snap):.2f}x; listing with idle rows / "
        f"without: requests {req_ratio:.2f}x, items read {read_ratio:.2f}x, time "
        f"{time_ratio:.2f}x\n"
    )
    if only["heartbeat"] or crowded["heartbeat"]:
        print(
            f"(heartbeat renewals during the listing calls, not counted above: "
            f"{only['heartbeat'] + crowded['heartbeat']})"
        )

    targets = common.Targets()
    targets.check(
        f"reap {args.rows} rows: dynasem speed-up over a 1-thread Scan-and-delete",
        b_time / d_time >= 5.0,
        f"{b_time / d_time:.2f}x ({d_time:.2f} s vs {b_time:.2f} s)",
        ">= 5x",
    )
    targets.check(
        f"list with {args.rows} idle rows vs without: requests",
        req_ratio <= 1.1,
        f"{req_ratio:.2f}x",
        "<= 1.1x",
    )
    targets.check(
        f"list with {args.rows} idle rows vs without: items read",
        read_ratio <= 1.1,
        f"{read_ratio:.2f}x ({crowded['read']:.0f} vs {only['read']:.0f})",
        "<= 1.1x",
    )

    if not args.no_doc:
        intro = f"""
Rows are written straight in dynasem's stored format with `BatchWriteItem` (TTL off on the
table, so DynamoDB Local's own TTL sweep cannot race the reapers). **Reap:** {args.rows} rows
whose only holder's lease ended two minutes ago; the baseline is one thread doing `Scan`
(filter `expMs < cutoff`) and a `DeleteItem` per row conditional on `expMs < cutoff` (the
condition dynasem uses); dynasem is `reaping.reap(workers={args.workers})` (expires index,
8 shards, {args.workers} delete threads). *CPU client / engine*: CPU seconds of this Python
process (all threads) and of the DynamoDB Local JVM during the reap. Both first reap
{args.warmup_rows} rows unmeasured; the rows are written again between the two measured
reaps. **List:** `operations.active_holds()` with {args.active} live
holds (lease 60 s), then with {args.rows} idle (released 1 s - 10 min ago) rows added;
requests per call (main thread; heartbeat renewals excluded), items read = `ScannedCount` of
each Query/Scan from an `after-call` hook (DynamoDB Local reports no consumed capacity),
median of {args.repeat} calls. The last column is what one filtered `Scan` of the table reads,
for scale.
"""
        common.write_section(
            "reap_and_list",
            common.section(
                f"Reap {args.rows} expired rows; list holds beside {args.rows} idle rows "
                "(`reap_and_list.py`)",
                started,
                intro,
                [reap_md, list_md],
                targets,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
