"""The unkind engine (tests/support/unkind.py) really is as unkind as AWS: a read straight after a
write returns the old item, an index misses a new item and still shows a deleted one, a hot
partition key is throttled at its limit, transactions are cancelled for conflicts, answers are lost
after the write applied, and the same seed gives the same answers."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.unkind import UnkindDynamoDB

pytestmark = pytest.mark.dynamodb_local_only("the unkind engine stands in front of DynamoDB Local")


@pytest.fixture
def local(dynamodb_local: str) -> str:
    return os.environ["DYNASEM_TEST_LOCAL_ENDPOINT"]


def client(endpoint: str, attempts: int = 1) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(retries={"mode": "legacy", "total_max_attempts": attempts}, read_timeout=5),
    )


def make_table(c: Any, name: str | None = None) -> str:
    name = name or f"unkind-{uuid.uuid4().hex[:8]}"
    c.create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "u", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
        GlobalSecondaryIndexes=[
            {
                "IndexName": "byUser",
                "KeySchema": [{"AttributeName": "u", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    return name


@pytest.fixture
def engine(local: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnkindDynamoDB]:
    marker = request.node.get_closest_marker("unkind")
    name, overrides = marker.args if marker else ("lag", {})
    with UnkindDynamoDB(
        local, seed=7, profile_name=name, overrides=overrides, journal=str(tmp_path / "j.jsonl")
    ) as unkind:
        yield unkind


def versions_read(c: Any, table: str, n: int, consistent: bool) -> list[int | None]:
    seen: list[int | None] = []
    for i in range(n):
        c.put_item(TableName=table, Item={"pk": {"S": "a"}, "v": {"N": str(i)}})
        got = c.get_item(TableName=table, Key={"pk": {"S": "a"}}, ConsistentRead=consistent)
        seen.append(int(got["Item"]["v"]["N"]) if "Item" in got else None)
    return seen


def fresh_read(c: Any, table: str, key: str) -> int | None:
    c.put_item(TableName=table, Item={"pk": {"S": key}, "v": {"N": "0"}})
    got = c.get_item(TableName=table, Key={"pk": {"S": key}})
    return int(got["Item"]["v"]["N"]) if "Item" in got else None


def went_back(c: Any, table: str) -> bool:
    for burst in range(10):
        c.put_item(TableName=table, Item={"pk": {"S": "b"}, "v": {"N": str(burst)}})
        seen = []
        for _ in range(30):
            got = c.get_item(TableName=table, Key={"pk": {"S": "b"}})
            seen.append(int(got["Item"]["v"]["N"]) if "Item" in got else -1)
        if any(b < a for a, b in zip(seen, seen[1:], strict=False)):
            return True
    return False


def test_a_read_straight_after_a_write_may_return_the_old_item(engine: UnkindDynamoDB) -> None:
    c = client(engine.endpoint_url)
    table = make_table(c)
    stale = versions_read(c, table, 40, consistent=False)
    behind = [i for i, v in enumerate(stale) if v != i]
    assert 5 <= len(behind) < 40, stale  # some reads are stale, not all
    # A new item may not be there yet at all: one read straight after each of 20 first writes.
    # (Not only item "a"'s first read: on a loaded machine its one replica may be quicker.)
    missing = [i for i in range(20) if fresh_read(c, table, f"new{i}") is None]
    assert missing, "every read straight after a first write found the item"
    # ...and a read may go back in time after a newer one (replicas are picked per read):
    # a burst of reads straight after a write, a few times over.
    assert went_back(c, table), "no read went back in time"
    assert versions_read(c, table, 20, consistent=True) == list(range(20))


def test_an_index_misses_a_new_item_and_still_shows_a_deleted_one(engine: UnkindDynamoDB) -> None:
    c = client(engine.endpoint_url)
    table = make_table(c)

    def by_user(user: str) -> list[str]:
        got = c.query(
            TableName=table,
            IndexName="byUser",
            KeyConditionExpression="u = :u",
            ExpressionAttributeValues={":u": {"S": user}},
        )
        return [i["pk"]["S"] for i in got["Items"]]

    missed = shown = 0
    for i in range(20):
        c.put_item(TableName=table, Item={"pk": {"S": f"k{i}"}, "u": {"S": f"user{i}"}})
        missed += by_user(f"user{i}") == []
    for i in range(20):
        c.delete_item(TableName=table, Key={"pk": {"S": f"k{i}"}})
        shown += by_user(f"user{i}") == [f"k{i}"]
    assert missed >= 5 and shown >= 5, (missed, shown)
    # The table itself, read consistently, has none of them.
    assert c.scan(TableName=table, ConsistentRead=True)["Items"] == []
    # A consistent read of an index is refused, as on AWS.
    with pytest.raises(ClientError, match="ValidationException"):
        c.query(
            TableName=table,
            IndexName="byUser",
            ConsistentRead=True,
            KeyConditionExpression="u = :u",
            ExpressionAttributeValues={":u": {"S": "user1"}},
        )


@pytest.mark.unkind("throttle", {"partition_wcu": 10.0})
def test_a_hot_partition_key_is_throttled_at_its_limit(engine: UnkindDynamoDB) -> None:
    """Never more than the key's limit (its units drain at 10 a second, a second's worth to
    begin with), whatever pace the client manages: the count is bounded by the loop's own
    duration, not by a pace a loaded machine may not reach (at 20 WCU/s and >= 30 refusals of
    135, a CI run beside a busy machine sent too slowly to be refused 30 times)."""
    limit = 10.0
    c = client(engine.endpoint_url)
    table = make_table(c)
    codes: dict[str, list[str]] = {"hot": [], "cold": []}
    started = time.monotonic()
    for i in range(150):
        for which in ("hot",) if i % 10 else ("hot", "cold"):
            pk = "hot" if which == "hot" else f"cold{i}"
            try:
                c.put_item(TableName=table, Item={"pk": {"S": pk}, "v": {"N": str(i)}})
                codes[which].append("ok")
            except ClientError as exc:
                codes[which].append(exc.response["Error"]["Code"])
    elapsed = time.monotonic() - started
    served = codes["hot"].count("ok")
    assert served <= limit * (elapsed + 1) + 1, (served, elapsed)
    assert len(codes["hot"]) > limit * (elapsed + 1) + 1, f"too slow to pass the limit: {elapsed}"
    throttled = [x for x in codes["hot"] if x != "ok"]
    assert set(throttled) <= {"ProvisionedThroughputExceededException", "ThrottlingException"}
    assert codes["hot"][:9].count("ok") == 9  # the first second's 10 units are served
    assert codes["cold"] == ["ok"] * 15  # other keys are not throttled by the hot one


@pytest.mark.unkind("throttle", {"transaction_hold": 0.3})
def test_transactions_on_one_item_at_once_are_cancelled_for_the_conflict(
    engine: UnkindDynamoDB,
) -> None:
    c = client(engine.endpoint_url)
    table = make_table(c)
    answers: list[str] = []

    def transact(i: int) -> None:
        try:
            c.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": table, "Item": {"pk": {"S": "x"}, "v": {"N": str(i)}}}},
                    {"Put": {"TableName": table, "Item": {"pk": {"S": f"y{i}"}}}},
                ]
            )
            answers.append("ok")
        except ClientError as exc:
            reasons = [r["Code"] for r in exc.response.get("CancellationReasons", [])]
            answers.append(f"{exc.response['Error']['Code']} {reasons}")

    threads = [threading.Thread(target=transact, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers.count("ok") >= 1
    assert "TransactionCanceledException ['TransactionConflict', 'None']" in answers, answers
    # A single write on an item inside a transaction conflicts with it too.
    worker = threading.Thread(target=transact, args=(9,))
    worker.start()
    threading.Event().wait(0.08)
    with pytest.raises(ClientError, match="TransactionConflictException"):
        c.put_item(TableName=table, Item={"pk": {"S": "x"}})
    worker.join()


@pytest.mark.unkind("throttle", {"lost_share": 1.0, "lost_timeout": 6.0})
def test_a_write_is_applied_and_its_answer_lost(engine: UnkindDynamoDB) -> None:
    c = client(engine.endpoint_url)
    table = make_table(c)
    failures = []
    for i in range(6):
        with pytest.raises(Exception) as caught:
            c.put_item(TableName=table, Item={"pk": {"S": f"k{i}"}})
        failures.append(type(caught.value).__name__)
    # 500s, dropped connections, read timeouts: and every one of the writes was applied.
    assert len(set(failures)) >= 2, failures
    assert len(c.scan(TableName=table, ConsistentRead=True)["Items"]) == 6


def journal_decisions(engine: UnkindDynamoDB, table: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in Path(engine.journal or "").read_text().splitlines()]
    keep = ("op", "replica", "throttled", "lost", "conflict", "wait_before", "wait_after")
    return [
        {k: v for k, v in e.items() if k in keep}
        for e in lines
        if table in e.get("subject", "") and e["op"] != "CreateTable"
    ]


def test_the_same_seed_gives_the_same_answers(local: str, tmp_path: Path) -> None:
    runs = []
    for run in range(2):
        with UnkindDynamoDB(
            local, seed=11, profile_name="aws", overrides={"lost_share": 0.0},
            journal=str(tmp_path / f"{run}.jsonl"),
        ) as engine:  # fmt: skip
            c = client(engine.endpoint_url, attempts=5)
            table = make_table(c, "unkind-same-seed")  # the generators are per item and seed
            versions_read(c, table, 30, consistent=False)
            runs.append(journal_decisions(engine, table))
            c.delete_table(TableName=table)
    assert runs[0] == runs[1]
    assert any("replica" in e and e["replica"] != "leader" for e in runs[0])


# -- dynasem on the engine: what it answers is handled as AWS's answers must be -----------------


@pytest.fixture
def on_engine(lock_table: str, engine: UnkindDynamoDB) -> Iterator[UnkindDynamoDB]:
    """dynasem's settings point at the engine (the table made before: copied to its replicas)."""
    from django.test import override_settings

    from dynasem._storage import dynamodb
    from dynasem.conf import settings

    with override_settings(DYNASEM=dict(settings.raw, ENDPOINT_URL=engine.endpoint_url)):
        dynamodb.reset_client()
        yield engine
    dynamodb.reset_client()


