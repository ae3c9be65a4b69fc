"""Many resources: 8 processes acquire + release random resources out of 1,000.

    .venv/bin/python benchmarks/many_resources.py [--processes 8] [--resources 1000] [--seconds 6]

One DynamoDB Local; ``--processes`` worker processes (multiprocessing *spawn*) live through
every run. In a run each participating worker loops for ``--seconds``: pick a resource at
random out of ``--resources``, acquire it, release it (no hold time). Runs:

* floor x1: one process, raw boto3 ``PutItem`` (``attribute_not_exists``) + ``DeleteItem``
  (conditional on the token) on a plain table: the uncontended floor of this engine;
* floor x8: the same in every process (collisions: the refused process picks another resource);
* dynasem: ``with semaphore(resource, wait=5): pass``;
* python-dynamodb-lock: ``acquire_lock(resource, retry_period=10 ms)`` + ``release()``.

Throughput = cycles completed by all processes / wall (first cycle started .. last cycle
ended). The ratio asked for is ``throughput / (8 x floor x1 throughput)``: how close 8
processes come to eight times one process's raw floor (1.0 = perfect scaling of the floor).
On a 2-core machine that also runs the engine it cannot come near 1; ``throughput / floor x8
throughput`` (the floor at the same concurrency) is shown beside it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def worker(cfg: dict[str, Any], idx: int, jobs: Any, barrier: Any, out: Any) -> None:
    try:
        common.setup_dynasem(cfg["endpoint"], cfg["dynasem_table"])
        from dynasem import semaphore
        from dynasem._storage import lock_rows

        counters = {k: common.RequestCounter() for k in ("floor", "dynasem", "peer")}
        common.dynasem_client(counters["dynasem"])
        floor = common.raw_client(cfg["endpoint"], counters["floor"])
        resource = common.peer_resource(cfg["endpoint"], counters["peer"])
        peer = common.peer_client(resource, cfg["peer_table"])
        lock_rows.get("warm-up")
        resource.Table(cfg["peer_table"]).get_item(Key={"lock_key": "warm-up", "sort_key": "-"})
        floor.get_item(
            TableName=cfg["floor_table"], Key={"pk": {"S": "warm-up"}, "sk": {"S": "lock"}}
        )
        out.put(("ready", idx, None))
    except BaseException:
        out.put(("error", idx, traceback.format_exc()))
        return
    rng = random.Random(idx * 7919 + 17)
    retry = timedelta(milliseconds=10)
    floor_table = cfg["floor_table"]

    def floor_cycle(res: str) -> bool:
        token = uuid.uuid4().hex
        if not common.floor_acquire(floor, floor_table, res, token):
            return False
        common.floor_release(floor, floor_table, res, token)
        return True

    def dynasem_cycle(res: str) -> bool:
        with semaphore(res, wait=5):
            pass
        return True

    def peer_cycle(res: str) -> bool:
        lock = peer.acquire_lock(res, retry_period=retry, retry_timeout=timedelta(seconds=5))
        lock.release(best_effort=False)
        return True

    cycles = {"floor": floor_cycle, "dynasem": dynasem_cycle, "peer": peer_cycle}
    while True:
        job = jobs.get()
        if job is None:
            break
        try:
            kind, prefix = job["kind"], job["prefix"]
            if idx >= job["active"]:
                out.put(("done", idx, None))
                continue
            cycle, counter = cycles[kind], counters[kind]
            counter.reset()
            if job["active"] > 1:
                barrier.wait()
            t0 = time.monotonic()
            deadline = t0 + job["seconds"]
            done = refused = 0
            t_end = t0
            while t_end < deadline:
                res = f"{prefix}-{rng.randrange(job['resources'])}"
                if cycle(res):
                    done += 1
                else:
                    refused += 1
                t_end = time.monotonic()
            out.put(
                (
                    "done",
                    idx,
                    {
                        "t0": t0,
                        "t_end": t_end,
                        "cycles": done,
                        "refused": refused,
                        "requests": counter.snapshot(),
                    },
                )
            )
        except BaseException:
            out.put(("error", idx, traceback.format_exc()))
            try:
                barrier.abort()
            except Exception:
                pass
            return
    peer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--resources", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each run")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds of each warm-up run")
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    common.require_peer()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    n = args.processes

    with common.engine() as ddb:
        endpoint = ddb.endpoint_url
        cfg = {
            "endpoint": endpoint,
            "dynasem_table": common.new_name("bench-many"),
            "peer_table": common.new_name("bench-many-peer"),
            "floor_table": common.new_name("bench-many-floor"),
        }
        common.setup_dynasem(endpoint, cfg["dynasem_table"])
        common.create_dynasem_table()
        common.create_peer_table(endpoint, cfg["peer_table"])
        common.create_floor_table(common.raw_client(endpoint), cfg["floor_table"])

        runs = [
            {"key": "floor1", "kind": "floor", "active": 1, "label": "floor x1 (raw put + delete)"},
            {"key": "floor8", "kind": "floor", "active": n, "label": f"floor x{n}"},
            {"key": "dynasem", "kind": "dynasem", "active": n, "label": f"dynasem x{n}"},
            {"key": "peer", "kind": "peer", "active": n, "label": f"{common.PEER} x{n}"},
        ]
        with common.worker_pool(worker, cfg, n) as (job_queues, out):
            plan = [("warm-up", r, args.warmup) for r in runs if r["active"] == n]
            plan += [("run", r, args.seconds) for r in runs]
            for k, (phase, run, seconds) in enumerate(plan):
                job = {
                    "kind": run["kind"],
                    "active": run["active"],
                    "seconds": seconds,
                    "resources": args.resources,
                    "prefix": f"r{k}",
                }
                for q in job_queues:
                    q.put(job)
                print(f"{phase} {run['label']} ({seconds:g} s) ...", flush=True)
                # Workers left out of a run (floor x1) answer None.
                answers = common.collect(out, n, run["label"], seconds + 300)
                results = [r for r in answers if r is not None]
                if phase == "run":
                    wall = max(r["t_end"] for r in results) - min(r["t0"] for r in results)
                    total = sum(r["cycles"] for r in results)
                    run["cycles"] = total
                    run["refused"] = sum(r["refused"] for r in results)
                    run["wall"] = wall
                    run["rate"] = total / wall
                    run["requests"] = common.merge(r["requests"] for r in results)
                    print(f"  {run['rate']:.1f} cycles/s", flush=True)

    by = {r["key"]: r for r in runs}
    floor1, floor8 = by["floor1"]["rate"], by["floor8"]["rate"]
    rows = []
    for r in runs:
        req = r["requests"]
        rows.append(
            [
                r["label"],
                r["cycles"],
                common.fmt(r["rate"], 1),
                common.fmt(r["rate"] / (n * floor1)),
                common.fmt(r["rate"] / floor8),
                common.fmt(common.work_calls(req) / max(1, r["cycles"])),
                common.by_operation(req, max(1, r["cycles"])),
                f"{common.heartbeat_calls(req)} / {common.retries(req)}",
                r["refused"],
            ]
        )
    headers = [
        "system",
        "cycles",
        "cycles/s",
        f"/ ({n} x floor x1)",
        f"/ floor x{n}",
        "requests/cycle",
        "by operation",
        "heartbeat reqs / retries",
        "floor collisions",
    ]
    results_md = common.table_md(headers, rows)
    print(
        f"\n{n} processes, random resource out of {args.resources} per cycle, "
        f"{args.seconds:g} s per run; floor x1 = {floor1:.1f} cycles/s, so {n} x floor x1 = "
        f"{n * floor1:.1f}\n"
    )
    print(results_md)
    dyn, peer = by["dynasem"]["rate"], by["peer"]["rate"]
    ratio_line = (
        f"dynasem / ({n} x floor x1) = {dyn / (n * floor1):.2f}; "
        f"{common.PEER} / ({n} x floor x1) = {peer / (n * floor1):.2f}; "
        f"dynasem / {common.PEER} = {dyn / peer:.2f}x; dynasem / floor x{n} = {dyn / floor8:.2f}"
    )
    print("\nratios: " + ratio_line + "\n")

    targets = common.Targets()  # the issue sets no target for this one
    if not args.no_doc:
        intro = f"""
{n} OS processes (multiprocessing spawn), each looping for {args.seconds:g} s: pick one of
{args.resources} resources at random, acquire, release (no hold). One unmeasured
{args.warmup:g} s warm-up run per system first. dynasem: `with semaphore(res, wait=5): pass`;
{common.PEER}: `acquire_lock(res, retry_period=10 ms)` + `release()`
({common.peer_config_text()}); *floor*: raw boto3 conditional `PutItem` + conditional
`DeleteItem` on a plain table (*floor x1*: one process alone). **Ratio definition:**
`throughput / ({n} x floor x1 throughput)`, where *floor x1* is measured in the same run on the
same engine: 1.0 would mean {n} processes scale one process's raw floor perfectly. On this
machine the engine and all clients share {common.os.cpu_count()} cores, so the floor itself does
not scale (the *floor x{n}* row); `throughput / floor x{n}` compares at equal concurrency.
"""
        common.write_section(
            "many_resources",
            common.section(
                f"Many resources: {n} processes, {args.resources} resources (`many_resources.py`)",
                started,
                intro,
                [results_md, "Ratios: " + ratio_line + "."],
                targets,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
