"""A resource taking another limit, or another mode, once nobody holds it: never while a
take or a release that began under the old one is between its two writes (permit items);
and a waiter refused for another limit leaves the queue at once."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
from django.core.management import call_command

from dynasem import SemaphoreUnavailable, semaphore
from dynasem._engine import permit_hold
from dynasem._engine.queue import Pace
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from dynasem._storage import permit_items as slots
from dynasem.testing import abandon
from tests.support.helpers import queue_of, take, wait_for

pytestmark = pytest.mark.django_db(transaction=False)


def live_permits(resource: str = "pool") -> list[Any]:
    now = int(time.time() * 1000)
    return [p for p in slots.permits(resource) if p.token and p.holder.expires_ms > now]


def _permit_write_held(
    monkeypatch: pytest.MonkeyPatch, thread: str, *, after: bool = False, wait: float = 10
) -> tuple[Any, Any]:
    """The permit write (a take's second) of the thread named ``thread`` waits for ``go``:
    its row write has drawn its fence and slot. ``after``: the permit is written first, and
    its answer waits."""
    reached, go = threading.Event(), threading.Event()
    real = slots.send

    def send(action: dict[str, Any], *, old: bool = False) -> Any:
        taking = action["Key"]["sk"]["S"].startswith("s#") and action[
            "UpdateExpression"
        ].startswith("SET #k = :tok")
        held = threading.current_thread().name == thread and taking and not go.is_set()
        if held and not after:
            reached.set()
            assert go.wait(wait)
        answer = real(action, old=old)
        if held and after:
            reached.set()
            assert go.wait(wait)
        return answer

    monkeypatch.setattr(slots, "send", send)
    return reached, go


def _slow_take(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, stopped: float = 10, **kwargs: Any
) -> Any:
    """A take of ``pool`` on a thread of its own, stopped between its two writes (for up to
    ``stopped`` seconds); returns ``(go, thread, got)``."""
    reached, go = _permit_write_held(monkeypatch, "slow", wait=stopped)
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(semaphore("pool", lease=30, **kwargs).acquire())
        except Exception as exc:  # reported to the test
            got.append(exc)

    thread = threading.Thread(target=run, name="slow")
    thread.start()
    assert reached.wait(10)
    return go, thread, got


def _finish(go: Any, thread: threading.Thread, got: list[Any], holds: list[Any]) -> Any:
    go.set()
    thread.join(10)
    assert got, "the slow take never ended"
    if not isinstance(got[0], BaseException):
        holds.append(got[0])
    return got[0]


def test_an_exclusive_take_never_holds_beside_a_permit_taken_between_its_writes(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    take(holds, "pool", limit=20).release()  # a permit row, every permit free
    go, thread, got = _slow_take(holds, monkeypatch, limit=20)
    writer = take(holds, "pool", wait=0, lease=30)  # reads the permits: none live yet
    slow = _finish(go, thread, got, holds)
    row = lock_rows.get("pool")
    assert writer.token in row.holders and not writer.lost
    # The permit take drew its fence before the writer's: its write is refused, and it
    # takes no permit of a row that is not a permit row any more.
    assert live_permits() == []
    assert isinstance(slow, ValueError) and "limit" in str(slow)


def test_a_reset_to_a_lower_limit_never_adds_a_permit_taken_between_its_writes(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = [take(holds, "pool", limit=20, lease=30) for _ in range(13)]
    for held in reversed(old):
        held.release()  # hints: 12, 11, ...
    go, thread, got = _slow_take(holds, monkeypatch, limit=20)  # it popped slot 12
    new = [take(holds, "pool", limit=9, wait=0, lease=30) for _ in range(9)]
    _finish(go, thread, got, holds)
    assert len(live_permits()) == 9
    assert {p.token for p in live_permits()} == {h.token for h in new}


def test_a_slot_freed_under_the_old_limit_is_not_hinted_after_a_reset(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release paused between freeing its permit (slot 11) and hinting it: the row is
    reset to limit 9 meanwhile, and the late hint must not give a tenth permit."""
    old = [take(holds, "pool", limit=20, lease=30) for _ in range(12)]
    for held in old[:11]:
        held.release()
    assert old[11].slots["pool"] == 11
    reached, go = threading.Event(), threading.Event()
    real = permit_hold.hint_freed

    def hint_freed(resource: str, slot: int, hold_ms: Any) -> None:
        if threading.current_thread().name == "slow":
            reached.set()
            assert go.wait(10)
        real(resource, slot, hold_ms)

    monkeypatch.setattr(permit_hold, "hint_freed", hint_freed)
    thread = threading.Thread(target=old[11].release, name="slow")
    thread.start()
    assert reached.wait(10)
    new = [take(holds, "pool", limit=9, wait=0, lease=30)]  # reset: limit 9
    go.set()
    thread.join(10)
    new += [take(holds, "pool", limit=9, wait=0, lease=30) for _ in range(8)]
    with pytest.raises(Exception, match="pool"):
        semaphore("pool", limit=9, wait=0).acquire()
    assert sorted(h.slots["pool"] for h in new) == list(range(9))
    assert len(live_permits()) == 9


def test_the_reaper_does_not_hint_a_dead_holders_slot_of_the_old_limit(
    holds: list[Any],
) -> None:
    old = [take(holds, "pool", limit=20, lease=30) for _ in range(15)]
    old.append(take(holds, "pool", limit=20, lease=1))
    assert old[15].slots["pool"] == 15
    abandon(old[15])  # slot 15's holder dies
    for held in old[:15]:
        held.release()
    time.sleep(1.6)  # its lease and CLOCK_SKEW are over
    new = [take(holds, "pool", limit=9, wait=0, lease=30)]  # reset to limit 9
    call_command("dynasem_reap", stdout=io.StringIO())
    new += [take(holds, "pool", limit=9, wait=0, lease=30) for _ in range(8)]
    with pytest.raises(Exception, match="pool"):
        semaphore("pool", limit=9, wait=0).acquire()
    assert sorted(h.slots["pool"] for h in new) == list(range(9))
    assert (
        "hints" not in lock_rows.get_item("pool") or 15 not in lock_rows.get_item("pool")["hints"]
    )


# (A counting semaphore of a few permits, kept in the row, backs off rather than queue.)
@pytest.mark.parametrize("limit", [1, 9], ids=["exclusive", "permits"])
def test_a_waiter_refused_for_another_limit_leaves_the_queue_at_once(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """Queued behind a holder of its limit, a waiter finds the resource held with another
    (the holder's hold replaced here by the row's own write): it raises ``ValueError``, and
    its entry goes with it, instead of standing before the waiters behind it for a lease."""
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 0.1)  # looks often
    monkeypatch.setattr("dynasem._engine.queue.ENTRY_DEFER", 0.0)  # its entry put at once
    holder = take(holds, "mix", limit=limit, lease=30)
    for _ in range(limit - 1):
        take(holds, "mix", limit=limit, lease=30)  # every permit held
    got: list[BaseException] = []

    def run() -> None:
        try:
            semaphore("mix", limit=limit, wait=30, lease=30).acquire().release()
        except BaseException as exc:  # reported to the test
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: queue_of("mix"), 10, "the waiter queued")
    # Held now by two holders of limit 3, in the row (what another deploy's code would take).
    now = int(time.time() * 1000)
    entry = {"u": "other", "e": now + 30_000, "f": holder.fence + 10, "a": now, "s": False}
    other = {"aaaa": entry, "bbbb": {**entry, "f": holder.fence + 11}}
    update = "SET #h = :h, #mode = :mode, #lim = :lim, #fence = :f, #expMs = :e REMOVE #hw, #hints"
    values = {":h": other, ":mode": records.Mode.COUNTING, ":lim": 3}
    values |= {":f": holder.fence + 11, ":e": now + 30_000}
    lock_rows.update(lock_writes.update_action("mix", records.LOCK_SK, update, "", {}, values))
    for held in holds:
        abandon(held)  # their holds are gone: nothing of theirs to give back
    holds.clear()
    thread.join(15)
    assert got and isinstance(got[0], ValueError) and "limit=3" in str(got[0])
    assert queue_of("mix") == {}


