"""Review 38 (helper j): a unique task's claim and the SemaphoreBusy of a signal receiver."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreBusy
from dynasem._background.unique import claim_for
from dynasem._operators.locks import holds_on
from dynasem.signals import lock_acquired


def test_a_lock_acquired_receivers_busy_lock_is_not_a_key_taken_by_a_task(lock_table) -> None:
    """A ``lock_acquired`` receiver that takes a lock of its own (an audit trail's,
    ``wait=0``) and finds it busy raises that lock's ``SemaphoreBusy``: the claim's hold is
    given back and the claim ends with it. It was taken for the claim's own busy answer,
    :class:`Taken`: the enqueue was skipped as a duplicate (``enqueue()`` returned None,
    ``apply_async`` a result of a task said to hold the key) although nothing held the key,
    and no task was queued to do the work. As a decorated call does (a8288cb), it
    propagates."""

    def audit(sender: Any, **kwargs: Any) -> None:
        if kwargs["resource"] == "r38j-key:1":
            raise SemaphoreBusy("audit-trail", 3, "someone", None, 0.0)

    lock_acquired.connect(audit, weak=False, dispatch_uid="review38j-claims")
    try:
        with pytest.raises(SemaphoreBusy) as raised:
            claim_for("app.reindex", "r38j-key:1", "task-1", 30, None)
    finally:
        lock_acquired.disconnect(dispatch_uid="review38j-claims")
    assert raised.value.resource == "audit-trail"
    assert holds_on("r38j-key:1") == []
