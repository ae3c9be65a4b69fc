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


def test_a_template_response_is_rendered_under_its_views_lock(lock_table, transactional_db):
    """Class-based views (``ListView``, ``DetailView``, ``TemplateView``) answer with a
    ``TemplateResponse``, rendered by Django's handler after the view returned: a lazy
    queryset in its context is read then. A reader's view (``shared=True``, so as not to
    read a project while its purge-and-rebuild runs) gave its hold back before the read:
    the rows were read with no lock held, while a writer could be rebuilding them."""
    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    seen: list[int] = []

    class Rows:  # a lazy queryset: read when the template shows it
        def __str__(self) -> str:
            seen.append(len(holds_on("issues:1")))
            return "rows"

    @semaphore("issues:{project_id}", shared=True)
    def issue_list(request, project_id):
        template = engines["django"].from_string("{{ rows }}")
        return SimpleTemplateResponse(template, {"rows": Rows()})

    response = issue_list(RequestFactory().get("/"), project_id=1)
    response.render()  # what Django's handler does after the view (and its middleware)
    assert response.content == b"rows"
    assert seen == [1], f"holders of issues:1 while its rows were read: {seen}"
    assert holds_on("issues:1") == []


def test_a_template_response_whose_rendering_raises_gives_its_lock_back(
    lock_table, transactional_db
):
    """Carried past the view, the hold must still end when the rendering fails (Django's
    handler answers 500 and drops the unrendered response)."""
    import gc

    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    from tests.support.helpers import wait_for

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("a template error")

    @semaphore("issues-broken:{project_id}", shared=True)
    def issue_list(request, project_id):
        template = engines["django"].from_string("{{ rows }}")
        return SimpleTemplateResponse(template, {"rows": Broken()})

    response = issue_list(RequestFactory().get("/"), project_id=1)
    with pytest.raises(RuntimeError):
        response.render()
    del response
    gc.collect()
    wait_for(lambda: holds_on("issues-broken:1") == [], 5, "the unrendered response's lock")


def test_a_template_response_carried_past_its_view_still_pickles_once_rendered(
    lock_table, transactional_db
):
    """Django's cache middleware pickles a rendered template response (a post-render
    callback of its own, after ours): what carries the hold must not go with it."""
    import pickle

    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    @semaphore("issues-cached:{project_id}", shared=True)
    def issue_list(request, project_id):
        return SimpleTemplateResponse(engines["django"].from_string("rows"), {})

    response = issue_list(RequestFactory().get("/"), project_id=1)
    response.render()
    assert pickle.loads(pickle.dumps(response)).content == b"rows"
    assert holds_on("issues-cached:1") == []
