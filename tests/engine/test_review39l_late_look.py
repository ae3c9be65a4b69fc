"""A second review of the late look (push.depart) mended this session: what it does once it
found a hand-over to a waiter that had left, when giving that hold back fails.

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem._engine import push as wakeup
from dynasem._storage import dynamodb
from tests.engine.test_late_handover import LEAVER_LEASE, Line, _held_up
from tests.support.faults import Faults


def _lossy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushes to the leaver are lost: only its process's late look can hand its hold on."""
    push = wakeup.push

    def lossy(address: Any, resource: str, token: str, item: Any, **kwargs: Any) -> bool:
        heir = item.holders.get(token)
        if heir is not None and heir.user_id == "leaver":
            return False
        return push(address, resource, token, item, **kwargs)

    monkeypatch.setattr(wakeup, "push", lossy)


@pytest.mark.parametrize("how", ["cancel", "interrupt"])
def test_a_late_look_whose_give_back_is_throttled_looks_again(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The late look reads the row and finds the hold handed to the waiter that had left;
    its give-back write is throttled past the release's patience (the key is hot: the very
    case 075b8fe retries a failed read for). Before the mend the look had marked itself done
    (``stopped``) before it wrote, and the release that gave up was only logged: the
    lock sat with nobody for the leaver's lease (30 s here, 65 s by default) while the next
    waiter waited. A give-back that failed now counts as a failed look: looked at again
    (2 s, then twice as late) while the hold may stand."""
    _lossy(monkeypatch)
    look = wakeup._Slot._look
    looks: list[int] = []

    def throttled_once(slot: Any) -> Any:
        if looks:
            looks.append(0)
            return look(slot)
        with Faults(dynamodb.get_client(), this_thread=True) as faults:
            faults.throttle("UpdateItem", 50)
            faults.throttle("TransactWriteItems", 50)
            result = look(slot)
        looks.append(faults.fired)
        return result

    monkeypatch.setattr(wakeup._Slot, "_look", throttled_once)
    line = Line(f"review39l:give-back-throttled-{how}", how, monkeypatch)
    _held_up(line, monkeypatch, lambda: None)
    released = time.monotonic()
    line.holder.release()
    line.next.join(60)
    # The throttled give-back built its hand-over to the next waiter too (never applied).
    line.heirs = [h for i, h in enumerate(line.heirs) if i == 0 or h != line.heirs[i - 1]]
    line.check()
    assert looks and looks[0] > 0, "the late look's give-back was never throttled"
    assert time.monotonic() - released < LEAVER_LEASE / 2  # not the leaver's lease
