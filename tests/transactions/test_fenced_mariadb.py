"""Fenced transactions (dynasem/_transactions/fencing.py) on a real MariaDB, with two holders'
transactions in
threads of their own (a connection each) fencing at the same moment.

InnoDB locks more than rows: under REPEATABLE READ (MySQL's own default, a common OPTIONS
``isolation_level``) a search that finds no row locks the gap where it would be. Two holders
that fence a resource nobody has fenced yet must still end with one of them first, never a
deadlock; and a deadlock the database does report while a fence is written (the transaction
locked the caller's own rows first) must reach the caller as ``LockLost``, not a raw
``OperationalError``. Both isolation levels run: Django's default for MySQL (READ COMMITTED)
and REPEATABLE READ.

The server is Debian's MariaDB, started for this module on a free loopback port
(tests/support/servers.py); without it (and no root to install it) the module is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import OperationalError, connections, transaction

from dynasem import LockLost, semaphore
from dynasem._transactions.fencing import row_key
from tests.support.helpers import break_holds
from tests.support.servers import ServerUnavailable, mariadb

pytest.importorskip(
    "MySQLdb",
    reason="mysqlclient is not installed: scripts/venv.sh builds it where libmariadb-dev and "
    "pkg-config are (apt-get install libmariadb-dev pkg-config, then make venv)",
)

ISOLATIONS = {"mariadb_rc": "read committed", "mariadb_rr": "repeatable read"}
BARRIER_WAIT = 3.0  # seconds a thread waits for the other to reach the same point


@pytest.fixture(scope="module")
def mariadb_aliases(django_db_blocker: Any) -> Iterator[list[str]]:
    """Two aliases of one throwaway database, one per isolation level, migrated."""
    with contextlib.ExitStack() as stack:
        # Not under pytest's temporary folder: the mysql user must reach it.
        workdir = Path(tempfile.mkdtemp(prefix="dynasem-mariadb-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        try:
            entry = stack.enter_context(mariadb(workdir))
        except ServerUnavailable as exc:
            pytest.skip(f"no MariaDB here: {exc}")
        stack.enter_context(django_db_blocker.unblock())
        for alias, isolation in ISOLATIONS.items():
            config = {**entry, "OPTIONS": {"isolation_level": isolation}}
            settings.DATABASES[alias] = config
            both = {"default": connections.settings["default"], alias: config}
            connections.settings[alias] = connections.configure_settings(both)[alias]
            stack.callback(settings.DATABASES.pop, alias, None)
            stack.callback(connections.settings.pop, alias, None)
            stack.callback(lambda alias=alias: connections[alias].close())
        call_command("migrate", "dynasem", database="mariadb_rc", verbosity=0)
        with connections["mariadb_rc"].cursor() as cursor:
            cursor.execute(
                "CREATE TABLE fence_work (id int AUTO_INCREMENT PRIMARY KEY, label varchar(20), "
                "n int) ENGINE=InnoDB"
            )
        yield list(ISOLATIONS)


def in_threads(*calls: Callable[[], str], alias: str) -> list[str | BaseException]:
    """Run each call in a thread of its own (a connection of its own); what each returned or
    raised, in order."""
    outcomes: list[str | BaseException] = ["unfinished"] * len(calls)

    def run(i: int, call: Callable[[], str]) -> None:
        try:
            outcomes[i] = call()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            outcomes[i] = exc
        finally:
            connections[alias].close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def after_fence_statement(barrier: threading.Barrier) -> Callable[..., Any]:
    """An execute wrapper: after this connection's first statement on the fence table, wait
    (a while at most) for the other thread to be there too."""
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "dynasem_fence" in sql and not seen:
            seen.append(sql)
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(BARRIER_WAIT)
        return result

    return wrapper


def stale_and_newer(resource: str) -> tuple[Any, Any]:
    """Two holds of one resource: A's was broken (it has not noticed, as a paused holder
    has not), B took it over with a larger fence."""
    a = semaphore(resource, lease=60).acquire()
    assert break_holds(resource)
    b = semaphore(resource, lease=60).acquire()
    assert b.fence > a.fence
    return a, b


def give_back(*holds: Any) -> None:
    for held in holds:
        with contextlib.suppress(LockLost):
            held.release()


def rows(alias: str) -> list[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT label FROM fence_work ORDER BY label")
        found = [label for (label,) in cursor.fetchall()]
        cursor.execute("DELETE FROM fence_work")
    return found


def stored(alias: str, resource: str) -> int | None:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT fence FROM dynasem_fence WHERE digest = %s", [row_key(resource)])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


@pytest.mark.parametrize("alias", list(ISOLATIONS))
def test_two_holders_fencing_a_new_resource_at_once_do_not_deadlock(
    lock_table: str, mariadb_aliases: list[str], alias: str
) -> None:
    """A stale holder and the holder after it write the first fence of a resource at the same
    moment: one goes first, the other waits for its transaction. The newer holder always
    lands; the stale one either committed first or was refused."""
    resource = f"new:{alias}"
    a, b = stale_and_newer(resource)
    barrier = threading.Barrier(2)

    def rebuild(held: Any, label: str) -> str:
        connection = connections[alias]
        with connection.execute_wrapper(after_fence_statement(barrier)):
            try:
                with transaction.atomic(using=alias):
                    held.fence_transaction(alias)
                    with connection.cursor() as cursor:
                        cursor.execute("INSERT INTO fence_work (label, n) VALUES (%s, 1)", [label])
            except LockLost:
                return "lost"
        return "done"

    try:
        outcome = in_threads(lambda: rebuild(a, "A"), lambda: rebuild(b, "B"), alias=alias)
    finally:
        give_back(a, b)
    assert not any(isinstance(o, BaseException) for o in outcome), outcome
    assert outcome[1] == "done", outcome
    assert stored(alias, resource) == b.fence
    assert rows(alias) == (["A", "B"] if outcome[0] == "done" else ["B"])


@pytest.mark.parametrize("alias", list(ISOLATIONS))
def test_a_deadlock_at_the_fence_is_lock_lost(
    lock_table: str, mariadb_aliases: list[str], alias: str
) -> None:
    """B (newer) locked a row of the caller's own first, then fences; A (stale) fenced first
    and then wants that row: a real deadlock, B's fence statement its victim (A has written
    more). B gets LockLost, its transaction rolled back; A's goes on."""
    resource = f"deadlock:{alias}"
    a, b = stale_and_newer(resource)
    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO fence_work (label, n) VALUES ('W', 0)")
        w = cursor.lastrowid  # locked by its key: a record lock, no gap (a scan locks all)
    barrier = threading.Barrier(2)

    def stale() -> str:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            a.fence_transaction(alias)
            # Heavier than B's transaction: InnoDB rolls back the lighter one.
            insert = "INSERT INTO fence_work (label, n) VALUES ('A', %s)"
            cursor.executemany(insert, [[n] for n in range(50)])
            barrier.wait(BARRIER_WAIT)
            cursor.execute("SELECT n FROM fence_work WHERE id = %s FOR UPDATE", [w])
        return "done"

    def newer() -> str:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute("SELECT n FROM fence_work WHERE id = %s FOR UPDATE", [w])
            barrier.wait(BARRIER_WAIT)
            b.fence_transaction(alias)
        return "done"

    try:
        outcome = in_threads(stale, newer, alias=alias)
    finally:
        give_back(a, b)
    assert outcome[0] == "done", outcome
    lost = outcome[1]
    assert isinstance(lost, LockLost), outcome
    assert "deadlock" in lost.reason and "rolled back" in lost.reason, lost.reason
    assert isinstance(lost.__cause__, OperationalError) and lost.__cause__.args[0] == 1213
    assert not b.lost  # still B's in DynamoDB: only its transaction is gone
    assert stored(alias, resource) == a.fence
    assert set(rows(alias)) == {"A", "W"}


