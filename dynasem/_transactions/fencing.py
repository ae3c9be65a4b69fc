"""Transactions fenced by the database: a stale holder's transaction cannot land over a newer
holder's work.

A lock service cannot stop a commit. A holder paused past its lease (GC, swap, a stalled
``COMMIT``) still commits after another holder began, and the two rebuilds' rows end up side by
side. Only the database can refuse it, so the hold's fence goes there: inside the hold's
transaction, before any work, one statement writes the fence of each resource to dynasem's
table ``dynasem_fence`` (one row per resource), on the condition that the stored fence is not
larger. That row stays locked until the transaction ends. Fences grow strictly with each new
holder of a resource, so:

* a newer holder's transaction that started first keeps the row locked: the stale one waits at
  its first statement until that transaction ends, then finds the larger fence and raises
  :class:`~dynasem.exceptions.LockLost` (its transaction rolls back, nothing of it lands);
* a stale transaction that started first keeps the row locked: the newer holder's first
  statement waits until it has committed or rolled back, then goes on over its committed data.

Two holders' transactions on one resource never interleave in the database. On MySQL and
MariaDB under REPEATABLE READ that is not enough: a transaction's reads keep the snapshot of its
first plain read, which the fence's wait does not renew, so one that read before its fence would
read data from before the commit it waited for, and its writes would overwrite that work. There
every row is locked unchanged first, then read plainly (the snapshot: taken now if none was) and
written only if it shows the row as the lock found it, fence and count of writes (``writes``,
which every fenced write changes); else :class:`~dynasem.exceptions.LockLost` (the transaction
rolls back, the hold is still ours).

The same hold may write its fence again (a nested block, a second transaction of one hold): an
equal fence is its own.

Exclusive holds only: holders of a counting or shared semaphore hold together, each with its
own fence, and must not refuse one another.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.transaction import TransactionManagementError

from .._storage.records import Mode
from ..exceptions import LockLost
from . import commit

__all__ = [
    "begin",
    "check_fenceable",
    "check_not_fenced",
    "cut_short",
    "end",
    "fence_transaction",
    "no_async",
    "row_key",
]

TABLE = "dynasem_fence"


def row_key(resource: str) -> str:
    """The row's primary key: a digest of the resource (keys up to 1 KB would not fit every
    database's index; MySQL's takes 3,072 bytes)."""
    return hashlib.sha256(resource.encode("utf-8")).hexdigest()


def check_fenceable(mode: Mode, resources: Any) -> None:
    """A ValueError unless holds of this mode can fence a transaction."""
    if mode != Mode.EXCLUSIVE:
        kind = mode.name.lower()  # not the stored letter: "not a s one"
        raise ValueError(
            f"fence_db needs an exclusive semaphore (limit=1, shared=False), not a {kind} one: "
            f"holders of {resources!r} hold together, each with its own fence, and the "
            "database would refuse all but the newest of them"
        )


def fence_transaction(held: Any, using: str | None = None) -> None:
    """Write ``held``'s fences to the database ``using`` (if None: where the routers send the
    Fence model's writes) inside its open transaction; raise :class:`LockLost` (and mark the
    hold lost) if a newer holder's fence is there already, or (the hold still ours) if, on
    MySQL under REPEATABLE READ, this transaction's snapshot is older than a fenced commit."""
    check_fenceable(held.semaphore.mode, held.resources)
    alias = commit.database(using)
    connection = connections[alias]
    # A TestCase's own blocks (they never commit) are no transaction here, as in production.
    if commit.open_transaction(alias) is None:
        raise TransactionManagementError(
            "fence_transaction() must run inside transaction.atomic("
            f"using={alias!r}): outside a transaction nothing keeps the fence row locked "
            "until the work commits"
        )
    hold = getattr(held, "outer", held)  # a nested acquire's view: the hold itself
    if hold.released:
        raise LockLost(held.resource, "it was given back before its transaction was fenced")
    # Past our trusted deadline a newer holder may have begun: no work of ours may start.
    hold.raise_if_lost()
    # One order for every holder: two holders of overlapping sets lock the rows alike.
    resources = sorted(held.fences)
    write = _write_over_snapshot if _keeps_snapshot(connection) else None
    if write is not None:  # every earlier holder's transaction over before our snapshot begins
        for resource in resources:
            _write(connection, alias, resource, held.fences[resource], _lock_row)
    for resource in resources:
        fence = held.fences[resource]
        if not _write(connection, alias, resource, fence, write):
            stored = _stored(connection, resource)
            reason = (
                f"the database {alias!r} holds fence {stored} for it, newer than this "
                f"hold's {fence}: another holder took it over; this transaction rolls back"
            )
            hold.found_lost(reason, resource)
    _remember_fenced(connection, alias, hold, resources)


