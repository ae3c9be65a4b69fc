"""The management commands, run with call_command against the test engine."""

from __future__ import annotations

import io
import itertools
import json
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from dynasem import LockLost, run_once, semaphore
from dynasem import _clock as clock
from dynasem._engine import arguments, core
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb, lock_rows, records
from dynasem._storage import records as table_stored
from dynasem.testing import abandon
from tests.support.helpers import dynasem_settings, enqueue_entry, take


def run(name: str, *args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``later(seconds)``: this process's wall clock runs ``seconds`` ahead from now on (the
    module attribute clock.wall_clock exists for that), as if the command ran that much later."""

    def shift(seconds: float) -> None:
        monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + seconds)

    return shift


@pytest.fixture
def no_ttl(lock_table: str) -> str:
    """The test table, whose TTL is off (see conftest.lock_table): DynamoDB Local's own TTL
    sweep would race the reaper under test."""
    status = dynamodb.get_client().describe_time_to_live(TableName=lock_table)
    assert status["TimeToLiveDescription"]["TimeToLiveStatus"] in ("DISABLED", "DISABLING")
    return lock_table


# ---------------------------------------------------------------------------------------------
# dynasem_createtable
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def new_table(dynamodb_local: str) -> Iterator[str]:
    """A table name nobody created yet, set as TABLE_NAME; dropped afterwards."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        try:
            yield name
        finally:
            try:
                dynamodb.get_client().delete_table(TableName=name)
            except Exception:
                pass


def table_names() -> list[str]:
    names: list[str] = []
    for page in dynamodb.get_client().get_paginator("list_tables").paginate():
        names += page["TableNames"]
    return names