@pytest.mark.parametrize("alias", list(ISOLATIONS))
def test_fenced_blocks_on_mariadb(lock_table: str, mariadb_aliases: list[str], alias: str) -> None:
    """The plain path: a fence written and committed, the same hold again (equal fence), a
    newer one over it, and an older hold refused."""
    resource = f"plain:{alias}"
    a, b = stale_and_newer(resource)
    try:
        with transaction.atomic(using=alias):
            b.fence_transaction(alias)
            b.fence_transaction(alias)  # the same hold again: an equal fence is its own
        assert stored(alias, resource) == b.fence
        with pytest.raises(LockLost, match=r"holds fence \d+ for it, newer than this hold's"):
            with transaction.atomic(using=alias):
                a.fence_transaction(alias)
        assert a.lost and stored(alias, resource) == b.fence
    finally:
        give_back(a, b)
    with semaphore(resource, fence_db=True, using=alias) as newest:
        assert stored(alias, resource) == newest.fence > b.fence


@pytest.mark.parametrize("alias", list(ISOLATIONS))
def test_a_fence_in_a_transaction_that_read_first_sees_the_stale_holders_commit(
    lock_table: str, mariadb_aliases: list[str], alias: str
) -> None:
    """A ``fence_db`` block inside a transaction that already read (a view under
    ATOMIC_REQUESTS that looked at the project before taking its lock): the stale holder A
    fenced first and commits its increment while B's transaction is open; B's fence is then
    written over A's, and B's work must go on over A's committed data, as the how-to promises.
    Under REPEATABLE READ, InnoDB's reads keep the snapshot of B's first read, from before
    A's commit: B read n as 0 and wrote 1 over A's 1, a lost update the fence let through.
    (PostgreSQL refuses it: its REPEATABLE READ raises a serialization failure at the fence
    write of a row changed after the snapshot.)

    The mend proposed: a column in ``dynasem_fence`` that every fenced write changes (a count,
    migration 0004; an equal fence of the same hold's next transaction changes nothing now);
    on MySQL under REPEATABLE READ, lock the row first without changing it (``ON DUPLICATE
    KEY UPDATE`` of nothing), then read it both plainly (this transaction's snapshot; one
    taken now is after every earlier holder's commit) and with ``FOR UPDATE`` (the newest):
    a difference is a snapshot older than an earlier holder's commit, refused with LockLost
    (the hold still ours: the work again in a new transaction), before the fence is written."""
    resource = f"snapshot:{alias}"
    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO fence_work (label, n) VALUES ('C', 0)")
        counter = cursor.lastrowid
    a, b = stale_and_newer(resource)
    a_wrote, b_read, a_committed = threading.Event(), threading.Event(), threading.Event()
    select = "SELECT n FROM fence_work WHERE id = %s"
    update = "UPDATE fence_work SET n = %s WHERE id = %s"

    def stale() -> str:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            a.fence_transaction(alias)
            cursor.execute(select, [counter])
            cursor.execute(update, [cursor.fetchone()[0] + 1, counter])
            a_wrote.set()
            assert b_read.wait(BARRIER_WAIT)
        a_committed.set()
        return "done"

    def newer() -> str:
        assert a_wrote.wait(BARRIER_WAIT)
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(select, [counter])  # the view's own read, before the lock's block
            b_read.set()
            assert a_committed.wait(BARRIER_WAIT)
            with transaction.atomic(using=alias):  # what fence_db=True opens: a savepoint
                b.fence_transaction(alias)
                cursor.execute(select, [counter])
                cursor.execute(update, [cursor.fetchone()[0] + 1, counter])
        return "done"

    try:
        outcome = in_threads(stale, newer, alias=alias)
    finally:
        give_back(a, b)
    with connections[alias].cursor() as cursor:
        cursor.execute(select, [counter])
        (n,) = cursor.fetchone()
    rows(alias)
    # A's increment, then B's over it; or B refused (its snapshot older than A's commit), its
    # transaction rolled back, its fence with it; the hold still B's.
    assert (outcome, n, stored(alias, resource)) == (["done", "done"], 2, b.fence) or (
        outcome[0] == "done"
        and isinstance(outcome[1], LockLost)
        and "run the work again in a new transaction" in outcome[1].reason
        and (n, stored(alias, resource), b.lost) == (1, a.fence, False)
    ), (outcome, n)


