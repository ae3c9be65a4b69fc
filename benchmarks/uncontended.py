"""Uncontended acquire + release: requests and latency per cycle, against a raw-boto3 floor.

    .venv/bin/python benchmarks/uncontended.py [--cycles 1000] [--resources 10]

One process, one DynamoDB Local. Each system runs ``--cycles`` acquire + release cycles over
``--resources`` resources (cycle i takes resource i mod resources), nobody else around:

* floor: raw boto3 ``PutItem`` conditional on ``attribute_not_exists(pk)`` + ``DeleteItem``
  conditional on our token, on a plain pk/sk table: the least any lock can send;
* dynasem: ``with semaphore(resource, wait=0): pass``;
* python-dynamodb-lock: ``acquire_lock(resource, retry_period=10 ms)`` + ``lock.release()``;
* diagnostic rows (``--no-diagnostics`` skips them), which split dynasem's time over the floor:
  the floor's two requests on dynasem's table with rows carrying ``userId``/``expires``/
  ``shard`` (so the engine maintains both GSIs); dynasem's own two ``UpdateItem`` requests
  (``lock_writes.take_free`` / ``lock_writes.give_back``) sent with raw boto3, on dynasem's table
  and on the floor's plain table; dynasem with its heartbeat not scheduled (monkeypatched).

The systems take turns in blocks of ``--block`` cycles (after ``--warmup`` unmeasured cycles
each), so JIT warm-up and drift of the engine hit all of them alike. A cycle's latency is from
before the acquire to after the release returned (``time.perf_counter``).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--resources", type=int, default=10)
    parser.add_argument("--block", type=int, default=25, help="cycles per turn")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured cycles per system")
    parser.add_argument(
        "--no-diagnostics",
        dest="diagnostics",
        action="store_false",
        help="skip the diagnostic rows",
    )
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    common.require_peer()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    with common.engine() as ddb:
        endpoint = ddb.endpoint_url
        common.setup_dynasem(endpoint, common.new_name("bench-unc"))
        common.create_dynasem_table()
        from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockError

        from dynasem import semaphore
        from dynasem.conf import settings

        dyn_table = settings.TABLE_NAME
        names = ("floor", "gsi", "dynasem", "peer", "raw", "rawplain", "nohb")
        counters = {name: common.RequestCounter() for name in names}
        common.dynasem_client(counters["dynasem"])
        floor_table, peer_table = common.new_name("bench-floor"), common.new_name("bench-peer")
        floor = common.raw_client(endpoint, counters["floor"])
        gsi = common.raw_client(endpoint, counters["gsi"])
        raw = common.raw_client(endpoint, counters["raw"])
        common.create_floor_table(floor, floor_table)
        common.create_peer_table(endpoint, peer_table)
        peer = common.peer_client(common.peer_resource(endpoint, counters["peer"]), peer_table)
        retry = timedelta(milliseconds=10)

        def floor_cycle(client, table_name, index_attributes=False):
            prefix = "floor-gsi" if index_attributes else "floor"

            def cycle(i: int) -> None:
                key, token = f"{prefix}-{i % args.resources}", uuid.uuid4().hex
                extra = None
                if index_attributes:  # what puts a row into both of dynasem's GSIs
                    extra = {
                        "userId": {"S": "bench"},
                        "expires": {"N": str(int(time.time()) + 10)},
                        "shard": {"N": str(i % 8)},
                    }
                if not common.floor_acquire(client, table_name, key, token, extra):
                    raise RuntimeError(f"floor: {key} unexpectedly taken")
                common.floor_release(client, table_name, key, token)

            return cycle

        def dynasem_cycle(i: int) -> None:
            with semaphore(f"res-{i % args.resources}", wait=0):
                pass

        def dynasem_raw_cycle(table_name: str):
            # dynasem's own two UpdateItems (its builders; ReturnValues as dynasem's acquire
            # asks, ALL_NEW), sent with raw boto3: the engine's share of dynasem's cost.
            from dynasem import _clock as clock
            from dynasem._storage import lock_writes

            def cycle(i: int) -> None:
                key, token, now = f"raw-{i % args.resources}", uuid.uuid4().hex, clock.now_ms()
                entry = lock_writes.holder_entry(
                    "bench", now + 10_000, clock.new_fence(0.5), now, False
                )
                extra = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
                take = lock_writes.take_free(
                    key, token, entry, mode="x", limit=1, stale_ms=now - 500
                )
                raw.update_item(TableName=table_name, ReturnValues="ALL_NEW", **extra, **take)
                back = lock_writes.give_back(key, token, now, sole=True)
                raw.update_item(TableName=table_name, ReturnValues="NONE", **extra, **back)

            return cycle

        def dynasem_no_heartbeat_cycle(i: int) -> None:
            # dynasem with its heartbeat not scheduled (diagnostic only).
            from dynasem._engine import core

            start = core.Held._start_heartbeat
            core.Held._start_heartbeat = lambda self: None
            try:
                with semaphore(f"nohb-{i % args.resources}", wait=0):
                    pass
            finally:
                core.Held._start_heartbeat = start

        def peer_cycle(i: int) -> None:
            lock = peer.acquire_lock(
                f"res-{i % args.resources}", retry_period=retry, retry_timeout=timedelta(seconds=5)
            )
            try:
                lock.release(best_effort=False)
            except DynamoDBLockError as exc:
                raise RuntimeError(f"peer release failed: {exc}") from exc

        systems: dict[str, Callable[[int], None]] = {
            "floor": floor_cycle(floor, floor_table),
            "dynasem": dynasem_cycle,
            "peer": peer_cycle,
        }
        if args.diagnostics:
            systems["gsi"] = floor_cycle(gsi, dyn_table, index_attributes=True)
            systems["raw"] = dynasem_raw_cycle(dyn_table)
            systems["rawplain"] = dynasem_raw_cycle(floor_table)
            systems["nohb"] = dynasem_no_heartbeat_cycle
        for name, cycle in systems.items():
            for i in range(args.warmup):
                cycle(i)
            counters[name].reset()

        latencies: dict[str, list[float]] = {name: [] for name in systems}
        # Requests of each block, from the counter of the client the system sends through
        # (the no-heartbeat variant shares dynasem's client).
        shared = {"nohb": "dynasem", "rawplain": "raw"}
        counter_of = {name: counters[shared.get(name, name)] for name in systems}
        deltas: dict[str, list[dict]] = {name: [] for name in systems}
        perf = time.perf_counter
        done = 0
        while done < args.cycles:
            n = min(args.block, args.cycles - done)
            for name, cycle in systems.items():
                lat = latencies[name]
                before = counter_of[name].snapshot()
                for i in range(done, done + n):
                    t0 = perf()
                    cycle(i)
                    lat.append(perf() - t0)
                deltas[name].append(common.diff(counter_of[name].snapshot(), before))
            done += n
        snaps = {name: common.merge(deltas[name]) for name in systems}
        peer.close()

    labels = {
        "floor": "floor (raw put + delete)",
        "gsi": "(diagnostic) floor on dynasem's table, rows in both GSIs",
        "dynasem": "dynasem",
        "peer": f"{common.PEER}",
        "raw": "(diagnostic) dynasem's 2 UpdateItems via raw boto3",
        "rawplain": "(diagnostic) the same on the floor's plain table",
        "nohb": "(diagnostic) dynasem, heartbeat not scheduled",
    }
    floor_med = common.percentile(latencies["floor"], 50)
    floor_p99 = common.percentile(latencies["floor"], 99)
    rows = []
    stats = {}
    for name in systems:
        lat, snap = latencies[name], snaps[name]
        med, p99 = common.percentile(lat, 50), common.percentile(lat, 99)
        per = common.work_calls(snap) / len(lat)
        stats[name] = (per, med, p99)
        rows.append(
            [
                labels[name],
                common.fmt(per),
                common.by_operation(snap, len(lat)),
                common.ms(med),
                common.ms(p99),
                f"{med / floor_med:.2f}x",
                f"{p99 / floor_p99:.2f}x",
                f"{common.heartbeat_calls(snap)} / {common.retries(snap)}",
            ]
        )
    headers = [
        "system",
        "requests/cycle",
        "by operation",
        "median",
        "p99",
        "median / floor",
        "p99 / floor",
        "heartbeat reqs / retries",
    ]
    results = common.table_md(headers, rows)
    print(f"\n{args.cycles} cycles per system over {args.resources} resources\n")
    print(results)
    dyn_per, dyn_med, _ = stats["dynasem"]
    peer_per, peer_med, _ = stats["peer"]
    print(
        f"\nratios: dynasem/floor median {dyn_med / floor_med:.2f}x, peer/floor median "
        f"{peer_med / floor_med:.2f}x, peer/dynasem median {peer_med / dyn_med:.2f}x, "
        f"requests peer/dynasem {peer_per / dyn_per:.2f}x\n"
    )

    targets = common.Targets()
    targets.check(
        "dynasem requests per cycle", abs(dyn_per - 2.0) < 1e-9, common.fmt(dyn_per), "2.0"
    )
    targets.check(
        f"{common.PEER} requests per cycle (reference)",
        abs(peer_per - 3.0) < 1e-9,
        common.fmt(peer_per),
        "3.0",
    )
    targets.check(
        "dynasem median latency / floor median",
        dyn_med <= 1.10 * floor_med,
        f"{dyn_med / floor_med:.2f}x ({common.ms(dyn_med)} vs {common.ms(floor_med)})",
        "<= 1.10x",
    )

    if not args.no_doc:
        intro = f"""
