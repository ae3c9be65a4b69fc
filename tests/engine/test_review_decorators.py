"""Review (helper 6): the decorator and argument checks, as a Django user meets them."""

from __future__ import annotations

import asyncio

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import RequestFactory

from dynasem import semaphore
from dynasem._operators.locks import holds_on


def test_a_streaming_view_holds_its_lock_while_its_body_streams(lock_table):
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


def test_an_async_streaming_view_holds_its_lock_while_its_body_streams(lock_table):
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
