"""The table itself: creating it and TTL."""

from __future__ import annotations

from typing import Any

from ..conf import settings
from ..exceptions import SemaphoreUnavailable, TableMissing
from . import dynamodb
from .dynamodb import get_client

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


def delete_table(name: str) -> None:
    dynamodb.send_request("delete_table", TableName=name)
