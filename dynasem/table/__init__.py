"""Every DynamoDB request dynasem makes, and nothing else: the client, sending, errors, the
index queries and the table itself. The stored format is :mod:`dynasem.table.stored`, the
conditional writes' builders :mod:`dynasem.table.writes`; both are re-exported here, so the
rest of the app speaks to ``table`` only.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from ..conf import FALLBACK_REGION, settings
from ..exceptions import SemaphoreUnavailable, TableMissing
from .stored import (
    DONE,
    EXPIRES_INDEX,
    FAILED,
    JOB_SK,
    LOCK_SK,
    MAX_TRANSACTION,
    RUNNING,
    SHARDS,
    USER_INDEX,
    Holder,
    JobRow,
    LockItem,
    Waiter,
    decode,
    encode,
    epoch_seconds,
    expires_index_start,
    guessed_free,
    holder_value,
    index_position,
    job_row,
    job_start_key,
    key,
    lock_item,
    scan_position,
    scan_start,
    shard_of,
    table_definition,
    user_index_start,
)
from .writes import (
    QueueTerms,
    dequeue,
    enqueue,
    force_release,
    give_back,
    hand_over,
    holder_entry,
    job_claim,
    job_finish,
    job_renew,
    job_reset,
    renew_hold,
    renew_waiter,
    take_free,
    take_join,
    take_room,
)

__all__ = [
    "Holder",
    "LockItem",
    "Waiter",
    "guessed_free",
    "holder_value",
    "lock_item",
    "stored_item",
    "wire",
    "update_job",
    "user_index_start",
    "expires_index_start",
    "index_position",
    "scan_start",
    "scan_position",
    "JobRow",
    "job_row",
    "get_job",
    "job_start_key",
    "DONE",
    "EXPIRES_INDEX",
    "FAILED",
    "JOB_SK",
    "LOCK_SK",
    "MAX_TRANSACTION",
    "RUNNING",
    "SHARDS",
    "USER_INDEX",
    "Cancelled",
    "QueueTerms",
    "Refused",
    "create_table",
    "decode",
    "delete_expired",
    "delete_table",
    "dequeue",
    "describe_table",
    "enable_ttl",
    "endpoint_label",
    "enqueue",
    "epoch_seconds",
    "force_release",
    "get",
    "get_client",
    "give_back",
    "hand_over",
    "holder_entry",
    "iter_expiring",
    "job_claim",
    "job_finish",
    "job_renew",
    "job_reset",
    "process_identity",
    "query_expiring",
    "query_user_page",
    "renew_hold",
    "renew_waiter",
    "reset_client",
    "scan_jobs",
    "shard_of",
    "table_definition",
    "take_free",
    "take_join",
    "take_room",
    "transact",
    "ttl_status",
    "update",
    "wait_until_active",
]

if TYPE_CHECKING:  # boto3-stubs[dynamodb], a development dependency only
    from mypy_boto3_dynamodb import DynamoDBClient

_client: DynamoDBClient | None = None
_client_lock = threading.Lock()

TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "LimitExceededException",
        "TransactionInProgressException",
    }
)


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


def get_client() -> DynamoDBClient:
    """The process's one DynamoDB client, built on first use (clients are thread-safe)."""
    global _client
    client = _client
    if client is not None:
        return client
    with _client_lock:
        if _client is None:
            session = boto3.session.Session()
            region = settings.REGION_NAME or session.region_name or FALLBACK_REGION
            _client = session.client(
                "dynamodb",
                endpoint_url=settings.ENDPOINT_URL,
                region_name=region,
                config=Config(
                    # Transport errors and throttling are botocore's to retry; dynasem's own
                    # loop only waits for a busy lock. "legacy" mode uses DynamoDB's own
                    # schedule (50 ms, 100 ms): a heartbeat gets its retries in well inside a
                    # lease, where standard mode's random 1-2 s backoffs could outlast it.
                    retries={"mode": "legacy", "max_attempts": 3},
                    connect_timeout=3,
                    read_timeout=10,
                    max_pool_connections=32,
                    # Every request is built here from checked arguments; botocore's
                    # client-side walk over each parameter cost ~0.4 ms per request, and a
                    # malformed one is still refused by DynamoDB (ValidationException).
                    parameter_validation=False,
                ),
            )
        return _client


