"""A hand-over to a waiter that had already left the queue (issue 40, H6), with no push.

On AWS a releaser reads the head of the line eventually consistently
(``dynasem._engine.handover``), so
for up to about a second it can still see the entry of a waiter that gave up and deleted it;
and a hand-over write that is slow (throttled and sent again, a releaser paused between its
read and its write) can land after the leaver's last look at the row. Either way the leaver
is made the holder of a lock nobody will use. With a push address its process hands it on
when the push comes; without one (pushes off, a releaser on another host) it used to sit
there for the leaver's whole lease plus the skew while every waiter behind it waited.

DynamoDB Local answers every read consistently and every write at once, so the stale read
and the slow write are made here, request by request.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import push as wakeup
from dynasem._storage import lock_rows, lock_writes, queue_entries
from tests.support import workers
from tests.support.helpers import dynasem_settings, queue_of

SPAWN = multiprocessing.get_context("spawn")

pytestmark = pytest.mark.kind_engine_only("makes its own stale read and slow write, to the request")

# The leaver's lease: how long the lock sat with it before (plus the skew). The next waiter
# waits less than this, and must get the lock far sooner still.
LEAVER_LEASE = 60
NEXT_WAIT = 20
# How long the leaver waits in line before it gives up: time for the next waiter to queue
# behind it, on a loaded machine too.
LEAVE_AFTER = 4.0
# The most the next waiter may wait for the lock after the release: the leaver's late look
# (dynasem._engine.late_handover.LATE_LOOK), the give-back, the next waiter's own look (at
# least every second), with room for a loaded machine. Far below LEAVER_LEASE + skew.
BOUND = 6.0


@pytest.fixture
def no_push(dynamodb_local: str, lock_table: str) -> Iterator[None]:
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH=None)):
        yield


def _wait_for_queue(resource: str, size: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(queue_of(resource)) < size:
        assert time.monotonic() < deadline, f"queue never reached {size}: {queue_of(resource)}"
        time.sleep(0.02)


def _in_thread(name: str, out: dict[str, Any], run: Callable[[], Any]) -> threading.Thread:
    def target() -> None:
        try:
            out[name] = run()
        except Exception as exc:  # reported to the test
            out[name] = exc

    thread = threading.Thread(target=target, name=name)
    thread.start()
    return thread


def _next_in_line(resource: str) -> tuple[float, int]:
    """A fair waiter behind the leaver: (when it got the lock, its fence)."""
    with semaphore(resource, fair=True, wait=NEXT_WAIT, user="next") as held:
        return time.monotonic(), held.fence


class Watch:
    """Reads the row consistently every few milliseconds, recording its holders' users."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.seen: list[list[str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="watch")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            row = lock_rows.get(self.resource)
            self.seen.append(sorted(h.user_id for h in row.holders.values()) if row else [])
            time.sleep(0.01)

    def done(self) -> list[list[str]]:
        self.stop.set()
        self.thread.join(10)
        return self.seen


class Line:
    """A holder, then the leaver in line (a process of its own, which gives up after
    ``leave_after`` seconds and lives on), then the next waiter behind it (a thread here)."""

    def __init__(
        self, endpoint: str, lock_table: str, resource: str, leave_after: float, how: str = "wait"
    ):
        self.resource = resource
        self.holder = semaphore(resource, user="holder").acquire()
        self.left = SPAWN.Queue()
        self.leaver = SPAWN.Process(
            target=workers.give_up_waiting,
            args=(endpoint, lock_table, resource, leave_after, LEAVER_LEASE, 40, self.left, how),
        )
        self.leaver.start()
        _wait_for_queue(resource, 1)
        self.out: dict[str, Any] = {}
        self.next = _in_thread("next", self.out, lambda: _next_in_line(resource))
        _wait_for_queue(resource, 2)
        self.gave_up: tuple[str, float] | None = None

    def wait_for_leaver(self) -> None:
        """Until the leaver gave up (its last look at the row included)."""
        if self.gave_up is None:
            self.gave_up = self.left.get(timeout=60)

    def check(self, watch: Watch, released: float) -> None:
        """``released``: when the hand-over write was sent."""
        self.next.join(NEXT_WAIT + 30)
        seen = watch.done()
        self.wait_for_leaver()
        self.leaver.terminate()
        self.leaver.join(10)
        assert self.gave_up is not None and self.gave_up[0] == "busy", self.gave_up
        # The hazard happened: the waiter that had left was made the holder.
        assert ["leaver"] in seen, "the hand-over never reached the waiter that left"
        # Never two holders of the exclusive lock.
        assert all(len(users) <= 1 for users in seen), [u for u in seen if len(u) > 1]
        got = self.out["next"]
        assert isinstance(got, tuple), f"the next waiter never got the lock: {got!r}"
        assert got[0] - released < BOUND, (
            f"the lock sat with the waiter that had left for {got[0] - released:.1f} s"
        )
        assert got[1] > self.holder.fence


