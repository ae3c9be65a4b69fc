"""The stored format: keys, attribute values, and the constants of the table's layout.

One item per resource (``pk`` = the resource, ``sk`` = ``"lock"``) holds a map ``holders`` of
token -> ``{u: user id, e: lease end in ms, f: fence, a: acquired at ms, s: shared, p: process}``,
so an exclusive, counting or shared hold is always one conditional write on one item. ``p``
(a queue entry has it too, for the hold a hand-over gives it) names the holding process on its
host (:mod:`dynasem._engine.processes`), so that a waiter on that host can prove it dead; it is
absent
where the holder could not be sure of its own view of ``/proc``. Item-level
``expMs`` is the latest lease end of its holders (what the reaper's condition reads) and
``userId`` the holder whose lease ends last (kept after its release: a re-take by the same
holder then moves no index key).

``expires`` (epoch seconds; TTL and both GSIs' sort key) is a coarse bucket: ``expMs``
rounded *up* to :data:`BUCKET_S`, so it never reads earlier than a lease really ends, and a
renewal, a release or a re-take within the bucket leaves every index key alone (AWS bills
an index write only when the row enters, leaves or moves in it, or a projected attribute
changes). The indexes project keys and ``mode`` only; listings read the rows they show from
the base table and decide from the exact lease ends there.

Waiters queue in items of their own, never in the row: a crowd of waiters never makes a write
to the row dearer, nor the row larger. ``ADD qin 1`` on the row draws a waiter's ticket
(1, 2, ...); its entry is an item under the resource's key, ``sk`` = ``q#<qbase>#<ticket>``
(:func:`entry_sk`), with its lease end, user, push address and process: no ``userId`` and no
``shard``, so it is in neither index; ``expires`` only for TTL. The row's ``qout`` says that
every ticket up to it has had its turn: a hand-over moves it to its heir's ticket, a waiter
that takes the lock by itself to its own, a take or release that saw every waiter between
dead or gone moves it past them. Nobody waits while ``qin`` = ``qout``: the uncontended lock's
writes read the two counters in their conditions and stay as cheap as ever. Entries are never
deleted on the way (only a waiter that gives up deletes its own): those below ``qout`` are
never read again, and TTL takes them. ``qbase`` (set with the first ticket) names the queue,
so that entries left from before a reap of the row are never read as its new queue's.

run_once rows live beside them under ``sk`` = ``"job"`` and carry no ``expires``: TTL and the
reaper never see them.

One more item, written with the table, names the stored format its rows are in
(``pk`` = :data:`FORMAT_PK`, ``sk`` = :data:`FORMAT_SK`, ``version``): in no index, never
expired. A later format is a new version, rolled out online as
``docs/explanation/stored-format.md`` says.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypeVar, overload

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from ..conf import settings

# The sort keys of a resource's lock row, run_once row and next-run registration.
LOCK_SK, JOB_SK, NEXT_SK = "lock", "job", "next"
# The format item's key, and the stored format this dynasem reads and writes.
FORMAT_PK, FORMAT_SK = "dynasem#format", "format"
FORMAT_VERSION = 1
# The protocol: which writes a lock operation sends, with which conditions, in which order.
# Bumped by every change to it (with or without a new stored format): benchmark results
# recorded under an older one (benchmarks/results/) no longer describe the code, and
# tests/project/test_figures.py says to run them again.
# 2: a hand-over's push carries the line after its heir, who hands over from it without a
# read of the queue while it is fresh (issue 43).
PROTOCOL_VERSION = 2
# Keys-only projections over a bucketed ``expires``.
USER_INDEX, EXPIRES_INDEX = "userId-index-v2", "expires-index-v2"
# The width of an ``expires`` bucket (seconds). Wider: fewer index moves for long holds;
# narrower: fewer idle rows (released this bucket) read and left out by a live listing.
BUCKET_S = 900
# The longest lease a hold may take (seconds): a week.
MAX_LEASE_S = 7 * 24 * 3600
# The expires index is partitioned by a shard number derived from the resource: one GSI
# partition-key value for every row would cap the whole table at one partition's write rate.
SHARDS = 8
# DynamoDB's limit on the actions of one TransactWriteItems.
MAX_TRANSACTION = 100

RUNNING, DONE, FAILED = "RUNNING", "DONE", "FAILED"

R = TypeVar("R")

_serializer, _deserializer = TypeSerializer(), TypeDeserializer()


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
    return {k: _value(v) for k, v in item.items()}


def _value(value: Any) -> Any:
    """One attribute's value as plain Python: what boto3's deserializer and :func:`_plain`
    give, read directly for the kinds dynasem stores (strings, integers, booleans, maps,
    lists), without their detour through ``Decimal`` (on every read: its CPU counts); anything
    else (sets, binary, NULL, a fraction) takes that detour."""
    if len(value) == 1:
        ((kind, raw),) = value.items()
        if kind == "S" or kind == "BOOL":
            return raw
        if (
            kind == "N"
            and raw.isascii()
            and (raw.isdigit() or raw[:1] == "-" and raw[1:].isdigit())
        ):
            return int(raw)
        if kind == "M":
            return {k: _value(v) for k, v in raw.items()}
        if kind == "L":
            return [_value(v) for v in raw]
    return _plain(_deserializer.deserialize(value))


def encode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in values.items()}


def shard_of(pk: str) -> int:
    return zlib.crc32(pk.encode()) % SHARDS


def epoch_seconds(ms: int) -> int:
    """Whole epoch seconds, rounded up (never earlier than ``ms``)."""
    return math.ceil(ms / 1000)


def bucket_of(ms: int) -> int:
    """The ``expires`` stored for a lease ending at ``ms``: rounded up to a bucket's end."""
    return math.ceil(ms / 1000 / BUCKET_S) * BUCKET_S


