"""Holds and jobs that wait for a commit (dynasem/_transactions/commit.py), found by review
(thirty-first session): each test failed before its mend."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connections, transaction

from dynasem import SemaphoreBusy, run_once, semaphore
from dynasem._operators.locks import holds_on
from tests.transactions.test_transactions import is_busy


@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_connection_closed_inside_the_block_gives_back_when_the_transaction_ends(lock_table):
    """The docs: "connection.close() inside atomic (close_old_connections() in a long task)
    dooms the transaction: the hold is given back at once". Closed INSIDE the semaphore's
    block (a long task calling close_old_connections() between two steps of its work), the
    block's end registers the give-back on the closed connection's on_commit list; the
    atomic block's exit then sets connection.connection = None without emptying that list
    (Django empties it at the next connect()), so the hold stays pending and renewed until
    this thread next connects to that database: the transaction is over (rolled back by the
    database), the lock is kept for nobody."""
    connection = connections["file"]
    with transaction.atomic(using="file"):
        with semaphore("tx:closed-inside", using="file", lease=1.5) as held:
            User.objects.using("file").create(username="closed-inside")
            connection.close()  # close_old_connections() in a long task, say
    # The transaction is over: it can never commit (the database rolled it back).
    assert not connection.in_atomic_block
    time.sleep(3.2)  # two leases: not a late give-back, the heartbeat keeps renewing it
    assert held.released and not held.pending_commit, "hold kept after the transaction ended"
    assert holds_on("tx:closed-inside") == [] and not is_busy("tx:closed-inside")
    assert not User.objects.using("file").filter(username="closed-inside").exists()


@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_connection_closed_inside_a_raising_block_gives_back_when_the_transaction_ends(
    lock_table,
):
    """The same when the block raises because its connection is closed (the next query)."""
    connection = connections["file"]
    with pytest.raises(DatabaseError), transaction.atomic(using="file"):
        with semaphore("tx:closed-raising", using="file") as held:
            User.objects.using("file").create(username="closed-raising")
            connection.close()
            User.objects.using("file").count()  # a closed connection: this raises
    assert not connection.in_atomic_block
    assert held.released and not held.pending_commit, "hold kept after the transaction ended"
    assert holds_on("tx:closed-raising") == [] and not is_busy("tx:closed-raising")


@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_a_forked_childs_copy_of_the_commit_hook_does_not_end_the_parents_pending_job(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run_once job whose body returned waits for its transaction (pending_commit). A
    child forked meanwhile that closes its copies of Django's connections, as children
    after a fork should, drops ITS copy of the commit hook, and the finalizer runs in the
    child: it found the connection "closed inside the transaction" and wrote FAILED under
    the parent's token while the parent's transaction was open, so another worker could run
    the job's body before the first run committed (found by review). The child's drop is
    played here in this process, as a child sees it (another pid): SQLite's files do not
    survive a child's close of an inherited connection."""

    from dynasem._transactions import commit
    from tests.transactions.test_transactions import job_status

    parent = os.getpid()
    with transaction.atomic(using="file"):
        with run_once("tx:job-fork", using="file") as job:
            User.objects.using("file").create(username="job-fork-work")
        assert job.pending_commit and job_status("tx:job-fork") == "RUNNING"
        with monkeypatch.context() as child:
            child.setattr(os, "getpid", lambda: parent + 1)
            for pending in list(commit._pending[connections["file"]]):
                pending._dropped()  # the child's close drops its copy of the hook
        assert job.pending_commit and job_status("tx:job-fork") == "RUNNING"
        ran_again: list[bool] = []

        def another_worker() -> None:
            try:
                with run_once("tx:job-fork", on_commit=False):
                    ran_again.append(True)
            except SemaphoreBusy:
                ran_again.append(False)

        worker = threading.Thread(target=another_worker)
        worker.start()
        worker.join()
        assert ran_again == [False], "the job's body ran again before the first run committed"
    assert User.objects.using("file").filter(username="job-fork-work").exists()
    assert job.status == "DONE" and job_status("tx:job-fork") == "DONE"


@pytest.mark.django_db(transaction=True)
def test_release_all_does_not_give_back_a_hold_waiting_for_another_threads_commit(lock_table):
    """release_all() (and atexit) give back the holds "nobody can be using any more": those
    taken by the calling thread or by an ended thread, judged by Held.thread, the thread that
    TOOK the hold. A hold waiting for a commit belongs to the transaction it was released in,
    which may be another thread's: taken by thread A (which then ends, or calls release_all,
    "done with its holds"), released by thread B inside B's transaction.atomic (pending
    commit). release_all() from anywhere then gives it back while B's transaction is still
    open: another holder begins before B's work under the lock is committed (the case
    commit.py exists to prevent; at exit, B a daemon thread can still commit after it)."""
    import dynasem

    taken: list = []
    taker = threading.Thread(target=lambda: taken.append(semaphore("tx:other-thread").acquire()))
    taker.start()
    taker.join()  # thread A took it and ended
    held = taken[0]

    in_transaction, go_on = threading.Event(), threading.Event()

    def committer() -> None:  # thread B: works under the hold and releases it in its transaction
        with transaction.atomic():
            User.objects.create(username="other-thread-work")
            held.release()
            in_transaction.set()
            go_on.wait(10)
        connections.close_all()

    b = threading.Thread(target=committer)
    b.start()
    assert in_transaction.wait(10)
    try:
        assert held.pending_commit
        dynasem.release_all()  # e.g. the main thread at its end, or atexit
        # B's transaction has not committed: nobody else may take the lock yet.
        assert not held.released and is_busy("tx:other-thread"), (
            "given back before its transaction committed"
        )
    finally:
        go_on.set()
        b.join()
