"""The simulated DynamoDB answers dynasem's requests as DynamoDB Local does.

Each test runs real dynasem operations against DynamoDB Local, recording every low-level
request and its answer (tests/simulation/conftest.py), then replays the same requests in the
same order on a fresh simulated DynamoDB (its kind profile) and compares each answer: the same
error (code, message, the item of a refusal, a transaction's cancellation reasons), the same
response (items in DynamoDB's order, returned attributes, capacity units), and at the end the
same tables. Timestamps differ between runs, but the requests replayed are the recorded ones.

Two differences of DynamoDB Local's are allowed for, each where it shows: a transaction's
capacity (DynamoDB Local merges the equal capacities of its actions, in a set: it reports
less than AWS bills, and the simulator bills as AWS); BatchGetItem's order (undefined).
"""

from __future__ import annotations

import collections
import io
import json
import random
import threading
import time
import uuid
from typing import Any, cast

import pytest
from django.core.management import call_command
from django.test import override_settings

from dynasem import LimitExceeded, SemaphoreBusy, run_once, semaphore
from dynasem import _clock as clock
from dynasem._background import unique
from dynasem._operators.locks import break_hold, holds_on
from dynasem._storage import dynamodb, lock_writes, reader_items, records
from dynasem.testing import abandon
from tests.simulation.conftest import Call, Recording
from tests.support.helpers import dynasem_settings
from tests.support.sim.dynamodb import Profile, SimDynamoDB, item_key

pytestmark = [
    pytest.mark.dynamodb_local_only("compares the simulator with DynamoDB Local"),
    pytest.mark.kind_engine_only("replays DynamoDB Local's own answers, not the unkind proxy's"),
]

# -- replaying -------------------------------------------------------------------------------------

VOLATILE = {"CreationDateTime", "TableSizeBytes", "ItemCount", "IndexSizeBytes"}


def replay(calls: list[Call], table: str) -> SimDynamoDB:
    """Replay ``calls`` on a fresh simulated DynamoDB holding ``table`` as dynasem makes it;
    assert each answer is the one recorded."""
    ticks = [1_700_000_000.0]

    def now() -> float:
        return ticks[0]

    sim = SimDynamoDB(random.Random(42), now, Profile.kind())
    if not any(c.operation == "CreateTable" and c.params["TableName"] == table for c in calls):
        # The table as the lock_table fixture made it (dynasem_createtable, before recording).
        sim.apply("CreateTable", records.table_definition(table))
        sim.apply("PutItem", {"TableName": table, "Item": records.format_item()})
    mismatches = []
    for n, call in enumerate(calls):
        ticks[0] += 0.001
        got_response, got_error = None, None
        try:
            got_response = sim.apply(call.operation, call.params)
        except Exception as exc:  # noqa: BLE001 - ClientError, or the simulator's own fault
            got_error = getattr(exc, "response", {"Error": {"Code": repr(exc)}})
        problem = difference(call, got_response, got_error)
        if problem:
            mismatches.append(f"#{n} {call.operation} {_short(call.params)}: {problem}")
    assert not mismatches, "\n".join(mismatches[:20])
    return sim


def _short(params: dict[str, Any]) -> str:
    text = json.dumps(params, default=str)
    return text if len(text) < 400 else text[:400] + "..."


def difference(call: Call, response: dict[str, Any] | None, error: dict[str, Any] | None) -> str:
    """What differs between the recorded answer and the simulator's ("" if nothing)."""
    if call.error is not None or error is not None:
        want = _error(call.error) if call.error is not None else call.response
        got = _error(error) if error is not None else response
        return "" if want == got else f"\n  local: {want}\n  sim:   {got}"
    assert call.response is not None and response is not None
    want, got = _normal(call.operation, call.response), _normal(call.operation, response)
    if call.operation == "TransactWriteItems":
        problem = _transaction_capacity(
            call, want.pop("ConsumedCapacity", None), got.pop("ConsumedCapacity", None)
        )
        if problem:
            return problem
    return "" if want == got else f"\n  local: {want}\n  sim:   {got}"


def _error(response: dict[str, Any] | None) -> dict[str, Any]:
    found = {k: v for k, v in (response or {}).items() if k != "ResponseMetadata"}
    return found


def _normal(operation: str, response: dict[str, Any]) -> dict[str, Any]:
    found = {k: v for k, v in response.items() if k != "ResponseMetadata"}
    for key in ("Table", "TableDescription"):
        if key in found:
            found[key] = _table(found[key])
    if operation == "BatchGetItem":
        found["Responses"] = {
            t: sorted(items, key=lambda i: json.dumps(i, sort_keys=True, default=str))
            for t, items in found.get("Responses", {}).items()
        }
    return found


