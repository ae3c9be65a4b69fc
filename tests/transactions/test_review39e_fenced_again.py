"""Review 39e: a resource fenced in a transaction, given back (``on_commit=False``), taken
again in the same transaction.

The fence row stays locked until the transaction ends: the next holder's fence waits for our
transaction, and our second acquire waited in line for that holder, each on the other, until
``wait`` ran out (SemaphoreBusy, a whole ``wait`` later; and the holder's fence stuck as long).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

from dynasem import semaphore
from tests.engine.test_heartbeat import unique

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "file"])


def next_holder(resource: str, took: threading.Event, fenced: threading.Event) -> None:
    """Another holder, as another process: takes the lock, then fences its transaction (its
    fence write waits for ours to end)."""
    try:
        with transaction.atomic(using="file"), semaphore(resource, wait=30, using="file") as held:
            took.set()
            held.fence_transaction("file")
            fenced.set()
    finally:
        connections["file"].close()


def test_a_fenced_resource_given_back_is_not_waited_for_again_in_its_transaction(
    lock_table: str,
) -> None:
    resource = unique("fenced-again")
    took, fenced = threading.Event(), threading.Event()
    other = threading.Thread(target=next_holder, args=(resource, took, fenced), daemon=True)
    raised: list[BaseException] = []
    with transaction.atomic(using="file"):
        with semaphore(resource, on_commit=False, using="file", fence_db=True):
            pass  # given back at once: the fence row stays locked until the commit
        other.start()
        assert took.wait(10), "the next holder did not take the lock"
        started = time.monotonic()
        try:
            with semaphore(resource, on_commit=False, using="file", wait=3):
                pass
        except Exception as exc:  # looked at below
            raised.append(exc)
        took_s = time.monotonic() - started
    other.join(30)
    assert fenced.is_set(), "the next holder's fence did not go on after our transaction"
    assert [type(e) for e in raised] == [ValueError], raised
    assert "fence" in str(raised[0]) and resource in str(raised[0])
    assert took_s < 1.5, f"waited {took_s:.1f}s on the holder that waits for us"


def test_the_next_transaction_of_the_same_atomic_decorator_takes_it_again(lock_table: str) -> None:
    """``@transaction.atomic`` enters the same block object at every call: what the last
    call's transaction fenced is forgotten as it ends, and taken again in the next."""
    resource = unique("fenced-next-call")

    @transaction.atomic(using="file")
    def work() -> int:
        with semaphore(resource, on_commit=False, using="file", fence_db=True) as held:
            return held.fence

    first = work()
    assert work() > first
