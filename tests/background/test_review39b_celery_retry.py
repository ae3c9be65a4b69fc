"""Review (thirty-ninth session, b): a Celery task's retry, sent from inside its run's
``@semaphore`` block, waits out that run's hold, however long it goes on (on a real broker:
the fixtures of tests/background/test_celery_broker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.background.test_celery_broker import broker  # noqa: F401 - a fixture
from tests.background.test_review37e_celery_retry import retried_runs

celery = pytest.importorskip("celery", reason="celery is in the test dependency group")

LEASE, SKEW = 3.0, 0.5  # the workers' (tests/support/celery_settings.py)


def test_a_retry_waits_for_a_run_that_holds_on_past_its_lease_never_beside_it(
    lock_table: str,
    broker: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """The run holds on (renewed) for twice its lease and CLOCK_SKEW after sending its
    retry: the retry, on another worker at once, waits the whole time (not only till a
    lease it would have taken over from a dead run), runs after the run gave the lock back,
    under a larger fence."""
    runs, failed, logs = retried_runs(broker, tmp_path, 2 * (LEASE + SKEW))
    assert not failed, f"the retry failed: {failed}\n{logs}"
    assert [e["retries"] for e in runs] == [0, 1], logs
    assert runs[1]["start"] >= runs[0]["end"], "two runs held the lock at once"
    assert runs[1]["fence"] > runs[0]["fence"]
