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

import functools
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, overload

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from ..conf import settings

LOCK_SK = "lock"
JOB_SK = "job"
# The format item's key, and the stored format this dynasem reads and writes.
FORMAT_PK, FORMAT_SK = "dynasem#format", "format"
FORMAT_VERSION = 1
# Keys-only projections over a bucketed ``expires``.
USER_INDEX = "userId-index-v2"
EXPIRES_INDEX = "expires-index-v2"
# The width of an ``expires`` bucket (seconds). Wider: fewer index moves for long holds;
# narrower: fewer idle rows (released this bucket) read and left out by a live listing.
BUCKET_S = 900
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
    """Whole epoch seconds, rounded up (never earlier than ``ms``)."""
    return math.ceil(ms / 1000)


def bucket_of(ms: int) -> int:
    """The ``expires`` stored for a lease ending at ``ms``: rounded up to a bucket's end."""
    return math.ceil(ms / 1000 / BUCKET_S) * BUCKET_S


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder of a lock row: whose hold, until when, under which fence."""

    user_id: str
    expires_ms: int  # its lease end (wall clock, ms): what decides everything
    fence: int
    acquired_ms: int = 0
    shared: bool = False
    # The holding process, as dynasem._engine.processes records it (None: not recorded).
    proc: str | None = None
    # A unique task's run that enqueued its retry: the token the retry's message carries,
    # which this hold becomes when the run ends (dynasem._background.unique; None: no retry).
    next_token: str | None = None


@dataclass(frozen=True, slots=True)
class Waiter:
    """One queue entry: an item of its own under the resource's key (``sk`` =
    :func:`entry_sk`)."""

    ticket: int  # first come, first served: the smallest live ticket is next
    expires_ms: int  # the entry's own lease end; a dead waiter's entry may be evicted
    user_id: str = ""
    shared: bool = False
    lease_ms: int | None = None  # the lease a hand-over grants it
    address: str | None = None  # where a hand-over is pushed (wakeup's format), if anywhere
    proc: str | None = None  # the waiting process: a hand-over records it in the holder entry
    token: str = ""  # whose entry
    since_ms: int | None = None  # when it queued (for listings)


class Mode(StrEnum):
    """How a resource is held: the row's ``mode``, stored as its one-letter value."""

    EXCLUSIVE = "x"
    COUNTING = "n"  # up to ``limit`` holders
    SHARED = "s"  # readers, any number of them


@dataclass(frozen=True, slots=True)
class LockItem:
    """A lock row as stored, decoded once. A missing attribute reads as its default; the
    acquire loop's guesses (\"free, with this fence\") are LockItems too."""

    resource: str = ""
    holders: Mapping[str, Holder] = field(default_factory=dict)
    fence: int = 0  # the last fence handed out for the resource
    expires_ms: int = 0  # the latest lease end of its holders (the row's own expiry)
    mode: Mode = Mode.EXCLUSIVE
    limit: int = 1
    # The queue of entry items: tickets 1, 2, ... handed out by ``ADD qin 1`` (queue_in);
    # every ticket up to ``queue_out`` (stored ``qout``) has had its turn (or was passed:
    # left, dead, or skipped). Waiters wait while queue_in > queue_out. ``queue_id`` (stored
    # ``qbase``) names this row's queue (set with its first ticket), so that entries left from
    # before a reap are never read as this row's.
    queue_in: int = 0
    queue_out: int = 0
    queue_id: int = 0
    # Entry items read for this row (ticket order, from ``queue_out`` + 1 on), or None.
    # A read stops at the first live entry; ``entries_to`` is the last ticket it covered.
    entries: tuple[Waiter, ...] | None = None
    entries_to: int = 0
    guessed: bool = False  # not read: a guess of the acquire loop (see guessed_free)
    hold_ms: int | None = None  # the average hold, for a waiter's estimate of its turn
    last_token: str | None = None  # who released last
    broken_token: str | None = None  # whose hold an operator broke last
    listed_s: int | None = None  # where the row sorts in the indexes (epoch seconds)
    # A counting semaphore's row whose holders are in permit items (permit_items.py): the
    # slots ever used (stored ``hw``; None: holders in the row) and the slots given back
    # lately.
    slots_used: int | None = None
    hints: tuple[int, ...] = ()
    permits_read: bool = False  # ``holders`` were read from its permits (with_permits)
    # A listing read only some of the holders kept in items (``most``: with_permits,
    # with_readers): the sort key of the last one read; more are stored after it.
    holders_next: str | None = None
    # Readers in reader items (reader_items.py): counted in ``reader_count`` (stored ``rc``)
    # under the epoch ``reader_epoch`` (``repoch``), whose longest lease was
    # ``reader_lease_ms`` (``rlease``); the row's holder ``readers`` stands for them all.
    reader_count: int = 0
    reader_epoch: int = 0
    reader_lease_ms: int = 0
    # The epoch and token of the last reader admitted to an item (stored ``rlast``;
    # reader_items.admission_mark): an admission sent again after its answer was lost is not
    # counted twice.
    last_reader: str | None = None
    # The decoded item itself, for a push (wakeup sends it as written); read it nowhere else.
    stored: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def waiting(self) -> bool:
        """Whether tickets are out that have not had their turn (live waiters, maybe)."""
        return self.queue_in > self.queue_out


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """A row as an index lists it: its resource, its ``expires`` bucket (where it sorts) and
    its mode. The row itself is read from the base table."""

    resource: str
    listed_s: int
    mode: Mode | None = None


