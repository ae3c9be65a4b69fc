"""Review of waiting in line (dynasem._engine.queue, core.Acquire.wait): a waiter that gives up
must leave nothing in the line that a releasing holder hands the lock to."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from typing import Any

import pytest
from django.test import override_settings

from dynasem import SemaphoreBusy, SemaphoreUnavailable, semaphore
from dynasem import _clock as clock
from dynasem._engine import hold
from dynasem._engine import push as wakeup
from dynasem._storage import lock_rows, queue_entries, records
from tests.engine.test_processes import identity_of
from tests.support.helpers import dynasem_settings, enqueue_entry, queue_of

LEAVER_LEASE = 30


@pytest.mark.parametrize("how", ["throttled_past_deadline", "refused"])
def test_a_waiter_whose_look_fails_leaves_the_line(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A queued waiter's look at the row fails: throttled still after botocore's retries,
    its answer coming after the wait's deadline (patient_read then raises), or refused for
    good. The acquire raises SemaphoreUnavailable, but its place in line (its entry, or the
    word it told the holder) stays: the holder's release hands the lock to it, and nobody
    uses that hold for the leaver's whole lease (its process is alive: no takeover)."""
    resource = f"rq:look:{how}"
    holder = semaphore(resource, lease=30, user="holder").acquire()
    get = lock_rows.get
    out: dict[str, Any] = {}
    started = time.monotonic()

    def failing_get(resource_: str, *args: Any, **kwargs: Any) -> Any:
        mine = threading.current_thread().name == "leaver" and kwargs.get("consistent") is False
        if mine and time.monotonic() > started + 0.5:  # its entry is put (ENTRY_DEFER)
            if how == "throttled_past_deadline":
                time.sleep(started + 1.2 - time.monotonic())  # retries, past the 1 s wait
                raise SemaphoreUnavailable("throttled", transient=True)
            raise SemaphoreUnavailable("AccessDenied")
        return get(resource_, *args, **kwargs)

    monkeypatch.setattr(lock_rows, "get", failing_get)

    def leave() -> None:
        try:
            semaphore(resource, fair=True, wait=1.0, lease=LEAVER_LEASE, user="leaver").acquire()
            out["leaver"] = "acquired"
        except Exception as exc:
            out["leaver"] = exc

    started = time.monotonic()
    leaver = threading.Thread(target=leave, name="leaver")
    leaver.start()
    leaver.join(10)
    assert isinstance(out.get("leaver"), SemaphoreUnavailable), out
    holder.release()
    # The lock is free: nobody else is in line. A newcomer gets it at once.
    try:
        held = semaphore(resource, wait=3, user="next").acquire()
    except SemaphoreBusy as busy:
        pytest.fail(f"the lock was handed to the waiter that failed and left: {busy!r}")
    held.release()


