"""The view decorator: function, async and class-based views against DynamoDB Local."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import iscoroutinefunction
from django.db import connections
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory
from django.utils.decorators import method_decorator
from django.utils.functional import SimpleLazyObject
from django.views import View

from dynasem import SemaphoreBusy, current_hold, semaphore
from dynasem._engine.decorators import SAFE, busy_response, resource_key
from dynasem._operators.locks import HoldInfo, holds_on
from tests.support import views

try:
    import hypothesis
    from hypothesis import strategies as st
except ImportError:  # not a dependency: the property test runs only where it is installed
    hypothesis = None  # type: ignore[assignment]

PROCESS_IDENTITY = f"{socket.gethostname()}:{os.getpid()}"


@pytest.fixture
def gate(lock_table: str) -> Iterator[Any]:
    """Holds every gated view inside its lock until the test sets the gate; always opens it
    again, so a failing test never leaves a request thread waiting."""
    views.CALLS.clear()
    views.GATE.clear()
    try:
        yield views.GATE
    finally:
        views.GATE.set()
        views.CALLS.clear()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-request") as executor:
        yield executor


def wait_for_holds(
    resource: str, count: int = 1, *, request: Future[Any] | None = None, timeout: float = 10.0
) -> list[HoldInfo]:
    """Poll the table until ``resource`` has ``count`` holders (the request thread is inside).
    Gives up at once if ``request`` finished meanwhile (it cannot be holding anything then)."""
    deadline = time.monotonic() + timeout
    while True:
        holds = holds_on(resource)
        if len(holds) == count:
            return holds
        if request is not None and request.done():
            outcome = request.exception() or request.result()
            raise AssertionError(f"the request ended without holding {resource!r}: {outcome!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{resource!r} has holders {holds!r}, expected {count}")
        time.sleep(0.02)


def in_thread(pool: ThreadPoolExecutor, fn: Callable[[], Any]) -> Future[Any]:
    def run() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()  # this thread's own database connections

    return pool.submit(run)


def get(path: str, client: Client | None = None) -> Any:
    return (client or Client()).get(path)


def post(path: str, client: Client | None = None) -> Any:
    return (client or Client()).post(path)


def aget(path: str, client: AsyncClient | None = None) -> Any:
    async def go() -> Any:
        return await (client or AsyncClient()).get(path)

    return asyncio.run(go())


def assert_locked(response: Any) -> int:
    assert response.status_code == 423
    retry_after = response["Retry-After"]
    assert retry_after.isdigit(), retry_after
    assert int(retry_after) >= 1
    return int(retry_after)


# ---------------------------------------------------------------------------------------------
# Busy, free and released, for each kind of view
# ---------------------------------------------------------------------------------------------

KINDS = {
    # kind: (send one request, path prefix, what the view records in CALLS)
    "function": (get, "/rebuild", "rebuild"),
    "async": (aget, "/arebuild", "arebuild"),
    "class": (post, "/cbv", "cbv"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_busy_view_gets_423_other_key_runs_and_lock_is_released(kind, gate, pool):
    send, prefix, name = KINDS[kind]
    first = in_thread(pool, lambda: send(f"{prefix}/1/"))
    (hold,) = wait_for_holds("tbl_issues:1", request=first)
    assert hold.user_id == PROCESS_IDENTITY  # anonymous request: this host and process

    busy = send(f"{prefix}/1/")
    assert_locked(busy)
    # The hold is in the table a moment before the first request's view body runs: wait for
    # that body, then the busy request (answered already) must not have entered the view.
    deadline = time.monotonic() + 10
    while not views.CALLS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert views.CALLS == [f"{name}:1"]  # the busy request never entered the view

    other = in_thread(pool, lambda: send(f"{prefix}/2/"))
    # Project 2 is held at the same time as project 1.
    wait_for_holds("tbl_issues:2", request=other)
    assert not first.done()

    gate.set()
    assert first.result(timeout=10).status_code == 200
    response = other.result(timeout=10)
    assert response.status_code == 200
    assert response.content.decode().endswith("rebuilt 2")
    assert holds_on("tbl_issues:1") == []

    again = send(f"{prefix}/1/")
    assert again.status_code == 200
    assert sorted(views.CALLS) == sorted([f"{name}:1", f"{name}:2", f"{name}:1"])
    assert holds_on("tbl_issues:1") == []
    assert holds_on("tbl_issues:2") == []


def test_decorated_views_keep_their_kind_and_name():
    assert iscoroutinefunction(views.arebuild)
    assert not iscoroutinefunction(views.rebuild)
    assert views.rebuild.__name__ == "rebuild"
    assert views.arebuild.__name__ == "arebuild"
    assert views.rebuild.__wrapped__.__name__ == "rebuild"


def test_view_exception_propagates_and_releases(lock_table):
    @semaphore("boom:{n}", wait=0)
    def view(request, n):
        assert [h.resource for h in holds_on("boom:1")] == ["boom:1"]
        raise RuntimeError("view failed")

    request = RequestFactory().get("/")
    with pytest.raises(RuntimeError, match="view failed"):
        view(request, n=1)
    assert holds_on("boom:1") == []


def test_view_exception_propagates_every_time(lock_table):
    calls = []

    @semaphore("boom:{n}", wait=0)
    def view(request, n):
        calls.append(n)
        raise KeyError(n)

    request = RequestFactory().get("/")
    for _ in range(2):  # a lock left behind would turn the second call into a 423
        with pytest.raises(KeyError):
            view(request, n=1)
    assert calls == [1, 1]
    assert holds_on("boom:1") == []


# ---------------------------------------------------------------------------------------------
# Who is recorded
# ---------------------------------------------------------------------------------------------


def test_logged_in_user_is_recorded(gate, pool, transactional_db, django_user_model):
    user = django_user_model.objects.create_user("ada", password="pw")
    client = Client()
    client.force_login(user)
    first = in_thread(pool, lambda: client.get("/rebuild/7/"))
    (hold,) = wait_for_holds("tbl_issues:7", request=first)
    assert hold.user_id == str(user.pk)
    gate.set()
    assert first.result(timeout=10).status_code == 200
    assert holds_on("tbl_issues:7") == []


def test_logged_in_user_is_recorded_by_class_based_view(
    gate, pool, transactional_db, django_user_model
):
    user = django_user_model.objects.create_user("grace", password="pw")
    client = Client()
    client.force_login(user)
    first = in_thread(pool, lambda: client.post("/cbv/8/"))
    (hold,) = wait_for_holds("tbl_issues:8", request=first)
    assert hold.user_id == str(user.pk)
    gate.set()
    assert first.result(timeout=10).status_code == 200


def test_anonymous_user_is_recorded_as_this_process(gate, pool, db):
    first = in_thread(pool, lambda: Client().get("/rebuild/9/"))
    (hold,) = wait_for_holds("tbl_issues:9", request=first)
    assert hold.user_id == PROCESS_IDENTITY
    gate.set()
    assert first.result(timeout=10).status_code == 200


def test_logged_in_user_is_recorded_by_async_view(gate, pool, transactional_db, django_user_model):
    user = django_user_model.objects.create_user("barbara", password="pw")
    client = AsyncClient()
    client.force_login(user)
    first = in_thread(pool, lambda: aget("/arebuild/5/", client))
    try:
        (hold,) = wait_for_holds("tbl_issues:5", request=first)
    finally:
        gate.set()
    assert hold.user_id == str(user.pk)
    assert first.result(timeout=10).status_code == 200


def test_async_view_loads_a_lazy_user_outside_the_event_loop(
    lock_table, transactional_db, django_user_model
):
    # Django 4.2's requests have no auser(): the lazy request.user (a session and a user read
    # from the database) must load in a thread, not in the loop (SynchronousOnlyOperation).
    user = django_user_model.objects.create_user("ada-lovelace", password="pw")
    seen: list[list[HoldInfo]] = []

    @semaphore("lazy:{n}", wait=0)
    async def view(request: Any, n: int) -> HttpResponse:
        seen.append(await asyncio.to_thread(holds_on, f"lazy:{n}"))
        return HttpResponse("ok")

    request = RequestFactory().get("/")
    request.user = SimpleLazyObject(lambda: django_user_model.objects.get(pk=user.pk))
    assert not hasattr(request, "auser")
    assert asyncio.run(view(request, n=1)).status_code == 200
    assert [h.user_id for h in seen[0]] == [str(user.pk)]
    assert holds_on("lazy:1") == []


def test_holder_is_request_user_never_request_data(gate, pool, db):
    # A "user" query parameter must not become the recorded holder.
    first = in_thread(pool, lambda: Client().get("/rebuild/10/?user=42&user_id=42"))
    (hold,) = wait_for_holds("tbl_issues:10", request=first)
    assert hold.user_id == PROCESS_IDENTITY
    gate.set()
    first.result(timeout=10)


# ---------------------------------------------------------------------------------------------
# Async views hold their lock until the coroutine finishes
# ---------------------------------------------------------------------------------------------


def test_async_view_holds_lock_until_coroutine_finishes(gate):
    request = RequestFactory().get("/arebuild/3/")

    async def scenario() -> tuple[list[HoldInfo], list[HoldInfo], Any]:
        coroutine = views.arebuild(request, project_id=3)
        # Calling the view only creates the coroutine: nothing is taken yet.
        before = await asyncio.to_thread(holds_on, "tbl_issues:3")
        task = asyncio.ensure_future(coroutine)
        during = await asyncio.to_thread(wait_for_holds, "tbl_issues:3")
        await asyncio.sleep(0.3)  # the body is still awaiting the gate: still held
        still = await asyncio.to_thread(holds_on, "tbl_issues:3")
        assert not task.done()
        assert [h.token for h in still] == [h.token for h in during]
        gate.set()
        response = await task
        return before, during, response

    before, during, response = asyncio.run(scenario())
    assert before == []
    assert len(during) == 1
    assert response.status_code == 200
    assert holds_on("tbl_issues:3") == []


def test_async_view_busy_while_other_coroutine_awaits(gate):
    factory = RequestFactory()

    async def scenario() -> tuple[Any, Any]:
        task = asyncio.ensure_future(views.arebuild(factory.get("/"), project_id=4))
        await asyncio.to_thread(wait_for_holds, "tbl_issues:4")
        busy = await views.arebuild(factory.get("/"), project_id=4)
        gate.set()
        return busy, await task

    busy, done = asyncio.run(scenario())
    assert_locked(busy)
    assert done.status_code == 200
    assert views.CALLS == ["arebuild:4"]


# ---------------------------------------------------------------------------------------------
# The busy response
# ---------------------------------------------------------------------------------------------


def test_on_busy_replaces_the_423(gate, pool):
    first = in_thread(pool, lambda: Client().get("/custom/report/"))
    wait_for_holds("custom:report", request=first)
    busy = Client().get("/custom/report/")
    assert busy.status_code == 409
    assert busy.json() == {"busy": "custom:report"}
    assert "Retry-After" not in busy
    # The hold is in the table a moment before the first request's view body runs.
    deadline = time.monotonic() + 10
    while not views.CALLS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert views.CALLS == ["custom:report"]
    gate.set()
    assert first.result(timeout=10).status_code == 200
    assert holds_on("custom:report") == []


def locked_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "status_code", None) == 423]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_busy_view_is_logged_once_at_info_by_dynasem(kind, lock_table, caplog):
    """A 423 is the expected answer of a busy lock: dynasem logs it at INFO with its facts,
    and Django does not log it again as a WARNING ("Locked: /...") per request."""
    send, prefix, _name = KINDS[kind]
    with semaphore("tbl_issues:8", user="alice"):
        with caplog.at_level(logging.INFO):
            busy = send(f"{prefix}/8/")
    retry_after = assert_locked(busy)
    assert [r.getMessage() for r in caplog.records if r.name == "django.request"] == []
    (record,) = locked_records(caplog)
    assert (record.name, record.levelno) == ("dynasem", logging.INFO)
    assert record.resource == "tbl_issues:8"
    assert record.holder_user_id == "alice"
    assert record.retry_after == retry_after
    assert record.queue_position == 1
    assert 0 <= record.estimated_wait <= retry_after
    assert f"{prefix}/8/" in record.getMessage()


def test_busy_response_marks_itself_logged_for_django(caplog):
    """What an on_busy that returns (or adds to) dynasem's own 423 gets: logged once."""
    from django.utils.log import log_response

    request = RequestFactory().get("/x/")
    exc = SemaphoreBusy("r", 7, "u1", queue_position=2, estimated_wait=6.5)
    with caplog.at_level(logging.INFO):
        response = busy_response(request, exc)
        log_response(
            "%s: %s", response.reason_phrase, request.path, response=response, request=request
        )
    assert [(r.name, r.levelname) for r in caplog.records] == [("dynasem", "INFO")]
    (record,) = caplog.records
    assert (record.resource, record.retry_after, record.queue_position) == ("r", 7, 2)