def index_entry(item: Mapping[str, Any]) -> IndexEntry:
    mode = item.get("mode")
    return IndexEntry(str(item["pk"]), int(item["expires"]), None if mode is None else Mode(mode))


def _proc(value: Mapping[str, Any]) -> str | None:
    proc = value.get("p")
    return str(proc) if proc else None


def holder_of(value: Mapping[str, Any]) -> Holder:
    return Holder(
        user_id=str(value.get("u", "")),
        expires_ms=int(value.get("e", 0)),
        fence=int(value.get("f", 0)),
        acquired_ms=int(value.get("a", 0)),
        shared=bool(value.get("s", False)),
        proc=_proc(value),
        next_token=str(value["n"]) if value.get("n") else None,
    )


def holder_value(holder: Holder) -> dict[str, Any]:
    value: dict[str, Any] = {
        "u": holder.user_id,
        "e": holder.expires_ms,
        "f": holder.fence,
        "a": holder.acquired_ms,
        "s": holder.shared,
    }
    if holder.proc is not None:
        value["p"] = holder.proc
    if holder.next_token is not None:
        value["n"] = holder.next_token
    return value


def waiter_of(value: Mapping[str, Any], token: str = "") -> Waiter:
    lease, address = value.get("l"), value.get("n")
    return Waiter(
        ticket=int(value.get("t", 0)),
        expires_ms=int(value.get("e", 0)),
        user_id=str(value.get("u", "")),
        shared=bool(value.get("s", False)),
        lease_ms=None if lease is None else int(lease),
        address=None if not address else str(address),
        proc=_proc(value),
        token=token,
        since_ms=None if value.get("a") is None else int(value["a"]),
    )


def waiter_value(waiter: Waiter) -> dict[str, Any]:
    value: dict[str, Any] = {
        "t": waiter.ticket,
        "e": waiter.expires_ms,
        "u": waiter.user_id,
        "s": waiter.shared,
    }
    if waiter.lease_ms is not None:
        value["l"] = waiter.lease_ms
    if waiter.address is not None:
        value["n"] = waiter.address
    if waiter.proc is not None:
        value["p"] = waiter.proc
    if waiter.since_ms is not None:
        value["a"] = waiter.since_ms
    return value


ENTRY_PREFIX = "q#"


def entry_sk(queue_id: int, ticket: int) -> str:
    """The sort key of a queue entry item: the row's queue, then the ticket (zero-padded, so
    the entries sort in ticket order under the resource's key, after ``job`` and ``lock``)."""
    return f"{ENTRY_PREFIX}{queue_id:020d}#{ticket:020d}"


def entry_item(resource: str, queue_id: int, waiter: Waiter) -> dict[str, Any]:
    """A queue entry as its own item (PutItem's ``Item``). It carries no ``userId`` or
    ``shard`` (so no index writes) and ``expires`` for TTL only: waiters that left or were
    served leave their entries behind, below the row's ``qout``, where nobody reads them."""
    value = waiter_value(waiter)
    value["k"] = waiter.token
    return {
        **key(resource, entry_sk(queue_id, waiter.ticket)),
        **encode(value),
        "expires": {"N": str(epoch_seconds(waiter.expires_ms) + BUCKET_S)},
    }


def entry_of(item: Mapping[str, Any]) -> Waiter:
    """A decoded entry item as a :class:`Waiter`."""
    return waiter_of(item, str(item.get("k", "")))


def _number(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value)


def _text(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value)


@overload
def lock_item(item: None) -> None: ...
@overload
def lock_item(item: Mapping[str, Any]) -> LockItem: ...
@overload
def lock_item(item: Mapping[str, Any] | None) -> LockItem | None: ...


