"""Review 39h: ``current_hold()`` in code that runs in another task on the holder's behalf,
awaited inside its block.

``asyncio.gather`` and a ``TaskGroup`` wrap each coroutine in a task of its own (so does
``asyncio.wait_for`` on Python 3.11), and ``async_to_sync`` called by sync code that
``sync_to_async`` runs for the holder runs its coroutine in a new task too: each is the
block's own work, awaited before the block ends, and ``current_hold().fence`` there is what
the block's writes need. A filter by task (aa7efa8, reverted) made each raise
``LookupError``: a block's hold is visible while the block is open, to the work it awaits.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from dynasem import current_hold, semaphore
from tests.engine.test_heartbeat import unique

pytestmark = pytest.mark.django_db(transaction=False)


async def seen_hold() -> Any:
    await asyncio.sleep(0)
    try:
        return current_hold()
    except LookupError:
        return None


def test_current_hold_in_gathered_coroutines(lock_table: str) -> None:
    """``await asyncio.gather(write_a(), write_b())`` inside the block: each coroutine's
    ``current_hold().fence`` is the block's."""
    resource = unique("gathered")

    async def main() -> tuple[Any, list[Any]]:
        async with semaphore(resource, wait=0) as held:
            return held, list(await asyncio.gather(seen_hold(), seen_hold()))

    held, seen = asyncio.run(main())
    assert seen == [held, held], "a gathered coroutine of the block found no hold"


def test_current_hold_in_a_task_group(lock_table: str) -> None:
    """A ``TaskGroup`` inside the block ends before the block does: its tasks are the
    block's work."""
    resource = unique("task-group")

    async def main() -> tuple[Any, Any]:
        async with semaphore(resource, wait=0) as held:
            async with asyncio.TaskGroup() as group:
                task = group.create_task(seen_hold())
            return held, task.result()

    held, seen = asyncio.run(main())
    assert seen is held, "a task group's task inside the block found no hold"


def test_current_hold_in_async_to_sync_under_sync_to_async(lock_table: str) -> None:
    """An async block awaits ``sync_to_async(helper)``; the helper (which finds the hold)
    calls ``async_to_sync`` of an async function: one call chain, each waiting on the next,
    yet the innermost call found no hold."""
    resource = unique("nested-calls")

    def helper() -> tuple[Any, Any]:
        return current_hold(), async_to_sync(seen_hold)()

    async def main() -> tuple[Any, tuple[Any, Any]]:
        async with semaphore(resource, wait=0) as held:
            return held, await sync_to_async(helper)()

    held, (in_sync, in_async) = asyncio.run(main())
    assert in_sync is held
    assert in_async is held, "async code the helper called found no hold"