def test_createtable_creates_the_table_its_indexes_and_ttl(new_table):
    out = run("dynasem_createtable", "--wait")
    assert f"Created table {new_table!r}" in out
    assert "ACTIVE" in out

    client = dynamodb.get_client()
    desc = client.describe_table(TableName=new_table)["Table"]
    assert desc["TableStatus"] == "ACTIVE"
    assert desc["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    indexes = {g["IndexName"]: g for g in desc["GlobalSecondaryIndexes"]}
    assert set(indexes) == {records.USER_INDEX, records.EXPIRES_INDEX}
    user_index, expires_index = indexes[records.USER_INDEX], indexes[records.EXPIRES_INDEX]
    assert user_index["KeySchema"][0] == {"AttributeName": "userId", "KeyType": "HASH"}
    # Keys and the row's mode only: a write that moves no key and keeps the mode costs the
    # indexes nothing.
    for index in (user_index, expires_index):
        assert index["Projection"] == {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["mode"]}
    assert expires_index["KeySchema"] == [
        {"AttributeName": "shard", "KeyType": "HASH"},
        {"AttributeName": "expires", "KeyType": "RANGE"},
    ]
    types = {a["AttributeName"]: a["AttributeType"] for a in desc["AttributeDefinitions"]}
    assert types["userId"] == "S"
    assert types["expires"] == "N"

    ttl = client.describe_time_to_live(TableName=new_table)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
    assert ttl["AttributeName"] == "expires"

    # The table works for the semaphore right away.
    with semaphore("made:1") as held:
        assert [h.token for h in holds_on("made:1")] == [held.token]


def test_createtable_writes_the_stored_format_and_the_check_stops_commands_but_createtable(
    new_table, capsys
):
    """The table dynasem_createtable makes names this dynasem's stored format version. A table
    naming none fails `manage.py check` (dynasem.E014), not dynasem_createtable, which writes
    the version: the command that mends the table is never stopped by its check."""
    from django.core.checks import run_checks
    from django.core.management import execute_from_command_line
    from django.core.management.base import SystemCheckError

    out = run("dynasem_createtable", "--wait")
    assert "stored format version 1" in out
    stored = lock_rows.get_item(records.FORMAT_PK, records.FORMAT_SK)
    assert stored is not None and stored["version"] == records.FORMAT_VERSION == 1
    assert not [m for m in run_checks() if m.id == "dynasem.E014"]
    assert "holds stored format version 1" in run("dynasem_createtable", "--check")

    dynamodb.get_client().delete_item(
        TableName=new_table, Key=records.key(records.FORMAT_PK, records.FORMAT_SK)
    )
    with pytest.raises(SystemCheckError, match="dynasem.E014"):
        call_command("check")
    execute_from_command_line(["manage.py", "dynasem_createtable"])
    assert "stored format version 1" in capsys.readouterr().out
    call_command("check", stdout=io.StringIO())


def test_createtable_check_of_a_missing_table_exits_non_zero_and_creates_nothing(new_table):
    with pytest.raises(CommandError, match="does not exist") as raised:
        run("dynasem_createtable", "--check")
    assert "stored format version 1" in str(raised.value)
    assert new_table not in table_names()


def test_createtable_again_succeeds_and_says_it_exists(new_table):
    run("dynasem_createtable", "--wait")
    created = dynamodb.get_client().describe_table(TableName=new_table)["Table"]
    out = run("dynasem_createtable")
    assert "already exists" in out
    again = dynamodb.get_client().describe_table(TableName=new_table)["Table"]
    assert again["CreationDateTime"] == created["CreationDateTime"]
    assert again["TableArn"] == created["TableArn"]


def test_createtable_dry_run_creates_nothing_and_prints_the_definition(requests_sent, new_table):
    requests_sent.reset()
    out = run("dynasem_createtable", "--dry-run")
    assert requests_sent.total == 0
    assert new_table not in table_names()
    lines = out.splitlines()
    assert new_table in lines[0]
    definition = json.loads("\n".join(lines[1:-1]))
    assert definition == records.table_definition(new_table)
    assert {g["IndexName"] for g in definition["GlobalSecondaryIndexes"]} == {
        "userId-index-v2",
        "expires-index-v2",
    }
    assert "TTL" in lines[-1]


def test_createtable_refuses_a_foreign_table_without_the_indexes(new_table):
    client = dynamodb.get_client()
    client.create_table(
        TableName=new_table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
    )
    with pytest.raises(CommandError) as raised:
        run("dynasem_createtable")
    assert "userId-index-v2" in str(raised.value)
    assert "expires-index-v2" in str(raised.value)
    desc = client.describe_table(TableName=new_table)["Table"]
    # Left as it was: no index (DynamoDB leaves the key out; moto lists none).
    assert not desc.get("GlobalSecondaryIndexes")


@pytest.mark.parametrize("wrong", ["index key", "index projection", "table key"])
@pytest.mark.parametrize("check", [False, True], ids=["create", "check"])
def test_createtable_refuses_a_table_whose_keys_or_indexes_are_not_dynasems(
    new_table, wrong, check
):
    """A table of dynasem's name and index names, made by hand or by another tool, whose
    index is keyed on other attributes (or projects less, or whose own key is another): the
    command said it "already exists" (``--check``: holds the format version dynasem needs),
    and the application failed later, at its first listing or take, with DynamoDB's own
    words. It now names what differs, and writes nothing."""
    definition = records.table_definition(new_table)
    index = definition["GlobalSecondaryIndexes"][0]
    if wrong == "index key":
        index["KeySchema"] = [{"AttributeName": "userId", "KeyType": "HASH"}]
    elif wrong == "index projection":
        index["Projection"] = {"ProjectionType": "KEYS_ONLY"}
    else:
        definition["KeySchema"] = [{"AttributeName": "sk", "KeyType": "HASH"}]
        definition["AttributeDefinitions"].remove({"AttributeName": "pk", "AttributeType": "S"})
    client = dynamodb.get_client()
    client.create_table(**definition)
    if check:  # and the format item written as this dynasem does, by hand
        client.put_item(TableName=new_table, Item=records.format_item())
    with pytest.raises(CommandError) as raised:
        run("dynasem_createtable", *(["--check"] if check else []))
    named = "the table's key" if wrong == "table key" else index["IndexName"]
    assert named in str(raised.value)
    assert "not made by dynasem_createtable" in str(raised.value)
    if not check:
        assert client.scan(TableName=new_table)["Items"] == []


def test_createtable_unreachable_endpoint_is_a_command_error(dynamodb_local):
    with override_settings(DYNASEM=dynasem_settings("http://127.0.0.1:1", "nowhere")):
        with pytest.raises(CommandError, match="127.0.0.1:1"):
            run("dynasem_createtable")


# ---------------------------------------------------------------------------------------------
# dynasem_reap
# ---------------------------------------------------------------------------------------------


def row(pk: str, sk: str = records.LOCK_SK) -> dict[str, Any] | None:
    return lock_rows.get_item(pk, sk)


def expired_hold(holds: list[Any], resource: str, **kwargs: Any) -> Any:
    """A hold whose holder died: no heartbeat, a 1 s lease."""
    held = semaphore(resource, lease=1, **kwargs).acquire()
    abandon(held)
    return held


def make_job_rows() -> None:
    with run_once("job:done"):
        pass
    with pytest.raises(RuntimeError), run_once("job:failed"):
        raise RuntimeError("broken")
    # A job sharing its name with an expired lock: the lock row goes, the job row stays.
    with run_once("dead:0"):
        pass


# A reap finds a row once its expires bucket has passed (and deletes it if its exact lease
# end is more than CLOCK_SKEW ago); live holds here outlast that.
REAP_LATER = records.BUCKET_S + 60  # past the bucket of any lease these tests take (10 s default)
LIVE_LEASE = 3 * records.BUCKET_S


def test_reap_deletes_exactly_the_expired_and_idle_rows(no_ttl, holds, later, requests_sent):
    for i in range(3):
        expired_hold(holds, f"dead:{i}")
    expired_hold(holds, "dead:counting", limit=3)
    with semaphore("idle:1"):
        pass
    live = take(holds, "live:1", lease=LIVE_LEASE)
    live_counting = take(holds, "live:counting", limit=2, lease=LIVE_LEASE)
    # One holder of this one died, the other lives on: the row stays.
    live_and_dead = take(holds, "mixed:1", limit=2, lease=LIVE_LEASE)
    expired_hold(holds, "mixed:1", limit=2)
    make_job_rows()

    later(REAP_LATER)  # every 1 s lease ended, and its expires bucket passed
    requests_sent.reset()
    out = run("dynasem_reap")

    assert "Deleted 5 expired rows." in out
    assert requests_sent.calls["Scan"] == 0
    assert requests_sent.calls["Query"] >= records.SHARDS
    for pk in ["dead:0", "dead:1", "dead:2", "dead:counting", "idle:1"]:
        assert row(pk) is None, pk
    assert [h.token for h in holds_on("live:1")] == [live.token]
    assert [h.token for h in holds_on("live:counting")] == [live_counting.token]
    assert live_and_dead.token in [h.token for h in holds_on("mixed:1")]
    assert row("job:done", records.JOB_SK)["status"] == "DONE"
    assert row("job:failed", records.JOB_SK)["status"] == "FAILED"
    assert "broken" in row("job:failed", records.JOB_SK)["error"]
    assert row("dead:0", records.JOB_SK)["status"] == "DONE"

    # The live holds are still ours; a second reap finds nothing.
    live.renew()
    live_counting.renew()
    live_and_dead.renew()
    assert "Deleted 0 expired rows." in run("dynasem_reap")


def test_reap_keeps_rows_whose_lease_ended_within_clock_skew(no_ttl, holds, later):
    expired_hold(holds, "recent:1")
    later(0)
    # Just ended (or not even): within CLOCK_SKEW another host may still think it holds.
    assert "Deleted 0 expired rows." in run("dynasem_reap")
    assert row("recent:1") is not None


def test_the_soaks_final_reap_finds_a_hold_that_died_in_a_bucket_still_running(no_ttl, holds):
    """The soaks' stuck-lock check (benchmarks/soak.py): a hold whose holder died in the
    run's last minutes has an expires bucket that has not ended when the run does; the reap
    then, at the real time, does not list it (CI's unkind soak counted two such rows as stuck
    locks), run as the soak runs it, a bucket later, it deletes it."""
    from benchmarks import soak

    to_bucket_end = records.bucket_of(clock.now_ms()) - time.time()
    if to_bucket_end < 10:  # so that the hold's bucket still runs when the reap does
        time.sleep(to_bucket_end + 1)
    expired_hold(holds, "soak:late")
    time.sleep(1 + 0.5 + 1.0)  # its 1 s lease, CLOCK_SKEW, the cutoff's whole seconds
    assert row("soak:late")["expires"] * 1000 > clock.now_ms()  # its bucket still runs
    assert "Deleted 0 expired rows." in run("dynasem_reap")
    with soak.reaping_later():
        assert "Deleted 1 expired rows." in run("dynasem_reap")
    assert row("soak:late") is None
    assert clock.wall_clock is time.time


def test_reap_in_real_time(no_ttl, dynamodb_local, requests_sent, monkeypatch):
    # Buckets of 1 s, so that they pass in real time here.
    monkeypatch.setattr(table_stored, "BUCKET_S", 1)
    settings = dynasem_settings(dynamodb_local, no_ttl, CLOCK_SKEW=0.2)
    with override_settings(DYNASEM=settings):
        held = semaphore("real:dead", lease=0.5).acquire()
        abandon(held)
        with semaphore("real:idle") as idle:
            pass
        live = semaphore("real:live", lease=60).acquire()
        try:
            # Wait until the stored bucket (whole seconds, as the index has it) is more than
            # CLOCK_SKEW in the past.
            ends = max(row(r)["expires"] for r in ["real:dead", "real:idle"])
            while clock.now_ms() - 200 < (ends + 1) * 1000:
                time.sleep(0.05)
            requests_sent.reset()
            out = run("dynasem_reap")
            assert "Deleted 2 expired rows." in out
            assert requests_sent.calls["Scan"] == 0
            assert row("real:dead") is None
            assert row("real:idle") is None
            assert [h.token for h in holds_on("real:live")] == [live.token]
            # Fences keep increasing although the rows that stored them are gone.
            with semaphore("real:dead") as again, semaphore("real:idle") as idle_again:
                assert again.fence > held.fence
                assert idle_again.fence > idle.fence
        finally:
            live.release()


def test_reap_dry_run_deletes_nothing(no_ttl, holds, later):
    expired_hold(holds, "dry:1")
    expired_hold(holds, "dry:2")
    with semaphore("dry:idle"):
        pass
    take(holds, "dry:live", lease=LIVE_LEASE)
    make_job_rows()
    later(REAP_LATER)
    out = run("dynasem_reap", "--dry-run")
    assert "Would delete 3 expired rows." in out
    listed = sorted(line.split()[0] for line in out.splitlines() if "(lease ended by" in line)
    assert listed == ["dry:1", "dry:2", "dry:idle"]  # what it would delete, by name
    *rows, totals = json_lines(run("dynasem_reap", "--dry-run", "--json"))
    assert sorted(r["resource"] for r in rows) == listed
    assert totals == {
        "dry_run": True,
        "found": 3,
        "deleted": 0,
        "changed_since_listed": 0,
        "kept": 0,
        "permits_freed": 0,
        "permits_kept": 0,
        "failed": 0,
    }
    for pk in ["dry:1", "dry:2", "dry:idle", "dry:live"]:
        assert row(pk) is not None, pk
    for pk in ["job:done", "job:failed", "dead:0"]:
        assert row(pk, records.JOB_SK) is not None, pk
    assert "Deleted 3 expired rows." in run("dynasem_reap")


def test_reap_verbosity_2_shows_progress(no_ttl, holds, later):
    for i in range(3):
        expired_hold(holds, f"progress:{i}")
    later(REAP_LATER)
    quiet = run("dynasem_reap", "--dry-run", verbosity=1)
    assert "deleted," not in quiet
    out = run("dynasem_reap", verbosity=2)
    assert "3 deleted, 0 survived" in out
    assert "Deleted 3 expired rows." in out


def test_reap_spares_a_row_reacquired_between_read_and_delete(no_ttl, holds, later):
    expired_hold(holds, "race:1")
    expired_hold(holds, "race:2")
    later(REAP_LATER)
    retaken: list[Any] = []

    def retake_first(params: dict[str, Any], **kwargs: Any) -> None:
        # Runs after reap read its candidates, just before its first DeleteItem is sent.
        if not retaken:
            pk = params["Key"]["pk"]["S"]
            retaken.append(take(holds, pk))

    clients = [
        dynamodb.get_client(),
        dynamodb.get_client(quick=True),
    ]  # the reap's is the quick one
    for client in clients:
        client.meta.events.register("before-parameter-build.dynamodb.DeleteItem", retake_first)
    try:
        out = run("dynasem_reap", "--workers", "1")
    finally:
        for client in clients:
            client.meta.events.unregister(
                "before-parameter-build.dynamodb.DeleteItem", retake_first
            )

    (held,) = retaken
    assert "Deleted 1 expired rows." in out
    assert "1 row changed since the index listed it and was kept" in out
    assert [h.token for h in holds_on(held.resource)] == [held.token]
    other = ({"race:1", "race:2"} - {held.resource}).pop()
    assert row(other) is None
    held.renew()  # still ours
    held.release()
    assert holds_on(held.resource) == []


def test_delete_expired_spares_a_row_whose_lease_was_extended(lock_table, holds):
    held = take(holds, "cond:1")
    cutoff = clock.now_ms()  # read "before" the holder's lease was taken/extended
    assert lock_rows.delete_expired("cond:1", cutoff) is False
    assert [h.token for h in holds_on("cond:1")] == [held.token]
    ends = row("cond:1")["expMs"]
    assert lock_rows.delete_expired("cond:1", ends + 1) is False  # its bucket not passed
    assert lock_rows.delete_expired("cond:1", records.bucket_of(ends) * 1000 + 1000) is True
    assert row("cond:1") is None


def test_reap_workers_must_be_positive(lock_table):
    with pytest.raises(CommandError, match="--workers"):
        run("dynasem_reap", "--workers", "0")


# ---------------------------------------------------------------------------------------------
# dynasem_locks
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def listed(no_ttl: str, holds: list[Any]) -> dict[str, Any]:
    taken = {
        "alpha:1": take(holds, "alpha:1", user="alice", lease=60),
        "alpha:2": take(holds, "alpha:2", user="bob", lease=60),
        "beta:1": take(holds, "beta:1", user="alice", lease=60),
    }
    with semaphore("gone:1", user="alice"):
        pass
    expired_hold(holds, "alpha:dead", user="alice")
    return taken


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_locks_lists_active_holds(listed, later):
    later(3)  # the 1 s lease of alpha:dead has ended; the 60 s ones have not
    out = run("dynasem_locks")
    lines = out.splitlines()
    assert "RESOURCE" in lines[0]
    assert len(lines) == 1 + len(listed)
    for resource, held in listed.items():
        (line,) = [line for line in lines if line.startswith(resource + " ")]
        user, fence = line.split()[1], line.split()[-1]
        assert user == held.user_id
        assert fence == str(held.fence)
    assert "gone:1" not in out
    assert "alpha:dead" not in out


def test_locks_all_includes_expired_holds(listed, later):
    later(3)
    resources = {h["resource"] for h in json_lines(run("dynasem_locks", "--all", "--json"))}
    assert resources == set(listed) | {"alpha:dead"}


def test_locks_json_lines(listed, later):
    later(3)
    rows = json_lines(run("dynasem_locks", "--json"))
    got = {(r["resource"], r["user_id"], r["fence"], r["token"]) for r in rows}
    assert got == {(r, h.user_id, h.fence, h.token[:8]) for r, h in listed.items()}
    for r in rows:
        assert r["kind"] == "exclusive"
        assert r["expires"].startswith(listed[r["resource"]].expires.isoformat()[:16])


def test_locks_user_filter_queries_the_user_index(listed, requests_sent, later):
    later(3)
    requests_sent.reset()
    rows = json_lines(run("dynasem_locks", "--user", "alice", "--json"))
    assert {r["resource"] for r in rows} == {"alpha:1", "beta:1"}
    assert {r["user_id"] for r in rows} == {"alice"}
    # userId-index, plus the counting/shared rows of each expires-index shard (one holder
    # per row is all the userId index knows); listing everyone takes one Query per shard.
    # The indexes hold keys (and mode): the rows shown are read in one BatchGetItem.
    assert dict(requests_sent.calls) == {"Query": 1 + records.SHARDS, "BatchGetItem": 1}
    requests_sent.reset()
    run("dynasem_locks", "--json")
    assert requests_sent.calls["Query"] == records.SHARDS
    assert requests_sent.calls["Scan"] == 0


def test_locks_user_filter_with_no_holds(listed):
    assert run("dynasem_locks", "--user", "nobody") == "No active holds.\n"


def test_locks_user_filter_finds_every_holder_of_a_counting_resource(lock_table, holds):
    alice = take(holds, "pool:1", limit=2, user="alice", lease=60)
    bob = take(holds, "pool:1", limit=2, user="bob", lease=60)
    readers = [take(holds, "doc:1", shared=True, user=u, lease=60) for u in ("carol", "dave")]
    assert {h.user_id for h in holds_on("pool:1")} == {"alice", "bob"}
    for held in [alice, bob, *readers]:
        rows = json_lines(run("dynasem_locks", "--user", held.user_id, "--json"))
        assert [r["token"] for r in rows] == [held.token[:8]], held.user_id


def test_locks_resource_prefix(listed, later):
    later(3)
    rows = json_lines(run("dynasem_locks", "--resource-prefix", "alpha:", "--json"))
    assert {r["resource"] for r in rows} == {"alpha:1", "alpha:2"}
    assert run("dynasem_locks", "--resource-prefix", "zeta") == "No active holds.\n"


def test_locks_shows_every_holder_of_counting_and_shared_resources(lock_table, holds):
    a = take(holds, "slots:1", limit=2, user="u1")
    b = take(holds, "slots:1", limit=2, user="u2")
    c = take(holds, "read:1", shared=True, user="u3")
    rows = json_lines(run("dynasem_locks", "--json"))
    assert {(r["resource"], r["token"], r["kind"]) for r in rows} == {
        ("slots:1", a.token[:8], "slot of 2"),
        ("slots:1", b.token[:8], "slot of 2"),
        ("read:1", c.token[:8], "shared"),
    }


def test_locks_empty_table(lock_table):
    assert run("dynasem_locks") == "No active holds.\n"
    assert run("dynasem_locks", "--json") == ""


def test_locks_waiters_lists_the_line_first_come_first(lock_table, holds):
    take(holds, "line:1", user="alice")
    now = clock.now_ms()
    enqueue_entry("line:1", "tok-bob", records.Waiter(0, now + 30_000, user_id="bob"))
    enqueue_entry("line:1", "tok-dead", records.Waiter(0, now - 60_000, user_id="dead"))
    reader = records.Waiter(0, now + 30_000, user_id="carol", shared=True, address="h@10.0.0.2:9")
    enqueue_entry("line:1", "tok-carol", reader)
    out = run("dynasem_locks", "--waiters", "line:1").splitlines()
    assert out[0].split() == ["#", "USER", "KIND", "ENTRY", "EXPIRES", "(UTC)", "PUSH", "TOKEN"]
    assert [line.split()[:3] for line in out[1:]] == [
        ["1", "bob", "exclusive"],
        ["2", "carol", "shared"],
    ]  # the dead entry is nobody's turn
    lines = [
        json.loads(x) for x in run("dynasem_locks", "--waiters", "line:1", "--json").splitlines()
    ]
    assert [(x["position"], x["user_id"], x["push"]) for x in lines] == [
        (1, "bob", False),
        (2, "carol", True),
    ]
    assert run("dynasem_locks", "--waiters", "line:none") == "Nobody is waiting for 'line:none'.\n"
    with pytest.raises(CommandError, match="--waiters"):
        run("dynasem_locks", "--waiters", "")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--user", "alice"), "--user"),
        (("--resource-prefix", "line:"), "--resource-prefix"),
        (("--all",), "--all"),
    ],
)
def test_locks_waiters_refuses_the_filters_of_a_list_of_holds(lock_table, holds, flags, named):
    # --waiters lists one queue: a filter of holds beside it was silently ignored, the
    # operator reading an unfiltered line as the filtered one they asked for.
    take(holds, "line:2", user="alice")
    enqueue_entry("line:2", "tok-bob", records.Waiter(0, clock.now_ms() + 30_000, user_id="bob"))
    with pytest.raises(CommandError, match=f"--waiters 'line:2' and {named} do not go together"):
        run("dynasem_locks", "--waiters", "line:2", *flags)


