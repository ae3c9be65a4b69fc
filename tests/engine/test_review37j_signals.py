"""Review (thirty-seventh session, j): a third round on lock_released at the end of a view's
streamed body."""

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

from dynasem import release_all, semaphore
from dynasem import signals as dynasem_signals
from dynasem._operators.locks import holds_on
from tests.support.helpers import assert_sent_here


class Mine(Exception):
    """The body's own error."""


@pytest.fixture
def raising_receiver() -> Iterator[None]:
    def fail(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("the audit database is down")

    dynasem_signals.lock_released.connect(fail, weak=False, dispatch_uid="review37j-recv")
    yield
    dynasem_signals.lock_released.disconnect(dispatch_uid="review37j-recv")


def _streaming_view(name: str, is_async: bool, body: Any) -> Any:
    if is_async:

        @semaphore(name, lease=30)
        async def aview(request: Any) -> StreamingHttpResponse:
            return StreamingHttpResponse(body())

        return aview

    @semaphore(name, lease=30)
    def view(request: Any) -> StreamingHttpResponse:
        return StreamingHttpResponse(body())

    return view


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_streamed_body_that_raised_ends_with_its_own_exception_past_a_raising_receiver(
    lock_table: str, raising_receiver: None, caplog: pytest.LogCaptureFixture, is_async: bool
) -> None:
    """A view's streamed body that raised ends with its own exception, its hold given back, as
    a block's or a decorated call's does (cd0ce2f): a lock_released receiver's exception at
    its end took its place (the server logged the receiver's error, not the body's)."""
    name = f"r37j-stream-raised-{is_async}"

    def body() -> Iterator[bytes]:
        yield b"rows"
        raise Mine("the body's own")

    async def abody() -> Any:
        yield b"rows"
        raise Mine("the body's own")

    view = _streaming_view(name, is_async, abody if is_async else body)

    async def astream() -> None:
        response = await view(RequestFactory().get("/"))
        async for _chunk in response.streaming_content:
            pass

    def stream() -> None:
        response = view(RequestFactory().get("/"))
        for _chunk in response.streaming_content:
            pass

    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"), pytest.raises(Mine):
            asyncio.run(astream()) if is_async else stream()
        assert holds_on(name) == []
        assert any("audit database" in r.getMessage() for r in caplog.records)
    finally:
        release_all()


def test_an_async_streamed_body_cancelled_stays_cancelled_past_a_raising_receiver(
    lock_table: str, raising_receiver: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The task streaming an async view's body is cancelled (Django's ASGI handler cancels it
    when the client goes away; a timeout): the body's end gives the hold back and the task
    ends cancelled. A raising lock_released receiver's exception took the cancel's place: the
    handler, awaiting the task it cancelled, got a RuntimeError instead."""
    name = "r37j-stream-cancelled"
    streaming = asyncio.Event()

    async def body() -> Any:
        yield b"rows"
        streaming.set()
        await asyncio.sleep(30)
        yield b"more"

    view = _streaming_view(name, True, body)

    async def stream() -> None:
        response = await view(RequestFactory().get("/"))
        async for _chunk in response.streaming_content:
            pass

    async def main() -> None:
        task = asyncio.create_task(stream())
        await streaming.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"):
            asyncio.run(main())
        assert holds_on(name) == []
        assert any("audit database" in r.getMessage() for r in caplog.records)
    finally:
        release_all()


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
@pytest.mark.django_db(transaction=True)
def test_an_async_unique_run_cancelled_as_it_started_sends_lock_released_where_django_closes_it(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async unique task's run cancelled while its start (the claim's adoption) ran in its
    thread: the adopted hold is given back (``run_io_taking``), and lock_released sent as an
    async release's is (``asend``), as ae69506 made the run's own end send it: sent in a
    thread of dynasem's executor, a receiver's ORM query opened a connection there that
    Django never closes (one per thread, for good)."""
    from dynasem._background import unique
    from tests.support import unique_tasks

    seen: list[tuple[str, Any]] = []

    def query(sender: Any, **kwargs: Any) -> None:
        db = connections["default"]
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append((threading.current_thread().name, db))

    start_run, starting = unique.start_run, threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        starting.set()
        time.sleep(0.3)
        return start_run(*args, **kwargs)

    monkeypatch.setattr(unique, "start_run", slow)
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    dynasem_signals.lock_released.connect(query, weak=False, dispatch_uid="review37j-query")
    try:
        with override_settings(TASKS=dummy):
            task = unique_tasks.aplain.using(backend="default")
            queued = task.enqueue("r37j-cancelled")

            async def work() -> None:
                run = asyncio.ensure_future(task.acall(*queued.args, **queued.kwargs))
                while not starting.is_set():
                    await asyncio.sleep(0.01)
                run.cancel()  # the adoption is in its thread
                with pytest.raises(asyncio.CancelledError):
                    await run

            async_to_sync(work)()
    finally:
        dynasem_signals.lock_released.disconnect(dispatch_uid="review37j-query")
        release_all()
    assert holds_on("unique-async:r37j-cancelled") == []
    assert_sent_here(seen)


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
@pytest.mark.django_db(transaction=True)
def test_an_async_enqueue_the_backend_refused_sends_lock_released_where_django_closes_it(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async unique enqueue whose backend failed to store the task withdraws its claim
    (``unique.withdraw``: the claim adopted and given back), and lock_released is sent as an
    async release's is (``asend``), as 73a9536 made a cancelled start's give-back send it: sent
    in a thread of dynasem's executor, a receiver's ORM query opened a connection there that
    Django never closes (one per thread, for good)."""
    from django.tasks.backends.dummy import DummyBackend

    from tests.support import unique_tasks

    seen: list[tuple[str, Any]] = []

    def query(sender: Any, **kwargs: Any) -> None:
        db = connections["default"]
        with db.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append((threading.current_thread().name, db))

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise Mine("the broker is down")

    monkeypatch.setattr(DummyBackend, "enqueue", refused)
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    dynasem_signals.lock_released.connect(query, weak=False, dispatch_uid="review37j-query")
    try:
        with override_settings(TASKS=dummy):
            task = unique_tasks.aplain.using(backend="default")

            async def work() -> None:
                with pytest.raises(Mine):
                    await task.aenqueue("r37j-refused")

            async_to_sync(work)()
    finally:
        dynasem_signals.lock_released.disconnect(dispatch_uid="review37j-query")
        release_all()
    assert holds_on("unique-async:r37j-refused") == []
    assert_sent_here(seen)


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_template_response_whose_render_raised_ends_with_its_own_past_a_raising_receiver(
    lock_table: str, raising_receiver: None, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """A view's template response whose render raised (a template error: a 500) gives its
    hold back (``_rendered_holding``) and ends with the render's own exception, the
    receiver's logged, as a streamed body's end does (5d3b7a6): its give-back left the block
    as if it had ended well, and a lock_released receiver's exception took the render's
    place (the server logged the receiver's error, not the template's). Under ASGI (an async
    view; Django's handler renders in ``sync_to_async``) likewise."""
    from asgiref.sync import sync_to_async
    from django.template import engines
    from django.template.response import SimpleTemplateResponse

    class Rows:
        def __str__(self) -> str:
            raise Mine("the template's own")

    def answer() -> SimpleTemplateResponse:
        return SimpleTemplateResponse(engines["django"].from_string("{{ rows }}"), {"rows": Rows()})

    name = f"r37j-render-raised-{kind}"

    @semaphore(name, lease=30)
    def view(request: Any) -> SimpleTemplateResponse:
        return answer()

    @semaphore(name, lease=30)
    async def aview(request: Any) -> SimpleTemplateResponse:
        return answer()

    async def asgi() -> None:  # what Django's ASGI handler does with a view's answer
        response = await aview(RequestFactory().get("/"))
        await sync_to_async(response.render)()

    def wsgi() -> None:
        response = view(RequestFactory().get("/"))  # kept: render() holds it weakly
        response.render()

    try:
        with caplog.at_level(logging.WARNING, logger="dynasem"), pytest.raises(Mine):
            asyncio.run(asgi()) if kind == "asgi" else wsgi()
        assert holds_on(name) == []
        assert any("audit database" in r.getMessage() for r in caplog.records)
    finally:
        release_all()


def _dynasem_logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str]]:
    return [
        (r.levelno, getattr(r, "dynasem_outcome", ""), r.getMessage())
        for r in caplog.records
        if r.name == "dynasem"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_receiver_raising_after_a_commit_s_give_back_is_logged_as_the_receiver_s(
    lock_table: str, raising_receiver: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A hold given back once its transaction committed, whose lock_released receiver raised:
    it was logged at ERROR as "giving back ... failed" (outcome give_back_failed), sending an
    operator after a hold that was given back."""
    from django.db import transaction

    with caplog.at_level(logging.WARNING, logger="dynasem"):
        with transaction.atomic(), semaphore("r37n:commit"):
            pass
    assert holds_on("r37n:commit") == []
    ((level, outcome, message),) = _dynasem_logged(caplog)
    assert (level, outcome) == (logging.WARNING, "receiver_failed")
    assert "lock_released receiver" in message and "the audit database is down" in message


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
@pytest.mark.django_db(transaction=True)
def test_a_receiver_raising_as_a_sync_enqueue_withdraws_is_logged_as_the_receiver_s(
    lock_table: str,
    raising_receiver: None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync unique enqueue the backend refused gives its claim back (unique.give_back); a
    lock_released receiver that raised then was logged as "could not give back" (outcome
    give_back_failed), the claim given back all the same."""
    from django.tasks.backends.dummy import DummyBackend

    from tests.support import unique_tasks

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise Mine("the broker is down")

    monkeypatch.setattr(DummyBackend, "enqueue", refused)
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy), caplog.at_level(logging.WARNING, logger="dynasem"):
        with pytest.raises(Mine):
            unique_tasks.plain.using(backend="default").enqueue("r37n-refused")
    assert holds_on("unique-plain:r37n-refused") == []
    ((level, outcome, message),) = _dynasem_logged(caplog)
    assert (level, outcome) == (logging.WARNING, "receiver_failed")
    assert "lock_released receiver" in message and "the audit database is down" in message
