"""Review (helper 6): the decorator and argument checks, as a Django user meets them."""

from __future__ import annotations

import asyncio

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import RequestFactory

from dynasem import semaphore
from dynasem._operators.locks import holds_on


def test_a_streaming_view_holds_its_lock_while_its_body_streams(lock_table, transactional_db):
    """A decorated view that returns a StreamingHttpResponse: the body (the export, the
    report) runs after the view returns, as the server iterates it. The decorator gives the
    lock back when the view returns, so the whole body streams with no lock held and a
    second request streams at the same time. (A generator function is refused for this
    very reason, but a view returning a generator in a StreamingHttpResponse is not.)"""
    seen: list[int] = []

    @semaphore("export:{n}")
    def view(request, n):
        def body():
            seen.append(len(holds_on(f"export:{n}")))
            yield b"rows"

        return StreamingHttpResponse(body())

    response = view(RequestFactory().get("/"), n=1)
    try:
        b"".join(response.streaming_content)
    finally:
        response.close()
    assert seen == [1], f"holders of export:1 while its body streamed: {seen}"
    assert holds_on("export:1") == []  # given back once the response is closed


def test_an_async_streaming_view_holds_its_lock_while_its_body_streams(
    lock_table, transactional_db
):
    seen: list[int] = []

    @semaphore("aexport:{n}")
    async def view(request, n):
        async def body():
            seen.append(len(holds_on(f"aexport:{n}")))
            yield b"rows"

        return StreamingHttpResponse(body())

    async def go():
        response = await view(RequestFactory().get("/"), n=1)
        try:
            return b"".join([chunk async for chunk in response.streaming_content])
        finally:
            response.close()

    asyncio.run(go())
    assert seen == [1], f"holders of aexport:1 while its body streamed: {seen}"


@pytest.mark.parametrize("user", ["bob\x1b[2J", "bob\r\nroot", "bob\x00"])
def test_a_user_str_with_a_control_character_is_refused_like_a_resource(
    lock_table, requests_sent, user
):
    """A holder's user id is shown to operators as written (dynasem_locks, the admin), as a
    resource name is; a resource with ESC/CR/NUL is refused by name before any request, a
    user id with them is accepted and written into the lock row."""
    with pytest.raises(ValueError, match="control character"):
        with semaphore("review6-user", user=user):
            pass
    assert holds_on("review6-user") == []


def test_a_cancelled_async_view_gives_its_hold_back(lock_table):
    """A client that disconnects cancels the view's task (ASGI): the hold must be given
    back, not left to its lease."""
    started = asyncio.Event()

    @semaphore("acancel:{n}")
    async def view(request, n):
        started.set()
        await asyncio.sleep(30)
        return HttpResponse("done")

    async def go():
        task = asyncio.create_task(view(RequestFactory().get("/"), n=1))
        await asyncio.wait_for(started.wait(), 10)
        assert len(holds_on("acancel:1")) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert holds_on("acancel:1") == []


def test_a_view_cancelled_while_it_waits_for_the_lock_leaves_nothing(lock_table):
    """Cancelled while it waits in line (wait=5) behind another holder: no hold and no
    waiter left, and the holder's release is not slowed by a dead waiter."""

    @semaphore("await:{n}", wait=5, fair=True)
    async def view(request, n):
        return HttpResponse("done")

    async def go():
        async with semaphore("await:1"):
            task = asyncio.create_task(view(RequestFactory().get("/"), n=1))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # free now: a fresh take at once
        async with semaphore("await:1", wait=0):
            pass

    asyncio.run(go())
    assert holds_on("await:1") == []


def test_a_streaming_response_closed_unread_gives_its_lock_back(lock_table, transactional_db):
    """A client gone before the body started: the server closes the response; the hold
    must not be renewed on forever."""

    @semaphore("export-unread:{n}")
    def view(request, n):
        return StreamingHttpResponse(iter([b"rows"]))

    response = view(RequestFactory().get("/"), n=1)
    assert len(holds_on("export-unread:1")) == 1
    response.close()
    assert holds_on("export-unread:1") == []
