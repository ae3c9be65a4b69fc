"""Review 36 (bad input and DynamoDB's limits), the operators' side: ``dynasem_createtable``
on a table whose key attributes are of another type than dynasem's."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from dynasem import SemaphoreUnavailable, semaphore
from dynasem._storage import dynamodb, records
from tests.support.helpers import dynasem_settings


@pytest.fixture
def expires_as_text(dynamodb_local: str) -> Iterator[str]:
    """A table made by hand with dynasem's keys and indexes, but ``expires`` (both indexes'
    sort key) defined as a string (S), not a number: set as TABLE_NAME; dropped after."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        definition = records.table_definition(name)
        for attribute in definition["AttributeDefinitions"]:
            if attribute["AttributeName"] == "expires":
                attribute["AttributeType"] = "S"
        dynamodb.get_client().create_table(**definition)
        try:
            yield name
        finally:
            dynamodb.get_client().delete_table(TableName=name)


@pytest.mark.parametrize("check", [False, True], ids=["create", "check"])
def test_a_table_whose_index_key_is_of_another_type_is_refused(expires_as_text, check):
    """Before: ``dynasem_createtable`` said "already exists ... holds stored format version
    1" (the format item has no index key, so its write was taken) and ``--check`` "as this
    dynasem needs", exit status 0; then every acquire failed with DynamoDB's "Type mismatch
    for Index Key"."""
    with pytest.raises(SemaphoreUnavailable, match="Type mismatch"), semaphore("x"):
        pass
    with pytest.raises(CommandError, match=r"the type of 'expires' \(S, not N\)"):
        call_command("dynasem_createtable", "--check" if check else "--wait", stdout=io.StringIO())
