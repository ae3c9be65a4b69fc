"""Counting semaphores of many permits: holders in permit items (dynasem._engine.permits)."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from typing import Any

import pytest
from django.core.management import call_command

from dynasem import LockLost, SemaphoreBusy, SemaphoreUnavailable, semaphore
from dynasem._engine import queue as queueing
from dynasem._engine.queue import Pace
from dynasem._operators import locks as operations
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from dynasem._storage import permit_items as slots
from dynasem.conf import settings
from dynasem.testing import abandon
from tests.engine.test_fair import wait_for_queue
from tests.engine.test_processes import identity_of
from tests.support.faults import Faults
from tests.support.helpers import holder_pages, queue_of, take, wait_for

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture
def gone() -> str:
    """The identity of a process of this host that has ended and been reaped."""
    proc = subprocess.Popen(["sleep", "60"])
    recorded = identity_of(proc.pid)
    proc.kill()
    proc.wait()
    return recorded


def permit_items(resource: str) -> list[records.Permit]:
    return slots.permits(resource)


def test_holders_live_in_permit_items(holds: list[Any]) -> None:
    a = take(holds, "pool", limit=16, user="alice")
    b = take(holds, "pool", limit=16, user="bob")
    row = lock_rows.get_item("pool")
    assert row is not None
    assert "holders" not in row and row["hw"] == 2 and row["limit"] == 16
    held = {p.token: p for p in permit_items("pool") if p.token}
    assert set(held) == {a.token, b.token}
    assert held[a.token].holder.user_id == "alice"
    assert b.fence > a.fence
    a.release()
    row = lock_rows.get_item("pool")
    assert row is not None and [int(x) for x in row["hints"]] == [held[a.token].slot]
    c = take(holds, "pool", limit=16, user="carol")
    assert c.fence > b.fence
    again = {p.token: p.slot for p in permit_items("pool") if p.token}
    assert again[c.token] == held[a.token].slot  # the hinted slot, not a new one
    assert lock_rows.get_item("pool")["hw"] == 2


def test_limit_is_kept_and_busy_names_a_holder(holds: list[Any]) -> None:
    for i in range(9):
        take(holds, "pool", limit=9, user=f"u{i}", lease=30)
    with pytest.raises(SemaphoreBusy) as caught:
        semaphore("pool", limit=9, wait=0).acquire()
    assert caught.value.holder_user_id in {f"u{i}" for i in range(9)}
    holds[3].release()
    tenth = take(holds, "pool", limit=9, wait=0)
    assert tenth.fence > holds[8].fence


def slot_of(token: str, resource: str = "pool") -> int | None:
    return next((p.slot for p in permit_items(resource) if p.token == token), None)


def test_an_expired_holders_permit_is_taken_over(holds: list[Any]) -> None:
    live = [take(holds, "pool", limit=9, lease=30) for _ in range(8)]
    expired = take(holds, "pool", limit=9, lease=1)
    abandon(expired)
    with pytest.raises(SemaphoreBusy):
        semaphore("pool", limit=9, wait=0).acquire()
    time.sleep(1.6)  # its lease and CLOCK_SKEW (0.5 s) are over
    newcomer = take(holds, "pool", limit=9, wait=0)
    assert newcomer.fence > max(h.fence for h in live)
    assert slot_of(newcomer.token) == expired.slots["pool"]


def test_a_permit_of_a_process_proven_dead_is_taken_over_at_once(
    holds: list[Any], gone: str
) -> None:
    for _ in range(9):
        take(holds, "pool", limit=9, lease=60)
    victim = holds[4]
    abandon(victim)
    slot = victim.slots["pool"]
    dynamodb.get_client().update_item(
        TableName=settings.TABLE_NAME,
        Key=records.key("pool", records.permit_sk(slot)),
        UpdateExpression="SET p = :p",
        ExpressionAttributeValues={":p": {"S": gone}},
    )
    newcomer = take(holds, "pool", limit=9, wait=0)  # its lease has a minute left
    assert slot_of(newcomer.token) == slot
    assert slot_of(victim.token) is None


def test_another_limit_once_every_permit_is_free(holds: list[Any]) -> None:
    a = take(holds, "pool", limit=16)
    with pytest.raises(ValueError, match="limit=16"):
        semaphore("pool", limit=32, wait=0).acquire()
    with pytest.raises(ValueError, match="limit=16"):
        semaphore("pool", limit=2, wait=0).acquire()
    with pytest.raises(ValueError, match="limit=16"):
        semaphore("pool", wait=0).acquire()
    a.release()
    b = take(holds, "pool", limit=32, wait=0)
    assert lock_rows.get_item("pool")["limit"] == 32 and b.fence > a.fence
    b.release()
    c = take(holds, "pool", wait=0)  # exclusive: holders inline again
    row = lock_rows.get_item("pool")
    assert "hw" not in row and set(row["holders"]) == {c.token} and c.fence > b.fence


def test_several_permit_resources_at_once(holds: list[Any]) -> None:
    for _ in range(9):
        take(holds, "a", limit=9, lease=30)
    both = take(holds, ["b", "c"], limit=9)
    assert slot_of(both.token, "b") == 0 and slot_of(both.token, "c") == 0
    with pytest.raises(SemaphoreBusy):
        semaphore(["a", "b"], limit=9, wait=0).acquire()
    assert (
        slot_of(holds[0].token, "a") is not None
        and len([p for p in permit_items("b") if p.token]) == 1
    )  # all or none: nothing of b was taken
    holds[0].release()
    pair = take(holds, ["a", "b"], limit=9, wait=0)
    assert pair.fences["a"] > holds[8].fence
    both.release()
    assert lock_rows.get_item("b")["hints"] == [0]


@pytest.mark.kind_engine_only(
    "counts slots: a lost answer grows hw twice, as on AWS (safe: RELIABILITY.md)"
)
def test_no_size_wall_and_no_item_over_4_kb(holds: list[Any]) -> None:
    many = [take(holds, "huge", limit=100_000, user=f"user-{i:04d}", lease=60) for i in range(300)]
    assert len({h.slots["huge"] for h in many}) == 300
    row = lock_rows.get_item("huge")
    assert row["hw"] == 300 and row["limit"] == 100_000
    biggest = max(
        len(json.dumps(item, default=str))
        for item in [row, *(lock_rows.get_item("huge", records.permit_sk(s)) for s in (0, 299))]
    )
    assert biggest < 1024
    for held in many[:40]:
        held.release()
    assert len(lock_rows.get_item("huge")["hints"]) == slots.MAX_HINTS  # the rest: found by reading


def test_renew_and_release_touch_only_the_permit(holds: list[Any]) -> None:
    held = take(holds, "pool", limit=64, lease=30)
    before = lock_rows.get_item("pool")
    held.renew()
    assert lock_rows.get_item("pool") == before
    mine = [p for p in permit_items("pool") if p.token == held.token]
    assert mine and mine[0].holder.expires_ms > before["expMs"] - 15 * 60 * 1000


def test_waiters_are_served_in_turn(holds: list[Any]) -> None:
    """The turn is the row's write (its fence counts up): a waiter whose permit item is
    written later (a stale hint: it picks another slot) still took its turn in order."""
    first = [take(holds, "pool", limit=9, lease=30) for _ in range(9)]
    got: list[tuple[int, int]] = []

    def waiter(i: int) -> None:
        with semaphore("pool", limit=9, wait=10, fair=True) as held:
            got.append((held.fence, i))
            time.sleep(0.05)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(3)]
    for i, t in enumerate(threads):
        t.start()
        wait_for_queue("pool", i + 1)  # in line before the next starts (0.3 s was not, loaded)
    for held in first[:3]:
        held.release()
    for t in threads:
        t.join(15)
    assert [i for _, i in sorted(got)] == [0, 1, 2]


def test_listings_show_permit_holders(holds: list[Any]) -> None:
    a = take(holds, "pool", limit=10, user="alice")
    take(holds, "pool", limit=10, user="bob")
    shown = operations.holds_on("pool")
    assert {h.user_id for h in shown} == {"alice", "bob"}
    assert operations.break_hold("pool", a.token)
    with pytest.raises(LockLost):
        a.renew()


def test_the_reaper_frees_dead_holders_permits_and_lists_no_live_one(holds: list[Any]) -> None:
    live = take(holds, "pool", limit=9, lease=30, user="alive")
    expired = [take(holds, "pool", limit=9, lease=1, user="dead") for _ in range(2)]
    for held in expired:
        abandon(held)
    time.sleep(1.6)  # their leases and CLOCK_SKEW (0.5 s) are over
    out = io.StringIO()
    call_command("dynasem_reap", "--dry-run", stdout=out)
    assert "Would free 2 permits and reader holds of dead holders." in out.getvalue()
    assert len([p for p in permit_items("pool") if p.token]) == 3
    call_command("dynasem_reap", stdout=out)
    assert "Freed 2 permits and reader holds of dead holders." in out.getvalue()
    assert [p.token for p in permit_items("pool") if p.token] == [live.token]
    assert sorted(int(s) for s in lock_rows.get_item("pool")["hints"]) == sorted(
        h.slots["pool"] for h in expired
    )
    assert [h.token for h in operations.active_holds(include_expired=True)] == [live.token]
    with pytest.raises(LockLost):
        expired[0].release()  # broken, not released by us: said so


def test_a_permit_never_takes_a_fence_older_than_one_it_had(holds: list[Any]) -> None:
    """A take slowed between its row write (its fence drawn) and its permit write must not hold
    a permit that someone with a later fence held meanwhile (soak.py found one: the slot was
    free to the other, by reading the permits)."""
    first = take(holds, "pool", limit=9)
    slot, fence = first.slots["pool"], first.fence
    first.release()
    now = int(time.time() * 1000)
    late = lock_writes.holder_entry("late", now + 10_000, fence - 1, now, False)
    with pytest.raises(dynamodb.Refused):
        slots.send(slots.take_permit("pool", slot, "late-token", late, stale_ms=now - 500))
    fresh = lock_writes.holder_entry("late", now + 10_000, fence + 1, now, False)
    slots.send(slots.take_permit("pool", slot, "late-token", fresh, stale_ms=now - 500))
    slots.send(slots.take_permit("pool", slot, "late-token", fresh, stale_ms=now - 500))  # a retry
    assert slot_of("late-token") == slot


@pytest.mark.kind_engine_only(
    "sends takes by hand and counts their answers: a lost answer, sent again, is refused by "
    "its own first write (the engine's callers plan again; this test does not)"
)
def test_takes_at_once_count_the_fence_up_instead_of_refusing_each_other(
    holds: list[Any],
) -> None:
    """Two takes of hinted slots sent from the same view of the row: each gets a slot and the
    next fence, where fences named by the takers (above the one they saw) would refuse the
    slower one, and every take in flight on a busy row."""
    held = [take(holds, "pool", limit=9) for _ in range(3)]
    held[0].release()
    held[1].release()
    before = lock_rows.get_item("pool")
    assert before is not None
    terms = lock_writes.QueueTerms()
    stale_name = slots.take_slot(
        "pool", how="pop", fence=int(before["fence"]), limit=9, queue=terms
    )
    with pytest.raises(dynamodb.Refused):
        slots.send(stale_name)  # a fence not above the stored one: refused
    olds = [
        slots.send(slots.take_slot("pool", how="pop", fence=None, limit=9, queue=terms), old=True)
        for _ in range(2)
    ]
    assert [int(o["fence"]) for o in olds] == [int(before["fence"]), int(before["fence"]) + 1]
    assert sorted(int(o["hints"][0]) for o in olds) == sorted(h.slots["pool"] for h in held[:2])
    after = lock_rows.get_item("pool")
    assert int(after["fence"]) == int(before["fence"]) + 2 and not after["hints"]
    with pytest.raises(ValueError, match="names its fence"):
        slots.take_slot("pool", how="create", fence=None, limit=9, queue=terms)


def test_a_slot_found_by_reading_is_not_taken_past_its_hint(holds: list[Any]) -> None:
    held = [take(holds, "pool", limit=9) for _ in range(2)]
    held[0].release()
    hinted = held[0].slots["pool"]
    terms = lock_writes.QueueTerms()
    with pytest.raises(dynamodb.Refused):
        slots.send(
            slots.take_slot("pool", how="fence", fence=None, slot=hinted, limit=9, queue=terms)
        )
    other = slots.take_slot("pool", how="fence", fence=None, slot=5, limit=9, queue=terms)
    assert slots.send(other, old=True) is not None


@pytest.mark.kind_engine_only(
    "FIFO needs each waiter's entry written before a hand-over passes its ticket: a "
    "throttled or lost entry write joins again at the back (RELIABILITY.md)"
)
def test_a_waiter_sent_to_a_stale_hint_keeps_its_turn(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first waiter, pushed a release, pops a hint whose slot is held (its permit write is
    refused): it takes the next hinted slot still first in line, not behind the waiter that
    came after it. (Waiters look only when pushed, here.)"""
    monkeypatch.setattr(queueing.Pace, "turn_in", lambda *a, **k: 20.0)
    full = [take(holds, "pool", limit=9, lease=30) for _ in range(9)]
    got: list[str] = []

    def waiter(name: str) -> None:
        with semaphore("pool", limit=9, wait=10, fair=True):
            got.append(name)
            time.sleep(0.05)

    first = threading.Thread(target=waiter, args=("first",))
    first.start()
    wait_for_queue("pool", 1)
    second = threading.Thread(target=waiter, args=("second",))
    second.start()
    wait_for_queue("pool", 2)
    slots.send(slots.hint("pool", full[0].slots["pool"]))  # stale: that slot is held
    full[1].release()  # its slot is hinted behind the stale one, and the first waiter pushed
    first.join(5)
    # The first in line entered first. (Its own release pushes the second, which may be in
    # already: CI once saw both here.)
    assert got[:1] == ["first"]
    full[2].release()
    second.join(5)
    assert got == ["first", "second"]