def wait_for_transaction(engine: UnkindDynamoDB) -> None:
    """Until the engine has a transaction holding its items (a loaded machine may take a
    while to send it)."""
    deadline = time.monotonic() + 20
    while not engine.stats()["in_transaction"]:
        assert time.monotonic() < deadline, "the transaction never reached the engine"
        time.sleep(0.02)


def transaction_on_row(
    engine: UnkindDynamoDB, table: str, resource: str, condition: str, sk: str = "lock"
) -> threading.Thread:
    """Another request's transaction (a ConditionCheck) holding ``resource``'s lock row (or
    its item ``sk``: a reader's, a permit's) on the engine for its ``transaction_hold``:
    started, and holding it when this returns."""
    check = {
        "TableName": table,
        "Key": {"pk": {"S": resource}, "sk": {"S": sk}},
        "ConditionExpression": condition,
    }
    other = threading.Thread(
        target=client(engine.endpoint_url).transact_write_items,
        kwargs={"TransactItems": [{"ConditionCheck": check}]},
    )
    other.start()
    wait_for_transaction(engine)
    return other


@pytest.mark.unkind("throttle", {"conflict_share": 0.5})
def test_a_take_of_several_resources_cancelled_for_a_conflict_is_tried_again(
    on_engine: UnkindDynamoDB,
) -> None:
    from dynasem import semaphore

    for _ in range(8):
        with semaphore(["conf:a", "conf:b"], wait=10):
            pass
    # Half the transactions were cancelled for a conflict (takes and releases): none failed.
    assert on_engine.stats()["counts"]["transaction conflict (share)"] >= 3


