"""Background work under review (eighth review, helper d): unique tasks, run_once,
coalescing, leadership. Each test says in its docstring what it shows and whether it failed
before its mend."""

from __future__ import annotations

import types
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.db import transaction

from dynasem import Coalesced, SemaphoreBusy, run_once, semaphore
from dynasem._background import unique
from dynasem._background.unique import Claim, Taken, claim
from dynasem._engine import heartbeat
from dynasem._engine.coalescing import Registration
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows, records
from dynasem.testing import held_elsewhere

# dynasem's own re-entry rule (tests/conftest.py's no_reentry is off here).
pytestmark = pytest.mark.reentry


@pytest.mark.django_db(transaction=True)
def test_a_claim_in_a_transaction_does_not_take_the_hold_waiting_for_its_commit(
    lock_table: str,
) -> None:
    """A ``with semaphore(key)`` block that ends inside ``transaction.atomic`` keeps its hold,
    renewed, until the commit; a unique task of the same key enqueued after it in that
    transaction must be refused like any other enqueue of a held key (the docs: a claim is
    "never a re-entry of a hold the enqueuing thread has"). ``claim`` runs its acquire in a
    fresh context, which keeps it from re-entering an open block, but the hold waiting for
    the commit is found by the thread's transaction (``reentry.pending_hold``), not by the
    context: the claim *was* the transaction's hold, its heartbeat stopped, and the worker's
    adoption replaced it while the transaction's work was still to commit (two runs of the
    key's work at once; the commit's give-back then refused)."""
    key = "rv38d:pending"
    with transaction.atomic():
        with semaphore(key, lease=5) as held:
            User.objects.create(username="rv38d-pending")
        with pytest.raises(Taken):
            claim(key, "task-1", queue_lease=30)
        assert not held.released and held._heartbeat is not None  # renewed until the commit
        (hold,) = holds_on(key)
        assert hold.token == held.token
    assert holds_on(key) == []


def _job_row(key: str) -> dict[str, Any]:
    return lock_rows.get_item(key, records.JOB_SK) or {}


