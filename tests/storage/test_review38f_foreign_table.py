"""Review 38f: TABLE_NAME pointed at a table dynasem did not make, whose key is not
dynasem's (pk, sk), as an operator's first try with a table of another lock library would.
Every lock request was refused with DynamoDB's own words (DynamoDB Local: "The number of
conditions on the keys is invalid"; AWS: "The provided key element does not match the
schema"), naming neither the table nor what to do. It is now a ``TableMissing`` that says
the table's key is not dynasem's and to use a table made by ``dynasem_createtable``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.test import override_settings

from dynasem import TableMissing, run_once, semaphore
from dynasem._storage import dynamodb
from tests.support.helpers import dynasem_settings


@pytest.fixture
def foreign_table(dynamodb_local: str) -> Iterator[str]:
    name = f"t-foreign-{uuid.uuid4().hex[:8]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        client = dynamodb.get_client()
        client.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "LockID", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "LockID", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        try:
            yield name
        finally:
            client.delete_table(TableName=name)


def test_a_table_whose_key_is_not_dynasems_is_named_so(foreign_table: str) -> None:
    for take in (lambda: semaphore("tbl_issues:42", wait=0), lambda: run_once("file:a")):
        with pytest.raises(TableMissing) as refused, take():
            pass  # pragma: no cover - never entered
        said = str(refused.value)
        assert foreign_table in said and "key is not dynasem's" in said, said
        assert "dynasem_createtable" in said, said


def test_the_format_check_names_a_table_whose_key_is_not_dynasems(foreign_table: str) -> None:
    """dynasem.E014 asked the table for its format item, was refused for the key, and stayed
    silent as if the table could not be asked: ``manage.py check`` passed."""
    from dynasem.checks import check_table_format

    (error,) = check_table_format()
    assert error.id == "dynasem.E014"
    assert foreign_table in error.msg and "key is not dynasem's" in error.msg, error.msg
