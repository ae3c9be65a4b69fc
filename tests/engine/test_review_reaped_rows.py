"""Review (writes landing on a lock row reaped meanwhile): a write without a condition that
the row exists makes it anew with only its own attributes. A row with no ``expires`` is in
neither index and has no TTL: neither the reaper nor DynamoDB ever deletes it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._storage import dynamodb, lock_rows
from tests.support.helpers import in_another_thread

from .test_review_fencing import PausedBeforeSend, reap_until_gone


class PausedBeforeDraw:
    """The first ticket draw (``ADD #qin``) this thread sends waits, before it leaves, while
    ``meanwhile()`` runs in another thread: a waiter paused between its look at the row (busy)
    and its draw."""

    def __init__(self, meanwhile: Callable[[], None], *, interrupt: bool = False) -> None:
        self.meanwhile = meanwhile
        # ``interrupt``: a KeyboardInterrupt (Ctrl-C, a Celery soft time limit) right after
        # the draw's answer came.
        self.interrupt, self.interrupted = interrupt, False
        self.thread = threading.get_ident()
        self.fired = False
        self.client = dynamodb.get_client()

    def _hook(self, request: Any, **kwargs: Any) -> None:
        if self.fired or threading.get_ident() != self.thread:
            return
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if b"ADD #qin" not in body:
            return
        self.fired = True
        in_another_thread(self.meanwhile)

    def _after(self, **kwargs: Any) -> None:
        if self.fired and self.interrupt and not self.interrupted:
            if threading.get_ident() == self.thread:
                self.interrupted = True
                raise KeyboardInterrupt

    def __enter__(self) -> PausedBeforeDraw:
        self.client.meta.events.register_first("before-send.dynamodb.UpdateItem", self._hook)
        self.client.meta.events.register_first("after-call.dynamodb.UpdateItem", self._after)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("before-send.dynamodb.UpdateItem", self._hook)
        self.client.meta.events.unregister("after-call.dynamodb.UpdateItem", self._after)


class Holder:
    """A holds ``res`` in a thread of its own until :meth:`release`."""

    def __init__(self, resource: str, lease: float) -> None:
        self.taken, self.go = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(resource, lease))
        self.thread.start()
        assert self.taken.wait(10)

    def _hold(self, resource: str, lease: float) -> None:
        with semaphore(resource, lease=lease):
            self.taken.set()
            self.go.wait(20)

    def release(self) -> None:
        self.go.set()
        self.thread.join(10)


@pytest.mark.usefixtures("one_second_buckets")
def test_a_ticket_drawn_on_a_reaped_row_leaves_no_row_that_never_expires(lock_table: str) -> None:
    """A holds ``res``. B tries, finds it busy, and is paused before its ticket draw.
    Meanwhile A releases and the reaper deletes the idle row. B's draw (``ADD qin 1``, no
    condition) lands on nothing and makes a row of ``qin``, ``qout`` and ``qbase`` alone: no
    holders, no ``expMs``, no ``expires``. B is interrupted as the answer comes (Ctrl-C, a
    soft time limit; or killed): it leaves the queue (its entry marked dead, TTL takes it).
    The row is left: in neither index (no ``expires``), never listed, never reaped, never
    taken by TTL, for as long as nobody takes ``res`` again (a resource named after a job, a
    user, a file: forever). On a row that is there, the same draw leaves a row the reaper
    deletes once its lease is CLOCK_SKEW old."""
    a = Holder("res", lease=1)

    def a_releases_and_the_row_is_reaped() -> None:
        a.release()
        reap_until_gone("res")

    with PausedBeforeDraw(a_releases_and_the_row_is_reaped, interrupt=True) as paused:
        with pytest.raises(KeyboardInterrupt):
            semaphore("res", lease=1, wait=5).acquire()
    assert paused.fired and paused.interrupted
    row = lock_rows.get_item("res")
    assert row is None or ("expires" in row and "expMs" in row), (
        f"the row left behind has no expires (never reaped, never deleted by TTL): {row}"
    )
    reap_until_gone("res")  # once the idle row's lease and bucket are over


class AfterDraw(PausedBeforeDraw):
    """As :class:`PausedBeforeDraw`; ``then()`` runs as the draw's answer comes, before the
    waiter goes on (what anyone reading the row and its line sees at that moment)."""

    def __init__(self, meanwhile: Callable[[], None], then: Callable[[], None]) -> None:
        super().__init__(meanwhile)
        self.then, self.done = then, False

    def _after(self, **kwargs: Any) -> None:
        if self.fired and not self.done and threading.get_ident() == self.thread:
            self.done = True
            self.then()


@pytest.mark.usefixtures("one_second_buckets")
def test_a_ticket_drawn_on_a_reaped_row_starts_a_new_queue_not_the_reaped_ones(
    lock_table: str,
) -> None:
    """A holds ``res``; W (lease 30 s) queues behind it (ticket 1 of the queue Q1) and puts
    its entry. B tries, finds it busy, and is paused before its ticket draw. Meanwhile A
    hands over to W, W releases, C (lease 1 s) takes and releases it, and the reaper deletes
    the idle row; W's entry (Q1, 1) stays, its lease live for 30 s (entries go by TTL). B's
    draw lands on nothing and names the queue after the row B saw
    (``if_not_exists(qbase, Q1)``): the row made anew is queue Q1 again, counted from 0, and
    its ticket 1 is W's entry of before the reap, live. Until B puts its own entry over it,
    a releaser reading the line hands the lock to W, who waits for nothing (``qbase``
    exists so that "entries left from before a reap of the row are never read as its new
    queue's": records.py). A waiter of Q1 paused over the reap reads
    the new counters as its old queue's too (``queue.passed``: same queue, ``qout`` below its
    ticket: still queued)."""
    from dynasem._engine import queue
    from dynasem._storage import queue_entries

    a = Holder("res", lease=1)
    w_done, w_tokens = threading.Event(), []

    def w_waits_then_releases() -> None:
        with semaphore("res", lease=30, wait=20) as w:
            w_tokens.append(w.token)
        w_done.set()

    w = threading.Thread(target=w_waits_then_releases)
    w.start()
    old = None
    for _ in range(200):  # W's ticket drawn and its entry put (deferred ENTRY_DEFER at most)
        old = lock_rows.get("res")
        if old is not None and old.queue_in == 1 and queue_entries.queue_entries(old):
            break
        threading.Event().wait(0.02)
    assert old is not None and queue_entries.queue_entries(old), "W's entry was never put"

    def a_hands_over_w_releases_the_row_is_reaped() -> None:
        a.release()
        assert w_done.wait(10)
        with semaphore("res", lease=1):  # C: the row's lease end (and bucket) is C's
            pass
        reap_until_gone("res")

    seen: list[Any] = []

    def look() -> None:
        row = lock_rows.get("res")
        seen.append((row, queue_entries.queue_entries(row) if row is not None else []))

    # B's first write a take, not a draw at once (W queued lately in this process, and that
    # draw's condition, "held or queued", refuses a row that is gone).
    queue.queued_recently.clear()
    with AfterDraw(a_hands_over_w_releases_the_row_is_reaped, look) as paused:
        b = semaphore("res", lease=1, wait=5).acquire()
    b.release()
    w.join(10)
    assert paused.fired and paused.done and w_tokens
    row, line = seen[0]
    assert row is not None
    stale = [x.token for x in line if x.token == w_tokens[0]]
    assert row.queue_id != old.queue_id and not stale, (
        f"the row made anew by B's draw is the reaped row's queue {old.queue_id} again "
        f"(qbase {row.queue_id}, qin {row.queue_in}, qout {row.queue_out}); its line shows "
        f"W's entry of before the reap: {line}"
    )


@pytest.mark.usefixtures("one_second_buckets")
def test_a_permit_take_paused_over_a_reap_gets_a_fence_above_the_earlier_holders(
    lock_table: str,
) -> None:
    """A (``limit=20``: permit items, lease 30 s) draws its fence and builds the take that
    makes the row a permit row (``take_slot(how="create")``: its fence named), and is paused
    before the send. Meanwhile B takes ``res`` exclusively (a later fence), releases it, and
    the reaper deletes the idle row. A's create lands on nothing (``attribute_not_exists(
    fence) OR fence < :fence``), slot 0 has no permit item to refuse it, and A holds (trusted:
    its lease is long) under the fence drawn before B's. The exclusive take's twin was mended
    (core.Acquire.may_be_reaped); the permits' acquire has no such check. Severity 3 at
    most: a counting hold cannot fence a transaction, and only each permit's holders are
    promised an order ("Permit items" in how-it-works.md); but the same page says a take's
    fence is larger than every fence drawn before, and that fences increase strictly per
    resource across a reap."""
    earlier: list[int] = []

    def b_takes_releases_and_the_row_is_reaped() -> None:
        with semaphore("res", lease=1) as b:
            earlier.append(b.fence)
        reap_until_gone("res")

    with PausedBeforeSend("UpdateItem", b_takes_releases_and_the_row_is_reaped) as paused:
        a = semaphore("res", limit=20, lease=30).acquire()
    try:
        assert paused.fired and earlier
        assert a.fence > earlier[0], (
            f"A's permit fence {a.fence} is not above B's {earlier[0]}: B held before A"
        )
    finally:
        a.release()


@pytest.mark.usefixtures("one_second_buckets")
def test_a_permit_row_made_anew_by_a_late_create_keeps_every_permit_takeable(
    lock_table: str,
) -> None:
    """The consequence of the fence above when the reaped row was a permit row. A
    (``limit=9``: permit items, lease 30 s) builds its create and is paused before the send.
    Meanwhile B takes a permit (B's create: slot 0, whose item keeps B's fence F_B after B's
    release, its TTL a week away) and releases it, and the reaper deletes the idle row. A's
    create lands: the row's fence is F_A < F_B. A's permit write on slot 0 is refused (F_B),
    and A takes slot 1. Every later take of the permit row counts its fence from the row's,
    F_A + n, for as long as n < F_B - F_A (microseconds: thousands to millions): slot 0's
    item refuses each of them. With 8 permits held, the 9th is free and nobody gets it: the
    taker finds slot 0 free, takes the row's fence and is refused at the permit, round after
    round, past its ``wait=3`` (it never raises busy), until a holder releases (here, 8 s
    later) -- for as long as B's item lives, one permit of nine is lost."""
    import time

    def b_takes_a_permit_releases_and_the_row_is_reaped() -> None:
        with semaphore("res", limit=9, lease=1):
            pass
        reap_until_gone("res")

    paused = PausedBeforeSend("UpdateItem", b_takes_a_permit_releases_and_the_row_is_reaped)
    with paused:
        a = semaphore("res", limit=9, lease=30).acquire()
    assert paused.fired
    stop, held, threads = threading.Event(), threading.Semaphore(0), []

    def hold_one() -> None:
        with semaphore("res", limit=9, lease=30, wait=10):
            held.release()
            stop.wait(30)

    ends = threading.Timer(8, stop.set)  # the holders release 8 s from now
    try:
        for _ in range(7):  # A and these: 8 of the 9 permits
            t = threading.Thread(target=hold_one)
            t.start()
            threads.append(t)
            assert held.acquire(timeout=10)
        ends.start()
        began = time.monotonic()
        ninth = semaphore("res", limit=9, lease=30, wait=3).acquire()
        took = time.monotonic() - began
        ninth.release()
        assert took < 3, (
            f"8 of 9 permits held, the 9th free: its acquire (wait=3) took {took:.1f} s, "
            "until a holder released"
        )
    finally:
        ends.cancel()
        stop.set()
        for t in threads:
            t.join(10)
        a.release()