# ---------------------------------------------------------------------------------------------
# The records: a frozen dataclass per item kind, each field naming the attribute it is stored
# in. from_item and to_item are the only code that reads or writes an item's attributes.
# ---------------------------------------------------------------------------------------------


def stored_as(attribute: str, default: Any = None) -> Any:
    """A field kept in the item's ``attribute``; a missing attribute reads as ``default``."""
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata={"stored": attribute})
    return dataclasses.field(default=default, metadata={"stored": attribute})


_codecs: dict[type, tuple[tuple[str, str, Callable[[Any], Any]], ...]] = {}


def _codec(cls: type) -> tuple[tuple[str, str, Callable[[Any], Any]], ...]:
    """(field, attribute, converter) of each stored field of ``cls``."""
    if cls not in _codecs:
        hints = typing.get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls) if "stored" in f.metadata]
        _codecs[cls] = tuple(
            (f.name, f.metadata["stored"], _converter(hints[f.name])) for f in fields
        )
    return _codecs[cls]


def _converter(hint: Any) -> Callable[[Any], Any]:
    """What makes a decoded attribute's value a value of the field's type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType:  # optional: the type that is not None
        return _converter(next(a for a in args if a is not type(None)))
    if origin is tuple:
        return lambda value: tuple(args[0](x) for x in value)
    if origin is Mapping:  # a map of records (a row's holders)
        return lambda value: {k: from_item(args[1], v) for k, v in value.items()}
    converter: Callable[[Any], Any] = hint  # int, str, bool, Mode
    return converter


def from_item(cls: type[R], item: Mapping[str, Any], **given: Any) -> R:
    """A decoded item as a ``cls``: each stored field from its attribute (a missing one reads
    as the field's default), the others ``given``."""
    for name, attribute, convert in _codec(cls):
        value = item.get(attribute)
        if value is not None and name not in given:
            given[name] = convert(value)
    return cls(**given)


def to_item(record: Any) -> dict[str, Any]:
    """A record's stored fields as its item's attributes (plain Python); a None is left out."""
    values = ((a, getattr(record, name)) for name, a, _ in _codec(type(record)))
    return {attribute: value for attribute, value in values if value is not None}


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder of a lock row: whose hold, until when, under which fence."""

    user_id: str = stored_as("u", "")
    expires_ms: int = stored_as("e", 0)  # its lease end (wall clock, ms): what decides everything
    fence: int = stored_as("f", 0)
    acquired_ms: int = stored_as("a", 0)
    shared: bool = stored_as("s", False)
    # The holding process, as dynasem._engine.processes records it (None: not recorded).
    proc: str | None = stored_as("p")
    # A unique task's run that enqueued its retry: the token the retry's message carries,
    # which this hold becomes when the run ends (dynasem._background.unique; None: no retry).
    next_token: str | None = stored_as("n")


@dataclass(frozen=True, slots=True)
class Waiter:
    """One queue entry: an item of its own under the resource's key (``sk`` =
    :func:`entry_sk`)."""

    ticket: int = stored_as("t", 0)  # first come, first served: the smallest live ticket is next
    expires_ms: int = stored_as("e", 0)  # the entry's own lease end; a dead one may be evicted
    user_id: str = stored_as("u", "")
    shared: bool = stored_as("s", False)
    lease_ms: int | None = stored_as("l")  # the lease a hand-over grants it
    # Where a hand-over is pushed (wakeup's format), if anywhere.
    address: str | None = stored_as("n")
    # The waiting process: a hand-over records it in the holder entry.
    proc: str | None = stored_as("p")
    token: str = stored_as("k", "")  # whose entry
    since_ms: int | None = stored_as("a")  # when it queued (for listings)


class Mode(StrEnum):
    """How a resource is held: the row's ``mode``, stored as its one-letter value."""

    EXCLUSIVE = "x"
    COUNTING = "n"  # up to ``limit`` holders
    SHARED = "s"  # readers, any number of them


