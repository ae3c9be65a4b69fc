"""The table itself: creating it, TTL, and the stored format version it holds."""

from __future__ import annotations

import email.utils
from typing import Any

from botocore.exceptions import ClientError, WaiterError

from .. import _clock as clock
from ..conf import settings
from ..exceptions import SemaphoreUnavailable, TableMissing
from . import dynamodb, lock_rows
from .dynamodb import REFUSED_OLD, Refused, get_client
from .records import FORMAT_PK, FORMAT_SK, FORMAT_VERSION, decode, format_item, format_version, key

# ---------------------------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------------------------


def describe_table() -> dict[str, Any] | None:
    try:
        return dict(dynamodb.send_to_table("describe_table")["Table"])
    except TableMissing:
        return None


def create_table(definition: dict[str, Any]) -> dict[str, Any] | None:
    """The table created, as described; None: a table of that name exists already (another
    dynasem_createtable made it meanwhile, or our own CreateTable, its answer lost and sent
    again by botocore)."""
    try:
        return dict(dynamodb.send_request("create_table", **definition)["TableDescription"])
    except SemaphoreUnavailable as exc:
        cause = exc.__cause__
        if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") == (
            "ResourceInUseException"
        ):
            return None
        raise


def wait_until_active(name: str) -> None:
    """Wait (5 minutes at most) until table ``name`` is ACTIVE; SemaphoreUnavailable if it
    never is (deleted meanwhile, DescribeTable refused, still creating)."""
    waiter = get_client().get_waiter("table_exists")
    try:
        waiter.wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    except WaiterError as exc:
        raise SemaphoreUnavailable(
            f"DynamoDB table {name!r} at {dynamodb.endpoint_label()} did not become ACTIVE: "
            f"{exc.last_response.get('Error', {}).get('Message') or exc}"
        ) from exc


def ttl_status(name: str) -> tuple[str, str | None]:
    """The table's TTL status and the attribute it is on (a table has one, or none)."""
    try:
        response = dynamodb.send_request("describe_time_to_live", TableName=name)
    except SemaphoreUnavailable:
        return "UNKNOWN", None
    ttl = response["TimeToLiveDescription"]
    return str(ttl.get("TimeToLiveStatus", "DISABLED")), ttl.get("AttributeName")


def enable_ttl(name: str) -> None:
    ttl = {"Enabled": True, "AttributeName": "expires"}
    dynamodb.send_request("update_time_to_live", TableName=name, TimeToLiveSpecification=ttl)


def delete_table(name: str) -> None:
    dynamodb.send_request("delete_table", TableName=name)


# ---------------------------------------------------------------------------------------------
# The stored format version
# ---------------------------------------------------------------------------------------------


def write_format() -> int | str:
    """Write this dynasem's format version into the table, unless it names one already (never
    over another version). Returns the version the table names now."""
    condition = "attribute_not_exists(pk)"
    try:
        dynamodb.send_to_table(
            "put_item", Item=format_item(), ConditionExpression=condition, **REFUSED_OLD
        )
    except Refused as refused:
        found = format_version(refused.item)
        return FORMAT_VERSION if found is None else found
    return FORMAT_VERSION


def stored_format() -> int | str | None:
    """The format version the table names (one consistent GetItem); None: it names none."""
    return format_version(lock_rows.get_item(FORMAT_PK, FORMAT_SK))


def format_problem(found: int | str | None) -> str | None:
    """What is wrong, for this dynasem, with a table that names format version ``found``
    (None: none; a str: no whole number, as :func:`~records.format_version` shows it): what
    the table has, what this dynasem needs, what to do. None: nothing."""
    if found == FORMAT_VERSION:
        return None
    name, needs = settings.TABLE_NAME, f"this dynasem reads and writes version {FORMAT_VERSION}"
    if isinstance(found, str):
        return (
            f"table {name!r} has a {FORMAT_PK!r} item whose version, {found}, is no format "
            f"version of dynasem's, and {needs}: it was written by something else; set "
            "TABLE_NAME to a table made by `manage.py dynasem_createtable`"
        )
    if found is None:
        return (
            f"table {name!r} names no stored format version (it has no {FORMAT_PK!r} item), "
            f"and {needs}: run `manage.py dynasem_createtable`, which writes it into a table "
            "with dynasem's indexes, or set TABLE_NAME to a new table"
        )
    return (
        f"table {name!r} holds stored format version {found}, and {needs}: deploy a dynasem "
        f"that reads version {found} (see 'Stored format and upgrades' in dynasem's docs), or "
        f"set TABLE_NAME to a table of version {FORMAT_VERSION}"
    )


def format_check() -> tuple[str | None, float | None]:
    """What is wrong with the table's stored format version, asked with one GetItem of the
    quick client (no retries, short timeouts) and no wait on a metadata service, or None when
    it is right or the table cannot be asked about (another check or the first request says
    why); and how far this host's wall clock is from DynamoDB's, by that answer's ``Date``
    (:func:`clock_offset`; None when it cannot tell)."""
    try:
        core = dynamodb.new_session()
        # Where credentials come from an instance role, look for them briefly: checks run on
        # every runserver, migrate and test, and must not wait on a metadata service.
        core.set_config_variable("metadata_service_timeout", 0.3)
        core.set_config_variable("metadata_service_num_attempts", 1)
        client = dynamodb.build_client(True, core)
        began = clock.monotonic()
        response = client.get_item(
            TableName=settings.TABLE_NAME, Key=key(FORMAT_PK, FORMAT_SK), ConsistentRead=True
        )
        # The wall clock as it is now (what leases go by from now on), the request's span
        # by the monotonic one: a clock stepped right while it was on its way (NTP) is
        # right, not as far off as it was at the send.
        answered = clock.wall_clock()
        sent = answered - (clock.monotonic() - began)
    except ClientError as exc:
        # A refusal of the format item's key: a table dynasem did not make, which no request
        # of dynasem's fits. Any other refusal is for another check or the first request.
        message = exc.response.get("Error", {}).get("Message", "")
        if any(words in message.lower() for words in dynamodb.FOREIGN_KEY):
            name = settings.TABLE_NAME
            return f"table {name!r} is not a dynasem table: {dynamodb.FOREIGN_KEY_SAID}", None
        return None, None
    except Exception:  # unreachable, no credentials, no table, a bad setting: not ours to say
        return None, None
    problem = format_problem(format_version(decode(response.get("Item"))))
    return problem, clock_offset(response, sent, answered)


def clock_offset(response: Any, sent: float, answered: float) -> float | None:
    """How far, at least, this host's wall clock was ahead of DynamoDB's (seconds; behind:
    negative; 0 where they may agree) while a request sent at ``sent`` was answered at
    ``answered`` (both this host's), from the answer's ``Date`` header: DynamoDB's time, cut to
    the second, somewhere between the two. None without one."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    try:
        server = email.utils.parsedate_to_datetime(headers["date"]).timestamp()
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    ahead, behind = sent - (server + 1), server - answered
    return ahead if ahead > 0 else -behind if behind > 0 else 0.0