def test_a_permit_taken_after_the_exclusive_takes_read_stops_it_from_fencing_the_slots(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exclusive take reads the permits (none live), and a permit is taken before it
    fences the slots out: the fencing is refused by that permit, which counts as a holder,
    so the exclusive take is refused for the limit it is held with, with no write of the row
    after that read (the row's fence, moved on by the permit's take, would refuse it too)."""
    take(holds, "pool", limit=20).release()  # a permit row, every permit free
    read, taken = slots.with_permits, []
    update, row_writes = lock_rows.update, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "writer" and taken:
            row_writes.append(args)  # after its read of the permits
        return update(*args, **kwargs)

    monkeypatch.setattr(lock_rows, "update", counted)

    def permit_taken_after_read(item: Any, **kwargs: Any) -> Any:
        seen = read(item, **kwargs)
        if not taken and threading.current_thread().name == "writer":
            runner = threading.Thread(
                target=lambda: taken.append(semaphore("pool", limit=20, lease=30).acquire())
            )
            runner.start()
            runner.join(10)
            holds.extend(taken)
        return seen

    monkeypatch.setattr(slots, "with_permits", permit_taken_after_read)
    got: list[Any] = []

    def writer() -> None:
        try:
            got.append(semaphore("pool", wait=0, lease=30).acquire())
        except Exception as exc:  # reported to the test
            got.append(exc)

    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    thread.join(15)
    assert taken, "no permit was taken between the read and the fencing"
    assert isinstance(got[0], ValueError) and "limit=20" in str(got[0]), got
    assert row_writes == []
    assert [p.token for p in live_permits()] == [taken[0].token] and not taken[0].lost
    assert lock_rows.get("pool").holders == {}


def _idle_past_its_listing(resource: str = "pool") -> None:
    """Sleep until the reaper may delete ``resource``'s row: its lease end (a 1 s bucket's,
    with one_second_buckets), CLOCK_SKEW and a bucket more are over."""
    row = lock_rows.get(resource)
    assert row is not None
    while time.time() * 1000 < row.expires_ms + 500 + 1200:
        time.sleep(0.1)


@pytest.mark.usefixtures("one_second_buckets")
@pytest.mark.parametrize("other", ["exclusive", "limit 9"])
def test_a_permit_row_is_not_reaped_between_a_takes_two_writes(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """A permit row, idle past its listing, is taken: between the take's row write and its
    permit write, the reaper runs. The row must outlive the permit the take is writing (else
    the next taker makes the row anew, knowing nothing of that permit, and holds beside it:
    exclusively, or as one of nine under a lower limit)."""
    _hints_0_to_12(holds)
    _idle_past_its_listing()
    go, thread, got = _slow_take(holds, monkeypatch, limit=20)  # stopped before its permit
    call_command("dynasem_reap", stdout=io.StringIO())
    assert lock_rows.get("pool") is not None  # listed past the permit being written
    permit_hold.rows.clear()  # the next takers are another process: no row remembered
    new: list[Any] = []
    try:
        if other == "exclusive":
            new.append(take(holds, "pool", wait=0, lease=30))
        else:
            new += [take(holds, "pool", limit=9, wait=0, lease=30) for _ in range(9)]
    except Exception as exc:  # refused: the pending take counts (what the test allows)
        new.append(exc)
    slow = _finish(go, thread, got, holds)
    holding = [h for h in new if not isinstance(h, BaseException) and not h.lost]
    if not isinstance(slow, BaseException) and not slow.lost:
        holding.append(slow)
    live = {p.token for p in live_permits()}
    row = lock_rows.get("pool")
    inline = set(row.holders) if row is not None else set()
    if other == "exclusive":
        assert len(holding) == 1, (new, slow, live, inline)
    else:
        assert len(live) <= 9 and len(holding) <= 9, (new, slow, live)


@pytest.mark.usefixtures("one_second_buckets")
def test_a_permit_is_never_renewed_past_its_rows_listing(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal raises the row's listing first; when it cannot (the write fails), the
    permit is not renewed either, and its hold runs out within the row's listing: a row the
    reaper deletes once its listing is over never has a live permit that a taker making it
    anew would know nothing of."""
    held = take(holds, "pool", limit=20, lease=2)

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise SemaphoreUnavailable("injected: the row's write failed", transient=True)

    monkeypatch.setattr(slots, "raise_row", unreachable)
    time.sleep(3)  # renewals every ~0.5 s, past the row's 1 s buckets
    (permit,) = live_permits() or [None]
    row = lock_rows.get("pool")
    assert row is not None
    if permit is not None:
        assert permit.holder.expires_ms <= row.expires_ms
    assert held.seconds_left() <= 0 or held.lost