def test_a_users_on_busy_response_is_theirs_to_log(lock_table, caplog):
    """dynasem neither logs nor marks a response it did not make: Django logs it as any other
    response of the user's (a 5xx of theirs still reaches mail_admins)."""
    with semaphore("custom:mine"):
        with caplog.at_level(logging.INFO):
            busy = Client().get("/custom/mine/")
    assert busy.status_code == 409
    assert [r.levelname for r in caplog.records if r.name == "django.request"] == ["WARNING"]
    assert locked_records(caplog) == []


def test_on_busy_receives_request_and_busy_error(lock_table):
    seen = []

    def on_busy(request, exc):
        seen.append((request, exc))
        return HttpResponse("later", status=503)

    @semaphore("report:{n}", wait=0, on_busy=on_busy)
    def view(request, n):
        return HttpResponse("ran")

    with semaphore("report:1", user="someone-else"):
        request = RequestFactory().get("/")
        response = view(request, n=1)
    assert response.status_code == 503
    ((got_request, exc),) = seen
    assert got_request is request
    assert isinstance(exc, SemaphoreBusy)
    assert exc.resource == "report:1"
    assert exc.holder_user_id == "someone-else"
    assert exc.retry_after >= 1


def test_busy_response_reveals_no_token(gate, pool):
    first = in_thread(pool, lambda: Client().get("/rebuild/11/"))
    (hold,) = wait_for_holds("tbl_issues:11", request=first)
    busy = Client().get("/rebuild/11/")
    assert_locked(busy)
    assert hold.token not in busy.content.decode()
    for header, value in busy.items():
        assert hold.token not in header
        assert hold.token not in value
    for cookie in busy.cookies.values():
        assert hold.token not in cookie.OutputString()
    gate.set()
    first.result(timeout=10)


