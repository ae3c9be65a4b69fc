"""The eighth review's findings on fenced transactions (dynasem/_transactions/fencing.py) and
the give-back after the commit (dynasem/_transactions/commit.py), on SQLite in one process."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from dynasem import LockLost, semaphore
from dynasem._operators.locks import holds_on
from dynasem._transactions.fencing import row_key
from dynasem.models import Fence
from tests.transactions.test_transactions import is_busy

routed = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def stored_in(alias: str, resource: str) -> int | None:
    row = Fence.objects.using(alias).filter(digest=row_key(resource)).first()
    return None if row is None else row.fence


def newer_fence_in_other(resource: str, held: Any) -> None:
    """A newer holder's committed fenced transaction in the database "other"."""
    Fence.objects.using("other").create(
        digest=row_key(resource), resource=resource, fence=held.fence + 1
    )


@routed
@pytest.mark.reentry
def test_a_nested_holds_fence_transaction_fences_the_nested_semaphores_database(
    lock_table: str,
) -> None:
    """``held.fence_transaction()`` fences "the semaphore's ``using``": for a nested acquire
    re-entering an outer hold, the semaphore the caller wrote (``using="other"``), as its
    ``fence_db=True`` block does. It fenced the outer semaphore's database instead (open too:
    ATOMIC_REQUESTS): the work in "other" went unfenced, a stale holder's commit unrefused."""
    resource = "tbl:nested-using"
    with pytest.raises(LockLost, match="'other' holds fence .* newer than this hold's"):
        with transaction.atomic():  # the request's transaction on default
            with semaphore(resource) as outer:
                newer_fence_in_other(resource, outer)
                with (
                    semaphore(resource, using="other") as inner,
                    transaction.atomic(using="other"),
                ):
                    inner.fence_transaction()
                    User.objects.using("other").create(username="stale")
    assert not User.objects.using("other").filter(username="stale").exists()
    assert stored_in("default", resource) is None
    assert stored_in("other", resource) == outer.fence + 1


@routed
def test_a_hold_taken_again_in_its_transaction_fences_the_new_semaphores_database(
    lock_table: str,
) -> None:
    """The same through a hold given back in its transaction and taken again there (a view
    calling two locked helpers under ATOMIC_REQUESTS), the second for work in "other"."""
    resource = "tbl:pending-using"
    with pytest.raises(LockLost, match="'other' holds fence .* newer than this hold's"):
        with transaction.atomic():
            with semaphore(resource) as first:
                pass
            assert first.pending_commit
            newer_fence_in_other(resource, first)
            with (
                semaphore(resource, using="other") as again,
                transaction.atomic(using="other"),
            ):
                again.fence_transaction()
                User.objects.using("other").create(username="stale")
    assert not User.objects.using("other").filter(username="stale").exists()
    assert stored_in("default", resource) is None
    assert first.released


@pytest.mark.parametrize("savepoint", [True, False])
@pytest.mark.django_db(transaction=True, databases=["default", "file"])
def test_a_connection_closed_after_an_inner_block_ended_gives_back_at_once(
    lock_table: str, savepoint: bool
) -> None:
    """The how-to: ``connection.close()`` inside ``atomic`` dooms the transaction, "the hold
    is given back at once". Given back inside an inner ``atomic`` block that then ended (a
    savepoint released, or a block without one), the close dropped the give-back while a
    savepoint it was registered under was no longer open: taken for a savepoint's rollback,
    it was registered again on the closed connection, whose list Django empties only at its
    next connect. The transaction over, the hold stayed pending, renewed for nobody, as long
    as this thread did not touch that database again."""
    resource = f"tx:closed-after-inner:{savepoint}"
    connection = connections["file"]
    with transaction.atomic(using="file"):
        with transaction.atomic(using="file", savepoint=savepoint):
            with semaphore(resource, using="file") as held:
                User.objects.using("file").create(username="closed-after-inner")
        assert held.pending_commit
        connection.close()  # close_old_connections() in a long task, say
        assert held.released and not held.pending_commit, "kept while its transaction is doomed"
    assert not connection.in_atomic_block
    assert holds_on(resource) == [] and not is_busy(resource)


def test_fence_transaction_outside_atomic_is_refused_in_a_testcase_as_in_production(
    lock_table: str, db: Any
) -> None:
    """A ``TestCase``'s own blocks never commit and count as no transaction (commit.py: "a
    test sees what production does"); ``fence_transaction()`` looked at ``in_atomic_block``
    alone, so a call its author forgot to put inside ``transaction.atomic`` wrote the fence
    into the test's transaction and passed, where production refuses it."""
    held = semaphore("tbl:testcase-outside").acquire()
    try:
        with pytest.raises(TransactionManagementError, match="must run inside transaction"):
            held.fence_transaction()
        with transaction.atomic():
            held.fence_transaction()  # inside the user's own block: as in production
    finally:
        held.release()