def test_locks_an_empty_user_is_refused_not_every_hold(lock_table, holds):
    take(holds, "line:3", user="alice")
    for args in (("--user", ""), ("line:3", "--user", ""), ("--waiters", "line:3", "--user", "")):
        with pytest.raises(CommandError, match="--user: empty"):
            run("dynasem_locks", *args)


# ---------------------------------------------------------------------------------------------
# dynasem_release
# ---------------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    """A stdin that says it is a terminal, with the operator's answer typed in."""

    def isatty(self) -> bool:
        return True


def test_release_yes_breaks_every_hold(lock_table, holds):
    held = take(holds, "rel:1", user="alice")
    out = run("dynasem_release", "rel:1", "--yes")
    assert "Broke 1 hold(s)" in out
    assert "alice" in out
    assert holds_on("rel:1") == []
    with pytest.raises(LockLost):
        held.renew()
    # Free again for anyone.
    with semaphore("rel:1", wait=0):
        pass


def test_release_breaks_every_shared_holder(lock_table, holds):
    readers = [take(holds, "rel:shared", shared=True, user=f"r{i}") for i in range(3)]
    out = run("dynasem_release", "rel:shared", "--yes")
    assert "Broke 3 hold(s)" in out
    assert holds_on("rel:shared") == []
    for held in readers:
        with pytest.raises(LockLost):
            held.renew()


