"""Review of the storage layer (review-1): DynamoDB's limits, retries and lost answers."""

from __future__ import annotations

import pytest

from dynasem import SemaphoreUnavailable, TableMissing, semaphore
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from tests.support.faults import Faults
from tests.support.helpers import OwnRequests


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


class _User:
    """A Django user as dynasem sees one: authenticated, with a primary key."""

    is_authenticated = True

    def __init__(self, pk: object):
        self.pk = pk


@pytest.mark.parametrize(
    "pk",
    ["ops\x1b[2Kroot", "", "u" * 3000],
    ids=["control-character", "empty", "3000-bytes"],
)
def test_a_django_users_odd_primary_key_is_refused_by_name_before_any_request(lock_table, pk):
    """A user given as a str is refused before any request when it is empty, longer than
    1,024 UTF-8 bytes or holds a control character (it is written as ``userId``, an index
    key, and shown to operators as written). The same text from a Django user's primary key
    was sent: with a control character it is stored and listed (an ESC that rewrites an
    operator's terminal line); empty, DynamoDB refuses an index key of "" and dynasem says the
    table "lacks an index dynasem needs: run dynasem_createtable" (TableMissing); 3,000 bytes,
    "ValidationException: Size limit exceeded", naming nothing."""
    try:
        held = semaphore("odd:user", user=_User(pk), wait=0).acquire()
    except (ValueError, SemaphoreUnavailable) as exc:
        assert isinstance(exc, ValueError) and "user" in str(exc), repr(exc)
    else:
        row = lock_rows.get_item("odd:user")
        held.release()
        pytest.fail(f"taken and written: {row!r}")
    assert lock_rows.get_item("odd:user") is None


def test_a_refused_index_key_value_is_not_read_as_a_missing_index(lock_table):
    """DynamoDB refuses a write that would give an index key a value it cannot take (an empty
    string) with a ValidationException whose message mentions "secondary index key". That is
    a bad value, not a table without dynasem's indexes: TableMissing ("run
    dynasem_createtable, or recreate the table") sends an operator to the wrong place."""
    action = lock_writes.update_action(
        "odd:index", records.LOCK_SK, "SET #uid = :uid", "", {}, {":uid": ""}
    )
    with pytest.raises(SemaphoreUnavailable) as err:
        lock_rows.update(action)
    assert not isinstance(err.value, TableMissing), err.value
    assert lock_rows.get_item("odd:index") is None


def test_a_query_of_an_index_the_table_lacks_is_still_table_missing(lock_table):
    """The other side of the test above: a table without dynasem's index is TableMissing."""
    request = {"IndexName": "no-such-index", "KeyConditionExpression": "#uid = :u"}
    with pytest.raises(TableMissing, match="lacks an index"):
        dynamodb.page("query", None, None, values={":u": "x"}, **request)


def test_holders_of_a_counting_semaphore_renewing_in_turn_move_no_index_key(lock_table):
    """Two holders of a counting semaphore (two processes: two users, as ``host:pid`` is by
    default) renew in turn. Each renewal that raises the row's lease end also names its user
    in ``userId``, the userId index's key: the key moves at *every* renewal, a delete and a
    put in the index, 3 write units where docs/explanation/cost.md counts 1 ("its first
    renewal names its user"). The listings find a counting row's holders through the expires
    shards anyway (``query_expiring(shared_only=True)``), not through ``userId``."""
    client = dynamodb.get_client()
    index_units: list[float] = []
    own = OwnRequests(this_thread=True)  # the renewals below: not a heartbeat's, nor a stray

    def ask(params: dict, **kwargs: object) -> None:
        params["ReturnConsumedCapacity"] = "INDEXES"

    def told(parsed: dict, **kwargs: object) -> None:
        if not own(None):  # after-call is told of no request: this thread's only
            return
        indexes = parsed.get("ConsumedCapacity", {}).get("GlobalSecondaryIndexes", {})
        index_units.append(sum(i.get("CapacityUnits", 0.0) for i in indexes.values()))

    a = semaphore("counted:renewals", limit=3, user="alice").acquire()
    b = semaphore("counted:renewals", limit=3, user="bob").acquire()
    a.renew()
    b.renew()  # each hold's first renewal: done
    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", ask)
    client.meta.events.register("after-call.dynamodb.UpdateItem", told)
    try:
        for held in (a, b, a, b):
            held.renew()
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.UpdateItem", ask)
        client.meta.events.unregister("after-call.dynamodb.UpdateItem", told)
        a.release()
        b.release()
    assert len(index_units) == 4
    assert index_units == [0.0] * 4, f"index write units of each renewal: {index_units}"


def test_a_job_claim_applied_then_hidden_behind_unconnected_retries_is_given_back(faults):
    """As for a take: run_once's claim (a job row's conditional write) is applied, its answer
    lost, and botocore's retries fail to connect. Read as never sent, the claim was not given
    back: the job sat RUNNING under nobody's claim for its whole lease, and the next
    run_once(key) was told it is busy."""
    from dynasem import SemaphoreBusy, run_once

    faults.lose_response("UpdateItem", 1)
    unconnected = faults.connection_error("UpdateItem", 3, after=1)
    with pytest.raises(SemaphoreUnavailable):
        with run_once("job:claim-unconnected", lease=60):
            pytest.fail("the body ran")
    faults.rules.clear()
    assert unconnected.fired == 3
    ran = []
    try:
        with run_once("job:claim-unconnected", lease=60):
            ran.append(True)
    except SemaphoreBusy as busy:
        pytest.fail(f"the lost claim was left RUNNING: {busy}")
    assert ran == [True]
