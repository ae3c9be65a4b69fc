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


@pytest.mark.xfail(
    strict=True,
    reason="lock_acquired (hold.acquired) and lock_busy (queue.busy) are sent with Signal.send "
    "inside the acquire loop, which an async acquire drives on the event loop's thread: a "
    "receiver that uses the ORM raises SynchronousOnlyOperation there (lock_released, sent "
    "from dynasem's executor, works). Mend: the loop yields a signal step (core.Acquire.write "
    "and permits, where take.hold is called; queue.busy's callers) that run_sync sends and "
    "run_async awaits as Signal.asend (sync_to_async(send) on Django 4.2), as Django's own "
    "async senders do; it needs core.py, not this helper's to edit.",
)
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