def _hints_0_to_12(holds: list[Any]) -> None:
    permit_hold.rows.clear()  # (rows an earlier test's process saw, of another table)
    # Leases of 3 s: trusted 2.5 s from each renewal, which a loaded machine's heartbeat
    # keeps up with (1 s, trusted 0.5 s, ran out in the project CI beside the simulator).
    old = [take(holds, "pool", limit=20, lease=3) for _ in range(13)]
    for held in reversed(old):
        held.release()  # hints 12, 11, ..., 0: the next take pops slot 12


def _made_anew(holds: list[Any], other: str) -> list[Any]:
    """``pool``'s row, reaped, made anew by another process: exclusively, or by 9 holders of
    ``limit=9`` (slots 0-8, ``hw`` 9)."""
    call_command("dynasem_reap", stdout=io.StringIO())
    assert lock_rows.get("pool") is None
    permit_hold.rows.clear()  # the next takers are another process: no row remembered
    if other == "exclusive":
        return [take(holds, "pool", wait=0, lease=30)]
    return [take(holds, "pool", limit=9, wait=0, lease=30) for _ in range(9)]


@pytest.mark.usefixtures("one_second_buckets")
@pytest.mark.parametrize("after", [False, True], ids=["before its permit", "after its permit"])
@pytest.mark.parametrize("other", ["exclusive", "limit 9"])
def test_a_take_paused_past_its_lease_confirms_nothing_on_a_row_made_anew(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, other: str, after: bool
) -> None:
    """A take (slot 12 of ``limit=20``) stops between its two writes, or after both, for
    longer than its lease and the row's listing: the reaper deletes the row, another process
    makes it anew. The late take's confirming renewal must not revive its permit there: a
    row with ``hw`` at or below slot 12 counts nothing of it (ten holders of ``limit=9``)."""
    _hints_0_to_12(holds)
    reached, go = _permit_write_held(monkeypatch, "slow", after=after, wait=30)
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(semaphore("pool", limit=20, lease=2, wait=10).acquire())
        except Exception as exc:  # reported to the test
            got.append(exc)

    thread = threading.Thread(target=run, name="slow")
    thread.start()
    assert reached.wait(10)
    _idle_past_its_listing()
    new = _made_anew(holds, other)
    slow = _finish(go, thread, got, holds)
    holding = [h for h in new if not h.lost]
    if not isinstance(slow, BaseException) and not slow.lost:
        holding.append(slow)
    live = sorted((p.slot, p.token[:6]) for p in live_permits())
    if other == "exclusive":
        assert len(holding) == 1, (new, slow, live)
    else:
        assert len(live) <= 9 and len(holding) <= 9, (slow, live)