def test_retry_after_estimates_when_the_holder_will_be_done(lock_table):
    @semaphore("lease:{n}", wait=0)
    def view(request, n):
        return HttpResponse("ran")

    for _ in range(3):
        with semaphore("lease:1", lease=100):
            time.sleep(0.3)
    with semaphore("lease:1", lease=100):
        retry_after = assert_locked(view(RequestFactory().get("/"), n=1))
    # Holds of 0.3 s: done within a second, although the lease has 100 s left (Retry-After
    # was its end + CLOCK_SKEW, 101 s). A loaded machine (CI's embedded engine beside another
    # suite) stretches the holds' measured length past a second: a few seconds, never the lease.
    assert 1 <= retry_after <= 5


def test_busy_response_helper():
    response = busy_response(None, SemaphoreBusy("r", 7, "u1"))
    assert assert_locked(response) == 7
    assert response["Content-Type"].startswith("text/plain")


def test_waiting_view_gets_the_lock_once_free(lock_table, pool):
    @semaphore("waits:{n}", wait=5)
    def view(request, n):
        return HttpResponse("ran")

    held = semaphore("waits:1").acquire()
    waiting = in_thread(pool, lambda: view(RequestFactory().get("/"), n=1))
    time.sleep(0.3)
    assert not waiting.done()
    held.release()
    assert waiting.result(timeout=10).status_code == 200


