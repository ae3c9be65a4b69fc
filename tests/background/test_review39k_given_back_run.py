"""Review 39k: the end of a unique task's run whose hold ``renew()`` gave back as it raised
``LockLost`` (6b22957, 46d38c3)."""

from __future__ import annotations

import time

import pytest

from dynasem import LockLost
from dynasem._background.unique import adopt, claim, end_run, hand_on
from dynasem._engine.hold import stop_renewing
from dynasem._operators.locks import holds_on

pytestmark = pytest.mark.reentry


def test_a_run_whose_renew_gave_the_hold_back_raises_at_its_end_with_a_retry(
    lock_table: str,
) -> None:
    """A run that enqueued its retry ends by making its hold the retry's claim
    (``become_claim``). Its ``renew()`` found it lost (its lease ran out) and gave the row
    back: the run's end found the hold ended and returned quietly, as if the retry's claim
    were made, where a run without a retry (``release()``) raises LockLost (logged by the
    task's wrapper, finish_run, as a give-back that failed)."""
    first = claim("given-back-run:1", "task-1", queue_lease=30)
    run = adopt(first, lease=1.5)
    assert hand_on(run, first) is not None
    stop_renewing(run)  # the caller's own renewal only
    time.sleep(1.2)  # past the deadline (lease 1.5 s less CLOCK_SKEW 0.5 s)
    with pytest.raises(LockLost):
        run.renew()
    assert holds_on("given-back-run:1") == []  # given back as it raised
    with pytest.raises(LockLost):
        end_run(run, queue_lease=30)