def new_counter(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("INSERT INTO fence_work (label, n) VALUES ('C', 0)")
        return int(cursor.lastrowid)


def increment(cursor: Any, counter: int) -> None:
    """A read-then-write: what a lost update loses."""
    cursor.execute("SELECT n FROM fence_work WHERE id = %s", [counter])
    cursor.execute(
        "UPDATE fence_work SET n = %s WHERE id = %s", [cursor.fetchone()[0] + 1, counter]
    )


def counted(alias: str, counter: int) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT n FROM fence_work WHERE id = %s", [counter])
        (n,) = cursor.fetchone()
    rows(alias)
    return int(n)


def until_another_waits_at_the_fence(cursor: Any) -> None:
    """Until another connection's statement on the fence table has run for a while: it waits
    on a lock ``cursor``'s transaction holds (MariaDB's PROCESSLIST; its INNODB_TRX does not
    list a transaction that has changed nothing yet)."""
    deadline = time.monotonic() + BARRIER_WAIT
    query = (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID != CONNECTION_ID() "
        "AND INFO LIKE '%%dynasem_fence%%' AND TIME_MS > 50"
    )
    while cursor.execute(query) is not None and not cursor.fetchone()[0]:
        assert time.monotonic() < deadline, "no statement waited on the fence row"
        time.sleep(0.01)


@pytest.mark.parametrize("alias", list(ISOLATIONS))
@pytest.mark.parametrize("two", [False, True], ids=["one_resource", "two_resources"])
def test_a_fence_first_waits_for_the_stale_holders_commit_and_goes_on_over_it(
    lock_table: str, mariadb_aliases: list[str], alias: str, two: bool
) -> None:
    """The how-to's rule: B's transaction fences first (nothing read before), its fence waits
    for the stale holder A's commit, then B reads A's increment and adds its own; a second
    fence of the same hold in that transaction (after its reads) is its own. Under REPEATABLE
    READ nothing may take B's snapshot before every row of B's is locked: neither a plain read
    of the row before its lock (a snapshot from before A's commit: B refused whenever it
    waited), nor a read of B's first row before its second is locked (the same, for a hold of
    two resources, the second A's)."""
    counter = new_counter(alias)
    shared = f"first:{alias}:{two}:b"
    a = semaphore(shared, lease=60).acquire()
    assert break_holds(shared)
    b = semaphore([f"first:{alias}:{two}:a", shared] if two else shared, lease=60).acquire()
    a_wrote = threading.Event()

    def stale() -> str:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            a.fence_transaction(alias)
            increment(cursor, counter)
            a_wrote.set()
            until_another_waits_at_the_fence(cursor)  # B's fence, on the row A's transaction locked
        return "done"

    def newer() -> str:
        assert a_wrote.wait(BARRIER_WAIT)
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            b.fence_transaction(alias)
            increment(cursor, counter)
            with transaction.atomic(using=alias):
                b.fence_transaction(alias)
        return "done"

    try:
        outcome = in_threads(stale, newer, alias=alias)
    finally:
        give_back(a, b)
    assert (outcome, counted(alias, counter)) == (["done", "done"], 2)
    assert stored(alias, shared) == b.fences[shared]


@pytest.mark.parametrize("alias", list(ISOLATIONS))
def test_a_stale_holders_next_transaction_after_the_newer_ones_first_read_is_seen(
    lock_table: str, mariadb_aliases: list[str], alias: str
) -> None:
    """A's fence is stored (a transaction of A's hold committed) before B's transaction reads;
    A's next transaction writes that fence again (equal: not refused, the fence unchanged) and
    commits an increment; then B fences. Under REPEATABLE READ B's snapshot is older than A's
    second commit, which the fence cannot show (the same before and after it): the row's count
    of writes does, and B is refused rather than write 1 over A's 1."""
    counter = new_counter(alias)
    a, b = stale_and_newer(f"again:{alias}")
    with transaction.atomic(using=alias):
        a.fence_transaction(alias)
    b_read, a_committed = threading.Event(), threading.Event()

    def stale() -> str:
        assert b_read.wait(BARRIER_WAIT)
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            a.fence_transaction(alias)
            increment(cursor, counter)
        a_committed.set()
        return "done"

    def newer() -> str:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute("SELECT n FROM fence_work WHERE id = %s", [counter])  # the snapshot
            b_read.set()
            assert a_committed.wait(BARRIER_WAIT)
            with transaction.atomic(using=alias):
                b.fence_transaction(alias)
                increment(cursor, counter)
        return "done"

    try:
        outcome = in_threads(stale, newer, alias=alias)
    finally:
        give_back(a, b)
    n = counted(alias, counter)
    if alias == "mariadb_rc":  # each statement reads what is committed: B adds to A's
        assert (outcome, n) == (["done", "done"], 2)
    else:
        assert outcome[0] == "done" and isinstance(outcome[1], LockLost), outcome
        assert (n, stored(alias, f"again:{alias}"), b.lost) == (1, a.fence, False)


def test_migration_0004_over_rows_and_a_deploy_that_rolls(
    lock_table: str, mariadb_aliases: list[str]
) -> None:
    """0004 adds the count of writes to a table with rows (theirs NULL), and code of before it
    (a deploy rolling) still inserts rows without the column; a fenced transaction under
    REPEATABLE READ that read first then goes on over either."""
    call_command("migrate", "dynasem", "0003", database="mariadb_rc", verbosity=0)
    insert = "INSERT INTO dynasem_fence (digest, resource, fence) VALUES (%s, %s, 5)"
    try:
        with connections["mariadb_rc"].cursor() as cursor:
            cursor.execute(insert, [row_key("legacy:old"), "legacy:old"])
    finally:
        call_command("migrate", "dynasem", database="mariadb_rc", verbosity=0)
    with connections["mariadb_rc"].cursor() as cursor:
        cursor.execute(insert, [row_key("legacy:new"), "legacy:new"])
    for resource in ("legacy:old", "legacy:new"):
        held = semaphore(resource, lease=60).acquire()
        try:
            with (
                transaction.atomic(using="mariadb_rr"),
                connections["mariadb_rr"].cursor() as cursor,
            ):
                cursor.execute("SELECT COUNT(*) FROM fence_work")  # the snapshot
                held.fence_transaction("mariadb_rr")
        finally:
            give_back(held)
        with connections["mariadb_rc"].cursor() as cursor:
            cursor.execute(
                "SELECT fence, writes FROM dynasem_fence WHERE digest = %s", [row_key(resource)]
            )
            assert cursor.fetchone() == (held.fence, 1)