def lock_item(item: Mapping[str, Any] | None) -> LockItem | None:
    """A decoded lock row (or a pushed one) as a :class:`LockItem`; None stays None."""
    if item is None:
        return None

    number, text = functools.partial(_number, item), functools.partial(_text, item)
    return LockItem(
        resource=str(item.get("pk", "")),
        holders={t: holder_of(h) for t, h in (item.get("holders") or {}).items()},
        fence=number("fence") or 0,
        expires_ms=number("expMs") or 0,
        mode=Mode(text("mode") or "x"),
        limit=number("limit") or 1,
        queue_in=number("qin") or 0,
        queue_out=number("qout") or 0,
        queue_id=number("qbase") or 0,
        hold_ms=number("holdMs"),
        last_token=text("lastToken"),
        broken_token=text("brokenToken"),
        listed_s=number("expires"),
        slots_used=number("hw"),
        hints=tuple(int(x) for x in item.get("hints") or ()),
        reader_count=number("rc") or 0,
        reader_epoch=number("repoch") or 0,
        reader_lease_ms=number("rlease") or 0,
        last_reader=text("rlast"),
        stored=item,
    )


def guessed_free(fence: int) -> LockItem | None:
    """What a busy lock we did not read again is guessed to be: free, keeping the fence we
    saw (one write tells us otherwise). None when we saw no fence: nothing known."""
    return LockItem(fence=fence, guessed=True) if fence else None


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

    number, text = functools.partial(_number, item), functools.partial(_text, item)
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


# Permit items (permit_items.py) and reader items (reader_items.py).

PERMIT_PREFIX = "s#"


def permit_sk(slot: int) -> str:
    return f"{PERMIT_PREFIX}{slot:010d}"


@dataclass(frozen=True, slots=True)
class Permit:
    """One permit item: its slot, and its hold if it is held (``token`` empty: free)."""

    slot: int
    token: str
    holder: Holder
    last_token: str | None = None
    broken_token: str | None = None

    def free_at(self, stale_ms: int) -> bool:
        """Free, or its holder's lease ended more than CLOCK_SKEW before (``stale_ms``)."""
        return not self.token or self.holder.expires_ms < stale_ms


def permit_of(item: dict[str, Any]) -> Permit:
    sk = str(item["sk"])
    return Permit(
        slot=int(sk[len(PERMIT_PREFIX) :]),
        token=str(item.get("k") or ""),
        holder=Holder(
            user_id=str(item.get("u", "")),
            expires_ms=int(item.get("e", 0)),
            fence=int(item.get("f", 0)),
            acquired_ms=int(item.get("a", 0)),
            proc=str(item["p"]) if item.get("p") else None,
        ),
        last_token=str(item["lt"]) if item.get("lt") else None,
        broken_token=str(item["bt"]) if item.get("bt") else None,
    )


READER_PREFIX = "r#"


def reader_sk(token: str) -> str:
    return f"{READER_PREFIX}{token}"


@dataclass(frozen=True, slots=True)
class Reader:
    """One reader item: its token, its hold, and the epoch it was admitted under."""

    token: str
    holder: Holder
    epoch: int


def reader_of(item: dict[str, Any]) -> Reader:
    return Reader(
        token=str(item["sk"])[len(READER_PREFIX) :],
        holder=Holder(
            user_id=str(item.get("u", "")),
            expires_ms=int(item.get("e", 0)),
            fence=int(item.get("f", 0)),
            acquired_ms=int(item.get("a", 0)),
            shared=True,
            proc=str(item["p"]) if item.get("p") else None,
        ),
        epoch=int(item.get("ep", 0)),
    )


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


def scan_start(pk: str, sk: str) -> dict[str, Any]:
    return key(pk, sk)


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


def format_version(item: Mapping[str, Any] | None) -> int | None:
    """The version a decoded format item names; None: no item."""
    return None if item is None or item.get("version") is None else int(item["version"])


def table_definition(name: str | None = None) -> dict[str, Any]:
    """CreateTable arguments: on-demand, a GSI on userId and a sharded GSI on expires."""
    user_index, expires_index = index_definitions()
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
        "GlobalSecondaryIndexes": [user_index, expires_index],
    }


def index_definitions() -> tuple[dict[str, Any], dict[str, Any]]:
    """The two GSIs, on userId and (sharded) on expires, each projecting its keys and ``mode``
    (which changes only when a row changes kind): a listing picks the rows it needs from the
    index and reads only those from the base table."""
    return (
        {
            "IndexName": USER_INDEX,
            "KeySchema": [
                {"AttributeName": "userId", "KeyType": "HASH"},
                {"AttributeName": "expires", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["mode"]},
        },
        {
            "IndexName": EXPIRES_INDEX,
            "KeySchema": [
                {"AttributeName": "shard", "KeyType": "HASH"},
                {"AttributeName": "expires", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["mode"]},
        },
    )
