"""A take of several resources (no queue of its own) never passes a live waiter in line of
one of them, even when the read of that line stays throttled: not known is not nobody; and
readers of several resources take a permit row nobody holds, within their wait."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import reader_hold as reader_held
from dynasem._storage import lock_rows
from tests.engine.test_readers_lost import INLINE
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    reader_held.rows.clear()


@pytest.mark.parametrize("throttled", [False, True])
def test_readers_of_several_resources_never_pass_a_live_writer_in_line(
    holds: list[Any], throttled: bool
) -> None:
    """(Found by review.) A shared acquire of several resources, one of which keeps its
    readers in items (readers.acquire_many), finds the row says someone waits and reads the
    queue (readers._admissible). That read throttled past botocore's retries is "no news"
    (queue.patient_read returns the row as read, its entries None), but
    ``queue.entries_ahead`` then answers None ("not read") and ``_admissible`` takes it for
    nobody ahead (``... or ()``): the admission passes the whole line (``qout = qin``, on
    ``qin``/``qout`` as seen), the live writer waiting first among them. Unthrottled, the
    same acquire waits (busy)."""
    from dynasem import _clock as clock
    from dynasem._storage import dynamodb, records
    from tests.support.faults import Faults
    from tests.support.helpers import enqueue_entry

    for _ in range(INLINE):
        take(holds, "thr:r1", shared=True, lease=30)
    # A writer waiting in line for thr:r1, alive (its entry renewed a minute ahead).
    writer = records.Waiter(ticket=0, expires_ms=clock.now_ms() + 60_000, user_id="writer")
    ticket = enqueue_entry("thr:r1", "w" * 32, writer)
    with Faults(dynamodb.get_client()) as faults:
        if throttled:
            faults.throttle("Query", 4)  # more than botocore's own retries: one read fails
        try:
            held = semaphore(["thr:r1", "thr:r2"], shared=True, wait=1.5, lease=30).acquire()
        except SemaphoreBusy:
            return  # waited behind the writer, as it must
    holds.append(held)
    stored = lock_rows.get_item("thr:r1")
    assert stored is not None
    pytest.fail(
        f"a reader was admitted ahead of the live writer in line (its ticket {ticket}, qout "
        f"now {stored.get('qout')}): its turn was passed"
    )


@pytest.mark.parametrize("throttled", [False, True])
def test_permits_of_several_resources_never_pass_a_live_waiter_in_line(
    lock_table: str, throttled: bool
) -> None:
    """(Found by review.) The same for permits: permits._plan_many reads the
    queue of a row waited on with ``queue.patient_read`` and takes ``entries_ahead(...) or
    ()``: a throttled read (the row as read, its entries None) is taken for nobody ahead."""
    from dynasem import _clock as clock
    from dynasem._storage import dynamodb, records
    from tests.support.faults import Faults
    from tests.support.helpers import enqueue_entry

    semaphore(["thr:p1", "thr:p2"], limit=9).acquire().release()  # the rows exist
    waiter = records.Waiter(ticket=0, expires_ms=clock.now_ms() + 60_000, user_id="waiter")
    ticket = enqueue_entry("thr:p1", "w" * 32, waiter)
    with Faults(dynamodb.get_client()) as faults:
        if throttled:
            faults.throttle("Query", 4)
        try:
            held = semaphore(["thr:p1", "thr:p2"], limit=9, wait=1.5, lease=30).acquire()
        except SemaphoreBusy:
            return
    held.release()
    pytest.fail(f"a taker of permits passed the live waiter in line (its ticket {ticket})")


@pytest.mark.parametrize("permits", ["free", "held"])
def test_readers_of_several_resources_take_a_permit_row_nobody_holds(
    holds: list[Any], permits: str
) -> None:
    """Readers of several resources in reader items (one of them has many readers), another
    of them a counting semaphore's permit row: with no permit live, its permits are fenced
    out and the readers take it (found by the simulator, seed 7108 of ``mixed_pairs`` with
    ``--permits-from 1 --readers-from 0``: the admission required a row of no permits and
    was refused again and again, 40 transactions a second, for ever, its wait ignored).
    With a permit live, they wait for it, and give up when their wait is over."""
    import threading

    for _ in range(INLINE + 1):
        take(holds, "mix:r", shared=True, lease=30)  # the last one in a reader item
    counted = semaphore("mix:s", limit=9, lease=30).acquire()
    if permits == "free":
        counted.release()
    else:
        holds.append(counted)
    got: list[Any] = []

    def acquire() -> None:
        try:
            got.append(semaphore(["mix:r", "mix:s"], shared=True, wait=1, lease=30).acquire())
        except Exception as exc:  # reported below
            got.append(exc)

    thread = threading.Thread(target=acquire, daemon=True)
    thread.start()
    thread.join(20)
    assert got, "the acquire never ended: its wait (1 s) was ignored"
    if permits == "held":
        assert isinstance(got[0], SemaphoreBusy), got
        return
    assert not isinstance(got[0], BaseException), got
    holds.append(got[0])
    row = lock_rows.get("mix:s")
    assert row is not None and row.slots_used is None and row.mode == "s"
