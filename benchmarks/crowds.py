"""Crowds: what one acquisition costs as the crowd on one resource grows.

    .venv/bin/python benchmarks/crowds.py [--limits 2 64 512] [--waiters 4 32 128]
        [--cycles 20] [--per-waiter 4] [--async-crowd 10000] [--counting-crowd 3:12]
        [--readers 2 64 512 2048]
        [--wall] [--no-doc]

One process, one DynamoDB Local (``tests.support.settings``: ``LEASE`` 10 s, ``CLOCK_SKEW`` 0.5 s),
capacity units as AWS bills them (``cost.Meter``: ``ReturnConsumedCapacity="INDEXES"``, a
refused write 1 WCU, a transaction twice its writes). Issue 22's table, on the layout of the
tree it runs from:

* ``limit=N, N-1 held``: a counting semaphore filled with N - 1 holders (``lease=600``, so
  no renewal fires), then ``--cycles`` acquire + release of one more; per cycle.
* ``--readers N``: ``N - 1`` readers hold a shared lock (``lease=600``), then ``--cycles``
  acquire + release of one more reader; per cycle (the readers' layout, issue 22).
* ``W waiters``: W threads on one exclusive lock (``wait=60``), each taking it
  ``--per-waiter`` times and holding it 5 ms; per acquisition (the requests of every thread:
  a holder's release is its heir's hand-over).
* ``--counting-crowd L:W[:fair]``: W threads on a counting semaphore of L permits
  (``wait=120``; ``fair``: every waiter queues, as a crowd does once a queue has formed),
  each taking one ``--per-waiter`` times and holding it 20 ms; per acquisition, and the
  share of the permits in use over the crowd's span.
* ``--async-crowd N``: N coroutines queue at once on one exclusive lock (``wait=3600``),
  each holding it 1 ms; per acquisition, and how long the crowd took.
* ``--wall``: holders of ``limit=6000`` (``lease=900``, short user ids) added one by one
  until an acquire fails: how many, the error, how long it took. Slow (minutes).

Printed: one row per case (WCU, RCU, requests per acquisition, the largest stored row in
bytes), and issue 22's targets beside them, as lines, never as an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import cost  # noqa: E402
import results  # noqa: E402

_PROBE: list[Any] = []  # a client of its own, not metered: the size probe costs nothing here


def row_bytes(resource: str) -> int:
    """The stored row's size, roughly as DynamoDB counts it (its wire form as JSON)."""
    from dynasem.conf import settings

    item = (
        _PROBE[0]
        .get_item(
            TableName=settings.TABLE_NAME,
            Key={"pk": {"S": resource}, "sk": {"S": "lock"}},
            ConsistentRead=True,
        )
        .get("Item", {})
    )
    return len(json.dumps(item, separators=(",", ":")).encode())


def run_threads(meter: cost.Meter, worker: Any, n: int) -> Any:
    """``n`` threads running ``worker``, metered from their start to the last one's end."""
    threads = [threading.Thread(target=worker) for _ in range(n)]
    with meter.measure() as units:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return units


def one_more(
    meter: cost.Meter, case: str, key: str, held: int, cycles: int, **options: Any
) -> dict[str, Any]:
    """``held`` holders of ``semaphore(resource, lease=600, **options)`` (no renewal fires),
    then ``cycles`` acquire + release of one more; per cycle."""
    from dynasem import semaphore

    resource = common.new_name(case.split(",")[0].replace("=", "-").replace(" ", ""))
    holds = [common.apart(semaphore(resource, lease=600, **options)) for _ in range(held)]
    try:
        size = row_bytes(resource)
        with meter.measure() as units:
            for _ in range(cycles):
                semaphore(resource, lease=600, **options).acquire().release()
    finally:
        for h in holds:
            h.release()
    return {
        "case": case,
        "key": key,
        "wcu": units.wcu / cycles,
        "rcu": units.rcu / cycles,
        "requests": sum(units.requests.values()) / cycles,
        "row": size,
    }


def counting(meter: cost.Meter, limit: int, cycles: int) -> dict[str, Any]:
    case = f"limit={limit}, {limit - 1} held"
    return one_more(meter, case, f"limit_{limit}", limit - 1, cycles, limit=limit)


def readers(meter: cost.Meter, n: int, cycles: int) -> dict[str, Any]:
    """``n - 1`` readers hold a shared lock, then one more reader comes and goes."""
    case = f"shared, {n - 1} readers held"
    return one_more(meter, case, f"readers_{n}", n - 1, cycles, shared=True)


