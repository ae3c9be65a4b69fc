"""Review (thirty-seventh session, e): lock_released at an async release, and at the exit of a
block that raised."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

from dynasem import release_all, semaphore
from dynasem import signals as dynasem_signals
from dynasem._operators.locks import holds_on


@pytest.fixture
def receiver() -> Iterator[Any]:
    connected: list[str] = []

    def connect(name: str, func: Any) -> None:
        getattr(dynasem_signals, name).connect(func, weak=False, dispatch_uid="review37e-recv")
        connected.append(name)

    yield connect
    for name in connected:
        getattr(dynasem_signals, name).disconnect(dispatch_uid="review37e-recv")


@pytest.mark.django_db(transaction=True)
def test_an_async_release_sends_lock_released_where_django_closes_the_connection(
    lock_table: str, receiver: Any
) -> None:
    """A sync receiver of an async release's lock_released runs as Django's async code runs
    it (``asend``: the sync thread this coroutine runs for, a request's), as lock_acquired's
    does. Sent in a thread of dynasem's executor, its ORM query opened a connection there that
    Django never closes: one per executor thread, open as long as the process lives."""
    seen: list[tuple[str, Any]] = []

    def query(sender: Any, **kwargs: Any) -> None:
        db = connections["default"]
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append((threading.current_thread().name, db))

    receiver("lock_released", query)

    async def work() -> None:
        async with semaphore("r37e-conn-block", lease=30):
            pass
        held = await semaphore("r37e-conn-held", lease=30).aacquire()
        await held.arelease()

    try:
        async_to_sync(work)()
    finally:
        release_all()
    here = threading.current_thread().name
    assert len(seen) == 2
    for thread, db in seen:
        assert (thread, db) == (here, connections["default"]), (
            f"sent in {thread}, its connection left open: {db.connection is not None}"
        )


class Mine(Exception):
    """The block's own error."""


def _raise_in_receiver(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("the audit database is down")


@pytest.mark.parametrize("form", ["with", "async with", "decorator", "async decorator"])
def test_the_blocks_own_exception_surfaces_past_a_raising_lock_released_receiver(
    lock_table: str, receiver: Any, caplog: pytest.LogCaptureFixture, form: str
) -> None:
    """A block that raised ends with its own exception, the lock given back: a
    lock_released receiver's exception at its exit is logged, not raised in its stead."""
    receiver("lock_released", _raise_in_receiver)
    name = f"r37e-exit-{form.replace(' ', '-')}"
    sem = semaphore(name, lease=30)

    def work() -> None:
        raise Mine("the block's own")

    async def awork() -> None:
        raise Mine("the block's own")

    def block() -> None:
        with sem:
            work()

    async def ablock() -> None:
        async with sem:
            await awork()

    run = {
        "with": block,
        "async with": lambda: asyncio.run(ablock()),
        "decorator": sem(work),
        "async decorator": lambda: asyncio.run(sem(awork)()),
    }[form]
    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"), pytest.raises(Mine):
            run()
        assert holds_on(name) == []
        assert any("audit database" in r.getMessage() for r in caplog.records)
    finally:
        release_all()
