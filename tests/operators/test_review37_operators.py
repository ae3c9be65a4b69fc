"""Review of what operators touch (seventh review): the commands' words and exit status, and
the tables they pass, when what they act on is not what they expect."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from dynasem._storage import dynamodb, records, schema
from tests.support.helpers import dynasem_settings, take


@pytest.fixture
def active_table(dynamodb_local: str) -> Iterator[str]:
    """A table made by dynasem_createtable --wait (ACTIVE), set as TABLE_NAME; dropped after."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        try:
            call_command("dynasem_createtable", "--wait", stdout=io.StringIO())
            yield name
        finally:
            try:
                dynamodb.get_client().delete_table(TableName=name)
            except Exception:
                pass


@pytest.mark.parametrize("check", [True, False], ids=["check", "createtable"])
def test_a_global_table_is_refused(active_table, monkeypatch, check):
    """The table was made a global table (a replica added in another region, as a DR plan
    does; DynamoDB Local has none, so DescribeTable's answer is given one here). Its default
    consistency is eventual: DynamoDB replicates a write to the other regions asynchronously,
    each region checks a condition against its own copy, and the last writer wins. A host whose
    REGION_NAME (or boto3 chain, or ENDPOINT_URL) names the other region takes a lock another
    host holds through the first: two holders, and their fences may cross. Before:
    ``dynasem_createtable --check`` said the table "holds stored format version 1, as this
    dynasem needs" and ``dynasem_createtable`` that it "already exists", both exit status 0."""
    described = schema.describe_table

    def with_a_replica() -> dict[str, Any] | None:
        table = described()
        assert table is not None
        replicas = [{"RegionName": "eu-west-1", "ReplicaStatus": "ACTIVE"}]
        return {**table, "Replicas": replicas, "GlobalTableVersion": "2019.11.21"}

    monkeypatch.setattr(schema, "describe_table", with_a_replica)
    out = io.StringIO()
    with pytest.raises(CommandError, match="global table") as refused:
        call_command("dynasem_createtable", *(["--check"] if check else []), stdout=out)
    assert "eu-west-1" in str(refused.value), str(refused.value)
    assert out.getvalue() == ""
    assert records.FORMAT_VERSION  # the table itself is dynasem's: only its replicas are refused


