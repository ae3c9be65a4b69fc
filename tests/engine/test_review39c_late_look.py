"""A ninth review: a hand-over that reached a waiter after it left, and its process's late
look at the row (push.depart), when that look fails.

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem._engine import push as wakeup
from dynasem._storage import dynamodb
from tests.engine.test_late_handover import LEAVER_LEASE, Line, _held_up
from tests.support.faults import Faults


@pytest.mark.parametrize("how", ["cancel", "interrupt"])
def test_a_late_look_whose_read_is_throttled_looks_again(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A hand-over lands on a waiter that had left, its push lost (pushes cannot reach it:
    another host, a datagram dropped); only its process's late look at the row, 2 s on, can
    hand it on. That read is throttled past botocore's retries (a hot key, which a lock
    with a line is). Before the mend the late look gave up after that one read ("if it was,
    it is free again when its lease runs out"): the lock sat with nobody for the leaver's
    lease (30 s here; 65 s by default) while the next waiter waited. A late look that could
    not read now looks again, as one whose dead mark failed does: 2 s later, then twice as
    late after each failure, while a hand-over to it may stand."""
    push = wakeup.push

    def lossy(address: Any, resource: str, token: str, item: Any, **kwargs: Any) -> bool:
        heir = item.holders.get(token)
        if heir is not None and heir.user_id == "leaver":
            return False
        return push(address, resource, token, item, **kwargs)

    monkeypatch.setattr(wakeup, "push", lossy)
    look = wakeup._Slot._look
    looks: list[bool] = []

    def throttled_once(slot: Any) -> Any:
        if looks:
            looks.append(True)
            return look(slot)
        with Faults(dynamodb.get_client(), this_thread=True) as faults:
            rule = faults.throttle("GetItem", 10)
            result = look(slot)
        looks.append(bool(rule.fired))
        return result

    monkeypatch.setattr(wakeup._Slot, "_look", throttled_once)
    line = Line(f"review39c:late-look-throttled-{how}", how, monkeypatch)
    _held_up(line, monkeypatch, lambda: None)
    released = time.monotonic()
    line.holder.release()
    line.check()
    assert looks[:1] == [True], "the late look was never throttled"
    assert time.monotonic() - released < LEAVER_LEASE / 2  # not the leaver's lease