@pytest.mark.unkind("throttle", {"transaction_hold": 3.0})
def test_a_write_on_an_item_inside_a_transaction_is_tried_again(
    on_engine: UnkindDynamoDB, lock_table: str
) -> None:
    from dynasem import semaphore

    with semaphore("conf:warm"):  # the client made and the table known before the clock runs
        pass
    other = transaction_on_row(
        on_engine, lock_table, "conf:x", "attribute_not_exists(pk)"
    )  # holds the row for 1.5-3 s
    with semaphore("conf:x", wait=10):  # TransactionConflictException first: tried again
        pass
    other.join()
    assert on_engine.stats()["counts"]["transaction conflict (write)"] >= 1


@pytest.mark.unkind("throttle", {"transaction_hold": 3.0})
def test_a_release_that_meets_another_transaction_on_the_row_is_sent_again(
    on_engine: UnkindDynamoDB, lock_table: str
) -> None:
    """Found by the three-host soak on the engine: a release refused with
    TransactionConflictException was given up ("it expires"), and the lock stayed held by
    nobody for its lease. A conflict applied nothing and passes within milliseconds."""
    from dynasem import semaphore
    from dynasem._operators.locks import holds_on

    held = semaphore("conf:r", lease=30).acquire()
    other = transaction_on_row(
        on_engine, lock_table, "conf:r", "attribute_exists(pk)"
    )  # holds the row for 1.5-3 s
    held.release()
    other.join()
    assert holds_on("conf:r") == []
    assert on_engine.stats()["counts"]["transaction conflict (write)"] >= 1


