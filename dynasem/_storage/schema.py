"""The table itself: creating it, TTL, and bringing an older layout's indexes up to date."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import boto3
import botocore.session
from botocore.config import Config

from ..conf import settings
from ..exceptions import SemaphoreUnavailable, TableMissing
from . import dynamodb
from .dynamodb import get_client, region_of
from .records import OLD_INDEXES, index_definitions, old_layout, table_definition

# ---------------------------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------------------------


def describe_table() -> dict[str, Any] | None:
    try:
        description: dict[str, Any] = dynamodb.send_request(
            "describe_table", TableName=settings.TABLE_NAME
        )["Table"]
        return description
    except TableMissing:
        return None


def create_table(definition: dict[str, Any]) -> dict[str, Any]:
    description: dict[str, Any] = dynamodb.send_request("create_table", **definition)[
        "TableDescription"
    ]
    return description


def wait_until_active(name: str) -> None:
    get_client().get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300}
    )


def ttl_status(name: str) -> str:
    try:
        desc = dynamodb.send_request("describe_time_to_live", TableName=name)[
            "TimeToLiveDescription"
        ]
    except SemaphoreUnavailable:
        return "UNKNOWN"
    status: str = desc.get("TimeToLiveStatus", "DISABLED")
    return status


def enable_ttl(name: str) -> None:
    dynamodb.send_request(
        "update_time_to_live",
        TableName=name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"},
    )


def upgrade_indexes(
    name: str, *, say: Callable[[str], None], poll: float = 2.0, timeout: float = 3600.0
) -> list[str]:
    """Bring a table of an older layout to this version's indexes in place: add each index it
    lacks and wait until DynamoDB has filled it (the old ones keep serving meanwhile), then
    drop the old ones. One index per UpdateTable, as DynamoDB requires. Returns what it did.
    Locks keep working throughout: only listings and reaping use the indexes."""
    done: list[str] = []
    for definition in index_definitions():
        index = definition["IndexName"]
        status = _index_status(name).get(index)
        if status is not None:
            if status != "ACTIVE":
                # Added by an earlier run that stopped waiting: the old indexes stay until
                # this one serves, or listings and reaping would have neither.
                say(f"Waiting for index {index} ({status})...")
                _wait_for(name, functools.partial(_is_active, index), poll, timeout, index)
            continue
        say(f"Adding index {index} (DynamoDB fills it from the table's rows)...")
        dynamodb.send_request(
            "update_table",
            TableName=name,
            AttributeDefinitions=table_definition(name)["AttributeDefinitions"],
            GlobalSecondaryIndexUpdates=[{"Create": definition}],
        )
        _wait_for(name, functools.partial(_is_active, index), poll, timeout, f"{index} ACTIVE")
        done.append(f"added {index}")
    for index in OLD_INDEXES:
        if index not in _index_status(name):
            continue
        say(f"Dropping the old index {index}...")
        dynamodb.send_request(
            "update_table",
            TableName=name,
            GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": index}}],
        )
        _wait_for(name, functools.partial(_is_gone, index), poll, timeout, f"{index} gone")
        done.append(f"dropped {index}")
    return done


def _is_active(index: str, status: dict[str, str]) -> bool:
    return status.get(index) == "ACTIVE"


def _is_gone(index: str, status: dict[str, str]) -> bool:
    return index not in status


def _index_status(name: str) -> dict[str, str]:
    description = dynamodb.send_request("describe_table", TableName=name)["Table"]
    return {
        g["IndexName"]: str(g.get("IndexStatus", "ACTIVE"))
        for g in description.get("GlobalSecondaryIndexes", [])
    }


def _wait_for(
    name: str, ready: Callable[[dict[str, str]], bool], poll: float, timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while not ready(_index_status(name)):
        if time.monotonic() > deadline:
            raise SemaphoreUnavailable(f"table {name!r}: gave up waiting for {what}")
        time.sleep(poll)


def delete_table(name: str) -> None:
    dynamodb.send_request("delete_table", TableName=name)


def layout_warning() -> str | None:
    """What is wrong with the table's index layout, asked with one quick DescribeTable (no
    retries, short timeouts; DescribeTable costs no capacity), or None when it is right or
    the table cannot be asked about (another check or the first request says why)."""
    try:
        core = botocore.session.get_session()
        # Where credentials come from an instance role, look for them briefly: checks run on
        # every runserver, migrate and test, and must not wait on a metadata service.
        core.set_config_variable("metadata_service_timeout", 0.3)
        core.set_config_variable("metadata_service_num_attempts", 1)
        session = boto3.session.Session(botocore_session=core)
        client = session.client(
            "dynamodb",
            endpoint_url=settings.ENDPOINT_URL,
            region_name=region_of(session),
            config=Config(
                connect_timeout=1, read_timeout=2, retries={"max_attempts": 1, "mode": "standard"}
            ),
        )
        description = client.describe_table(TableName=settings.TABLE_NAME)["Table"]
    except Exception:  # unreachable, no credentials, no table, a bad setting: not ours to say
        return None
    return old_layout(description)