def queued(meter: cost.Meter, waiters: int, per_waiter: int) -> dict[str, Any]:
    from dynasem import semaphore

    resource = common.new_name(f"queue-{waiters}")
    biggest = [0]
    taken = [0]
    lock = threading.Lock()
    start = threading.Barrier(waiters)

    def worker() -> None:
        start.wait()
        for _ in range(per_waiter):
            with semaphore(resource, wait=60):
                with lock:
                    taken[0] += 1
                    if taken[0] % max(1, waiters // 4) == 0:
                        biggest[0] = max(biggest[0], row_bytes(resource))
                time.sleep(0.005)

    units = run_threads(meter, worker, waiters)
    n = max(1, taken[0])
    return {
        "case": f"{waiters} waiters, 5 ms holds",
        "key": f"waiters_{waiters}",
        "wcu": units.wcu / n,
        "rcu": units.rcu / n,
        "requests": sum(units.requests.values()) / n,
        "row": biggest[0],
    }


def counting_queued(
    meter: cost.Meter, limit: int, waiters: int, per_waiter: int, fair: bool = False
) -> dict[str, Any]:
    """``waiters`` threads on one counting semaphore of ``limit`` (``wait=120``), each taking a
    permit ``per_waiter`` times and holding it 20 ms: per acquisition, and the share of the
    permits in use over the crowd's span (the holds' total time over ``limit`` x the span:
    a queue that lets one waiter in at a time, or leaves freed permits idle, shows low)."""
    from dynasem import semaphore

    resource = common.new_name(f"counting-{limit}-{waiters}")
    holds: list[tuple[float, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(waiters)

    def worker() -> None:
        start.wait()
        for _ in range(per_waiter):
            with semaphore(resource, limit=limit, wait=120, fair=fair):
                began = time.monotonic()
                time.sleep(0.02)
                with lock:
                    holds.append((began, time.monotonic()))

    units = run_threads(meter, worker, waiters)
    n = max(1, len(holds))
    span = max(e for _, e in holds) - min(b for b, _ in holds)
    used = sum(e - b for b, e in holds) / (limit * span)
    return {
        "case": f"limit={limit}, {waiters}{' fair' if fair else ''} waiters, 20 ms holds: "
        f"{used:.0%} of permits in use"
        f" ({span:.1f} s)",
        "key": f"counting_{limit}_{waiters}{'_fair' if fair else ''}",
        "used": f"{used:.0%}",
        "wcu": units.wcu / n,
        "rcu": units.rcu / n,
        "requests": sum(units.requests.values()) / n,
        "row": row_bytes(resource),
    }


def async_crowd(meter: cost.Meter, waiters: int) -> dict[str, Any]:
    """``waiters`` coroutines (one event loop, no thread each) queue at once on one exclusive
    lock, wait as long as it takes, and hold it 1 ms each: per acquisition, and how long the
    whole crowd took. Their requests run in dynasem's own executor (32 threads)."""
    import asyncio

    from dynasem import semaphore

    resource = common.new_name(f"async-{waiters}")
    biggest = [0]
    taken = [0]

    async def one(i: int) -> None:
        async with semaphore(resource, user=f"c{i}", wait=3600, lease=600):
            taken[0] += 1
            if taken[0] % max(1, waiters // 8) == 0:
                biggest[0] = max(biggest[0], row_bytes(resource))
            await asyncio.sleep(0.001)

    async def crowd() -> None:
        await asyncio.gather(*(one(i) for i in range(waiters)))

    started = time.monotonic()
    with meter.measure() as units:
        asyncio.run(crowd())
    n = max(1, taken[0])
    took = time.monotonic() - started
    return {
        "case": f"{waiters} async waiters, 1 ms holds ({took:.0f} s)",
        "key": f"async_{waiters}",
        "seconds": f"{took:.0f} s",
        "wcu": units.wcu / n,
        "rcu": units.rcu / n,
        "requests": sum(units.requests.values()) / n,
        "row": biggest[0],
    }


def wall() -> str:
    from dynasem import SemaphoreError, semaphore

    resource = common.new_name("wall")
    held = []
    started = time.monotonic()
    try:
        for i in range(6000):
            try:
                held.append(common.apart(semaphore(resource, limit=6000, lease=900, user=f"u{i}")))
            except SemaphoreError as exc:
                return (
                    f"limit=6000: acquire {i + 1} failed after {time.monotonic() - started:.0f} s"
                    f" ({row_bytes(resource)} B stored): {type(exc).__name__}: {exc}"
                )
        return f"limit=6000: all 6000 held in {time.monotonic() - started:.0f} s"
    finally:
        for h in held:
            h.release()


TARGETS = [
    "issue 22 targets: limit=512 with 511 held <= 4 WCU + 1 RCU per acquire + release, and at "
    "most 1.5x limit=2;",
    "128 waiters <= 5 WCU + 1 RCU and <= 6 requests per acquisition, at most 1.5x 4 waiters; "
    "4 waiters no dearer than 3.75 WCU + 0.5 RCU; no stored item over 4 KB.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", type=int, nargs="*", default=[2, 64, 512])
    parser.add_argument("--waiters", type=int, nargs="*", default=[4, 32, 128])
    parser.add_argument(
        "--readers", type=int, nargs="*", default=[], help="shared holds: N-1 held, one more"
    )
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--per-waiter", type=int, default=4)
    parser.add_argument("--wall", action="store_true")
    parser.add_argument(
        "--counting-crowd",
        nargs="*",
        default=[],
        metavar="LIMIT:WAITERS[:fair]",
        help="crowds of thread waiters on a counting semaphore, e.g. 3:12 16:64 16:64:fair",
    )
    parser.add_argument(
        "--async-crowd", type=int, nargs="*", default=[], help="crowds of coroutine waiters"
    )
    parser.add_argument(
        "--no-doc",
        action="store_true",
        help="do not record the result nor update the pages that quote it (a partial run's "
        "figures would replace the whole recorded run's)",
    )
    args = parser.parse_args(argv)

    with common.engine() as ddb:
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-crowds"))
        common.create_dynasem_table()
        from dynasem._storage import dynamodb

        machine = common.machine()
        print(f"machine: {machine}\n", flush=True)
        _PROBE.append(common.raw_client(ddb.endpoint_url))
        meter = cost.Meter()
        meter.attach(dynamodb.get_client())
        meter.attach(dynamodb.get_client(quick=True))  # a reader's count-down goes through it
        rows = []
        for limit in args.limits:
            rows.append(counting(meter, limit, args.cycles))
            print(f"{rows[-1]['case']}: done", flush=True)
        for n in args.readers:
            rows.append(readers(meter, n, args.cycles))
            print(f"{rows[-1]['case']}: done", flush=True)
        for waiters in args.waiters:
            rows.append(queued(meter, waiters, args.per_waiter))
            print(f"{rows[-1]['case']}: done", flush=True)
        for crowd in args.counting_crowd:
            limit, waiters, *how = crowd.split(":")
            fair = how == ["fair"]
            rows.append(counting_queued(meter, int(limit), int(waiters), args.per_waiter, fair))
            print(f"{rows[-1]['case']}: done", flush=True)
        for waiters in args.async_crowd:
            rows.append(async_crowd(meter, waiters))
            print(f"{rows[-1]['case']}: done", flush=True)
        walled = wall() if args.wall else None
    print()
    print(
        common.table_md(
            ["case", "WCU", "RCU", "requests", "largest row (B)"],
            [
                [
                    r["case"],
                    common.fmt(r["wcu"]),
                    common.fmt(r["rcu"]),
                    common.fmt(r["requests"]),
                    r["row"],
                ]
                for r in rows
            ],
        )
    )
    if walled:
        print(f"\n{walled}")
    print()
    for line in TARGETS:
        print(line)
    if not args.no_doc:
        results.record("crowds", figures_of(rows), machine=machine, command=common.command())
    return 0


def figures_of(rows: list[dict[str, Any]]) -> dict[str, str]:
    """What the pages quote (docs/SCALE.md): per case, WCU, RCU and requests an acquisition
    (two decimals), the largest row, and a crowd's span or share of permits used."""
    figures = {}
    for r in rows:
        key = r["key"]
        figures |= {f"{key}_wcu": f"{r['wcu']:.2f}", f"{key}_rcu": f"{r['rcu']:.2f}"}
        figures |= {f"{key}_requests": f"{r['requests']:.2f}", f"{key}_row": f"{r['row']} B"}
        figures |= {f"{key}_{extra}": r[extra] for extra in ("seconds", "used") if extra in r}
    return figures


if __name__ == "__main__":
    sys.exit(main())
