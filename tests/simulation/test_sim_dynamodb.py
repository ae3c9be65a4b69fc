"""The simulated DynamoDB's unkind profile (stale reads, lagging indexes, throttling,
transaction conflicts, late TTL), its determinism, its item sizes, and its speed. Its kind
answers are checked against DynamoDB Local in tests/simulation/test_differential.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.sim import dynamodb as simulated
from tests.support.sim.dynamodb import Profile, SimClient, SimDynamoDB
from tests.support.sim.values import item_size

TABLE = "t"
DEFINITION = {
    "TableName": TABLE,
    "BillingMode": "PAY_PER_REQUEST",
    "AttributeDefinitions": [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
        {"AttributeName": "userId", "AttributeType": "S"},
        {"AttributeName": "expires", "AttributeType": "N"},
    ],
    "KeySchema": [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ],
    "GlobalSecondaryIndexes": [
        {
            "IndexName": "users",
            "KeySchema": [
                {"AttributeName": "userId", "KeyType": "HASH"},
                {"AttributeName": "expires", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ],
}


class Clock:
    def __init__(self, at: float = 1_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def make(profile: Profile, seed: int = 7) -> tuple[SimDynamoDB, SimClient, Clock]:
    clock = Clock()
    db = SimDynamoDB(random.Random(seed), clock, profile)
    client = db.client()
    client.create_table(**DEFINITION)
    return db, client, clock


def key(pk: str, sk: str = "lock") -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def put(client: SimClient, pk: str, version: int, **extra: Any) -> None:
    client.put_item(TableName=TABLE, Item={**key(pk), "v": {"N": str(version)}, **extra})


def version(client: SimClient, pk: str, *, consistent: bool = False) -> int | None:
    item = client.get_item(TableName=TABLE, Key=key(pk), ConsistentRead=consistent).get("Item")
    return None if item is None else int(item["v"]["N"])


def code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


# -- stale reads -----------------------------------------------------------------------------------


def test_reads_lag_a_write_may_be_missing_or_old_and_reads_go_back_in_time() -> None:
    db, client, clock = make(Profile(stale_read=1.0))
    put(client, "a", 1)
    clock.at += 0.5
    put(client, "a", 2)
    clock.at += 0.1
    seen = [version(client, "a") for _ in range(300)]
    assert set(seen) == {None, 1, 2}  # not there yet, the old version, the new one
    pairs = list(zip(seen, seen[1:], strict=False))
    went_back = any(b is not None and a is not None and b < a for a, b in pairs)
    assert went_back or any(a is not None and b is None for a, b in pairs)
    assert {version(client, "a", consistent=True) for _ in range(50)} == {2}
    clock.at += 1.0  # past the lag: every read is current
    assert {version(client, "a") for _ in range(50)} == {2}


def test_a_deleted_item_may_still_be_read_for_a_while() -> None:
    db, client, clock = make(Profile(stale_read=1.0))
    put(client, "a", 1)
    clock.at += 5
    client.delete_item(TableName=TABLE, Key=key("a"))
    clock.at += 0.2
    assert {version(client, "a") for _ in range(200)} == {None, 1}
    assert version(client, "a", consistent=True) is None
    clock.at += 1.0
    assert {version(client, "a") for _ in range(50)} == {None}


def test_a_query_and_a_batch_read_lag_too() -> None:
    db, client, clock = make(Profile(stale_read=1.0))
    put(client, "a", 1)
    clock.at += 0.3
    counts = {
        client.query(
            TableName=TABLE,
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": {"S": "a"}},
        )["Count"]
        for _ in range(100)
    }
    assert counts == {0, 1}
    found = {
        len(client.batch_get_item(RequestItems={TABLE: {"Keys": [key("a")]}})["Responses"][TABLE])
        for _ in range(100)
    }
    assert found == {0, 1}


# -- indexes ---------------------------------------------------------------------------------------


def listed(client: SimClient, user: str = "u") -> list[str]:
    items = client.query(
        TableName=TABLE,
        IndexName="users",
        KeyConditionExpression="userId = :u",
        ExpressionAttributeValues={":u": {"S": user}},
    )["Items"]
    return [i["pk"]["S"] for i in items]


def test_an_index_misses_a_new_item_and_shows_a_deleted_one_for_a_while() -> None:
    db, client, clock = make(Profile(index_lag=1.0))
    put(client, "a", 1, userId={"S": "u"}, expires={"N": "5"})
    clock.at += 0.4
    assert {tuple(listed(client)) for _ in range(100)} == {(), ("a",)}
    assert version(client, "a") == 1  # the table itself is read consistently (no stale_read)
    clock.at += 0.7
    assert {tuple(listed(client)) for _ in range(50)} == {("a",)}
    client.delete_item(TableName=TABLE, Key=key("a"))
    clock.at += 0.4
    assert {tuple(listed(client)) for _ in range(100)} == {(), ("a",)}
    clock.at += 0.7
    assert {tuple(listed(client)) for _ in range(50)} == {()}


def test_an_index_moves_an_item_late_and_is_never_read_consistently() -> None:
    db, client, clock = make(Profile(index_lag=1.0))
    put(client, "a", 1, userId={"S": "u"}, expires={"N": "5"})
    clock.at += 2
    put(client, "a", 2, userId={"S": "w"}, expires={"N": "5"})
    clock.at += 0.3
    pairs = {(tuple(listed(client, "u")), tuple(listed(client, "w"))) for _ in range(200)}
    assert (("a",), ()) in pairs and ((), ("a",)) in pairs
    with pytest.raises(ClientError) as refused:
        client.query(
            TableName=TABLE,
            IndexName="users",
            KeyConditionExpression="userId = :u",
            ExpressionAttributeValues={":u": {"S": "u"}},
            ConsistentRead=True,
        )
    assert code(refused) == "ValidationException"
    assert "Consistent reads are not supported" in str(refused.value)


# -- throttling ------------------------------------------------------------------------------------


def test_a_partition_key_past_its_write_units_is_throttled_and_nothing_is_applied() -> None:
    db, client, clock = make(Profile(throttle_wcu=10))
    for n in range(10):
        put(client, "hot", n)
    with pytest.raises(ClientError) as throttled:
        put(client, "hot", 99)
    assert code(throttled) in ("ProvisionedThroughputExceededException", "ThrottlingException")
    assert version(client, "hot", consistent=True) == 9  # the throttled write was not applied
    put(client, "cold", 1)  # another partition key has units of its own
    clock.at += 1.0
    put(client, "hot", 100)  # a second later the key's units are back
    assert version(client, "hot", consistent=True) == 100


def test_reads_past_their_units_are_throttled() -> None:
    db, client, clock = make(Profile(throttle_rcu=2))
    put(client, "hot", 1)
    for _ in range(2):
        version(client, "hot", consistent=True)
    with pytest.raises(ClientError) as throttled:
        version(client, "hot", consistent=True)
    assert code(throttled) in ("ProvisionedThroughputExceededException", "ThrottlingException")
    clock.at += 1.0
    assert version(client, "hot", consistent=True) == 1


# -- transactions ----------------------------------------------------------------------------------


def update(pk: str, value: int) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": TABLE,
            "Key": key(pk),
            "UpdateExpression": "SET v = :v",
            "ExpressionAttributeValues": {":v": {"N": str(value)}},
        }
    }


def test_a_write_on_an_item_a_transaction_holds_conflicts_and_is_not_applied() -> None:
    db, client, clock = make(Profile(transaction_hold=0.05))
    client.transact_write_items(TransactItems=[update("a", 1), update("b", 1)])
    with pytest.raises(ClientError) as conflict:
        client.update_item(**{**update("a", 2)["Update"]})
    assert code(conflict) == "TransactionConflictException"
    with pytest.raises(ClientError) as cancelled:
        client.transact_write_items(TransactItems=[update("c", 2), update("b", 2)])
    assert code(cancelled) == "TransactionCanceledException"
    reasons = cancelled.value.response["CancellationReasons"]
    assert [r["Code"] for r in reasons] == ["None", "TransactionConflict"]
    assert version(client, "a", consistent=True) == 1
    assert version(client, "c", consistent=True) is None  # all or nothing
    clock.at += 0.06
    client.update_item(**{**update("a", 3)["Update"]})
    assert version(client, "a", consistent=True) == 3


def test_a_share_of_transactions_meets_one_in_flight() -> None:
    db, client, clock = make(Profile(conflict_share=0.5))
    outcomes = []
    for n in range(100):
        clock.at += 1
        try:
            client.transact_write_items(TransactItems=[update("a", n), update("b", n)])
            outcomes.append("applied")
        except ClientError as exc:
            reasons = [r["Code"] for r in exc.response["CancellationReasons"]]
            assert sorted(reasons) == ["None", "TransactionConflict"]
            outcomes.append("conflict")
    assert 20 < outcomes.count("conflict") < 80
    singles = []
    for n in range(100):  # items that transactions write meet one in flight too
        try:
            client.update_item(**{**update("a", 1000 + n)["Update"]})
            singles.append("applied")
        except ClientError as exc:
            assert code_of(exc) == "TransactionConflictException"
            singles.append("conflict")
    assert 20 < singles.count("conflict") < 80


def code_of(exc: ClientError) -> str:
    return str(exc.response["Error"]["Code"])


# -- TTL -------------------------------------------------------------------------------------------


def test_ttl_deletes_expired_items_late_but_deletes_them() -> None:
    db, client, clock = make(Profile(ttl_delay=100.0))
    client.update_time_to_live(
        TableName=TABLE, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"}
    )
    for n in range(20):
        put(client, f"gone{n}", 1, expires={"N": str(int(clock.at) + 10)})
    put(client, "kept", 1, expires={"N": str(int(clock.at) + 10_000)})
    put(client, "no-ttl", 1)
    assert db.expire_ttl() == 0
    clock.at += 11
    first = db.expire_ttl()
    assert first < 20  # not at once: each waits a delay of its own
    deleted = first
    for _ in range(20):
        clock.at += 5
        deleted += db.expire_ttl()
    assert deleted == 20
    assert set(db.snapshot()[TABLE]) == {'["kept", "lock"]', '["no-ttl", "lock"]'}


def test_ttl_deletes_nothing_while_it_is_off() -> None:
    db, client, clock = make(Profile.kind())
    put(client, "a", 1, expires={"N": str(int(clock.at) - 10)})
    clock.at += 100
    assert db.expire_ttl() == 0
    assert version(client, "a") == 1


# -- determinism -----------------------------------------------------------------------------------


def workload(seed: int) -> list[Any]:
    """Answers to a random mix of requests under AWS's unkindness."""
    db, client, clock = make(Profile.aws(), seed=seed)
    draw = random.Random(99)  # the same requests for every seed
    answers: list[Any] = []
    for n in range(400):
        clock.at += draw.uniform(0, 0.05)
        pk = f"k{draw.randrange(5)}"
        try:
            if draw.random() < 0.5:
                put(client, pk, n, userId={"S": "u"}, expires={"N": str(n)})
                answers.append("put")
            elif draw.random() < 0.5:
                answers.append(version(client, pk))
            elif draw.random() < 0.5:
                answers.append(listed(client))
            else:
                client.transact_write_items(TransactItems=[update(pk, n), update("k9", n)])
                answers.append("transaction")
        except ClientError as exc:
            answers.append(code_of(exc))
    return answers + [db.snapshot()]


