"""Review 38 (helper e): the decorator and context manager as a Django user meets them."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.decorators import method_decorator
from django.views import View

from dynasem import SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem.signals import lock_acquired


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


@pytest.fixture
def acquired_receiver() -> Iterator[Callable[[Callable[..., Any]], None]]:
    def connect(func: Callable[..., Any]) -> None:
        lock_acquired.connect(func, weak=False, dispatch_uid="review38e-acquired")

    yield connect
    lock_acquired.disconnect(dispatch_uid="review38e-acquired")


@pytest.mark.parametrize("kind", ["view", "async view", "function"])
def test_a_lock_acquired_receivers_busy_lock_is_not_the_decorated_calls_busy_answer(
    lock_table, acquired_receiver, kind
):
    """A ``lock_acquired`` receiver that takes another lock of its own (an audit trail's,
    ``wait=0``) and finds it busy raises that lock's ``SemaphoreBusy``: the hold is given
    back and the acquire ends with the receiver's exception. The decorator took it for its
    own acquire's busy answer: the view answered 423 naming the receiver's lock (its
    holder, its Retry-After), and a function's ``on_busy`` was called with it, although the
    decorated call's own resource was free. As a ``with`` block does (and as a
    ``SemaphoreBusy`` raised inside the body does), it propagates."""

    def audit(sender: Any, **kwargs: Any) -> None:
        if kwargs["resource"].startswith("r38e-busy:"):
            raise SemaphoreBusy("audit-trail", 3, "someone", None, 0.0)

    acquired_receiver(audit)
    ran: list[object] = []
    answered: list[object] = []

    if kind == "function":

        @semaphore("r38e-busy:{n}", on_busy=lambda exc, n: answered.append(exc))
        def call(n):
            ran.append(n)

        call_it: Callable[[], Any] = lambda: call(1)  # noqa: E731
    elif kind == "view":

        @semaphore("r38e-busy:{n}")
        def view(request, n):
            ran.append(n)
            return HttpResponse("ok")

        call_it = lambda: view(RequestFactory().get("/"), n=1)  # noqa: E731
    else:

        @semaphore("r38e-busy:{n}")
        async def aview(request, n):
            ran.append(n)
            return HttpResponse("ok")

        call_it = lambda: asyncio.run(aview(RequestFactory().get("/"), n=1))  # noqa: E731

    with pytest.raises(SemaphoreBusy) as raised:
        answered.append(call_it())
    assert raised.value.resource == "audit-trail"
    assert ran == [] and answered == []
    assert holds_on("r38e-busy:1") == []


def _logged(func: Callable[..., Any]) -> Callable[..., Any]:
    """A plain sync decorator, as many are: it hides that ``func`` is async."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def test_an_async_function_under_a_sync_decorator_is_refused_not_run_unlocked(lock_table):
    """``@semaphore`` over a sync decorator that wraps an ``async def`` (it hides that the
    call makes a coroutine): locked as a sync call, the lock was given back as the coroutine
    was made, and its body ran later with no lock, beside another caller's. Refused as a
    generator function is, before its body begins."""
    inside: list[int] = []

    @semaphore("r38e-hidden:{n}")
    @_logged
    async def rebuild(n):
        inside.append(len(holds_on(f"r38e-hidden:{n}")))

    async def call() -> None:
        await rebuild(1)

    try:
        asyncio.run(call())
        refused = ""
    except TypeError as exc:
        refused = str(exc)
    assert inside == [], f"the body ran, holders of its lock then: {inside}"
    assert "coroutine" in refused
    assert holds_on("r38e-hidden:1") == []


def test_a_hold_taken_in_a_task_a_lock_acquired_receiver_starts_is_that_tasks(lock_table):
    """An async ``lock_acquired`` receiver starts a task (an audit trail's) that takes a lock
    of its own, then raises: the acquire fails and gives back what it took. The task's
    context, copied from the acquire's, had the acquire's box of holds not yet delivered,
    so the task's acquire counted itself nested in it, put its hold there, and the failing
    acquire gave that hold back while the task was inside its block: its lock free for
    anyone while it ran. (On Django 5.0 and 5.1, ``Signal.asend`` runs async receivers with
    ``asyncio.gather``: a sibling receiver's block needs no task of its own to be hit.)"""
    seen: list[int] = []
    background: list[tuple[asyncio.Task[None], asyncio.Event]] = []

    async def audit_receiver(sender: Any, **kwargs: Any) -> None:
        if kwargs["resource"] != "r38e-main":
            return
        inside, done = asyncio.Event(), asyncio.Event()

        async def audit() -> None:
            async with semaphore("r38e-audit"):
                inside.set()
                await done.wait()
                seen.append(len(holds_on("r38e-audit")))

        background.append((asyncio.create_task(audit()), done))
        await inside.wait()
        raise RuntimeError("the audit database is down")

    lock_acquired.connect(audit_receiver, weak=False, dispatch_uid="review38e-audit")
    try:

        async def main() -> None:
            with pytest.raises(RuntimeError):
                await semaphore("r38e-main").aacquire()
            task, done = background[0]
            done.set()
            await task

        asyncio.run(main())
    finally:
        lock_acquired.disconnect(dispatch_uid="review38e-audit")
    assert seen == [1], f"holders of the audit task's lock while it was inside: {seen}"
    assert holds_on("r38e-main") == [] and holds_on("r38e-audit") == []
