"""Async waiters: many coroutines of one process waiting for a few busy resources.

    .venv/bin/python benchmarks/async_waiters.py [--scenarios spread threads one-key]
        [--one-key 500] [--one-key-hold 0.02]

One process, one DynamoDB Local, dynasem's default timing (``LEASE`` 60 s, ``CLOCK_SKEW``
5 s), the event loop's default executor left as ``asyncio.run`` makes it (``min(32, cpus +
4)`` threads: 6 on 2 cores). Scenarios:

* ``spread``: 50 coroutines over 5 resources (10 each), all started at once, each
  ``async with semaphore(resource, wait=10)`` holding it 0.1 s (``asyncio.sleep``);
* ``threads``: the same 50 as threads (``with semaphore(...)``, ``time.sleep``), the
  comparison;
* ``one-key``: ``--one-key`` coroutines (500) on one resource, ``wait=900`` (long enough for
  all), ``--one-key-hold`` each (0.02 s), to show they are all served in turn (one after
  the other: ``overlaps`` 0). Their queue is one DynamoDB item of about 100 KB, so each
  write costs about 100 WCU: what issue 22's layout is for.

Meanwhile a probe coroutine (not in ``threads``) calls ``asyncio.to_thread`` on a no-op every
50 ms, as the application's own code would, and records how long it waited for a thread of the
default executor.

Printed per scenario: holds taken of those asked, how many gave up (``SemaphoreBusy``), the
idle gap between one holder's block end and the next holder's block start on each resource
(median, p95, max), overlaps (must be 0), the application's ``to_thread`` delay (median, max),
requests and capacity units per hold (``ReturnConsumedCapacity``), and the wall time. Targets
(issue 21): ``spread`` 50 of 50 held, median idle gap <= 20 ms; ``one-key`` all served.

Run against a tree without the change (``PYTHONPATH`` set to it) for the "before" figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import cost  # noqa: E402

SCENARIOS = ("spread", "threads", "one-key")


class Record:
    """What one scenario saw: every block's (start, end) per resource, refusals, errors."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.busy = 0
        self.errors: list[str] = []
        self.probe: list[float] = []
        self._lock = threading.Lock()

    def block(self, resource: str, start: float, end: float) -> None:
        with self._lock:
            self.blocks[resource].append((start, end))

    def gaps(self) -> list[float]:
        out = []
        for intervals in self.blocks.values():
            intervals.sort()
            out += [b[0] - a[1] for a, b in zip(intervals, intervals[1:], strict=False)]
        return out

    def held(self) -> int:
        return sum(len(v) for v in self.blocks.values())


async def _probe(record: Record, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        await asyncio.to_thread(lambda: None)
        record.probe.append(time.monotonic() - t0)
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass


async def _coroutines(resources: list[str], per: int, hold: float, wait: float) -> Record:
    from dynasem import SemaphoreBusy, semaphore

    record = Record()

    async def one(resource: str, i: int) -> None:
        try:
            async with semaphore(resource, user=f"c{i}", wait=wait):
                start = time.monotonic()
                await asyncio.sleep(hold)
                record.block(resource, start, time.monotonic())
        except SemaphoreBusy:
            record.busy += 1
        except Exception as exc:  # counted, not fatal: the figures say what happened
            record.errors.append(repr(exc))

    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(record, stop))
    await asyncio.gather(*(one(r, i) for i in range(per) for r in resources))
    stop.set()
    await probe
    return record


def _threads(resources: list[str], per: int, hold: float, wait: float) -> Record:
    from dynasem import SemaphoreBusy, semaphore

    record = Record()

    def one(resource: str, i: int) -> None:
        try:
            with semaphore(resource, user=f"t{i}", wait=wait):
                start = time.monotonic()
                time.sleep(hold)
                record.block(resource, start, time.monotonic())
        except SemaphoreBusy:
            with record._lock:
                record.busy += 1
        except Exception as exc:
            record.errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(r, i)) for i in range(per) for r in resources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return record


def overlaps(record: Record) -> int:
    n = 0
    for intervals in record.blocks.values():
        intervals.sort()
        n += sum(b[0] < a[1] for a, b in zip(intervals, intervals[1:], strict=False))
    return n


def run(name: str, args: argparse.Namespace, meter: cost.Meter) -> list[Any]:
    if name == "one-key":
        resources, per, hold = [common.new_name("one")], args.one_key, args.one_key_hold
        wait = 900.0  # long enough for all: the question is whether each is served
    else:
        resources, per, hold, wait = [common.new_name(f"k{i}") for i in range(5)], 10, 0.1, 10
    asked = len(resources) * per
    t0 = time.monotonic()
    with meter.measure() as units:
        if name == "threads":
            record = _threads(resources, per, hold, wait)
        else:
            record = asyncio.run(_coroutines(resources, per, hold, wait))
    wall = time.monotonic() - t0
    gaps = record.gaps()
    held = record.held()
    requests = sum(units.requests.values())
    probe = record.probe
    row = [
        name,
        f"{held}/{asked}",
        record.busy,
        len(record.errors),
        common.ms(statistics.median(gaps)) if gaps else "-",
        common.ms(common.percentile(gaps, 95)) if gaps else "-",
        common.ms(max(gaps)) if gaps else "-",
        overlaps(record),
        f"{common.ms(statistics.median(probe))} / {common.ms(max(probe))}" if probe else "-",
        common.fmt(requests / max(1, held)),
        common.fmt(units.wcu / max(1, held)),
        common.fmt(units.rcu / max(1, held)),
        f"{wall:.1f} s",
    ]
    for error in record.errors[:5]:
        print(f"  {name}: error {error}", flush=True)
    print(f"{name}: {held}/{asked} held in {wall:.1f} s", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--one-key", type=int, default=500, help="waiters of one-key")
    parser.add_argument("--one-key-hold", type=float, default=0.02, help="their hold (s)")
    args = parser.parse_args(argv)

    with common.engine() as ddb:
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-async"))
        common.create_dynasem_table()
        from django.test import override_settings

        from dynasem._storage import dynamodb
        from dynasem.conf import settings

        print(f"machine: {common.machine()}\n", flush=True)
        rows = []
        with override_settings(DYNASEM=dict(settings.raw, LEASE=60, CLOCK_SKEW=5)):
            meter = cost.Meter()
            meter.attach(dynamodb.get_client())  # the client is built again for the new settings
            for name in args.scenarios:
                rows.append(run(name, args, meter))
    print()
    print(
        common.table_md(
            [
                "scenario",
                "held",
                "gave up",
                "errors",
                "idle gap median",
                "p95",
                "max",
                "overlaps",
                "app to_thread delay median / max",
                "requests / hold",
                "WCU / hold",
                "RCU / hold",
                "wall",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
