"""Review of a hold's life (review-3): a unique task's run whose hold becomes its retry's
claim (``Held.become_claim``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem._background import unique
from dynasem._background.unique import adopt, claim, hand_on
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows
from dynasem.exceptions import LimitExceeded

pytestmark = pytest.mark.reentry


def test_a_run_end_throttled_once_still_hands_the_key_to_its_retry(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that enqueued its retry ends: its hold becomes the retry's claim in one write
    (``become_claim``). DynamoDB throttles that write past botocore's retries (a hot
    partition, for a second): nothing was written, and it is not sent again, unlike every
    other give-back (resend.py: a release, run_once's DONE). The hold was ended first (its
    heartbeat stopped), so the run's entry stays in the row unrenewed; the retry, started on
    a worker at once, finds the run still holding and sleeps until the run's lease (and the
    skew) is over, as if the run's process had died: a whole run lease (minutes, for a long
    task) with the key held by nobody, though the worker lives and the throttling passed at
    once."""
    first = claim("reindex:review-3", "task-1", queue_lease=30)
    run = adopt(first, lease=3)
    retry = hand_on(run, first)
    assert retry is not None
    real_update = lock_rows.update
    throttled: list[str] = []

    def update(action: dict[str, Any], **kwargs: Any) -> Any:
        names = action.get("ExpressionAttributeNames", {})
        if names.get("#c") == run.token and names.get("#t") == retry.token and not throttled:
            throttled.append(run.token)
            raise LimitExceeded("throttled still after the retries", "throughput", transient=True)
        return real_update(action, **kwargs)

    monkeypatch.setattr(lock_rows, "update", update)
    unique.finish_run("reindex", first, run, queue_lease=30)  # logs a failure, if any
    assert throttled
    started = time.monotonic()
    held = adopt(retry, lease=5)
    waited = time.monotonic() - started
    try:
        assert waited < 1.0, f"the retry waited {waited:.1f} s for a run that had ended"
    finally:
        held.release()
    assert holds_on("reindex:review-3") == []