def _table(description: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in description.items() if k not in VOLATILE}
    kept.pop("ProvisionedThroughput", None)
    kept["BillingModeSummary"] = {
        "BillingMode": kept.get("BillingModeSummary", {}).get("BillingMode")
    }
    kept["GlobalSecondaryIndexes"] = [
        {k: v for k, v in index.items() if k not in VOLATILE}
        for index in kept.get("GlobalSecondaryIndexes", [])
    ]
    return kept


def _transaction_capacity(call: Call, want: Any, got: Any) -> str:
    """DynamoDB Local reports each distinct capacity of a transaction's actions once: one
    action's must be equal; several actions' at least what DynamoDB Local says."""
    if want is None or got is None:
        return "" if want == got else f"capacity local {want} sim {got}"
    if len(call.params["TransactItems"]) == 1:
        return "" if want == got else f"capacity local {want} sim {got}"
    (w,), (g,) = want, got
    if w["TableName"] != g["TableName"] or w["CapacityUnits"] > g["CapacityUnits"]:
        return f"capacity local {want} sim {got}"
    return ""


def local_items(table: str) -> dict[str, dict[str, Any]]:
    """The table's items in DynamoDB Local now (a consistent Scan, not recorded)."""
    client = dynamodb.get_client()
    found: dict[str, dict[str, Any]] = {}
    request: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = client.scan(**request)
        for item in page["Items"]:
            found[json.dumps([item["pk"]["S"], item["sk"]["S"]])] = item
        if "LastEvaluatedKey" not in page:
            return found
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def check(recording: Recording, table: str, *operations: str) -> SimDynamoDB:
    """Replay what was recorded and compare; also the final table, and that the scenario sent
    every operation named."""
    recording.on = False
    sent = {c.operation for c in recording.calls}
    assert set(operations) <= sent, f"not sent: {set(operations) - sent}"
    sim = replay(recording.calls, table)
    kinds = collections.Counter(
        c.operation + ("!" + str(c.error["Error"]["Code"]) if c.error else "")
        for c in recording.calls
    )
    print(f"\nreplayed {len(recording.calls)} requests: {dict(sorted(kinds.items()))}")
    simulated = sim.snapshot().get(table, {})
    local = local_items(table)
    assert simulated.keys() == local.keys()
    for key, item in local.items():
        assert simulated[key] == item, key
    return sim


# -- the scenarios ---------------------------------------------------------------------------------


def test_exclusive_waiter_hand_over_renewal_and_a_busy_refusal(
    lock_table: str, recording: Recording, waiters_elsewhere: None
) -> None:
    # The waiter stands for another process's: the release reads the line (the Query).
    first = semaphore("x:1", lease=10).acquire()
    with pytest.raises(SemaphoreBusy):
        semaphore("x:1", wait=0).acquire()
    first.renew()

    def release_later() -> None:
        time.sleep(0.3)
        first.release()

    releaser = threading.Thread(target=release_later)
    releaser.start()
    second = semaphore("x:1", wait=10, lease=10).acquire()  # queued, then handed the lock
    releaser.join()
    assert second.fence > first.fence
    second.renew()
    second.release()
    check(recording, lock_table, "UpdateItem", "PutItem", "Query", "GetItem")


def test_counting_semaphore_of_three(lock_table: str, recording: Recording) -> None:
    held = [semaphore("n:3", limit=3, lease=10).acquire() for _ in range(3)]
    with pytest.raises(SemaphoreBusy):
        semaphore("n:3", limit=3, wait=0).acquire()
    held[1].renew()
    held.pop(0).release()
    held.append(semaphore("n:3", limit=3).acquire())
    for hold in held:
        hold.release()
    check(recording, lock_table, "UpdateItem")


def test_counting_semaphore_with_permit_items(lock_table: str, recording: Recording) -> None:
    held = [semaphore("n:12", limit=12, lease=10).acquire() for _ in range(5)]
    held[2].renew()
    assert len(holds_on("n:12")) == 5
    held.pop(0).release()
    held.append(semaphore("n:12", limit=12).acquire())
    for hold in held:
        hold.release()
    check(recording, lock_table, "UpdateItem", "Query")


def test_shared_readers_beyond_the_row_in_reader_items(
    lock_table: str, recording: Recording
) -> None:
    readers = [semaphore("s:1", shared=True, lease=10).acquire() for _ in range(5)]
    with pytest.raises(SemaphoreBusy):
        semaphore("s:1", wait=0).acquire()  # a writer
    readers[3].renew()
    assert len(holds_on("s:1")) == 5
    for reader in readers:
        reader.release()
    with semaphore("s:1", wait=0):
        pass
    check(recording, lock_table, "UpdateItem", "DeleteItem", "Query")


