"""Where an uncontended acquire + release spends its time beyond a bare client (issue 43).

    .venv/bin/python benchmarks/cycle_profile.py [--cycles 2000] [--block 50] [--no-doc]

One process, one DynamoDB Local, two systems over 10 resources, in alternating blocks of
``--block`` cycles (after 300 warm-up cycles each), so that drift of the engine and of the
machine hits both alike:

* dynasem: ``with semaphore(resource, wait=0): pass``;
* bare: the same two requests sent by a bare boto3 client on the same table: dynasem's take
  (``lock_writes.take_free``, ``ReturnValues="ALL_NEW"``) and release (``lock_writes.give_back``),
  built by dynasem's own builders each cycle (so the bare side pays for the expressions too).

Measured per cycle, without a profiler: wall time and this process's CPU time
(``time.process_time``, the heartbeat thread included). Then one profiled run of each
(``cProfile``, the calling thread) splits the time by where it went: botocore and the HTTP
stack, dynasem's storage layer (expressions, encoding, decoding), its lock engine, its
settings, telemetry and signals, Django, threading, and the built-in functions, whose time
includes the waits on the socket. A profiler slows pure-Python code more than C, so its
microseconds are larger than the unprofiled ones: they are shown as measured.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import results as recorded  # noqa: E402

# Where a profiled function's own time goes, by the first match on its file's path.
PLACES = [
    (
        "botocore, urllib3 and the HTTP stack",
        (
            "botocore",
            "urllib3",
            "http/",
            "socket",
            "ssl",
            "email/",
            "json/",
            "urllib/",
            "selectors",
        ),
    ),
    ("dynasem: storage (expressions, encode, decode, requests)", ("dynasem/_storage",)),
    ("dynasem: the lock engine", ("dynasem/_engine", "dynasem/_transactions", "dynasem/_clock")),
    ("dynasem: settings, telemetry, signals, arguments", ("dynasem/",)),
    ("Django (signals, settings)", ("django/",)),
    ("boto3 (type serializer)", ("boto3/",)),
    ("threading (the heartbeat's scheduling, locks)", ("threading.py",)),
    ("uuid (a token per acquire)", ("uuid.py",)),
    ("built-in functions (C; waiting on the socket included)", ("~",)),
]


def place_of(filename: str) -> str:
    for place, parts in PLACES:
        if any(part in filename for part in parts):
            return place
    return "the rest of the standard library"


def profile(cycle: Callable[[int], None], n: int) -> dict[str, float]:
    """Seconds of own time per place, per cycle, over ``n`` profiled cycles."""
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(n):
        cycle(i)
    profiler.disable()
    by_place: dict[str, float] = defaultdict(float)
    stats: Any = pstats.Stats(profiler).stats
    for (filename, _, _), (_, _, tottime, _, _) in stats.items():
        by_place[place_of(filename)] += tottime / n
    return dict(by_place)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument(
        "--no-doc",
        action="store_true",
        help="do not record the result nor update docs/BENCHMARKS.md",
    )
    args = parser.parse_args(argv)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    with common.engine() as ddb:
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-cycle"))
        common.create_dynasem_table()
        from dynasem import _clock as clock
        from dynasem import semaphore
        from dynasem._storage import lock_writes
        from dynasem._storage.records import Mode
        from dynasem.conf import settings

        table = settings.TABLE_NAME
        bare_client = common.raw_client(ddb.endpoint_url)
        refused_old = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}

        def dynasem_cycle(i: int) -> None:
            with semaphore(f"res-{i % 10}", wait=0):
                pass

        def bare_cycle(i: int) -> None:
            resource, token, now = f"bare-{i % 10}", uuid.uuid4().hex, clock.now_ms()
            entry = lock_writes.holder_entry(
                "bench", now + 10_000, clock.new_fence(0.5), now, False
            )
            take = lock_writes.take_free(
                resource, token, entry, mode=Mode.EXCLUSIVE, limit=1, stale_ms=now - 500
            )
            bare_client.update_item(TableName=table, ReturnValues="ALL_NEW", **refused_old, **take)
            back = lock_writes.give_back(resource, token, now, sole=True)
            bare_client.update_item(TableName=table, ReturnValues="NONE", **refused_old, **back)

        systems = {"dynasem": dynasem_cycle, "bare": bare_cycle}
        for cycle in systems.values():
            for i in range(300):
                cycle(i)
        wall: dict[str, list[float]] = {name: [] for name in systems}
        cpu: dict[str, float] = dict.fromkeys(systems, 0.0)
        done = 0
        while done < args.cycles:
            for name, cycle in systems.items():
                cpu_start = time.process_time()
                for i in range(done, done + args.block):
                    start = time.perf_counter()
                    cycle(i)
                    wall[name].append(time.perf_counter() - start)
                cpu[name] += time.process_time() - cpu_start
            done += args.block
        profiled = {name: profile(cycle, min(1000, args.cycles)) for name, cycle in systems.items()}

    n = len(wall["dynasem"])
    median = {name: common.percentile(values, 50) for name, values in wall.items()}
    cpu_per = {name: total / n for name, total in cpu.items()}
    wall_ratio = median["dynasem"] / median["bare"]
    cpu_ratio = cpu_per["dynasem"] / cpu_per["bare"]
    rows = [
        [name, common.ms(median[name]), common.ms(cpu_per[name])] for name in ("dynasem", "bare")
    ]
    rows.append(["dynasem / bare", f"{wall_ratio:.2f}x", f"{cpu_ratio:.2f}x"])
    measured = common.table_md(["system", "wall median / cycle", "client CPU / cycle"], rows)
    places = sorted(
        set(profiled["dynasem"]) | set(profiled["bare"]),
        key=lambda p: -profiled["dynasem"].get(p, 0),
    )
    us = lambda s: f"{s * 1e6:,.0f} µs"  # noqa: E731
    prof_rows = []
    for place in places:
        mine, theirs = profiled["dynasem"].get(place, 0.0), profiled["bare"].get(place, 0.0)
        prof_rows.append([place, us(mine), us(theirs), us(mine - theirs)])
    totals = {name: sum(p.values()) for name, p in profiled.items()}
    prof_rows.append(
        [
            "**total**",
            us(totals["dynasem"]),
            us(totals["bare"]),
            us(totals["dynasem"] - totals["bare"]),
        ]
    )
    split = common.table_md(
        ["where (own time, profiled)", "dynasem / cycle", "bare / cycle", "dynasem's extra"],
        prof_rows,
    )
    print(measured + "\n\n" + split)
    targets = common.Targets()
    targets.check(
        "wall median / the bare client's", wall_ratio <= 1.10, f"{wall_ratio:.2f}x", "<= 1.10x"
    )
    targets.check(
        "client CPU / the bare client's", cpu_ratio <= 1.10, f"{cpu_ratio:.2f}x", "<= 1.10x"
    )
    figures = {
        "wall_ratio": f"{wall_ratio:.2f}×",
        "cpu_ratio": f"{cpu_ratio:.2f}×",
        "dynasem_cpu": common.ms(cpu_per["dynasem"]),
        "bare_cpu": common.ms(cpu_per["bare"]),
    }
    if not args.no_doc:
        recorded.record(
            "cycle_profile", figures, machine=common.machine(), command=common.command()
        )
        intro = (
            f"One process, {n} uncontended cycles per system over 10 resources, in alternating "
            f"blocks of {args.block} after 300 warm-up cycles each: dynasem's `with "
            "semaphore(res, wait=0): pass` against a bare boto3 client sending the same two "
            "requests (dynasem's own `take_free` and `give_back` builders, the same table, "
            "ALL_NEW for the take), boto3's client as made by default: it validates each "
            "request's parameters, which dynasem's own client leaves out (it builds every "
            "request itself; the botocore row below shows what that saves). dynasem runs as "
            "installed here: `opentelemetry-api` importable, no MeterProvider or "
            "TracerProvider set (no span made, no capacity asked; with the SDK, "
            "`telemetry.py` measures what recording adds). *Client CPU* is "
            "`time.process_time` (the heartbeat thread included). The second table is one "
            "`cProfile` run of 1,000 cycles of each (the "
            "calling thread; wall time, so the built-in functions' row holds the waits on "
            "the socket), own time grouped by where the function lives; a profiler slows pure "
            "Python more than C, so its microseconds are larger than the first table's."
        )
        common.write_section(
            "cycle_profile",
            common.section(
                "Where an uncontended cycle's time goes (`cycle_profile.py`)",
                started,
                intro,
                [measured, split],
                targets,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
