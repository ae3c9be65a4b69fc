"""Review of the storage layer (review-1): DynamoDB's limits, retries and lost answers."""

from __future__ import annotations

import pytest

from dynasem import SemaphoreUnavailable, semaphore
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb
from tests.support.faults import Faults


@pytest.fixture
def faults(lock_table):
    with Faults(dynamodb.get_client()) as f:
        yield f


def test_an_applied_take_hidden_behind_unconnected_retries_is_not_left_in_the_row(faults):
    """The first send of the take is applied and its answer lost (a 500, or a dropped
    connection); botocore sends it again and every later attempt fails to connect
    (EndpointConnectionError: an endpoint that refuses connections for a moment). botocore
    raises the last attempt's error only, a "never sent" one, so the failure reads as not
    ambiguous and the applied take is never withdrawn: the lock is held by nobody for its
    whole lease while this process lives on."""
    faults.lose_response("UpdateItem", 1)
    unconnected = faults.connection_error("UpdateItem", 3, after=1)
    try:
        held = semaphore("job:unconnected", wait=0, lease=60).acquire()
    except SemaphoreUnavailable:
        held = None
    faults.rules.clear()
    assert unconnected.fired == 3
    if held is not None:
        held.release()
    assert holds_on("job:unconnected") == []