# The attribute of a connection (Django's: one per thread) naming what its open transaction
# fenced: (the atomic block that opened it and its savepoint, {resource: the hold that fenced
# it}), dropped as the transaction ends (the block is not enough: ``@atomic`` enters one block
# every call; in a TestCase, its transaction never ends: its savepoint tells them apart).
_FENCED = "dynasem_fenced"
# Every connection (of any thread) that has it, and maybe some that no longer do: while none
# does, an acquire's check_not_fenced looks at no connection (Django's list of this thread's
# connections is about 5 % of the lock's own CPU in an uncontended cycle).
_fenced_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def _outermost(connection: Any) -> tuple[Any, str | None] | None:
    """The atomic block that opened ``connection``'s transaction (not a TestCase's), and the
    savepoint it made as it was entered (None: none, as outside a TestCase's blocks). In a
    TestCase, whose commit hooks never run, that savepoint (a new one at every entry) tells
    apart the calls of one ``@atomic`` block object. None: a block inside a TestCase's that
    made no savepoint (``savepoint=False``), whose entries nothing tells apart: nothing is
    remembered of it (a later entry of the block would be refused for an earlier one's)."""
    blocks, sids = connection.atomic_blocks, connection.savepoint_ids
    for i, block in enumerate(blocks):
        if not getattr(block, "_from_testcase", False):
            at = len(sids) - (len(blocks) - i)  # the last block made the last entry
            if at < 0:
                return block, None
            return None if sids[at] is None else (block, sids[at])
    return None, None


def _remember_fenced(connection: Any, alias: str, hold: Any, resources: list[str]) -> None:
    outermost = _outermost(connection)
    if outermost is None:
        return
    kept = getattr(connection, _FENCED, None)
    if kept is None or kept[0] != outermost:
        kept = (outermost, {})
        _fenced_connections.add(connection)  # first: check_not_fenced looks at it from now
        setattr(connection, _FENCED, kept)
        # A transaction that cannot end (closed in it) ends it at once: nothing is kept.
        commit.after_transaction(alias, lambda _committed: _forget_fenced(connection), TABLE)
    kept[1].update(dict.fromkeys(resources, hold))


def _forget_fenced(connection: Any) -> None:
    connection.__dict__.pop(_FENCED, None)
    _fenced_connections.discard(connection)


def check_not_fenced(resources: list[str]) -> None:
    """A ValueError if this thread's open transaction (of any database) fenced one of
    ``resources`` under a hold it has given back (``on_commit=False``, or after another
    database's commit) or lost: the fence row stays locked until that transaction ends, so
    the next holder's fence waits for it, and taking the resource again before then would
    wait on that holder while it waits on us, until ``wait`` ran out."""
    if not _fenced_connections:
        return  # no connection has anything fenced
    for connection in connections.all(initialized_only=True):
        kept = getattr(connection, _FENCED, None)
        if kept is None or kept[0] != _outermost(connection):
            continue
        for resource in resources:
            hold = kept[1].get(resource)
            if hold is not None and (hold.released or hold.lost):
                raise ValueError(
                    f"{resource!r} was fenced in database {connection.alias!r}'s open "
                    "transaction by a hold given back (or lost) since: its fence row stays "
                    "locked until the transaction ends, and the next holder's fence waits for "
                    "that, so taking it again now would wait on a holder that waits on us. "
                    "Take it once for the whole transaction, or with on_commit=True (kept "
                    "until the commit, taken again at once), or again after the transaction"
                )


def begin(opened: Any, using: str | None, undo: Callable[[], None]) -> None:
    """A ``fence_db`` block's start (``opened``: its record, reentry.Block, whose hold is
    its ``value``): open ``transaction.atomic(using)`` (a savepoint inside an open
    transaction), write the fence first in it, and keep it as the block's ``atomic``. On
    failure, ``undo()`` (give the hold back) and raise."""
    try:
        alias = commit.database(using)  # the routers' choice, asked once for both
        block = transaction.atomic(using=alias)
        block.__enter__()
        try:
            fence_transaction(opened.value, alias)
            opened.atomic = block  # inside: an interrupt here closes it
            hold = getattr(opened.value, "outer", opened.value)
            # What an exit interrupted before end() began finds (cut_short); those ended, gone.
            hold.fenced = [*(b for b in hold.fenced if b.atomic is not None), opened]
        except BaseException as exc:
            opened.atomic = None  # closed here: no exit's cut_short closes it again
            block.__exit__(type(exc), exc, exc.__traceback__)
            raise
    except BaseException:
        undo()
        raise