def test_ctrl_c_right_after_telling_the_holder_leaves_no_word_behind(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter that told the holder it queued (hold.queued_behind: its entry deferred,
    queue.ENTRY_DEFER) is interrupted (Ctrl-C, a Celery soft time limit) before its next
    step: the last step it yielded, the ticket's draw, knows no entry to leave, so nothing
    leaves the line. The holder's word of it stays in the line it hands on (second in line:
    not the first-in-line word that ``Held._forget_heir_gone`` drops), and the lock is handed
    to the waiter that is gone, held for nobody for its whole lease."""
    resource = "rq:word"
    holder = semaphore(resource, lease=30, user="holder").acquire()
    out: dict[str, Any] = {}
    told = hold.queued_behind

    def queued_behind(row: Any, waiter: Any) -> bool:
        heard = told(row, waiter)
        if heard and threading.current_thread().name == "gone":
            raise KeyboardInterrupt  # right after the word, before the wait's first step
        return heard

    monkeypatch.setattr(hold, "queued_behind", queued_behind)

    def first() -> None:
        try:
            sem = semaphore(resource, fair=True, wait=15, lease=30, user="first")
            sem.acquire().release()  # handed the lock, it hands it on at once
            out["first"] = "acquired"
        except BaseException as exc:
            out["first"] = exc

    def gone() -> None:
        try:
            semaphore(resource, fair=True, wait=15, lease=LEAVER_LEASE, user="gone").acquire()
            out["gone"] = "acquired"
        except BaseException as exc:
            out["gone"] = exc

    one = threading.Thread(target=first, name="first")
    one.start()
    deadline = time.monotonic() + 5
    while "first" not in {w.user_id for w in queue_of(resource).values()}:  # its entry is put
        assert time.monotonic() < deadline, "the first waiter never queued"
        time.sleep(0.02)
    two = threading.Thread(target=gone, name="gone")
    two.start()
    two.join(10)
    assert isinstance(out.get("gone"), KeyboardInterrupt), out
    holder.release()
    one.join(20)
    assert out.get("first") == "acquired", out
    try:
        held = semaphore(resource, wait=3, user="next").acquire()
    except SemaphoreBusy as busy:
        pytest.fail(f"the lock was handed to the waiter that was interrupted: {busy!r}")
    held.release()


def test_a_leaver_whose_drop_is_throttled_is_not_handed_the_lock_later(
    dynamodb_local: str, lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter whose wait ran out leaves the line: it marks its entry dead (one write), then
    reads the row. That write throttled still after botocore's retries (the resource's key
    is hot: a crowd waits on it), its entry stays live for the rest of its lease; only one
    late look, LATE_LOOK (2 s) on, watches for a hand-over to it. Pushes do not reach it
    (off here; or a releaser on another host and a loopback PUSH): a release a little later
    hands the lock to that entry, and it is held for nobody for the leaver's whole lease."""
    monkeypatch.setattr(wakeup, "LATE_LOOK", 0.5)  # (the same with 2 s: a shorter test)
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH=None)):
        resource = "rq:drop"
        holder = semaphore(resource, lease=30, user="holder").acquire()
        drop = queue_entries.drop_entry
        out: dict[str, Any] = {}

        def throttled_drop(*args: Any) -> None:
            if threading.current_thread().name == "leaver":
                raise SemaphoreUnavailable("throttled", transient=True)
            drop(*args)

        monkeypatch.setattr(queue_entries, "drop_entry", throttled_drop)

        def leave() -> None:
            try:
                sem = semaphore(resource, fair=True, wait=1, lease=LEAVER_LEASE, user="leaver")
                sem.acquire()
                out["leaver"] = "acquired"
            except Exception as exc:
                out["leaver"] = exc

        leaver = threading.Thread(target=leave, name="leaver")
        leaver.start()
        leaver.join(10)
        assert isinstance(out.get("leaver"), SemaphoreBusy), out
        time.sleep(1.0)  # past its late look
        holder.release()
        try:
            held = semaphore(resource, wait=3, user="next").acquire()
        except SemaphoreBusy as busy:
            pytest.fail(f"the lock was handed to the waiter that had left: {busy!r}")
        held.release()


def test_a_free_lock_found_by_a_refused_join_is_not_guessed_busy_again(
    lock_table: str, requests_sent: Any
) -> None:
    """After a process queued for a resource, its next acquires (GUESS_BUSY_FOR, 10 s) join
    the queue in their first write, refused if the lock is free (then they take it). A take
    at once is to end that guess ("taken at once: free, this time"), but the refused join
    counts as an enqueue (``pace.enqueued``), so the guess stays: every acquire of a free
    lock for the next 10 s pays a refused ticket write (1 WCU) before its take."""
    resource = "rq:guess"
    holder = semaphore(resource, lease=30).acquire()
    waiter = threading.Thread(target=lambda: semaphore(resource, wait=10).acquire().release())
    waiter.start()
    deadline = time.monotonic() + 5
    while lock_rows.get(resource).queue_in == 0:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    holder.release()
    waiter.join(10)
    semaphore(resource, wait=5).acquire().release()  # the guess: a refused join, the take
    requests_sent.reset()
    semaphore(resource, wait=5).acquire().release()  # free again: one take, one release
    assert requests_sent.calls["UpdateItem"] == 2, requests_sent.calls


