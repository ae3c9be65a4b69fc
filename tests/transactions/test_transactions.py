"""Holds and run_once jobs follow Django's transaction: given back after the outermost
transaction commits, or at once when it rolls back (dynasem/_transactions/commit.py).

Most tests use ``transactional_db``: their ``transaction.atomic`` blocks are real transactions
(not savepoints inside a TestCase's), as in production.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connections, transaction
from django.http import HttpResponse
from django.test import Client, RequestFactory

from dynasem import (
    AlreadyDone,
    LockLost,
    SemaphoreBusy,
    run_once,
    semaphore,
)
from dynasem._operators import locks as operations
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows, records
from dynasem.signals import lock_lost, lock_released
from tests.support import views

both_databases = pytest.mark.django_db(transaction=True, databases=["default", "other"])


class Boom(Exception):
    pass


def is_busy(resource: str) -> bool:
    """Can another acquisition take ``resource`` right now? (It gives it back at once.) Asked
    from another thread: this one's transaction may own a hold waiting for its commit, which
    this thread would take again at once."""
    import threading

    answer: list[bool] = []

    def attempt() -> None:
        try:
            semaphore(resource, wait=0, on_commit=False).acquire().release()
        except SemaphoreBusy:
            answer.append(True)
        else:
            answer.append(False)

    other = threading.Thread(target=attempt)
    other.start()
    other.join()
    return answer[0]


@contextlib.contextmanager
def releases(
    using: str = "default", committed: str | None = None
) -> Iterator[list[dict[str, Any]]]:
    """Records, for every lock_released, the state of ``using``'s transaction at that moment
    (and, given a username, whether that user's row was committed by then)."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, resource: str, **kwargs: Any) -> None:
        connection = connections[using]
        seen.append({"resource": resource, "in_atomic_block": connection.in_atomic_block})
        if committed is not None:
            seen[-1]["committed"] = User.objects.filter(username=committed).exists()

    lock_released.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        lock_released.disconnect(receiver)


# ---------------------------------------------------------------------------------------------
# with semaphore(...) inside transaction.atomic
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_block_left_inside_atomic_is_given_back_after_the_commit(lock_table):
    with releases() as released:
        with transaction.atomic():
            with semaphore("tx:commit") as held:
                User.objects.create(username="under-the-lock")
            # The block is over, its writes are not committed: nobody else may start yet.
            assert held.pending_commit and not held.released
            assert [h.token for h in holds_on("tx:commit")] == [held.token]
            assert is_busy("tx:commit")
            assert released == []
        assert held.released and not held.pending_commit
        assert holds_on("tx:commit") == []
        assert not is_busy("tx:commit")
    # Given back once, after the commit ended the transaction.
    assert released[0] == {"resource": "tx:commit", "in_atomic_block": False}
    assert User.objects.filter(username="under-the-lock").exists()


@pytest.mark.django_db(transaction=True)
def test_hold_is_renewed_while_it_waits_for_the_commit(lock_table):
    with transaction.atomic():
        with semaphore("tx:renewed", lease=1.5) as held:
            pass
        first = holds_on("tx:renewed")[0].expires_ms
        time.sleep(1.6)  # longer than the lease: only renewals keep it ours
        assert not held.lost
        (hold,) = holds_on("tx:renewed")
        assert hold.token == held.token and hold.expires_ms > first
        assert is_busy("tx:renewed")
    assert holds_on("tx:renewed") == []


@pytest.mark.django_db(transaction=True)
def test_rollback_gives_back_at_once(lock_table):
    with releases() as released, pytest.raises(Boom):
        with transaction.atomic():
            with semaphore("tx:rollback") as held:
                User.objects.create(username="rolled-back")
            assert held.pending_commit
            raise Boom
    assert held.released
    assert holds_on("tx:rollback") == []
    assert released == [{"resource": "tx:rollback", "in_atomic_block": False}]
    assert not User.objects.filter(username="rolled-back").exists()


@pytest.mark.django_db(transaction=True)
def test_set_rollback_gives_back_when_the_block_ends(lock_table):
    with transaction.atomic():
        with semaphore("tx:set-rollback") as held:
            pass
        transaction.set_rollback(True)
        assert held.pending_commit
    assert held.released and holds_on("tx:set-rollback") == []


@pytest.mark.django_db(transaction=True)
def test_block_raising_inside_atomic_waits_for_the_rollback(lock_table):
    with pytest.raises(Boom), transaction.atomic():
        try:
            with semaphore("tx:raises") as held:
                raise Boom
        finally:
            # The exception has not reached the atomic block yet: still ours.
            assert held.pending_commit and [h.token for h in holds_on("tx:raises")]
    assert holds_on("tx:raises") == []


@pytest.mark.django_db(transaction=True)
def test_only_the_outermost_commit_counts(lock_table):
    with transaction.atomic():
        with transaction.atomic():  # a savepoint
            with semaphore("tx:nested") as held:
                pass
        # The savepoint was released, the transaction is still open.
        assert held.pending_commit and is_busy("tx:nested")
    assert held.released and holds_on("tx:nested") == []


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_keeps_the_hold_until_the_transaction_ends(lock_table):
    with transaction.atomic():
        with contextlib.suppress(Boom), transaction.atomic():
            with semaphore("tx:savepoint") as held:
                pass
            raise Boom
        # Writes made under the lock before the savepoint may still commit: still ours.
        assert held.pending_commit and is_busy("tx:savepoint")
    assert held.released and holds_on("tx:savepoint") == []


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_then_outer_rollback_gives_back(lock_table):
    with pytest.raises(Boom), transaction.atomic():
        with contextlib.suppress(Boom), transaction.atomic():
            with semaphore("tx:savepoint-then-rollback") as held:
                pass
            raise Boom
        raise Boom
    assert held.released and holds_on("tx:savepoint-then-rollback") == []


@pytest.mark.django_db(transaction=True)
def test_release_called_inside_atomic_waits_too(lock_table):
    held = semaphore("tx:manual").acquire()
    with transaction.atomic():
        held.release()
        held.release()  # a second call changes nothing
        assert held.pending_commit and is_busy("tx:manual")
    assert held.released and holds_on("tx:manual") == []


@pytest.mark.django_db(transaction=True)
def test_on_commit_false_gives_back_at_once(lock_table):
    with transaction.atomic():
        with semaphore("tx:opt-out", on_commit=False) as held:
            pass
        assert held.released and not held.pending_commit
        assert holds_on("tx:opt-out") == []


@pytest.mark.django_db(transaction=True)
def test_outside_any_transaction_nothing_changes(lock_table):
    with semaphore("tx:none") as held:
        pass
    assert held.released and holds_on("tx:none") == []


@pytest.mark.django_db(transaction=True)
def test_async_with_gives_back_at_once(lock_table):
    import asyncio

    async def main() -> Any:
        async with semaphore("tx:async") as held:
            pass
        return held

    held = asyncio.run(main())
    assert held.released and holds_on("tx:async") == []


# ---------------------------------------------------------------------------------------------
# using=
# ---------------------------------------------------------------------------------------------


@both_databases
def test_using_follows_that_databases_transaction(lock_table):
    with releases("other") as released:
        with transaction.atomic(using="other"):
            with semaphore("tx:other", using="other") as on_other:
                pass
            with semaphore("tx:default") as on_default:
                pass
            # The default database is in no transaction: that hold went back at once.
            assert on_default.released
            assert on_other.pending_commit and is_busy("tx:other")
        assert on_other.released
    assert released[-1] == {"resource": "tx:other", "in_atomic_block": False}


@both_databases
def test_default_database_transaction_does_not_hold_a_using_other_hold(lock_table):
    with transaction.atomic():
        with semaphore("tx:other-only", using="other") as held:
            pass
        assert held.released


@both_databases
def test_a_hold_waiting_for_one_databases_commit_is_not_taken_again_for_anothers(lock_table):
    # Returned as it is, it would be given back at "other"'s commit, which may come before
    # the default database's: the work done under it there would commit after the release.
    with transaction.atomic():
        with transaction.atomic(using="other"):
            with semaphore("tx:two-dbs", using="other") as held:
                pass
            assert held.pending_commit
            with pytest.raises(ValueError, match="'other'.*'default'.*same using="):
                with semaphore("tx:two-dbs"):
                    pass
            # Work that commits where the hold waits, or at the block's end: it covers it.
            with semaphore("tx:two-dbs", using="other") as again:
                assert again is held
            with semaphore("tx:two-dbs", on_commit=False) as again:
                # The same hold, seen through a view whose fence_transaction() fences its
                # own semaphore's database (default), not "other".
                assert again.outer is held and again.using is None
            assert held.pending_commit and is_busy("tx:two-dbs")
        assert held.released and not is_busy("tx:two-dbs")


def test_bad_using_and_on_commit_are_refused_naming_them():
    with pytest.raises(ValueError, match="using='nope'.*DATABASES"):
        semaphore("x", using="nope")
    with pytest.raises(TypeError, match="using"):
        semaphore("x", using=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_commit"):
        semaphore("x", on_commit="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="using='nope'"):
        run_once("x", using="nope")


# ---------------------------------------------------------------------------------------------
# The decorator: ATOMIC_REQUESTS, and @transaction.atomic stacked over it
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_view_under_atomic_requests_gives_back_after_the_commit(lock_table, monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    views.AFTER_COMMIT.clear()
    with releases(committed="txview-a") as released:
        response = Client().get("/tx/a/")
    assert response.content == b"in transaction: True"  # Django wrapped the view in atomic
    # Given back once the view's row was committed, before the other commit hooks ran (so
    # that one of them raising cannot keep the lock).
    assert released == [{"resource": "txview:a", "in_atomic_block": False, "committed": True}]
    assert views.AFTER_COMMIT == [{"holders": 0, "in_atomic_block": False, "committed": True}]
    assert holds_on("txview:a") == []


@pytest.mark.django_db(transaction=True)
def test_view_without_atomic_requests_gives_back_when_it_returns(lock_table):
    views.AFTER_COMMIT.clear()
    response = Client().get("/tx/b/")
    assert response.content == b"in transaction: False"
    # No transaction: on_commit ran at once, inside the view, while the lock was held.
    assert views.AFTER_COMMIT == [{"holders": 1, "in_atomic_block": False, "committed": True}]
    assert holds_on("txview:b") == []


@pytest.mark.django_db(transaction=True)
def test_atomic_stacked_over_the_decorator(lock_table):
    seen: list[int] = []

    @transaction.atomic
    @semaphore("fn:{n}")
    def work(request: Any, n: int) -> HttpResponse:
        User.objects.create(username=f"fn-{n}")
        transaction.on_commit(lambda: seen.append(len(holds_on(f"fn:{n}"))))
        return HttpResponse()

    with releases(committed="fn-4") as released:
        work(RequestFactory().get("/"), n=4)
    # Given back after the commit, before the app's own commit hook ran.
    assert released == [{"resource": "fn:4", "in_atomic_block": False, "committed": True}]
    assert seen == [0]
    assert holds_on("fn:4") == []


@pytest.mark.django_db(transaction=True)
def test_atomic_stacked_over_the_decorator_of_a_function(lock_table):
    seen: list[int] = []

    @transaction.atomic
    @semaphore("job:{pk}")
    def job(pk: int) -> None:
        User.objects.create(username=f"job-{pk}")
        transaction.on_commit(lambda: seen.append(len(holds_on(f"job:{pk}"))))

    with releases(committed="job-5") as released:
        job(5)
    assert released == [{"resource": "job:5", "in_atomic_block": False, "committed": True}]
    assert seen == [0]
    assert holds_on("job:5") == []


# ---------------------------------------------------------------------------------------------
# The lease lost before the commit
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_hold_lost_before_the_commit_is_signalled_and_logged(lock_table, caplog):
    lost: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs)

    lock_lost.connect(receiver, weak=False)
    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"), transaction.atomic():
            with semaphore("tx:lost", lease=1.5) as held:
                pass
            # An operator breaks the hold and someone else takes the lock.
            assert operations.break_hold("tx:lost", held.token)
            taken: list[Any] = []
            # Someone else: another thread (this one's transaction would take its own again).
            thread = threading.Thread(
                target=lambda: taken.append(
                    semaphore("tx:lost", user="other", on_commit=False).acquire()
                )
            )
            thread.start()
            thread.join()
            (other,) = taken
            deadline = time.monotonic() + 5
            while not held.lost and time.monotonic() < deadline:
                time.sleep(0.02)  # the heartbeat finds out at its next renewal
            assert held.lost
    finally:
        lock_lost.disconnect(receiver)
    assert [(s["token"], s["pending_commit"]) for s in lost] == [(held.token, True)]
    assert "committed after the hold was lost" in caplog.text
    # The commit gave back nothing of the new holder's.
    assert [h.token for h in holds_on("tx:lost")] == [other.token]
    other.release()


@pytest.mark.django_db(transaction=True)
def test_hold_known_lost_at_block_exit_raises_there(lock_table):
    with pytest.raises(LockLost), transaction.atomic():
        with semaphore("tx:lost-early") as held:
            User.objects.create(username="lost-early")
            assert operations.break_hold("tx:lost-early", held.token)
            with contextlib.suppress(LockLost):
                held.renew()  # what the heartbeat does: it finds the hold gone
    # LockLost left the atomic block: its work was rolled back.
    assert not User.objects.filter(username="lost-early").exists()


# ---------------------------------------------------------------------------------------------
# Django's TestCase: its own atomic blocks never commit and do not count
# ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_testcase_transaction_is_not_a_transaction(lock_table):
    with semaphore("tx:testcase") as held:
        pass
    assert held.released and holds_on("tx:testcase") == []


@pytest.mark.django_db
def test_inside_testcase_an_own_atomic_waits_like_on_commit(
    lock_table, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            with semaphore("tx:captured") as held:
                pass
        assert held.pending_commit  # TestCase never commits: on_commit callbacks wait
    assert held.released and holds_on("tx:captured") == []


# ---------------------------------------------------------------------------------------------
# run_once
# ---------------------------------------------------------------------------------------------


def job_status(key: str) -> str:
    return lock_rows.get_item(key, records.JOB_SK)["status"]


@pytest.mark.django_db(transaction=True)
def test_run_once_writes_done_after_the_commit(lock_table):
    with transaction.atomic():
        with run_once("tx:job") as job:
            User.objects.create(username="job-work")
        assert job.pending_commit and job_status("tx:job") == "RUNNING"
        with pytest.raises(SemaphoreBusy), run_once("tx:job"):
            pytest.fail("the job's work is not committed yet: nobody else may run it")
    assert job.status == "DONE" and job_status("tx:job") == "DONE"


@pytest.mark.django_db(transaction=True)
def test_run_once_writes_failed_on_rollback(lock_table):
    with pytest.raises(Boom), transaction.atomic():
        with run_once("tx:job-rolled-back") as job:
            pass
        raise Boom
    assert job.status == "FAILED"
    row = lock_rows.get_item("tx:job-rolled-back", records.JOB_SK)
    assert row["status"] == "FAILED" and "rolled back" in row["error"]
    with run_once("tx:job-rolled-back") as again:  # FAILED runs again
        assert again.attempt == 2


@pytest.mark.django_db(transaction=True)
def test_run_once_body_error_inside_atomic_is_failed_with_its_message(lock_table):
    with pytest.raises(Boom), transaction.atomic(), run_once("tx:job-raises"):
        raise Boom("bad row")
    row = lock_rows.get_item("tx:job-raises", records.JOB_SK)
    assert row["status"] == "FAILED" and row["error"] == "Boom: bad row"


@pytest.mark.django_db(transaction=True)
def test_run_once_on_commit_false_writes_done_at_once(lock_table):
    with transaction.atomic():
        with run_once("tx:job-now", on_commit=False):
            pass
        assert job_status("tx:job-now") == "DONE"


# ---------------------------------------------------------------------------------------------
# Review findings (issue 20): hooks that raise, savepoints, stalls, a closed connection
# ---------------------------------------------------------------------------------------------


class BrokerDown(Exception):
    """What another app's on_commit hook raises after the commit (say, task.delay())."""


def broker_down() -> None:
    raise BrokerDown("the broker is down")


@pytest.mark.django_db(transaction=True)
def test_run_once_is_done_when_a_later_commit_hook_raises(lock_table):
    with pytest.raises(BrokerDown) as raised:
        with transaction.atomic():
            with run_once("tx:job-hook-raises") as job:
                User.objects.create(username="job-hook-work")
                transaction.on_commit(broker_down)  # registered before run_once's own
    # Committed: the job is DONE, whatever another app's hook did after the commit, even
    # while the caller still has that hook's exception in hand.
    assert User.objects.filter(username="job-hook-work").exists()
    assert job_status("tx:job-hook-raises") == "DONE" and job.status == "DONE"
    del raised
    with pytest.raises(AlreadyDone), run_once("tx:job-hook-raises"):
        pytest.fail("a committed job ran a second time")


@pytest.mark.django_db(transaction=True)
def test_run_once_rolled_back_with_its_savepoint_runs_again(lock_table):
    with transaction.atomic():
        with contextlib.suppress(Boom), transaction.atomic():
            with run_once("tx:job-savepoint"):
                User.objects.create(username="job-savepoint-work")
            raise Boom  # a later check in the inner block: its savepoint rolls back
        User.objects.create(username="outer-work")
    assert User.objects.filter(username="outer-work").exists()
    assert not User.objects.filter(username="job-savepoint-work").exists()
    row = lock_rows.get_item("tx:job-savepoint", records.JOB_SK)
    assert row["status"] == "FAILED" and "savepoint" in row["error"]
    with run_once("tx:job-savepoint") as again:  # its work is gone: it runs again
        assert again.attempt == 2


@pytest.mark.django_db(transaction=True)
def test_run_once_stalled_past_its_lease_then_rolled_back_is_not_done(lock_table):
    with pytest.raises(Boom), transaction.atomic():
        with run_once("tx:job-stalled", lease=1) as job:
            job._heartbeat.stop()  # the whole process stalls: no renewal either
            User.objects.create(username="job-stalled-work")
            time.sleep(0.8)  # past the trusted lease (1 s less CLOCK_SKEW 0.5 s)
        raise Boom  # the transaction rolls back after the block
    assert not User.objects.filter(username="job-stalled-work").exists()
    assert job_status("tx:job-stalled") == "FAILED"
    with run_once("tx:job-stalled") as again:
        assert again.attempt == 2


@pytest.mark.django_db(transaction=True)
def test_run_once_stalled_and_claimed_by_another_raises_inside_the_transaction(lock_table):
    claimed: list[int] = []

    def other_worker() -> None:
        with run_once("tx:job-taken") as other:
            claimed.append(other.attempt)

    with pytest.raises(LockLost), transaction.atomic():
        with run_once("tx:job-taken", lease=1) as job:
            job._heartbeat.stop()
            User.objects.create(username="job-taken-work")
            time.sleep(1.7)  # past the lease and CLOCK_SKEW: another worker claims it
            worker = threading.Thread(target=other_worker)
            worker.start()
            worker.join()
    # The stale run's work rolled back with its transaction; the other run's DONE stands.
    assert claimed == [2]
    assert not User.objects.filter(username="job-taken-work").exists()
    assert job_status("tx:job-taken") == "DONE"


@pytest.mark.django_db(transaction=True)
def test_hold_is_given_back_when_a_later_commit_hook_raises(lock_table):
    with pytest.raises(BrokerDown) as raised:
        with transaction.atomic():
            with semaphore("tx:hook-raises") as held:
                transaction.on_commit(broker_down)
    # The caller still has the hook's exception in hand: the hold is given back all the same.
    assert raised.value is not None
    assert held.released and not held.pending_commit
    assert holds_on("tx:hook-raises") == [] and not is_busy("tx:hook-raises")


@pytest.mark.django_db(transaction=True)
def test_a_transaction_does_not_wait_on_its_own_pending_release(lock_table):
    with transaction.atomic():
        with semaphore("tx:twice", wait=0) as first:
            pass
        assert first.pending_commit
        # The same resource again in the same transaction: ours already, no wait.
        with semaphore("tx:twice", wait=0) as second:
            assert second.fence == first.fence and second.token == first.token
        with semaphore(["tx:twice"], wait=0, shared=True):
            pass  # an exclusive hold covers a shared request too
        assert is_busy("tx:twice")
    assert first.released and holds_on("tx:twice") == []


@pytest.mark.django_db(transaction=True)
def test_a_hold_taken_again_in_its_transaction_and_lost_there_raises_at_that_block_exit(
    lock_table,
):
    """The second block of a hold waiting for its commit (the view that calls a locked
    helper twice) ends with the hold known lost (an operator broke it, the heartbeat found
    out): that block's exit raises LockLost, as the first block's would, so the transaction
    rolls back instead of committing work done after another holder may have begun. Before,
    the exit returned quietly (the hold was pending already) and the work committed."""
    with pytest.raises(LockLost), transaction.atomic():
        with semaphore("tx:again-lost", lease=1.5) as first:
            pass
        assert first.pending_commit
        with semaphore("tx:again-lost") as second:
            assert second is first
            User.objects.create(username="again-lost")
            assert operations.break_hold("tx:again-lost", first.token)
            deadline = time.monotonic() + 5
            while not first.lost and time.monotonic() < deadline:
                time.sleep(0.02)  # the heartbeat finds out at its next renewal
            assert first.lost
    assert not User.objects.filter(username="again-lost").exists()


@pytest.mark.django_db(transaction=True)
def test_view_calling_a_locked_helper_twice_under_atomic_requests(lock_table, monkeypatch):
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)

    @semaphore("helper:{n}", wait=0)
    def rebuild(n: int) -> int:
        User.objects.create(username=f"rebuilt-{n}-{User.objects.count()}")
        return current_fence(f"helper:{n}")

    def view(request: Any) -> HttpResponse:
        return HttpResponse(f"{rebuild(7)} {rebuild(7)}")

    response = transaction.atomic(view)(RequestFactory().get("/"))
    first, second = response.content.split()
    assert first == second  # one hold, kept until the commit
    assert User.objects.count() == 2 and holds_on("helper:7") == []


def current_fence(resource: str) -> bytes:
    from dynasem import current_hold

    return str(current_hold(resource).fence).encode()


@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_closed_connection_inside_atomic_gives_back_when_the_block_ends(lock_table):
    connection = connections["file"]
    with pytest.raises(DatabaseError), transaction.atomic(using="file"):
        with semaphore("tx:closed", using="file") as held:
            User.objects.using("file").create(username="closed-work")
        connection.close()  # close_old_connections() in a long task, say
        assert held.released  # the transaction can never commit now
        User.objects.using("file").count()  # a closed connection: this raises
    assert held.released and holds_on("tx:closed") == []
    assert not User.objects.using("file").filter(username="closed-work").exists()
