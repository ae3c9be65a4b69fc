"""Review (thirty-seventh session, helper k): dynasem.testing as a Django user's suite meets it."""

from __future__ import annotations

import pytest
from django.db import transaction

from dynasem import SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem.testing import held_elsewhere


def test_held_elsewhere_finds_busy_a_lock_the_tests_transaction_still_holds(
    lock_table, transactional_db
):
    """A hold given back inside a transaction that has not committed (a request under
    ``ATOMIC_REQUESTS`` in a ``TestCase``, whose transaction never commits) stays ours until
    that commit. ``held_elsewhere`` stands for another process, which finds it busy; it ran
    in the test's thread and took that hold again as the transaction's own (same token, the
    ``user=`` it was given ignored), so the test saw a lock "held elsewhere" that nobody
    else held, and the view under test re-entered it instead of answering 423."""
    with transaction.atomic():
        with semaphore("k-pending") as ours:
            pass
        assert ours.pending_commit
        with pytest.raises(SemaphoreBusy), held_elsewhere("k-pending", user="alice") as theirs:
            pytest.fail(f"held elsewhere with our own hold: {theirs.token == ours.token}")
        assert [h.token for h in holds_on("k-pending")] == [ours.token]
        assert ours.pending_commit, "still ours until the commit"
    assert holds_on("k-pending") == []