def end(opened: Any, exc_type: Any, exc: Any, tb: Any, undo: Callable[[], None]) -> None:
    """A ``fence_db`` block's end (``opened``: the record :func:`begin` had, found by the
    block, wherever it is left): its transaction commits (a savepoint is released), unless
    the block raised or the hold can no longer be trusted (then it rolls back and LockLost
    is raised). The hold is given back after this, once the outermost transaction ends. If
    this raises, ``undo()`` (give the hold back, the block having failed) ran first."""
    # Taken (plain attributes: no signal lands here): from here on this closes it, not an
    # interrupted exit's cut_short.
    block, opened.atomic, exited = opened.atomic, None, False
    try:
        hold = getattr(opened.value, "outer", opened.value)
        hold.fenced = [b for b in hold.fenced if b is not opened]  # keeps it alive no more
        if exc_type is None:
            try:
                opened.value.raise_if_lost()
            except BaseException as lost:  # LockLost, or what a lock_lost receiver raised
                exited = True
                block.__exit__(type(lost), lost, lost.__traceback__)
                raise
        exited = True
        block.__exit__(exc_type, exc, tb)
    except BaseException as failure:
        if not exited:  # interrupted before the block's exit (a signal): it rolls back
            block.__exit__(type(failure), failure, failure.__traceback__)
        undo()
        raise


def cut_short(hold: Any, exc: BaseException) -> None:
    """A block's exit of ``hold`` raised ``exc`` (an interrupt: a signal's exception): if it
    was a ``fence_db`` block's and :func:`end` never began (the signal landed as the exit
    called it), its transaction, open still, rolls back: the block's exit does not run
    again, and the connection would stay in it (this thread's later work in a transaction
    that never commits, the fence row locked against the next holder)."""
    for opened in reversed(hold.fenced):
        if opened.atomic is not None and not opened.open:  # left by its exit, not ended
            block, opened.atomic = opened.atomic, None
            block.__exit__(type(exc), exc, exc.__traceback__)
            return


def no_async() -> TypeError:
    return TypeError(
        "fence_db=True needs a synchronous block (transaction.atomic is synchronous): in "
        "async code, call held.fence_transaction() first inside the function that "
        "sync_to_async runs in transaction.atomic()"
    )


Step = Callable[[Any, str, str, int], bool]


def _write(
    connection: Any, alias: str, resource: str, fence: int, step: Step | None = None
) -> bool:
    """``step`` (by default the conditional upsert: True if the row now holds ``fence``, locked
    until our transaction ends, False if it holds a larger one). A deadlock the database broke
    by rolling our transaction back raises LockLost: the caller's work is gone, not the hold."""
    try:
        return (step or _upsert)(connection, alias, resource, fence)
    except DatabaseError as exc:
        # MySQL's and MariaDB's ER_LOCK_DEADLOCK: InnoDB rolled the whole transaction back.
        if connection.vendor == "mysql" and exc.args and exc.args[0] == _MYSQL_DEADLOCK:
            raise LockLost(
                resource,
                f"the database {alias!r} chose this transaction as a deadlock victim while it "
                f"wrote fence {fence} ({exc}): the whole transaction was rolled back, nothing of "
                "it lands; the hold is still yours, run the work again in a new transaction",
            ) from exc
        if TABLE in str(exc):  # "no such table", "relation ... does not exist"
            exc.add_note(
                f"dynasem: fenced transactions need the {TABLE} table of database {alias!r}: "
                f"run `manage.py migrate dynasem --database {alias}`"
            )
        raise


_MYSQL_DEADLOCK = 1213


def _upsert(connection: Any, alias: str, resource: str, fence: int) -> bool:
    key, table = row_key(resource), connection.ops.quote_name(TABLE)
    insert = f"INSERT INTO {table} (digest, resource, fence, writes) VALUES (%s, %s, %s, 1)"
    with connection.cursor() as cursor:
        if connection.vendor in ("postgresql", "sqlite"):
            cursor.execute(
                f"{insert} ON CONFLICT (digest) DO UPDATE SET fence = excluded.fence, "
                f"writes = COALESCE({table}.writes, 0) + 1 WHERE {table}.fence <= excluded.fence",
                [key, resource, fence],
            )
            return bool(cursor.rowcount == 1)
        if connection.vendor == "mysql":
            # MySQL and MariaDB: one ``INSERT ... ON DUPLICATE KEY UPDATE`` on the primary key.
            # An UPDATE that finds no row locks the gap where it would be under REPEATABLE
            # READ, and two transactions that both did so then wait on each other's gap to
            # INSERT: a deadlock of every two holders fencing a new resource at once. This
            # statement takes no gap lock: a duplicate of the primary key is locked as a record
            # (exclusively, for the update), a new row by its insert; the second holder waits
            # for the first's transaction, then finds its row. The row locked, a locking read
            # (the newest committed value, not the transaction's snapshot) says whether our
            # fence is the one stored: the affected-rows count cannot, as Django's FOUND_ROWS
            # flag counts an insert and an unchanged row alike.
            # (``writes`` first: MySQL's assignments see those before them.)
            cursor.execute(
                f"{insert} ON DUPLICATE KEY UPDATE "
                "writes = IF(fence <= %s, COALESCE(writes, 0) + 1, writes), "
                "fence = IF(fence <= %s, %s, fence)",
                [key, resource, fence, fence, fence, fence],
            )
            return _fence_of(cursor, table, key, " FOR UPDATE") == fence
        # Elsewhere (Oracle, third-party backends): update the row; create it if there is none.
        update = (
            f"UPDATE {table} SET fence = %s, writes = COALESCE(writes, 0) + 1 "
            "WHERE digest = %s AND fence <= %s"
        )
        cursor.execute(update, [fence, key, fence])
        if cursor.rowcount == 1:
            return True
        try:
            with transaction.atomic(using=alias):
                cursor.execute(insert, [key, resource, fence])
            return True
        except IntegrityError:  # made meanwhile: its fence decides
            cursor.execute(update, [fence, key, fence])
            return bool(cursor.rowcount == 1)


