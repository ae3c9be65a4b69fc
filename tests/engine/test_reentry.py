"""Re-entry: a nested acquire, in the same thread or asyncio task, of what this thread or task
already holds gets that hold again at once (dynasem._engine.reentry)."""

from __future__ import annotations

import asyncio
import os
import select
import sys
import threading
import time
import warnings
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction

from dynasem import LockLost, SemaphoreBusy, current_hold, semaphore
from dynasem._operators.locks import holds_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.reentry]


def tokens(resource: str) -> set[str]:
    return {h.token for h in holds_on(resource) if h.expires.timestamp() > time.time()}


def test_a_nested_with_gets_the_same_hold_at_once(lock_table: str, requests_sent: Any) -> None:
    with semaphore("k", wait=3) as outer:
        requests_sent.reset()
        started = time.monotonic()
        with semaphore("k", wait=3) as inner:
            assert time.monotonic() - started < 0.2
            assert requests_sent.total == 0  # no request at all
            assert inner is outer and inner.fence == outer.fence
            with semaphore("k", wait=None) as deepest:  # would wait forever on itself
                assert deepest is outer
        assert tokens("k") == {outer.token}  # the inner exits gave nothing back
        assert not outer.released
    assert outer.released and tokens("k") == set()


def test_decorated_functions_calling_each_other(lock_table: str) -> None:
    calls: list[str] = []

    @semaphore("tbl_issues:{project_id}", wait=3)
    def purge(project_id: int) -> None:
        calls.append(f"purge {current_hold().fence}")

    @semaphore("tbl_issues:{project_id}", wait=3)
    def rebuild(project_id: int) -> None:
        purge(project_id)
        calls.append(f"rebuild {current_hold().fence}")

    started = time.monotonic()
    rebuild(42)
    assert time.monotonic() - started < 1.0
    fences = {c.split()[1] for c in calls}
    assert [c.split()[0] for c in calls] == ["purge", "rebuild"] and len(fences) == 1
    assert tokens("tbl_issues:42") == set()


def test_async_nesting_and_async_decorated_functions(lock_table: str) -> None:
    @semaphore("job:{pk}", wait=3)
    async def inner(pk: int) -> int:
        return current_hold().fence

    @semaphore("job:{pk}", wait=3)
    async def outer(pk: int) -> tuple[int, int]:
        return current_hold().fence, await inner(pk)

    async def main() -> None:
        async with semaphore("a", wait=3) as first:
            async with semaphore("a", wait=3) as again:
                assert again is first
        assert first.released
        started = time.monotonic()
        mine, nested = await outer(7)
        assert mine == nested and time.monotonic() - started < 1.0

    asyncio.run(main())
    assert tokens("job:7") == set()


def test_another_thread_and_a_child_task_are_other_holders(lock_table: str) -> None:
    with semaphore("k"):
        busy: list[BaseException] = []

        def other() -> None:
            try:
                semaphore("k", wait=0).acquire()
            except SemaphoreBusy as exc:
                busy.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(busy) == 1

    async def main() -> None:
        async with semaphore("t"):

            async def child() -> None:
                async with semaphore("t", wait=0):
                    pass

            with pytest.raises(SemaphoreBusy):
                await asyncio.create_task(child())

    asyncio.run(main())


def test_an_acquire_under_wait_for_belongs_to_the_caller_from_python_3_12(
    lock_table: str,
) -> None:
    """``asyncio.wait_for`` runs the acquire in the caller's own task from Python 3.12 on (a
    nested acquire then re-enters its hold); on 3.11 in a task of its own, another holder by
    the rules above, so the caller's nested acquire is told busy (docs: Nested acquires)."""

    async def main() -> None:
        held = await asyncio.wait_for(semaphore("w", wait=3).aacquire(), 5)
        try:
            if sys.version_info >= (3, 12):
                async with semaphore("w", wait=0) as again:
                    assert again is held
                assert not held.released
            else:
                with pytest.raises(SemaphoreBusy):
                    async with semaphore("w", wait=0):
                        pass
        finally:
            await held.arelease()
        assert held.released

    asyncio.run(main())
    assert tokens("w") == set()


