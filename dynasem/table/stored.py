"""The stored format: keys, attribute values, and the constants of the table's layout.

One item per resource (``pk`` = the resource, ``sk`` = ``"lock"``) holds a map ``holders`` of
token -> ``{u: user id, e: lease end in ms, f: fence, a: acquired at ms, s: shared}``, so an
exclusive, counting or shared hold is always one conditional write on one item. Item-level
``userId``/``expires`` (epoch seconds, TTL and both GSIs) and ``expMs`` describe the holder
whose lease ends last: TTL and the reaper may only ever remove an item nobody holds.

run_once rows live beside them under ``sk`` = ``"job"`` and carry no ``expires``: TTL and the
reaper never see them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, overload

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

LOCK_SK = "lock"
JOB_SK = "job"
USER_INDEX = "userId-index"
EXPIRES_INDEX = "expires-index"
# The expires index is partitioned by a shard number derived from the resource: one GSI
# partition-key value for every row would cap the whole table at one partition's write rate.
SHARDS = 8
# DynamoDB's limit on the actions of one TransactWriteItems.
MAX_TRANSACTION = 100

RUNNING, DONE, FAILED = "RUNNING", "DONE", "FAILED"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | set):
        return [_plain(v) for v in value]
    return value


@overload
def decode(item: None) -> None: ...
@overload
def decode(item: Mapping[str, Any]) -> dict[str, Any]: ...
@overload
def decode(item: Mapping[str, Any] | None) -> dict[str, Any] | None: ...


def decode(item: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A low-level item (``{"S": ...}``) as plain Python (ints, strs, dicts)."""
    if item is None:
        return None
    return {k: _plain(_deserializer.deserialize(v)) for k, v in item.items()}


def encode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in values.items()}


def shard_of(pk: str) -> int:
    return zlib.crc32(pk.encode()) % SHARDS


def epoch_seconds(ms: int) -> int:
    # expires is whole seconds for TTL and the indexes; round up so it never reads earlier
    # than the lease really ends.
    return math.ceil(ms / 1000)


@dataclass(frozen=True, slots=True)
class JobRow:
    """A run_once row as stored; an attribute the row lacks is None."""

    key: str | None
    status: str | None  # None: never run, or reset by an operator
    token: str | None  # the claim's
    user_id: str | None
    attempt: int | None
    fence: int | None
    expires_ms: int | None  # the claim's lease end, while RUNNING
    started_ms: int | None
    finished_ms: int | None
    reset_ms: int | None
    error: str | None
    last_token: str | None  # the claim that finished it


def job_row(item: Mapping[str, Any] | None) -> JobRow:
    """A decoded run_once row (or the nothing a missing one is) as a :class:`JobRow`."""
    item = item or {}

    def number(name: str) -> int | None:
        value = item.get(name)
        return None if value is None else int(value)

    def text(name: str) -> str | None:
        value = item.get(name)
        return None if value is None else str(value)

    return JobRow(
        key=text("pk"),
        status=text("status"),
        token=text("token"),
        user_id=text("userId"),
        attempt=number("attempt"),
        fence=number("fence"),
        expires_ms=number("expMs"),
        started_ms=number("startedMs"),
        finished_ms=number("finishedMs"),
        reset_ms=number("resetMs"),
        error=text("error"),
        last_token=text("lastToken"),
    )