BROKEN_LOOKS_RELEASED = (
    "force_release sets lastToken to the broken token, so the holder's own release takes the "
    "break for its earlier release whose response was lost, and does not raise LockLost"
)


def test_release_makes_the_holders_release_raise_lock_lost(lock_table, holds):
    held = take(holds, "rel:lost")
    run("dynasem_release", "rel:lost", "--yes")
    assert holds_on("rel:lost") == []
    with pytest.raises(LockLost):
        held.release()


def test_release_makes_the_holders_block_raise_lock_lost(lock_table):
    with pytest.raises(LockLost), semaphore("rel:block"):
        run("dynasem_release", "rel:block", "--yes")


def test_release_token_makes_that_holders_release_raise_lock_lost(lock_table, holds):
    first = take(holds, "rel:pool", limit=2)
    second = take(holds, "rel:pool", limit=2)
    run("dynasem_release", "rel:pool", "--token", first.token, "--yes")
    try:
        with pytest.raises(LockLost):
            first.release()
    finally:
        second.release()


def test_release_without_yes_and_without_a_terminal_breaks_nothing(lock_table, holds, monkeypatch):
    held = take(holds, "rel:ask")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(CommandError, match="--yes"):
        run("dynasem_release", "rel:ask")
    assert [h.token for h in holds_on("rel:ask")] == [held.token]
    held.renew()
    held.release()


