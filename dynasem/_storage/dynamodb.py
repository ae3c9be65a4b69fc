"""The DynamoDB client, sending a request, and what its errors mean to dynasem."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import botocore.session
from botocore import exceptions as boto_errors
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from .._observability import metrics, telemetry
from ..conf import FALLBACK_REGION, settings
from ..exceptions import LimitExceeded, Picklable, SemaphoreUnavailable, TableMissing
from .records import JobRow, LockItem, decode, job_row, key, lock_item, with_expressions

if TYPE_CHECKING:  # boto3-stubs[dynamodb], a development dependency only
    from mypy_boto3_dynamodb import DynamoDBClient

# The process's clients, by purpose (see get_client): built on first use (they are
# thread-safe), dropped when the settings change or the process forks.
_clients: dict[bool, DynamoDBClient] = {}
_client_lock = threading.Lock()
_client_pid = os.getpid()  # the process _clients (and _client_lock) are of
_models: Any = None  # botocore's loader of service models, shared (see new_session)
# Set while an operator waits on a page or a command (see quick()).
_quick: contextvars.ContextVar[bool] = contextvars.ContextVar("dynasem_quick", default=False)
# The sends of the request being made in this context (see count_send): botocore raises only
# its last attempt's transport error, which may be a "never sent" one after an earlier
# attempt that was applied and its answer lost.
_sends: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "dynasem_sends", default=None
)

# Transport errors of an attempt that never connected: never sent, never applied.
_UNSENT = (boto_errors.EndpointConnectionError, boto_errors.ConnectTimeoutError)

# DynamoDB's answers for a request over a throughput limit (LimitExceeded("throughput")).
THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
# The same, as a cancelled transaction's reasons (a provisioned table's; an on-demand one's).
THROTTLED_REASONS = frozenset({"ProvisionedThroughputExceeded", "ThrottlingError"})
# TransactionConflictException: a single write on an item that a transaction is writing
# (nothing was applied).
TRANSIENT_CODES = {"InternalServerError", "ServiceUnavailable", "LimitExceededException"}
TRANSIENT_CODES |= THROTTLED | {"TransactionInProgressException", "TransactionConflictException"}

# A transaction cancelled for one of these reasons, and for no other than these or "None" (an
# action that was not the cause), leaves its callers to plan again.
CANCELLED_REPLAN = frozenset({"ConditionalCheckFailed", "TransactionConflict"})
CANCELLED_RETRYABLE = CANCELLED_REPLAN | {"None"}

# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


def get_client(*, quick: bool = False) -> DynamoDBClient:
    """The process's DynamoDB client, built on first use (clients are thread-safe).

    ``quick``: the client of pages and commands an operator waits on (see :func:`quick`):
    one attempt, 1 s to connect, 2 s to answer. The locks' own requests (renewals above all)
    keep theirs: three attempts, 3 s and 10 s.

    A child forked by C code that runs none of Python's at-fork hooks (a uWSGI worker, unless
    ``py-call-osafterfork``) builds its own too: its parent's pooled connections are every
    such child's, and one could read another's answer."""
    if _client_pid != os.getpid():
        _after_fork()
    with _client_lock:
        if quick not in _clients:
            _clients[quick] = build_client(quick)
        return _clients[quick]


def new_session() -> botocore.session.Session:
    """A botocore session of its own (credentials, region and AWS config read now), with the
    service models this process has parsed already: parsing DynamoDB's is two thirds of what
    building a client costs (~0.1 s of CPU; a settings change, or each forked worker, builds
    one). The models are botocore's own data files, the same for every session."""
    global _models
    session = botocore.session.get_session()
    if _models is None:
        _models = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _models)
    return session


def build_client(quick: bool, session: botocore.session.Session | None = None) -> DynamoDBClient:
    """A DynamoDB client, quick or not (see :func:`get_client`), of ``session`` (default: a
    new one)."""
    session = session or new_session()
    # Not quick: transport errors and throttling are botocore's to retry; dynasem's own loop
    # only waits for a busy lock. "legacy" mode uses DynamoDB's own schedule (50 ms, 100 ms):
    # a heartbeat gets its retries in well inside a lease, where standard mode's random 1-2 s
    # backoffs could outlast it.
    attempts = {"total_max_attempts": 1} if quick else {"max_attempts": 3}
    client = session.create_client(
        "dynamodb",
        endpoint_url=settings.ENDPOINT_URL,
        region_name=region_of(session),
        config=Config(
            max_pool_connections=32,
            # Every request is built here from checked arguments; botocore's client-side
            # walk over each parameter cost ~0.4 ms per request, and a malformed one is
            # still refused by DynamoDB (ValidationException).
            parameter_validation=False,
            retries={"mode": "legacy", **attempts},  # type: ignore[arg-type]
            connect_timeout=1 if quick else 3,
            read_timeout=2 if quick else 10,
        ),
    )
    # Every attempt (botocore's retries too) creates its request anew: counted, so that a
    # transport error after a retry is known to follow an attempt that may have been applied.
    client.meta.events.register("request-created.dynamodb", count_send)
    # Less each attempt that never connected (refused, or its connection timed out): never
    # sent, never applied; a request whose every attempt failed so is not ambiguous.
    client.meta.events.register("needs-retry.dynamodb", _count_unconnected)
    return cast("DynamoDBClient", client)


