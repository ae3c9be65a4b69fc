"""Takeover from a dead holder: SIGKILL a holder mid-hold and time until a waiter on the same
host holds its resource.

    .venv/bin/python benchmarks/takeover.py [--lease 60] [--rounds 5] [--scenarios ...]

Starts its own DynamoDB Local and table (``tests.support.settings``: ``CLOCK_SKEW`` 0.5 s). In each
round a holder process (multiprocessing *spawn*, as a Celery or gunicorn worker is a process of
its own) takes a resource with ``lease=--lease`` and is SIGKILLed mid-hold; the time is from
just before the ``kill`` to the moment the waiter's ``acquire`` returned (``time.monotonic``:
one clock for every process on Linux). Scenarios:

* ``arriving``: a waiter process asks for the resource right after the kill (``wait`` = two
  leases), as the next task of a Celery worker would;
* ``queued``: a waiter process queued for the resource before the kill (``fair=True``, hand-over
  pushes on, the default ``PUSH``);
* ``queued-no-push``: the same with ``PUSH`` = ``None`` (it reads instead of being pushed).

The killed holder is reaped at once (``--zombie`` leaves it a zombie until the round ends), as
a Celery master or a gunicorn arbiter reaps its children. It prints, per scenario, the takeover
times of every round, their median and maximum, and whether every waiter's fence was larger
than the dead holder's. Run against a tree without the fast takeover (``PYTHONPATH`` set to it)
it measures the lease end plus ``CLOCK_SKEW`` instead.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SCENARIOS = ("arriving", "queued", "queued-no-push")


def hold(endpoint: str, table_name: str, resource: str, lease: float, out: Any) -> None:
    """Take the resource, say so, then work until SIGKILLed."""
    common.setup_dynasem(endpoint, table_name)
    from dynasem import semaphore

    held = semaphore(resource, lease=lease, user="doomed").acquire()
    out.put(("held", held.fence))
    time.sleep(3600)


def wait_for(
    endpoint: str,
    table_name: str,
    resource: str,
    scenario: str,
    wait: float,
    go: Any,
    out: Any,
) -> None:
    """Warm up (Django, the client), then take the resource: at once and queued, or on ``go``."""
    common.setup_dynasem(endpoint, table_name)
    from django.test import override_settings

    from dynasem import semaphore
    from dynasem.conf import settings

    with semaphore(f"warm-up:{os.getpid()}"):
        pass
    push = None if scenario == "queued-no-push" else settings.PUSH
    with override_settings(DYNASEM=dict(settings.raw, PUSH=push)):
        if scenario == "arriving":
            out.put(("ready", None))
            go.wait(600)
        else:
            out.put(("ready", None))
        with semaphore(resource, wait=wait, fair=scenario != "arriving", user="heir") as held:
            out.put(("held", (time.monotonic(), held.fence)))


def queued(resource: str, timeout: float = 60) -> None:
    from dynasem._operators import locks as operations

    deadline = time.monotonic() + timeout
    while not operations.waiters_on(resource):
        if time.monotonic() > deadline:
            raise RuntimeError("the waiter never queued")
        time.sleep(0.02)


def one_round(
    endpoint: str, table_name: str, scenario: str, n: int, lease: float, zombie: bool
) -> tuple[float, bool]:
    ctx = mp.get_context("spawn")
    resource = f"{scenario}:{n}"
    out, waiter_out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=hold, args=(endpoint, table_name, resource, lease, out))
    holder.start()
    waiter = None
    try:
        kind, dead_fence = out.get(timeout=120)
        assert kind == "held"
        waiter = ctx.Process(
            target=wait_for,
            args=(endpoint, table_name, resource, scenario, 2 * lease + 10, go, waiter_out),
        )
        waiter.start()
        assert waiter_out.get(timeout=120)[0] == "ready"
        if scenario != "arriving":
            queued(resource)
            time.sleep(1.0)  # the waiter sleeps toward its turn
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        if not zombie:
            holder.join(10)
        go.set()
        kind, (took, fence) = waiter_out.get(timeout=2 * lease + 60)
        assert kind == "held"
        return took - killed, fence > dead_fence
    finally:
        holder.kill()
        holder.join(10)
        if waiter is not None:
            waiter.join(30)
            if waiter.is_alive():
                waiter.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", type=float, default=60.0, help="the dead holder's lease (s)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--zombie", action="store_true", help="do not reap the killed holder")
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    with common.engine() as ddb:
        table_name = common.new_name("bench-takeover")
        common.setup_dynasem(ddb.endpoint_url, table_name)
        common.create_dynasem_table()
        from dynasem.conf import settings

        print(
            f"takeover: lease {args.lease:g} s, CLOCK_SKEW {settings.CLOCK_SKEW:g} s, "
            f"{args.rounds} round(s), killed holder {'left a zombie' if args.zombie else 'reaped'}"
            f", load average {common.START_LOAD}, Python {sys.version.split()[0]}"
        )
        for scenario in scenarios:
            times, fences_ok = [], True
            for n in range(args.rounds):
                took, ok = one_round(
                    ddb.endpoint_url, table_name, scenario, n, args.lease, args.zombie
                )
                times.append(took)
                fences_ok = fences_ok and ok
            shown = ", ".join(f"{t:.3f}" for t in times)
            print(
                f"{scenario:>15}: median {statistics.median(times):.3f} s, max {max(times):.3f} s "
                f"(rounds: {shown}); every fence above the dead holder's: {fences_ok}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
