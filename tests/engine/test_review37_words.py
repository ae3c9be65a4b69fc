"""A seventh review: the hand-over's words between processes and hosts, and what a waiter
trusts of them (push, handover, late_handover, resend, the wake-up side of queue).

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import hold, push
from dynasem._engine.queue import Pace
from dynasem._storage import dynamodb, lock_rows, queue_entries
from tests.support.faults import Faults
from tests.support.helpers import queue_of, wait_for


@pytest.fixture
def faults(lock_table: str) -> Iterator[Faults]:
    with Faults(dynamodb.get_client()) as f:
        yield f


def _waiter(resource: str, out: dict[str, Any], **kwargs: Any) -> threading.Thread:
    """A thread that takes ``resource`` and gives it back at once; ``out["acquired"]``: when
    it held (monotonic)."""

    def run() -> None:
        try:
            with semaphore(resource, **kwargs):
                out["acquired"] = time.monotonic()
        except Exception as exc:  # reported to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.kind_engine_only("loses one write's answer after the engine applied it")
@pytest.mark.parametrize(
    ("shared", "retries_throttled"),
    [(False, False), (False, True), (True, False)],
    ids=["hand-over", "hand-over-unanswered", "plain-release"],
)
def test_a_release_applied_whose_answer_was_lost_still_wakes_the_next_waiter(
    faults: Faults, monkeypatch: pytest.MonkeyPatch, shared: bool, retries_throttled: bool
) -> None:
    """The release's write is applied, its answer lost; botocore sends it again, which is
    refused: our token is gone (our own write, ``_released_by`` says). Before the mend the
    release ended there: the heir an exclusive holder had just handed the lock to (or, after
    a reader's plain release, the writer first in line for the lock it left free) was pushed
    nothing, and the lock stood idle, held by
    a live waiter that did not know it, until that waiter's next paced look (here 20 s;
    up to about a second by default). The same when botocore's retries of the hand-over are
    throttled (``hand-over-unanswered``): the plain release that follows is refused. The
    refusal carries the row as our write left it: the release now pushes it, as it pushes the
    answer it did not get."""
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)  # only a push wakes the waiter
    resource = "review37:lost-release-answer"
    holder = semaphore(resource, user="holder", lease=30, shared=shared).acquire()
    out: dict[str, Any] = {}
    thread = _waiter(resource, out, user="heir", wait=30, lease=30)
    wait_for(lambda: queue_of(resource), 10, "the waiter never put its entry")
    holder.renew()  # its answer shows the holder the queue: it hands over, or pushes
    lose = faults.lose_response("UpdateItem", 1)
    if retries_throttled:
        faults.throttle("UpdateItem", 3, after=1)
    holder.release()
    assert lose.fired == 1
    thread.join(5)
    woken = "acquired" in out
    thread.join(30)  # its own look finds the hold at last: let it end either way
    assert "error" not in out, out
    assert woken, "the waiter handed the lock was not told: it sat idle until its look"
    row = lock_rows.get(resource)
    assert row is not None and not row.holders


def test_a_hand_over_to_a_waiter_of_ours_that_left_never_raises_into_the_release(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release read the line while a waiter of its own process was still in it; the
    waiter left before the hand-over landed (its wait over). The push reaches it in this very
    process (``push.push`` hands it over directly), and its give-back starts a thread of its
    own (``_Slot.stray``). A process that cannot start one more thread (a container's pids
    limit: the heartbeat's scheduler allows for it) made ``Thread.start`` raise inside the
    releaser's push, and so out of ``release()`` (a ``with`` block's exit), though the
    release was done: a push is best effort and must never fail its sender. The late look
    (whose thread the scheduler starts, or tries again) hands the lock on instead."""
    resource = "review37:stray-thread"
    holder = semaphore(resource, user="holder", lease=30).acquire()
    out: dict[str, Any] = {}
    monkeypatch.setattr(hold, "queued_behind", lambda row, waiter: False)  # an entry, no word
    thread = _waiter(resource, out, user="leaver", wait=1.0, lease=30)
    wait_for(lambda: queue_of(resource), 10, "the waiter never put its entry")
    # The release's read of the line, taken while the waiter was still in it.
    row = lock_rows.get(resource)
    assert row is not None
    holder._row = queue_entries.load_entries(row)
    thread.join(10)
    assert isinstance(out.get("error"), SemaphoreBusy), out
    start = threading.Thread.start

    def no_more_threads(self: threading.Thread) -> None:
        if self.name == "dynasem-stray":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", no_more_threads)
    holder.release()  # hands the lock to the leaver, as its read showed it: must not raise
    assert holder.released and not holder.lost
    # Handed on by the leaver's late look (2 s after it left): free again, or to a newcomer.
    semaphore(resource, user="next", wait=10).acquire().release()


def _in_a_child_forked_holding(lock: Any, work: Any) -> str:
    """Fork (Python's at-fork hooks run) while ``lock`` is held, as by another thread of this
    process at that moment; ``work()`` in the child, which answers what it returned, or its
    exception, or nothing if it hung (an alarm ends it)."""
    read, write = os.pipe()
    with lock:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fork() of a process with threads
            child = os.fork()
        if child == 0:  # the child, its copy of the lock held by no thread of its own
            try:
                os.close(read)
                signal.alarm(20)
                try:
                    answer = str(work()).encode()
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    answer = type(exc).__name__.encode()
                os.write(write, answer)
            finally:
                os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 30)
    answer = (os.read(read, 256).decode() if ready else "") or "hung"
    os.close(read)
    os.waitpid(child, 0)
    return answer


def test_a_child_forked_while_a_word_was_being_passed_on_can_take_a_lock(lock_table: str) -> None:
    """``os.fork()`` while another thread of the parent held the module's lock of words
    (``push._words_lock``: the listener thread hearing a word, a releaser passing words on
    to its heir, a hold registering). The at-fork hook replaced the listener's lock, not
    that one: the child's copy stayed locked for good, and the child's first exclusive
    acquire (``hold.acquired`` registers the hold for words: ``push.holding``) hung forever,
    its lock taken and renewed for nobody."""

    def take() -> str:
        semaphore("review37:fork-words", user="child", wait=5).acquire().release()
        return "acquired"

    assert _in_a_child_forked_holding(push._words_lock, take) == "acquired"


def test_a_child_forked_inside_a_block_queues_behind_its_parent_without_telling_it(
    lock_table: str,
) -> None:
    """A child forked inside a block (a worker pool started by the job the lock guards)
    queues for the same lock, behind its parent's hold. Its word for the holder went to the
    child's copy of the parent's hold (``push.holds`` came along with the fork): useless to
    the parent, and deadly when a thread of the parent held that hold's line lock at the
    fork (a renewal's answer being observed, a word heard): the child's acquire hung
    forever in ``Held.heard_of``. A copy of another process's hold hears no word now."""
    resource = "review37:fork-line"
    with semaphore(resource, user="parent", lease=30) as held:

        def wait_behind() -> str:
            try:
                semaphore(resource, user="child", wait=1, lease=30).acquire().release()
            except SemaphoreBusy:
                return "busy"
            return "acquired"

        answer = _in_a_child_forked_holding(held._row_lock, wait_behind)
    assert answer == "busy", f"the child's acquire behind its parent: {answer}"
