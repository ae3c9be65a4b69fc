"""Review 39k: the give-back of a ``renew()`` that raises ``LockLost`` (6b22957) behind the
heartbeat's renewal in flight (313a889), when that renewal ends otherwise than in a loss.

Leases here are 1.5 s with CLOCK_SKEW 0.5 s (the test settings): a holder trusts its hold
1.0 s from the send of its last write; others take over 0.5 s after the stored end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from dynasem import LockLost, SemaphoreUnavailable, semaphore
from dynasem._engine.hold import stop_renewing
from dynasem._storage import lock_rows
from dynasem.signals import lock_lost
from dynasem.testing import abandon
from tests.engine.test_heartbeat import tokens_on, unique

pytestmark = pytest.mark.django_db(transaction=False)


def renewal_applied_answer_lost(
    monkeypatch: pytest.MonkeyPatch, seconds: float, sent: threading.Event
) -> None:
    """The renewal's write applied, its answer lost ``seconds`` later (a read timeout:
    SemaphoreUnavailable, ambiguous); other writes (the give-back) as they are."""
    real_update = lock_rows.update

    def update(action: dict[str, Any], **kwargs: Any) -> Any:
        renewal = action["UpdateExpression"].startswith("SET #h.#t.#e = :e")
        if not renewal or sent.is_set():
            return real_update(action, **kwargs)
        sent.set()
        real_update(action, **kwargs)
        time.sleep(seconds)
        raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)

    monkeypatch.setattr(lock_rows, "update", update)


def test_a_renew_told_of_the_loss_behind_a_renewal_whose_answer_is_lost_gives_the_row_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``renew()`` waits for the heartbeat's renewal in flight, and raises ``LockLost`` as
    the deadline passes: it asks that renewal to give the row back (313a889), so that a caller
    of ``acquire()`` told of the loss leaves nothing named for a lease. That renewal, applied
    (a whole lease from its send), fails with its answer lost: only a loss it found gave the
    row back, and the row named nobody's hold for a whole lease."""
    resource = unique("renew-behind-lost-answer")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)
    sent = threading.Event()
    beat_raised: list[BaseException] = []

    def beat() -> None:  # the heartbeat's renewal
        try:
            held._renew_in_background()
        except Exception as exc:  # kept for the test
            beat_raised.append(exc)

    try:
        renewal_applied_answer_lost(monkeypatch, 1.3, sent)  # past the deadline (1.0 s)
        heartbeat = threading.Thread(target=beat, name="dynasem-heartbeat")
        heartbeat.start()
        assert sent.wait(5)
        time.sleep(1.1)  # past the deadline, the heartbeat's renewal in flight
        with pytest.raises(LockLost):
            held.renew()
        heartbeat.join(5)
        monkeypatch.undo()
        assert len(beat_raised) == 1
        assert tokens_on(resource) == set(), "the lost hold's row still names it"
        with pytest.raises(LockLost):
            held.release()
    finally:
        monkeypatch.undo()
        abandon(held)


def test_a_renew_told_of_the_loss_by_a_slow_receiver_still_has_the_row_given_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``renew()`` waiting for the heartbeat's renewal in flight finds the deadline passed:
    it marks the hold lost and sends ``lock_lost`` (a project's receiver: a log shipper, a
    metric) before it asks that renewal to give the row back. The renewal, answered past its
    trust meanwhile, found the hold lost before the ask, and left the row: it named a hold
    whose caller was told it was lost, for a whole lease from that renewal's send."""
    from tests.engine.test_review39h_give_back import slowed_renewals

    resource = unique("renew-behind-heartbeat-slow-receiver")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)
    sent = threading.Event()
    heartbeat = threading.Thread(target=lambda: None)

    def beat() -> None:  # the heartbeat's renewal
        with contextlib.suppress(LockLost):
            held._renew_in_background()

    def slow_receiver(**kwargs: Any) -> None:
        if threading.current_thread() is not heartbeat:
            heartbeat.join(5)  # the receiver takes its time: the renewal ends meanwhile

    lock_lost.connect(slow_receiver, dispatch_uid="review39k-slow")
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
        assert tokens_on(resource) == set(), "the lost hold's row still names it"
    finally:
        lock_lost.disconnect(dispatch_uid="review39k-slow")
        monkeypatch.undo()
        abandon(held)