# ---------------------------------------------------------------------------------------------
# Any other callable: functions, async functions, methods
# ---------------------------------------------------------------------------------------------


def test_function_binds_fields_by_signature_positional_keyword_defaults(lock_table):
    @semaphore("job:{pk}:{kind}")
    def job(pk, kind="full"):
        (hold,) = holds_on(current_hold().resource)
        assert hold.token == current_hold().token  # really held while the body runs
        return current_hold().resource

    assert job(5) == "job:5:full"
    assert job(pk=6, kind="quick") == "job:6:quick"
    assert job(7, "quick") == "job:7:quick"
    assert job(8, kind="my-app_v2.1") == "job:8:my-app_v2.1"
    for resource in ["job:5:full", "job:6:quick", "job:7:quick", "job:8:my-app_v2.1"]:
        assert holds_on(resource) == []


def test_function_positional_fields_index_every_positional_argument(lock_table):
    @semaphore("pos:{0}:{1}")
    def job(a, b):
        return current_hold().resource

    assert job("x", "y") == "pos:x:y"


def test_busy_function_raises_and_is_not_called(lock_table):
    calls = []

    @semaphore("job:{pk}", wait=0)
    def job(pk):
        calls.append(pk)

    with semaphore("job:5", user="worker-2"):
        with pytest.raises(SemaphoreBusy) as busy:
            job(5)
        job(6)  # another key: runs
    assert busy.value.resource == "job:5"
    assert busy.value.holder_user_id == "worker-2"
    assert calls == [6]
    job(5)
    assert calls == [6, 5]


def test_on_busy_decides_for_a_function(lock_table):
    @semaphore("job:{pk}", on_busy=lambda exc, pk, **kw: ("later", pk, exc.resource))
    def job(pk, note=""):
        return "ran"

    with semaphore("job:1"):
        assert job(1, note="x") == ("later", 1, "job:1")
    assert job(1) == "ran"


def test_function_records_the_decorators_user(lock_table):
    @semaphore("who:{n}", user="nightly-import")
    def job(n):
        return holds_on(f"who:{n}")[0].user_id

    assert job(1) == "nightly-import"

    @semaphore("who:{n}")
    def anonymous(n):
        return holds_on(f"who:{n}")[0].user_id

    assert anonymous(2) == PROCESS_IDENTITY


def test_method_binds_self(lock_table):
    class Report:
        def __init__(self, pk):
            self.pk = pk

        @semaphore("report:{self.pk}:{period}")
        def build(self, period="2024"):
            return current_hold().resource

    assert Report(3).build() == "report:3:2024"
    assert Report(4).build(period="q1") == "report:4:q1"


