"""The seventh review, the storage layer on an engine as unkind as AWS: each test failed
before its mend."""

from __future__ import annotations

import pytest

from dynasem._background.unique import adopt, claim, task_of
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb
from tests.support.faults import Faults

pytestmark = pytest.mark.reentry

# Every attempt botocore makes of one request (legacy mode: the first and three retries).
ONE_REQUEST = 4


def test_an_adoption_throttled_through_the_retries_is_sent_again(lock_table: str) -> None:
    """The worker's adoption of a claim is throttled still after botocore's retries (a hot
    partition, for a second): nothing was written. It was not sent again: the task failed
    (SemaphoreUnavailable) and never ran, and its claim stayed in the row, held for nobody
    for the whole queue lease, every enqueue of the key refused as taken by a task that
    will never run. It is sent again now, as every give-back is while it is throttled."""
    taken = claim("reindex:review37-throttled", "task-1", queue_lease=30)
    with Faults(dynamodb.get_client()) as faults:
        throttled = faults.throttle("UpdateItem", ONE_REQUEST)
        held = adopt(taken, lease=5)
    assert throttled.fired == ONE_REQUEST
    (hold,) = holds_on("reindex:review37-throttled")
    assert hold.token == held.token and task_of(hold.user_id) == "task-1"
    held.release()
    assert holds_on("reindex:review37-throttled") == []
