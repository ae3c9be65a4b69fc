"""Review of the day's mends (a3486cb..): faults they bring, as failing tests."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import dynasem
from dynasem._engine import reentry
from dynasem._storage import lock_rows


def test_an_async_generator_closed_in_its_live_task_gives_back_its_own_hold(
    lock_table: str,
) -> None:
    """One Semaphore object (limit 2), two async generators each holding it in an
    ``async with`` block. The first is entered by a task that has ended since (the generator,
    suspended inside its block, outlives it: kept to be read on later); the second is closed
    with ``aclose()`` by its own task, alive. ``aclose()`` throws GeneratorExit into the
    block, so ``__aexit__`` sees ``exc_type is GeneratorExit`` and takes the first block of a
    dead task (``_orphan``) for its own: it gives back the FIRST generator's hold, whose
    block has not ended (another process may take the permit while that block goes on), and
    leaves its own hold in the row, renewed by the heartbeat for nobody while the process
    lives. Before the mend (a3486cb), the block's own hold was left as for any exit."""
    resource = "res:review-orphan-mispick"
    sem = dynasem.semaphore(resource, limit=2, lease=60)
    kept: list[AsyncIterator[Any]] = []
    tokens: dict[str, str] = {}

    async def block(name: str) -> AsyncIterator[int]:
        async with sem as held:
            tokens[name] = held.token
            yield 1
            yield 2

    async def first() -> None:
        gen = block("first")
        await gen.__anext__()  # inside its block
        kept.append(gen)  # read on later, by whoever

    async def main() -> dict[str, Any]:
        await asyncio.create_task(first())
        await asyncio.sleep(0)  # the wake-up that held the first task, run
        await asyncio.sleep(0)
        gc.collect()  # the first task is gone; its generator lives, in its block
        blocks = [b for bs in reentry._open_blocks.values() for b in bs if b.owner is sem]
        dead = [b.task is not None and b.task() for b in blocks]
        assert dead == [None], "the test missed the path"
        second = block("second")
        await second.__anext__()
        await second.aclose()  # its own task, alive: its block is left
        row = lock_rows.get(resource)
        holders = dict(row.holders) if row is not None else {}
        await kept[0].aclose()  # now the first block ends too
        return holders

    holders = asyncio.run(main())
    assert tokens["second"] not in holders, (
        f"the closed block's own hold left in the row (renewed for nobody): {sorted(holders)}"
    )
    assert tokens["first"] in holders, (
        "the hold of a block not left yet (its generator suspended inside it) was given back"
    )
