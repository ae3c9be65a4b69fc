"""Review (fencing tokens, end to end): the database's fence row after a lock row was reaped
and made anew by a take paused before its send (tests/engine/test_review_fencing.py)."""

from __future__ import annotations

import pytest
from django.db import connections, transaction

from dynasem import semaphore
from dynasem._transactions import fencing
from dynasem.testing import abandon
from tests.engine.test_review_fencing import PausedBeforeSend, reap_until_gone

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.usefixtures("one_second_buckets")
def test_a_stale_holders_fence_is_refused_after_the_next_holders_transaction(
    lock_table: str,
) -> None:
    """A draws its fence and is paused before its take's send. B takes the lock (a later
    fence), then its process stalls (no renewal, no release); its lease ends and the reaper
    deletes the row. A's take lands on no row and holds under its older fence; A's fenced
    transaction commits. B resumes past its deadline check, just before writing its fence
    (the case (b) of RELIABILITY's fenced transactions): the database must refuse B, whose
    hold ended before A's began. It accepts B's fence: B's stale work would land over A's."""
    stale: list[object] = []

    def b_takes_and_stalls_and_the_row_is_reaped() -> None:
        b = semaphore("res", lease=1, fence_db=False).acquire()
        abandon(b)  # its process stalls: no renewal, no release
        stale.append(b)
        reap_until_gone("res")

    with PausedBeforeSend("UpdateItem", b_takes_and_stalls_and_the_row_is_reaped) as paused:
        a = semaphore("res", lease=30).acquire()
    assert paused.fired and stale
    b = stale[0]
    try:
        with transaction.atomic():
            a.fence_transaction()  # A, the one holder now, fences its work and commits
        with transaction.atomic():
            # B, stalled after its deadline check: its fence write is the database's call.
            accepted = fencing._write(connections["default"], "default", "res", b.fence)
            transaction.set_rollback(True)
        assert not accepted, (
            f"the database took stale B's fence {b.fence} after A's transaction (fence "
            f"{a.fence}): B's hold had ended before A's began"
        )
    finally:
        a.release()
