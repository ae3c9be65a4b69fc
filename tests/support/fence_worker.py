"""The worker processes of tests/transactions/test_fenced_postgres.py: a purge-and-rebuild of one
project's rows on PostgreSQL under a lock, stalled on request the way a paused process stalls (the
whole process stops itself with SIGSTOP, its heartbeat included, until the test sends SIGCONT):

* ``commit``: after the block's last check, in its ``COMMIT`` (Django's ``_commit``);
* ``first``: after acquiring, before the transaction's first statement (for a fenced hold,
  inside ``fence_transaction`` after its deadline check, just before the fence is written).

Every step is reported through a pipe (a synchronous write: nothing is left in a buffer when
the process stops itself)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tests.support.workers import setup_django

# Short, so that a run takes about a second: B takes over LEASE + CLOCK_SKEW after A stopped.
# A trusts its hold LEASE - CLOCK_SKEW: 1.8 s to reach its stall, and B as long between two
# renewals of its rebuild's (0.6 s, from a lease of 0.8, and then 1 s were too little on a
# 2-core machine running the suite on 4 workers, 2026-12-02: A lost before its stall, B
# before its commit).
LEASE = 2.0
CLOCK_SKEW = 0.2
ROWS = 20

# A slow rebuild pauses halfway, its transaction open, until the test says "go" (once the
# other holder's statement waits on its row locks, or has ended): a pause of 0.4 s was too
# little on a loaded machine, 2026-12-05 (A's purge came after B's commit, and took B's rows).
GO_WITHIN = 30.0


def serve(endpoint: str, table_name: str, database_url: str, pipe: Any, name: str) -> None:
    """Run the rebuilds the test sends (None ends) and report each one's steps. ``name`` is
    the connection's application_name, by which the test sees its statements wait."""
    os.environ["DYNASEM_TEST_DATABASE_URL"] = database_url
    os.environ["PGAPPNAME"] = name  # libpq's
    os.environ["DYNASEM_TEST_CLOCK_SKEW"] = str(CLOCK_SKEW)
    setup_django(endpoint, table_name)
    from django.db import connections, transaction

    from dynasem import LockLost, semaphore
    from dynasem._transactions import fencing as fenced

    connection = connections["default"]
    stall_next = {"commit": False, "fence": False}

    def stop_here(where: str) -> None:
        pipe.send(("stalling", where))
        os.kill(os.getpid(), signal.SIGSTOP)
        pipe.send(("resumed", where))

    commit = connection._commit

    def stalling_commit() -> None:
        if stall_next["commit"]:
            stall_next["commit"] = False
            stop_here("commit")
        commit()
        pipe.send(("committed", time.monotonic()))

    connection._commit = stalling_commit
    write = fenced._write

    def stalling_write(*args: Any) -> bool:
        if stall_next["fence"]:
            stall_next["fence"] = False
            stop_here("first")
        return write(*args)

    fenced._write = stalling_write

    def purge_and_rebuild(project: int, label: str, slow: bool) -> None:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM fence_work WHERE project = %s", [project])
            pipe.send(("purged", cursor.rowcount))
            rows = [(project, label, n) for n in range(ROWS)]
            insert = "INSERT INTO fence_work (project, label, n) VALUES (%s, %s, %s)"
            cursor.executemany(insert, rows[: ROWS // 2])
            if slow:
                pipe.send(("halfway", None))
                if not pipe.poll(GO_WITHIN) or pipe.recv() != "go":
                    raise RuntimeError("no go from the test halfway through the rebuild")
            cursor.executemany(insert, rows[ROWS // 2 :])

    def rebuild(resource: str, project: int, label: str, how: str, stall: Any, slow: bool):
        lock = semaphore(resource, lease=LEASE, wait=30, fence_db=how == "fence_db")
        if stall == "first" and how != "none":
            stall_next["fence"] = True
        with lock as held:
            pipe.send(("acquired", held.fence))
            with transaction.atomic():  # a savepoint inside fence_db's own transaction
                if how == "explicit":
                    held.fence_transaction()
                elif stall == "first":
                    stop_here("first")
                purge_and_rebuild(project, label, slow)
                # The block's last check (not in "none": a check narrows the window of (b)
                # without closing it; (a) stalls after it anyway).
                if how != "none" and held.lost:
                    raise LockLost(resource, "lost before the commit")
                # The COMMIT comes at this block's end, or at fence_db's (this is a savepoint).
                stall_next["commit"] = stall == "commit"

    while True:
        job = pipe.recv()
        if job is None:
            return
        try:
            rebuild(*job)
        except LockLost as exc:
            pipe.send(("lost", str(exc)))
        except Exception as exc:  # reported, not raised: the test decides
            pipe.send(("error", repr(exc)))
        else:
            pipe.send(("done", None))
        finally:
            stall_next.update(commit=False, fence=False)
