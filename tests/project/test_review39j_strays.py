"""What a test leaves renewed is not seen by the next test's fault rules and request counts.

The worker's DynamoDB client is shared, and a request names the table DYNASEM names as it is
built: a hold an earlier test never gave back, renewed on, wrote to the next test's table,
where it used up an injected fault or was counted (ci97). ``lock_table`` now stops what its
test left renewed (tests.support.helpers.table_of_a_test)."""

from __future__ import annotations

import time

import pytest

from dynasem import semaphore
from dynasem._storage import dynamodb
from tests.support.faults import Faults
from tests.support.helpers import OwnRequests, RequestCounter, table_of_a_test


def test_a_hold_an_earlier_test_left_renewed_is_unseen_by_the_next(dynamodb_local: str) -> None:
    # The earlier test: a hold renewed every third of (1.5 s - 0.5 s skew), never given back.
    with pytest.warns(UserWarning, match=r"still renewed.*'left-renewed'"):
        with table_of_a_test(dynamodb_local, LEASE=1.5):
            semaphore("left-renewed").acquire()
    # The next test, on a table of its own, counts and fails every request naming it.
    with table_of_a_test(dynamodb_local):
        client = dynamodb.get_client()
        counter = RequestCounter(OwnRequests())
        client.meta.events.register("before-call.dynamodb", counter)
        try:
            with Faults(client) as faults:
                faults.server_error("*", 1000)
                time.sleep(1.2)  # several renewals of the hold left (every 0.33 s)
        finally:
            client.meta.events.unregister("before-call.dynamodb", counter)
        assert (counter.calls, faults.fired) == ({}, 0)


def test_own_requests_are_told_by_table_and_thread(lock_table: str) -> None:
    import threading

    own, here = OwnRequests(), OwnRequests(this_thread=True)
    body = f'{{"TableName": "{lock_table}", "Key": {{}}}}'.encode()
    other = b'{"TableName": "t-another", "Key": {}}'
    assert own(body) and own({"body": body}) and own({"TableName": lock_table})
    assert not own(other) and not own({"body": other}) and not own({"TableName": "t-another"})
    assert own(b"{}")  # ListTables names no table
    told: list[bool] = []
    elsewhere = threading.Thread(target=lambda: told.append(here(body)))
    elsewhere.start()
    elsewhere.join()
    assert here(body) and told == [False]