def test_several_resources_at_once_and_a_refused_transaction(
    lock_table: str, recording: Recording
) -> None:
    both = semaphore(["m:a", "m:b"], lease=10).acquire()
    with pytest.raises(SemaphoreBusy):
        semaphore(["m:b", "m:c"], wait=0).acquire()
    both.renew()
    both.release()
    with semaphore(["m:a", "m:b", "m:c"], lease=10):
        pass
    check(recording, lock_table, "TransactWriteItems")


@pytest.mark.django_db(transaction=True)
def test_a_fenced_block(lock_table: str, recording: Recording) -> None:
    with semaphore("f:1", fence_db=True) as held:
        fence = held.fence
    with semaphore("f:1", fence_db=True) as newer:
        assert newer.fence > fence
    check(recording, lock_table, "UpdateItem")


def test_run_once_jobs(lock_table: str, recording: Recording) -> None:
    with run_once("job:done"):
        pass
    with pytest.raises(RuntimeError), run_once("job:failed"):
        raise RuntimeError("broken")
    with run_once("job:failed"):  # FAILED runs again
        pass
    with pytest.raises(Exception), run_once("job:done"):  # noqa: B017 - AlreadyDone
        pass
    call_command("dynasem_jobs", stdout=io.StringIO())
    check(recording, lock_table, "UpdateItem", "Scan")


@pytest.mark.reentry
def test_unique_task_claims_and_a_coalesced_next_run(lock_table: str, recording: Recording) -> None:
    taken = unique.claim("u:1", "task-1", queue_lease=30)
    with pytest.raises(unique.Taken):
        unique.claim("u:1", "task-2", queue_lease=30)
    carried = unique.Claim.from_header(taken.header())
    assert carried is not None
    held = unique.adopt(carried, lease=5)
    held.renew()
    retry = unique.hand_on(held, taken)
    assert retry is not None
    unique.end_run(held, queue_lease=30)
    again = unique.adopt(retry, lease=5)
    again.release()

    busy = semaphore("c:1", coalesce=True, lease=10, wait=5).acquire()
    result: list[Any] = []

    def second() -> None:
        try:
            with semaphore("c:1", coalesce=True, wait=5):
                result.append("ran")
        except Exception as exc:  # noqa: BLE001 - Coalesced, or what the test reports
            result.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.4)
    busy.release()
    thread.join()
    check(recording, lock_table, "UpdateItem", "PutItem")


def test_reaper_operators_and_listings(
    lock_table: str, recording: Recording, one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        abandon(semaphore(f"dead:{i}", lease=1).acquire())
    abandon(semaphore("dead:n", limit=12, lease=1).acquire())
    live = semaphore("live:1", lease=60, user="alice").acquire()
    other = semaphore("live:2", limit=2, lease=60).acquire()
    with run_once("job:kept"):
        pass
    out = io.StringIO()
    call_command("dynasem_locks", stdout=out)
    call_command("dynasem_locks", "--user", "alice", stdout=out)
    assert break_hold("live:2", other.token)
    call_command("dynasem_release", "live:1", "--noinput", stdout=out)
    time.sleep(2.2)  # one-second buckets: every 1 s lease ended and its bucket passed
    later = time.time() + 2
    monkeypatch.setattr(clock, "wall_clock", lambda: later)
    call_command("dynasem_reap", stdout=out)
    abandon(live)  # broken by the operators: nothing of theirs to give back at exit
    abandon(other)
    check(recording, lock_table, "Query", "BatchGetItem", "DeleteItem", "UpdateItem")


def test_createtable_describe_and_ttl(dynamodb_local: str, recording: Recording) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        try:
            call_command("dynasem_createtable", "--wait", stdout=io.StringIO())
            call_command("dynasem_createtable", stdout=io.StringIO())  # there already
            with semaphore("t:1"):
                pass
            check(recording, name, "CreateTable", "DescribeTable", "DescribeTimeToLive")
            assert any(c.operation == "UpdateTimeToLive" for c in recording.calls)
        finally:
            dynamodb.get_client().delete_table(TableName=name)


def test_an_item_over_400_kb_is_refused_and_nothing_written(
    lock_table: str, recording: Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_writes, "READERS_INLINE", 10**6)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 10**6)
    crowd = [
        semaphore("crowd", shared=True, lease=600, user=f"{i:04}" + "u" * 1_016) for i in (0, 1)
    ]
    held = [sem.acquire() for sem in crowd]
    # The row filled to just under the limit in one write (a copy of a reader 360 times), not
    # by ~390 acquires that each send and answer the whole growing row.
    client, key = dynamodb.get_client(), records.key("crowd", "lock")
    row = client.get_item(TableName=lock_table, Key=key, ConsistentRead=True)["Item"]
    one = next(iter(row["holders"]["M"].values()))
    copies = {f"copy{i:04}": one for i in range(360)}
    client.put_item(
        TableName=lock_table, Item={**row, "holders": {"M": {**row["holders"]["M"], **copies}}}
    )
    with pytest.raises(LimitExceeded):
        for i in range(2, 60):
            sem = semaphore("crowd", shared=True, lease=600, user=f"{i:04}" + "u" * 1_016)
            held.append(sem.acquire())
    for hold in held:
        hold.release()
    sim = check(recording, lock_table, "UpdateItem", "PutItem")
    stored = sim.snapshot()[lock_table][item_key(sim.tables[lock_table], key)]
    assert set(stored["holders"]["M"]) == set(copies)  # the real readers left; nothing was added