class Rollback(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_an_async_run_once_run_by_async_to_sync_inside_atomic_is_done_after_the_commit(
    lock_table: str,
) -> None:
    """``async with run_once(key)`` in code a sync view calls through ``async_to_sync`` inside
    ``transaction.atomic`` (ATOMIC_REQUESTS): the body's ORM work (``sync_to_async``) runs on
    the view's thread, in its transaction. The API: "The same holds for run_once's DONE":
    written after the commit, FAILED on a rollback. An ``async with semaphore()`` block
    follows that transaction (``steps.release_to_end``); ``RunOnce.__aexit__`` ran its end in
    dynasem's executor, in no transaction: DONE at once, and on the rollback the job stayed
    DONE with its work undone, never run again."""
    key = "rv38d:async-job"

    async def job_body() -> None:
        async with run_once(key):
            await sync_to_async(User.objects.create)(username="rv38d-async-job")

    with pytest.raises(Rollback), transaction.atomic():
        async_to_sync(job_body)()
        assert _job_row(key).get("status") == records.RUNNING, "DONE before the commit"
        raise Rollback
    assert not User.objects.filter(username="rv38d-async-job").exists()
    assert _job_row(key).get("status") == records.FAILED

    with transaction.atomic():
        async_to_sync(job_body)()
        assert _job_row(key).get("status") == records.RUNNING, "DONE before the commit"
    assert _job_row(key).get("status") == records.DONE


def test_a_next_run_interrupted_as_its_heartbeat_starts_is_withdrawn(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hole in the mend of ``tests/engine/test_coalesce_interrupted.py``: ``register()``
    hands the registration to ``acquire()``'s guard (``made.append``) only after
    ``Registration.__init__`` has started its heartbeat. A KeyboardInterrupt (a signal
    handler's, or a task's soft time limit) landing in between left it renewed for as long
    as the process lives, with nobody to run: every busy caller is answered Coalesced and
    its work never runs. Modelled as raised right after the heartbeat was started."""
    start = heartbeat.Heartbeat.start

    def interrupted(self: heartbeat.Heartbeat) -> None:
        start(self)
        if isinstance(self.held, Registration):
            raise KeyboardInterrupt  # a signal's exception, the bytecode after the call

    resource = "rv38d:rebuild-interrupted"
    with held_elsewhere(resource):
        monkeypatch.setattr(heartbeat.Heartbeat, "start", interrupted)
        with pytest.raises(KeyboardInterrupt):
            with semaphore(resource, coalesce=True, wait=30, lease=2):
                pytest.fail("the block must not run")
        monkeypatch.setattr(heartbeat.Heartbeat, "start", start)
        orphans = [hb for hb in heartbeat.scheduled() if isinstance(hb.held, Registration)]
        for hb in orphans:  # not left renewing into the next tests of this worker
            hb.stop()
        assert orphans == [], "a registration renewed for nobody"
        # The next busy caller is the next run (its short wait runs out), not coalesced.
        with pytest.raises(SemaphoreBusy) as caught:
            with semaphore(resource, coalesce=True, wait=0.3):
                pass
        assert not isinstance(caught.value, Coalesced)


def test_a_unique_run_interrupted_as_its_adoption_returns_gives_its_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unique.run``: ``held = start_run(...)`` comes before the ``try`` whose ``finally``
    ends the run. A KeyboardInterrupt (a signal handler's; Celery's soft time limit,
    ``SoftTimeLimitExceeded``, raised the same way) landing after the adoption returned and
    before that ``try`` left the adopted hold renewed by its heartbeat as long as the worker
    lived, with no run: the key claimed for nobody, every enqueue of it refused. Modelled
    as raised right after ``start_run`` returned (as the coalesced run's in
    ``tests/engine/test_coalesce_interrupted.py``)."""
    real = unique.start_run

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt  # a signal's exception, the bytecode after the call

    resource = "rv38d:unique-interrupted"
    carried = claim(resource, "task-1", queue_lease=30)
    options = types.SimpleNamespace(run_lease=5, queue_lease=30)
    monkeypatch.setattr(unique, "start_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        unique.run("rv38d.task", options, carried, lambda: pytest.fail("must not run"))
    monkeypatch.setattr(unique, "start_run", real)
    left = holds_on(resource)
    for beat in heartbeat.scheduled():  # not left renewing into the next tests of this worker
        if getattr(beat.held, "resource", None) == resource:
            beat.stop()
    assert left == [], "the key is held by a run nobody makes"
    claim(resource, "task-2", queue_lease=30)  # free for the next enqueue


def test_a_celery_enqueue_interrupted_after_its_claim_gives_the_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``UniqueTask._send``: the claim taken, its header was made (``claimed.header()``:
    ``dataclasses.asdict``, a few calls) before the ``try`` that withdraws the claim when
    the message cannot be sent. A KeyboardInterrupt there (a signal handler's: a web
    worker's timeout, Ctrl-C) left the key claimed by a task never enqueued, every enqueue
    of it refused for the queue lease (600 s by default). Modelled as raised as the header
    is made."""
    celery = pytest.importorskip("celery")
    from dynasem.celery import UniqueTask

    app = celery.Celery("rv38d-unique", broker="memory://")

    @app.task(base=UniqueTask, name="rv38d.reindex", unique_key="rv38d:reindex:{n}")
    def reindex(n: int) -> None:
        pass

    def interrupted(self: Claim) -> Any:
        raise KeyboardInterrupt  # a signal's exception as the header is made

    monkeypatch.setattr(Claim, "header", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reindex.delay(1)
    monkeypatch.undo()
    assert holds_on("rv38d:reindex:1") == [], "claimed by a task that was never enqueued"


def test_a_lead_interrupted_as_its_block_is_entered_is_given_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Leadership.__enter__``: ``semaphore.acquire()`` guards the hold only until it
    returns (``hold.delivering``); the ``Lead`` was then made (its events, its lock, its
    ``when_lost`` watcher) and the block entered outside any guard. A KeyboardInterrupt (a
    signal handler's) landing there left the lead renewed by its heartbeat as long as the
    process lived, with no block to give it back: a leadership never given up, every other
    contender waiting for ever (``wait=math.inf``). A ``semaphore()`` block's entry is
    guarded whole (``delivering(lambda: opened(block, self.acquire()))``). Modelled as
    raised as the lead listens for its loss."""
    from dynasem import leadership
    from dynasem._background import leadership as leadership_module

    def interrupted(held: Any, told: Any) -> None:
        raise KeyboardInterrupt  # a signal's exception, in Lead.__init__

    monkeypatch.setattr(leadership_module, "when_lost", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with leadership("rv38d-beat", lease=5):
            pytest.fail("the block must not run")
    monkeypatch.undo()
    left = holds_on("leader:rv38d-beat")
    for beat in heartbeat.scheduled():  # not left renewing into the next tests of this worker
        if getattr(beat.held, "resource", None) == "leader:rv38d-beat":
            beat.stop()
    assert left == [], "a lead renewed for nobody"
