"""Unique Celery tasks (dynasem.celery.UniqueTask) on a real broker: Redis and two workers
of two prefork children each (the fixtures of tests/background/test_celery_broker.py).

60 enqueues of one unique task over 3 keys, 0.1 s apart, each task taking 0.3-0.6 s: an
enqueue while a task of its key is queued or running enqueues nothing and returns that
task's result handle. From the enqueues and the workers' own log: never two tasks of one key
queued or running at once, every enqueued task ran exactly once, and no key is held once
they are done. A worker process SIGKILLed mid-task frees its key within the run lease (2 s)
and CLOCK_SKEW (0.5 s)."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.background.test_celery_broker import broker, workers  # noqa: F401 - a fixture
from tests.support.events import read_events, wait_events

celery = pytest.importorskip("celery", reason="celery is in the test dependency group")

ENQUEUES, KEYS = 60, 3
RUN_LEASE, SKEW = 2.0, 0.5


def producer(broker_url: str, name: str = "unique_work") -> Any:
    """The enqueueing side: the same task, by name, on a client app of the test's own."""
    from dynasem.celery import UniqueTask

    app = celery.Celery("dynasem-unique-producer", broker=broker_url)
    app.conf.update(task_ignore_result=True)

    @app.task(
        bind=True,
        base=UniqueTask,
        name=f"tests.support.celery_app.{name}",
        unique_key="unique:{key}",
        queue_lease=60,
        run_lease=RUN_LEASE,
    )
    def unique_work(self: Any, key: str, *args: Any) -> int:
        raise AssertionError("runs in the workers only")

    return unique_work


def live(resource: str) -> list[Any]:
    from dynasem._operators.locks import holds_on

    return [h for h in holds_on(resource) if h.expires_ms > time.time() * 1000]


def test_sixty_enqueues_over_three_keys_never_two_of_a_key_at_once(
    lock_table: str,
    broker: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    events_file = tmp_path / "events.jsonl"
    task = producer(broker)
    rng = random.Random(25)
    enqueued: dict[str, tuple[str, float]] = {}  # task id -> (key, when enqueued)
    refused = 0
    with workers(broker, events_file, tmp_path) as (_client, tails):
        for n in range(ENQUEUES):
            key = f"k{n % KEYS}"
            result = task.apply_async((key, n, rng.uniform(0.3, 0.6)))
            queued = time.time()  # queued by then at the latest (claimed during the call)
            if not result.enqueued:
                refused += 1  # the handle of the task that holds the key
                assert enqueued[result.id][0] == key
            else:
                assert result.id not in enqueued
                enqueued[result.id] = (key, queued)
            time.sleep(0.1)
        wait_events(events_file, "unique-run", len(enqueued), timeout=60, tails=tails)
    runs = [e for e in read_events(events_file) if e["event"] == "unique-run"]
    print(f"\n{len(enqueued)} enqueued, {refused} refused, {len(runs)} ran")
    assert sorted(e["task_id"] for e in runs) == sorted(enqueued), tails()  # each once
    assert refused > 0 and len(enqueued) + refused == ENQUEUES
    for key in {f"k{i}" for i in range(KEYS)}:
        # From the enqueue's return (queued by then at the latest) to the end of its run (the
        # key is given back after it), and each run from its start to its end.
        spans = sorted((enqueued[e["task_id"]][1], e["end"]) for e in runs if e["key"] == key)
        ran = sorted((e["start"], e["end"]) for e in runs if e["key"] == key)
        for before, after in [
            *zip(spans, spans[1:], strict=False),
            *zip(ran, ran[1:], strict=False),
        ]:
            assert after[0] >= before[1], (
                f"{key}: two tasks queued or running at once: {before} {after}"
            )
        assert live(f"unique:{key}") == []


def test_a_worker_killed_mid_task_frees_its_key_within_the_run_lease(
    lock_table: str,
    broker: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    events_file = tmp_path / "events.jsonl"
    task = producer(broker)
    with workers(broker, events_file, tmp_path) as (_client, tails):
        first = task.apply_async(("kill", 0, 30.0))
        (start,) = wait_events(events_file, "unique-start", tails=tails)
        assert task.apply_async(("kill", 1, 0.1)).id == first.id  # held: not enqueued
        os.kill(start["pid"], signal.SIGKILL)  # the prefork child running it
        killed = time.time()
        # An enqueue refused was sent while the key was held, or before: none sent past
        # lease + skew may be refused.
        refused_at = killed
        while True:
            asked = time.time()
            again = task.apply_async(("kill", 2, 0.1))
            if again.id != first.id:
                break
            refused_at = asked
            assert asked - killed < RUN_LEASE + SKEW, "still held past lease + skew"
            time.sleep(0.05)
        freed_after = time.time() - killed
        print(
            f"\nthe killed task's key: last seen held {refused_at - killed:.2f} s after the kill, "
            f"taken again after {freed_after:.2f} s (bound {RUN_LEASE + SKEW} s)"
        )
        assert freed_after < RUN_LEASE + SKEW + 1  # the enqueues' own round trips and naps
        wait_events(events_file, "unique-run", tails=tails)
    assert live("unique:kill") == []


def test_a_retry_keeps_the_key_and_a_revoked_task_gives_it_back(
    lock_table: str,
    broker: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    events_file = tmp_path / "events.jsonl"
    retried, task = producer(broker, "unique_retried"), producer(broker)
    with workers(broker, events_file, tmp_path) as (client, tails):
        first = retried.apply_async(("retry",))
        assert first.enqueued is True
        deadline = time.monotonic() + 30
        wait_events(events_file, "unique-try", tails=tails)
        # Between the first try and its retry (1 s later) the key is the retry's: the run's
        # hold becomes the retry's claim, for the queue lease, when the first try ends.
        again = retried.apply_async(("retry",))
        assert (again.enqueued, again.id) == (False, first.id)
        while not [h for h in live("unique:retry") if h.expires_ms > time.time() * 1000 + 30_000]:
            assert time.monotonic() < deadline, tails()
            time.sleep(0.02)
        assert retried.apply_async(("retry",)).id == first.id
        wait_events(events_file, "unique-try", 2, tails=tails)
        tries = [e for e in read_events(events_file) if e["event"] == "unique-try"]
        assert [(e["task_id"], e["retries"]) for e in tries] == [(first.id, 0), (first.id, 1)]
        while live("unique:retry"):  # given back at the retry's end
            assert time.monotonic() < deadline, tails()
            time.sleep(0.05)

        # A task revoked while it waits for its countdown never runs; the worker that
        # discards it gives its key back, long before its queue lease (60 s) would.
        later = task.apply_async(("revoke", 0, 0.1), countdown=2)
        assert live("unique:revoke")
        client.control.revoke(later.id)
        deadline = time.monotonic() + 15
        while live("unique:revoke"):
            assert time.monotonic() < deadline, f"the revoked task kept its key\n{tails()}"
            time.sleep(0.05)
        freed = task.apply_async(("revoke", 1, 0.1))
        assert freed.enqueued is True and freed.id != later.id
        wait_events(events_file, "unique-run", tails=tails)
    runs = [e for e in read_events(events_file) if e["event"] == "unique-run"]
    assert [e["task_id"] for e in runs] == [freed.id]  # the revoked one never ran
