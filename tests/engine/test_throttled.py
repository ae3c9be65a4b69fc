"""A hot lock under throttling (issue 40, point 4): a request DynamoDB throttles still after
botocore's retries neither leaves a released lock held for the rest of its lease nor fails a
caller who asked to wait (tests/support/faults.py's ``throttle``, on DynamoDB Local)."""

from __future__ import annotations

import threading
import time
from typing import Any

from dynasem import semaphore
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb
from tests.support.faults import Faults

# Every attempt botocore makes of one request (legacy mode: the first and three retries).
ONE_REQUEST = 4


def test_a_release_throttled_past_botocores_retries_is_sent_again(lock_table: str) -> None:
    held = semaphore("thr:release", lease=30, wait=0).acquire()
    with Faults(dynamodb.get_client()) as faults:
        rule = faults.throttle("UpdateItem", ONE_REQUEST)
        held.release()
    assert rule.fired == ONE_REQUEST
    # Released now, not when its lease runs out in 30 s: every waiter would sit idle till then.
    assert holds_on("thr:release") == []
    semaphore("thr:release", wait=0).acquire().release()


def test_a_queued_waiters_throttled_look_keeps_it_waiting(lock_table: str) -> None:
    resource = "thr:look"
    held = semaphore(resource, wait=0).acquire()
    got: dict[str, Any] = {}

    def wait() -> None:
        try:
            got["held"] = semaphore(resource, wait=20, fair=True).acquire()
        except Exception as exc:  # the failure under test: handed to the assertion
            got["error"] = exc

    with Faults(dynamodb.get_client()) as faults:
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # queued, looking at the row now and then
        rule = faults.throttle("GetItem", ONE_REQUEST)
        deadline = time.monotonic() + 10
        while rule.fired < ONE_REQUEST and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rule.fired == ONE_REQUEST  # one look throttled through botocore's retries
        time.sleep(0.2)
        held.release()
        waiter.join(20)
    assert "error" not in got, got
    got["held"].release()


def test_a_hand_over_whose_read_of_the_queue_is_throttled_still_releases(
    lock_table: str, waiters_elsewhere: None
) -> None:
    resource = "thr:heirs"
    held = semaphore(resource, wait=0, lease=30).acquire()
    got: dict[str, Any] = {}

    def wait() -> None:
        try:
            got["held"] = semaphore(resource, wait=20, fair=True).acquire()
        except Exception as exc:  # handed to the assertion
            got["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)  # queued
    with Faults(dynamodb.get_client()) as faults:
        rule = faults.throttle("Query", ONE_REQUEST)
        held.release()  # reads the queue to hand the lock over: throttled through the retries
    assert rule.fired == ONE_REQUEST
    waiter.join(20)
    assert "error" not in got, got
    got["held"].release()