# -- beyond what dynasem sends ---------------------------------------------------------------------


def raw_requests(table: str) -> list[tuple[str, dict[str, Any]]]:
    """Requests dynasem does not send today, for the expressions, return values, orders and
    refusals a later dynasem (or the simulator's runtime) may rely on."""

    def key(pk: str, sk: str = "lock") -> dict[str, Any]:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    item = {
        **key("a"),
        "n": {"N": "5"},
        "s": {"S": "abc"},
        "l": {"L": [{"N": "1"}, {"S": "x"}]},
        "ss": {"SS": ["a", "b"]},
        "m": {"M": {"k": {"N": "1"}, "deep": {"M": {"x": {"S": "y"}}}}},
    }
    upd = {"TableName": table, "Key": key("a"), "ReturnValues": "ALL_NEW"}
    requests: list[tuple[str, dict[str, Any]]] = [("PutItem", {"TableName": table, "Item": item})]
    conditions = [
        ("n BETWEEN :a AND :b", {":a": {"N": "1"}, ":b": {"N": "9"}}),
        ("n IN (:a, :b)", {":a": {"N": "1"}, ":b": {"N": "5"}}),
        ("contains(ss, :a) AND contains(l, :b)", {":a": {"S": "a"}, ":b": {"N": "1"}}),
        ("begins_with(s, :a) OR size(l) > :b", {":a": {"S": "zz"}, ":b": {"N": "5"}}),
        ("attribute_type(m, :a) AND NOT (nope <> :b)", {":a": {"S": "M"}, ":b": {"N": "1"}}),
        ("m.deep.x = :a AND l[1] = :b", {":a": {"S": "y"}, ":b": {"S": "x"}}),
        ("size(s) = :a AND NOT n < :b", {":a": {"N": "3"}, ":b": {"S": "1"}}),
        ("n BETWEEN :b AND :a", {":a": {"N": "1"}, ":b": {"N": "9"}}),
        ("attribute_type(n, :a)", {":a": {"S": "Q"}}),
        ("n = :a AND", {":a": {"N": "1"}}),
        ("shard = :a", {":a": {"N": "1"}}),
    ]
    for n, (condition, values) in enumerate(conditions):
        request = {**upd, "UpdateExpression": "SET t = :t", "ConditionExpression": condition}
        request["ExpressionAttributeValues"] = {":t": {"N": str(n)}, **values}
        requests.append(("UpdateItem", request))
    updates = [
        (
            "SET n = n - :a, l = list_append(l, :b), s2 = if_not_exists(s2, s)",
            {":a": {"N": "0.5"}, ":b": {"L": [{"N": "9"}]}},
            "UPDATED_NEW",
        ),  # noqa: E501
        (
            "ADD ss :a, c :b DELETE ss2 :a",
            {":a": {"SS": ["z"]}, ":b": {"N": "-1.5"}},
            "UPDATED_OLD",
        ),
        ("SET l[0] = :a, m.k = m.k + :a REMOVE l[5], m.deep.x", {":a": {"N": "7"}}, "ALL_OLD"),
        ("REMOVE l[0], l[1] SET m.deep.y = :a", {":a": {"BOOL": True}}, "ALL_NEW"),
        ("SET q = :a, q = :a", {":a": {"N": "1"}}, "NONE"),
        ("SET nope.x = :a", {":a": {"N": "1"}}, "NONE"),
        ("SET n = :a + :a", {":a": {"S": "1"}}, "NONE"),
        ("SET pk = :a", {":a": {"S": "b"}}, "NONE"),
        ("SET big = :a", {":a": {"S": "x" * 409_600}}, "NONE"),
    ]
    for update, values, returns in cast(list[tuple[str, dict[str, Any], str]], updates):
        request = {**upd, "UpdateExpression": update, "ExpressionAttributeValues": values}
        requests.append(("UpdateItem", request | {"ReturnValues": returns}))
    for n in range(7):
        extra = {"userId": {"S": "u"}, "expires": {"N": str(900 * (n % 3))}, "mode": {"S": "x"}}
        requests.append(("PutItem", {"TableName": table, "Item": {**key(f"r{n}"), **extra}}))
        requests.append(("PutItem", {"TableName": table, "Item": {**key(f"r{n}", f"q#{n}")}}))
    users = {
        "TableName": table,
        "IndexName": records.USER_INDEX,
        "KeyConditionExpression": "#u = :u AND #e BETWEEN :a AND :b",
        "ExpressionAttributeNames": {"#u": "userId", "#e": "expires"},
        "ExpressionAttributeValues": {":u": {"S": "u"}, ":a": {"N": "0"}, ":b": {"N": "900"}},
    }
    requests += [
        ("Query", users | {"Limit": 2}),
        ("Query", users | {"Limit": 3, "ScanIndexForward": False}),
        ("Query", users | {"Select": "COUNT"}),
        ("Query", users | {"ConsistentRead": True}),
        (
            "Query",
            {
                "TableName": table,
                "KeyConditionExpression": "pk = :p AND begins_with(sk, :q)",
                "ProjectionExpression": "pk, m.deep, l[0]",
                "ExpressionAttributeValues": {":p": {"S": "r1"}, ":q": {"S": "q#"}},
            },
        ),  # fmt: skip
        ("Scan", {"TableName": table, "Limit": 5}),
        (
            "Scan",
            {
                "TableName": table,
                "FilterExpression": "attribute_exists(#m)",
                "ExpressionAttributeNames": {"#m": "mode"},
            },
        ),  # noqa: E501
        (
            "GetItem",
            {"TableName": table, "Key": key("a"), "ProjectionExpression": "m.k, l[0], nope"},
        ),  # noqa: E501
        ("GetItem", {"TableName": table, "Key": {"pk": {"S": "a"}}}),
        ("BatchGetItem", {"RequestItems": {table: {"Keys": [key("a"), key("r2"), key("zz")]}}}),
        ("BatchGetItem", {"RequestItems": {table: {"Keys": [key("a"), key("a")]}}}),
        ("DeleteItem", {"TableName": table, "Key": key("r3"), "ReturnValues": "ALL_OLD"}),
        (
            "DeleteItem",
            {"TableName": table, "Key": key("zz"), "ConditionExpression": "attribute_exists(pk)"},
        ),  # noqa: E501
        (
            "TransactWriteItems",
            {
                "TransactItems": [
                    {
                        "ConditionCheck": {
                            "TableName": table,
                            "Key": key("zz"),
                            "ConditionExpression": "attribute_exists(pk)",
                        }
                    },  # noqa: E501
                    {"Delete": {"TableName": table, "Key": key("r4")}},
                    {
                        "Put": {
                            "TableName": table,
                            "Item": key("r5"),
                            "ConditionExpression": "attribute_not_exists(pk)",
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },  # noqa: E501
                ]
            },
        ),  # fmt: skip
        (
            "TransactWriteItems",
            {
                "TransactItems": [
                    {
                        "Update": {
                            "TableName": table,
                            "Key": key("r6"),
                            "UpdateExpression": "SET #m = :m",
                            "ExpressionAttributeNames": {"#m": "mode"},
                            "ExpressionAttributeValues": {":m": {"S": "n"}},
                        }
                    },  # noqa: E501
                    {"Delete": {"TableName": table, "Key": key("r0")}},
                ]
            },
        ),  # fmt: skip
        (
            "TransactWriteItems",
            {"TransactItems": [{"Delete": {"TableName": table, "Key": key("r1")}}] * 2},
        ),  # noqa: E501
    ]
    return requests


def test_expressions_orders_and_refusals_beyond_dynasems_own(
    lock_table: str, recording: Recording
) -> None:  # noqa: E501
    client = dynamodb.get_client()
    for operation, request in raw_requests(lock_table):
        try:
            cast(Any, client)._make_api_call(operation, request)
        except Exception:  # noqa: BLE001,S110 - a refusal, recorded with its answer
            pass
    check(recording, lock_table, "UpdateItem", "Query", "Scan", "TransactWriteItems")
