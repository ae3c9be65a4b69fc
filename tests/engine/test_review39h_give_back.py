"""Review 39h: the give-back of a ``renew()`` that raises ``LockLost`` (6b22957), beside a
release of the same hold from another thread.

Leases here are 1.5 s with CLOCK_SKEW 0.5 s (the test settings): a holder trusts its hold
1.0 s from the send of its last write; others take over 0.5 s after the stored end.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem._engine.hold import stop_renewing
from dynasem._storage import lock_rows
from dynasem.signals import lock_released
from dynasem.testing import abandon
from tests.engine.test_heartbeat import tokens_on, unique
from tests.support.helpers import break_holds

pytestmark = pytest.mark.django_db(transaction=False)


def slowed_renewals(monkeypatch: pytest.MonkeyPatch, seconds: float, sent: threading.Event) -> None:
    """The renewal's write answered ``seconds`` late (``sent`` set as it goes out); other
    writes (the give-back) as they are."""
    real_update = lock_rows.update

    def slow_update(action: dict[str, Any], **kwargs: Any) -> Any:
        renewal = action["UpdateExpression"].startswith("SET #h.#t.#e = :e")
        renewal = renewal and not sent.is_set()
        if renewal:
            sent.set()
        answer = real_update(action, **kwargs)
        if renewal:
            time.sleep(seconds)
        return answer

    monkeypatch.setattr(lock_rows, "update", slow_update)


def released_in_thread(held: Any, raised: list[BaseException | None]) -> threading.Thread:
    def release() -> None:
        try:
            held.release()
            raised.append(None)
        except BaseException as exc:  # kept for the test
            raised.append(exc)

    return threading.Thread(target=release, name="releasing")


def test_a_release_beside_a_late_renewal_still_raises_lock_lost(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block ends (its release, in one thread) past the hold's deadline, while a
    ``renew()`` of another thread is in flight and is answered past its trust. The renew()
    gave the row back as it raised; the release, waiting on the hold's lock meanwhile, then
    found it ended and returned quietly: the block's exit said nothing of the loss, so a
    transaction around its work committed though another holder may have worked beside it."""
    resource = unique("late-renewal-beside-release")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)  # the caller's own renewal only
    sent = threading.Event()
    renew_raised: list[BaseException] = []
    release_raised: list[BaseException | None] = []

    def renew() -> None:
        try:
            held.renew()
        except LockLost as exc:
            renew_raised.append(exc)

    try:
        slowed_renewals(monkeypatch, 1.3, sent)  # answered past the deadline (1.0 s)
        renewer = threading.Thread(target=renew, name="renewing")
        renewer.start()
        assert sent.wait(5)
        time.sleep(1.1)  # past the deadline, the renewal still in flight
        releaser = released_in_thread(held, release_raised)
        releaser.start()
        renewer.join(5)
        releaser.join(5)
        monkeypatch.undo()
        assert [type(e) for e in renew_raised] == [LockLost]
        assert [type(e) for e in release_raised] == [LockLost], "the block's end hid the loss"
        assert tokens_on(resource) == set()
    finally:
        monkeypatch.undo()
        abandon(held)