def test_callable_key_gets_the_calls_arguments(lock_table):
    seen = []

    def key_of(*args, **kwargs):
        seen.append((args, kwargs))
        return f"cb:{args[0]}"

    @semaphore(key_of)
    def job(pk, kind="full"):
        return current_hold().resource

    assert job(9, kind="x") == "cb:9"
    assert seen == [((9,), {"kind": "x"})]


def test_async_function_binds_raises_and_holds_until_it_finishes(lock_table):
    # The first run holds until the second has been refused (a fixed sleep of 0.2 s could
    # end first on a loaded machine: the matrix's ci35).
    gate: list[asyncio.Event] = []

    @semaphore("ajob:{pk}:{kind}", wait=0)
    async def job(pk, kind="full"):
        await gate[0].wait()
        return current_hold().fence

    async def scenario() -> tuple[int, Any, list[HoldInfo]]:
        gate.append(asyncio.Event())
        task = asyncio.ensure_future(job(1))
        during = await asyncio.to_thread(wait_for_holds, "ajob:1:full")
        with pytest.raises(SemaphoreBusy):
            await job(pk=1)
        gate[0].set()
        return await task, during, await asyncio.to_thread(holds_on, "ajob:1:full")

    fence, during, after = asyncio.run(scenario())
    assert iscoroutinefunction(job)
    assert fence == during[0].fence
    assert after == []


def test_async_on_busy_may_be_a_coroutine(lock_table):
    async def later(exc, pk):
        return f"later {pk}"

    @semaphore("ajob:{pk}", on_busy=later)
    async def job(pk):
        return "ran"

    with semaphore("ajob:2"):
        assert asyncio.run(job(2)) == "later 2"


def test_async_views_on_busy_may_be_a_coroutine(lock_table):
    async def busy_page(request, exc):
        return HttpResponse("come back later", status=503)

    @semaphore("aview:{n}", on_busy=busy_page)
    async def view(request, n):  # pragma: no cover - busy
        return HttpResponse("ran")

    with semaphore("aview:1"):
        response = asyncio.run(view(RequestFactory().get("/"), n=1))
    assert response.status_code == 503


def test_busy_inside_the_body_is_not_the_decorators_busy(lock_table):
    @semaphore("outer:{n}", on_busy=lambda exc, n: "on_busy")
    def job(n):
        with semaphore("inner", wait=0):
            return "ran"

    with semaphore("inner"):
        with pytest.raises(SemaphoreBusy) as busy:
            job(1)
    assert busy.value.resource == "inner"
    assert holds_on("outer:1") == []


def test_wrong_call_raises_like_the_function_before_any_request(lock_table, requests_sent):
    @semaphore("job:{pk}")
    def job(pk):  # pragma: no cover - never reached
        pass

    with pytest.raises(TypeError, match=r"job\(\) missing a required argument: 'pk'"):
        job()
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        job(1, nope=2)
    assert requests_sent.total == 0


def test_template_naming_no_argument_of_a_function_raises_naming_it(lock_table, requests_sent):
    @semaphore("job:{project_id}")
    def job(pk):  # pragma: no cover - never reached
        pass

    with pytest.raises(ValueError, match="'project_id'.*call .*job\\(\\)"):
        job(1)
    assert requests_sent.total == 0


def test_what_cannot_be_decorated_is_refused_saying_why():
    with pytest.raises(TypeError, match="decorates a callable"):
        semaphore("x")(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="method_decorator"):

        @semaphore("x")
        class V(View):
            pass

    with pytest.raises(TypeError, match="generator"):

        @semaphore("x")
        def gen():  # pragma: no cover
            yield 1

    with pytest.raises(TypeError, match="generator"):

        @semaphore("x")
        async def agen():  # pragma: no cover
            yield 1


def test_a_request_first_makes_a_view_call(lock_table):
    @semaphore("rule:{n}", wait=0)
    def handle(first, n):
        return HttpResponse("ran")

    with semaphore("rule:1"):
        # An HttpRequest first: a view call, busy is a 423 response.
        assert_locked(handle(RequestFactory().get("/"), n=1))
        # Anything else first: a function call, busy raises.
        with pytest.raises(SemaphoreBusy):
            handle("not a request", n=1)


def test_decorated_view_reaches_its_hold(lock_table):
    @semaphore("fenced:{n}")
    def view(request, n):
        held = current_hold()
        assert current_hold("fenced:1") is held
        return HttpResponse(f"{held.resource} {held.fence} {held.token}")

    resource, fence, token = view(RequestFactory().get("/"), n=1).content.decode().split()
    assert resource == "fenced:1" and int(fence) > 0 and len(token) == 32
    with pytest.raises(LookupError, match="no dynasem hold"):
        current_hold()