def test_the_lock_list_reads_a_few_permits_of_a_large_semaphore(holds: list[Any]) -> None:
    held = [take(holds, "pool:l", limit=40, user=f"p{i}") for i in range(12)]
    holds[-1].release()  # a free permit among the held ones: not a holder, not counted
    (listed,) = operations.lock_page(prefix="pool:l", holds_per_resource=5).rows
    assert len(listed.holds) == 5 and listed.more_holds
    assert {h.token for h in listed.holds} < {h.token for h in held[:-1]}
    (whole,) = operations.lock_page(prefix="pool:l", holds_per_resource=11).rows
    assert len(whole.holds) == 11 and not whole.more_holds
    assert len(operations.active_holds(prefix="pool:l")) == 11


def test_the_resource_state_reads_permits_a_page_at_a_time(holds: list[Any]) -> None:
    held = [take(holds, "pool:p", limit=40, user=f"p{i}") for i in range(8)]
    pages = holder_pages("pool:p", most=3)
    assert [len(p) for p in pages] == [3, 3, 2]
    assert sorted(t for p in pages for t in p) == sorted(h.token for h in held)


def _is_take(action: dict[str, Any]) -> bool:
    return str(action.get("UpdateExpression", "")).startswith("SET #k = :tok")


def test_a_permit_take_whose_answers_are_lost_until_the_wait_ends_is_given_back(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The permit's write lands, and neither its answer nor the answers of its re-sends come
    back before the caller's wait is over: the caller is told DynamoDB failed, and the permit
    its write may have taken is given back at once, not held by nobody for a whole lease."""
    send, takes = slots.send, []

    def unanswered(action: dict[str, Any], **kwargs: Any) -> Any:
        if not _is_take(action):
            return send(action, **kwargs)
        takes.append(action)
        send(action, **kwargs)  # applied (the first time; a re-send names our token: no-op)
        raise SemaphoreUnavailable("answer lost", transient=True, ambiguous=True)

    monkeypatch.setattr(slots, "send", unanswered)
    with pytest.raises(SemaphoreUnavailable, match="answer lost"):
        semaphore("pool", limit=16, lease=30, wait=0.3).acquire()
    monkeypatch.undo()
    assert len(takes) > 1  # re-sent while the wait lasted
    assert [p.token for p in permit_items("pool") if p.token] == []  # given back
    row = lock_rows.get_item("pool")
    assert row is not None and [int(x) for x in row["hints"]] == [0]  # and hinted, as a release
    again = take(holds, "pool", limit=16, wait=0)
    assert again.slots["pool"] == 0


def test_an_interrupt_after_the_permit_write_gives_the_permit_back(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    send = slots.send

    def interrupted(action: dict[str, Any], **kwargs: Any) -> Any:
        result = send(action, **kwargs)  # the write lands...
        if _is_take(action):
            raise KeyboardInterrupt  # ...and Ctrl-C comes before its answer is used
        return result

    monkeypatch.setattr(slots, "send", interrupted)
    with pytest.raises(KeyboardInterrupt), semaphore("pool", limit=16, lease=30):
        pytest.fail("the block must not run")
    monkeypatch.undo()
    assert [p.token for p in permit_items("pool") if p.token] == []
    assert take(holds, "pool", limit=16, wait=0).slots["pool"] == 0


def test_a_renewal_before_the_hold_knows_its_permits_extends_no_trust(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``acquired()`` starts the heartbeat before the permit hold is told its slots. The
    acquiring thread stalled there past the first renewal's due time (1.5 s, its lease 3 s):
    that renewal, of no permit, must not move the hold's trusted deadline. Nothing renews it
    after that (as when cut off from DynamoDB): once its stored lease end and CLOCK_SKEW are
    past, another process takes its permit over, and by then the hold must say it is lost.
    Before, it trusted its permit for 1.5 s more than its lease: 0.5 s beside the newcomer."""
    from dynasem._engine import heartbeat
    from dynasem._engine.permit_hold import PermitHeld

    for _ in range(8):
        take(holds, "pool", limit=9, lease=60)
    schedule, stalled = heartbeat.later, []

    def later(task: Any, seconds: float) -> None:
        if isinstance(getattr(task, "held", None), PermitHeld) and task.held.lease == 3:
            if not stalled:
                stalled.append(task)
                time.sleep(1.5)  # the acquiring thread, stalled inside acquired()
                task.beat()  # the scheduler's first renewal, due meanwhile
            return  # no renewal lands after it
        schedule(task, seconds)

    monkeypatch.setattr(heartbeat, "later", later)
    mine = take(holds, "pool", limit=9, lease=3)
    slot = mine.slots["pool"]
    permit = next(p for p in permit_items("pool") if p.slot == slot)
    assert stalled and permit.token == mine.token
    time.sleep(max(0.0, permit.holder.expires_ms / 1000 + 0.5 - time.time()) + 0.05)
    newcomer = take(holds, "pool", limit=9, lease=60, wait=0)  # may take it over now
    assert newcomer.slots["pool"] == slot
    assert mine.lost, f"still trusted for {mine.seconds_left():.2f} s beside the newcomer"


@pytest.mark.kind_engine_only("loses one write's answer after the engine applied it")
@pytest.mark.parametrize(
    ("lost", "throttled"),
    [
        (2, 0),
    ],
    ids=["give-back-and-hint"],
)
def test_a_permit_given_back_whose_answers_were_lost_still_wakes_the_waiter(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, lost: int, throttled: int
) -> None:
    """The permit's give-back and its slot's hint each applied, its answer lost, and
    botocore's re-send refused: the give-back's refusal shows our own release (_gave_back),
    the hint's the row it left, pushed to the waiter first in line (hint_freed), as the
    answer would have been. (A hint throttled is sent again, as a give-back is:
    tests/engine/test_review38c_counting.py.)"""
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)  # only a push wakes the waiter
    held = [take(holds, "pool", limit=9, lease=30) for _ in range(9)]
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(take([], "pool", limit=9, wait=30)))
    waiter.start()
    wait_for(lambda: queue_of("pool"), 10, "the waiter never put its entry")
    with Faults(dynamodb.get_client()) as faults:
        losing = faults.lose_response("UpdateItem", lost, after=2 - lost)
        throttling = faults.throttle("UpdateItem", throttled, after=2)
        held[-1].release()
    holds.remove(held[-1])
    assert (losing.fired, throttling.fired) == (lost, throttled)
    waiter.join(5)
    woken = bool(got)
    waiter.join(30)  # its own look finds the slot free at last: let it end either way
    holds.extend(got)
    assert woken, "the waiter was not pushed the slot given back: it sat idle until its look"
