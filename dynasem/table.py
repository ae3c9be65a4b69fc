"""Every DynamoDB request dynasem makes, and nothing else.

One item per resource (``pk`` = the resource, ``sk`` = ``"lock"``) holds a map ``holders`` of
token -> ``{u: user id, e: lease end in ms, f: fence, a: acquired at ms, s: shared}``, so an
exclusive, counting or shared hold is always one conditional write on one item. Item-level
``userId``/``expires`` (epoch seconds, TTL and both GSIs) and ``expMs`` describe the holder
whose lease ends last: TTL and the reaper may only ever remove an item nobody holds.

run_once rows live beside them under ``sk`` = ``"job"`` and carry no ``expires``: TTL and the
reaper never see them.

The builders below return the keyword arguments of one ``UpdateItem`` (usable alone or as one
action of a transaction); :func:`update` and :func:`transact` send them.
"""

from __future__ import annotations

import math
import os
import re
import socket
import threading
import zlib
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast, overload

import boto3
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
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

from .conf import FALLBACK_REGION, settings
from .exceptions import SemaphoreUnavailable, TableMissing

if TYPE_CHECKING:  # boto3-stubs[dynamodb], a development dependency only
    from mypy_boto3_dynamodb import DynamoDBClient

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
# Values
# ---------------------------------------------------------------------------------------------


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


def _encode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in values.items()}


def shard_of(pk: str) -> int:
    return zlib.crc32(pk.encode()) % SHARDS


def epoch_seconds(ms: int) -> int:
    # expires is whole seconds for TTL and the indexes; round up so it never reads earlier
    # than the lease really ends.
    return math.ceil(ms / 1000)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class Refused(Exception):
    """The write's condition failed; ``old`` is the item as it was (``ALL_OLD``), or None."""

    def __init__(self, old: dict[str, Any] | None, retried: bool = False):
        super().__init__("condition failed")
        self.old = old
        # botocore re-sent the request: an earlier attempt may have been applied.
        self.retried = retried


class Cancelled(Exception):
    """A transaction was cancelled; ``reasons[i]`` is ``(code, old item)`` for action i."""

    def __init__(self, reasons: list[tuple[str, dict[str, Any] | None]], retried: bool = False):
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
                (r.get("Code", "None"), decode(r.get("Item")))
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
# Lock writes (builders return UpdateItem kwargs without TableName)
# ---------------------------------------------------------------------------------------------

_LOCK_NAMES = {
    "#h": "holders",
    "#mode": "mode",
    "#lim": "limit",
    "#fence": "fence",
    "#uid": "userId",
    "#exp": "expires",
    "#expMs": "expMs",
    "#shard": "shard",
    "#last": "lastToken",
    "#q": "queue",
    "#next": "ticket",
    "#hold": "holdMs",
}


_PLACEHOLDER = re.compile(r"#\w+")


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _action(
    pk: str,
    sk: str,
    update: str,
    condition: str,
    names: dict[str, str],
    values: dict[str, Any],
) -> dict[str, Any]:
    # DynamoDB rejects names the expressions do not use: match whole placeholders only.
    tokens = set(_PLACEHOLDER.findall(update + " " + condition))
    used = {k: v for k, v in names.items() if k in tokens}
    action: dict[str, Any] = {
        "Key": _key(pk, sk),
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": used,
    }
    if values:
        action["ExpressionAttributeValues"] = _encode(values)
    return action


def holder_entry(
    user_id: str, expires_ms: int, fence: int, now_ms: int, shared: bool
) -> dict[str, Any]:
    return {"u": user_id, "e": expires_ms, "f": fence, "a": now_ms, "s": shared}


class QueueTerms:
    """How a take treats the resource's waiting queue (see core: nobody cuts in line).

    ``queued``: we are in the queue and leave it by this take. ``evict``: dead waiters (their
    lease end as seen) removed by this take. ``size``: for a taker not in the queue, the queue
    size it saw (a newcomer since then would be ahead of us); None when it saw no queue.
    """

    def __init__(
        self, queued: bool = False, evict: dict[str, int] | None = None, size: int | None = None
    ):
        self.queued, self.evict, self.size = queued, evict or {}, size


