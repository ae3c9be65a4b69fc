"""Bodies of the OS processes the race tests start (spawned, so each is a fresh interpreter
with its own boto3 client, as separate web workers would be)."""

from __future__ import annotations

import os
import time
from typing import Any


def setup_django(endpoint: str, table_name: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DYNASEM_TEST_ENDPOINT"] = endpoint
    os.environ["DYNASEM_TEST_TABLE"] = table_name
    for key, value in (("AWS_ACCESS_KEY_ID", "dummy"), ("AWS_SECRET_ACCESS_KEY", "dummy")):
        os.environ.setdefault(key, value)
    import django

    django.setup()


def rerun_failed_job(endpoint: str, table_name: str, key: str, barrier: Any, out: Any) -> None:
    """The seed scenario: re-process a FAILED job; report whether this process ran it."""
    setup_django(endpoint, table_name)
    from dynasem import AlreadyDone, SemaphoreBusy, run_once

    barrier.wait()
    try:
        with run_once(key, user=f"worker-{os.getpid()}") as job:
            out.put(("ran", os.getpid(), job.attempt))
            time.sleep(1.0)  # the work: long enough that every other process tries meanwhile
    except SemaphoreBusy:
        out.put(("busy", os.getpid(), None))
    except AlreadyDone:
        out.put(("done", os.getpid(), None))


def count_under_lock(
    endpoint: str,
    table_name: str,
    resource: str,
    counter: str,
    rounds: int,
    barrier: Any,
    out: Any,
) -> None:
    """Increment a number in a shared file while holding the lock; report hold intervals."""
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    intervals = []
    fences = []
    barrier.wait()
    for _ in range(rounds):
        with semaphore(resource, wait=120) as held:
            start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on a host
            with open(counter, "r+") as f:
                value = int(f.read() or 0)
                f.seek(0)
                f.write(str(value + 1))
                f.truncate()
            fences.append(held.fence)
            intervals.append((start, time.monotonic()))
    out.put((os.getpid(), intervals, fences))


def hold_with_limit(
    endpoint: str,
    table_name: str,
    resource: str,
    limit: int,
    rounds: int,
    hold: float,
    barrier: Any,
    out: Any,
) -> None:
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    intervals = []
    barrier.wait()
    for _ in range(rounds):
        with semaphore(resource, limit=limit, wait=120):
            start = time.monotonic()
            time.sleep(hold)
            intervals.append((start, time.monotonic()))
    out.put((os.getpid(), intervals))