@pytest.mark.parametrize("how", ["wait", "cancel"])
def test_a_stale_read_of_the_line_does_not_idle_the_lock_for_a_lease(
    dynamodb_local, lock_table, no_push, monkeypatch, how
):
    # The releaser's eventually consistent read of the line is served as it was before the
    # leaver deleted its entry (as AWS may for about a second). The leaver's wait ran out, or
    # its task was cancelled (an async waiter whose client went away).
    resource = f"heirs:stale-read-{how}"
    line = Line(dynamodb_local, lock_table, resource, leave_after=LEAVE_AFTER, how=how)
    holder = line.holder
    holder.renew()
    row = lock_rows.get(resource)
    assert row is not None
    before = queue_entries.load_entries(row, consistent=False)  # both in line
    assert [w.user_id for w in before.entries or ()] == ["leaver", "next"]
    line.wait_for_leaver()
    assert len(queue_of(resource)) == 1
    load = queue_entries.load_entries
    served: list[bool] = []

    def stale(item: Any, upto: Any = None, *, consistent: bool = True, known: Any = None) -> Any:
        if not consistent and not served:
            served.append(True)  # the release's read only
            return before
        return load(item, upto, consistent=consistent, known=known)

    monkeypatch.setattr(queue_entries, "load_entries", stale)
    watch = Watch(resource)
    released = time.monotonic()
    holder.release()
    assert served, "the release never read the line eventually consistently"
    line.check(watch, released)


def test_a_hand_over_write_landing_after_the_waiter_left_does_not_idle_the_lock(
    dynamodb_local, lock_table, no_push, monkeypatch
):
    # The releaser reads the line (consistently: the leaver is still in it), then its write
    # is slow: it lands after the leaver gave up and made its last look at the row.
    resource = "heirs:slow-write"
    line = Line(dynamodb_local, lock_table, resource, leave_after=LEAVE_AFTER)
    build = lock_writes.hand_over
    releaser = threading.current_thread()
    slowed: list[bool] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is releaser and not slowed:
            slowed.append(True)
            line.wait_for_leaver()
            time.sleep(0.3)
            sent.append(time.monotonic())
        return build(*args, **kwargs)

    sent: list[float] = []
    monkeypatch.setattr(lock_writes, "hand_over", slow)
    watch = Watch(resource)
    line.holder.release()
    assert slowed and sent, "the release handed nothing over"
    line.check(watch, sent[0])


def test_a_waiter_that_left_while_another_held_looks_once_more_and_no_more(no_push, requests_sent):
    # What the late look costs: one consistent read of the row (1 RCU) per waiter that gives
    # up while a hand-over to it may still land, LATE_LOOK seconds after it left.
    resource = "heirs:cost"
    holder = semaphore(resource, user="holder").acquire()
    with pytest.raises(SemaphoreBusy):
        semaphore(resource, fair=True, wait=1.0, user="leaver").acquire()
    left = requests_sent.calls["GetItem"]
    time.sleep(wakeup.LATE_LOOK + 1.0)
    assert requests_sent.calls["GetItem"] - left == 1, requests_sent.calls
    row = lock_rows.get(resource)
    assert row is not None and [h.user_id for h in row.holders.values()] == ["holder"]
    holder.release()
