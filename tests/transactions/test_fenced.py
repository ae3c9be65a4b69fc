"""Transactions fenced by the database (dynasem/_transactions/fencing.py) on SQLite, in one
process: the
fence row written first, a newer holder's fence refusing an older hold's transaction, and the
refusals of what cannot be fenced. tests/transactions/test_fenced_postgres.py stalls real processes
on PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from dynasem import LockLost, run_once, semaphore
from dynasem import _clock as clock
from dynasem._transactions.fencing import row_key
from dynasem.models import Fence
from dynasem.signals import lock_lost
from tests.support.helpers import RequestCounter

pytestmark = pytest.mark.django_db(transaction=True)


def stored(resource: str) -> int | None:
    row = Fence.objects.filter(digest=row_key(resource)).first()
    return None if row is None else row.fence


def test_a_fenced_block_writes_its_fence_first_and_commits_its_work(lock_table: str) -> None:
    with semaphore("tbl:1", fence_db=True) as held:
        assert connections["default"].in_atomic_block
        assert stored("tbl:1") == held.fence
        User.objects.create(username="rebuilt")
    assert User.objects.filter(username="rebuilt").exists()
    assert held.released
    row = Fence.objects.get(digest=row_key("tbl:1"))
    assert row.resource == "tbl:1" and row.fence == held.fence
    with semaphore("tbl:1", fence_db=True) as newer:
        assert stored("tbl:1") == newer.fence > held.fence


def test_an_older_hold_is_refused_and_its_work_rolled_back(lock_table: str) -> None:
    """The hold's fence is older than the stored one (a newer holder wrote it while this one
    stalled): LockLost at the first statement, nothing of the block lands, the hold is lost."""
    held = semaphore("tbl:2").acquire()
    try:
        Fence.objects.create(digest=row_key("tbl:2"), resource="tbl:2", fence=held.fence + 1)
        with pytest.raises(LockLost, match=r"holds fence \d+ for it, newer than this hold's"):
            with transaction.atomic():
                User.objects.create(username="stale")
                held.fence_transaction()
        assert not User.objects.filter(username="stale").exists()
        assert held.lost
        assert stored("tbl:2") == held.fence + 1
    finally:
        with pytest.raises(LockLost):
            held.release()


def test_a_fenced_decorated_view_under_atomic_requests(lock_table: str, settings: Any) -> None:
    calls: list[int] = []

    @semaphore("tbl:{n}", fence_db=True)
    def rebuild(n: int) -> int:
        calls.append(n)
        assert stored(f"tbl:{n}") is not None
        return n

    with transaction.atomic():  # as ATOMIC_REQUESTS wraps a view
        assert rebuild(3) == 3
    assert calls == [3] and stored("tbl:3") is not None


@pytest.mark.reentry
def test_a_nested_fenced_block_of_the_same_hold_writes_its_own_fence_again(
    lock_table: str,
) -> None:
    with semaphore("tbl:4", fence_db=True) as outer:
        with semaphore("tbl:4", fence_db=True) as inner:
            assert inner.fence == outer.fence == stored("tbl:4")
    assert outer.released


def test_a_hold_past_its_deadline_rolls_back_at_the_end_of_its_block(lock_table: str) -> None:
    with pytest.raises(LockLost):
        with semaphore("tbl:5", fence_db=True) as held:
            User.objects.create(username="late")
            held._deadline = clock.monotonic() - 1  # stalled past its trusted lease
    assert not User.objects.filter(username="late").exists()


def test_a_lost_hold_whose_signal_receiver_raises_still_rolls_back_and_closes_its_block(
    lock_table: str,
) -> None:
    """The end of a block that finds its hold lost sends lock_lost; a receiver that raises
    (Django's send lets it through) must not leave the block's transaction open."""

    def receiver(**kwargs: Any) -> None:
        raise RuntimeError("a receiver failed")

    lock_lost.connect(receiver, weak=False)
    try:
        with pytest.raises(RuntimeError, match="a receiver failed"):
            with semaphore("tbl:5b", fence_db=True) as held:
                User.objects.create(username="late-signal")
                held._deadline = clock.monotonic() - 1  # stalled past its trusted lease
    finally:
        lock_lost.disconnect(receiver)
    assert not connections["default"].in_atomic_block
    assert not User.objects.filter(username="late-signal").exists()
    assert held.lost


def test_the_block_raising_rolls_back_and_gives_back(lock_table: str) -> None:
    with pytest.raises(ZeroDivisionError):
        with semaphore("tbl:6", fence_db=True) as held:
            User.objects.create(username="half")
            1 / 0  # noqa: B018
    assert not User.objects.filter(username="half").exists()
    assert held.released


def test_several_resources_are_fenced_in_one_order(lock_table: str) -> None:
    with semaphore(["b", "a"], fence_db=True) as held:
        assert {r: stored(r) for r in ("a", "b")} == held.fences


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"limit": 2}, ValueError, "fence_db needs an exclusive semaphore"),
        ({"shared": True}, ValueError, "fence_db needs an exclusive semaphore"),
        ({"fence_db": 1}, TypeError, "fence_db must be True or False"),
    ],
)
def test_what_cannot_be_fenced_is_refused_at_once(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        semaphore("x", **{"fence_db": True, **kwargs})


def test_outside_a_transaction_fence_transaction_is_refused(lock_table: str) -> None:
    with semaphore("tbl:7") as held:
        with pytest.raises(TransactionManagementError, match=r"inside transaction\.atomic"):
            held.fence_transaction()
    assert stored("tbl:7") is None


def test_async_code_is_told_how_to_fence() -> None:
    async def enter() -> None:
        async with semaphore("x", fence_db=True):
            pass

    with pytest.raises(TypeError, match="sync_to_async"):
        asyncio.run(enter())
    with pytest.raises(TypeError, match="sync_to_async"):

        @semaphore("x", fence_db=True)
        async def view() -> None:
            pass


def test_a_fenced_block_sends_no_extra_dynamodb_request(
    lock_table: str, requests_sent: RequestCounter
) -> None:
    """The fence goes to the database only: an uncontended fenced hold is the plain
    acquire + release."""
    with semaphore("tbl:8", fence_db=True):
        pass
    assert requests_sent.total == 2


def test_a_missing_fence_table_says_to_migrate(lock_table: str) -> None:
    from django.db import DatabaseError, connection

    with connection.schema_editor() as editor:
        editor.delete_model(Fence)
    try:
        with pytest.raises(DatabaseError) as caught:
            with semaphore("tbl:9", fence_db=True):
                pass
        assert "run `manage.py migrate dynasem --database default`" in caught.value.__notes__[0]
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(Fence)


def test_a_hold_given_back_cannot_fence_a_transaction(lock_table: str) -> None:
    held = semaphore("tbl:10").acquire()
    held.release()
    with pytest.raises(LockLost, match="given back before its transaction was fenced"):
        with transaction.atomic():
            held.fence_transaction()
    assert stored("tbl:10") is None


@pytest.mark.reentry
def test_a_refusal_seen_through_a_nested_view_loses_the_hold_itself(lock_table: str) -> None:
    with pytest.raises(LockLost):
        with semaphore(["tbl:11", "tbl:12"]) as outer:
            with semaphore("tbl:11") as inner:  # a nested view of the outer hold
                assert inner is not outer
                Fence.objects.create(
                    digest=row_key("tbl:11"), resource="tbl:11", fence=outer.fences["tbl:11"] + 1
                )
                with pytest.raises(LockLost):
                    with transaction.atomic():
                        inner.fence_transaction()
                assert outer.lost  # the hold itself, not only the view


class FencesToOther:
    """A project's router: dynasem's models (the Fence table) live in the database "other"."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "other" if model._meta.app_label == "dynasem" else None

    db_for_read = db_for_write


routed = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def stored_in(alias: str, resource: str) -> int | None:
    row = Fence.objects.using(alias).filter(digest=row_key(resource)).first()
    return None if row is None else row.fence


@routed
def test_fence_db_without_using_follows_the_router(lock_table: str, settings: Any) -> None:
    """No ``using``: the block's transaction and its fence row are where the routers send
    the Fence model's writes, not ``default``."""
    settings.DATABASE_ROUTERS = [f"{__name__}.FencesToOther"]
    with semaphore("tbl:routed", fence_db=True) as held:
        assert connections["other"].in_atomic_block
        assert not connections["default"].in_atomic_block
    assert stored_in("other", "tbl:routed") == held.fence
    assert stored_in("default", "tbl:routed") is None
    with semaphore("tbl:routed") as explicit, transaction.atomic(using="other"):
        explicit.fence_transaction()
    assert stored_in("other", "tbl:routed") == explicit.fence > held.fence


@routed
def test_the_give_back_without_using_waits_for_the_routed_databases_commit(
    lock_table: str, settings: Any
) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.FencesToOther"]
    with transaction.atomic(using="other"):
        with semaphore("tx:routed") as held:
            pass
        assert held.pending_commit and not held.released
    assert held.released
    with transaction.atomic(using="default"):  # not the routed database's transaction
        with semaphore("tx:routed") as again:
            pass
        assert again.released and not again.pending_commit


@routed
def test_run_once_without_using_is_done_after_the_routed_databases_commit(
    lock_table: str, settings: Any
) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.FencesToOther"]
    with transaction.atomic(using="other"):
        with run_once("job:routed") as job:
            pass
        assert job.pending_commit and job.status == "RUNNING"
    assert not job.pending_commit and job.status == "DONE"
