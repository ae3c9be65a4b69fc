"""Review (thirty-sixth session): dynasem's own use of its public signals, beside a user's
receivers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dynasem import leadership
from dynasem.signals import lock_lost


@pytest.fixture
def raising_receiver() -> Iterator[None]:
    """A project's ``lock_lost`` receiver (connected at start-up, before any lead) that
    raises: an alert whose webhook is down."""

    def alert(sender: Any, **kwargs: Any) -> None:
        raise ConnectionError("the alerting webhook is down")

    lock_lost.connect(alert, weak=False, dispatch_uid="review36-alert")
    try:
        yield
    finally:
        lock_lost.disconnect(dispatch_uid="review36-alert")


def test_a_raising_lock_lost_receiver_does_not_keep_on_lost_from_a_lead(
    lock_table: str, raising_receiver: None
) -> None:
    """A lead learns of its loss through ``lock_lost``, which Django sends receiver by
    receiver, stopping at the first that raises: a project's receiver connected before the
    lead (at start-up) that raised kept ``on_lost`` from being called (the guide's way to
    stop a leader's work) until something asked ``lead.active``."""
    from dynasem._operators.locks import break_hold, holds_on

    told = threading.Event()
    with leadership("review36-jobs", lease=5, on_lost=lambda lead: told.set()):
        (hold,) = holds_on("leader:review36-jobs")
        break_hold("leader:review36-jobs", hold.token)  # the next renewal is refused
        assert told.wait(10), "on_lost was not called after the lead was broken"