@pytest.mark.parametrize(("answer", "broken"), [("y\n", True), ("n\n", False), ("\n", False)])
def test_release_asks_on_a_terminal(lock_table, holds, monkeypatch, answer, broken):
    held = take(holds, "rel:tty")
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    if broken:
        out = run("dynasem_release", "rel:tty")
        assert "Broke 1 hold(s)" in out
        assert holds_on("rel:tty") == []
    else:
        with pytest.raises(CommandError, match="Nothing broken.") as refused:
            run("dynasem_release", "rel:tty")
        assert refused.value.returncode == 3
        assert [h.token for h in holds_on("rel:tty")] == [held.token]
        held.renew()


def test_release_token_breaks_only_that_hold(lock_table, holds):
    first = take(holds, "rel:pool", limit=2, user="u1")
    second = take(holds, "rel:pool", limit=2, user="u2")
    out = run("dynasem_release", "rel:pool", "--token", first.token, "--yes")
    assert "Broke 1 hold(s)" in out
    assert [h.token for h in holds_on("rel:pool")] == [second.token]
    with pytest.raises(LockLost):
        first.renew()
    second.renew()
    second.release()
    assert holds_on("rel:pool") == []


def test_a_break_spares_the_token_holding_again_under_a_later_fence(lock_table, holds):
    """The operator saw the hold of fence F; before the break, the same token was handed the
    lock again under a later fence (a waiter's token taken over and handed to it anew): the
    break of what was seen leaves that hold alone."""
    from dynasem._operators.locks import break_hold
    from dynasem._storage.lock_writes import update_action

    held = take(holds, "rel:again", lease=30)
    seen = holds_on("rel:again")[0]
    again = update_action(
        "rel:again",
        records.LOCK_SK,
        "SET #h.#t.#f = :f",
        "",
        {"#t": held.token},
        {":f": held.fence + 1},
    )
    lock_rows.update(again)
    assert not break_hold("rel:again", seen.token, fence=seen.fence)
    assert held.token in lock_rows.get("rel:again").holders
    assert break_hold("rel:again", seen.token, fence=seen.fence + 1)
    assert holds_on("rel:again") == []
    abandon(held)


