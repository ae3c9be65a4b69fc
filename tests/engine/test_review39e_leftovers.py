"""Review 39e: leftovers the last review noted, in a hold's life.

Leases here are 1.5 s with CLOCK_SKEW 0.5 s (the test settings): a holder trusts its hold
1.0 s from the send of its last write; others take over 0.5 s after the stored end.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem._engine.hold import stop_renewing
from dynasem._storage import lock_rows, permit_items, reader_items
from dynasem.testing import abandon
from tests.engine.test_heartbeat import tokens_on, unique, wait_for_renewal
from tests.support.helpers import break_holds

pytestmark = pytest.mark.django_db(transaction=False)


def slowed_writes(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every row write answered ``seconds`` late (a slow network, botocore's retries)."""
    real_update = lock_rows.update

    def slow_update(action: dict[str, Any], **kwargs: Any) -> Any:
        time.sleep(seconds)
        return real_update(action, **kwargs)

    monkeypatch.setattr(lock_rows, "update", slow_update)


def test_a_renewal_answered_past_its_trust_gives_the_row_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, requests_sent: Any
) -> None:
    """``held.renew()`` answered past the trust it gives raises ``LockLost``: the caller is
    told the hold is over. Its write was applied, though: the row named us for a whole
    lease from the send, and every other caller waited that lease out for nobody (a caller
    of ``acquire()`` told its hold is lost has nothing left to release). The row is given
    back as the loss is raised, under our token's condition; a ``release()`` after it still
    raises ``LockLost`` and sends nothing more."""
    resource = unique("late-renewal-given-back")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)  # the caller's own renewal only
    try:
        slowed_writes(monkeypatch, 1.2)  # past the trust it gives (1.0 s from its send)
        with pytest.raises(LockLost):
            held.renew()
        monkeypatch.undo()
        assert tokens_on(resource) == set(), "the lost hold's row still names it"
        other = semaphore(resource, wait=0).acquire()  # at once, not a lease later
        other.release()
        requests_sent.reset()
        with pytest.raises(LockLost):
            held.release()
        assert requests_sent.total == 0
    finally:
        monkeypatch.undo()
        abandon(held)


@pytest.mark.parametrize("kind", [{"limit": 9}, {"shared": True}], ids=["permit", "reader_item"])
def test_a_late_renewal_of_a_hold_in_an_item_gives_the_item_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, kind: dict[str, Any]
) -> None:
    """The same for a hold kept in an item of its own: a permit (a counting semaphore of more
    than 8), a reader behind the row's first two."""
    resource = unique("late-renewal-item")
    others = [semaphore(resource, **kind).acquire() for _ in range(2 if "shared" in kind else 0)]
    held = semaphore(resource, lease=1.5, **kind).acquire()
    stop_renewing(held)
    try:
        slowed_writes(monkeypatch, 1.2)
        for module in (permit_items, reader_items):
            real_send = module.send
            monkeypatch.setattr(
                module,
                "send",
                lambda *a, _send=real_send, **k: (time.sleep(1.2), _send(*a, **k))[1],
            )
        with pytest.raises(LockLost):
            held.renew()
        monkeypatch.undo()
        assert held.token not in tokens_on(resource)
        with pytest.raises(LockLost):
            held.release()
    finally:
        monkeypatch.undo()
        abandon(held)
        for other in others:
            other.release()


def test_the_heartbeats_late_renewal_leaves_the_row_to_the_block(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat's own renewal answered past the trust: the block that holds is still
    running and knows nothing yet (a lead's command is still being stopped), so the row
    stays named for its lease; the block's end gives it back."""
    resource = unique("late-heartbeat")
    held = semaphore(resource, lease=1.5).acquire()
    try:
        wait_for_renewal(held)
        slowed_writes(monkeypatch, 1.2)
        deadline = time.monotonic() + 5
        while not held.lost:
            assert time.monotonic() < deadline, "the late renewal was not declared a loss"
            time.sleep(0.02)
        time.sleep(1.3)  # the late renewal's answer has come
        monkeypatch.undo()
        assert tokens_on(resource) == {held.token}
        with pytest.raises(LockLost):
            held.release()
        assert tokens_on(resource) == set()
    finally:
        monkeypatch.undo()
        abandon(held)


def test_a_renewal_refused_gives_back_nobody_elses_hold(lock_table: str) -> None:
    """Broken by an operator and taken by another: the renewal's ``LockLost`` frees nothing
    of the new holder's."""
    resource = unique("broken-then-taken")
    held = semaphore(resource, lease=1.5).acquire()
    stop_renewing(held)
    break_holds(resource, held.token)
    other = semaphore(resource, wait=0).acquire()
    try:
        with pytest.raises(LockLost):
            held.renew()
        assert tokens_on(resource) == {other.token}
    finally:
        abandon(held)
        other.release()