One process, {args.cycles} acquire + release cycles per system over {args.resources}
resources, no contention; the systems take turns in blocks of {args.block} cycles after
{args.warmup} unmeasured warm-up cycles each. *floor* = raw boto3 `PutItem` conditional on
`attribute_not_exists(pk)` + `DeleteItem` conditional on the token, on a plain table.
dynasem: `with semaphore(res, wait=0): pass`. {common.PEER}: `acquire_lock(res,
retry_period=10 ms)` + `release()` ({common.peer_config_text()}). The *(diagnostic)* rows
split dynasem's time over the floor: the floor's requests on dynasem's table with rows that
enter both GSIs (index maintenance); dynasem's own two `UpdateItem`s (built by
`dynasem._storage.lock_writes.take_free`/`give_back`) sent with raw boto3, on dynasem's table and
on the plain
table (the engine's cost of dynasem's expressions); dynasem with its heartbeat not scheduled
(monkeypatched: what scheduling the renewals costs).
Requests per cycle count the calling thread's requests (`before-call` hooks); heartbeat
requests and botocore retries are shown apart. Latency: acquire start to release end.
"""
        common.write_section(
            "uncontended",
            common.section(
                "Uncontended acquire + release (`uncontended.py`)",
                started,
                intro,
                [results],
                targets,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
