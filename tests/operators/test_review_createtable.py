"""Review of dynasem_createtable (review-1): what it says, and its exit status, when a step
fails on a table that is there and ACTIVE."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from dynasem._storage import dynamodb, lock_rows, records
from tests.support.faults import Faults
from tests.support.helpers import dynasem_settings


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


def test_createtable_that_cannot_write_the_format_version_into_an_active_table_fails(
    active_table,
):
    """The format item is missing (deleted, or never written) from an ACTIVE table, and its
    PutItem is refused for good (an IAM policy without dynamodb:PutItem: AccessDenied).
    dynasem_createtable says the version "could not be written yet ... run this again once
    the table is ACTIVE (or use --wait)" and exits 0: a deploy step goes on, and every
    process then fails its system check (dynasem.E014) with a table that is ACTIVE already."""
    dynamodb.get_client().delete_item(
        TableName=active_table, Key=records.key(records.FORMAT_PK, records.FORMAT_SK)
    )
    with Faults(dynamodb.get_client()) as faults:
        faults.refuse("PutItem", 10, code="AccessDeniedException")
        out = io.StringIO()
        try:
            call_command("dynasem_createtable", "--wait", stdout=out)
        except CommandError as exc:
            said = str(exc)
        else:
            pytest.fail(f"exit status 0: {out.getvalue()!r}")
    assert "AccessDenied" in said and "once the table is ACTIVE" not in said
    assert lock_rows.get_item(records.FORMAT_PK, records.FORMAT_SK) is None


@pytest.mark.parametrize(
    "version",
    [{"S": "two"}, {"N": "1.5"}, {"NULL": True}],
    ids=["text", "fraction", "null"],
)
def test_a_format_item_naming_no_whole_version_is_refused_clearly(active_table, version):
    """A format item whose ``version`` is no whole number (written by hand, or by another
    tool): the system check and ``--check`` must refuse the table, saying what it holds.
    Text crashed both with a bare ValueError (``int('two')``), a traceback instead of
    dynasem.E014; 1.5 was read as version 1 (``int(1.5)``) and the table accepted."""
    from django.core.checks import run_checks

    item = {**records.key(records.FORMAT_PK, records.FORMAT_SK), "version": version}
    dynamodb.get_client().put_item(TableName=active_table, Item=item)
    problems = [m for m in run_checks() if m.id == "dynasem.E014"]
    assert problems, "the table was accepted"
    with pytest.raises(CommandError, match="format"):
        call_command("dynasem_createtable", "--check", stdout=io.StringIO())


def test_createtable_racing_another_createtable_succeeds(active_table, monkeypatch):
    """Two deploy steps (containers starting side by side) run dynasem_createtable at once:
    both describe the table, find none, and send CreateTable; the second is refused with
    ResourceInUseException ("Table already exists"), and its command failed (exit status 1)
    where the table it asked for is there, made by dynasem_createtable. The same when one
    CreateTable's answer is lost and botocore sends it again. "Safe to run again" should
    hold for runs at the same time too: the loser goes on as "already exists"."""
    from dynasem._storage import schema

    real = schema.describe_table
    calls: list[int] = []

    def raced() -> dict | None:
        calls.append(1)
        return None if len(calls) == 1 else real()  # the other one created it meanwhile

    monkeypatch.setattr(schema, "describe_table", raced)
    out = io.StringIO()
    call_command("dynasem_createtable", "--wait", stdout=out)
    assert "stored format version 1" in out.getvalue()


def test_a_table_that_never_becomes_active_is_a_clear_error(active_table):
    """``dynasem_createtable --wait``: the table never becomes ACTIVE (DescribeTable refused
    for good, or the table deleted meanwhile). botocore's waiter raised its WaiterError, a
    traceback out of the command; it is SemaphoreUnavailable (the command's CommandError)
    naming the table and the cause."""
    from dynasem._storage import schema
    from dynasem.exceptions import SemaphoreUnavailable

    with Faults(dynamodb.get_client()) as faults:
        faults.refuse("DescribeTable", 1, code="AccessDeniedException")
        with pytest.raises(SemaphoreUnavailable, match=f"{active_table}.*did not become ACTIVE"):
            schema.wait_until_active(active_table)