def test_the_same_seed_gives_the_same_answers() -> None:
    assert workload(1) == workload(1)
    assert workload(1) != workload(2)


# -- sizes and speed -------------------------------------------------------------------------------

# Sizes of attributes named "n" as DynamoDB Local bills them (measured: the largest padding
# whose item still cost 1 WCU).
MEASURED = {
    "1": 3,
    "12": 3,
    "123": 4,
    "1234567890123": 9,
    "100": 3,
    "1000000": 3,
    "0.5": 3,
    "-1": 4,
    "0": 2,
    "1.25": 4,
    "-123": 5,
    "123.4": 5,
    "1.5": 4,
    "10.5": 4,
    "0.05": 3,
    "0.001": 3,
    "1700000000000": 4,
    "1700000000123": 9,
}


@pytest.mark.parametrize("number", sorted(MEASURED))
def test_a_number_is_sized_as_dynamodb_sizes_it(number: str) -> None:
    assert item_size({"n": {"N": number}}) == MEASURED[number]


def test_maps_lists_and_sets_are_sized_as_dynamodb_sizes_them() -> None:
    assert item_size({"m": {"M": {}}}) == 4
    assert item_size({"m": {"M": {"k": {"S": "v"}, "kk": {"S": "vv"}}}}) == 12
    assert item_size({"l": {"L": [{"S": "v"}, {"N": "1"}]}}) == 9
    assert item_size({"m": {"M": {"a": {"M": {"b": {"N": "1"}}}}}}) == 13
    assert item_size({"s": {"SS": ["ab", "c"]}}) == 4
    assert item_size({"s": {"NS": ["1", "22"]}}) == 5
    assert item_size({"b": {"BOOL": True}, "s": {"S": "é"}}) == 5


def test_speed(capsys: pytest.CaptureFixture[str]) -> None:
    """Requests a second (no assertion: the machine is shared); see also
    ``python -m tests.support.sim.dynamodb --bench``."""
    rates = simulated.bench(1.0)
    with capsys.disabled():
        print("\nsimulated DynamoDB: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
    assert all(rate > 0 for rate in rates.values())