def reset_client() -> None:
    """Forget the cached client (settings changed, or we are a freshly forked child)."""
    global _client
    with _client_lock:
        _client = None


if hasattr(os, "register_at_fork"):
    # A forked child must not share the parent's connection pool.
    os.register_at_fork(after_in_child=lambda: globals().__setitem__("_client", None))


def endpoint_label() -> str:
    return settings.ENDPOINT_URL or f"AWS DynamoDB ({settings.REGION_NAME or 'default region'})"


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class Refused(Exception):
    """The write's condition failed; the row as it was (``ALL_OLD``) is ``lock`` (a lock
    write's) or ``job`` (a run_once write's)."""

    def __init__(self, old: dict[str, Any] | None, retried: bool = False):
        super().__init__("condition failed")
        self._old = old
        # botocore re-sent the request: an earlier attempt may have been applied.
        self.retried = retried

    @property
    def lock(self) -> LockItem | None:
        return lock_item(self._old)

    @property
    def job(self) -> JobRow:
        return job_row(self._old)


class Cancelled(Exception):
    """A transaction (of lock writes) was cancelled; ``reasons[i]`` is ``(code, old row)`` for
    action i."""

    def __init__(self, reasons: list[tuple[str, LockItem | None]], retried: bool = False):
        super().__init__("transaction cancelled: " + ", ".join(c for c, _ in reasons))
        self.reasons = reasons
        self.retried = retried


def _unavailable(exc: Exception) -> SemaphoreUnavailable:
    where = endpoint_label()
    table = settings.TABLE_NAME
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "")
        if code == "ResourceNotFoundException":
            return TableMissing(
                f"DynamoDB table {table!r} does not exist at {where} ({message}): "
                "run `manage.py dynasem_createtable`"
            )
        if code == "ValidationException" and "index" in message.lower():
            return TableMissing(
                f"DynamoDB table {table!r} at {where} lacks an index dynasem needs ({message}): "
                "run `manage.py dynasem_createtable` (or recreate the table)"
            )
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return SemaphoreUnavailable(
            f"DynamoDB at {where} refused the request: {code}: {message}",
            transient=code in TRANSIENT_CODES or status >= 500,
            # A 5xx may come after the write was applied; a throttled request never was.
            ambiguous=status >= 500,
        )
    if isinstance(exc, NoCredentialsError):
        return SemaphoreUnavailable(
            f"no AWS credentials for DynamoDB at {where}: boto3's default chain found none "
            "(environment, shared config, instance role)"
        )
    transient = isinstance(exc, BotoConnectionError | ReadTimeoutError)
    return SemaphoreUnavailable(
        f"cannot reach DynamoDB at {where}: {exc}",
        transient=transient,
        # Never connected: never applied. A timeout or a dropped connection: perhaps applied.
        ambiguous=transient and not isinstance(exc, EndpointConnectionError | ConnectTimeoutError),
    )


def _retried(exc: ClientError) -> bool:
    return exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0