def count_send(**kwargs: Any) -> None:
    sends = _sends.get()
    if sends is not None:
        sends[0] += 1
        sends[1] = 0


def count_unsent() -> None:
    """The attempt counted last never reached DynamoDB (it could not connect). botocore
    says so of every attempt but its last (no needs-retry event after that one)."""
    sends = _sends.get()
    if sends is not None and not sends[1]:
        sends[0] -= 1
        sends[1] = 1


def _count_unconnected(caught_exception: Exception | None = None, **kwargs: Any) -> None:
    if isinstance(caught_exception, _UNSENT):
        count_unsent()


@contextlib.contextmanager
def quick() -> Iterator[None]:
    """Requests sent inside go through the quick client (:func:`get_client`): an admin page
    or a command answers within ~2 s that DynamoDB is unavailable, where the locks' own
    client would keep it waiting up to 40 s on an endpoint that accepts and never answers."""
    token = _quick.set(True)
    try:
        yield
    finally:
        _quick.reset(token)


def region_of(session: botocore.session.Session) -> str:
    """The region a client of ``session`` talks to: the setting, else boto3's own."""
    region = settings.REGION_NAME or session.get_config_variable("region")
    return cast(str, region or FALLBACK_REGION)


def reset_client() -> None:
    """Forget the cached clients (settings changed). Under the lock: a client being built from
    the old settings meanwhile is forgotten too, never cached after the change."""
    with _client_lock:
        _clients.clear()


def _after_fork() -> None:
    # A forked child must not share the parent's connection pool, nor wait on a lock that a
    # thread of the parent held when it forked.
    global _client_lock, _client_pid
    _client_lock = threading.Lock()
    _clients.clear()
    _client_pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def endpoint_label() -> str:
    return settings.ENDPOINT_URL or f"AWS DynamoDB ({settings.REGION_NAME or 'default region'})"


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


# A refused write answers with the item as it was (Refused.item), at no extra read unit.
REFUSED_OLD: dict[str, Any] = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}


class Refused(Picklable, Exception):
    """The write's condition failed; the row as it was (``ALL_OLD``) is ``lock`` (a lock
    write's) or ``job`` (a run_once write's)."""

    def __init__(self, old: dict[str, Any] | None, retried: bool = False):
        super().__init__("condition failed")
        # The item as it was, decoded (any item's: a permit's, a next run's...).
        self.item = old
        # botocore re-sent the request: an earlier attempt may have been applied.
        self.retried = retried

    @functools.cached_property
    def lock(self) -> LockItem | None:
        return None if self.item is None else lock_item(self.item)  # decoded once

    @functools.cached_property
    def job(self) -> JobRow:
        return job_row(self.item)


class Cancelled(Picklable, Exception):
    """A transaction (of lock writes) was cancelled; ``reasons[i]`` is ``(code, old row)`` for
    action i."""

    def __init__(self, reasons: list[tuple[str, LockItem | None]], retried: bool = False):
        super().__init__("transaction cancelled: " + ", ".join(c for c, _ in reasons))
        self.reasons = reasons
        self.retried = retried


class WriteConflict(SemaphoreUnavailable):
    """A single write on an item that a transaction was writing at that moment
    (``TransactionConflictException``): nothing was applied, and it passes within
    milliseconds; send it again."""


# What DynamoDB says of a request whose key does not fit the table's key schema: a table
# dynasem did not make (AWS: "The provided key element does not match the schema"; DynamoDB
# Local: "The number of conditions on the keys is invalid"). dynasem's own keys always fit
# its tables: pk and sk, two non-empty strings.
FOREIGN_KEY = (
    "key element does not match the schema",
    "number of conditions on the keys is invalid",
)
FOREIGN_KEY_SAID = (
    "its key is not dynasem's (pk, sk): set TABLE_NAME to a table made by `manage.py "
    "dynasem_createtable` (its --check says what a table lacks)"
)


