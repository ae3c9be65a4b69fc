"""Review 35 (re-entry, decorators, the public surface): faults found by reading the code,
each shown through public behaviour or the stored rows."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

from dynasem import SemaphoreBusy, release_all, semaphore
from dynasem._operators.locks import holds_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.reentry]


def tokens(resource: str) -> set[str]:
    return {h.token for h in holds_on(resource) if h.expires.timestamp() > time.time()}


def test_a_thread_that_ran_async_code_inside_its_block_still_re_enters_its_hold(
    lock_table: str,
) -> None:
    """asgiref's sync_to_async leaves its call's ``task_context`` in the thread's local when
    the call ends. A sync thread that runs ``async_to_sync(...)`` inside its block, whose
    coroutine calls sync code (``sync_to_async``, Django's async ORM) — run on this very
    thread — is then taken for that finished call: its nested acquire waits on itself."""

    async def touch_the_orm() -> None:
        await sync_to_async(lambda: None)()  # runs on this thread (thread_sensitive)

    with semaphore("r35-a", wait=0) as outer:
        async_to_sync(touch_the_orm)()
        try:
            with semaphore("r35-a", wait=0) as inner:  # wait=0: busy on itself, not a hang
                assert inner is outer
        except SemaphoreBusy:
            pytest.fail("a nested acquire in the same thread waited on its own hold")
    assert tokens("r35-a") == set()


def test_a_generators_block_left_in_another_thread_gives_its_hold_back(
    lock_table: str,
) -> None:
    """A generator suspended inside a ``with semaphore(...)`` block and resumed (to its
    end) by another thread: the block's exit runs where its enter is not on the context's
    stack. The hold must still be given back, not kept (renewed) for nobody."""

    def work() -> Any:
        with semaphore("r35-g", wait=0):
            yield "inside"
        yield "after"

    it = work()
    # Entered in a context of its own: this thread's keeps no trace of the block for the
    # tests after this one (current_hold() would find its entry, left in another thread).
    assert contextvars.copy_context().run(next, it) == "inside"
    assert len(tokens("r35-g")) == 1
    errors: list[BaseException] = []

    def resume() -> None:
        try:
            assert next(it) == "after"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=resume)
    t.start()
    t.join()
    try:
        assert errors == [], f"leaving the block raised {errors!r}"
        assert tokens("r35-g") == set(), "the block was left, its hold is still held"
    finally:
        release_all()  # what a failure left held (its thread ended), not for the next test


def test_an_async_generators_block_closed_by_another_task_gives_its_hold_back(
    lock_table: str,
) -> None:
    """An async generator started in one task (``create_task(anext(agen))``, as stream
    mergers do) and closed by another while the first task object is still referenced: the
    ``async with`` block's exit must give its hold back."""

    async def work() -> Any:
        async with semaphore("r35-ag", wait=0):
            yield "inside"
            yield "more"

    async def main() -> list[BaseException]:
        agen = work()
        first = asyncio.create_task(agen.__anext__())
        assert await first == "inside"
        assert len(await sync_to_async(tokens)("r35-ag")) == 1
        errors: list[BaseException] = []
        try:
            await agen.aclose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        assert first.done()  # still referenced: the entering task object lives
        return errors

    errors = asyncio.run(main())
    try:
        assert errors == [], f"closing the generator raised {errors!r}"
        assert tokens("r35-ag") == set(), "the block was left, its hold is still held"
    finally:
        release_all()  # what a failure left held (taken in this thread), not for the next test


def test_a_hold_taken_again_in_its_transaction_outlives_the_commit_only_if_still_held(
    lock_table: str,
) -> None:
    """A block left inside ``atomic`` waits for the commit; ``acquire()`` of the same
    resource in that transaction gets that hold again (``pending_hold``). The caller keeps
    it past the commit (it was not released): the commit must not give it back under it."""
    with transaction.atomic():
        with semaphore("r35-t", wait=0):
            pass
        again = semaphore("r35-t", wait=0).acquire()
    # Committed; ``again`` was never released: the lock must still be ours.
    try:
        assert not again.released
        assert tokens("r35-t") == {again.token}, "given back at the commit while still held"
        other: list[BaseException | str] = []

        def intruder() -> None:
            try:
                h = semaphore("r35-t", wait=0).acquire()
                other.append("acquired")
                h.release()
            except SemaphoreBusy as exc:
                other.append(exc)

        t = threading.Thread(target=intruder)
        t.start()
        t.join()
        assert isinstance(other[0], SemaphoreBusy), "another thread got the lock: two holders"
    finally:
        again.release()
    assert tokens("r35-t") == set()


def test_an_async_block_run_by_async_to_sync_inside_atomic_is_held_until_the_commit(
    lock_table: str,
) -> None:
    """``async_to_sync`` inside ``transaction.atomic`` (a sync view under ATOMIC_REQUESTS
    calling async code): the coroutine's sync work (``sync_to_async``, Django's async ORM)
    runs on the outer thread, inside its transaction. Its ``async with`` block's hold must
    then wait for that commit, as a ``with`` block's does; it is given back at the block's
    exit, before the work it protects is committed (the docs say async code cannot be
    inside ``atomic``; through async_to_sync its work is)."""
    in_atomic: list[bool] = []

    async def work() -> None:
        async with semaphore("r35-ax", wait=0):
            # Django's async ORM does this: the write lands in the outer transaction.
            in_atomic.append(
                await sync_to_async(lambda: transaction.get_connection().in_atomic_block)()
            )

    with transaction.atomic():
        async_to_sync(work)()
        assert in_atomic == [True]  # the block's work is in this transaction
        held_before_commit = tokens("r35-ax")
    assert tokens("r35-ax") == set()
    assert held_before_commit != set(), "given back before the commit of the work it protects"


def test_an_async_release_run_by_async_to_sync_inside_atomic_follows_that_transaction(
    lock_table: str,
) -> None:
    """``arelease()`` likewise: kept until the outer transaction commits, given back at once
    when it rolls back."""

    async def take_and_give_back() -> str:
        held = await semaphore("r35-ar", wait=0).aacquire()
        await held.arelease()
        return held.token

    with transaction.atomic():
        token = async_to_sync(take_and_give_back)()
        assert tokens("r35-ar") == {token}, "given back before the commit"
    assert tokens("r35-ar") == set()

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        async_to_sync(take_and_give_back)()
        raise Rollback
    assert tokens("r35-ar") == set()


def test_a_streaming_view_that_re_entered_its_callers_hold_gives_back_only_its_share(
    lock_table: str,
) -> None:
    """A decorated streaming view called where its lock is held already (re-entered: the
    caller's block, a test's, a view calling another view) counts one depth. Its stream's
    end and the response's close() each give back "its" share: the second took the caller's,
    and the caller's hold went back while its block still ran (its exit then said nothing)."""
    from django.http import StreamingHttpResponse
    from django.test import RequestFactory

    @semaphore("r35-s:{n}", wait=0)
    def stream(request: Any, n: int) -> StreamingHttpResponse:
        return StreamingHttpResponse(iter([b"a", b"b"]))

    with semaphore("r35-s:1", wait=0) as outer:
        response = stream(RequestFactory().get("/"), 1)
        assert b"".join(response) == b"ab"  # the server sends the body...
        response.close()  # ...and closes the response (WSGI, ASGI alike)
        assert not outer.released, "the caller's hold was given back inside its block"
        assert tokens("r35-s:1") == {outer.token}
    assert tokens("r35-s:1") == set()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_nested_acquire_whose_work_commits_in_another_database_keeps_the_hold_till_then(
    lock_table: str,
) -> None:
    """The outer block follows ``other``'s transaction (``using="other"``); a nested block of
    the same resource (a helper, ``using`` left to the default) works inside the default
    database's ``atomic``. The outer block's exit, still inside that atomic, gives the hold
    back at once (``other`` is in no transaction): the nested block's work is not committed
    yet. A hold waiting for its commit refuses such a nested acquire (pending_hold's
    ValueError: "give both the same using="); a re-entered one did not. Mended: the
    re-entered hold is kept one level deeper until the nested block's transaction ends."""
    with transaction.atomic():  # the default database
        with semaphore("r35-u", using="other", wait=0):
            with semaphore("r35-u", wait=0):  # its work is the default database's
                pass
        held_before_commit = tokens("r35-u")
    assert held_before_commit != set(), "given back before the nested block's work committed"
    assert tokens("r35-u") == set(), "kept after that commit"


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_nested_acquire_in_an_atomic_opened_inside_the_outer_block_is_no_refusal(
    lock_table: str,
) -> None:
    """The same nesting with the default database's ``atomic`` opened inside the outer
    block: the nested work commits before the outer block ends, which then gives the hold
    back at its exit. A rollback of the nested block's transaction ends its level at once."""
    with semaphore("r35-v", using="other", wait=0):
        with transaction.atomic():
            with semaphore("r35-v", wait=0):
                pass
            assert tokens("r35-v") != set()
        with pytest.raises(RuntimeError), transaction.atomic():
            with semaphore("r35-v", wait=0):
                raise RuntimeError("rolled back")
        assert tokens("r35-v") != set()
    assert tokens("r35-v") == set(), "kept after the outer block's exit"
