"""Review 35 (time and trust): where a deadline or a lease is computed, trusted, extended or
compared. Each test fails on the code it was written against."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from dynasem import run_once
from dynasem._engine.core import CONFIRM_SHARE
from dynasem._storage import dynamodb

pytestmark = pytest.mark.django_db(transaction=False)

LEASE = 2.0
SKEW = 0.5  # tests/conftest.py's CLOCK_SKEW
MARGIN = (LEASE - SKEW) * CONFIRM_SHARE
# Late by less than the trusted window but by more than its last third.
NEARLY = (LEASE - SKEW) * (1 - CONFIRM_SHARE) + 0.2


class LateJobAnswers:
    """The answer of the first ``times`` successful run_once writes that ``match`` (their
    JSON body) comes back ``delay`` seconds after DynamoDB applied them: a host cut off
    between its write and the answer (botocore's ``needs-retry`` event follows each answer)."""

    def __init__(self, match: Any, delay: float, times: int = 1) -> None:
        self.match, self.delay, self.remaining, self.fired = match, delay, times, 0
        self._lock = threading.Lock()
        self.client = dynamodb.get_client()

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        if response is None or response[0].status_code != 200:
            return
        body = json.loads(request_dict["body"] or b"{}")
        with self._lock:
            if self.remaining <= 0 or not self.match(body):
                return
            self.remaining -= 1
            self.fired += 1
        time.sleep(self.delay)

    def __enter__(self) -> LateJobAnswers:
        self.client.meta.events.register("needs-retry.dynamodb.UpdateItem", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("needs-retry.dynamodb.UpdateItem", self._hook)


def job_claim(body: dict[str, Any]) -> bool:
    return "#attempt" in body.get("UpdateExpression", "")


def job_renewal(body: dict[str, Any]) -> bool:
    return body.get("UpdateExpression") == "SET #expMs = :e"


# -- run_once: a claim answered late begins its body with almost no trust -----------------------


def test_a_run_once_claim_answered_late_is_confirmed_before_its_body(lock_table: str) -> None:
    """The claim was applied, its answer came NEARLY a whole trusted window later (a host cut
    off from DynamoDB between its write and the answer). An acquire (core.CONFIRM_SHARE) and a
    unique task's adoption (unique._renewed) confirm such a hold with a renewal of their own
    when less than a third of ``lease - CLOCK_SKEW`` is left; ``run_once`` confirmed it only
    once nothing was left (``job.seconds_left() > 0``), so the body began with 0.3 s of trust:
    the heartbeat's first renewal, answered a little late too (the same network), came after
    that, the job was lost under its running body, and another process may claim it and run
    the body beside it once the stored lease runs out, though every write was applied."""
    with LateJobAnswers(job_claim, NEARLY) as late_claim, LateJobAnswers(job_renewal, 0.4):
        with run_once("file:late.txt", lease=LEASE) as job:
            left = job.seconds_left()
            time.sleep(0.8)  # the body works; the heartbeat renews meanwhile
            lost_in_body = job.seconds_left() == 0
    assert late_claim.fired == 1, "the claim's late answer never came: the test missed it"
    assert left >= MARGIN, f"the body began with {left:.3f}s of trust, less than {MARGIN:.3f}s"
    assert not lost_in_body, "the claim was lost under its running body, nothing refused"