@pytest.mark.unkind("throttle", {"transaction_hold": 3.0})
def test_a_release_of_several_resources_cancelled_for_a_conflict_is_sent_again(
    on_engine: UnkindDynamoDB, lock_table: str
) -> None:
    """Found by the CI's race test on the engine: a release of two resources (a transaction)
    cancelled three times at once for another request's transaction on a row returned, and
    left the hold in both rows for its lease."""
    from dynasem import semaphore
    from dynasem._operators.locks import holds_on

    held = semaphore(["conf:p", "conf:q"], lease=30).acquire()
    other = transaction_on_row(
        on_engine, lock_table, "conf:p", "attribute_exists(pk)"
    )  # holds the row for 1.5-3 s, within the release's patience (5 s)
    held.release()
    other.join()
    assert holds_on("conf:p") == [] and holds_on("conf:q") == []


@pytest.mark.unkind("throttle", {"transaction_hold": 3.0})
def test_a_reader_items_release_that_meets_another_transaction_is_sent_again(
    on_engine: UnkindDynamoDB, lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the simulator's `shared_pairs` mix (seed 16, `pauses`): a reader item's
    delete refused with TransactionConflictException was given up at once ("it expires"), as
    the row's release no longer is: a writer then waited a lease for the write-off."""
    from dynasem import semaphore
    from dynasem._operators.locks import holds_on
    from dynasem._storage import lock_writes, reader_items, records

    monkeypatch.setattr(lock_writes, "READERS_INLINE", 1)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 1)
    first = semaphore("conf:rw", shared=True, lease=30).acquire()
    second = semaphore("conf:rw", shared=True, lease=30).acquire()  # in a reader item
    sk = records.reader_sk(second.token)
    exists = "attribute_exists(pk)"
    other = transaction_on_row(on_engine, lock_table, "conf:rw", exists, sk)  # for 1.5-3 s
    second.release()
    other.join()
    first.release()
    assert holds_on("conf:rw") == []
    assert on_engine.stats()["counts"]["transaction conflict (write)"] >= 1
    with semaphore("conf:rw", wait=0):  # a writer takes it at once: no reader left
        pass


