"""Review 35b (the review-35 mends of re-entry, blocks left elsewhere, async releases): holes
found by reading the mends, each shown through public behaviour or the stored rows."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from dynasem import SemaphoreBusy, current_hold, release_all, run_once, semaphore
from dynasem._engine import reentry
from dynasem._operators.locks import holds_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.reentry]


def tokens(resource: str) -> set[str]:
    return {h.token for h in holds_on(resource) if h.expires.timestamp() > time.time()}


def test_a_second_generator_left_where_an_earlier_one_was_entered_gives_its_hold_back(
    lock_table: str,
) -> None:
    """A module-level semaphore guards a generator's work; generators are started by one
    thread (context A) and finished by another (B), and the other way round (a pool of
    threads reading streams). The first block's exit, in B, falls back to its frame's record
    (the mend), but A's context keeps the block's entry: stale. The second generator, entered
    in B and finished in A, pops that stale entry (a hold given back already) in A instead of
    its own: its exit gives back nothing, and its hold is renewed for nobody while the
    process lives."""
    lock = semaphore("r35b-stale", wait=0)

    def work() -> Any:
        with lock:
            yield "inside"
        yield "after"

    ctx_a, ctx_b = contextvars.copy_context(), contextvars.copy_context()
    first = work()
    assert ctx_a.run(next, first) == "inside"
    assert ctx_b.run(next, first) == "after"  # left in B: A keeps its entry
    assert tokens("r35b-stale") == set()
    second = work()
    assert ctx_b.run(next, second) == "inside"
    try:
        assert ctx_a.run(next, second) == "after"  # left in A
        assert tokens("r35b-stale") == set(), "the second block was left, its hold is held"
    finally:
        release_all()  # what a failure left held (taken in this thread)


def test_a_generators_block_left_inside_another_block_of_the_same_semaphore(
    lock_table: str,
) -> None:
    """A counting semaphore object shared by the code (limit=2): a generator entered its
    block in one context, and is finished inside this context's own block of the same
    object. The generator's exit pops the innermost entry of the semaphore here: this
    block's hold, given back while this block still works (its permit free for another
    while it works), while the generator's permit is kept, renewed for nobody while the
    process lives (for a shared one: every writer waits on it); this block's exit then
    raised RuntimeError. Mended: an exit takes the record its own block's frame made first
    (``reentry.left``), this context's innermost entry only when there is none."""
    lock = semaphore("r35b-count", limit=2, wait=0)

    def work() -> Any:
        with lock:
            yield "inside"
        yield "after"

    it = work()
    assert contextvars.copy_context().run(next, it) == "inside"
    seen: dict[str, Any] = {}
    try:
        with contextlib.suppress(RuntimeError), lock as mine:
            assert next(it) == "after"  # the generator's block is left here
            seen["mine released"] = mine.released
            seen["tokens"] = tokens("r35b-count")
            seen["mine"] = mine.token
        assert seen["mine released"] is False, "the generator's exit gave back this block's hold"
        assert seen["tokens"] == {seen["mine"]}, "the generator's hold is kept, for nobody"
    finally:
        release_all()


def test_an_async_blocks_release_waits_not_for_its_sync_thread_busy_with_another_call(
    lock_table: str,
) -> None:
    """Under ``async_to_sync`` (a sync view calling async code; no transaction at all), the
    release of an ``async with`` block now runs on the sync thread (``release_to_end``). That
    thread also runs the coroutine's ``sync_to_async`` calls (thread_sensitive): while one of
    them waits for the very lock the block held, the release waits for that call: the hold
    is kept, renewed for nobody, and the call waits on it until its ``wait`` runs out
    (``SemaphoreBusy``; with ``wait=None``, forever). Before 679ada4 the release ran in
    dynasem's executor and the call got the lock at once. Mended: only a hold taken while
    that thread was in a transaction is given back there (``caller_in_transaction``, asked
    before the acquire)."""

    async def holder() -> None:
        async with semaphore("r35b-busy", wait=0):
            await asyncio.sleep(0.3)

    _sync_call_waits_on(
        "r35b-busy", holder, "the block's release waited for the sync call waiting on its hold"
    )


def test_a_run_once_block_entered_through_an_exit_stack_leaves_no_record(
    lock_table: str,
) -> None:
    """``run_once`` records every block by (its object's id, the frame that entered it)
    (``reentry.block_opened``, fe5de26); ``block_closed`` takes it off only under the frame
    that leaves it. Entered and left from different frames (``ExitStack.enter_context``,
    a wrapper's ``__enter__``/``__exit__``, ``dynasem_lead``'s ``place.__enter__()`` and
    ``place.__exit__``), the record stays for ever, with its Job: ``_open_blocks`` grows
    by one such block each time, for the life of the process. (Since: ``reentry.opened`` and
    ``left``, for every block.)"""
    job = run_once("r35b-job", lease=5)
    with contextlib.ExitStack() as stack:
        stack.enter_context(job)
    assert [k for k in reentry._open_blocks if k[0] == id(job)] == []


def test_a_second_leadership_block_left_where_an_earlier_one_was_entered_gives_the_lead_back(
    lock_table: str,
) -> None:
    """``leadership`` (and ``run_once``) as the first test does for a semaphore: the first
    block, left in B, keeps its entry in A's context; the second, entered in B and left in A,
    took that stale entry (the lead given back already) for its own: its own lead was kept,
    renewed for nobody."""
    from dynasem import leadership
    from dynasem._storage import lock_rows

    place = leadership("r35b-lead", lease=5)

    def work() -> Any:
        with place:
            yield "inside"
        yield "after"

    def holders() -> Any:
        row = lock_rows.get("leader:r35b-lead")
        return {} if row is None else row.holders

    ctx_a, ctx_b = contextvars.copy_context(), contextvars.copy_context()
    first = work()
    assert ctx_a.run(next, first) == "inside"
    assert ctx_b.run(next, first) == "after"
    assert not holders()
    second = work()
    assert ctx_b.run(next, second) == "inside"
    try:
        assert ctx_a.run(next, second) == "after"
        assert not holders(), "the second block was left, its lead is still held"
    finally:
        release_all()


