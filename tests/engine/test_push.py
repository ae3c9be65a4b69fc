"""Hand-over pushes: a releasing holder tells the waiter it handed the lock to, at once."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from dynasem import SemaphoreBusy, semaphore
from dynasem import _clock as clock
from dynasem._engine import handover, hold, queue
from dynasem._engine import push as wakeup
from dynasem._engine.hold import WAKE_AFTER
from dynasem._engine.queue import Pace
from dynasem._observability.logs import shown_token
from dynasem._storage import lock_rows, queue_entries, records
from tests.support.helpers import dynasem_settings, queue_of

# A pushed waiter's wake-up, timed from the release: the release's write, the push, then the
# waiter's own write (a plain release's take, or its release), each a DynamoDB Local round trip
# that takes a few ms on an idle machine but up to a second on CI's (two cores ~90 % busy, the
# JVM among the busy). What the bound tells apart is a push from a look: every test using it
# puts the paced looks 20 s away (Pace.turn_in), and the holder's lease (10 s, the test
# settings) ends later than this too, so a waiter not pushed is not woken within it.
PUSHED_WITHIN = 3.0


def waiter_thread(resource: str, out: dict, **kwargs) -> threading.Thread:
    def run() -> None:
        try:
            with semaphore(resource, **kwargs) as held:
                out["acquired"] = time.monotonic()
                out["fence"] = held.fence
        except Exception as exc:  # reported to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_until_queued(resource: str, n: int = 1, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        queue = queue_of(resource)
        if len(queue) >= n:
            return queue
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.02)


@pytest.mark.kind_engine_only(
    "counts a pushed waiter's requests and times its wake-up against a kind engine"
)
@pytest.mark.parametrize("holder_knows", [True, False], ids=["hand-over", "plain-release"])
@pytest.mark.parametrize("path", ["in-process", "datagram"])
def test_a_pushed_waiter_reads_nothing(lock_table, requests_sent, holder_knows, path, monkeypatch):
    # Paced looks far away: whatever brings the waiter its hold now is the push.
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    if path == "datagram":
        monkeypatch.setattr(wakeup, "IN_PROCESS", False)
    else:  # no datagram could reach the waiter: only the direct hand-over can
        monkeypatch.setattr(wakeup, "reachable", lambda address: None)
    if not holder_knows:  # as a waiter of another process: the holder is not told it queued
        monkeypatch.setattr(hold, "queued_behind", lambda row, waiter: None)
    holder = semaphore("deploy:prod").acquire()
    out: dict = {}
    thread = waiter_thread("deploy:prod", out, wait=30)  # default mode: it queues to be pushed
    queue = wait_until_queued("deploy:prod")
    (entry,) = queue.values()
    assert entry.address.startswith(wakeup.HOST_ID + "@127.0.0.1:")
    if holder_knows:
        holder.renew()  # its answer shows the holder the queue: it hands over on release
    else:
        # A release looks for waiters it did not know of only after a hold this long (a
        # shorter one spares the uncontended path the decoding of the item).
        time.sleep(WAKE_AFTER)
    requests_sent.reset()
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert "error" not in out
    # No read, and no paced look waited for: handed over, the waiter holds by the push alone
    # (the hand-over, then its release); after a plain release, the push tells it the lock
    # is free and it takes it in one write.
    assert requests_sent.calls["GetItem"] == 0
    assert requests_sent.calls["UpdateItem"] == (2 if holder_knows else 3)
    assert out["acquired"] - released < PUSHED_WITHIN
    assert out["fence"] > holder.fence
    assert (lock_rows.get_item("deploy:prod") or {}).get("holders") == {}


@pytest.mark.kind_engine_only("counts the requests of a hand-over")
@pytest.mark.parametrize("gives_up", [False, True], ids=["waits", "gives-up"])
def test_a_waiter_of_the_holders_own_process_is_handed_the_lock_in_one_write(
    lock_table, requests_sent, gives_up, monkeypatch
):
    # Paced looks far away: whatever brings the waiter its hold now is the push.
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    told = threading.Event()
    queued_behind = hold.queued_behind

    def telling(row, waiter):  # the waiter's thread tells the holder, then we go on
        queued_behind(row, waiter)
        told.set()

    monkeypatch.setattr(hold, "queued_behind", telling)
    holder = semaphore("deploy:own").acquire()  # a short hold: no release looks for waiters
    out: dict = {}
    thread = waiter_thread("deploy:own", out, wait=0.5 if gives_up else 30)
    assert told.wait(10)
    if gives_up:
        # Its wait ends before the release: the holder must not hand it the lock from what
        # it was told (nobody would use it until the hand-back comes).
        thread.join(10)
        assert isinstance(out.get("error"), SemaphoreBusy)
    requests_sent.reset()
    holder.release()
    thread.join(10)
    row = lock_rows.get_item("deploy:own") or {}
    if gives_up:
        # Given back to nobody: not handed over (a hand-over draws a larger fence).
        assert row.get("holders") == {} and row.get("fence") == holder.fence
        return
    assert "error" not in out and out["fence"] > holder.fence
    # The release's one write handed it over (not a release refused for a waiter it did not
    # know of, then a read of the queue), and the waiter's own release: two writes. (The
    # waiter may have looked at the row once since it queued.)
    assert requests_sent.calls["UpdateItem"] == 2 and requests_sent.calls["Query"] == 0
    assert row.get("holders") == {}


def _telling(monkeypatch) -> threading.Event:
    """Set once a waiter has told the holder it queued (or found it could not)."""
    told = threading.Event()
    queued_behind = hold.queued_behind

    def telling(row, waiter):
        heard = queued_behind(row, waiter)
        told.set()
        return heard

    monkeypatch.setattr(hold, "queued_behind", telling)
    return told


@pytest.mark.kind_engine_only("counts the requests of a hand-over")
@pytest.mark.parametrize("defer", [3.0, 0.0], ids=["deferred", "not-deferred"])
def test_a_waiter_that_told_the_holder_puts_no_entry_if_its_turn_comes_first(
    lock_table, requests_sent, defer, monkeypatch
):
    # A turn within ENTRY_DEFER of the join costs no entry item: the ticket and the
    # hand-over are the contended acquisition's two writes. (Not deferred: one put more.)
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    monkeypatch.setattr(queue, "ENTRY_DEFER", defer)
    told = _telling(monkeypatch)
    holder = semaphore("deploy:soon").acquire()
    requests_sent.reset()
    out: dict = {}
    thread = waiter_thread("deploy:soon", out, wait=30)
    assert told.wait(10)
    if not defer:
        wait_until_queued("deploy:soon")  # (a Query of the test's own)
    queries = requests_sent.calls["Query"]
    holder.release()
    thread.join(10)
    assert "error" not in out and out["fence"] > holder.fence
    assert requests_sent.calls["PutItem"] == (0 if defer else 1)
    assert requests_sent.calls["Query"] == queries  # handed over from the word


@pytest.mark.kind_engine_only("times when the entry item appears")
def test_a_waiter_that_told_the_holder_puts_its_entry_once_it_has_waited_a_while(
    lock_table, monkeypatch
):
    monkeypatch.setattr(queue, "ENTRY_DEFER", 0.3)
    holder = semaphore("deploy:later").acquire()
    out: dict = {}
    started = time.monotonic()
    thread = waiter_thread("deploy:later", out, wait=30, user="waiter")
    (entry,) = wait_until_queued("deploy:later").values()
    # Not before ENTRY_DEFER from its join: the holder heard of it by its word till then.
    assert time.monotonic() - started >= 0.3
    assert entry.user_id == "waiter" and entry.address
    holder.release()
    thread.join(10)
    assert "error" not in out and out["fence"] > holder.fence


@pytest.mark.kind_engine_only("counts the requests of a hand-over")
def test_a_release_that_reads_the_queue_takes_the_words_for_entries_not_put_yet(
    lock_table, requests_sent, monkeypatch
):
    from dynasem._engine import handover
    from dynasem._storage import queue_entries

    # The line the word started is never fresh enough, so the release reads the queue; the
    # waiter's entry is not there (it would be put only after ENTRY_DEFER). The word stands
    # in for it: handed over at once, not after the wait for a missing entry (JOIN_GRACE).
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    monkeypatch.setattr(handover, "LINE_FRESH", -1.0)
    monkeypatch.setattr(queue, "ENTRY_DEFER", 3.0)  # < LEASE / 2
    told = _telling(monkeypatch)
    holder = semaphore("deploy:words").acquire()
    out: dict = {}
    thread = waiter_thread("deploy:words", out, wait=30)
    assert told.wait(10)
    requests_sent.reset()
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert "error" not in out and out["fence"] > holder.fence
    assert out["acquired"] - released < queue_entries.JOIN_GRACE
    assert requests_sent.calls["Query"] >= 1 and requests_sent.calls["PutItem"] == 0


def test_a_waiter_that_leaves_before_its_entry_was_put_leaves_a_dead_one(lock_table, monkeypatch):
    from dynasem._storage import queue_entries

    monkeypatch.setattr(queue, "ENTRY_DEFER", 3.0)  # < LEASE / 2
    holder = semaphore("deploy:left").acquire()
    out: dict = {}
    waiter_thread("deploy:left", out, wait=0.2).join(10)  # a thread: not a nested acquire
    assert isinstance(out.get("error"), SemaphoreBusy)
    row = lock_rows.get("deploy:left")
    assert row is not None
    (entry,) = queue_entries.queue_entries(row)
    assert entry.ticket == row.queue_in and entry.expires_ms == 0  # passed without a wait
    holder.release()
    row = lock_rows.get("deploy:left")
    assert row is not None and row.holders == {} and row.fence == holder.fence  # no hand-over


@pytest.mark.kind_engine_only("counts the requests of a hand-over")
def test_a_waiter_tells_the_holder_it_handed_the_lock_to_by_datagram(
    lock_table, requests_sent, monkeypatch
):
    # Two processes taking turns, played by threads of this one whose words all go by
    # datagram: the first releaser handed the lock to the holder, so it knows where the
    # holder listens, and its waiter queued behind that holder tells it so.
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    monkeypatch.setattr(wakeup, "IN_PROCESS", False)
    heard = threading.Event()
    hear = wakeup._Listener._heard

    def hearing(listener, message, arrived):
        hear(listener, message, arrived)
        heard.set()

    monkeypatch.setattr(wakeup._Listener, "_heard", hearing)
    first = semaphore("deploy:turns").acquire()
    holding, done = threading.Event(), threading.Event()

    def hold_until_done() -> None:
        with semaphore("deploy:turns", wait=30):
            holding.set()
            done.wait(10)

    holder = threading.Thread(target=hold_until_done)
    holder.start()
    wait_until_queued("deploy:turns")
    first.renew()  # its answer shows it the queue: it hands over on release
    first.release()
    assert holding.wait(10)
    out: dict = {}
    thread = waiter_thread("deploy:turns", out, wait=30)
    assert heard.wait(10)
    requests_sent.reset()
    done.set()
    holder.join(10)
    thread.join(10)
    assert "error" not in out
    # The holder's release handed over in its one write (not a release refused for a waiter
    # it did not know of, then a read of the queue); then the waiter's own release.
    assert requests_sent.calls["UpdateItem"] == 2 and requests_sent.calls["Query"] == 0
    assert (lock_rows.get_item("deploy:turns") or {}).get("holders") == {}


def _chain(resource: str, requests_sent, n: int) -> list[str]:
    """A holder, then ``n`` waiters queued one after another, each giving the lock back at
    once: who held it, in order, once the holder released (the queue read before it)."""
    holder = semaphore(resource).acquire()
    order: list[str] = []
    threads = []
    for i in range(n):

        def run(name: str = f"w{i}") -> None:
            with semaphore(resource, wait=30):
                order.append(name)

        threads.append(threading.Thread(target=run))
        threads[-1].start()
        wait_until_queued(resource, i + 1)
    holder.renew()  # its answer shows the holder the queue: it hands over on release
    requests_sent.reset()
    holder.release()
    for thread in threads:
        thread.join(10)
    return order


@pytest.mark.kind_engine_only("counts the queue reads of a chain of hand-overs")
def test_a_hand_over_passes_the_line_on_and_the_next_hand_overs_read_nothing(
    lock_table, requests_sent, monkeypatch
):
    # Paced looks far away: only pushes move the line.
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    # The line the holder heard is trusted whatever its age: it dates from the first word,
    # and queueing three waiters one after another took more than LINE_FRESH (1 s) on two
    # loaded cores (a read then, rightly: test_a_line_passed_on_is_not_trusted_once_it_is_old).
    monkeypatch.setattr(handover, "LINE_FRESH", 600.0)
    order = _chain("deploy:line", requests_sent, 3)
    assert order == ["w0", "w1", "w2"]  # first come, first served
    # The holder heard each waiter's word (kept across its renewal) and handed over from
    # that line, which it pushed on with its hand-over: w0 and w1 handed over from it; w2
    # had nobody after it. Nobody read the queue.
    assert requests_sent.calls["Query"] == 0
    assert requests_sent.calls["GetItem"] == 0
    assert (lock_rows.get_item("deploy:line") or {}).get("holders") == {}


def _words_heard(monkeypatch) -> Callable[[str, set[str], float], None]:
    """``wait(token, users, timeout)``: until the hold ``token`` has been told
    (``Held.heard_of``) of a waiter of each of ``users``."""
    heard: dict[str, set[str]] = {}
    changed = threading.Condition()
    heard_of = hold.Held.heard_of

    def hearing(held, row, waiter, *, sent=None):
        told = heard_of(held, row, waiter, sent=sent)
        with changed:
            heard.setdefault(held.token, set()).add(waiter.user_id)
            changed.notify_all()
        return told

    monkeypatch.setattr(hold.Held, "heard_of", hearing)

    def wait(token: str, users: set[str], timeout: float) -> None:
        with changed:
            changed.wait_for(lambda: users <= heard.get(token, set()), timeout)

    return wait


@pytest.mark.kind_engine_only("counts the queue reads of contenders taking turns")
@pytest.mark.parametrize("path", ["in-process", "datagram"])
def test_contenders_taking_turns_tell_the_holder_and_nobody_reads_the_queue_again(
    lock_table, requests_sent, path, monkeypatch
):
    # Paced looks far away: only pushes and words move the line.
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    # The line is trusted for the whole ring: 15 turns on a loaded machine took more than
    # LINE_FRESH (1 s), and a line that old is read again, rightly (its own test:
    # test_a_line_passed_on_is_not_trusted_once_it_is_old); up to 6 reads in 8 runs.
    monkeypatch.setattr(handover, "LINE_FRESH", 600.0)
    if path == "datagram":
        monkeypatch.setattr(wakeup, "IN_PROCESS", False)
    heard = _words_heard(monkeypatch)
    load, reads = queue_entries.load_entries, []

    def reading(*args, **kwargs):
        reads.append(threading.current_thread().name)
        return load(*args, **kwargs)

    monkeypatch.setattr(queue_entries, "load_entries", reading)
    holder = semaphore("deploy:ring").acquire()
    order: list[str] = []
    threads = []
    for i in range(3):

        def run(name: str = f"w{i}") -> None:
            for _ in range(5):
                # A long lease: the line carries each waiter's entry end as read or told; an
                # entry seen ended (10 s after it was written, on a machine slow enough) is
                # read again, rightly, and counted below.
                with semaphore("deploy:ring", wait=30, lease=60, user=name) as held:
                    order.append(name)
                    # Held until the one released before us, if it has turns left, queued
                    # again and told us (a datagram's word can come after a short hold's
                    # release, and the line runs out: a read, as it should); the others
                    # are in the line our hand-over brought. A word that never comes leaves
                    # the read counted below.
                    before = order[-2] if len(order) > 1 else name
                    if before != name and order.count(before) < 5:
                        heard(held.token, {before}, 10.0)

        threads.append(threading.Thread(target=run))
        threads[-1].start()
        wait_until_queued("deploy:ring", i + 1)
    holder.renew()  # its answer shows the holder the queue: it hands over on release
    requests_sent.reset()
    holder.release()
    for thread in threads:
        thread.join(60)
    assert order == ["w0", "w1", "w2"] * 5  # first come, first served, every turn
    # The first release read the line, or handed over from the words it heard (in this
    # process they name the whole line while it is fresh); every waiter that queued again
    # told the holder it queued behind, which handed the lock on with it: the line never
    # ran out, and no contender read the queue.
    assert [name for name in reads if name != threading.current_thread().name] == []
    assert requests_sent.calls["Query"] <= 1, reads  # (ci105: 2, reads not shown)
    assert (lock_rows.get_item("deploy:ring") or {}).get("holders") == {}


@pytest.mark.kind_engine_only("counts the queue reads of a chain of hand-overs")
def test_a_line_passed_on_is_not_trusted_once_it_is_old(lock_table, requests_sent, monkeypatch):
    from dynasem._engine import handover

    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    monkeypatch.setattr(handover, "LINE_FRESH", 0.0)  # every line is too old by the time it is used
    order = _chain("deploy:old-line", requests_sent, 3)
    assert order == ["w0", "w1", "w2"]
    # Each hand-over read the line itself: the holder's, w0's and w1's.
    assert requests_sent.calls["Query"] == 3


def _two_waiters_behind(held):
    """The row ``held`` took, in a queue of its own, as the tickets of two waiters behind it
    left it, and those two waiters (``w1`` first), for words told by hand."""
    import dataclasses

    row = held._row
    assert row is not None
    held._row = row = dataclasses.replace(row, queue_id=row.queue_id or 7)
    row = dataclasses.replace(row, queue_in=row.queue_out + 2)
    now = clock.now_ms()
    first, second = (
        records.Waiter(
            ticket=row.queue_out + n, expires_ms=now + 10_000, user_id=f"w{n}", token=f"t{n}" * 16
        )
        for n in (1, 2)
    )
    return row, first, second


def test_a_word_held_up_on_its_way_makes_the_line_it_joins_as_old_as_itself(
    lock_table, monkeypatch
):
    """A line is trusted without a read for LINE_FRESH from its oldest news: a word sent long
    ago (a datagram held up, a word passed on late) that joins a line a fresh word began
    leaves it that old, and the release reads the queue rather than hand over from it."""

    from dynasem._engine import handover
    from dynasem._storage import queue_entries

    held = semaphore("deploy:old-word", user="holder").acquire()
    row, first, second = _two_waiters_behind(held)
    held.heard_of(row, second, sent=clock.monotonic())  # fresh: the line begins now
    held.heard_of(row, first, sent=clock.monotonic() - 10 * handover.LINE_FRESH)  # held up
    reads: list[bool] = []
    load = queue_entries.load_entries

    def counted(*args, **kwargs):
        reads.append(kwargs.get("consistent", True))
        return load(*args, **kwargs)

    monkeypatch.setattr(queue_entries, "load_entries", counted)
    try:
        heirs, *_ = handover.heirs_of(held._row, held.token)
        assert reads, "handed over from a line older than LINE_FRESH without a read"
        assert [w.user_id for _, w in heirs] == ["w1"]  # the words stand in for entries
    finally:
        monkeypatch.undo()
        held._row = None
        held.release()


def test_two_words_heard_at_once_both_join_the_line(lock_table, monkeypatch):
    """Two waiters' words reach a hold at the same moment, in two threads (the listener's
    datagram and a waiter of this process telling it itself). Each read the line, added its
    waiter and wrote the line back: the second write dropped the first one's waiter, and the
    release, finding a gap before its heir, read the queue (a round trip and a read unit)
    where it could have handed over at once (found by review). Here the word of ticket 2
    pauses between its read and its write while the word of ticket 1 is heard."""
    import dataclasses

    from dynasem._engine import handover
    from dynasem._storage import queue_entries

    held = semaphore("deploy:two-words", user="holder").acquire()
    row, first, second = _two_waiters_behind(held)
    paused, heard_first = threading.Event(), threading.Event()

    class Pausing:
        def __getattr__(self, name):
            return getattr(dataclasses, name)

        def replace(self, obj, **changes):
            if threading.current_thread().name == "second" and not paused.is_set():
                paused.set()
                heard_first.wait(1.0)  # a word heard meanwhile (or, kept out, after)
            return dataclasses.replace(obj, **changes)

    monkeypatch.setattr(hold, "dataclasses", Pausing())
    late = threading.Thread(target=held.heard_of, args=(row, second), name="second")
    late.start()
    assert paused.wait(5)
    early = threading.Thread(target=held.heard_of, args=(row, first), name="first")
    early.start()
    early.join(0.5)
    heard_first.set()
    late.join(5)
    early.join(5)
    monkeypatch.undo()
    reads: list[object] = []
    load = queue_entries.load_entries

    def counted(*args, **kwargs):
        reads.append(args)
        return load(*args, **kwargs)

    monkeypatch.setattr(queue_entries, "load_entries", counted)
    try:
        heirs, *_ = handover.heirs_of(held._row, held.token)
        assert [w.user_id for _, w in heirs] == ["w1"]
        assert reads == [], "a word was lost: the line had a gap before its heir"
    finally:
        monkeypatch.undo()
        held._row = None
        held.release()


@pytest.mark.kind_engine_only("times a chain of hand-overs")
def test_a_line_too_old_to_hand_over_from_still_stands_in_for_entries_not_put(
    lock_table, requests_sent, monkeypatch
):
    from dynasem._engine import handover
    from dynasem._storage import queue_entries

    # Every line is too old to hand over from without a read; the waiters told the holder
    # and put no entries (they would come 3 s later). Each release reads the queue and
    # takes the words of the line it was pushed, however old, for the missing entries.
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    monkeypatch.setattr(handover, "LINE_FRESH", 0.0)
    monkeypatch.setattr(queue, "ENTRY_DEFER", 3.0)  # < LEASE / 2
    told = _telling(monkeypatch)
    holder = semaphore("deploy:old-words").acquire()
    order: list[str] = []
    threads = []
    for i in range(3):

        def run(name: str = f"w{i}") -> None:
            with semaphore("deploy:old-words", wait=30):
                order.append(name)

        told.clear()
        threads.append(threading.Thread(target=run))
        threads[-1].start()
        assert told.wait(10)
    requests_sent.reset()
    released = time.monotonic()
    holder.release()
    for thread in threads:
        thread.join(10)
    assert order == ["w0", "w1", "w2"]
    assert time.monotonic() - released < queue_entries.JOIN_GRACE  # no wait for an entry
    assert requests_sent.calls["PutItem"] == 0 and requests_sent.calls["Query"] == 3


def test_a_lost_push_costs_a_read_not_the_lock(lock_table, monkeypatch):
    monkeypatch.setattr(wakeup, "push", lambda *a, **k: False)
    holder = semaphore("deploy:stage").acquire()
    out: dict = {}
    thread = waiter_thread("deploy:stage", out, wait=30)
    wait_until_queued("deploy:stage")
    holder.release()
    thread.join(15)
    assert "error" not in out and "acquired" in out


def test_a_forged_push_is_ignored(lock_table):
    holder = semaphore("deploy:qa").acquire()
    out: dict = {}
    thread = waiter_thread("deploy:qa", out, wait=2)
    queue = wait_until_queued("deploy:qa")
    ((token, entry),) = queue.items()
    host, port = wakeup.reachable(entry.address)
    # Everything a real push says, signed with another key: the waiter must not believe it.
    item = lock_rows.get_item("deploy:qa")
    item["holders"] = {token: {"u": "", "e": 2**42, "f": holder.fence + 1, "a": 0, "s": False}}
    body = json.dumps({"r": "deploy:qa", "k": token, "i": item}).encode()
    mac = hmac.new(b"not the project's key", body, hashlib.sha256).digest()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(mac + body, (host, port))
        sock.sendto(b"garbage", (host, port))  # and the listener survives garbage
    thread.join(10)
    assert "acquired" not in out  # it gave up after its wait: the lock was never free
    assert type(out["error"]).__name__ == "SemaphoreBusy"
    assert wakeup._listener is not None and wakeup._listener.thread.is_alive()
    holder.release()
    assert not queue_of("deploy:qa")  # it left the queue


def test_pushes_off_means_polling_as_before(dynamodb_local, lock_table):
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH=None)):
        assert (
            wakeup.expect("x", "t", lease=10, skew=0.5, now_ms=clock.now_ms) is None
            and not wakeup.available()
        )
        holder = semaphore("deploy:dev").acquire()
        out: dict = {}
        thread = waiter_thread("deploy:dev", out, wait=30)
        time.sleep(0.3)
        assert not queue_of("deploy:dev")  # default mode polls
        holder.release()
        thread.join(15)
        assert "error" not in out and "acquired" in out


def test_only_the_same_host_is_pushed_to_on_loopback():
    here = f"{wakeup.HOST_ID}@127.0.0.1:4000"
    assert wakeup.reachable(here) == ("127.0.0.1", 4000)
    assert wakeup.reachable("0123456789ab@127.0.0.1:4000") is None  # another host's loopback
    assert wakeup.reachable("0123456789ab@10.1.2.3:4000") == ("10.1.2.3", 4000)
    for bad in (None, 7, "", "no-at-sign", "h@10.1.2.3", "h@10.1.2.3:port"):
        assert wakeup.reachable(bad) is None
        assert wakeup.push(bad, "r", "t", records.LockItem(), sent_ms=0) is False


def test_a_push_that_would_not_fit_a_datagram_is_not_sent():
    big = records.lock_item({"holders": {str(i): {"u": "x" * 100} for i in range(1000)}})
    assert wakeup.push(f"{wakeup.HOST_ID}@127.0.0.1:9", "r", "t", big, sent_ms=0) is False


def test_an_address_it_cannot_listen_on_is_a_warning_not_a_failure(
    dynamodb_local, lock_table, caplog
):
    with override_settings(
        DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH="192.0.2.1")  # TEST-NET-1
    ):
        with caplog.at_level(logging.WARNING, logger="dynasem"):
            assert wakeup.expect("x", "t", lease=10, skew=0.5, now_ms=clock.now_ms) is None
        assert "cannot listen for hand-over pushes on 192.0.2.1" in caplog.text
        with semaphore("deploy:x", wait=1) as held:  # locking itself is unaffected
            assert held.fence > 0


@pytest.mark.parametrize(
    "value",
    [
        "localhost",
        "::1",
        "300.1.1.1",
        127,
        ["127.0.0.1"],
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.9",
    ],
)
def test_a_bad_push_setting_is_a_check_error(dynamodb_local, lock_table, value):
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH=value)):
        errors = [e for e in run_checks() if e.id == "dynasem.E010"]
    assert errors and repr(value) in errors[0].msg


@pytest.mark.parametrize("value", [None, ""])
def test_an_empty_push_setting_is_off_for_the_check_too(dynamodb_local, lock_table, value):
    # The runtime reads "" as None (no pushes: DYNASEM["PUSH"] = os.environ.get("X", "")); the
    # check refused it as no IPv4 literal, so a project passed one and failed the other.
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, PUSH=value)):
        assert [e for e in run_checks() if e.id == "dynasem.E010"] == []
        assert wakeup.settings.PUSH is None
        assert wakeup.expect("x", "t", lease=10, skew=0.5, now_ms=clock.now_ms) is None


def test_a_resource_queued_for_lately_is_joined_in_the_first_write(lock_table, requests_sent):
    first = semaphore("deploy:uat").acquire()
    go = threading.Event()
    out: dict = {}

    def hold_until_told() -> None:
        with semaphore("deploy:uat", wait=30):
            out["second"] = True
            go.wait(10)

    thread = threading.Thread(target=hold_until_told)
    thread.start()
    wait_until_queued("deploy:uat")
    first.release()
    deadline = time.monotonic() + 10
    while "second" not in out:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # This process queued for the resource a moment ago: the next acquire's first write is
    # the join (no refused take first), and it is handed the lock when the holder leaves.
    requests_sent.reset()
    third: dict = {}
    waiter = waiter_thread("deploy:uat", third, wait=30)
    wait_until_queued("deploy:uat")
    assert requests_sent.calls["UpdateItem"] == 1  # (GetItems: the test's own looks)
    go.set()
    thread.join(10)
    waiter.join(10)
    assert "acquired" in third and "error" not in third


# -- what a push may claim (issue: a waiter stalled through its hand-over) --------------------


def _listening_slot(resource: str, token: str, lease: float = 10) -> tuple[str, int]:
    address = wakeup.expect(resource, token, lease=lease, skew=0.5, now_ms=clock.now_ms)
    assert address is not None
    target = wakeup.reachable(address)
    assert target is not None
    return target


def _send(target: tuple[str, int], message: dict, secret: str | None = None) -> None:
    body = json.dumps(message).encode()
    key = wakeup._keys()[0] if secret is None else wakeup._derive(secret)
    assert key is not None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(wakeup._sign(key, body) + body, target)


def _hand_over(token: str, *, e_ms: int, fence: int, sent_ms: int, table_name: str) -> dict:
    holder = {"u": "w", "e": e_ms, "f": fence, "a": sent_ms, "s": False}
    item = {"holders": {token: holder}, "fence": fence, "expMs": e_ms}
    return {"r": "deploy:push", "k": token, "i": item, "tb": table_name, "ts": sent_ms}


@pytest.mark.parametrize("read_own", [True, False], ids=["waiter-reads", "listener-reads"])
def test_a_fresh_hand_over_push_is_taken_with_its_arrival(lock_table, monkeypatch, read_own):
    monkeypatch.setattr(wakeup, "READ_OWN", read_own)
    token = "t-fresh"
    target = _listening_slot("deploy:push", token)
    now = clock.now_ms()
    before = clock.monotonic()
    _send(target, _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=lock_table))
    pushed = wakeup.wait(token, 5, fence_above=6)
    wakeup.forget(token)
    assert pushed is not None and pushed.item.holders[token].fence == 7
    assert before <= pushed.arrived <= clock.monotonic() and pushed.sent_ms == now


def _waiting(token: str, seconds: float = 5) -> tuple[threading.Thread, dict]:
    got: dict = {}

    def run() -> None:
        got["push"] = wakeup.wait(token, seconds, fence_above=6)
        got["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def _until(condition, what: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _push_for(token: str, table_name: str) -> dict:
    now = clock.now_ms()
    return _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=table_name)


def test_a_waiting_thread_reads_its_own_push_while_the_listener_steps_aside(lock_table):
    target = _listening_slot("deploy:push", "t-own")
    listener = wakeup._listener
    thread, got = _waiting("t-own")
    # The listener thread steps aside (out of its recvfrom) for the waiter.
    _until(lambda: listener.claimed and not listener.reading, "the waiter never read itself")
    _send(target, _push_for("t-own", lock_table))
    thread.join(5)
    wakeup.forget("t-own")
    assert got["push"] is not None and got["push"].item.holders["t-own"].fence == 7
    assert not listener.claimed
    _until(lambda: listener.reading, "the listener never read the socket again")


def test_a_thread_reading_the_socket_delivers_the_pushes_of_other_waiters(lock_table):
    target = _listening_slot("deploy:push", "t-reader")
    _listening_slot("deploy:push", "t-other")
    listener = wakeup._listener
    reader, reader_got = _waiting("t-reader")
    _until(lambda: listener.claimed and not listener.reading, "the waiter never read itself")
    other, other_got = _waiting("t-other")  # the socket is taken: it waits on its event
    _send(target, _push_for("t-other", lock_table))
    other.join(5)
    assert other_got["push"] is not None and reader.is_alive()
    _send(target, _push_for("t-reader", lock_table))
    reader.join(5)
    for token in ("t-reader", "t-other"):
        wakeup.forget(token)
    assert reader_got["push"] is not None and not listener.claimed


def test_a_push_handed_over_in_this_process_wakes_a_thread_reading_the_socket(lock_table):
    _listening_slot("deploy:push", "t-local")
    listener = wakeup._listener
    thread, got = _waiting("t-local", seconds=10)
    _until(lambda: listener.claimed and not listener.reading, "the waiter never read itself")
    message = _push_for("t-local", lock_table)
    pushed = wakeup.Push(records.lock_item(message["i"]), clock.monotonic(), message["ts"])
    given = time.monotonic()
    listener.take("t-local", "deploy:push", lock_table, pushed)  # what push() does in-process
    thread.join(5)
    wakeup.forget("t-local")
    assert got["push"] is not None and got["at"] - given < 2  # nudged, not at the wait's end


def test_a_listener_that_does_not_step_aside_delivers_the_push_itself(lock_table, monkeypatch):
    target = _listening_slot("deploy:push", "t-stuck")
    listener = wakeup._listener
    _until(lambda: listener.reading, "the listener is not reading the socket")
    monkeypatch.setattr(listener, "nudge", lambda: None)  # its nudge lost
    thread, got = _waiting("t-stuck")
    time.sleep(wakeup.CLAIM_WAIT * 2)
    assert not listener.claimed  # the waiter gave the socket up to it
    _send(target, _push_for("t-stuck", lock_table))
    thread.join(5)
    wakeup.forget("t-stuck")
    assert got["push"] is not None


def test_a_timeout_left_on_the_socket_does_not_end_the_listener(lock_table, monkeypatch):
    monkeypatch.setattr(wakeup, "READ_OWN", False)  # only the listener thread reads
    target = _listening_slot("deploy:push", "t-timeout")
    listener = wakeup._listener
    _until(lambda: listener.reading, "the listener is not reading the socket")
    listener.sock.settimeout(0.05)  # as a reader's finally could fail to undo
    listener.nudge()  # its next recvfrom times out
    time.sleep(0.3)
    assert listener.thread.is_alive() and listener.sock.gettimeout() is None
    _send(target, _push_for("t-timeout", lock_table))
    pushed = wakeup.wait("t-timeout", 5, fence_above=6)
    wakeup.forget("t-timeout")
    assert pushed is not None


@pytest.mark.parametrize("path", ["in-process", "datagram"])
def test_a_hand_over_push_carries_the_line_and_its_age_unless_it_would_not_fit(
    lock_table, path, monkeypatch
):
    monkeypatch.setattr(wakeup, "IN_PROCESS", path == "in-process")
    token = "t-line"
    target = _listening_slot("deploy:push", token)
    address = f"{wakeup.HOST_ID}@{target[0]}:{target[1]}"
    now = clock.now_ms()
    message = _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=lock_table)
    item = records.lock_item(message["i"])
    line = tuple(records.Waiter(ticket=t, expires_ms=now + 5_000, token=f"w{t}") for t in (3, 4))
    # The second is too big for a datagram; a waiter of this process gets it all the same.
    big = line * 2000
    for waiters, sent in ((line, line), (big, big if path == "in-process" else ())):
        assert wakeup.push(address, "deploy:push", token, item, sent_ms=now, line=(waiters, 0.25))
        pushed = wakeup.wait(token, 5, fence_above=6)
        assert pushed is not None and pushed.item.holders[token].fence == 7
        assert pushed.line == sent  # without the line, the hand-over still goes
        # (a datagram's line is older by its time on the way, by the wall clocks)
        expected = 0.25 if sent else 0.0
        assert expected <= pushed.line_age < expected + 0.5
    wakeup.forget(token)


class _HoldHearing:
    """Stands for a hold of this process that hands over: what it was told of its line."""

    def __init__(self, resource: str, token: str):
        self.resource, self.token = resource, token
        self.heard: list[tuple[int, str, float | None]] = []

    def heard_of(self, row: records.LockItem, waiter: records.Waiter, *, sent=None) -> bool:
        self.heard.append((row.fence, waiter.token, sent))
        return True


def _line_push(token: str, table_name: str) -> tuple[records.LockItem, tuple]:
    now = clock.now_ms()
    message = _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=table_name)
    line = tuple(records.Waiter(ticket=t, expires_ms=now + 5_000, token=f"w{t}") for t in (3, 4))
    return records.lock_item(message["i"]), line


def _heard_by(hold_: _HoldHearing, n: int) -> list[tuple[int, str, float | None]]:
    deadline = time.monotonic() + 5
    while len(hold_.heard) < n:
        assert time.monotonic() < deadline, f"the hold heard {hold_.heard}"
        time.sleep(0.01)
    return hold_.heard


@pytest.mark.parametrize("path", ["in-process", "datagram"])
def test_a_line_pushed_after_its_heir_took_the_hold_itself_goes_to_that_hold(
    lock_table, path, monkeypatch
):
    """The heir took the lock on a look of its own before the hand-over's push came: the
    line the push carries (waiters whose entries may not be put yet) goes to its hold, so
    that its release hands on to them instead of waiting for their entries."""
    monkeypatch.setattr(wakeup, "IN_PROCESS", path == "in-process")
    token = "t-took-itself"
    listener = wakeup._get_listener()  # nobody waits as ``token`` here
    assert listener is not None
    address = listener.address
    item, line = _line_push(token, lock_table)
    holding = _HoldHearing("deploy:push", token)
    elsewhere = _HoldHearing("deploy:elsewhere", "t-elsewhere")
    wakeup.holding(holding)
    wakeup.holding(elsewhere)
    try:
        before = time.monotonic()
        assert wakeup.push(
            address, "deploy:push", token, item, sent_ms=clock.now_ms(), line=(line, 0.25)
        )
        heard = _heard_by(holding, 2)
        assert [(fence, who) for fence, who, _ in heard] == [(7, "w3"), (7, "w4")]
        # As of when the line was read: its age before the push was sent.
        assert all(sent is not None and sent <= time.monotonic() - 0.25 for *_, sent in heard)
        assert all(sent is not None and sent >= before - 0.25 - 0.1 for *_, sent in heard)
        # A hold of another resource is told nothing, under any token.
        assert wakeup.push(
            address, "deploy:push", "t-elsewhere", item, sent_ms=clock.now_ms(), line=(line, 0)
        )
        time.sleep(0.2)
        assert elsewhere.heard == []
    finally:
        wakeup.holds.pop(token, None)
        wakeup.holds.pop("t-elsewhere", None)


@pytest.mark.parametrize("path", ["in-process", "datagram"])
def test_a_line_pushed_while_the_heirs_own_look_made_it_holder_goes_to_its_hold(
    lock_table, path, monkeypatch
):
    """The push came while the waiter was still waiting, but its own look made it the holder
    before it took the push: the hold, as it registers, takes the line the push brought."""
    monkeypatch.setattr(wakeup, "IN_PROCESS", path == "in-process")
    token = "t-look-won"
    _listening_slot("deploy:push", token)
    slot = wakeup._listener.slots[token]
    address = wakeup._listener.address
    item, line = _line_push(token, lock_table)
    try:
        assert wakeup.push(
            address, "deploy:push", token, item, sent_ms=clock.now_ms(), line=(line, 0)
        )
        deadline = time.monotonic() + 5
        while slot.push is None:
            assert time.monotonic() < deadline, "the push never reached the waiter"
            time.sleep(0.01)
        holding = _HoldHearing("deploy:push", token)
        wakeup.holding(holding)
        assert [(fence, who) for fence, who, _ in holding.heard] == [(7, "w3"), (7, "w4")]
    finally:
        wakeup.forget(token)
        wakeup.holds.pop(token, None)


@pytest.mark.parametrize("path", ["in-process", "datagram"])
def test_a_push_to_a_waiter_that_left_once_its_wait_was_over_is_given_back(
    lock_table, path, monkeypatch
):
    """A waiter may leave the queue after its wait ended (an interrupt inside its acquire
    loop: the loop's end forgot its mailbox first): a hand-over pushed to it after it left
    still reaches its give-back, not the floor."""
    monkeypatch.setattr(wakeup, "IN_PROCESS", path == "in-process")
    token = "t-left-after"
    _listening_slot("deploy:push", token)
    wakeup.forget(token)  # its wait is over
    given: list[records.LockItem] = []
    wakeup.depart(token, given.append, seconds=10, resource="deploy:push")
    item, _ = _line_push(token, lock_table)
    try:
        assert wakeup.push(
            wakeup._listener.address, "deploy:push", token, item, sent_ms=clock.now_ms()
        )
        deadline = time.monotonic() + 5
        while not given:
            assert time.monotonic() < deadline, "the push was not given back"
            time.sleep(0.01)
        assert [i.holders[token].fence for i in given] == [7]
    finally:
        wakeup._listener.slots.pop(token, None)


def test_a_releaser_gives_its_cpu_to_the_heir_once_the_datagram_is_sent(lock_table, monkeypatch):
    """The datagram wakes the heir's listener, which the kernel tends to queue behind the
    releaser on its CPU: the releaser yields at once (only after a datagram went out)."""
    monkeypatch.setattr(wakeup, "IN_PROCESS", False)
    yielded: list[int] = []
    monkeypatch.setattr(wakeup, "_yield_cpu", lambda: yielded.append(len(yielded)))
    token = "t-yield"
    target = _listening_slot("deploy:push", token)
    now = clock.now_ms()
    message = _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=lock_table)
    item = records.lock_item(message["i"])
    address = f"{wakeup.HOST_ID}@{target[0]}:{target[1]}"
    assert wakeup.push(address, "deploy:push", token, item, sent_ms=now)
    assert yielded == [0]
    pushed = wakeup.wait(token, 5, fence_above=6)
    wakeup.forget(token)
    assert pushed is not None and pushed.item.holders[token].fence == 7
    monkeypatch.setattr(wakeup, "_send", lambda *args: False)  # nothing went out
    assert not wakeup.push(address, "deploy:push", token, item, sent_ms=now)
    assert yielded == [0]


def test_of_two_pushes_waiting_the_later_state_is_taken_whatever_came_last(lock_table):
    """Two holders release at once and both push the first waiter; the push of the older
    state arrives second. The waiter must see the newer state (fence 9), not the older."""
    token = "t-two"
    target = _listening_slot("deploy:push", token)
    slot = wakeup._listener.slots[token]
    now = clock.now_ms()
    for fence in (9, 8):
        _send(
            target,
            _hand_over(token, e_ms=now + 10_000, fence=fence, sent_ms=now, table_name=lock_table),
        )
        deadline = time.monotonic() + 5
        while slot.push is None or slot.push.item.fence != 9:  # the first: accepted
            assert time.monotonic() < deadline
            time.sleep(0.01)
    time.sleep(0.2)  # the second (fence 8) has arrived and been weighed by now
    pushed = wakeup.wait(token, 5, fence_above=0)
    wakeup.forget(token)
    assert pushed is not None and pushed.item.fence == 9


def test_a_coroutine_awaiting_a_push_is_woken_through_its_event_loop(lock_table):
    """The push arrives while the coroutine awaits it (the listener thread resolves a future
    of its loop), or before it starts to (taken at once); with none it times out."""
    token = "t-async"
    target = _listening_slot("deploy:push", token)
    now = clock.now_ms()

    async def main() -> tuple[object, float, object, object]:
        loop = asyncio.get_running_loop()
        loop.call_later(
            0.2,
            _send,
            target,
            _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=lock_table),
        )
        started = time.monotonic()
        woken = await wakeup.await_push(token, 5, fence_above=6)
        after = time.monotonic() - started
        nothing = await wakeup.await_push(token, 0.1, fence_above=6)
        _send(
            target,
            _hand_over(token, e_ms=now + 10_000, fence=8, sent_ms=now, table_name=lock_table),
        )
        slot = wakeup._listener.slots[token]
        while not slot.event.is_set():
            await asyncio.sleep(0.01)
        early = await wakeup.await_push(token, 0, fence_above=7)
        return woken, after, nothing, early

    woken, after, nothing, early = asyncio.run(main())
    wakeup.forget(token)
    assert woken is not None and woken.item.holders[token].fence == 7
    assert 0.15 < after < 2
    assert nothing is None
    assert early is not None and early.item.holders[token].fence == 8


def test_a_pushed_coroutine_reads_nothing(lock_table, requests_sent, monkeypatch):
    """test_a_pushed_waiter_reads_nothing, for ``async with``: handed over by push, at once."""
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)
    holder = semaphore("deploy:async").acquire()
    out: dict = {}

    async def wait() -> None:
        async with semaphore("deploy:async", wait=30) as held:
            out["acquired"] = time.monotonic()
            out["fence"] = held.fence

    thread = threading.Thread(target=asyncio.run, args=(wait(),))
    thread.start()
    wait_until_queued("deploy:async")
    holder.renew()  # its answer shows the holder the queue: it hands over on release
    requests_sent.reset()
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert requests_sent.calls["GetItem"] == 0
    assert requests_sent.calls["UpdateItem"] == 2  # the hand-over, then the waiter's release
    assert out["acquired"] - released < PUSHED_WITHIN
    assert out["fence"] > holder.fence


@pytest.mark.parametrize(
    "case",
    ["run-out", "oversized", "fence-not-above", "other-table", "send-time-ahead"],
)
def test_a_push_that_claims_too_much_is_dropped_and_logged(lock_table, caplog, case):
    token = f"t-{case}"
    target = _listening_slot("deploy:push", token, lease=10)
    now = clock.now_ms()
    e_ms, fence, sent, name = now + 9_000, 7, now, lock_table
    if case == "run-out":
        # Sent 12 s ago (its 10 s lease is over): we were paused past it.
        e_ms, sent = now - 2_000, now - 12_000
    elif case == "oversized":
        e_ms = now + 60_000  # longer than our own 10 s lease from its send time
    elif case == "fence-not-above":
        fence = 5  # we saw fence 5 already
    elif case == "other-table":
        name = "another-project-locks"
    else:
        sent = now + 30_000
    with caplog.at_level(logging.INFO, logger="dynasem"):
        _send(target, _hand_over(token, e_ms=e_ms, fence=fence, sent_ms=sent, table_name=name))
        assert wakeup.wait(token, 1, fence_above=5) is None
    wakeup.forget(token)
    assert "dropped a push" in caplog.text
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # A wrong claim is a warning; a push we were too slow for is only information.
    assert bool(loud) == (case != "run-out")


def test_a_push_that_ran_out_while_buffered_is_dropped_when_taken(lock_table, monkeypatch):
    token = "t-buffered"
    target = _listening_slot("deploy:push", token, lease=10)
    now = clock.now_ms()
    _send(target, _hand_over(token, e_ms=now + 10_000, fence=7, sent_ms=now, table_name=lock_table))
    deadline = time.monotonic() + 5
    slot = wakeup._listener.slots[token]
    while slot.push is None:  # arrived and accepted...
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # ...then the waiter stalls past the hold it grants before it takes it.
    monkeypatch.setattr(slot, "now_ms", lambda: now + 10_000)
    assert wakeup.wait(token, 1, fence_above=0) is None
    wakeup.forget(token)


def test_pushes_signed_with_a_fallback_key_are_taken(lock_table, caplog):
    token = "t-rotated"
    target = _listening_slot("deploy:push", token)
    now = clock.now_ms()
    message = _hand_over(token, e_ms=now + 9_000, fence=7, sent_ms=now, table_name=lock_table)
    # This process already runs with the new key; the releaser still signs with the old one.
    with override_settings(SECRET_KEY="the new key", SECRET_KEY_FALLBACKS=["dynasem-tests-only"]):
        _send(target, message, secret="dynasem-tests-only")
        assert wakeup.wait(token, 5) is not None
    # Without the old key among the fallbacks the push is dropped, with a warning that names
    # the likely cause, and only once a minute however many arrive.
    with override_settings(SECRET_KEY="the new key"), caplog.at_level(logging.WARNING):
        for _ in range(3):
            _send(target, message, secret="dynasem-tests-only")
        assert wakeup.wait(token, 0.5) is None
    wakeup.forget(token)
    warnings = [r.getMessage() for r in caplog.records if "signature" in r.getMessage()]
    assert len(warnings) <= 1
    if warnings:  # (none when another test warned within the minute)
        assert "SECRET_KEY_FALLBACKS" in warnings[0]


def test_pushes_go_only_to_ipv4_literals_that_name_one_host():
    for host in ("0.0.0.0", "255.255.255.255", "224.0.0.1", "239.1.2.3", "localhost", "::1"):
        assert wakeup.reachable(f"{wakeup.HOST_ID}@{host}:4000") is None, host
        assert wakeup.push_address_problem(host) is not None, host
    assert wakeup.reachable(f"{wakeup.HOST_ID}@127.0.0.1:0") is None
    assert wakeup.push_address_problem("10.0.0.7") is None


def test_an_interrupt_while_claiming_the_socket_does_not_keep_the_listener_away(
    lock_table, monkeypatch
):
    """Review: a signal raised in a waiter's claim() (Ctrl-C, a time limit raised from a
    handler) while it waits for the listener to step aside left ``claimed`` set: the
    listener thread read one more datagram, then waited for an unclaim that never came, and
    every later push to this process went unread (waiters slept to their paced look)."""
    for token in ("t-after-1", "t-after-2"):
        target = _listening_slot("deploy:push", token)
    listener = wakeup._listener
    _interrupted_claim(monkeypatch)
    stuck = listener.claimed
    try:
        got = {}
        for token in ("t-after-1", "t-after-2"):  # the listener must read both, in turn
            _send(target, _push_for(token, lock_table))
            got[token] = wakeup.wait(token, 2, fence_above=6)
    finally:
        for token in ("t-after-1", "t-after-2"):
            wakeup.forget(token)
        if stuck:
            listener.unclaim()  # let the tests after this one have their listener back
    assert got["t-after-1"] is not None and got["t-after-2"] is not None, "a push went unread"
    assert not stuck


def _interrupted_claim(monkeypatch) -> None:
    """The main thread's wait is interrupted (SIGALRM raising KeyboardInterrupt) while it
    waits in claim() for the listener thread to step aside (its nudge slow or lost)."""
    import signal

    _listening_slot("deploy:push", "t-intr")
    listener = wakeup._listener
    _until(lambda: listener.reading, "the listener is not reading the socket")
    with monkeypatch.context() as patch:
        patch.setattr(listener, "nudge", lambda: None)
        patch.setattr(wakeup, "CLAIM_WAIT", 2.0)

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(KeyboardInterrupt):
                wakeup.wait("t-intr", 5, fence_above=6)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    wakeup.forget("t-intr")
    listener.nudge()  # the listener's pending read ends (as any datagram would end it)
    time.sleep(0.2)


@pytest.mark.kind_engine_only("times a pushed waiter's wake-up against a kind engine")
def test_after_an_interrupted_claim_a_hand_over_from_another_process_still_wakes_its_heir(
    lock_table, monkeypatch
):
    """Review: end to end, the stuck claim above leaves a lock handed over by datagram (as
    from another process) idle until its heir's paced look."""
    listener = wakeup._get_listener()
    assert listener is not None
    try:
        _interrupted_claim(monkeypatch)
        monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)  # paced looks far away
        monkeypatch.setattr(wakeup, "IN_PROCESS", False)  # the datagram, as between processes
        holder = semaphore("deploy:prod").acquire()
        out: dict = {}
        thread = waiter_thread("deploy:prod", out, wait=30)
        wait_until_queued("deploy:prod")
        holder.renew()  # its answer shows the holder the queue: it hands over on release
        released = time.monotonic()
        holder.release()
        thread.join(30)
    finally:
        if listener.claimed:
            listener.unclaim()
    assert "error" not in out
    assert out["acquired"] - released < PUSHED_WITHIN, (
        "the heir held the lock only at its paced look"
    )


