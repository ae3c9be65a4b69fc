"""Review (thirty-sixth session): the decorator as a Django user meets it."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import iscoroutinefunction

from dynasem import semaphore
from dynasem._operators.locks import holds_on


def test_a_callable_object_with_an_async_call_holds_its_lock_while_it_runs(lock_table):
    """An instance whose ``__call__`` is a coroutine function (a handler object, a service
    class) is no coroutine function to asgiref's test: the decorator wrapped it as a sync
    call, took the lock, made the coroutine and gave the lock back, and the body ran when the
    caller awaited it, with nothing held."""
    seen: list[int] = []

    class Rebuild:
        async def __call__(self, project_id):
            seen.append(len(holds_on(f"obj:{project_id}")))

    rebuild = semaphore("obj:{project_id}")(Rebuild())
    assert iscoroutinefunction(rebuild)  # Django and asgiref call it as async code
    asyncio.run(rebuild(project_id=1))
    assert seen == [1], f"holders of obj:1 while the body ran: {seen}"
    assert holds_on("obj:1") == []


def test_a_callable_object_with_a_generator_call_is_refused_as_a_generator_function_is():
    """The same for a generator: the lock would be given back before the first item."""

    class Rows:
        def __call__(self, n):
            yield n

    with pytest.raises(TypeError, match="generator function"):
        semaphore("rows:{n}")(Rows())


def test_a_streaming_response_replaced_by_a_304_gives_its_lock_back(lock_table, transactional_db):
    """A streaming view's response that is never iterated nor closed: Django's
    ``ConditionalGetMiddleware`` answers a revalidation (``If-Modified-Since`` on a response
    with ``Last-Modified``, as ``django.views.static.serve`` sets on its ``FileResponse``)
    with a new ``HttpResponseNotModified`` and drops the view's response unclosed (as does
    any middleware or handler that replaces a response). Its lock, given back only by the
    body's end or ``close()``, was kept, renewed by the heartbeat, while the process lived."""
    import gc

    from django.http import StreamingHttpResponse
    from django.middleware.http import ConditionalGetMiddleware
    from django.test import RequestFactory
    from django.utils.http import http_date

    from tests.support.helpers import wait_for

    @semaphore("export-cached:{n}")
    def view(request, n):
        response = StreamingHttpResponse(iter([b"rows"]))
        response["Last-Modified"] = http_date(1_700_000_000)
        return response

    middleware = ConditionalGetMiddleware(lambda request: view(request, n=1))
    request = RequestFactory().get("/", HTTP_IF_MODIFIED_SINCE=http_date(1_700_000_000))
    response = middleware(request)
    assert response.status_code == 304
    response.close()  # what the server sends, it closes
    gc.collect()
    wait_for(lambda: holds_on("export-cached:1") == [], 5, "the replaced response's lock is held")