def test_decorated_async_view_reaches_its_hold(lock_table):
    @semaphore("afenced:{n}")
    async def view(request, n):
        return HttpResponse(str(current_hold().fence))

    response = asyncio.run(view(RequestFactory().get("/"), n=1))
    assert int(response.content) > 0


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def key(template: str, *args: Any, **kwargs: Any) -> str:
    return resource_key(template, *args, **kwargs)


def test_key_formats_view_arguments(lock_table):
    assert key("tbl_issues:{project_id}", project_id=42) == "tbl_issues:42"
    assert key("t:{0}:{1}", "a", "b") == "t:a:b"

    @semaphore(lambda request, x: f"k/{x}:{x}")
    def view(request, x):
        return HttpResponse(current_hold().resource)

    # A callable's key is used as returned: nothing escaped.
    assert view(RequestFactory().get("/"), x="a:b").content == b"k/a:b:a:b"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"x": "1:2", "y": "3"}, {"x": "1", "y": "2:3"}),
        ({"x": ":", "y": ""}, {"x": "", "y": ":"}),
        ({"x": "%3A", "y": "1"}, {"x": ":", "y": "1"}),
        ({"x": "%", "y": "1"}, {"x": "%25", "y": "1"}),
        ({"x": "é", "y": "1"}, {"x": "%C3%A9", "y": "1"}),
        ({"x": "a b", "y": "c"}, {"x": "a", "y": "b c"}),
        ({"x": "a b", "y": "c"}, {"x": "a%20b", "y": "c"}),
        ({"x": "日本", "y": "語"}, {"x": "日", "y": "本語"}),
        ({"x": "{y}", "y": "1"}, {"x": "1", "y": "1"}),
    ],
)
def test_different_arguments_never_share_a_key(one, other):
    assert key("a:{x}:{y}", **one) != key("a:{x}:{y}", **other)


def test_values_of_letters_digits_dash_underscore_dot_are_used_as_written():
    for template in ["deploy:{slug}", "a:{x}:{y}", "{x}/{y}", "t:{0}:{1}", "{x}: {y}!"]:
        values = {"x": "my-app_v2.1", "y": "Z9", "slug": "my-app_v2.1"}
        positional = ["my-app_v2.1", "Z9"]
        assert resource_key(template, *positional, **values) == template.format(
            *positional, **values
        )
    assert SAFE == set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def test_every_field_escapes_ascii_punctuation_spaces_and_percent_whatever_the_template():
    assert resource_key("file:{path}", path="a/b?c=d&e") == "file:a%2Fb%3Fc%3Dd%26e"
    assert resource_key("file:{path}", path="1:2") == "file:1%3A2"
    assert resource_key("file:{path}", path="100% a") == "file:100%25%20a"
    assert resource_key("file:{path}", path="{}") == "file:%7B%7D"
    assert resource_key("a:{x}:{y}", x="1:2", y="3") == "a:1%3A2:3"
    assert resource_key("{x}/{y}", x="a/b", y="c:d") == "a%2Fb/c%3Ad"
    # Printable letters beyond ASCII stay as written, unless the template parts fields with one.
    assert resource_key("doc:{title}", title="é日本") == "doc:é日本"
    assert resource_key("{x}→{y}", x="a→b", y="é") == "a%E2%86%92b→é"


def test_a_field_cannot_make_the_key_of_another_template():
    # The review's case: one argument set of one template was the key of another template.
    assert resource_key("tbl_issues:{id}", id="1:export") == "tbl_issues:1%3Aexport"
    assert resource_key("tbl_issues:{id}:export", id=1) == "tbl_issues:1:export"
    assert resource_key("file:{p}", p="a/meta") != resource_key("file:{p}/meta", p="a")
    # And a unique task's key (reindex:{id}) is out of reach of a view's {slug}.
    assert resource_key("{slug}", slug="reindex:42") == "reindex%3A42"


def test_control_characters_in_a_field_are_escaped_not_stored():
    value = "1\x1b[2K\rbilling:7\x00\x7f\x85\u2028"
    key = resource_key("tbl_issues:{project_id}", project_id=value)
    assert key == "tbl_issues:1%1B%5B2K%0Dbilling%3A7%00%7F%C2%85%E2%80%A8"
    assert key.isprintable()


def test_a_field_cannot_reach_dynasems_own_leader_prefix():
    assert resource_key("{slug}", slug="leader:beat") == "leader%3Abeat"
    assert resource_key("{kind}:{id}", kind="leader", id="beat") == "%6Ceader:beat"
    assert resource_key("lead{x}:{y}", x="er", y="beat") == "lead%65r:beat"
    assert resource_key("{kind}:{id}", kind="leaders", id="beat") == "leaders:beat"
    assert resource_key("{kind}:{id}", kind="", id="beat") == ":beat"
    # The template's own text names what it names: the field is not what reaches the prefix.
    assert resource_key("leader:{name}", name="beat") == "leader:beat"
    assert resource_key("{a}leader:{name}", a="", name="beat") == "leader:beat"