@pytest.mark.parametrize("where", ["permit", "reader"])
def test_a_break_spares_an_item_holding_again_under_a_later_fence(
    lock_table, holds, monkeypatch, where
):
    """The same in a permit item and in a reader item: their breaks are by token, and were
    made whatever the fence the operator saw (the simulator's breaks mix: a reader listed,
    then admitted again with its token under a new fence, was broken by the stale break)."""
    from dynasem._operators.locks import break_hold
    from dynasem._storage import lock_writes, permit_items, reader_items
    from dynasem._storage.lock_writes import update_action

    monkeypatch.setattr(permit_items, "INLINE_MAX", 1)
    monkeypatch.setattr(lock_writes, "READERS_INLINE", 1)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 1)
    if where == "permit":
        held = take(holds, "rel:items", limit=3, lease=30)
        sk = records.permit_sk(held.slots["rel:items"])
    else:
        take(holds, "rel:items", shared=True, lease=30)  # (the row's own reader)
        held = take(holds, "rel:items", shared=True, lease=30)
        sk = records.reader_sk(held.token)
    (seen,) = [h for h in holds_on("rel:items") if h.token == held.token]
    assert seen.fence == held.fence
    lock_rows.update(update_action("rel:items", sk, "SET #f = :f", "", {}, {":f": seen.fence + 1}))
    assert not break_hold("rel:items", seen.token, fence=seen.fence)
    assert held.token in {h.token for h in holds_on("rel:items")}
    assert break_hold("rel:items", seen.token, fence=seen.fence + 1)
    assert held.token not in {h.token for h in holds_on("rel:items")}
    abandon(held)


def test_release_unknown_token_breaks_nothing(lock_table, holds):
    held = take(holds, "rel:tok")
    with pytest.raises(CommandError, match="No hold on 'rel:tok' with token") as nothing:
        run("dynasem_release", "rel:tok", "--token", "f" * 32, "--yes")
    assert nothing.value.returncode == 3
    assert [h.token for h in holds_on("rel:tok")] == [held.token]


def test_release_with_no_holds_exits_3(lock_table):
    with pytest.raises(CommandError, match="No hold on 'nothing:1': nothing broken.") as nothing:
        run("dynasem_release", "nothing:1", "--yes")
    assert nothing.value.returncode == 3


@pytest.mark.parametrize("flag", ["--noinput", "--no-input", "--yes"])
def test_release_takes_djangos_noinput(lock_table, holds, flag):
    take(holds, "rel:noinput")
    assert "Broke 1 hold(s)" in run("dynasem_release", "rel:noinput", flag)
    assert holds_on("rel:noinput") == []


def test_release_fence_breaks_only_that_hold_and_json_says_what_was_broken(lock_table, holds):
    first = take(holds, "rel:fence", limit=2, user="u1")
    second = take(holds, "rel:fence", limit=2, user="u2")
    out = run("dynasem_release", "rel:fence", "--fence", str(second.fence), "--yes", "--json")
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert (line["fence"], line["user_id"], line["broken"]) == (second.fence, "u2", True)
    assert [h.token for h in holds_on("rel:fence")] == [first.token]
    first.release()


