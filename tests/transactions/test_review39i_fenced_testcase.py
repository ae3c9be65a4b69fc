"""Review 39i: what an open transaction fenced (fencing.check_not_fenced, 39e) inside a Django
``TestCase``, whose transaction never commits."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from dynasem import semaphore
from dynasem.testing import held_elsewhere
from tests.engine.test_heartbeat import unique


def test_an_atomic_decorator_called_twice_in_a_testcase_takes_it_again(
    lock_table: str, db: Any
) -> None:
    """``@transaction.atomic`` enters the same block object at every call, and its commit
    hooks never run in a ``TestCase``: the first call's fenced resource was remembered past
    its block's end, and the second call raised ValueError, where production (whose commit
    forgets it) takes it again."""
    resource = unique("fenced-testcase")

    @transaction.atomic
    def work() -> int:
        with semaphore(resource, on_commit=False, fence_db=True) as held:
            return held.fence

    first = work()
    assert work() > first


def test_in_a_testcase_one_transaction_still_refuses_it_again(lock_table: str, db: Any) -> None:
    """Told apart by their savepoints, one block's transaction is still one: taken again in
    it, the resource is refused at once, as in production."""
    resource = unique("fenced-testcase-again")
    with transaction.atomic():
        with semaphore(resource, on_commit=False, fence_db=True):
            pass
        with transaction.atomic(), pytest.raises(ValueError, match="fenced"):
            semaphore(resource, on_commit=False, wait=0).acquire()


def test_held_elsewhere_takes_a_resource_fenced_and_given_back_as_another_process_would(
    lock_table: str, db: Any
) -> None:
    """``held_elsewhere`` acquires as another process would (its own connection, never this
    transaction's fence row): taking what this transaction fenced and gave back is no
    deadlock there, and it got a ValueError meant for this transaction's own acquires."""
    resource = unique("fenced-elsewhere")
    with transaction.atomic():
        with semaphore(resource, on_commit=False, fence_db=True) as ours:
            pass
        with held_elsewhere(resource) as other:
            assert other.fence > ours.fence