def test_escaping_is_injective_over_tricky_values():
    # Every pair of values up to two characters from an alphabet of the troublemakers.
    alphabet = ["a", "3", "A", ":", "%", " ", "é", "{", "-", ".", "/", "\x1b", "→"]
    values = ["".join(p) for n in range(3) for p in itertools.product(alphabet, repeat=n)]
    for template in ["a:{x}:{y}", "{x}/{y}", "{x}:-/{y}.", "{x} {y}", "{x}→{y}", "{x}:{y}ab"]:
        seen: dict[str, tuple[str, str]] = {}
        for x, y in itertools.product(values, repeat=2):
            k = resource_key(template, x=x, y=y)
            assert seen.setdefault(k, (x, y)) == (x, y), f"{(x, y)} and {seen[k]} share {k!r}"
        assert len(seen) == len(values) ** 2


def test_decorator_and_with_block_lock_the_same_resource(lock_table):
    @semaphore("deploy:{slug}", wait=0)
    def deploy(request, slug):
        return HttpResponse("deployed")

    slug = "my-app_v2.1"
    with semaphore(f"deploy:{slug}"):
        assert_locked(deploy(RequestFactory().post("/"), slug=slug))
    assert deploy(RequestFactory().post("/"), slug=slug).status_code == 200
    # Any value: resource_key names the decorator's lock.
    slug = "my app/v2:1 é"
    with semaphore(resource_key("deploy:{slug}", slug=slug)):
        assert_locked(deploy(RequestFactory().post("/"), slug=slug))
    assert deploy(RequestFactory().post("/"), slug=slug).status_code == 200


@pytest.mark.parametrize(
    "template",
    ["{a}{b}", "{a}x{b}", "k:{a}ab{b}", "{a}%{b}", "{0}{1}", "{a}-{b}", "{a}.{b}", "{a}_{b}"],
)
def test_ambiguous_template_is_refused_at_decoration_time(template):
    with pytest.raises(ValueError, match="separat"):

        @semaphore(template)
        def view(request, a, b):  # pragma: no cover - never decorated
            return HttpResponse()


def test_ambiguous_template_in_a_list_is_refused():
    with pytest.raises(ValueError):

        @semaphore(["ok:{a}", "{a}{b}"])
        def view(request, a, b):  # pragma: no cover
            return HttpResponse()


@pytest.mark.parametrize(
    "template", ["{a}:{b}", "{a}-:{b}", "{a}/x/{b}", "x{a}", "{a}x", "{a}", "{a}-{{b}}"]
)
def test_separated_template_is_accepted(template):
    @semaphore(template)
    def view(request, a, b=None):
        return HttpResponse()

    assert callable(view)


def test_resource_key_refuses_bad_templates():
    with pytest.raises(ValueError, match="separat"):
        resource_key("{a}-{b}", a="1", b="2")
    with pytest.raises(ValueError, match="not a valid format string"):
        resource_key("{a", a="1")
    with pytest.raises(TypeError, match="template must be a str"):
        resource_key(["x"])  # type: ignore[arg-type]


def test_template_naming_a_missing_argument_raises_naming_it(lock_table, requests_sent):
    @semaphore("tbl_issues:{project_id}")
    def view(request, pk):  # pragma: no cover - never reached
        return HttpResponse()

    with pytest.raises(ValueError, match="project_id"):
        view(RequestFactory().get("/"), pk=1)
    assert requests_sent.total == 0


def test_callable_key_must_return_str(lock_table, requests_sent):
    @semaphore(lambda request, n: n)
    def view(request, n):  # pragma: no cover - never reached
        return HttpResponse()

    for bad in [42, b"bytes", None]:
        with pytest.raises(TypeError, match=type(bad).__name__):
            view(RequestFactory().get("/"), n=bad)
    assert requests_sent.total == 0


def test_callable_key_gets_request_and_arguments(lock_table):
    seen = []

    def key_of(request, *args, **kwargs):
        seen.append((request.path, args, kwargs))
        return f"cb:{kwargs['n']}"

    @semaphore(key_of)
    def view(request, n):
        return HttpResponse(str([h.resource for h in holds_on("cb:5")]))

    response = view(RequestFactory().get("/p/"), n=5)
    assert response.content == b"['cb:5']"
    assert seen == [("/p/", (), {"n": 5})]


