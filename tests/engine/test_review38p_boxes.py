"""Review 38 (helper p): third round on the acquire's box of holds not yet delivered."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref

from dynasem._engine import hold as holds_module


def test_tasks_sharing_a_context_do_not_keep_every_box_they_ever_opened() -> None:
    """Two long-lived tasks that share one context (Django's ``Signal.asend`` runs async
    receivers so; a TaskGroup's ``create_task(..., context=)``) whose acquires overlap, one
    opening its next box while the other's is open: each new box linked to the one open
    before it, itself linked to the one before, closed since but never unlinked (only the
    innermost box is taken off as it closes). The chain grew by one box per acquire for
    the life of the tasks, each closed box keeping the task that made it, and every acquire
    walked it all: memory and time without end for workers that loop."""
    rounds = 50
    opened = {"a": 0, "b": 0}
    linked: list[int] = []
    freed: list[bool] = []
    gone: list[weakref.ref[asyncio.Task[None]]] = []

    async def until(ready: object) -> None:
        while not ready():  # type: ignore[operator]
            await asyncio.sleep(0)

    async def acquire(name: str) -> None:
        # An acquire under way (its box open) until the other task has opened its own: A
        # waits for B's box of the same round, B for A's next one.
        opened[name] += 1
        mine = opened[name]
        if name == "a":
            await until(lambda: opened["b"] >= mine)
        elif mine < rounds:
            await until(lambda: opened["a"] > mine)
        else:  # the last one, A's last box open too: the boxes this context links to
            box, count = holds_module._undelivered.get(), 0
            while box is not None:
                box, count = box.outer, count + 1
            linked.append(count)
            gc.collect()
            freed.append(gone[0]() is None)

    async def loop(name: str) -> None:
        for _ in range(rounds):
            await holds_module.adelivering(lambda: acquire(name))

    async def short() -> None:  # a task that acquires once, then ends, in the same context
        await holds_module.adelivering(lambda: until(lambda: opened["b"] >= 2))

    async def main() -> None:
        shared = contextvars.copy_context()
        first = asyncio.create_task(loop("a"), context=shared)
        brief = asyncio.create_task(short(), context=shared)
        second = asyncio.create_task(loop("b"), context=shared)
        await brief
        gone.append(weakref.ref(brief))
        del brief
        await asyncio.gather(first, second)

    asyncio.run(main())
    assert linked and linked[0] <= 3, f"boxes linked after {rounds} acquires each: {linked}"
    assert freed == [True], "a task that ended is kept alive by the box it opened"