def _send(operation: str, **kwargs: Any) -> dict[str, Any]:
    try:
        client = get_client()
    except ValueError as exc:  # botocore refuses the endpoint URL itself
        raise SemaphoreUnavailable(
            f"cannot build a DynamoDB client for {endpoint_label()!r}: {exc}"
        ) from exc
    try:
        # Every operation's response is a dict; which keys it has depends on the operation.
        response: dict[str, Any] = getattr(client, operation)(**kwargs)
        return response
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ConditionalCheckFailedException":
            # ReturnValuesOnConditionCheckFailure puts the item in the error response, a key
            # botocore-stubs' ClientError response does not list.
            item = cast("Mapping[str, Any] | None", exc.response.get("Item"))
            raise Refused(decode(item), _retried(exc)) from None
        if code == "TransactionCanceledException":
            reasons = [
                (r.get("Code", "None"), lock_item(decode(r.get("Item"))))
                for r in exc.response.get("CancellationReasons", [])
            ]
            if any(c == "ConditionalCheckFailed" for c, _ in reasons):
                raise Cancelled(reasons, _retried(exc)) from None
        raise _unavailable(exc) from exc
    except (BotoCoreError, OSError) as exc:
        raise _unavailable(exc) from exc
    except ValueError as exc:  # an endpoint URL botocore could not take apart
        raise SemaphoreUnavailable(f"bad DynamoDB endpoint {endpoint_label()!r}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------------


def update(action: dict[str, Any], *, return_new: bool = False) -> LockItem | None:
    """Send one conditional lock write. Raises :class:`Refused` with the old row."""
    return lock_item(_update(action, return_new))


def update_job(action: dict[str, Any], *, return_new: bool = False) -> JobRow | None:
    """Send one conditional run_once write. Raises :class:`Refused` with the old row."""
    row = _update(action, return_new)
    return None if row is None else job_row(row)


def _update(action: dict[str, Any], return_new: bool) -> dict[str, Any] | None:
    response = _send(
        "update_item",
        TableName=settings.TABLE_NAME,
        ReturnValues="ALL_NEW" if return_new else "NONE",
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
        **action,
    )
    return decode(response.get("Attributes")) if return_new else None


def transact(actions: list[dict[str, Any]]) -> None:
    """Send UpdateItem actions as one all-or-none transaction. Raises :class:`Cancelled`."""
    table = settings.TABLE_NAME
    items = [
        {"Update": dict(a, TableName=table, ReturnValuesOnConditionCheckFailure="ALL_OLD")}
        for a in actions
    ]
    _send("transact_write_items", TransactItems=items)


def get(resource: str) -> LockItem | None:
    """One strongly consistent read of a lock row (used only where no write can tell us)."""
    return lock_item(_get(resource, LOCK_SK))


def stored_item(pk: str, sk: str = LOCK_SK) -> dict[str, Any] | None:
    """A row exactly as stored, decoded to plain Python: for tests and diagnostics, which
    check the stored format itself. The app reads :func:`get` and :func:`get_job`."""
    return _get(pk, sk)


def _get(pk: str, sk: str) -> dict[str, Any] | None:
    response = _send(
        "get_item", TableName=settings.TABLE_NAME, Key=key(pk, sk), ConsistentRead=True
    )
    return decode(response.get("Item"))


def wire(item: LockItem) -> dict[str, Any]:
    """The row as a push carries it (JSON-safe); :func:`lock_item` reads it back."""
    return dict(item.stored)


# ---------------------------------------------------------------------------------------------
# Reading many rows through the indexes
# ---------------------------------------------------------------------------------------------


def query_expiring(
    shard: int,
    *,
    before: int | None = None,
    since: int | None = None,
    limit: int | None = None,
    start: dict[str, Any] | None = None,
    shared_only: bool = False,
) -> tuple[list[LockItem], dict[str, Any] | None]:
    """One page of rows of one shard of the expires index, by ``expires`` (epoch seconds)."""
    names = {"#shard": "shard", "#exp": "expires"}
    values: dict[str, Any] = {":s": shard}
    cond = "#shard = :s"
    if before is not None:
        cond += " AND #exp < :b"
        values[":b"] = before
    elif since is not None:
        cond += " AND #exp >= :a"
        values[":a"] = since
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "IndexName": EXPIRES_INDEX,
        "KeyConditionExpression": cond,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": encode(values),
    }
    if shared_only:
        # Counting and shared rows name only one of their holders in userId.
        kwargs["FilterExpression"] = "#mode <> :x"
        names["#mode"] = "mode"
        kwargs["ExpressionAttributeValues"][":x"] = {"S": "x"}
    if limit:
        kwargs["Limit"] = limit
    if start:
        kwargs["ExclusiveStartKey"] = start
    response = _send("query", **kwargs)
    return [lock_item(decode(i)) for i in response.get("Items", [])], response.get(
        "LastEvaluatedKey"
    )


def iter_expiring(shard: int, **kwargs: Any) -> Iterator[LockItem]:
    start = None
    while True:
        rows, start = query_expiring(shard, start=start, **kwargs)
        yield from rows
        if not start:
            return