def test_a_fenced_generators_block_left_in_another_context_gives_its_hold_back(
    lock_table: str,
) -> None:
    """a7ec3d7 makes a block left in another context find its hold by its frame; a
    ``fence_db=True`` block's exit then asks ``fencing.end`` for its atomic block in this
    context's ``_opened``, finds none and raises ValueError before ``leave``: the hold is
    kept, renewed for nobody, and the atomic block it opened is never closed. (The same
    thread here: a connection is a thread's, so only another context is possible.) Mended:
    the atomic block is kept in the block's own record (``reentry.Block.atomic``)."""
    from django.db import connection

    def work() -> Any:
        with semaphore("r35b-fenced", wait=0, fence_db=True):
            yield "inside"
        yield "after"

    it = work()
    assert contextvars.copy_context().run(next, it) == "inside"
    errors: list[BaseException] = []
    try:
        try:
            assert contextvars.copy_context().run(next, it) == "after"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        in_atomic = connection.in_atomic_block
        held = tokens("r35b-fenced")
    finally:
        while connection.in_atomic_block and connection.atomic_blocks:
            connection.atomic_blocks[-1].__exit__(None, None, None)
        release_all()
    assert held == set(), f"the block was left, its hold is still held ({errors!r})"
    assert errors == [], f"leaving the block raised {errors!r}"
    assert not in_atomic


def test_a_nested_async_acquire_asks_nothing_of_a_sync_thread_busy_waiting_on_its_hold(
    lock_table: str,
) -> None:
    """Under ``async_to_sync``, a first async acquire asks the sync thread whether it is in a
    transaction (``caller_in_transaction``, before it takes anything). A nested one asked
    too: while that thread ran a ``sync_to_async`` call waiting for the very hold the task
    had, the nested acquire waited behind the call, and the call on the hold until its
    ``wait`` ran out. A nested acquire follows its outer hold and asks nothing now (failed
    before: the call got ``SemaphoreBusy`` after 3 s)."""

    async def holder() -> None:
        async with semaphore("r35c-nested", wait=0):
            await asyncio.sleep(0.2)  # the sync call waits on this hold meanwhile
            async with semaphore("r35c-nested", wait=0):  # nested: re-enters
                pass

    _sync_call_waits_on(
        "r35c-nested", holder, "the nested acquire waited for the sync call waiting on its hold"
    )


def _sync_call_waits_on(resource: str, holder: Any, failure: str) -> None:
    """Under ``async_to_sync``: ``holder()`` (a task holding ``resource``) runs while a
    ``sync_to_async`` call on the sync thread waits up to 3 s for ``resource``; fails with
    ``failure`` if that call is refused, and unless it got the lock within 2 s."""
    got: list[float] = []

    def worker() -> None:  # Django's async ORM, or any sync_to_async call: on this thread
        start = time.monotonic()
        with semaphore(resource, wait=3):
            got.append(time.monotonic() - start)

    async def main() -> None:
        task = asyncio.create_task(holder())
        await asyncio.sleep(0.1)
        try:
            await sync_to_async(worker)()
        finally:
            await task

    try:
        async_to_sync(main)()
    except SemaphoreBusy:
        pytest.fail(failure)
    finally:
        release_all()
    assert got and got[0] < 2


def test_a_generators_block_left_inside_an_exit_stacks_re_entered_block(lock_table: str) -> None:
    """The first fault, with the block it is left in entered through an ``ExitStack`` (its
    enter's frame is not its exit's) and re-entering this thread's hold: the generator's
    exit gives back its own hold, the ExitStack's exit finds its own block by this context,
    and the outer hold stays until its block ends. (Before 077faf5 the generator's exit gave
    back this thread's hold.)"""
    lock = semaphore("r36-stack", limit=2, wait=0)

    def work() -> Any:
        with lock:
            yield "inside"
        yield "after"

    it = work()
    assert contextvars.copy_context().run(next, it) == "inside"
    try:
        with lock as outer:
            with contextlib.ExitStack() as stack:
                assert stack.enter_context(lock) is outer  # re-entered
                assert next(it) == "after"  # the generator's block is left here
                assert tokens("r36-stack") == {outer.token}
            assert not outer.released and tokens("r36-stack") == {outer.token}
        assert tokens("r36-stack") == set()
        assert [k for k in reentry._open_blocks if k[0] == id(lock)] == []
    finally:
        release_all()


def test_no_current_hold_once_its_generators_block_was_left_in_another_thread(
    lock_table: str,
) -> None:
    """A generator's block entered here and left by another thread: its hold is given back
    there, and ``current_hold()`` here must not name it any more (it did before 077faf5:
    this thread's entry of the block stayed, a hold given back taken for ours)."""
    lock = semaphore("r36-current", wait=0)

    def work() -> Any:
        with lock:
            yield "inside"
        yield "after"

    it = work()
    assert next(it) == "inside"
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(next(it)))
    thread.start()
    thread.join()
    try:
        assert out == ["after"] and tokens("r36-current") == set()
        with pytest.raises(LookupError):
            current_hold()
    finally:
        release_all()
