"""Review (thirty-seventh session, h): a second round on lock_released at an async release,
and at the exit of a block that raised."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.http import StreamingHttpResponse
from django.test import RequestFactory, override_settings

from dynasem import leadership, release_all, semaphore
from dynasem import signals as dynasem_signals
from dynasem._operators.locks import holds_on
from tests.support.helpers import assert_sent_here


@pytest.fixture
def receiver() -> Iterator[Any]:
    connected: list[str] = []

    def connect(name: str, func: Any) -> None:
        getattr(dynasem_signals, name).connect(func, weak=False, dispatch_uid="review37h-recv")
        connected.append(name)

    yield connect
    for name in connected:
        getattr(dynasem_signals, name).disconnect(dispatch_uid="review37h-recv")


def _querying(seen: list[tuple[str, Any]]) -> Any:
    def query(sender: Any, **kwargs: Any) -> None:
        db = connections["default"]
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append((threading.current_thread().name, db))

    return query


@pytest.mark.django_db(transaction=True)
def test_an_async_leads_release_sends_lock_released_where_django_closes_the_connection(
    lock_table: str, receiver: Any
) -> None:
    """``async with leadership(...)``'s end sends lock_released as an async block's does
    (``asend``: the sync thread this coroutine runs for). Sent in a thread of dynasem's
    executor, a receiver's ORM query opened a connection there that Django never closes."""
    seen: list[tuple[str, Any]] = []
    receiver("lock_released", _querying(seen))

    async def work() -> None:
        async with leadership("r37h-lead", lease=30):
            pass

    try:
        async_to_sync(work)()
    finally:
        release_all()
    assert_sent_here(seen)


@pytest.mark.django_db(transaction=True)
def test_an_async_streaming_views_release_sends_lock_released_where_django_closes_it(
    lock_table: str, receiver: Any
) -> None:
    """An async view's streamed body ends: its hold is given back, and lock_released sent
    as an async block's is (``asend``), not in a thread of dynasem's executor, where a
    receiver's ORM query opened a connection that Django never closes."""
    seen: list[tuple[str, Any]] = []
    receiver("lock_released", _querying(seen))

    @semaphore("r37h-stream:{n}", lease=30)
    async def view(request: Any, n: int) -> StreamingHttpResponse:
        async def body() -> Any:
            yield b"rows"

        return StreamingHttpResponse(body())

    async def work() -> None:
        response = await view(RequestFactory().get("/"), n=1)
        try:
            assert b"".join([chunk async for chunk in response.streaming_content]) == b"rows"
        finally:
            response.close()

    try:
        async_to_sync(work)()
    finally:
        release_all()
    assert_sent_here(seen)


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
@pytest.mark.django_db(transaction=True)
def test_an_async_unique_tasks_run_sends_lock_released_where_django_closes_it(
    lock_table: str, receiver: Any
) -> None:
    """An async unique task's run ends (``acall``): its key is given back, and lock_released
    sent as an async block's is (``asend``), not in a thread of dynasem's executor, where a
    receiver's ORM query opened a connection that Django never closes."""
    from tests.support import unique_tasks

    seen: list[tuple[str, Any]] = []
    receiver("lock_released", _querying(seen))
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        task = unique_tasks.aplain.using(backend="default")
        queued = task.enqueue("r37h")
        try:
            assert async_to_sync(task.acall)(*queued.args, **queued.kwargs) == "r37h"
        finally:
            release_all()
    assert_sent_here(seen)


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
def test_an_async_unique_tasks_run_stands_past_a_raising_lock_released_receiver(
    lock_table: str, receiver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """As a sync run's: the receiver's exception is logged, the task's own outcome stands."""
    from tests.support import unique_tasks

    def fail(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("the audit database is down")

    receiver("lock_released", fail)
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy), caplog.at_level(logging.WARNING, logger="dynasem"):
        task = unique_tasks.aplain.using(backend="default")
        queued = task.enqueue("r37h-raises")
        try:
            assert async_to_sync(task.acall)(*queued.args, **queued.kwargs) == "r37h-raises"
        finally:
            release_all()
    assert any("audit database" in r.getMessage() for r in caplog.records)


class Mine(Exception):
    """The block's own error."""


def _raise_in_receiver(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("the audit database is down")


@pytest.mark.parametrize("form", ["with", "async with"])
def test_a_leads_own_exception_surfaces_past_a_raising_lock_released_receiver(
    lock_table: str, receiver: Any, caplog: pytest.LogCaptureFixture, form: str
) -> None:
    """A leadership block that raised ends with its own exception, the lead given back, as
    a semaphore's block does: a lock_released receiver's exception at its end is logged,
    not raised in its stead."""
    receiver("lock_released", _raise_in_receiver)
    name = f"r37h-lead-exit-{form.replace(' ', '-')}"

    def block() -> None:
        with leadership(name, lease=30):
            raise Mine("the block's own")

    async def ablock() -> None:
        async with leadership(name, lease=30):
            raise Mine("the block's own")

    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"), pytest.raises(Mine):
            block() if form == "with" else asyncio.run(ablock())
        assert holds_on(f"leader:{name}") == []
        assert any("audit database" in r.getMessage() for r in caplog.records)
    finally:
        release_all()


@pytest.mark.parametrize("leave", ["async with", "arelease"])
def test_a_release_cancelled_on_its_way_stays_cancelled_past_a_raising_receiver(
    lock_table: str,
    receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    leave: str,
) -> None:
    """A task cancelled while its release runs in its thread (a timeout around it, a server
    shutting down) ends cancelled once the hold is given back, as before lock_released was
    sent after that thread: a raising receiver's exception, raised then, took the place of
    the cancellation (``asyncio.timeout`` and task groups saw no cancel; the task was not)."""
    from dynasem._engine.hold import Held

    receiver("lock_released", _raise_in_receiver)
    give_back, releasing = Held._give_back, threading.Event()

    def slow(self: Held) -> bool:
        releasing.set()
        time.sleep(0.3)
        return give_back(self)

    monkeypatch.setattr(Held, "_give_back", slow)
    name = f"r37h-cancel-{leave.replace(' ', '-')}"

    async def hold() -> None:
        if leave == "async with":
            async with semaphore(name, lease=30):
                pass
        else:
            held = await semaphore(name, lease=30).aacquire()
            await held.arelease()

    async def main() -> None:
        task = asyncio.create_task(hold())
        while not releasing.is_set():
            await asyncio.sleep(0.01)
        task.cancel()  # the release is in its thread
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"):
            asyncio.run(main())
        assert holds_on(name) == []
        assert any("audit database" in r.getMessage() for r in caplog.records)
    finally:
        release_all()


@pytest.mark.django_db(transaction=True)
def test_a_hold_given_back_as_its_lock_acquired_receiver_raised_sends_lock_released_here(
    lock_table: str, receiver: Any
) -> None:
    """An async acquire whose lock_acquired receiver raised gives the hold back, and sends
    lock_released as an async release does (``asend``), not in a thread of dynasem's
    executor, where a receiver's ORM query opened a connection Django never closes."""
    seen: list[tuple[str, Any]] = []
    dynasem_signals.lock_acquired.connect(_raise_in_receiver, dispatch_uid="review37h-acq")
    receiver("lock_released", _querying(seen))

    async def work() -> None:
        with pytest.raises(RuntimeError, match="audit database"):
            await semaphore("r37h-acquired", lease=30).aacquire()

    try:
        async_to_sync(work)()
    finally:
        dynasem_signals.lock_acquired.disconnect(dispatch_uid="review37h-acq")
        release_all()
    assert holds_on("r37h-acquired") == []
    assert_sent_here(seen)