def test_a_departed_waiters_failures_are_logged_with_their_facts(monkeypatch, caplog):
    """What a departed waiter's slot could not do is logged, each as a warning naming the
    resource and the error, with its facts, where it failed: a thread to give a stray
    hand-over back that could not start; its entry's dead mark, and its late look's read,
    that failed."""
    slot = wakeup._Slot("deploy:gone", "t-gone-0123456789", wakeup.settings.TABLE_NAME)
    slot.left, slot.until = True, clock.monotonic() + 60

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    def unmarked():
        raise OSError("mark refused")

    def unread(*args, **kwargs):
        raise OSError("read refused")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    monkeypatch.setattr(lock_rows, "get", unread)
    slot.drop = unmarked
    item = records.LockItem(resource="deploy:gone", holders={slot.token: records.Holder("u", 0, 1)})
    with caplog.at_level(logging.WARNING, logger="dynasem"):
        slot.stray(item)
        assert slot.beat() is not None  # looked at again: the failures are passing
    found = [
        (r.funcName, r.dynasem_outcome, r.dynasem_resource, r.dynasem_reason, r.dynasem_token)
        for r in caplog.records
    ]
    token = shown_token(slot.token)
    assert found == [
        ("stray", "give_back_failed", "deploy:gone", "can't start new thread", token),
        ("beat", "leave_failed", "deploy:gone", "mark refused", token),
        ("_look", "late_look_failed", "deploy:gone", "read refused", token),
    ]
    errors = ("can't start new thread", "mark refused", "read refused")
    for record, error in zip(caplog.records, errors, strict=True):
        assert record.levelno == logging.WARNING
        assert "'deploy:gone'" in record.getMessage() and error in record.getMessage()