@dataclass(frozen=True, slots=True)
class LockItem:
    """A lock row as stored, decoded once. A missing attribute reads as its default; the
    acquire loop's guesses (\"free, with this fence\") are LockItems too."""

    resource: str = stored_as("pk", "")
    holders: Mapping[str, Holder] = stored_as("holders", {})
    fence: int = stored_as("fence", 0)  # the last fence handed out for the resource
    # The latest lease end of its holders (the row's own expiry).
    expires_ms: int = stored_as("expMs", 0)
    mode: Mode = stored_as("mode", Mode.EXCLUSIVE)
    limit: int = stored_as("limit", 1)
    # The queue of entry items: tickets 1, 2, ... handed out by ``ADD qin 1`` (queue_in);
    # every ticket up to ``queue_out`` has had its turn (or was passed: left, dead, or
    # skipped). Waiters wait while queue_in > queue_out. ``queue_id`` names this row's queue
    # (set with its first ticket), so that entries left from before a reap are never read as
    # this row's.
    queue_in: int = stored_as("qin", 0)
    queue_out: int = stored_as("qout", 0)
    queue_id: int = stored_as("qbase", 0)
    # Entry items read for this row (ticket order, from ``queue_out`` + 1 on), or None.
    # A read stops at the first live entry; ``entries_to`` is the last ticket it covered.
    entries: tuple[Waiter, ...] | None = None
    entries_to: int = 0
    entries_read_ms: int = 0  # when the read of ``entries`` was sent (our wall clock; 0: unknown)
    # The line after us, as the releaser that handed us this row read it (its push carries
    # it): entry items read without ConsistentRead at ``line_read`` (our monotonic clock),
    # for our own hand-over to go without a read while they are fresh (handover.heirs_of).
    line: tuple[Waiter, ...] = ()
    line_read: float = 0.0
    guessed: bool = False  # not read: a guess of the acquire loop (see guessed_free)
    # The average hold, for a waiter's estimate of its turn.
    hold_ms: int | None = stored_as("holdMs")
    last_token: str | None = stored_as("lastToken")  # who released last
    broken_token: str | None = stored_as("brokenToken")  # whose hold an operator broke last
    listed_s: int | None = stored_as("expires")  # where the row sorts in the indexes (epoch s)
    # A counting semaphore's row whose holders are in permit items (permit_items.py): the
    # slots ever used (None: holders in the row) and the slots given back lately.
    slots_used: int | None = stored_as("hw")
    hints: tuple[int, ...] = stored_as("hints", ())
    permits_read: bool = False  # ``holders`` were read from its permits (with_permits)
    # A listing read only some of the holders kept in items (``most``: with_permits,
    # with_readers): the sort key of the last one read; more are stored after it.
    holders_next: str | None = None
    # Readers in reader items (reader_items.py): counted in ``reader_count`` under the epoch
    # ``reader_epoch``, whose longest lease was ``reader_lease_ms``; the row's holder
    # ``readers`` stands for them all.
    reader_count: int = stored_as("rc", 0)
    reader_epoch: int = stored_as("repoch", 0)
    reader_lease_ms: int = stored_as("rlease", 0)
    # The epoch and token of the last reader admitted to an item
    # (reader_items.admission_mark): an admission sent again after its answer was lost is not
    # counted twice.
    last_reader: str | None = stored_as("rlast")
    # The decoded item itself, for a push (wakeup sends it as written); read it nowhere else.
    stored: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def waiting(self) -> bool:
        """Whether tickets are out that have not had their turn (live waiters, maybe)."""
        return self.queue_in > self.queue_out


