"""A second look at the hand-on (a waiter that proves a holder of its host dead hands the
lock to the live waiter ahead of it): the write's answer lost."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem import _clock as clock
from dynasem._engine import handover
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from tests.engine.test_review36_liveness import dead, linux_only  # noqa: F401 - the fixture
from tests.support.faults import Faults
from tests.support.helpers import enqueue_entry


@linux_only
def test_a_hand_on_whose_answer_is_lost_still_pushes_its_heir(
    lock_table: str,
    dead: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hand-on applied, its answer lost; botocore's re-send is refused by the row it
    wrote. The refusal showed the heir holding under our fence, and nobody pushed it: it
    learns of its hold only at its next paced look."""
    now = clock.now_ms()
    entry = lock_writes.holder_entry("killed", now + 60_000, clock.new_fence(0.5), now, False, dead)
    lock_rows.update(
        lock_writes.take_free("r:lost", "killed", entry, mode="x", limit=1, stale_ms=now - 500)
    )
    elsewhere = records.Waiter(
        clock.new_fence(0), now + 60_000, user_id="elsewhere", lease_ms=60_000, proc=None
    )
    enqueue_entry("r:lost", "elsewhere", elsewhere)
    pushed: list[str] = []

    def push_heirs(resource: str, heirs: Any, item: Any, *args: Any) -> None:
        pushed.extend(token for token, _ in heirs if token in item.holders)

    monkeypatch.setattr(handover, "push_heirs", push_heirs)
    built = lock_writes.hand_on
    faults = Faults(dynamodb.get_client())

    def hand_on(*args: Any, **kwargs: Any) -> dict[str, Any]:
        faults.lose_response("UpdateItem", 1)  # this write's: applied, then sent again
        return built(*args, **kwargs)

    monkeypatch.setattr(lock_writes, "hand_on", hand_on)
    with faults, pytest.raises(SemaphoreBusy):
        semaphore("r:lost", fair=True, wait=0.5).acquire()
    row = lock_rows.get("r:lost")
    assert row is not None and list(row.holders) == ["elsewhere"]
    assert pushed == ["elsewhere"], "the heir was handed the lock and never told"