@pytest.mark.unkind("throttle", {"transaction_hold": 3.0})
def test_a_permit_items_release_that_meets_another_transaction_is_sent_again(
    on_engine: UnkindDynamoDB, lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a permit item's release: given up at once, the permit stayed taken for
    its lease."""
    from dynasem import semaphore
    from dynasem._operators.locks import holds_on
    from dynasem._storage import permit_items, records

    monkeypatch.setattr(permit_items, "INLINE_MAX", 1)
    held = semaphore("conf:c", limit=2, lease=30).acquire()  # in a permit item
    (slot,) = held.slots.values()
    sk = records.permit_sk(slot)
    other = transaction_on_row(on_engine, lock_table, "conf:c", "attribute_exists(pk)", sk)
    held.release()
    other.join()
    assert [h for h in holds_on("conf:c") if h.token == held.token] == []
    assert on_engine.stats()["counts"]["transaction conflict (write)"] >= 1
    with semaphore("conf:c", limit=2, wait=0), semaphore("conf:c", limit=2, wait=0):
        pass  # both permits free


@pytest.mark.unkind("throttle", {"transaction_hold": 3.0})
@pytest.mark.parametrize(
    ("kind", "patience"),
    [("row", 5.0), ("permit", 5.0), ("reader", 5.0), ("row", 0.1)],
    ids=["row", "permit", "reader", "row-given-up"],
)
def test_the_undo_of_an_interrupted_take_that_meets_another_transaction_is_sent_again(
    on_engine: UnkindDynamoDB,
    lock_table: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    patience: float,
) -> None:
    """An acquire interrupted (Ctrl-C) once its take landed undoes it: a give-back of the
    row, a permit item's or a reader item's. That undo, refused with
    TransactionConflictException (another request's transaction on the item), was given up
    at once, and what it took stayed held by nobody for its lease: it is sent again within
    the releases' patience, as a release is; given up past it, it says so."""
    from dynasem import SemaphoreBusy, semaphore
    from dynasem._engine import resend
    from dynasem._storage import dynamodb, lock_writes, permit_items, reader_items, records

    monkeypatch.setattr(resend, "RELEASE_PATIENCE", patience)

    resource = f"conf:undo-{kind}"
    options: dict[str, Any] = {"lease": 30}
    first = None
    if kind == "permit":
        monkeypatch.setattr(permit_items, "INLINE_MAX", 1)
        options["limit"] = 2
    elif kind == "reader":
        monkeypatch.setattr(lock_writes, "READERS_INLINE", 1)
        monkeypatch.setattr(reader_items, "READERS_INLINE", 1)
        options["shared"] = True
        first = semaphore(resource, **options).acquire()  # inline: the next one in an item
    prefix = {"row": "lock", "permit": records.PERMIT_PREFIX, "reader": records.READER_PREFIX}
    send_request, interrupted = dynamodb.send_request, []

    def interrupted_after_the_take(operation: str, **kwargs: Any) -> dict[str, Any]:
        answer = send_request(operation, **kwargs)
        sk = kwargs.get("Key", {}).get("sk", {}).get("S", "")
        if interrupted or operation != "update_item" or not sk.startswith(prefix[kind]):
            return answer
        # The take landed; another request's transaction holds its item (for 1.5-3 s, within
        # the patience of 5 s) when Ctrl-C comes, before the answer is used.
        interrupted.append(
            transaction_on_row(on_engine, lock_table, resource, "attribute_exists(pk)", sk)
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(dynamodb, "send_request", interrupted_after_the_take)
    with pytest.raises(KeyboardInterrupt), semaphore(resource, **options):
        pytest.fail("the block must not run")
    monkeypatch.setattr(dynamodb, "send_request", send_request)
    interrupted[0].join()
    assert on_engine.stats()["counts"]["transaction conflict (write)"] >= 1
    if first is not None:
        first.release()
    options.pop("shared", None)  # a writer: no reader may be left
    if patience < 1:
        assert (
            f"could not give back what an interrupted acquire took of {resource!r}" in caplog.text
        )
        with pytest.raises(SemaphoreBusy):  # held by nobody until its lease runs out
            semaphore(resource, wait=0, **options).acquire()
        return
    taken = [
        semaphore(resource, wait=0, **options).acquire() for _ in range(options.get("limit", 1))
    ]
    for held in taken:  # taken at once (every permit): nothing was left held for its lease
        held.release()
