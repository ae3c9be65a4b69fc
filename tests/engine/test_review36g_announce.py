"""Review (thirty-sixth session, g): lock_acquired and lock_busy sent as a step of the acquire
loop (``steps.Announce``), across the kinds of semaphore that drive it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from dynasem import SemaphoreBusy, release_all, semaphore
from dynasem import signals as dynasem_signals
from dynasem._operators.locks import holds_on


class Interrupt(BaseException):
    """A signal handler's exception (Ctrl-C, a task's soft time limit)."""


@pytest.fixture
def receiver() -> Iterator[Any]:
    connected: list[str] = []

    def connect(name: str, func: Any) -> None:
        getattr(dynasem_signals, name).connect(func, weak=False, dispatch_uid="review36g-recv")
        connected.append(name)

    yield connect
    for name in connected:
        getattr(dynasem_signals, name).disconnect(dispatch_uid="review36g-recv")


KINDS: dict[str, dict[str, Any]] = {
    "exclusive": {},
    "several": {"resources": ["b", "a"]},
    "permits": {"limit": 3},
    "shared": {"shared": True},
    "coalesce": {"coalesce": True, "wait": 5},
}


def _sem(kind: str, name: str, **more: Any) -> Any:
    options = dict(KINDS[kind])
    resources = [f"{name}-{r}" for r in options.pop("resources", ["x"])]
    options.update(more)
    return semaphore(resources if len(resources) > 1 else resources[0], lease=30, **options)


def _free(sem: Any) -> bool:
    return all(holds_on(r) == [] for r in sem.resources)


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(
    ("kind", "error"),
    [
        (kind, error)
        for kind in KINDS
        for error in (RuntimeError, ValueError, SemaphoreBusy, Interrupt)
    ],
)
def test_a_raising_lock_acquired_receiver_leaves_nothing_held(
    lock_table: str, receiver: Any, kind: str, error: type[BaseException], driver: str
) -> None:
    """Every kind of semaphore drives the same loop: a lock_acquired receiver that raises
    (the loop's own kinds of answer too) gives the hold back, once, and ends the acquire.
    A coalesced acquire took a receiver's SemaphoreBusy (a receiver that tried another lock)
    for its own first attempt's: it registered as the next run, took the lock again and ran
    the receiver twice. A receiver's exception is now marked as such, and re-raised."""
    sent: list[str] = []

    def refuse(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs["token"])
        if error is SemaphoreBusy:
            raise SemaphoreBusy(kwargs["resource"], 1, None, None, 0.0)
        raise error("the audit database is down")

    receiver("lock_acquired", refuse)
    released: list[str] = []
    receiver("lock_released", lambda sender, **kw: released.append(kw["token"]))
    sem = _sem(kind, f"r36g-{kind}-{error.__name__}-{driver}")
    try:
        with pytest.raises(error):
            if driver == "sync":
                sem.acquire()
            else:
                asyncio.run(sem.aacquire())
        assert len(sent) == 1
        assert _free(sem), "the hold stayed, for nobody"
        assert released.count(sent[0]) <= 1
    finally:
        release_all()


@pytest.mark.parametrize("driver", ["sync", "async", "cancel"])
@pytest.mark.parametrize("error", [RuntimeError, ValueError, Interrupt])
@pytest.mark.parametrize("kind", ["exclusive", "several", "permits"])
def test_a_raising_lock_busy_receiver_leaves_no_waiter_behind(
    lock_table: str, receiver: Any, kind: str, error: type[BaseException], driver: str
) -> None:
    """A busy acquire that waited in the queue, whose lock_busy receiver raises (or whose task
    is cancelled while it is awaited): its queue entry is gone, nothing is held for it, and
    the holder's release leaves the lock free for the next."""
    from tests.support.helpers import queue_of

    name = f"r36g-busy-{kind}-{error.__name__}-{driver}"
    holders = [_sem(kind, name).acquire() for _ in range(3 if kind == "permits" else 1)]
    sent: list[str] = []

    async def slow(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs["token"])
        await asyncio.sleep(60)

    def refuse(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs["token"])
        raise error("the audit database is down")

    receiver("lock_busy", slow if driver == "cancel" else refuse)
    sem = _sem(kind, name, wait=1.5)

    async def cancelled() -> None:
        task = asyncio.ensure_future(sem.aacquire())
        while not sent:
            await asyncio.sleep(0.01)
        task.cancel()
        await task

    try:
        expected = asyncio.CancelledError if driver == "cancel" else error
        with pytest.raises(expected):
            if driver == "sync":
                sem.acquire()
            elif driver == "async":
                asyncio.run(sem.aacquire())
            else:
                asyncio.run(cancelled())
        assert len(sent) == 1
        assert all(queue_of(r) == {} for r in sem.resources), "a waiter nobody is left for"
        mine = [h for r in sem.resources for h in holds_on(r) if h.token == sent[0]]
        assert mine == []
        for held in holders:
            held.release()
        with _sem(kind, name, wait=0):
            pass
    finally:
        release_all()


def test_an_async_acquire_on_django_4_2_with_no_receiver_needs_no_sync_thread(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django 4.2 has no ``Signal.asend``: lock_acquired was sent with
    ``sync_to_async(signal.send)`` even when nobody listens, a hop to the request's sync
    thread for every async acquire. A sync view under ASGI that runs async code with
    ``asyncio.run`` (its coroutine inherits the request's thread-sensitive context) waited
    there for itself: the hop was queued to the very thread that waits in ``asyncio.run``,
    a deadlock, for good, with no receiver connected at all. On Django 5.0+ ``asend`` sends
    nothing without a receiver; the 4.2 path now does the same."""
    import threading

    from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
    from django.dispatch import Signal

    monkeypatch.delattr(Signal, "asend")
    assert not dynasem_signals.lock_acquired.has_listeners()
    done: list[str] = []

    async def work() -> None:
        async with semaphore("r36g-django-4.2", lease=30) as held:
            done.append(held.token)

    def view() -> None:
        asyncio.run(work())  # the view's own loop, on the request's sync thread

    async def request() -> None:
        async with ThreadSensitiveContext():
            await sync_to_async(view)()

    handler = threading.Thread(target=asyncio.run, args=(request(),), daemon=True)
    handler.start()
    handler.join(15)
    stuck = handler.is_alive()
    if stuck:  # free the deadlocked thread-sensitive thread's executor for later tests
        SyncToAsync.context_to_thread_executor.clear()
    assert not stuck, "the async acquire waited for the thread it runs on"
    assert len(done) == 1
    release_all()


@pytest.mark.reentry
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_nested_acquire_sends_no_lock_acquired(
    lock_table: str, receiver: Any, driver: str
) -> None:
    """A nested acquire re-enters its outer hold: no hold is taken, none announced."""
    sent: list[str] = []
    receiver("lock_acquired", lambda sender, **kw: sent.append(kw["token"]))

    def sem() -> Any:
        return semaphore("r36g-nested", lease=30)

    async def nested() -> None:
        async with sem() as outer:
            async with sem() as inner:
                assert inner.token == outer.token

    try:
        if driver == "sync":
            with sem() as outer:
                with sem() as inner:
                    assert inner.token == outer.token
        else:
            asyncio.run(nested())
        assert len(sent) == 1
        assert holds_on("r36g-nested") == []
    finally:
        release_all()


def test_a_carried_give_back_interrupted_before_its_release_began_is_not_kept_for_nobody(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view's template response carries its hold until rendered; its give-back (called
    by render's post-render callback, a streaming body's end, close()) takes the hold out
    of ``ours`` first, then leaves. Ctrl-C or a worker's time limit landing at ``leave``'s
    first line (ahead of the release's own guard) left the hold renewed by its heartbeat for
    nobody while the process lived: neither a later call nor the response's drop gives it
    back (``ours`` is empty). As a ``with`` block's exit (f7f88f7): left to its lease."""
    import time

    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    from dynasem._engine import decorators
    from tests.engine.test_heartbeat import LEASE, heartbeats_of, wait_for_renewal

    resource = "r36g-carried:1"
    held: list[Any] = []

    @semaphore("r36g-carried:{n}", lease=LEASE)
    def view(request: Any, n: int) -> Any:
        from dynasem import current_hold

        held.append(current_hold())
        return SimpleTemplateResponse(engines["django"].from_string("ok"), {})

    real = decorators.leave

    def leave(hold: Any, raised: bool) -> None:
        monkeypatch.setattr(decorators, "leave", real)
        raise KeyboardInterrupt  # the signal, before the release's first step

    try:
        response = view(RequestFactory().get("/"), n=1)
        wait_for_renewal(held[0])
        monkeypatch.setattr(decorators, "leave", leave)
        with pytest.raises(KeyboardInterrupt):
            response.render()
        del response
        time.sleep(2 * (LEASE - 0.5) / 3 + 0.15)  # two renewals would have been due
        assert heartbeats_of(resource) == [], "the hold is renewed on, for nobody"
        with semaphore(resource, lease=LEASE, wait=3 * LEASE) as again:
            assert again.token != held[0].token
    finally:
        release_all()


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_template_response_whose_render_raises_gives_its_hold_back_at_once(
    lock_table: str, kind: str
) -> None:
    """A view's template response carries its hold until rendered; a render that raises
    (a template error: a 500) never calls the post-render callback, and the hold waited for
    the response's drop. Under ASGI (the render in ``sync_to_async``) the exception's
    traceback keeps the response in a reference cycle: the hold stayed, renewed for nobody,
    until the garbage collector ran (for objects that lived into its oldest generation, a
    long while in a quiet process). Mended: a render that raises gives the hold back."""
    import gc
    import time

    from asgiref.sync import sync_to_async
    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    class Rows:
        def __str__(self) -> str:
            raise RuntimeError("the template failed")

    @semaphore("r36g-raise-{n}", lease=30)
    def view(request: Any, n: int) -> Any:
        template = engines["django"].from_string("{{ rows }}")
        return SimpleTemplateResponse(template, {"rows": Rows()})

    async def asgi() -> None:  # what Django's ASGI handler does with a view's answer
        response = await sync_to_async(view)(RequestFactory().get("/"), n=kind)
        with pytest.raises(RuntimeError):
            await sync_to_async(response.render)()

    def wsgi() -> None:
        response = view(RequestFactory().get("/"), n=kind)
        with pytest.raises(RuntimeError):
            response.render()

    resource = f"r36g-raise-{kind}"
    gc.collect()
    gc.disable()  # the collector runs when it will: not within the second below
    try:
        if kind == "asgi":
            asyncio.run(asgi())
        else:
            wsgi()
        deadline = time.monotonic() + 1
        while holds_on(resource) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holds_on(resource) == [], "kept until the garbage collector runs"
    finally:
        gc.enable()
        release_all()
