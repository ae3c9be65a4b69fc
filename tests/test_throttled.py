"""A hot lock under throttling (issue 40, point 4): a request DynamoDB throttles still after
botocore's retries neither leaves a released lock held for the rest of its lease nor fails a
caller who asked to wait (tests/faults.py's ``throttle``, on DynamoDB Local)."""

from __future__ import annotations

from dynasem import semaphore, table
from dynasem.operations import holds_on
from tests.faults import Faults

# Every attempt botocore makes of one request (legacy mode: the first and three retries).
ONE_REQUEST = 4


def test_a_release_throttled_past_botocores_retries_is_sent_again(lock_table: str) -> None:
    held = semaphore("thr:release", lease=30, wait=0).acquire()
    with Faults(table.get_client()) as faults:
        rule = faults.throttle("UpdateItem", ONE_REQUEST)
        held.release()
    assert rule.fired == ONE_REQUEST
    # Released now, not when its lease runs out in 30 s: every waiter would sit idle till then.
    assert holds_on("thr:release") == []
    semaphore("thr:release", wait=0).acquire().release()