def test_a_permit_waiter_handed_the_row_hands_it_on_and_takes_a_permit(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exclusive holder hands over to its next in line whatever its mode (a queue shared
    with other limits or modes): a waiter of a permit semaphore (``limit=9``: permit items)
    handed the row cannot use it. It took its ticket for passed and queued again behind the
    row it held, unused: every waiter behind, itself too, waited for that hold's lease (found
    by the simulator's interrupt fault, whose check looks for what a token holds: seed 12 of
    ``--mix limits --faults interrupts --permits-from 1``, 11 s idle). It hands the row on,
    and takes its permit."""
    from dynasem._storage import dynamodb
    from dynasem.conf import settings

    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 0.1)  # looks often
    monkeypatch.setattr("dynasem._engine.queue.ENTRY_DEFER", 0.0)  # its entry put at once
    holder = take(holds, "handed", limit=9, lease=30)
    for _ in range(8):
        take(holds, "handed", limit=9, lease=30)  # every permit held
    got: list[Any] = []

    def run() -> None:
        started = time.monotonic()
        try:
            semaphore("handed", limit=9, wait=60, lease=30).acquire().release()
            got.append(time.monotonic() - started)
        except BaseException as exc:  # reported to the test
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: queue_of("handed"), 10, "the waiter queued")
    ((token, waiter),) = queue_of("handed").items()
    for held in holds:
        abandon(held)  # their permits go (below): nothing of theirs to give back
    holds.clear()
    for slot in range(9):
        key = records.key("handed", records.permit_sk(slot))
        dynamodb.get_client().delete_item(TableName=settings.TABLE_NAME, Key=key)
    # Then an exclusive holder took the row and handed it over to the waiter, its next in line.
    now = int(time.time() * 1000)
    entry = {"u": "w", "e": now + 30_000, "f": holder.fence + 10, "a": now, "s": False}
    update = (
        "SET #h = :h, #mode = :mode, #lim = :lim, #fence = :f, #expMs = :e, #qout = :t "
        "REMOVE #hw, #hints"
    )
    values = {":h": {token: entry}, ":mode": records.Mode.EXCLUSIVE, ":lim": 1}
    values |= {":f": holder.fence + 10, ":e": now + 30_000, ":t": waiter.ticket}
    lock_rows.update(lock_writes.update_action("handed", records.LOCK_SK, update, "", {}, values))
    thread.join(20)
    assert got and isinstance(got[0], float) and got[0] < 25, got


def test_a_stale_read_of_the_row_before_a_limit_change_is_no_other_limit(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Found by review.) The row was a permit row of limit 20 (every permit free), and
    another caller moved it to limit 30 and holds a permit. A fresh take of limit 30 (ours
    too) whose first read is eventually consistent sees the row as it was before (limit
    20): it must plan again from the row as it is, not raise that the resource is held
    with limit 20."""
    take(holds, "pool", limit=20).release()
    before = lock_rows.get("pool", consistent=True)
    assert before is not None and before.limit == 20
    permit_hold.rows.clear()
    other = take(holds, "pool", limit=30, lease=30)  # reset to 30, slot 0 held
    assert lock_rows.get("pool", consistent=True).limit == 30
    permit_hold.rows.clear()  # a fresh process: nothing remembered

    real = lock_rows.get

    def get(resource: str, *args: Any, consistent: bool = True, **kwargs: Any) -> Any:
        if not consistent:
            return before  # the read lags the reset (eventually consistent)
        return real(resource, *args, consistent=consistent, **kwargs)

    monkeypatch.setattr(lock_rows, "get", get)
    mine = semaphore("pool", limit=30, wait=0, lease=30).acquire()
    holds.append(mine)
    assert mine.token != other.token