def lock_item(item: Mapping[str, Any]) -> LockItem:
    """A decoded lock row (or a pushed one) as a :class:`LockItem`."""
    return from_item(LockItem, item, stored=item)


def guessed_free(fence: int) -> LockItem | None:
    """What a busy lock we did not read again is guessed to be: free, keeping the fence we
    saw (one write tells us otherwise). None when we saw no fence: nothing known."""
    return LockItem(fence=fence, guessed=True) if fence else None


def holder_value(holder: Holder) -> dict[str, Any]:
    """A holder entry as the row's ``holders`` map keeps it."""
    return to_item(holder)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """A row as an index lists it: its resource, its ``expires`` bucket (where it sorts) and
    its mode. The row itself is read from the base table."""

    resource: str = stored_as("pk", "")
    listed_s: int = stored_as("expires", 0)
    mode: Mode | None = stored_as("mode")


ENTRY_PREFIX = "q#"


def entry_sk(queue_id: int, ticket: int) -> str:
    """The sort key of a queue entry item: the row's queue, then the ticket (zero-padded, so
    the entries sort in ticket order under the resource's key, after ``job`` and ``lock``)."""
    return f"{ENTRY_PREFIX}{queue_id:020d}#{ticket:020d}"


def entry_item(resource: str, queue_id: int, waiter: Waiter) -> dict[str, Any]:
    """A queue entry as its own item (PutItem's ``Item``). It carries no ``userId`` or
    ``shard`` (so no index writes) and ``expires`` for TTL only: waiters that left or were
    served leave their entries behind, below the row's ``qout``, where nobody reads them."""
    attributes = to_item(waiter) | {"expires": ttl_of(waiter.expires_ms)}
    return {**key(resource, entry_sk(queue_id, waiter.ticket)), **encode(attributes)}


def ttl_of(expires_ms: int) -> int:
    """The ``expires`` (TTL only) of an item in no index: a bucket after its lease end."""
    return epoch_seconds(expires_ms) + BUCKET_S


@dataclass(frozen=True, slots=True)
class JobRow:
    """A run_once row as stored; an attribute the row lacks is None."""

    key: str | None = stored_as("pk")
    status: str | None = stored_as("status")  # None: never run, or reset by an operator
    token: str | None = stored_as("token")  # the claim's
    user_id: str | None = stored_as("userId")
    attempt: int | None = stored_as("attempt")
    fence: int | None = stored_as("fence")
    expires_ms: int | None = stored_as("expMs")  # the claim's lease end, while RUNNING
    started_ms: int | None = stored_as("startedMs")
    finished_ms: int | None = stored_as("finishedMs")
    reset_ms: int | None = stored_as("resetMs")
    error: str | None = stored_as("error")
    last_token: str | None = stored_as("lastToken")  # the claim that finished it


def job_row(item: Mapping[str, Any] | None) -> JobRow:
    """A decoded run_once row (or the nothing a missing one is) as a :class:`JobRow`."""
    return from_item(JobRow, item or {})


@dataclass(frozen=True, slots=True)
class NextRun:
    """A coalescing semaphore's registered next run (next_runs.py), ``sk`` = ``next``."""

    token: str = stored_as("k", "")
    user_id: str = stored_as("u", "")
    after_fence: int = stored_as("af", 0)  # the resource's fence when it registered
    until_ms: int = stored_as("un", 0)  # its lease end
    # TTL only: DynamoDB deletes an item days after it at the earliest.
    expires: int = stored_as("expires", 0)