def _unavailable(exc: Exception, resent: bool = False) -> SemaphoreUnavailable:
    where, table = endpoint_label(), settings.TABLE_NAME
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "")
        if code == "ResourceNotFoundException":
            return TableMissing(
                f"DynamoDB table {table!r} does not exist at {where} ({message}): "
                "run `manage.py dynasem_createtable`"
            )
        # "The table does not have the specified index: NAME"; not any refusal that names an
        # index (a value an index key cannot take is the request's fault, not the table's).
        if code == "ValidationException" and "specified index" in message.lower():
            return TableMissing(
                f"DynamoDB table {table!r} at {where} lacks an index dynasem needs ({message}): "
                "run `manage.py dynasem_createtable` (or recreate the table)"
            )
        if code == "ValidationException" and any(w in message.lower() for w in FOREIGN_KEY):
            return TableMissing(
                f"DynamoDB table {table!r} at {where} is not a dynasem table ({message}): "
                + FOREIGN_KEY_SAID
            )
        limit = _limit_of(code, message, exc.response, _retried(exc))
        if limit is not None:
            return limit
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code == "TransactionConflictException":
            text = f"DynamoDB at {where} refused a write: {code}: {message}"
            return WriteConflict(text, transient=True, ambiguous=_retried(exc))
        text = f"DynamoDB at {where} refused the request: {code}: {message}"
        # A 5xx may come after the write was applied; a throttled request never was, but
        # botocore tells only the last attempt's error: an earlier one may have been applied
        # and its answer lost.
        ambiguous = status >= 500 or _retried(exc)
        transient = code in TRANSIENT_CODES or status >= 500
        return SemaphoreUnavailable(text, transient=transient, ambiguous=ambiguous)
    if isinstance(exc, NoCredentialsError):
        return SemaphoreUnavailable(
            f"no AWS credentials for DynamoDB at {where}: boto3's default chain found none "
            "(environment, shared config, instance role)"
        )
    # A connection closed before the answer (an HTTPClientError, not a ConnectionError) is
    # a dropped connection too: worth sending again, and the request may have been applied.
    transient = isinstance(
        exc,
        boto_errors.ConnectionError
        | boto_errors.ReadTimeoutError
        | boto_errors.ConnectionClosedError,
    )
    # Never connected: never applied. A timeout or a dropped connection: perhaps applied. And
    # after botocore's retries (``resent``), whatever the last attempt's error: an earlier
    # attempt may have been applied and its answer lost.
    unsent = isinstance(exc, _UNSENT)
    ambiguous = transient and (resent or not unsent)
    message = f"cannot reach DynamoDB at {where}: {exc}"
    return SemaphoreUnavailable(message, transient=transient, ambiguous=ambiguous)


def _limit_of(code: str, message: str, response: Any, retried: bool) -> LimitExceeded | None:
    """The DynamoDB limit a refusal is about, as a :class:`LimitExceeded` that names it; None
    when it is about no limit of DynamoDB's. ``retried``: botocore sent it more than once (an
    earlier attempt, answered with a 500 or not at all, may have been applied)."""
    where, table = endpoint_label(), settings.TABLE_NAME
    cancelled = code == "TransactionCanceledException"
    reasons = response.get("CancellationReasons", []) if cancelled else []
    text = " ".join([message] + [str(r.get("Message", "")) for r in reasons]).lower()
    if "item size" in text and "exceed" in text:
        return LimitExceeded(
            f"DynamoDB at {where} refused a write to table {table!r}: the item would exceed "
            f"DynamoDB's item size limit of 400 KB ({code}: {message}). Nothing was "
            "written. (A lock row keeps only a few holders: queued waiters, readers past the "
            "first two and the holders of more than 8 permits have items of their own.)",
            "item size",
        )
    if code in THROTTLED or any(r.get("Code") in THROTTLED_REASONS for r in reasons):
        return LimitExceeded(
            f"DynamoDB at {where} throttled requests to table {table!r} still after the "
            f"retries ({code}: {message}): the table's capacity, or one partition key's "
            "(1,000 write units and 3,000 read units a second: one resource's item), is used "
            "up. "
            + (
                "Its last attempt wrote nothing; an earlier one (botocore sent it again) may "
                "have been applied."
                if retried
                else "Nothing was written by the throttled request."
            ),
            "throughput",
            transient=True,
            ambiguous=retried,
        )
    transaction = (cancelled or code == "ValidationException") and "transaction" in text
    if transaction and ("size" in text or "limit" in text):
        return LimitExceeded(
            f"DynamoDB at {where} refused a transaction on table {table!r} for its limits "
            f"({code}: {message}). Nothing was written.",
            "transaction",
        )
    return None


def _retried(exc: ClientError) -> bool:
    return exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0


# The quick client sends once (an operator learns fast that DynamoDB is down), but a throttled
# request is sent again after these pauses: it was never applied, and throttling passes
# within a second, where one throttle of a busy table used to fail the page or the command.
QUICK_THROTTLE_PAUSES = (0.05, 0.1, 0.2)


