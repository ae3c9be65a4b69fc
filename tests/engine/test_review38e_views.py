"""Review 38 (helper e): the decorator and context manager as a Django user meets them."""

from __future__ import annotations

import asyncio

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.decorators import method_decorator
from django.views import View

from dynasem import semaphore
from dynasem._operators.locks import holds_on


@pytest.mark.parametrize("method", ["get", "options"])
def test_an_async_class_based_views_dispatch_holds_its_lock_while_its_handler_runs(
    lock_table, method
):
    """Django's way to decorate every method of a class-based view is ``dispatch``
    (``@method_decorator(..., name="dispatch")``). An async view's ``dispatch`` is a sync
    method that returns its handler's coroutine, which Django awaits: locked as a sync call,
    the lock was taken on the event loop's thread and given back before the handler ran, so
    two requests ran the handler at once, neither holding the lock."""
    inside: list[int] = []

    @method_decorator(semaphore("r38e-cbv:{pk}", wait=0), name="dispatch")
    class Rebuild(View):
        async def get(self, request, pk):
            inside.append(len(holds_on(f"r38e-cbv:{pk}")))
            await entered.wait()
            return HttpResponse("rebuilt")

    view = Rebuild.as_view()

    async def requests() -> list[int]:
        first = asyncio.ensure_future(view(_request(method), pk=1))
        try:
            await asyncio.sleep(0.3)  # the first request is inside, waiting for the event
            second = (await asyncio.wait_for(view(_request(method), pk=1), 3)).status_code
        except TimeoutError:
            second = 0  # inside the handler beside the first
        finally:
            entered.set()
        return [(await first).status_code, second]

    entered = asyncio.Event()
    statuses = asyncio.run(requests())
    if method == "get":
        assert inside == [1], f"holders of r38e-cbv:1 while the handler ran: {inside}"
        assert statuses == [200, 423], statuses
    else:  # Django's own async options(): answered under the lock too
        assert statuses[0] == 200
    assert holds_on("r38e-cbv:1") == []


def _request(method: str):
    return getattr(RequestFactory(), method)("/")