def test_a_cancelled_waiters_renewal_in_flight_does_not_revive_its_entry(
    dynamodb_local: str, lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async waiter renews its entry (half its lease gone) in a request that a cancel does
    not wait for (``run_io``: it goes on in its thread). The cleanup marks the entry dead
    meanwhile, in another thread; the renewal, held up on its way (a throttled attempt and
    botocore's pause), lands after it: ``renew_waiter``'s condition is only that the entry
    exists, so it makes the dead entry live again for a whole lease. Any release meanwhile
    hands the lock to it; unpushed (pushes off here, or a releaser on another host) and
    later than the one late look, it is held for nobody for the leaver's lease."""
    monkeypatch.setattr(wakeup, "LATE_LOOK", 0.3)
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH=None)):
        resource = "rq:renew"
        holder = semaphore(resource, lease=30, user="holder").acquire()
        update = lock_rows.update
        renewing = threading.Event()

        def slow_renewal(action: dict[str, Any], **kwargs: Any) -> Any:
            if action.get("UpdateExpression") == "SET #e = :e, #exp = :exp":
                renewing.set()
                time.sleep(0.6)  # a throttled first attempt, botocore's pause
            return update(action, **kwargs)

        monkeypatch.setattr(lock_rows, "update", slow_renewal)

        async def leave() -> None:
            sem = semaphore(resource, fair=True, wait=20, lease=4, user="leaver")
            task = asyncio.ensure_future(sem.aacquire())
            while not renewing.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(leave())
        time.sleep(0.8)  # the renewal has landed, the late look is over
        live = {w.user_id for w in queue_of(resource).values()}
        holder.release()
        assert "leaver" not in live, "the cancelled waiter's entry is live again"


def test_a_free_lock_is_not_kept_from_its_taker_by_a_dead_waiter_of_this_host(
    lock_table: str,
) -> None:
    """The lock is free, and the first entry in line is a waiter's whose process was killed
    (SIGKILL, OOM) on this very host: provably dead, as a holder of this host is taken over
    at once when /proc shows its process ended. A waiter's entry is judged by its lease
    alone: the taker waits (or is told busy) until the dead waiter's lease (60 s here) and
    the skew are over, with the lock free all along. (Free with a live entry at the head:
    the holder's read of the line failed and it released plainly, or it died too.)"""
    proc = subprocess.Popen(["sleep", "60"])
    dead = identity_of(proc.pid)
    proc.kill()
    proc.wait()
    resource = "rq:deadwaiter"
    waiter = records.Waiter(
        ticket=0, expires_ms=clock.now_ms() + 60_000, user_id="dead", lease_ms=60_000, proc=dead
    )
    enqueue_entry(resource, "d" * 32, waiter)
    try:
        held = semaphore(resource, wait=2, user="next").acquire()
    except SemaphoreBusy as busy:
        pytest.fail(f"a waiter proven dead on this host keeps the free lock: {busy!r}")
    held.release()


def test_busy_behind_a_waiter_names_no_holder(lock_table: str) -> None:
    """Nobody holds the lock; a live waiter ahead (its turn not taken yet) keeps a newcomer
    out. ``SemaphoreBusy.holder_user_id`` is "the holder's recorded user", and its message
    says "held by": both named the waiter, which holds nothing."""
    resource = "rq:heldby"
    waiter = records.Waiter(ticket=0, expires_ms=clock.now_ms() + 30_000, user_id="waiting")
    enqueue_entry(resource, "w" * 32, waiter)
    with pytest.raises(SemaphoreBusy) as busy:
        semaphore(resource, wait=0, user="next").acquire()
    assert busy.value.holder_user_id is None, str(busy.value)