def delete_expired(resource: str, cutoff_ms: int) -> bool:
    """Delete a lock row only if its lease still ended before ``cutoff_ms``; False if it
    survived."""
    try:
        _send(
            "delete_item",
            TableName=settings.TABLE_NAME,
            Key=key(resource, LOCK_SK),
            ConditionExpression="#expMs < :cut",
            ExpressionAttributeNames={"#expMs": "expMs"},
            ExpressionAttributeValues=encode({":cut": cutoff_ms}),
        )
    except Refused:
        return False
    return True


def query_user_page(
    user_id: str, since: int, limit: int | None, start: dict[str, Any] | None
) -> tuple[list[LockItem], dict[str, Any] | None]:
    """One page of the userId index: rows whose latest holder is ``user_id`` and whose lease
    ends at or after ``since`` (epoch seconds)."""
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "IndexName": USER_INDEX,
        "KeyConditionExpression": "#uid = :u AND #exp >= :a",
        "ExpressionAttributeNames": {"#uid": "userId", "#exp": "expires"},
        "ExpressionAttributeValues": {":u": {"S": user_id}, ":a": {"N": str(since)}},
    }
    if limit:
        kwargs["Limit"] = limit
    if start:
        kwargs["ExclusiveStartKey"] = start
    response = _send("query", **kwargs)
    return [lock_item(decode(i)) for i in response.get("Items", [])], response.get(
        "LastEvaluatedKey"
    )


def scan_jobs(
    prefix: str | None, status: str | None, start: dict[str, Any] | None
) -> tuple[list[JobRow], dict[str, Any] | None]:
    """One Scan page of run_once rows.

    A Scan, because job rows are in no index (they carry no ``expires``); it reads the lock
    rows too, 1 MB a request, which is acceptable for an admin page read by hand. ``status``
    "NEW" means never run or reset (no status stored)."""
    names = {"#sk": "sk"}
    values: dict[str, Any] = {":job": {"S": JOB_SK}}
    conditions = ["#sk = :job"]
    if prefix:
        names["#pk"] = "pk"
        values[":p"] = {"S": prefix}
        conditions.append("begins_with(#pk, :p)")
    if status == "NEW":
        names["#st"] = "status"
        conditions.append("attribute_not_exists(#st)")
    elif status:
        names["#st"] = "status"
        values[":st"] = {"S": status}
        conditions.append("#st = :st")
    kwargs: dict[str, Any] = {
        "TableName": settings.TABLE_NAME,
        "FilterExpression": " AND ".join(conditions),
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    if start:
        kwargs["ExclusiveStartKey"] = start
    response = _send("scan", **kwargs)
    return [job_row(decode(i)) for i in response.get("Items", [])], response.get("LastEvaluatedKey")


def get_job(pk: str) -> JobRow | None:
    """The run_once row of ``pk`` (one consistent read), or None if never run."""
    item = _get(pk, JOB_SK)
    return job_row(item) if item else None


# ---------------------------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------------------------


def describe_table() -> dict[str, Any] | None:
    try:
        description: dict[str, Any] = _send("describe_table", TableName=settings.TABLE_NAME)[
            "Table"
        ]
        return description
    except TableMissing:
        return None


def create_table(definition: dict[str, Any]) -> dict[str, Any]:
    description: dict[str, Any] = _send("create_table", **definition)["TableDescription"]
    return description


def wait_until_active(name: str) -> None:
    get_client().get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300}
    )


def ttl_status(name: str) -> str:
    try:
        desc = _send("describe_time_to_live", TableName=name)["TimeToLiveDescription"]
    except SemaphoreUnavailable:
        return "UNKNOWN"
    status: str = desc.get("TimeToLiveStatus", "DISABLED")
    return status


def enable_ttl(name: str) -> None:
    _send(
        "update_time_to_live",
        TableName=name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"},
    )


def delete_table(name: str) -> None:
    _send("delete_table", TableName=name)


def process_identity() -> str:
    """Who holds a lock when no Django user does: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"