class LateFor:
    """A hold's lock that the thread named ``name`` takes only ``seconds`` after asking."""

    def __init__(self, lock: Any, name: str, seconds: float) -> None:
        self.lock, self.name, self.seconds = lock, name, seconds

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        if threading.current_thread().name == self.name:
            time.sleep(self.seconds)
        return bool(self.lock.acquire(*args, **kwargs))

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_renew_beside_a_release_in_time_leaves_the_give_back_to_it(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block ends in time while a renewal is in flight; a ``renew()`` of another thread,
    waiting on the hold's lock before the release began, gets it first, is told the hold is
    being released (``LockLost``) and gave the row back itself: the release then found
    nothing to do, and ``lock_released`` was never sent (a receiver's ledger kept the lock
    held for good)."""
    resource = unique("renew-beside-release")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)
    released: list[str] = []

    def heard(sender: Any, token: str | None = None, **kwargs: Any) -> None:
        if token == held.token:
            released.append(token)

    def renew() -> None:
        try:
            held.renew()
        except LockLost as exc:
            renew_raised.append(exc)

    lock_released.connect(heard, weak=False)
    sent = threading.Event()
    renew_raised: list[BaseException] = []
    release_raised: list[BaseException | None] = []
    try:
        slowed_renewals(monkeypatch, 0.5, sent)  # answered in time
        first = threading.Thread(target=held.renew, name="renewing")
        first.start()
        assert sent.wait(5)
        second = threading.Thread(target=renew, name="renewing-too")
        second.start()
        time.sleep(0.1)  # waits for the hold's lock
        monkeypatch.setattr(held, "_lock", LateFor(held._lock, "releasing", 0.6))
        releaser = released_in_thread(held, release_raised)
        releaser.start()  # begun in time, it waits for the renewal in flight
        for thread in (first, second, releaser):
            thread.join(5)
        monkeypatch.undo()
        assert [type(e) for e in renew_raised] == [LockLost]
        assert release_raised == [None]
        assert tokens_on(resource) == set()
        assert released == [held.token], "the release was never announced"
    finally:
        lock_released.disconnect(heard)
        monkeypatch.undo()
        abandon(held)


def test_a_renew_told_of_the_loss_behind_the_heartbeats_late_renewal_gives_the_row_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``renew()`` that raises ``LockLost`` because the deadline passed gives the row back
    (failures.md), so that a caller of ``acquire()`` told of the loss leaves nothing named for
    a lease. Called while the heartbeat's renewal was in flight, it raised from its wait for
    the hold's lock, before the try that gives back; the heartbeat's renewal, answered past
    its trust, left the row to the block's end: the row named nobody's hold for a whole lease
    from that renewal's send."""
    resource = unique("renew-behind-heartbeat")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)
    sent = threading.Event()
    beat_raised: list[BaseException] = []

    def beat() -> None:  # the heartbeat's renewal
        try:
            held._renew_in_background()
        except LockLost as exc:
            beat_raised.append(exc)

    try:
        slowed_renewals(monkeypatch, 1.3, sent)  # answered past the deadline (1.0 s)
        heartbeat = threading.Thread(target=beat, name="dynasem-heartbeat")
        heartbeat.start()
        assert sent.wait(5)
        time.sleep(1.1)  # past the deadline, the heartbeat's renewal in flight
        with pytest.raises(LockLost):
            held.renew()
        heartbeat.join(5)
        monkeypatch.undo()
        assert [type(e) for e in beat_raised] == [LockLost]
        assert tokens_on(resource) == set(), "the lost hold's row still names it"
        with pytest.raises(LockLost):
            held.release()
    finally:
        monkeypatch.undo()
        abandon(held)


def test_a_renewal_refused_on_one_row_gives_back_the_rows_still_ours(lock_table: str) -> None:
    """A hold of two resources; an operator breaks its hold on the second. ``renew()``
    renews the first row (a whole lease from now), is refused on the second and raises
    ``LockLost``; a caller of ``acquire()`` told of the loss has nothing left to release
    (6b22957), yet the give-back was skipped for the whole hold once one write was refused:
    the first row named nobody's hold for the lease just renewed. The second, taken by
    another since, stays that holder's."""
    first, second = unique("ours-still"), unique("broken")
    held = semaphore([first, second], lease=1.5).acquire()
    stop_renewing(held)
    break_holds(second, held.token)
    taker = semaphore(second, wait=0).acquire()
    try:
        with pytest.raises(LockLost):
            held.renew()
        assert tokens_on(second) == {taker.token}, "the new holder's row was given back"
        assert tokens_on(first) == set(), "the row still ours was left to its lease"
        other = semaphore(first, wait=0).acquire()  # at once, not a lease later
        other.release()
    finally:
        abandon(held)
        taker.release()