def _queue_clauses(
    token: str, terms: QueueTerms | None, names: dict[str, str], values: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """REMOVE paths and conditions for a take, per :class:`QueueTerms`."""
    terms = terms or QueueTerms()
    removes, conds = [], []
    names["#me"] = token
    if terms.queued:
        removes.append("#q.#me")
        conds.append("attribute_exists(#q.#me)")
    elif terms.size is None:
        conds.append("(attribute_not_exists(#q) OR size(#q) = :qsize)")
        values[":qsize"] = 0
    else:
        conds.append("size(#q) = :qsize")
        values[":qsize"] = terms.size
    for i, (gone, ends) in enumerate(sorted(terms.evict.items())):
        names[f"#w{i}"] = gone
        removes.append(f"#q.#w{i}")
        conds.append(f"#q.#w{i}.e = :we{i}")
        values[f":we{i}"] = ends
    return removes, conds


def take_free(
    resource: str,
    token: str,
    entry: dict[str, Any],
    *,
    mode: str,
    limit: int,
    stale_ms: int,
    queue: QueueTerms | None = None,
) -> dict[str, Any]:
    """Take a resource nobody holds (no item, no holders, or every lease long over).

    Replaces the holders map with ours alone; the fence condition keeps fences strictly
    increasing even when our clock is behind the previous holder's.
    """
    update = (
        "SET #h = :h, #mode = :mode, #lim = :lim, #fence = :fence, #uid = :uid, "
        "#exp = :exp, #expMs = :expMs, #shard = :shard"
    )
    condition = (
        "(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale) "
        "AND (attribute_not_exists(#fence) OR #fence < :fence)"
    )
    names = dict(_LOCK_NAMES)
    values: dict[str, Any] = {}
    removes, conds = _queue_clauses(token, queue, names, values)
    if removes:
        update += " REMOVE " + ", ".join(removes)
    else:
        update += ", #q = if_not_exists(#q, :emptyq)"  # later waiters join this map
        values[":emptyq"] = {}
    condition = " AND ".join([condition, *conds])
    values |= {
        ":h": {token: entry},
        ":mode": mode,
        ":lim": limit,
        ":fence": entry["f"],
        ":uid": entry["u"],
        ":exp": epoch_seconds(entry["e"]),
        ":expMs": entry["e"],
        ":shard": shard_of(resource),
        ":zero": 0,
        ":stale": stale_ms,
    }
    return _action(resource, LOCK_SK, update, condition, names, values)


def take_join(
    resource: str,
    token: str,
    entry: dict[str, Any],
    *,
    mode: str,
    limit: int,
    seen: dict[str, Any],
    evict: list[str],
    replace: bool = False,
    queue: QueueTerms | None = None,
) -> dict[str, Any]:
    """Join the holders of a counting or shared resource, evicting expired holders.

    Conditional on the item being exactly as ``seen`` (mode, limit, holder count, fence and
    the evicted holders' lease ends), so a concurrent change makes us look again instead of
    overfilling the semaphore. ``replace`` (every seen holder evicted) lets us set another
    mode and limit, as nobody is left to disagree.
    """
    names = dict(_LOCK_NAMES, **{"#t": token})
    values: dict[str, Any] = {
        ":entry": entry,
        ":fence": entry["f"],
        ":mode": mode,
        ":lim": limit,
        ":size": len(seen.get("holders") or {}),
        ":shard": shard_of(resource),
    }
    sets = ["#h.#t = :entry", "#fence = :fence", "#shard = :shard"]
    conds = ["size(#h) = :size", "#fence < :fence"]
    if replace:
        sets += ["#mode = :mode", "#lim = :lim"]
    else:
        conds += ["#mode = :mode", "#lim = :lim"]
    seen_expires = int(seen.get("expMs") or 0)
    if entry["e"] >= seen_expires:
        # Item-level expiry is the latest lease end of all holders: only ever pushed later,
        # so only over the very value we saw (a holder may have renewed since).
        sets += ["#uid = :uid", "#exp = :exp", "#expMs = :expMs"]
        conds.append("#expMs = :seenExp")
        values.update(
            {
                ":uid": entry["u"],
                ":exp": epoch_seconds(entry["e"]),
                ":expMs": entry["e"],
                ":seenExp": seen_expires,
            }
        )
    removes = []
    for i, gone in enumerate(evict):
        names[f"#x{i}"] = gone
        removes.append(f"#h.#x{i}")
        conds.append(f"#h.#x{i}.e = :xe{i}")
        values[f":xe{i}"] = seen["holders"][gone]["e"]
    q_removes, q_conds = _queue_clauses(token, queue, names, values)
    removes += q_removes
    conds += q_conds
    update = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    return _action(resource, LOCK_SK, update, " AND ".join(conds), names, values)


def take_room(
    resource: str, token: str, entry: dict[str, Any], *, mode: str, limit: int
) -> dict[str, Any]:
    """A counting or shared hold's first, blind try: join if there is room, same mode and
    limit, nobody queued, and our lease ends last (so it becomes the item's expiry). Anything
    else is refused and planned from the old item."""
    names = dict(_LOCK_NAMES, **{"#t": token})
    conds = [
        "attribute_exists(#h)",
        "#mode = :mode",
        "#lim = :lim",
        "#fence < :fence",
        "#expMs <= :expMs",
        "(attribute_not_exists(#q) OR size(#q) = :zero)",
    ]
    values: dict[str, Any] = {
        ":entry": entry,
        ":fence": entry["f"],
        ":mode": mode,
        ":lim": limit,
        ":uid": entry["u"],
        ":exp": epoch_seconds(entry["e"]),
        ":expMs": entry["e"],
        ":zero": 0,
    }
    if mode != "s":  # shared holds have no upper bound
        conds.insert(1, "size(#h) < :lim")
    update = "SET #h.#t = :entry, #fence = :fence, #uid = :uid, #exp = :exp, #expMs = :expMs"
    return _action(resource, LOCK_SK, update, " AND ".join(conds), names, values)


def renew_hold(resource: str, token: str, expires_ms: int, *, raise_item: bool) -> dict[str, Any]:
    """Push our lease end; conditional on our token still being among the holders.

    ``raise_item`` also pushes the item-level expiry, only ever later (another holder of a
    counting or shared resource may have a later one).
    """
    names = dict(_LOCK_NAMES, **{"#t": token})
    values: dict[str, Any] = {":e": expires_ms}
    update = "SET #h.#t.e = :e"
    condition = "attribute_exists(#h.#t)"
    if raise_item:
        update += ", #exp = :exp, #expMs = :e"
        condition += " AND #expMs <= :e"
        values[":exp"] = epoch_seconds(expires_ms)
    return _action(resource, LOCK_SK, update, condition, names, values)


def give_back(
    resource: str, token: str, now_ms: int, *, sole: bool, hold_ms: int | None = None
) -> dict[str, Any]:
    """Release our hold only; conditional on our token. ``lastToken`` remembers who released,
    so a retried release whose first response was lost is recognised as done."""
    names = dict(_LOCK_NAMES, **{"#t": token})
    values: dict[str, Any] = {":tok": token}
    update = "REMOVE #h.#t"
    sets = ["#last = :tok"]
    if sole:
        # The sole holder leaves: the item becomes idle now (out of the active listing, and
        # reapable) instead of at its old lease end. (``now_ms`` may be a little ahead of the
        # clock: see Held._give_back.)
        update += ", #uid"
        sets += ["#exp = :exp", "#expMs = :now"]
        values.update({":exp": epoch_seconds(now_ms), ":now": now_ms})
    if hold_ms is not None:
        sets.append("#hold = :hold")  # waiters estimate their turn from it
        values[":hold"] = hold_ms
    update += " SET " + ", ".join(sets)
    return _action(resource, LOCK_SK, update, "attribute_exists(#h.#t)", names, values)


def hand_over(
    resource: str,
    token: str,
    heir: str,
    ticket: int,
    entry: dict[str, Any],
    *,
    hold_ms: int,
) -> dict[str, Any]:
    """Release our exclusive hold straight to the first waiter, in the same write: it holds
    the lock from now, with ``entry`` (its user and lease, a fresh fence). Conditional on our
    token and on the heir still waiting with the ticket we saw."""
    names = dict(_LOCK_NAMES, **{"#t": token, "#n": heir})
    values = {
        ":entry": entry,
        ":fence": entry["f"],
        ":uid": entry["u"],
        ":exp": epoch_seconds(entry["e"]),
        ":expMs": entry["e"],
        ":tok": token,
        ":ticket": ticket,
        ":hold": hold_ms,
    }
    update = (
        "REMOVE #h.#t, #q.#n SET #h.#n = :entry, #fence = :fence, #uid = :uid, #exp = :exp, "
        "#expMs = :expMs, #last = :tok, #hold = :hold"
    )
    condition = "attribute_exists(#h.#t) AND #q.#n.t = :ticket AND #fence < :fence"
    return _action(resource, LOCK_SK, update, condition, names, values)


def enqueue(
    resource: str,
    token: str,
    waiter: dict[str, Any],
    *,
    fresh: bool,
    if_busy_ms: int | None = None,
) -> dict[str, Any]:
    """Join the resource's queue with a ticket (microseconds, only ever increasing).

    ``fresh``: the item has no queue map yet (or no item at all): create it with us alone.
    ``if_busy_ms``: only if it is held (item lease end at or after this) or others wait."""
    names = dict(_LOCK_NAMES, **{"#me": token})
    values: dict[str, Any] = {":ticket": waiter["t"]}
    if fresh:
        update = "SET #q = :q, #next = :ticket, #shard = :shard"
        condition = "attribute_not_exists(#q)"
        values.update({":q": {token: waiter}, ":shard": shard_of(resource)})
    else:
        update = "SET #q.#me = :w, #next = :ticket"
        condition = "attribute_exists(#q) AND (attribute_not_exists(#next) OR #next < :ticket)"
        values[":w"] = waiter
    if if_busy_ms is not None:
        condition += " AND ((size(#h) > :zero AND #expMs >= :busy) OR size(#q) > :zero)"
        values.update({":zero": 0, ":busy": if_busy_ms})
    return _action(resource, LOCK_SK, update, condition, names, values)


def dequeue(resource: str, token: str) -> dict[str, Any]:
    names = dict(_LOCK_NAMES, **{"#me": token})
    return _action(resource, LOCK_SK, "REMOVE #q.#me", "attribute_exists(#q.#me)", names, {})


def renew_waiter(resource: str, token: str, expires_ms: int) -> dict[str, Any]:
    names = dict(_LOCK_NAMES, **{"#me": token})
    return _action(
        resource,
        LOCK_SK,
        "SET #q.#me.e = :e",
        "attribute_exists(#q.#me)",
        names,
        {":e": expires_ms},
    )


def force_release(resource: str, token: str) -> dict[str, Any]:
    """An operator breaks one hold (admin, CLI): conditional on that token still holding.

    Unlike :func:`give_back` it leaves ``lastToken`` alone and records ``brokenToken``: the
    broken holder's own release must not mistake the break for its release."""
    names = dict(_LOCK_NAMES, **{"#t": token, "#broken": "brokenToken"})
    return _action(
        resource,
        LOCK_SK,
        "REMOVE #h.#t SET #broken = :tok",
        "attribute_exists(#h.#t)",
        names,
        {":tok": token},
    )


# ---------------------------------------------------------------------------------------------
# run_once writes
# ---------------------------------------------------------------------------------------------

_JOB_NAMES = {
    "#st": "status",
    "#tok": "token",
    "#uid": "userId",
    "#expMs": "expMs",
    "#fence": "fence",
    "#att": "attempt",
    "#err": "error",
    "#start": "startedMs",
    "#end": "finishedMs",
    "#last": "lastToken",
}


def job_claim(
    key: str, token: str, user_id: str, expires_ms: int, fence: int, now_ms: int, stale_ms: int
) -> dict[str, Any]:
    """NEW or FAILED (or RUNNING under a dead lease) -> RUNNING, in one conditional write."""
    update = (
        "SET #st = :running, #tok = :tok, #uid = :uid, #expMs = :expMs, #fence = :fence, "
        "#start = :now, #att = if_not_exists(#att, :zero) + :one REMOVE #end"
    )
    condition = (
        "(attribute_not_exists(#st) OR #st = :failed OR (#st = :running AND #expMs < :stale)) "
        "AND (attribute_not_exists(#fence) OR #fence < :fence)"
    )
    values = {
        ":running": RUNNING,
        ":failed": FAILED,
        ":tok": token,
        ":uid": user_id,
        ":expMs": expires_ms,
        ":fence": fence,
        ":now": now_ms,
        ":zero": 0,
        ":one": 1,
        ":stale": stale_ms,
    }
    return _action(key, JOB_SK, update, condition, _JOB_NAMES, values)


def job_renew(key: str, token: str, expires_ms: int) -> dict[str, Any]:
    return _action(
        key,
        JOB_SK,
        "SET #expMs = :e",
        "#tok = :tok AND #st = :running",
        _JOB_NAMES,
        {":e": expires_ms, ":tok": token, ":running": RUNNING},
    )


def job_finish(key: str, token: str, status: str, error: str | None, now_ms: int) -> dict[str, Any]:
    """RUNNING -> DONE/FAILED; the row loses its lease and never expires."""
    values: dict[str, Any] = {":st": status, ":tok": token, ":now": now_ms, ":running": RUNNING}
    update = "SET #st = :st, #end = :now, #last = :tok"
    if error is not None:
        update += ", #err = :err"
        values[":err"] = error[:4000]
        update += " REMOVE #tok, #expMs"
    else:
        update += " REMOVE #tok, #expMs, #err"
    return _action(key, JOB_SK, update, "#tok = :tok AND #st = :running", _JOB_NAMES, values)


def job_reset(key: str, status_seen: str, finished_ms: int | None, now_ms: int) -> dict[str, Any]:
    """An operator makes a DONE or FAILED job new again (the next run_once runs it), only if it
    still ended as the operator saw it (``status_seen`` at ``finished_ms``). Keeps the fence and
    the attempt count; records when it was reset."""
    names = {**_JOB_NAMES, "#end": "finishedMs", "#reset": "resetMs"}
    values: dict[str, Any] = {":seen": status_seen, ":now": now_ms}
    if finished_ms is None:
        condition = "#st = :seen AND attribute_not_exists(#end)"
    else:
        condition = "#st = :seen AND #end = :end"
        values[":end"] = finished_ms
    update = "REMOVE #st, #err, #end, #tok, #expMs SET #reset = :now"
    return _action(key, JOB_SK, update, condition, names, values)


# ---------------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------------


def update(action: dict[str, Any], *, return_new: bool = False) -> dict[str, Any] | None:
    """Send one conditional UpdateItem. Raises :class:`Refused` with the old item."""
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


def get(pk: str, sk: str = LOCK_SK) -> dict[str, Any] | None:
    """One strongly consistent read of a row (used only where no write can tell us)."""
    response = _send(
        "get_item", TableName=settings.TABLE_NAME, Key=_key(pk, sk), ConsistentRead=True
    )
    return decode(response.get("Item"))


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
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
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
        "ExpressionAttributeValues": _encode(values),
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
    return [decode(i) for i in response.get("Items", [])], response.get("LastEvaluatedKey")


def iter_expiring(shard: int, **kwargs: Any) -> Iterator[dict[str, Any]]:
    start = None
    while True:
        rows, start = query_expiring(shard, start=start, **kwargs)
        yield from rows
        if not start:
            return


def delete_expired(pk: str, sk: str, cutoff_ms: int) -> bool:
    """Delete a row only if its lease still ended before ``cutoff_ms``; False if it survived."""
    try:
        _send(
            "delete_item",
            TableName=settings.TABLE_NAME,
            Key=_key(pk, sk),
            ConditionExpression="#expMs < :cut",
            ExpressionAttributeNames={"#expMs": "expMs"},
            ExpressionAttributeValues=_encode({":cut": cutoff_ms}),
        )
    except Refused:
        return False
    return True


def query_user_page(
    user_id: str, since: int, limit: int | None, start: dict[str, Any] | None
) -> tuple[list[Any], dict[str, Any] | None]:
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
    return [decode(i) for i in response.get("Items", [])], response.get("LastEvaluatedKey")


def scan_jobs(
    prefix: str | None, status: str | None, start: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
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
    return [decode(i) for i in response.get("Items", [])], response.get("LastEvaluatedKey")


# ---------------------------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------------------------


def table_definition(name: str | None = None) -> dict[str, Any]:
    """CreateTable arguments: on-demand, a GSI on userId and a sharded GSI on expires."""
    return {
        "TableName": name or settings.TABLE_NAME,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "userId", "AttributeType": "S"},
            {"AttributeName": "expires", "AttributeType": "N"},
            {"AttributeName": "shard", "AttributeType": "N"},
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": USER_INDEX,
                "KeySchema": [
                    {"AttributeName": "userId", "KeyType": "HASH"},
                    {"AttributeName": "expires", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": EXPIRES_INDEX,
                "KeySchema": [
                    {"AttributeName": "shard", "KeyType": "HASH"},
                    {"AttributeName": "expires", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
    }


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
