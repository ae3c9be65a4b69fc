"""Background work under review (eighth review, second round, helper g): the interrupt
windows left beside the mends of helper d. Each test says in its docstring what it shows and
whether it failed before its mend."""

from __future__ import annotations

import threading
import types
from typing import Any

import django
import pytest

from dynasem import semaphore
from dynasem._background import unique
from dynasem._background.unique import claim
from dynasem._engine import heartbeat
from dynasem._engine.coalescing import Registration
from dynasem._operators.locks import holds_on
from dynasem.testing import held_elsewhere

# dynasem's own re-entry rule (tests/conftest.py's no_reentry is off here).
pytestmark = pytest.mark.reentry


def _stop_renewing(resource: str) -> None:
    """Heartbeats of ``resource`` stopped: not left renewing into the next tests."""
    for beat in heartbeat.scheduled():
        if getattr(beat.held, "resource", None) == resource:
            beat.stop()


def test_a_give_back_interrupted_as_its_adoption_returns_frees_the_key(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unique.give_back`` (a revoked task's key, an enqueue that could not be sent) frees
    a claim by adopting it and releasing the adoption: ``adopt(taken, wait=False).release()``.
    A KeyboardInterrupt (a signal handler's: a web worker's timeout, Ctrl-C, a soft time
    limit) landing after the adoption returned and before ``release()`` left the adopted
    hold renewed by its heartbeat as long as the process lived: the key held for nobody,
    every enqueue of it refused (the window ``unique.run`` had, fdace27). Modelled as
    raised right after ``adopt`` returned. Failed before its mend: the key still held."""
    real = unique.adopt

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt  # a signal's exception, the bytecode after the call

    resource = "rv38g:give-back-interrupted"
    carried = claim(resource, "task-1", queue_lease=30)
    monkeypatch.setattr(unique, "adopt", interrupted)
    with pytest.raises(KeyboardInterrupt):
        unique.give_back(carried)
    monkeypatch.undo()
    left = holds_on(resource)
    _stop_renewing(resource)
    assert left == [], "the key is held by an adoption nobody gives back"
    claim(resource, "task-2", queue_lease=30)  # free for the next enqueue


def _interrupted_as_it_returns(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``unique.<name>`` raises a KeyboardInterrupt right after it returned: a signal's
    exception at the bytecode after the call."""
    real = getattr(unique, name)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(unique, name, interrupted)


def test_a_celery_enqueue_interrupted_as_its_claim_returns_gives_the_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``UniqueTask._send``: d4b493c put everything after the claim inside the ``try`` that
    withdraws it, but the claim itself (``unique.claim_for``, a call) returns before that
    ``try``. A KeyboardInterrupt (a signal handler's: a web worker's timeout, Ctrl-C) landing
    as it returns left the key claimed by a task never enqueued, every enqueue of it refused
    for the queue lease (600 s by default). Modelled as raised right after ``claim_for``
    returned. Failed before its mend: the key still claimed."""
    celery = pytest.importorskip("celery")
    from dynasem.celery import UniqueTask

    app = celery.Celery("rv38g-unique", broker="memory://")

    @app.task(base=UniqueTask, name="rv38g.reindex", unique_key="rv38g:reindex:{n}")
    def reindex(n: int) -> None:
        pass

    _interrupted_as_it_returns(monkeypatch, "claim_for")
    with pytest.raises(KeyboardInterrupt):
        reindex.delay(1)
    monkeypatch.undo()
    assert holds_on("rv38g:reindex:1") == [], "claimed by a task that was never enqueued"


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
def test_a_tasks_enqueue_interrupted_as_its_claim_returns_gives_the_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dynasem.django_tasks``' ``UniqueTask.enqueue``: the claim (``_claim`` ->
    ``unique.claim_for``) was made before the ``try`` that withdraws it when the backend
    cannot store the task. A KeyboardInterrupt (a signal handler's: a web worker's timeout)
    landing as it returned left the key claimed by a task never enqueued, every enqueue of
    it refused for the queue lease. Modelled as raised right after ``claim_for`` returned.
    Failed before its mend: the key still claimed."""
    from tests.support import unique_tasks

    _interrupted_as_it_returns(monkeypatch, "claim_for")
    with pytest.raises(KeyboardInterrupt):
        unique_tasks.plain.enqueue("rv38g")
    monkeypatch.undo()
    assert holds_on("unique-plain:rv38g") == [], "claimed by a task that was never enqueued"
    assert unique_tasks.plain.enqueue("rv38g").status == "SUCCESSFUL"  # free for the next


def test_a_next_run_interrupted_as_its_turn_comes_withdraws_its_registration(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``coalescing.acquire``: 0c9aedb guards the registration from its write to the end of
    the wait for the next run's turn, but ``registration.stop()`` came after that ``try``.
    A KeyboardInterrupt (a signal handler's) landing as the turn came (the hold handed to
    us, given back by the block's entry guard) and before that call left the registration
    renewed by its heartbeat as long as the process lived, for a run that never ran: a
    renewal write every third of the lease, for nothing, until another caller replaced it.
    Modelled as raised as ``stop()`` begins (once). Failed before its mend: its heartbeat
    still scheduled."""
    resource = "rv38g:next-run-turn"
    started, go = threading.Event(), threading.Event()

    def holder() -> None:
        with held_elsewhere(resource):
            started.set()
            go.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    started.wait(10)
    real, calls = Registration.stop, []

    def interrupted(self: Registration) -> None:
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt  # a signal's exception, as the turn came
        real(self)

    monkeypatch.setattr(Registration, "stop", interrupted)
    threading.Timer(0.5, go.set).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with semaphore(resource, coalesce=True, wait=10, lease=2):
                pytest.fail("the block must not run")
    finally:
        go.set()
        thread.join(10)
    monkeypatch.undo()
    orphans = [hb for hb in heartbeat.scheduled() if isinstance(hb.held, Registration)]
    for hb in orphans:  # not left renewing into the next tests of this worker
        hb.stop()
    assert orphans == [], "a registration renewed for a run that never ran"
    assert holds_on(resource) == []


def test_a_unique_run_interrupted_as_it_enters_leaves_no_block_open_here(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unique.running``: the run's block was opened (``opened``), then the hold remembered
    and the run recorded, before the ``try`` whose ``finally`` closes it. A KeyboardInterrupt
    (a signal handler's: Celery's soft time limit) landing in between ended the run (fdace27
    gives its key back) but left its block open in this thread's context: a worker runs its
    next tasks in that thread and context, where ``current_hold()`` outside any block gave
    the released hold, its fence a stale run's, instead of LookupError. Modelled as raised
    as the hold is remembered. Failed before its mend: ``current_hold()`` answered."""
    from dynasem import current_hold

    real, calls = unique.remember_acquired, []

    def interrupted(held: Any) -> None:
        calls.append(held)
        raise KeyboardInterrupt  # a signal's exception, as the hold is remembered

    resource = "rv38g:running-interrupted"
    carried = claim(resource, "task-1", queue_lease=30)
    options = types.SimpleNamespace(run_lease=5, queue_lease=30)
    monkeypatch.setattr(unique, "remember_acquired", interrupted)
    with pytest.raises(KeyboardInterrupt):
        unique.run("rv38g.task", options, carried, lambda: pytest.fail("must not run"))
    monkeypatch.setattr(unique, "remember_acquired", real)
    _stop_renewing(resource)
    assert calls and calls[0].released and holds_on(resource) == []
    with pytest.raises(LookupError):
        current_hold()  # no block of a run that ended is this thread's