def test_what_a_nested_acquire_may_ask(lock_table: str) -> None:
    with semaphore("doc", shared=True):
        with semaphore("doc", shared=True) as reader:
            assert reader.semaphore.shared
        with pytest.raises(ValueError, match="upgrade"):
            semaphore("doc", wait=30).acquire()  # at once, not after 30 s
    with semaphore("pool", limit=3) as slot:
        assert semaphore("pool", limit=3).acquire() is slot
        slot.release()  # the nested one's
        with pytest.raises(ValueError, match="upgrade"):
            semaphore("pool").acquire()
        with pytest.raises(ValueError, match="limit=4"):
            semaphore("pool", limit=4).acquire()
    with semaphore("x") as exclusive:  # covers a shared or counting request of it
        assert semaphore("x", shared=True).acquire() is exclusive
        assert semaphore("x", limit=5).acquire() is exclusive
        exclusive.release()
        exclusive.release()
    assert tokens("x") == set() and tokens("pool") == set() and tokens("doc") == set()


def test_nested_in_several_resources(lock_table: str) -> None:
    with semaphore(["a", "b"]) as both:
        with semaphore("b") as b:
            assert b.resource == "b" and b.fence == both.fences["b"]
            assert b.token == both.token and b.fences == {"b": both.fences["b"]}
        with pytest.raises(ValueError, match=r"\['a'\].*\['c'\]"):
            semaphore(["a", "c"]).acquire()
        assert tokens("a") == tokens("b") == {both.token}
    assert tokens("a") == tokens("b") == set()


def test_a_hold_waiting_for_its_commit_taken_again_in_part_is_named_by_that_part(
    lock_table: str,
) -> None:
    """A hold of several resources given back inside a transaction, taken again for one of
    them before the commit: that one's fence, as a nested acquire gets, not the first
    resource's. Here b's fence is counted on from a stored one an hour ahead of the clock (a
    clock behind another host's): a's, from the clock, is below b's earlier holders'."""
    from dynasem._storage import dynamodb

    ahead = int((time.time() + 3600) * 1_000_000)
    row = {"pk": {"S": "b"}, "sk": {"S": "lock"}, "fence": {"N": str(ahead)}}
    dynamodb.get_client().put_item(TableName=lock_table, Item=row)
    with transaction.atomic():
        with semaphore(["a", "b"]) as both:
            pass
        assert both.pending_commit and both.fences["b"] > ahead > both.fences["a"]
        with semaphore("b") as b:
            assert b.resource == "b" and b.fence == both.fences["b"]
            assert b.fences == {"b": both.fences["b"]} and b.token == both.token
        assert both.pending_commit and tokens("b") == {both.token}
    assert both.released and tokens("a") == tokens("b") == set()


def test_a_hold_waiting_for_its_commit_asked_for_more_raises_at_once(
    lock_table: str, requests_sent: Any
) -> None:
    """More resources than it holds, or an exclusive acquire of a shared hold: the acquire
    would wait on the hold it waits for its commit to give back, as a nested one would."""
    with transaction.atomic():
        with semaphore("a") as a:
            pass
        with semaphore("s", shared=True) as s:
            pass
        assert a.pending_commit and s.pending_commit
        requests_sent.reset()
        started = time.monotonic()
        with pytest.raises(ValueError, match=r"\['a'\].*\['c'\]"):
            semaphore(["a", "c"], wait=3).acquire()
        with pytest.raises(ValueError, match="exclusive acquire of 's' inside a shared hold"):
            semaphore("s", wait=3).acquire()
        assert time.monotonic() - started < 1 and requests_sent.total == 0
        with semaphore("s", shared=True) as again:  # what it covers is still its own
            assert again is s
    assert a.released and s.released and tokens("c") == set()


def test_the_outermost_release_decides_with_the_transaction(lock_table: str) -> None:
    with transaction.atomic():
        with semaphore("tx") as outer:
            with semaphore("tx"):
                pass
            assert not outer.pending_commit  # the inner exit registered nothing
        assert outer.pending_commit and tokens("tx") == {outer.token}
    assert outer.released and tokens("tx") == set()


