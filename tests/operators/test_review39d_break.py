"""A break of a hold in its row (exclusive, counting inline, a reader inline) applied and its
answer lost, on a client that sends again (botocore's retries), as the unkind engine showed
(tests/engine/test_review_several.py's break failed there)."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem._operators.locks import break_hold, holds_on
from dynasem._storage import dynamodb
from dynasem.signals import lock_released
from tests.support.faults import Faults


@pytest.mark.parametrize(
    "options", [{}, {"limit": 3}, {"shared": True}], ids=["exclusive", "counting", "reader"]
)
def test_a_break_whose_resend_is_refused_by_its_own_applied_write_says_broken(
    lock_table: str, options: dict[str, Any]
) -> None:
    """The break's first send is applied and its answer lost; botocore's re-send is refused
    (the token is gone). Before, that refusal read as "the token no longer held": False,
    no ``lock_released``, no push to the first waiter, though the hold was broken."""
    held = semaphore("review39d:break", lease=30, **options).acquire()
    told: list[dict[str, Any]] = []

    def heard(**kwargs: Any) -> None:
        told.append(kwargs)

    lock_released.connect(heard, weak=False)
    try:
        with Faults(dynamodb.get_client()) as faults:
            lost = faults.lose_response("UpdateItem")
            broken = break_hold("review39d:break", held.token, fence=held.fence)
    finally:
        lock_released.disconnect(heard)
    assert lost.fired == 1
    assert broken
    assert [(t["token"], t["broken"]) for t in told] == [(held.token, True)]
    assert holds_on("review39d:break") == []
    with pytest.raises(LockLost):
        held.renew()
