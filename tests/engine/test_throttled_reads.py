"""A waiting acquire's reads of the queue, throttled still after botocore's retries, are no
news while its wait lasts: never the caller's failure (issue 40, found by
benchmarks/throttled.py on the unkind engine)."""

from __future__ import annotations

from dynasem import _clock as clock
from dynasem import semaphore
from dynasem._storage import dynamodb, records
from tests.support.faults import Faults
from tests.support.helpers import enqueue_entry


def test_a_throttled_read_of_the_queue_ahead_keeps_the_acquire_waiting(lock_table: str) -> None:
    resource = "thr:load"
    # A waiter ahead whose entry runs out in 1 s (a crashed one): the lock is free, the row
    # says someone waits, so a taker reads the queue first (a Query).
    enqueue_entry(
        resource, "w" * 32, records.Waiter(ticket=0, expires_ms=clock.now_ms() + 1000, user_id="w")
    )
    with Faults(dynamodb.get_client()) as faults:
        rule = faults.throttle("Query", 4)  # more than botocore's own retries
        semaphore(resource, wait=10).acquire().release()
    assert rule.fired == 4


def test_a_throttled_read_of_permit_rows_keeps_the_acquire_waiting(lock_table: str) -> None:
    # Several counting resources of permit items (limit above 8): their rows are read first.
    semaphore(["thr:p1", "thr:p2"], limit=9).acquire().release()  # the rows exist
    with Faults(dynamodb.get_client()) as faults:
        rule = faults.throttle("GetItem", 4)
        semaphore(["thr:p1", "thr:p2"], limit=9, wait=10).acquire().release()
    assert rule.fired == 4


def test_throttled_reads_of_reader_item_rows_keep_the_acquire_waiting(lock_table: str) -> None:
    # Shared holds of several resources, one of which keeps its readers in reader items
    # (it has as many inline as it keeps): the rows are read first, then the queue of the
    # one waited on. Both reads throttled past botocore's retries: still no caller's failure.
    inline = [semaphore("thr:r1", shared=True, lease=30).acquire() for _ in range(2)]
    enqueue_entry(
        "thr:r1", "w" * 32, records.Waiter(ticket=0, expires_ms=clock.now_ms() + 1000, user_id="w")
    )
    with Faults(dynamodb.get_client()) as faults:
        gets = faults.throttle("GetItem", 4)
        queries = faults.throttle("Query", 4)
        held = semaphore(["thr:r1", "thr:r2"], shared=True, wait=10).acquire()
    assert held.fence > 0
    assert (gets.fired, queries.fired) == (4, 4)
    held.release()
    for hold in inline:
        hold.release()


def test_an_operator_command_sends_a_throttled_request_again(lock_table: str) -> None:
    # The operators' quick client sends once (a down DynamoDB is reported in seconds), but
    # one throttle of a busy table failed the whole command (found on the unkind engine).
    import io

    from django.core.management import call_command

    held = semaphore("thr:listed", lease=30).acquire()
    out = io.StringIO()
    with Faults(dynamodb.get_client(quick=True)) as faults:
        rule = faults.throttle("*", 2)
        call_command("dynasem_locks", "thr:listed", stdout=out, stderr=io.StringIO())
    assert rule.fired == 2
    assert "thr:listed" in out.getvalue()
    held.release()