def _call(
    client: Any, operation: str, kwargs: dict[str, Any], *, quick: bool, sends: list[int]
) -> Any:
    """``operation`` sent by botocore; ``sends[0]``: how often its last call sent it (a throttled
    call of the quick client's, sent again here, was never applied: not counted)."""
    for pause in QUICK_THROTTLE_PAUSES if quick else ():
        try:
            sends[0] = 0
            return getattr(client, operation)(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") not in THROTTLED:
                raise
        time.sleep(pause)
    sends[0] = 0
    return getattr(client, operation)(**kwargs)


def send_request(operation: str, **kwargs: Any) -> dict[str, Any]:
    try:
        client = get_client(quick=True) if _quick.get() else get_client()
    except ValueError as exc:  # botocore refuses the endpoint URL itself
        message = f"cannot build a DynamoDB client for {endpoint_label()!r}: {exc}"
        raise SemaphoreUnavailable(message) from exc
    if telemetry.ON:
        telemetry.ask_capacity(operation, kwargs)
    sends = [0, 0]  # attempts that may have reached DynamoDB; the last counted out already
    counting = _sends.set(sends)
    try:
        # Every operation's response is a dict; which keys it has depends on the operation.
        response: dict[str, Any] = _call(client, operation, kwargs, quick=_quick.get(), sends=sends)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if telemetry.ON:
            cancelled = exc.response.get("CancellationReasons", ())
            outcome = metrics.outcome_of_error(code, code in THROTTLED, cancelled)
            telemetry.request(operation, outcome, None)
        if code == "ConditionalCheckFailedException":
            # ReturnValuesOnConditionCheckFailure puts the item in the error response, a key
            # botocore-stubs' ClientError response does not list.
            item = cast("Mapping[str, Any] | None", exc.response.get("Item"))
            raise Refused(decode(item), _retried(exc)) from None
        if code == "TransactionCanceledException":
            reasons = [
                (r.get("Code", "None"), None if "Item" not in r else lock_item(decode(r["Item"])))
                for r in exc.response.get("CancellationReasons", [])
            ]
            codes = {c for c, _ in reasons}
            # A refused condition, or another request writing one of the items at that
            # moment (TransactionConflict, which DynamoDB itself never retries): nothing was
            # applied, and every caller plans again from the reasons.
            if codes & CANCELLED_REPLAN and codes <= CANCELLED_RETRYABLE:
                raise Cancelled(reasons, _retried(exc)) from None
        raise _unavailable(exc) from exc
    except (BotoCoreError, OSError) as exc:
        if telemetry.ON:
            telemetry.request(operation, "error", None)
        # ``sends``: the attempts that reached DynamoDB, or may have, and the last one (its
        # own error, raised, says whether it did) unless it was counted out already.
        raise _unavailable(exc, resent=sends[0] - (1 - sends[1]) > 0) from exc
    except ValueError as exc:  # an endpoint URL botocore could not take apart
        raise SemaphoreUnavailable(f"bad DynamoDB endpoint {endpoint_label()!r}: {exc}") from exc
    finally:
        _sends.reset(counting)
    if telemetry.ON:  # after the request's own error handling: it never turns into one
        telemetry.request(operation, "ok", response)
    return response


def send_to_table(
    operation: str, values: dict[str, Any] | None = None, **request: Any
) -> dict[str, Any]:
    """:func:`send_request` to the table, with the attribute names its expressions use and
    ``values`` (:func:`~dynasem._storage.records.with_expressions`)."""
    request = with_expressions(request, None, values)
    return send_request(operation, TableName=settings.TABLE_NAME, **request)


def page(
    operation: str, limit: int | None = None, start: Mapping[str, Any] | None = None, **request: Any
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """One page of a Query or Scan of the table: its items, decoded, and the key the next
    page starts after (None: this was the last). ``limit``: items a page; the rest as
    :func:`send_to_table` takes it."""
    if limit:
        request["Limit"] = limit
    if start:
        request["ExclusiveStartKey"] = start
    response = send_to_table(operation, **request)
    return [decode(item) for item in response.get("Items", [])], response.get("LastEvaluatedKey")


def prefix_pages(
    resource: str,
    prefix: str,
    *,
    consistent: bool,
    limit: int | None = None,
    after_sk: str | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The items under ``resource`` whose sort key begins with ``prefix`` (permits, reader
    items), decoded, one Query page at a time (``limit``: items a page; ``after_sk``: from
    the item after that sort key on)."""
    start = None if after_sk is None else key(resource, after_sk)
    values = {":pk": resource, ":pre": prefix}
    condition = "#pk = :pk AND begins_with(#sk, :pre)"
    while True:
        request = {"ConsistentRead": consistent, "KeyConditionExpression": condition}
        items, start = page("query", limit, start, values=values, **request)
        yield items
        if not start:
            return


def process_identity() -> str:
    """Who holds a lock when no Django user does: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"