def test_method_decorator_formats_view_kwargs(lock_table):
    class V(View):
        @method_decorator(semaphore("m:{slug}:{n}"))
        def get(self, request, slug, n):
            key = resource_key("m:{slug}:{n}", slug=slug, n=n)
            return HttpResponse(",".join(h.resource for h in holds_on(key)))

    response = V.as_view()(RequestFactory().get("/"), slug="a:b", n=1)
    assert response.content == b"m:a%3Ab:1"


if hypothesis is not None:

    @hypothesis.given(
        st.sampled_from(["a:{x}:{y}", "{x}/{y}", "{x}: {y}", "{x}:{y}-", "{x}:{y}", "l{x}:{y}"]),
        st.text(),
        st.text(),
        st.text(),
        st.text(),
    )
    @hypothesis.settings(max_examples=300, deadline=None)
    def test_keys_never_collide_property(template, x1, y1, x2, y2):
        if (x1, y1) != (x2, y2):
            assert key(template, x=x1, y=y1) != key(template, x=x2, y=y2)

else:

    @pytest.mark.skip(reason="hypothesis is not installed")
    def test_keys_never_collide_property():  # pragma: no cover
        pass


def test_a_url_value_too_long_for_a_key_is_a_400_and_sends_nothing(lock_table, requests_sent):
    @semaphore("deploy:{env}:{slug}", wait=0)
    def deploy(request, env, slug):
        raise AssertionError("must not run")

    # 400 separators escape to 1,200 bytes (%3A each): past the 1,024 a key may have.
    response = deploy(RequestFactory().post("/"), env="prod", slug=":" * 400)
    assert response.status_code == 400
    assert "1024" in response.content.decode()
    response = deploy(RequestFactory().post("/"), env="prod", slug="x" * 1100)
    assert response.status_code == 400
    assert requests_sent.total == 0


def test_an_async_view_answers_400_for_a_key_too_long_too(lock_table, requests_sent):
    @semaphore("deploy:{slug}", wait=0)
    async def deploy(request, slug):
        raise AssertionError("must not run")

    response = asyncio.run(deploy(RequestFactory().post("/"), slug="x" * 1100))
    assert response.status_code == 400
    assert requests_sent.total == 0


def test_a_view_value_cannot_take_a_leadership_or_another_templates_lock(lock_table):
    from dynasem import leadership

    @semaphore("{slug}", wait=0)
    def by_slug(request, slug):
        return HttpResponse(current_hold().resource)

    @semaphore("{kind}:{id}", wait=0)
    def by_kind(request, kind, id):
        return HttpResponse(current_hold().resource)

    @semaphore("tbl_issues:{id}", wait=0)
    def issue(request, id):
        return HttpResponse(current_hold().resource)

    # Called from another thread: this one's holds would be re-entered, not waited for.
    def call(view: Any, **kwargs: Any) -> Any:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(view, RequestFactory().post("/"), **kwargs).result()

    with leadership("beat", wait=0), semaphore("tbl_issues:1:export", wait=0):
        for response in [
            call(by_slug, slug="leader:beat"),
            call(by_kind, kind="leader", id="beat"),
            call(issue, id="1:export"),
        ]:
            assert response.status_code == 200, response.content
            assert response.content.decode() not in ("leader:beat", "tbl_issues:1:export")


def test_a_view_value_with_control_characters_locks_its_escaped_key(lock_table):
    @semaphore("tbl_issues:{project_id}", wait=0)
    def view(request, project_id):
        return HttpResponse(current_hold().resource)

    response = view(RequestFactory().post("/"), project_id="1\x1b[2K\rbilling:7")
    assert response.status_code == 200
    assert response.content == b"tbl_issues:1%1B%5B2K%0Dbilling%3A7"


def test_a_callable_key_with_a_control_character_is_a_400_and_sends_nothing(
    lock_table, requests_sent
):
    @semaphore(lambda request, name: f"file:{name}", wait=0)
    def view(request, name):
        raise AssertionError("must not run")

    @semaphore(lambda request, name: f"file:{name}", wait=0)
    async def async_view(request, name):
        raise AssertionError("must not run")

    requests_sent.reset()
    for response in [
        view(RequestFactory().post("/"), name="a\x00b"),
        asyncio.run(async_view(RequestFactory().post("/"), name="a\x1b[2K")),
    ]:
        assert response.status_code == 400
        assert "control character" in response.content.decode()
    assert requests_sent.total == 0


def test_a_template_with_a_control_character_is_refused_at_decoration_time():
    with pytest.raises(ValueError, match=r"^resource 'a\\x1b:\{x\}'.*control character '\\x1b'"):

        @semaphore("a\x1b:{x}")
        def view(request, x):  # pragma: no cover - never decorated
            return HttpResponse()

    with pytest.raises(ValueError, match=r"^resource template 'a\\x1b:\{x\}'.*'\\x1b'"):
        resource_key("a\x1b:{x}", x=1)