def next_run_item(resource: str, run: NextRun) -> dict[str, Any]:
    """A next-run registration as its item (PutItem's ``Item``)."""
    return {**key(resource, NEXT_SK), **encode(to_item(run))}


# Permit items (permit_items.py) and reader items (reader_items.py).

PERMIT_PREFIX = "s#"


def permit_sk(slot: int) -> str:
    return f"{PERMIT_PREFIX}{slot:010d}"


@dataclass(frozen=True, slots=True)
class Permit:
    """One permit item: its slot, and its hold if it is held (``token`` empty: free). The
    holder's attributes are the item's own (``u``, ``e``, ``f``, ``a``, ``p``)."""

    slot: int
    holder: Holder
    token: str = stored_as("k", "")
    last_token: str | None = stored_as("lt")  # who gave it back last
    broken_token: str | None = stored_as("bt")  # whose hold an operator broke last

    def free_at(self, stale_ms: int) -> bool:
        """Free, or its holder's lease ended more than CLOCK_SKEW before (``stale_ms``)."""
        return not self.token or self.holder.expires_ms < stale_ms


def permit_of(item: Mapping[str, Any]) -> Permit:
    slot = int(str(item["sk"])[len(PERMIT_PREFIX) :])
    return from_item(Permit, item, slot=slot, holder=from_item(Holder, item))


READER_PREFIX = "r#"


def reader_sk(token: str) -> str:
    return f"{READER_PREFIX}{token}"


@dataclass(frozen=True, slots=True)
class Reader:
    """One reader item: its token, its hold (the item's own ``u``, ``e``, ``f``, ``a``,
    ``p``), and the epoch it was admitted under; or a broken reader's tombstone."""

    token: str
    holder: Holder
    epoch: int = stored_as("ep", 0)
    # Set on a tombstone: the token an operator (or the reaper) broke; no reader then.
    broken_token: str | None = stored_as("bt")
    # Set on a tombstone by a break: a word of that break's own, so that a break whose
    # answer was lost knows its own tombstone from another's (it counts the reader down).
    breaker: str | None = stored_as("bk")


def broken_by(item: Mapping[str, Any] | None, breaker: str) -> bool:
    """Whether ``item`` (decoded) is a tombstone written by the break whose word is
    ``breaker`` (a reader's or a permit's)."""
    return (item or {}).get("bk") == breaker


def reader_of(item: Mapping[str, Any]) -> Reader:
    holder = dataclasses.replace(from_item(Holder, item), shared=True)
    return from_item(Reader, item, token=str(item["sk"])[len(READER_PREFIX) :], holder=holder)


# The placeholders of the writes' expressions (lock_writes, job_writes, claims, next_runs,
# permit_items, reader_items) and the attributes they stand for: ``#`` and the attribute of
# every record's stored field, and the shorter (or other) placeholders below.
NAMES = {
    f"#{attribute}": attribute
    for record in (LockItem, Holder, Waiter, JobRow, NextRun, Permit, Reader)
    for _, attribute, _ in _codec(record)
} | {
    "#sk": "sk",
    "#shard": "shard",
    "#h": "holders",
    "#lim": "limit",
    "#uid": "userId",
    "#exp": "expires",
    "#hold": "holdMs",
    "#rep": "repoch",
    "#rl": "rlease",
    "#rla": "rlast",
    # The row's holder that stands for its reader items (reader_items.SENTINEL); not a
    # holder's ``s``, which no expression names.
    "#s": "readers",
}


_PLACEHOLDER = re.compile(r"#\w+")


def names_in(expression: str, given: Mapping[str, str] | None = None) -> dict[str, str]:
    """ExpressionAttributeNames for the placeholders ``expression`` uses (DynamoDB refuses
    one it does not use): ``given`` ones (a holder's token, say), else :data:`NAMES`'."""
    known = NAMES | dict(given or {})
    return {p: known[p] for p in dict.fromkeys(_PLACEHOLDER.findall(expression))}


