"""Review (thirty-seventh session, e): a dynasem-locked Celery task that retries itself at
once, on a real broker (the fixtures of tests/background/test_celery_broker.py). Mended in
the thirty-ninth session (b): the retry waits out its run's hold (dynasem.celery)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.background.test_celery_broker import broker, workers  # noqa: F401 - a fixture
from tests.support.events import read_events

celery = pytest.importorskip("celery", reason="celery is in the test dependency group")


def retried_runs(url: str, tmp_path: Path, seconds: float) -> tuple[list[Any], list[Any], str]:
    """Send ``retried_at_once``, whose run holds on ``seconds`` after sending its retry: its
    runs (by start), the task's failures, and the workers' logs."""
    events_file = tmp_path / "events.jsonl"
    with workers(url, events_file, tmp_path) as (client, tails):
        client.send_task("tests.support.celery_app.retried_at_once", args=("k", 7, seconds))
        deadline = time.monotonic() + 30 + seconds
        while time.monotonic() < deadline:
            events = read_events(events_file)
            if any(e["event"] == "failed" for e in events):
                break
            if any(e["event"] == "retry-run" and e["retries"] == 1 for e in events):
                break
            time.sleep(0.2)
        time.sleep(1.5)  # a second run of the retry, or a failure, would show by now
        events = read_events(events_file)
        logs = tails()
    failed = [e for e in events if e["event"] == "failed"]
    runs = sorted((e for e in events if e["event"] == "retry-run"), key=lambda e: e["start"])
    return runs, failed, logs


def test_a_task_that_retries_itself_at_once_runs_its_retry_after_the_lock_is_given_back(
    lock_table: str,
    broker: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """``raise self.retry(countdown=0)`` inside ``@semaphore(...)``: Celery enqueues the
    retry before the block's exit gives the lock back (here a ``finally`` goes on for a
    second, still under the lock); another worker's child starts it at once, finds the lock
    held by the very run that retried, and the retry was refused (``SemaphoreBusy``: the
    task failed). A Django user expects the retry to run, after the run's hold ends."""
    runs, failed, logs = retried_runs(broker, tmp_path, 1.0)
    assert not failed, f"the retry failed: {failed}\n{logs}"
    assert [e["retries"] for e in runs] == [0, 1], logs
    assert runs[1]["start"] >= runs[0]["end"], "two runs held the lock at once"