def _keeps_snapshot(connection: Any) -> bool:
    """Whether this connection's transactions read a snapshot that a lock does not renew:
    MySQL's and MariaDB's REPEATABLE READ (InnoDB's reads keep the one of the transaction's
    first plain read; SERIALIZABLE makes them locking reads, READ COMMITTED takes one per
    statement). Asked of the server once per connection: a project's OPTIONS may leave the
    level to the server's own default (REPEATABLE READ) or set it in ``init_command``."""
    if connection.vendor != "mysql":
        return False  # PostgreSQL's REPEATABLE READ refuses the fence's write itself
    raw = connection.connection
    known = getattr(connection, "_dynasem_keeps_snapshot", None)
    if known is None or known[0] is not raw:
        mariadb = getattr(connection, "mysql_is_mariadb", False)
        variable = "tx_isolation" if mariadb else "transaction_isolation"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT @@SESSION.{variable}")
            known = (raw, str(cursor.fetchone()[0]).upper() == "REPEATABLE-READ")
        connection._dynasem_keeps_snapshot = known
    return bool(known[1])


def _lock_row(connection: Any, alias: str, resource: str, fence: int) -> bool:
    """MySQL under REPEATABLE READ, before anything is read of the row: lock it unchanged
    (made, with ``fence`` and no write counted, if there is none), as the upsert locks it (no
    gap lock). Once every row is locked, every earlier holder's transaction has ended: a
    snapshot this transaction takes from here on has their commits."""
    key, table = row_key(resource), connection.ops.quote_name(TABLE)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (digest, resource, fence, writes) VALUES (%s, %s, %s, 0) "
            "ON DUPLICATE KEY UPDATE fence = fence",  # unchanged: our snapshot does not see it
            [key, resource, fence],
        )
    return True


def _write_over_snapshot(connection: Any, alias: str, resource: str, fence: int) -> bool:
    """MySQL under REPEATABLE READ, the row locked (:func:`_lock_row`): the upsert, if the
    row this transaction's snapshot shows (a plain read) is the newest (the UPDATE's); else,
    unless a larger fence is stored, LockLost: a holder's commit landed after this
    transaction's first read, whose snapshot all its reads keep (its writes would overwrite
    that holder's work). The hold stays ours; the transaction rolls back."""
    key, table = row_key(resource), connection.ops.quote_name(TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT fence, writes FROM {table} WHERE digest = %s", [key])
        seen = cursor.fetchone()  # None: made after our snapshot (ours would show)
        if seen is not None:
            cursor.execute(
                f"UPDATE {table} SET writes = COALESCE(writes, 0) + 1, fence = %s "
                "WHERE digest = %s AND fence <= %s AND fence = %s AND writes <=> %s",
                [fence, key, fence, *seen],
            )
            if cursor.rowcount == 1:
                return True
        stored = _fence_of(cursor, table, key, " FOR UPDATE")
    if stored is not None and stored > fence:
        return False
    raise LockLost(
        resource,
        f"the database {alias!r} committed a fenced transaction on it after this "
        "transaction's first read, and under REPEATABLE READ all its reads keep that read's "
        "snapshot: what it read is stale, so this transaction rolls back; the hold is still "
        "yours, run the work again in a new transaction with the fence first in it",
    )


def _fence_of(cursor: Any, table: str, key: str, lock: str = "") -> int | None:
    """The fence stored in the row ``key`` (None: no row); ``lock``: a locking read's tail."""
    cursor.execute(f"SELECT fence FROM {table} WHERE digest = %s{lock}", [key])
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def _stored(connection: Any, resource: str) -> int | None:
    lock = " FOR UPDATE" if connection.vendor == "mysql" else ""  # not a stale snapshot's
    with connection.cursor() as cursor:
        return _fence_of(cursor, connection.ops.quote_name(TABLE), row_key(resource), lock)
