"""Busy: what a refused caller is told for holds of 0.2-0.5 s, before and now.

    .venv/bin/python benchmarks/busy.py [--holds 20] [--queued 0 2]

One process, one DynamoDB Local, dynasem's default timing (``LEASE`` 60 s, ``CLOCK_SKEW``
5 s). For each hold length (0.2, 0.3, 0.4, 0.5 s) and each number of queued waiters
(``--queued``), on a fresh resource:

* a holder thread takes the resource ``--holds`` times, holding it that long each time and
  pausing 0.1-0.3 s between holds; ``queued`` more threads do the same with ``wait=60``, so
  they queue behind whoever holds it;
* a prober thread tries ``semaphore(resource, wait=0)`` every 0.05-0.25 s (releasing at once
  what it gets) and, for every refusal, records
  - *before*: what ``retry_after`` was until issue 21, the first holder's lease end +
    ``CLOCK_SKEW`` rounded up, computed by that formula from the very refusal (the acquire
    loop's ``busy`` is wrapped: it receives who was in the way);
  - *now*: ``retry_after``, ``estimated_wait`` and ``queue_position``;
  - *actual*: from the refusal until the caller's turn came: the ``queue_position``-th
    release after it (the holder's, then one per waiter that was ahead);
  - the prober's own requests (botocore ``before-call`` in the prober thread).

Printed: one row per (hold, queued); ``turn by retry_after`` is the share of refusals whose
turn had come when ``retry_after`` (whole seconds) was up. Target: every ``retry_after``
<= 2 s.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HOLDS = (0.2, 0.3, 0.4, 0.5)
TARGET = 2  # seconds: the most retry_after may say for these holds


def run_one(hold: float, queued: int, holds: int, refusals: list[dict[str, Any]]) -> int:
    """One scenario; returns how many holds the holder and the queued threads took."""
    from dynasem import SemaphoreBusy, semaphore

    resource = common.new_name(f"busy-{hold:g}-{queued}")
    releases: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()
    taken = [0]

    def worker(name: str) -> None:
        for _ in range(holds):
            with semaphore(resource, user=name, wait=60):
                with lock:
                    taken[0] += 1
                time.sleep(hold)
            with lock:
                releases.append(time.monotonic())
            time.sleep(random.uniform(0.1, 0.3))

    def prober() -> None:
        while not stop.is_set():
            time.sleep(random.uniform(0.05, 0.25))
            PROBER.requests, PROBER.before = 0, None
            refused_at = time.monotonic()
            try:
                semaphore(resource, user="prober", wait=0).acquire().release()
                with lock:
                    releases.append(time.monotonic())
            except SemaphoreBusy as exc:
                refusals.append(
                    {
                        "at": refused_at,
                        "before": PROBER.before,
                        "now": exc.retry_after,
                        "estimate": exc.estimated_wait,
                        "position": exc.queue_position or 1,
                        "requests": PROBER.requests,
                        "releases": releases,
                    }
                )

    threads = [
        threading.Thread(target=worker, args=(name,))
        for name in ["holder", *(f"queued-{i}" for i in range(queued))]
    ]
    probe = threading.Thread(target=prober, name="prober")
    for t in threads:
        t.start()
    time.sleep(hold / 2)
    probe.start()
    for t in threads:
        t.join()
    stop.set()
    probe.join()
    return taken[0]


class _Prober(threading.local):
    before: int | None = None
    requests: int = 0


PROBER = _Prober()


def wrap_busy() -> None:
    """Record, for each refusal, the retry_after of before issue 21 (same inputs)."""
    from dynasem._engine import queue as queueing

    real = queueing.busy

    def busy(run: Any, blocked: Mapping[str, Any], *args: Any) -> Any:
        holders = blocked[next(iter(blocked))]
        PROBER.before = math.ceil(queueing.seconds_until_free(blocked, run.skew)) if holders else 1
        return real(run, blocked, *args)

    queueing.busy = busy  # type: ignore[assignment]


def count_prober_requests() -> None:
    from dynasem._storage import dynamodb

    def before_call(**kwargs: Any) -> None:
        if threading.current_thread().name == "prober":
            PROBER.requests += 1

    dynamodb.get_client().meta.events.register("before-call.dynamodb", before_call)


def actual_wait(refusal: dict[str, Any]) -> float:
    """From the refusal to the ``position``-th release after it (NaN if the run ended
    first)."""
    after = sorted(t for t in refusal["releases"] if t > refusal["at"])
    n = refusal["position"]
    return after[n - 1] - refusal["at"] if len(after) >= n else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holds", type=int, default=20, help="holds per thread and scenario")
    parser.add_argument(
        "--queued", type=int, nargs="+", default=[0, 2], help="queued waiters per scenario"
    )
    args = parser.parse_args(argv)

    with common.engine() as ddb:
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-busy"))
        common.create_dynasem_table()
        from django.test import override_settings

        from dynasem.conf import settings

        wrap_busy()
        rows = []
        every: list[int] = []
        print(f"machine: {common.machine()}\n", flush=True)
        with override_settings(DYNASEM=dict(settings.raw, LEASE=60, CLOCK_SKEW=5)):
            count_prober_requests()  # the client is built again for the new settings
            for queued in args.queued:
                for hold in HOLDS:
                    refusals: list[dict[str, Any]] = []
                    taken = run_one(hold, queued, args.holds, refusals)
                    for r in refusals:
                        r["actual"] = actual_wait(r)
                    actual = [r["actual"] for r in refusals if not math.isnan(r["actual"])]
                    now = [r["now"] for r in refusals]
                    before = [r["before"] for r in refusals if r["before"] is not None]
                    every += now
                    in_time = [r for r in refusals if not math.isnan(r["actual"])]
                    by_retry = sum(r["actual"] <= r["now"] for r in in_time)
                    errors = [abs(r["estimate"] - r["actual"]) for r in in_time]
                    rows.append(
                        [
                            f"{hold:g} s",
                            queued,
                            taken,
                            len(refusals),
                            f"{min(before, default=0)}-{max(before, default=0)} s",
                            f"{min(now, default=0)}-{max(now, default=0)} s",
                            common.fmt(common.percentile([r["estimate"] for r in refusals], 50)),
                            common.fmt(common.percentile(actual, 50)),
                            common.fmt(common.percentile(errors, 50)),
                            f"{by_retry}/{len(in_time)}",
                            common.fmt(
                                sum(r["requests"] for r in refusals) / max(1, len(refusals))
                            ),
                        ]
                    )
                    print(f"hold {hold:g} s, {queued} queued: {len(refusals)} refusals", flush=True)

    print()
    print(
        common.table_md(
            [
                "hold",
                "queued",
                "holds",
                "refusals",
                "retry_after before",
                "retry_after now",
                "estimated_wait p50 (s)",
                "actual wait p50 (s)",
                "|estimate - actual| p50 (s)",
                "turn by retry_after",
                "requests / refusal",
            ],
            rows,
        )
    )
    print()
    targets = common.Targets()
    targets.check(
        f"every retry_after <= {TARGET} s for holds of 0.2-0.5 s",
        bool(every) and max(every) <= TARGET,
        f"max {max(every, default=0)} s over {len(every)} refusals",
        f"<= {TARGET} s",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
