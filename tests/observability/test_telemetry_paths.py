"""Telemetry off the plain exclusive path: permit items (limit > 8), async cancellation, a
busy take of several counting resources, and requests sent for a lock from another thread
than its acquire's (heartbeats, a stray hand-over given back, a coalesced run's
registration). The SDK's in-memory reader and exporter, on DynamoDB Local."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

from dynasem import SemaphoreBusy, queue_depth, semaphore
from dynasem._engine import late_handover as strays
from dynasem._observability.metrics import MODE, NAME, OPERATION, OUTCOME, QUEUED
from dynasem._operators import locks as operations
from dynasem._storage import lock_rows
from dynasem.testing import abandon
from tests.observability.test_telemetry import _providers as sdk
from tests.observability.test_telemetry import (
    histogram,
    named,
    otel,  # noqa: F401 - the fixture, for every test here
    points,
    spans,
    total,
)

ACQUIRE, AHEAD = "dynasem.lock.acquire.duration", "dynasem.lock.queue.ahead"
REQUESTS = "dynasem.dynamodb.requests"

pytestmark = pytest.mark.usefixtures("otel")


def resource() -> str:
    return f"telp:{uuid.uuid4().hex}"


def outcomes(reader: Any, name: str) -> list[tuple[str, str, bool]]:
    return sorted(
        (
            p.attributes[MODE],
            p.attributes[OUTCOME],
            p.attributes[QUEUED],
        )
        for p in histogram(reader, ACQUIRE, **{NAME: name})
        for _ in range(p.count)
    )


def unnamed_requests(reader: Any) -> float:
    return sum(p.value for p in points(reader, REQUESTS) if NAME not in p.attributes)


def wait_for_depth(res: str, depth: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while queue_depth(res) < depth:
        assert time.monotonic() < deadline, f"{depth} waiter(s) never queued on {res}"
        time.sleep(0.05)


def in_thread(take: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["held"] = take()
        except BaseException as exc:  # the test reads it
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_queued_waiters_for_permits_record_the_waiters_ahead(holds: list[Any]) -> None:
    name, res, reader = named(), resource(), sdk["reader"]
    full = [semaphore(res, limit=20).acquire() for _ in range(20)]
    holds.extend(full)
    waiters = []
    for i in range(2):
        waiters.append(
            in_thread(
                lambda i=i: semaphore(res, limit=20, wait=10, metrics_name=f"{name}-{i}").acquire()
            )
        )
        wait_for_depth(res, i + 1)  # queued one after the other, whatever the load
    full[0].release()
    full[1].release()
    for thread, out in waiters:
        thread.join(15)
        assert "held" in out, out
        holds.append(out["held"])
    for i in range(2):
        assert outcomes(reader, f"{name}-{i}") == [("counting", "acquired", True)]
        (ahead,) = histogram(reader, AHEAD, **{NAME: f"{name}-{i}"})
        assert (ahead.count, ahead.sum) == (1, i)


@pytest.mark.parametrize("limit", [1, 9], ids=["exclusive", "permits"])
def test_a_cancelled_async_acquire_records_outcome_cancelled(holds: list[Any], limit: int) -> None:
    name, res = named(), resource()
    holds.extend(semaphore(res, limit=limit).acquire() for _ in range(limit))

    async def scenario() -> None:
        task = asyncio.ensure_future(
            semaphore(res, limit=limit, wait=10, fair=True, metrics_name=name).aacquire()
        )
        # Cancelled once it queued (its queue's length recorded), not after a fixed sleep:
        # under load 0.6 s was once too short (CI, ci65: recorded as not queued).
        deadline = time.monotonic() + 8
        while not histogram(sdk["reader"], AHEAD, **{NAME: name}):
            assert time.monotonic() < deadline, f"the acquire never queued on {res}"
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    mode = "exclusive" if limit == 1 else "counting"
    assert outcomes(sdk["reader"], name) == [(mode, "cancelled", True)]


def test_a_busy_take_of_several_counting_resources_has_its_wait_event(holds: list[Any]) -> None:
    name, first, second = named(), resource(), resource()
    holds.extend(semaphore(first, limit=9).acquire() for _ in range(9))
    with pytest.raises(SemaphoreBusy):
        semaphore([first, second], limit=9, wait=0.4, metrics_name=name).acquire()
    (span,) = [s for s in spans(sdk, "dynasem.acquire") if s.attributes[NAME] == name]
    assert span.attributes[OUTCOME] == "busy"
    assert [e.name for e in span.events] == ["dynasem.wait"]


def test_heartbeat_renewals_carry_the_locks_name(holds: list[Any]) -> None:
    """Renewals run on the heartbeat thread: a permit's, reader items', an exclusive hold's."""
    name, shared, reader = named(), resource(), sdk["reader"]
    got = [semaphore(resource(), limit=20, lease=1.0, metrics_name=name).acquire()]
    got += [semaphore(resource(), lease=1.0, metrics_name=name).acquire()]
    got += [
        semaphore(shared, shared=True, lease=1.0, metrics_name=name).acquire() for _ in range(3)
    ]
    holds.extend(got)
    before = unnamed_requests(reader)
    time.sleep(1.3)  # a renewal every (lease - skew) / 3
    renewed = total(reader, "dynasem.lock.renewals", **{NAME: name})
    unnamed = unnamed_requests(reader) - before
    assert renewed >= len(got)
    assert unnamed == 0


def test_a_stray_hand_over_given_back_sends_for_its_lock() -> None:
    """A hand-over that reached a waiter who had left is given back on a thread of its own
    (strays.give_back_stray): its requests carry the lock's name."""
    name, res, reader = named(), resource(), sdk["reader"]
    sem = semaphore(res, metrics_name=name)
    held = sem.acquire()
    abandon(held)
    item = lock_rows.get(res)
    before = unnamed_requests(reader), total(reader, REQUESTS, **{NAME: name})
    thread = threading.Thread(
        target=strays.give_back_stray,
        args=(sem, held.token, item),
        kwargs={"lease": 10, "skew": 0.5},
        name="dynasem-stray",
    )
    thread.start()
    thread.join(10)
    held._released = True  # given back by the stray's own Held
    assert unnamed_requests(reader) - before[0] == 0
    assert total(reader, REQUESTS, **{NAME: name}) > before[1]
    assert operations.holds_on(res) == []  # (a request of the test's own: unnamed)


def test_a_coalesced_runs_registration_sends_for_its_lock(holds: list[Any]) -> None:
    """The next run's registration is renewed by a heartbeat while the lock is busy."""
    name, res, reader = named(), resource(), sdk["reader"]
    first = semaphore(res).acquire()
    holds.append(first)
    before = unnamed_requests(reader)
    thread, out = in_thread(
        lambda: semaphore(res, coalesce=True, wait=10, lease=1.0, metrics_name=name).acquire()
    )
    time.sleep(1.4)  # several renewals of the registration
    unnamed = unnamed_requests(reader) - before
    first.release()
    thread.join(10)
    assert "held" in out, out
    out["held"].release()
    assert unnamed == 0
    assert total(reader, REQUESTS, **{NAME: name, OPERATION: "UpdateItem"}) >= 3