@pytest.fixture
def foreign_ttl_table(dynamodb_local: str) -> Iterator[str]:
    """A table with dynasem's key and indexes whose TTL is on another attribute (``ttl``, as
    a hand-made table's often is), set as TABLE_NAME; dropped afterwards."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        client = dynamodb.get_client()
        client.create_table(**records.table_definition(name))
        client.get_waiter("table_exists").wait(TableName=name)
        ttl = {"Enabled": True, "AttributeName": "ttl"}
        client.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)
        try:
            yield name
        finally:
            try:
                client.delete_table(TableName=name)
            except Exception:
                pass


@pytest.mark.parametrize("check", [True, False], ids=["check", "createtable"])
def test_a_table_whose_ttl_is_on_another_attribute_is_refused(foreign_ttl_table, check):
    """A table can have one TTL attribute. Before: on a table whose TTL was on ``ttl``,
    dynasem_createtable said "TTL is on for 'expires'" (it asked only whether TTL was on)
    and exited 0; nothing dynasem writes would ever expire (idle rows the reaper does not
    reach, queue entries, permit items, tombstones), and ``--check`` passed it too."""
    out = io.StringIO()
    with pytest.raises(CommandError, match="TTL on 'ttl', not 'expires'"):
        call_command("dynasem_createtable", *(["--check"] if check else []), stdout=out)
    assert "TTL is on for 'expires'" not in out.getvalue()
    ttl = dynamodb.get_client().describe_time_to_live(TableName=foreign_ttl_table)
    assert ttl["TimeToLiveDescription"]["AttributeName"] == "ttl"


@pytest.mark.django_db
def test_a_raising_lock_released_receiver_does_not_stop_a_release_or_its_record(
    lock_table, holds, django_user_model
):
    """A project's ``lock_released`` receiver raises (it writes to a database that is down,
    or reads a keyword the break does not pass). Before: ``dynasem_release`` of two holders
    broke the first, and the receiver's exception, raised from the break, ended the command
    with a traceback: the break it had made was in no LogEntry and not said, and the second
    hold was not tried. An operator's break is made when its write is: a receiver's failure
    is logged."""
    from django.contrib.admin.models import LogEntry

    from dynasem._operators.locks import holds_on
    from dynasem.signals import lock_released

    django_user_model.objects.create_user("ops")
    resource = "review37:receiver"
    for user in ("a", "b"):
        take(holds, resource, limit=2, user=user, lease=60)

    def receiver(**kwargs: Any) -> None:
        raise RuntimeError("the receiver's database is down")

    lock_released.connect(receiver, dispatch_uid="review37")
    try:
        out = io.StringIO()
        call_command(
            "dynasem_release", resource, "--yes", "--log-as", "ops", stdout=out, stderr=out
        )
    finally:
        lock_released.disconnect(dispatch_uid="review37")
    assert holds_on(resource) == []
    assert LogEntry.objects.count() == 2
    assert "Broke 2 hold(s)" in out.getvalue()


@pytest.mark.parametrize("ahead", [60, -60, 0])
def test_a_host_clock_off_dynamodbs_by_more_than_the_skew_is_a_check_error(
    lock_table, monkeypatch, ahead
):
    """This host's wall clock runs a minute ahead of (or behind) DynamoDB's: NTP stopped, a
    VM restored from a snapshot. Every lease it writes ends a minute late (or early) by the
    other hosts' clocks, far past ``CLOCK_SKEW`` (5 s): a host behind takes over holds that
    are still trusted elsewhere, and fences drawn on either side cross. Before: every system
    check passed (E014's GetItem answered with DynamoDB's ``Date``, which nobody read), and
    nothing said so until two holders met."""
    import time

    from django.core.checks import run_checks

    from dynasem import _clock as clock

    monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + ahead)
    found = [m for m in run_checks() if m.id in ("dynasem.E015", "dynasem.W002")]
    if ahead == 0:
        assert found == []
        return
    assert found, "a host a minute off DynamoDB's clock passed the checks"
    assert ("ahead of" if ahead > 0 else "behind") in found[0].msg, found[0].msg
    # DynamoDB Local's clock is no trusted reference: a Warning (W002), not AWS's Error.
    assert [m.id for m in found] == ["dynasem.W002"] and not found[0].is_serious()


def test_a_host_clock_off_aws_dynamodbs_is_an_error_another_engines_a_warning(monkeypatch):
    """Against AWS (``ENDPOINT_URL = None``) a host a minute off DynamoDB's clock is an Error
    (E015: it stops ``migrate``); against another engine (DynamoDB Local in a container whose
    clock drifts after a laptop sleeps) the engine's clock may be the one off: a Warning
    (W002), so that it never stops a project for nothing."""
    from django.core.checks import Error, Warning

    from dynasem import checks
    from dynasem._storage import schema
    from dynasem.conf import settings

    monkeypatch.setattr(schema, "format_check", lambda: (None, 60.0))  # AWS: never asked here
    monkeypatch.setattr(checks, "check_settings", lambda app_configs=None: [])
    for endpoint, kind, check_id in [
        (None, Error, "dynasem.E015"),
        ("http://127.0.0.1:8000", Warning, "dynasem.W002"),
    ]:
        monkeypatch.setattr(type(settings), "ENDPOINT_URL", endpoint, raising=False)
        found = checks.check_table_format()
        assert [(type(m), m.id) for m in found] == [(kind, check_id)], found


@pytest.mark.django_db
@pytest.mark.parametrize("answer", ["answered", "lost"])
def test_an_exclusive_break_whose_answer_was_lost_is_made_recorded_and_handed_on(
    lock_table, holds, django_user_model, answer
):
    """An operator breaks a stuck exclusive holder that a waiter queues behind; the break's
    UpdateItem is applied, its answer lost (the operators' client sends once). Before:
    ``dynasem_release`` stopped with "it may be broken all the same ... run it again", and
    run again said "No hold ... nothing broken" (exit status 3); the break was in no
    LogEntry, and nobody pushed the waiter, which slept until its own look, at the broken
    holder's lease end (30 s here). A reader's and a permit's break already tell their own
    applied break by its tombstone; an exclusive one is told by the row: its token gone,
    named as broken (``brokenToken``), and not as given back (``lastToken``)."""
    import threading
    import time

    from django.contrib.admin.models import LogEntry

    from dynasem import semaphore
    from dynasem.testing import abandon
    from tests.support.faults import Faults
    from tests.support.helpers import queue_of, wait_for

    django_user_model.objects.create_user("ops")
    resource = "review37:exclusive-lost"
    victim = take(holds, resource, lease=30)
    got: list[Any] = []

    def wait() -> None:
        try:
            got.append(semaphore(resource, lease=30, wait=8).acquire())
        except Exception as exc:
            got.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: queue_of(resource), 5, "the waiter's entry")
    out = io.StringIO()
    with Faults(dynamodb.get_client(quick=True)) as quick:
        lost = quick.lose_response("UpdateItem", 1 if answer == "lost" else 0)
        call_command(
            "dynasem_release", resource, "--yes", "--log-as", "ops", stdout=out, stderr=out
        )
    assert lost.fired == (answer == "lost")
    abandon(victim)
    broke = time.monotonic()
    waiter.join(10)
    took = time.monotonic() - broke
    (outcome,) = got
    if not isinstance(outcome, Exception):
        holds.append(outcome)
    assert "Broke 1 hold(s)" in out.getvalue()
    assert LogEntry.objects.count() == 1
    assert not isinstance(outcome, Exception) and took < 3, (outcome, took)