def with_expressions(
    request: dict[str, Any], names: Mapping[str, str] | None, values: dict[str, Any] | None
) -> dict[str, Any]:
    """``request`` with the ExpressionAttributeNames of the placeholders its expressions use
    (``names``: those not in :data:`NAMES`), and ``values`` encoded as its
    ExpressionAttributeValues (none: no values)."""
    used = " ".join(text for k, text in request.items() if k.endswith("Expression"))
    if "#" in used:
        request["ExpressionAttributeNames"] = names_in(used, names)
    if values:
        request["ExpressionAttributeValues"] = encode(values)
    return request


# The keys of pages: where a listing goes on.


def user_index_start(resource: str, user_id: str, listed_s: int) -> dict[str, Any]:
    """The ExclusiveStartKey that goes on after ``resource``'s row in the userId index."""
    return {**key(resource, LOCK_SK), "userId": {"S": user_id}, "expires": {"N": str(listed_s)}}


def expires_index_start(resource: str, shard: int, listed_s: int) -> dict[str, Any]:
    """The ExclusiveStartKey that goes on after ``resource``'s row in one expires shard."""
    return {**key(resource, LOCK_SK), "shard": {"N": str(shard)}, "expires": {"N": str(listed_s)}}


def index_position(last_key: Mapping[str, Any]) -> list[Any]:
    """An index query's LastEvaluatedKey as ``[listed_s, resource]`` (a cursor's form)."""
    return [int(last_key["expires"]["N"]), str(last_key["pk"]["S"])]


# The ExclusiveStartKey that goes on after the item ``pk``, ``sk`` (a Scan cursor's form).
scan_start = key


def scan_position(last_key: Mapping[str, Any]) -> list[str]:
    """A Scan's LastEvaluatedKey as ``[pk, sk]`` (a cursor's form)."""
    return [str(last_key["pk"]["S"]), str(last_key["sk"]["S"])]


def job_start_key(start_key: str) -> dict[str, Any]:
    """The ExclusiveStartKey that goes on after the job row of ``start_key``."""
    return key(start_key, JOB_SK)


# The table itself.


def format_item(version: int = FORMAT_VERSION) -> dict[str, Any]:
    """The item that names the table's stored format (PutItem's ``Item``)."""
    return {**key(FORMAT_PK, FORMAT_SK), **encode({"version": version})}


def format_version(item: Mapping[str, Any] | None) -> int | str | None:
    """The version a decoded format item names; None: no item (or no version). A version that
    is no whole number (written by hand or by another tool: ``"two"``, ``1.5``) is returned
    as its repr, a version no dynasem has, never read as a number near it."""
    if item is None or item.get("version") is None:
        return None
    version = item["version"]
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    return repr(version)


def table_definition(name: str | None = None) -> dict[str, Any]:
    """CreateTable arguments: on-demand, a GSI on userId and a sharded GSI on expires."""
    kinds = {"pk": "S", "sk": "S", "userId": "S", "expires": "N", "shard": "N"}
    attributes = [{"AttributeName": a, "AttributeType": t} for a, t in kinds.items()]
    return {
        "TableName": name or settings.TABLE_NAME,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": attributes,
        "KeySchema": _key_schema("pk", "sk"),
        "GlobalSecondaryIndexes": list(index_definitions()),
    }


def index_definitions() -> tuple[dict[str, Any], dict[str, Any]]:
    """The two GSIs, on userId and (sharded) on expires, each projecting its keys and ``mode``
    (which changes only when a row changes kind): a listing picks the rows it needs from the
    index and reads only those from the base table."""
    projection = {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["mode"]}
    user_index = {"IndexName": USER_INDEX, "KeySchema": _key_schema("userId", "expires")}
    expires_index = {"IndexName": EXPIRES_INDEX, "KeySchema": _key_schema("shard", "expires")}
    return user_index | {"Projection": projection}, expires_index | {"Projection": projection}


def _key_schema(hash_key: str, range_key: str) -> list[dict[str, str]]:
    keys = {hash_key: "HASH", range_key: "RANGE"}
    return [{"AttributeName": name, "KeyType": kind} for name, kind in keys.items()]
