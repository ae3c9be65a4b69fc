"""Review (shared/exclusive and counting holds): lost answers on a permit's release."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem._storage import dynamodb, lock_rows
from dynasem._storage import permit_items as slots
from tests.support.faults import Faults
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)


def test_a_release_whose_hint_answer_is_lost_hints_its_slot_once(holds: list[Any]) -> None:
    """The release's second write (the slot appended to the row's hints) is applied, its
    answer lost, and botocore sends it again: the slot must not be hinted twice. A second
    hint of a slot sends a later take to a permit that is held by then (its row write and
    its refused permit write for nothing, and a take planned again), and keeps one of the
    row's MAX_HINTS places for nobody."""
    first = take(holds, "pool", limit=16, lease=30)
    take(holds, "pool", limit=16, lease=30)
    slot = first.slots["pool"]
    with Faults(dynamodb.get_client()) as faults:
        # The release's writes: the permit (UpdateItem), then the row's hint (UpdateItem).
        lost = faults.lose_response("UpdateItem", 1, after=1)
        first.release()
    assert lost.fired == 1
    row = lock_rows.get_item("pool")
    assert row is not None
    assert [int(x) for x in row["hints"]] == [slot]
    # And so the next two takes: the first pops the hint, the second grows a new slot.
    a = take(holds, "pool", limit=16, lease=30)
    assert a.slots["pool"] == slot
    assert slots.slot_of("pool", a.token) is not None


def _pops_a_hint(body: dict[str, Any]) -> bool:
    return "#hints[0]" in body.get("UpdateExpression", "")


def test_a_take_whose_row_write_answer_is_lost_loses_no_permit(holds: list[Any]) -> None:
    """A take of a hinted slot: its row write (the first hint popped, the fence counted up)
    is applied, its answer lost, and botocore sends it again: applied again, it pops the
    next hint too. The take holds that second slot; the first, free, is hinted no more.

    Accepted (decision, docs/RELIABILITY.md, thirty-third session): that slot is not lost.
    Takes grow new slots past it, and once all the others are in use, a take reads the
    permits and finds it. The cost is one read of the permits when the pool is full, after a
    rare lost answer. Telling the re-send apart would need a mark of every take kept in the
    row. This test holds the guarantee: all ``limit`` permits can still be held at once, and
    not one more."""
    from dynasem import SemaphoreBusy
    from tests.engine.test_readers_lost import LoseAnswer

    limit = 16  # above INLINE_MAX: permits in items
    first, second, _ = (take(holds, "pool", limit=limit, lease=30) for _ in range(3))
    freed = {first.slots["pool"], second.slots["pool"]}
    for held in (first, second):
        held.release()
        holds.remove(held)
    with LoseAnswer(_pops_a_hint) as lost:
        again = take(holds, "pool", limit=limit, lease=30, wait=0)
    assert lost.fired == 1, "the row write's answer was never lost: the test missed it"
    assert again.slots["pool"] in freed
    # The other permits fill the pool: the slot popped twice among them.
    rest = [take(holds, "pool", limit=limit, lease=30, wait=0) for _ in range(limit - 2)]
    held_slots = {h.slots["pool"] for h in holds}
    assert held_slots == set(range(limit)), held_slots
    assert freed <= {again.slots["pool"]} | {h.slots["pool"] for h in rest}
    with pytest.raises(SemaphoreBusy):
        take(holds, "pool", limit=limit, lease=30, wait=0)