def test_a_lost_hold_says_so_at_the_inner_exit(lock_table: str) -> None:
    from dynasem._operators.locks import break_hold

    with pytest.raises(LockLost):
        with semaphore("k") as outer:
            with pytest.raises(LockLost):
                with semaphore("k"):
                    break_hold("k", outer.token)
                    outer.renew()


def test_a_loss_found_through_a_nested_view_is_the_outer_holds(lock_table: str) -> None:
    """A newer holder's trace found by whoever has the view (a fence in a database) loses
    the hold itself: the view keeps no state of its own."""
    with pytest.raises(LockLost):
        with semaphore(["a", "b"]) as outer:
            with pytest.raises(LockLost, match="newer fence") as raised:
                with semaphore("b") as inner:
                    inner.found_lost("a newer fence was found")
            assert raised.value.resource == "b"
            assert outer.lost and inner.lost and outer.seconds_left() == 0


def test_release_all_gives_back_a_re_entered_hold_of_a_thread_that_ended(lock_table: str) -> None:
    """A thread that ended holding a hold it re-entered (acquired twice, never released)
    uses it no more: release_all (atexit) gives it back, not one depth of it."""
    import dynasem

    got: list[Any] = []

    def work() -> None:
        sem = semaphore("left", lease=30)
        got.extend([sem.acquire(), sem.acquire()])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert got[0] is got[1] and got[0].depth == 2
    assert dynasem.release_all() == 1
    assert got[0].released and tokens("left") == set()


def test_a_view_under_test_re_enters_the_tests_hold_but_not_one_held_elsewhere(
    lock_table: str, client: Any
) -> None:
    """Django's test client runs the view in the test's thread: the view re-enters a hold the
    test took itself. held_elsewhere() holds it as another process would: the view is busy."""
    from dynasem.testing import held_elsewhere

    with semaphore("tbl_issues:8"):
        assert client.get("/rebuild/8/").status_code == 200
    with held_elsewhere("tbl_issues:8", user="alice") as other:
        response = client.get("/rebuild/8/")
        assert response.status_code == 423 and tokens("tbl_issues:8") == {other.token}
    assert tokens("tbl_issues:8") == set()


def test_a_forked_child_does_not_reenter_its_parents_hold(lock_table: str) -> None:
    """A child forked inside a block keeps its parent's context variables and the forking
    thread's Thread object: it is another process, another holder (found by review)."""
    with semaphore("k") as held:
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fork() of a process with threads
            child = os.fork()
        if child == 0:  # the child: another process, which must wait (here: be told busy)
            try:
                os.close(read)
                try:
                    got = semaphore("k", wait=0).acquire()
                    answer = b"reentered" if got.token == held.token else b"other"
                except SemaphoreBusy:
                    answer = b"busy"
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    answer = repr(exc).encode()[:200]
                os.write(write, answer)
            finally:
                os._exit(0)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 30)
        answer = os.read(read, 256).decode() if ready else "no answer"
        os.close(read)
        os.waitpid(child, 0)
        assert answer == "busy", f"the forked child's acquire of 'k': {answer}"


def test_a_child_task_through_sync_to_async_is_another_holder(lock_table: str) -> None:
    """asgiref's sync_to_async (thread_sensitive) runs every task's sync calls on one thread
    and copies the context back into the calling task: a child task's call must not re-enter
    its parent's hold by that thread (found by review)."""

    async def main() -> None:
        # The parent task's hold, taken by sync code (a sync helper, a sync view's code).
        held = await sync_to_async(semaphore("t").acquire)()
        try:
            inside: list[str] = []

            async def child(name: str) -> None:
                # Another task: it must be told busy (wait=0), not share the parent's hold.
                mine = await sync_to_async(semaphore("t", wait=0).acquire)()
                inside.append(name)
                await asyncio.sleep(0.05)  # its critical section, with the parent's going on
                await sync_to_async(mine.release)()

            results = await asyncio.gather(
                asyncio.create_task(child("a")),
                asyncio.create_task(child("b")),
                return_exceptions=True,
            )
            # Two more holders of an exclusive lock besides the parent: both entered.
            assert inside == [], f"tasks {inside} entered while the parent task held 't'"
            assert all(isinstance(r, SemaphoreBusy) for r in results), results
        finally:
            await sync_to_async(held.release)()

    asyncio.run(main())
