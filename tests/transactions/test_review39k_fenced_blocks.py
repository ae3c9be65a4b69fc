"""Review 39k: how an open transaction is told apart (fencing._outermost, a07f5aa) for the
shapes of ``atomic`` a project uses inside a Django ``TestCase``."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dynasem import semaphore
from tests.engine.test_heartbeat import unique


def test_an_atomic_decorator_without_savepoint_called_twice_takes_it_again(
    lock_table: str, db: Any
) -> None:
    """``@transaction.atomic(savepoint=False)`` makes no savepoint inside a TestCase's
    transaction: its calls were one transaction to the fence's memory (block and savepoint
    None alike), and the second call raised ValueError where production takes it again."""
    resource = unique("fenced-nosavepoint")

    @transaction.atomic(savepoint=False)
    def work() -> int:
        with semaphore(resource, on_commit=False, fence_db=True) as held:
            return held.fence

    first = work()
    assert work() > first


def test_atomic_as_a_context_manager_twice_takes_it_again(lock_table: str, db: Any) -> None:
    """One ``Atomic`` object entered twice as a context manager, its savepoint off."""
    resource = unique("fenced-cm")
    block = transaction.atomic(savepoint=False)
    fences = []
    for _ in range(2):
        with block, semaphore(resource, on_commit=False, fence_db=True) as held:
            fences.append(held.fence)
    assert fences[1] > fences[0]
