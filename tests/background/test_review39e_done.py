"""Review 39e: a run_once job's DONE that DynamoDB cannot take for a while.

The body returned, its work is done; DONE is refused by an outage (5xx answers) longer than
a give-back's patience (``resend.RELEASE_PATIENCE``, 5 s). Given up then, the job stayed
RUNNING until its lease ran out, and then ran again. A claim is ours until its trusted end
(a lease less CLOCK_SKEW from its last renewal): DONE is sent again until then.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import SemaphoreUnavailable, run_once
from dynasem._engine import resend
from tests.background.test_run_once_review import ThrottleFinishes, job_row
from tests.support.faults import _error_response


class FinishesDown(ThrottleFinishes):
    """Every DONE/FAILED write answered 500 (never applied) for ``seconds`` from entry."""

    def __init__(self, seconds: float):
        super().__init__(n=10**6, status=500)
        self.until = time.monotonic() + seconds

    def _before_send(self, request: Any, **kwargs: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if self.MARK in body and time.monotonic() < self.until:
            self.fired += 1
            return _error_response(500, "InternalServerError", "injected outage")
        return None


def test_done_is_sent_again_through_an_outage_shorter_than_the_claims_trust(lock_table):
    """An outage of 6.5 s, a claim trusted 7.5 s (lease 8 s): DONE lands when it is over,
    and the block's exit raises nothing."""
    key = "rv39e:done-outage"
    with FinishesDown(resend.RELEASE_PATIENCE + 1.5) as down:
        with run_once(key, lease=8):
            pass
    assert down.fired > 1
    assert job_row(key).get("status") == "DONE"


def test_done_given_up_at_the_claims_trusted_end_says_the_job_will_run_again(lock_table):
    """An outage that outlasts the claim's trust: given up by then (the job may be claimed
    once its lease ends), the block raises ``SemaphoreUnavailable`` saying the work is done
    but not recorded, and the job will run again."""
    key = "rv39e:done-outage-long"
    with FinishesDown(60) as down:
        started = time.monotonic()
        with pytest.raises(SemaphoreUnavailable, match="run again"), run_once(key, lease=8):
            pass
        took = time.monotonic() - started
    assert down.fired > 1
    assert 6.5 < took < 8.5, took
    assert job_row(key).get("status") == "RUNNING"
