"""Review (thirty-sixth session): dynasem's own use of its public signals, beside a user's
receivers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dynasem import leadership
from dynasem.signals import lock_lost


@pytest.fixture
def raising_receiver() -> Iterator[None]:
    """A project's ``lock_lost`` receiver (connected at start-up, before any lead) that
    raises: an alert whose webhook is down."""

    def alert(sender: Any, **kwargs: Any) -> None:
        raise ConnectionError("the alerting webhook is down")

    lock_lost.connect(alert, weak=False, dispatch_uid="review36-alert")
    try:
        yield
    finally:
        lock_lost.disconnect(dispatch_uid="review36-alert")


def test_a_raising_lock_lost_receiver_does_not_keep_on_lost_from_a_lead(
    lock_table: str, raising_receiver: None
) -> None:
    """A lead learns of its loss through ``lock_lost``, which Django sends receiver by
    receiver, stopping at the first that raises: a project's receiver connected before the
    lead (at start-up) that raised kept ``on_lost`` from being called (the guide's way to
    stop a leader's work) until something asked ``lead.active``."""
    from dynasem._operators.locks import break_hold, holds_on

    told = threading.Event()
    with leadership("review36-jobs", lease=5, on_lost=lambda lead: told.set()):
        (hold,) = holds_on("leader:review36-jobs")
        break_hold("leader:review36-jobs", hold.token)  # the next renewal is refused
        assert told.wait(10), "on_lost was not called after the lead was broken"


@pytest.mark.parametrize("signal", ["lock_acquired", "lock_busy"])
def test_a_receiver_using_the_orm_works_for_an_async_acquire(
    lock_table: str, transactional_db: None, signal: str
) -> None:
    """An audit receiver (``AuditEntry.objects.create(...)``), as a Django project writes
    one, works for ``with semaphore(...)`` and for a sync view; for ``async with`` and an
    async view it raised ``SynchronousOnlyOperation``: the acquire failed (500, not the
    view's answer), or the busy answer became a 500 instead of 423."""
    import asyncio

    from django.contrib.auth.models import User

    from dynasem import SemaphoreBusy, semaphore
    from dynasem import signals as dynasem_signals

    def audit(sender: Any, **kwargs: Any) -> None:
        User.objects.filter(username=kwargs["user_id"]).exists()  # any ORM call

    getattr(dynasem_signals, signal).connect(audit, weak=False, dispatch_uid="review36-audit")

    async def go() -> None:
        async with semaphore("audited"):
            if signal == "lock_busy":
                with pytest.raises(SemaphoreBusy):  # not SynchronousOnlyOperation
                    async with semaphore("audited", wait=0):
                        pass

    try:
        asyncio.run(go())
    finally:
        getattr(dynasem_signals, signal).disconnect(dispatch_uid="review36-audit")


@pytest.fixture
def receiver() -> Iterator[Any]:
    """Connect a receiver to a signal by name for the test (``receiver(name, func)``)."""
    from dynasem import signals as dynasem_signals

    connected: list[str] = []

    def connect(name: str, func: Any) -> None:
        getattr(dynasem_signals, name).connect(func, weak=False, dispatch_uid="review36-recv")
        connected.append(name)

    yield connect
    for name in connected:
        getattr(dynasem_signals, name).disconnect(dispatch_uid="review36-recv")


async def _taken_then_busy(resource: str, signal: str) -> None:
    """Take ``resource``; for ``lock_busy``, try it again, not waiting, inside."""
    from dynasem import SemaphoreBusy, semaphore

    async with semaphore(resource):
        if signal == "lock_busy":
            with pytest.raises(SemaphoreBusy):
                async with semaphore(resource, wait=0):
                    pass


@pytest.mark.parametrize("signal", ["lock_acquired", "lock_busy"])
def test_an_async_receiver_is_awaited_on_the_loop_for_an_async_acquire(
    lock_table: str, receiver: Any, signal: str
) -> None:
    """As ``Signal.asend`` does: an async receiver is awaited on the acquire's own loop, its
    keyword arguments those of the sync send."""
    import asyncio

    seen: list[tuple[Any, dict[str, Any]]] = []

    async def audit(sender: Any, **kwargs: Any) -> None:
        seen.append((asyncio.get_running_loop(), kwargs))

    receiver(signal, audit)

    async def go() -> Any:
        await _taken_then_busy("async-receiver", signal)
        return asyncio.get_running_loop()

    loop = asyncio.run(go())
    assert [s[0] for s in seen] == [loop]
    assert seen[0][1]["resource"] == "async-receiver"
    assert ("fences" in seen[0][1]) == (signal == "lock_acquired")
    assert ("retry_after" in seen[0][1]) == (signal == "lock_busy")


@pytest.mark.parametrize("error", [RuntimeError, ValueError])
def test_a_raising_receiver_of_an_async_acquire_gives_the_hold_back(
    lock_table: str, receiver: Any, error: type[Exception]
) -> None:
    """``lock_acquired``'s documented rule for an async acquire too: a receiver that raises
    (sync, run in ``sync_to_async``; a ``ValueError`` too, which the acquire loop otherwise
    takes for its own answer) makes the acquire give the hold back and raise it."""
    import asyncio

    from dynasem import semaphore
    from dynasem._operators.locks import holds_on

    def refuse(sender: Any, **kwargs: Any) -> None:
        raise error("the audit database is down")

    receiver("lock_acquired", refuse)

    async def go() -> None:
        async with semaphore("refused-async", lease=30):
            pytest.fail("the block must not run")

    with pytest.raises(error):
        asyncio.run(go())
    assert holds_on("refused-async") == []
    with pytest.raises(error):
        semaphore("refused-sync", lease=30).acquire()
    assert holds_on("refused-sync") == []


def test_a_cancel_while_lock_acquired_is_awaited_gives_the_hold_back(
    lock_table: str, receiver: Any
) -> None:
    """A task cancelled while a ``lock_acquired`` receiver is awaited (the hold taken, its
    caller not having it yet): the hold is given back, not renewed for nobody."""
    import asyncio

    from dynasem import semaphore
    from dynasem._operators.locks import holds_on

    called: list[asyncio.Event] = []

    async def slow(sender: Any, **kwargs: Any) -> None:
        called[0].set()
        await asyncio.sleep(60)

    receiver("lock_acquired", slow)

    async def go() -> None:
        called.append(asyncio.Event())
        task = asyncio.ensure_future(semaphore("cancelled-in-receiver", lease=30).aacquire())
        await called[0].wait()
        assert holds_on("cancelled-in-receiver") != []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert holds_on("cancelled-in-receiver") == []


@pytest.mark.parametrize("signal", ["lock_acquired", "lock_busy"])
def test_a_sync_receiver_of_an_async_acquire_under_async_to_sync_runs_on_the_caller(
    lock_table: str, transactional_db: None, receiver: Any, signal: str
) -> None:
    """A sync view calling async code (``async_to_sync``): the thread-sensitive
    ``sync_to_async`` the signal is sent with runs the receiver on that view's thread, busy
    waiting for it, as asgiref runs such work: no deadlock, and the ORM works there."""
    from asgiref.sync import async_to_sync
    from django.contrib.auth.models import User

    ran_on: list[threading.Thread] = []

    def audit(sender: Any, **kwargs: Any) -> None:
        User.objects.filter(username=kwargs["user_id"]).exists()
        ran_on.append(threading.current_thread())

    receiver(signal, audit)
    view_threads: list[threading.Thread] = []

    def view() -> None:
        view_threads.append(threading.current_thread())
        async_to_sync(_taken_then_busy)("under-async-to-sync", signal)

    caller = threading.Thread(target=view)
    caller.start()
    caller.join(30)
    assert not caller.is_alive(), "the view's thread never ended"
    assert ran_on == view_threads


def test_a_receiver_using_the_orm_works_for_an_async_acquire_on_django_4_2(
    lock_table: str, transactional_db: None, receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django 4.2 has no ``Signal.asend``: the signal is sent in ``sync_to_async``."""
    import asyncio

    from django.contrib.auth.models import User
    from django.dispatch import Signal

    monkeypatch.delattr(Signal, "asend")
    seen: list[str] = []

    def audit(sender: Any, **kwargs: Any) -> None:
        seen.append(str(User.objects.filter(username=kwargs["user_id"]).exists()))

    receiver("lock_acquired", audit)
    asyncio.run(_taken_then_busy("django-4.2", "lock_acquired"))
    assert seen == ["False"]


def test_a_receiver_using_the_orm_works_for_an_async_release(
    lock_table: str, transactional_db: None, receiver: Any
) -> None:
    """``lock_released`` of an ``async with`` block is sent where its release runs, in a
    thread of dynasem's executor: not the event loop's thread."""
    import asyncio

    from django.contrib.auth.models import User

    seen: list[str] = []

    def audit(sender: Any, **kwargs: Any) -> None:
        seen.append(str(User.objects.filter(username=kwargs["user_id"]).exists()))

    receiver("lock_released", audit)
    asyncio.run(_taken_then_busy("released-async", "lock_acquired"))
    assert seen == ["False"]


def test_a_raising_lock_released_receiver_leaves_no_hold_at_exit(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holds whose release Ctrl-C cut short are given back at exit (``release_all``), each
    then sending ``lock_released``. A receiver that raised for the first stopped the rest:
    every later such hold stayed in its row for its lease, and the exit hook raised."""
    from dynasem import semaphore
    from dynasem._engine import shutdown
    from dynasem._operators.locks import holds_on
    from dynasem._storage import lock_rows
    from dynasem.signals import lock_released

    holds = [semaphore(f"exit-{n}", lease=30).acquire() for n in range(2)]
    real_update = lock_rows.update
    interrupted: set[str] = set()

    def update(action: dict[str, Any], **kwargs: Any) -> Any:
        key = str(action.get("Key"))
        if action["UpdateExpression"].startswith("REMOVE #h.#t") and key not in interrupted:
            interrupted.add(key)
            raise KeyboardInterrupt  # Ctrl-C before the give-back is sent
        return real_update(action, **kwargs)

    monkeypatch.setattr(lock_rows, "update", update)
    for held in holds:
        with pytest.raises(KeyboardInterrupt):
            held.release()
    assert all(holds_on(h.resource) for h in holds)

    def alert(sender: Any, **kwargs: Any) -> None:
        raise ConnectionError("the alerting webhook is down")

    lock_released.connect(alert, weak=False, dispatch_uid="review36-released")
    try:
        shutdown.release_all()
    finally:
        lock_released.disconnect(dispatch_uid="review36-released")
    assert [h.resource for h in holds if holds_on(h.resource)] == []


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_receiver_using_the_orm_works_when_async_code_finds_its_hold_lost(
    lock_table: str, transactional_db: None, receiver: Any, kind: str
) -> None:
    """Async code that asks ``held.lost`` (or ``raise_if_lost()``) past the hold's deadline,
    before the heartbeat saw it, finds the loss itself, on the event loop's thread: a sync
    ``lock_lost`` receiver that used the ORM raised ``SynchronousOnlyOperation`` out of
    ``held.lost``, and an async one a ``RuntimeError`` (Django's ``send`` cannot run it
    there); the block saw an error instead of ``True``."""
    import asyncio

    from django.contrib.auth.models import User

    from dynasem import _clock as clock
    from dynasem import semaphore
    from dynasem._engine.hold import stop_renewing

    told = threading.Event()
    seen: list[str] = []

    def audit(sender: Any, **kwargs: Any) -> None:
        seen.append(str(User.objects.filter(username=kwargs["user_id"]).exists()))
        told.set()

    async def aaudit(sender: Any, **kwargs: Any) -> None:
        seen.append(str(await User.objects.filter(username=kwargs["user_id"]).aexists()))
        told.set()

    receiver("lock_lost", audit if kind == "sync" else aaudit)

    async def go() -> bool:
        held = await semaphore("lost-async", lease=30).aacquire()
        stop_renewing(held)
        held._deadline = clock.monotonic() - 1  # paused past its trusted lease
        lost = held.lost
        await asyncio.sleep(0)
        return lost

    assert asyncio.run(go())
    assert told.wait(10), "lock_lost was not sent"
    assert seen == ["False"]