def _deleted_by_ttl(sk: str, before_s: float) -> None:
    """DynamoDB's TTL deletes ``pool``'s item ``sk`` some time after its ``expires``: here
    at once after it, if that comes before ``before_s`` (a paused take's lease end)."""
    item = lock_rows.get_item("pool", sk)
    assert item is not None and "k" not in item and "expires" in item
    if item["expires"] >= before_s:
        return  # it outlives the paused take's lease: no deletion matters to it
    while time.time() <= item["expires"]:
        time.sleep(0.2)
    dynamodb.send_to_table("delete_item", Key=records.key("pool", sk))


def _reaped() -> None:
    """Wait until the reaper may delete ``pool``'s row (its lease end and its listing's
    bucket over, CLOCK_SKEW and a bucket more), and reap it."""
    row = lock_rows.get_item("pool")
    assert row is not None
    until = max(row["expMs"] / 1000, row["expires"]) + 2.5
    while time.time() < until:
        time.sleep(0.1)
    call_command("dynasem_reap", stdout=io.StringIO())
    assert lock_rows.get("pool") is None


@pytest.mark.usefixtures("one_second_buckets")
def test_a_permit_deleted_by_ttl_never_takes_a_fence_older_than_one_it_had(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take paused between its row write (slot 8 popped, fence F) and its permit write;
    meanwhile another take finds slot 8 free by reading the permits, holds it under a later
    fence and gives it back. The freed permit must outlive the paused take's lease: deleted
    by TTL, it would have no fence to refuse that take, and slot 8 would be held under a
    fence older than one it had."""
    first = [take(holds, "pool", limit=9, lease=30) for _ in range(9)]
    assert first[8].slots["pool"] == 8
    first[8].release()  # hints: [8]
    lease_end = time.time() + 30
    go, thread, got = _slow_take(holds, monkeypatch, 60, limit=9)  # popped 8, stopped
    permit_hold.rows.clear()
    later = semaphore("pool", limit=9, wait=0, lease=3).acquire()  # slot 8 read free
    assert later.slots["pool"] == 8
    later.release()
    _deleted_by_ttl(records.permit_sk(8), lease_end)
    slow = _finish(go, thread, got, holds)
    permit = next(p for p in slots.permits("pool") if p.slot == 8)
    assert permit.holder.fence >= later.fence, (slow, permit, later.fence)


@pytest.mark.usefixtures("one_second_buckets")
def test_a_take_paused_between_its_writes_never_holds_beside_an_exclusive_holder(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permit take (lease 30 s) pops slot 2 and is paused before its permit write. Within
    its lease: an exclusive take fences the permits out and holds (its lease end becomes the
    row's, below the paused take's); the row, idle, is reaped; another process makes it a
    permit row anew, holds slot 2 and gives it back; TTL may delete the freed permit; the row
    is reaped again; an exclusive take holds it. The paused take's permit write must then be
    refused: a row made anew by an exclusive take knows nothing of permits."""
    permit_hold.rows.clear()
    old = [take(holds, "pool", limit=20, lease=3) for _ in range(3)]
    for held in (old[2], old[0], old[1]):
        held.release()  # hints [2, 0, 1]
    lease_end = time.time() + 30
    go, thread, got = _slow_take(holds, monkeypatch, 60, limit=20, wait=0)  # popped 2
    permit_hold.rows.clear()
    take(holds, "pool", wait=0, lease=3).release()  # every permit free: fenced out, held
    _reaped()
    permit_hold.rows.clear()  # another process
    anew = [take(holds, "pool", limit=20, lease=3) for _ in range(3)]
    assert anew[2].slots["pool"] == 2
    for held in anew:
        held.release()
    _deleted_by_ttl(records.permit_sk(2), lease_end)
    _reaped()
    permit_hold.rows.clear()
    writer = take(holds, "pool", wait=0, lease=30)  # exclusive, a row made anew
    slow = _finish(go, thread, got, holds)
    holding = not isinstance(slow, BaseException) and not slow.lost
    assert not isinstance(slow, AssertionError), "stopped too long"
    assert not (holding and not writer.lost), (slow, writer, live_permits())
