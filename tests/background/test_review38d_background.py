"""Background work under review (eighth review, helper d): unique tasks, run_once,
coalescing, leadership. Each test says in its docstring what it shows and whether it failed
before its mend."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from dynasem import semaphore
from dynasem._background.unique import Taken, claim
from dynasem._operators.locks import holds_on

# dynasem's own re-entry rule (tests/conftest.py's no_reentry is off here).
pytestmark = pytest.mark.reentry


@pytest.mark.django_db(transaction=True)
def test_a_claim_in_a_transaction_does_not_take_the_hold_waiting_for_its_commit(
    lock_table: str,
) -> None:
    """A ``with semaphore(key)`` block that ends inside ``transaction.atomic`` keeps its hold,
    renewed, until the commit; a unique task of the same key enqueued after it in that
    transaction must be refused like any other enqueue of a held key (the docs: a claim is
    "never a re-entry of a hold the enqueuing thread has"). ``claim`` runs its acquire in a
    fresh context, which keeps it from re-entering an open block, but the hold waiting for
    the commit is found by the thread's transaction (``reentry.pending_hold``), not by the
    context: the claim *was* the transaction's hold, its heartbeat stopped, and the worker's
    adoption replaced it while the transaction's work was still to commit (two runs of the
    key's work at once; the commit's give-back then refused)."""
    key = "rv38d:pending"
    with transaction.atomic():
        with semaphore(key, lease=5) as held:
            User.objects.create(username="rv38d-pending")
        with pytest.raises(Taken):
            claim(key, "task-1", queue_lease=30)
        assert not held.released and held._heartbeat is not None  # renewed until the commit
        (hold,) = holds_on(key)
        assert hold.token == held.token
    assert holds_on(key) == []