def test_a_command_line_break_exits_0_and_a_shell_can_tell_3(lock_table, holds, tmp_path):
    # As a shell sees it: the exit status, not the text.
    import os
    import subprocess

    from django.conf import settings as django_settings

    take(holds, "rel:shell")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.support.settings")
    script = (
        "import sys, django; from django.conf import settings; "
        "from tests.support.helpers import dynasem_settings; "
        f"settings.DYNASEM = dynasem_settings({django_settings.DYNASEM['ENDPOINT_URL']!r}, "
        f"{lock_table!r}); django.setup(); "
        "from django.core.management import execute_from_command_line; "
        "execute_from_command_line(['manage.py', 'dynasem_release', *sys.argv[1:], '--noinput'])"
    )
    done = [
        subprocess.run(
            [sys.executable, "-c", script, "rel:shell"], env=env, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert [d.returncode for d in done] == [0, 3], [d.stderr for d in done]
    assert "nothing broken" in done[1].stderr


@pytest.mark.parametrize("resource", ["", "x" * 1025])
def test_release_bad_resource_is_a_command_error(lock_table, requests_sent, resource):
    requests_sent.reset()
    with pytest.raises(CommandError, match="resource"):
        run("dynasem_release", resource, "--yes")
    assert requests_sent.total == 0


@pytest.mark.django_db
def test_locks_shows_usernames_and_takes_one_for_user(lock_table, holds, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    held = take(holds, "named:1", user=alice, lease=60)
    assert held.user_id == str(alice.pk)
    (line,) = run("dynasem_locks", "--user", "alice").splitlines()[1:]
    assert line.split()[:2] == ["named:1", "alice"]
    (row,) = json_lines(run("dynasem_locks", "--user", "alice", "--json"))
    assert (row["user_id"], row["username"]) == (str(alice.pk), "alice")


def test_locks_pads_by_display_width(lock_table, holds):
    take(holds, "倉庫:在庫-1", user="担当者", lease=60)
    take(holds, "ascii:1", user="bob", lease=60)
    from dynasem.management.commands._output import width

    lines = run("dynasem_locks").splitlines()
    # Every column starts at the same display column on every line.
    starts = [width(line[: line.index(" exclusive ")]) for line in lines[1:]]
    assert len(set(starts)) == 1, lines
    assert width("倉庫") == 4 and width("é") == 1 and width("e\u0301") == 1


def test_locks_json_into_a_closed_pipe_ends_quietly(lock_table, holds, dynamodb_local):
    import os
    import subprocess

    for i in range(50):
        take(holds, f"pipe:{i}", lease=60)
    script = (
        "import sys, django; from django.conf import settings; "
        "from tests.support.helpers import dynasem_settings; "
        f"settings.DYNASEM = dynasem_settings({dynamodb_local!r}, {lock_table!r}); "
        "django.setup(); from django.core.management import execute_from_command_line; "
        "execute_from_command_line(['manage.py', 'dynasem_locks', '--json'])"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.support.settings")
    # The reader has gone before the first line is written (``| head -c 0``; ``| head -1``
    # does the same once its line is read, when the output outgrows the pipe's buffer).
    shell = f"{sys.executable} -c {script!r} | head -c 0"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", shell], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


@pytest.mark.django_db
def test_a_command_line_break_is_in_the_admins_history(lock_table, holds, django_user_model):
    import getpass

    from django.contrib.admin.models import LogEntry

    django_user_model.objects.create_user("ops")
    held = take(holds, "audit:1", user="worker-7", lease=60)
    with pytest.raises(CommandError, match="no Django user named 'nobody'"):
        run("dynasem_release", "audit:1", "--yes", "--log-as", "nobody")
    assert [h.token for h in holds_on("audit:1")] == [held.token]  # nothing broken
    run("dynasem_release", "audit:1", "--yes", "--log-as", "ops")
    (entry,) = LogEntry.objects.all()
    assert (entry.user.get_username(), entry.object_id) == ("ops", "audit:1")
    assert entry.change_message == (
        f"Broke the hold of worker-7 on audit:1 (fence {held.fence}) with manage.py "
        "dynasem_release."
    )
    # Without --log-as: the Django user named as this OS login, if there is one.
    django_user_model.objects.create_user(getpass.getuser())
    take(holds, "audit:2", lease=60)
    run("dynasem_release", "audit:2", "--yes")
    assert LogEntry.objects.latest("pk").user.get_username() == getpass.getuser()


@pytest.mark.django_db
def test_a_break_nobody_can_be_recorded_for_says_so(lock_table, holds):
    take(holds, "audit:3", lease=60)
    err = io.StringIO()
    call_command("dynasem_release", "audit:3", "--yes", stdout=io.StringIO(), stderr=err)
    assert "Not recorded in the admin's history: no --log-as, and no Django user" in err.getvalue()
    assert holds_on("audit:3") == []


# ---------------------------------------------------------------------------------------------
# dynasem_jobs
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_jobs_lists_and_resets_a_failed_key(lock_table, django_user_model):
    from django.contrib.admin.models import LogEntry

    from dynasem import run_once

    django_user_model.objects.create_user("ops")
    with run_once("import:1"):
        pass
    with pytest.raises(ValueError), run_once("import:2"):
        raise ValueError("bad header")
    running = run_once("import:3").claim()
    rows = {r["key"]: r for r in json_lines(run("dynasem_jobs", "--json"))}
    assert {k: r["status"] for k, r in rows.items()} == {
        "import:1": "DONE",
        "import:2": "FAILED",
        "import:3": "RUNNING",
    }
    assert "ValueError: bad header" in rows["import:2"]["error"]
    table_out = run("dynasem_jobs", "--status", "FAILED")
    assert "import:2" in table_out and "import:1" not in table_out
    out = run("dynasem_jobs", "--reset", "import:2", "--noinput", "--log-as", "ops")
    assert "Reset 'import:2' (was FAILED)" in out
    assert (
        json_lines(run("dynasem_jobs", "--key-prefix", "import:2", "--json"))[0]["status"] == "NEW"
    )
    (entry,) = LogEntry.objects.all()
    assert (entry.object_id, entry.user.get_username()) == ("import:2", "ops")
    for key, why in (("import:3", "is RUNNING"), ("import:9", "No run_once job")):
        with pytest.raises(CommandError, match=why) as nothing:
            run("dynasem_jobs", "--reset", key, "--yes")
        assert nothing.value.returncode == 3
    running._finish(None)


def test_createtable_json_says_what_it_did(lock_table):
    (facts,) = json_lines(run("dynasem_createtable", "--json"))
    assert (facts["table"], facts["created"], facts["ttl"]) == (lock_table, False, True)
    assert facts["format"] == records.FORMAT_VERSION
    assert facts["message"].startswith(f"Table {lock_table!r} already exists")
    (plan,) = json_lines(run("dynasem_createtable", "--dry-run", "--json"))
    assert plan["dry_run"] is True and plan["definition"]["TableName"] == lock_table


# ---------------------------------------------------------------------------------------------
# What the commands show: printable names, a token's first characters only
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def unchecked_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resources and users taken without the control-character check: rows as an older
    dynasem, or another writer with table access, could have stored them."""
    monkeypatch.setattr(
        arguments, "check_resources", lambda r: list(r) if isinstance(r, list) else [r]
    )
    monkeypatch.setattr(arguments, "check_printable", lambda value, what: value)


def test_locks_and_release_show_control_characters_escaped(lock_table, holds, unchecked_names):
    bad = "tbl_issues:1\x1b[2K\rbilling:7"
    take(holds, bad, user="mallory\x1b]0;owned\x07")
    for out in [
        run("dynasem_locks"),
        run("dynasem_locks", "--resource-prefix", "tbl_issues:"),
        run("dynasem_reap", "--dry-run"),
    ]:
        assert not any(c in out for c in "\x1b\r\x07"), out
    out = run("dynasem_locks")
    assert "tbl_issues:1\\x1b[2K\\rbilling:7" in out
    assert "mallory\\x1b]0;owned\\x07" in out
    (row,) = json_lines(run("dynasem_locks", "--json"))
    assert row["resource"] == bad  # JSON carries it exactly (escaped by JSON itself)


def test_a_release_of_a_resource_with_a_control_character_is_refused_naming_it(
    lock_table, requests_sent
):
    requests_sent.reset()
    with pytest.raises(CommandError, match=r"'a\\x1b\[2K' contains the control character"):
        run("dynasem_release", "a\x1b[2K", "--yes")
    with pytest.raises(CommandError, match="control character"):
        run("dynasem_locks", "--waiters", "a\x00")
    with pytest.raises(CommandError, match="control character"):
        run("dynasem_jobs", "--reset", "a\r", "--yes")
    assert requests_sent.total == 0


def test_the_commands_show_a_tokens_first_characters_only(lock_table, holds):
    held = take(holds, "tok:1", user="alice")
    enqueue_entry("tok:1", "w" * 32, records.Waiter(0, clock.now_ms() + 30_000, user_id="bob"))
    outputs = [
        run("dynasem_locks"),
        run("dynasem_locks", "--json"),
        run("dynasem_locks", "--waiters", "tok:1"),
        run("dynasem_locks", "--waiters", "tok:1", "--json"),
    ]
    for out in outputs:
        assert held.token not in out and "w" * 32 not in out, out
    (row,) = json_lines(outputs[1])
    assert row["token"] == held.token[:8]
    (waiter,) = json_lines(outputs[3])
    assert waiter["token"] == "w" * 8
    assert outputs[2].split()[-1] == "w" * 8
    out = run("dynasem_release", "tok:1", "--token", row["token"], "--yes", "--json")
    (broken,) = json_lines(out)
    assert (broken["token"], broken["broken"]) == (held.token[:8], True)
    assert held.token not in out
    assert holds_on("tok:1") == []


def test_release_takes_a_tokens_first_characters_and_refuses_one_naming_several(
    lock_table, holds, monkeypatch
):
    one = take(holds, "rel:prefix", limit=3, user="u1")
    out = run("dynasem_release", "rel:prefix", "--token", one.token[:8], "--yes")
    assert f"token={one.token[:8]}" in out and "Broke 1 hold(s)" in out
    assert holds_on("rel:prefix") == []
    # Two tokens that share their first 8 characters (rare: made so here).
    made = itertools.count(1)
    monkeypatch.setattr(core.uuid, "uuid4", lambda: uuid.UUID(f"c0ffee00{next(made):024x}"))
    first = take(holds, "rel:prefix", limit=3, user="u1")
    second = take(holds, "rel:prefix", limit=3, user="u2")
    assert (first.token[:8], second.token[:8]) == ("c0ffee00", "c0ffee00")
    with pytest.raises(CommandError, match=r"matches 2 holds.*--fence"):
        run("dynasem_release", "rel:prefix", "--token", "c0ffee00", "--yes")
    with pytest.raises(CommandError, match="--token"):
        run("dynasem_release", "rel:prefix", "--token", "", "--yes")
    assert len(holds_on("rel:prefix")) == 2
    # The whole token, or enough of it, still names its hold.
    run("dynasem_release", "rel:prefix", "--token", first.token, "--yes")
    run("dynasem_release", "rel:prefix", "--token", second.token[:-1], "--yes")
    assert holds_on("rel:prefix") == []


def test_jobs_show_a_failed_runs_control_characters_escaped(lock_table):
    with pytest.raises(RuntimeError), run_once("job:ansi"):
        raise RuntimeError("boom\x1b[2K\rall fine")
    out = run("dynasem_jobs")
    assert "\x1b" not in out and "\r" not in out
    assert "boom\\x1b[2K" in out  # the error's first line: up to the CR
    assert json_lines(run("dynasem_jobs", "--json"))[0]["error"].endswith("boom\x1b[2K\rall fine")
