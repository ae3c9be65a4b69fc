"""Paths of permits held in items that no test ran (review 39, helper g): an operator's break
whose answer was lost, a freed slot's hint given up, the bound on rows remembered."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem._engine import permit_hold
from dynasem._operators import locks
from dynasem._storage import dynamodb, lock_rows
from tests.engine.test_readers_lost import LoseAnswer
from tests.engine.test_trust_at_return import sk_of
from tests.support.faults import Faults
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)


def _break(body: dict[str, Any]) -> bool:
    """An operator's break of a permit (not a give-back: that sets ``lt``)."""
    return sk_of(body).startswith("s#") and "SET #bt = :tok" in body["UpdateExpression"]


def _hints(resource: str) -> tuple[int, ...]:
    row = lock_rows.get(resource)
    assert row is not None
    return row.hints


@pytest.mark.parametrize("quick", [True, False], ids=["quick client", "locks' client"])
def test_a_permits_break_applied_with_its_answer_lost_hints_its_slot(
    holds: list[Any], quick: bool
) -> None:
    """An operator's break of a permit, applied, its answer lost. On the quick client (every
    operator's page and command: one attempt) the break reads its own tombstone (its word);
    on the locks' client botocore sends it again, refused by it, known the same way. Either
    way the break is done: the slot is hinted (and the first waiter pushed), not left for a
    read of the permits once a lease is over."""
    take(holds, "pool", limit=9, lease=30)
    broken = take(holds, "pool", limit=9, lease=30)
    slot = broken.slots["pool"]
    assert slot not in _hints("pool")
    with LoseAnswer(_break) as lost:
        client = dynamodb.quick() if quick else contextlib.nullcontext()
        if quick:
            lost.client.meta.events.unregister(lost.event, lost._hook)
            lost.client = dynamodb.get_client(quick=True)
            lost.client.meta.events.register_first(lost.event, lost._hook)
        with client:
            assert locks.break_hold("pool", broken.token)
    assert lost.fired == 1
    assert slot in _hints("pool")
    with pytest.raises(LockLost):
        broken.renew()


def test_a_release_whose_hint_was_given_up_is_done(holds: list[Any]) -> None:
    """A permit given back, its slot's hint throttled past the release's patience: the
    release is done all the same (the slot is found by a read of the permits)."""
    held = semaphore("pool", limit=9, lease=30).acquire()
    with Faults(dynamodb.get_client()) as faults:
        faults.throttle("UpdateItem", 10_000, after=1)  # the give-back passes, the hint fails
        held.release()
        assert faults.fired
    assert held.slots["pool"] not in _hints("pool")
    assert not [p for p in locks.holds_on("pool")]
    semaphore("pool", limit=9, lease=30, wait=0).acquire().release()


def test_the_permit_rows_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process remembers at most MAX_REMEMBERED permit rows (then it starts again)."""
    from dynasem._storage import records

    monkeypatch.setattr(permit_hold, "MAX_REMEMBERED", 3)
    monkeypatch.setattr(permit_hold, "rows", {})
    for n in range(7):
        permit_hold.remember(records.LockItem(resource=f"pool:{n}", slots_used=1))
        assert len(permit_hold.rows) <= 3
    assert "pool:6" in permit_hold.rows


def test_a_stale_hint_dropped_by_another_first_is_left_to_the_next_plan(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take of permits of several resources pops a hint of a slot that is held (a hint
    that landed late), and is refused by that slot's permit; it drops the hint, but another
    taker dropped it first: that refusal is no failure of the acquire, which plans again
    from the row as it is and takes another slot."""
    from dynasem._storage import permit_items

    holder = take(holds, "sev:pool", limit=16, lease=30)  # slot 0
    assert holder.slots == {"sev:pool": 0}
    lock_rows.update(permit_items.hint("sev:pool", 0))  # the hint that landed late
    transact, dropped = lock_rows.transact, []

    def another_drops_it_first(actions: list[dict[str, Any]]) -> None:
        try:
            transact(actions)
        except dynamodb.Cancelled:
            if not dropped:  # another taker's refused pop dropped it meanwhile
                lock_rows.update(permit_items.drop_hint("sev:pool", 0))
                dropped.append(True)
            raise

    monkeypatch.setattr(lock_rows, "transact", another_drops_it_first)
    pair = take(holds, ["sev:pool", "sev:other"], limit=16, lease=30, wait=2)
    assert dropped, "the take never popped the stale hint"
    assert pair.slots["sev:pool"] != 0


def test_a_permit_take_planned_from_a_row_changed_since_plans_again(holds: list[Any]) -> None:
    """A permit take plans its row write from the row as this process last saw it (a hint
    to pop); another process popped that hint meanwhile: the row write is refused, and the
    take plans again from the row the refusal showed (a slot more), not a failure."""
    from dynasem._storage import permit_items

    take(holds, "pool", limit=9, lease=30)  # slot 0
    semaphore("pool", limit=9, lease=30).acquire().release()  # slot 1, hinted
    assert _hints("pool") == (1,)
    lock_rows.update(permit_items.drop_hint("pool", 1))  # popped by another process
    held = take(holds, "pool", limit=9, lease=30, wait=0)
    assert held.slots["pool"] == 2


def test_permits_of_several_taken_for_longer_than_their_rows_are_listed(
    holds: list[Any],
) -> None:
    """A take of permits of several resources whose lease runs past the end of their rows'
    listing (the ``expires`` bucket a shorter hold left): each row is listed further first,
    as its transaction requires (a permit is never live on a row that may be reaped), and
    the take is not refused for it again and again until its wait is over."""
    pair = ["pool:a", "pool:b"]
    semaphore(pair, limit=9, lease=30).acquire().release()  # the rows, listed for 30 s
    held = take(holds, pair, limit=9, lease=1_000, wait=2)  # past any bucket of 30 s
    lease_end = int(held.expires.timestamp() * 1000)
    for resource in pair:
        row = lock_rows.get(resource)
        assert row is not None and row.expires_ms >= lease_end, f"{resource}: listed short"
