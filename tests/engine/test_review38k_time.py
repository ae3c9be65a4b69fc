"""Review 38k: a second look at a hold's life in time (the clocks its deadlines are read and
waited on)."""

from __future__ import annotations

import time

import pytest

from dynasem import semaphore
from dynasem.testing import abandon
from tests.engine.test_heartbeat import unique, watching_lost
from tests.engine.test_review38b_time import host_suspended, taken_elsewhere

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's clocks")
def test_a_suspend_past_the_lease_is_declared_lost_at_once_on_waking(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host holding a 30 s lease sleeps two minutes; another host takes the lock over.
    ``held.lost`` says True on waking (its deadline is on CLOCK_BOOTTIME), but the
    heartbeat's scheduler kept its due times on CLOCK_MONOTONIC, which did not count the
    sleep: the next renewal, and with it ``lock_lost`` (a leadership's ``on_lost``), came
    only when the old renewal's pause ran out on that clock, up to a third of the lease after
    waking, while whoever stops its work on ``lock_lost`` went on beside the new holder."""
    resource = unique("suspend-beat")
    held = semaphore(resource, lease=30).acquire()
    other = None
    try:
        with watching_lost(held.token) as lost:
            host_suspended(monkeypatch, 120.0)
            other = taken_elsewhere(resource)
            assert lost.wait(timeout=3), "lock_lost waited for the renewal's old due time"
    finally:
        monkeypatch.undo()
        abandon(held)
        if other is not None:
            abandon(other)
