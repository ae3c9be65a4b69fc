"""dynasem._engine.queue: the pacing and backoff of a waiter, without DynamoDB."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dynasem import _clock as clock
from dynasem._engine import queue as queueing
from dynasem._engine.lockspec import Attempt
from dynasem._engine.queue import Pace
from dynasem._storage import lock_rows, records


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> int:
    """The wall clock stopped at 1,000 s (now_ms = 1,000,000)."""
    monkeypatch.setattr(clock, "wall_clock", lambda: 1_000.0)
    return 1_000_000


def holder(ends_ms: int, taken_ms: int, user: str = "u") -> records.Holder:
    return records.Holder(user, ends_ms, 1, acquired_ms=taken_ms)


def waiter(ticket: int, ends_ms: int) -> records.Waiter:
    return records.Waiter(ticket, ends_ms, user_id="w", lease_ms=10_000)


def in_line(queue: dict[str, records.Waiter]) -> dict[str, Any]:
    """LockItem fields for ``queue`` (token -> entry, tickets as given) as the entry items a
    waiter read: every ticket up to the last one read (a ticket with no entry: one that left)."""
    entries = sorted((dataclasses.replace(w, token=t) for t, w in queue.items()), key=ticket_of)
    last = max((w.ticket for w in entries), default=0)
    return {
        "queue_id": 1,
        "queue_in": last,
        "queue_out": 0,
        "entries": tuple(entries),
        "entries_to": last,
    }


def ticket_of(w: records.Waiter) -> int:
    return w.ticket


def pace_of(item: records.LockItem, token: str = "me") -> Pace:
    """A Pace for the waiter ``token`` of ``item``'s line (not queued if it is not in it)."""
    pace = Pace()
    mine = [w for w in item.entries or () if w.token == token]
    pace.ticket = mine[0].ticket if mine else None
    return pace


def test_backoff_doubles_from_the_first_pause_up_to_the_cap() -> None:
    for attempt, cap in [(1, 0.02), (2, 0.04), (3, 0.08), (10, queueing.BACKOFF_CAP)]:
        pauses = [queueing.backoff(attempt) for _ in range(50)]
        assert all(cap / 2 <= p <= cap for p in pauses)


def test_seconds_until_free_is_the_first_lease_end_plus_skew(frozen: int) -> None:
    blocked = {"r": {"a": holder(frozen + 2_000, frozen), "b": holder(frozen + 5_000, frozen)}}
    assert queueing.seconds_until_free(blocked, 0.5) == pytest.approx(2.5)
    assert queueing.seconds_until_free({"r": {"a": holder(frozen - 9_000, 0)}}, 0.5) == 0.0
    assert queueing.seconds_until_free({"r": {}}, 0.5) == queueing.BACKOFF_CAP


def test_live_holders_leave_out_the_stale(frozen: int) -> None:
    item = records.LockItem(holders={"old": holder(frozen - 1, 0), "live": holder(frozen + 1, 0)})
    assert list(queueing.live_holders(item, frozen)) == ["live"]
    assert queueing.live_holders(None, frozen) == {}


def test_turn_in_aims_at_the_end_of_the_hold_ahead(frozen: int) -> None:
    """A holder that took the lock 5 ms ago with holds of 20 ms: our turn is in about 15 ms
    plus a round trip, never later than the holder's lease end plus the skew."""
    seen = records.LockItem(
        holders={"h": holder(frozen + 10_000, frozen - 5)},
        **in_line({"me": waiter(1, frozen + 10_000)}),
        hold_ms=20,
    )
    pace = pace_of(seen)
    turn = pace.turn_in(seen, "me", 0.5)
    assert turn == pytest.approx((20 - 5 + pace.rtt * 1000) / 1000)
    assert pace.until_free == pytest.approx(10.5 + 0.001)


def test_turn_in_backs_off_while_nothing_moves(frozen: int) -> None:
    """An overdue holder: each look that finds the same state doubles the pause."""
    pace = Pace()
    seen = records.LockItem(holders={"h": holder(frozen + 10_000, frozen - 1_000)}, hold_ms=20)
    pauses = [pace.turn_in(seen, "me", 0.5) for _ in range(4)]
    assert pauses[1] == pytest.approx(2 * pauses[0])
    assert pauses[3] == pytest.approx(8 * pauses[0])


def test_turn_in_waits_behind_the_waiters_ahead_only(frozen: int) -> None:
    base = records.LockItem(holders={"h": holder(frozen + 10_000, frozen)}, hold_ms=20)
    first = dataclasses.replace(base, **in_line({"me": waiter(1, frozen + 9_000)}))
    alone = pace_of(first).turn_in(first, "me", 0.5)
    line = dataclasses.replace(
        base,
        **in_line(
            {
                "me": waiter(5, frozen + 9_000),
                "first": waiter(1, frozen + 9_000),  # ahead of us
                "dead": waiter(2, frozen - 9_000),  # ahead, but its entry expired
                "later": waiter(9, frozen + 9_000),  # behind us
            }
        ),
    )
    behind = pace_of(line).turn_in(line, "me", 0.5)
    rtt = Pace().rtt
    assert behind - alone == pytest.approx((20 + 2 * rtt * 1000) / 1000)


def test_a_pushed_waiter_far_back_looks_when_its_turn_should_come(frozen: int) -> None:
    """100 waiters ahead with 20 ms holds: a waiter that is pushed its hand-over looks only
    when its turn should come (its look is the fallback for a lost push), not every second
    as one that must find out by reading; one with nobody ahead looks as often as ever."""
    queue = {f"w{i}": waiter(i, frozen + 50_000) for i in range(100)}
    queue["me"] = waiter(1_000, frozen + 50_000)
    seen = records.LockItem(
        holders={"h": holder(frozen + 50_000, frozen)}, **in_line(queue), hold_ms=20
    )
    pushed = pace_of(seen).turn_in(seen, "me", 0.5, pushed=True)
    assert pushed == pytest.approx((20 + Pace().rtt * 1000 + 100 * (20 + 2 * 5)) / 1000)
    assert pace_of(seen).turn_in(seen, "me", 0.5, pushed=False) == 1.0
    head = dataclasses.replace(seen, **in_line({"me": waiter(1, frozen + 50_000)}), hold_ms=5_000)
    assert pace_of(head).turn_in(head, "me", 0.5, pushed=True) == 1.0


def test_answered_averages_round_trips_and_ignores_outliers() -> None:
    pace = Pace()
    pace.answered(0.009)
    assert pace.rtt == pytest.approx((3 * 0.005 + 0.009) / 4)
    pace.answered(30.0)  # a stalled read counts as half a second at most
    assert pace.rtt < 0.135


# ---------------------------------------------------------------------------------------------
# What a caller that gives up is told: estimate_wait, retry_after, busy
# ---------------------------------------------------------------------------------------------


def shared_holder(ends_ms: int, taken_ms: int) -> records.Holder:
    return records.Holder("reader", ends_ms, 1, acquired_ms=taken_ms, shared=True)


def queued(ticket: int, ends_ms: int, *, shared: bool = False) -> records.Waiter:
    return records.Waiter(ticket, ends_ms, user_id="w", shared=shared, lease_ms=10_000)


def estimate(item: records.LockItem, *, shared: bool = False, token: str = "me") -> Any:
    mine = [w.ticket for w in item.entries or () if w.token == token]
    return queueing.estimate_wait(item, shared=shared, skew=0.5, ticket=mine[0] if mine else None)


def test_a_holder_is_expected_to_hold_for_the_average_hold(frozen: int) -> None:
    """Taken 100 ms ago, holds average 300 ms: done in about 200 ms. Its lease end (60 s
    away, renewed while it lives) says nothing about when it will be done."""
    item = records.LockItem(holders={"h": holder(frozen + 60_000, frozen - 100)}, hold_ms=300)
    assert estimate(item) == (pytest.approx(0.2), 1)


def test_a_holder_past_the_average_is_expected_to_hold_as_long_again(frozen: int) -> None:
    """Held 2 s where holds average 0.3 s: nothing says when it ends; as long again as it has
    held so far (so callers of an ever longer hold are told to come back ever later)."""
    late = records.LockItem(holders={"h": holder(frozen + 60_000, frozen - 2_000)}, hold_ms=300)
    assert estimate(late).seconds == pytest.approx(2.0)
    unknown = records.LockItem(holders={"h": holder(frozen + 60_000, frozen - 1_500)})
    assert estimate(unknown).seconds == pytest.approx(1.5)  # no average stored yet: the same
    fresh = records.LockItem(holders={"h": holder(frozen + 60_000, frozen)})
    assert estimate(fresh).seconds == 0.0


def test_a_holder_that_stopped_renewing_is_free_at_its_takeover(frozen: int) -> None:
    """Its lease ended 100 ms ago unrenewed: dead (or paused); free once it can be taken
    over, at its lease end + CLOCK_SKEW, whatever the average says."""
    item = records.LockItem(holders={"h": holder(frozen - 100, frozen - 5_000)}, hold_ms=300)
    assert estimate(item).seconds == pytest.approx(0.4)


def test_every_live_waiter_ahead_takes_an_average_hold(frozen: int) -> None:
    item = records.LockItem(
        holders={"h": holder(frozen + 60_000, frozen - 100)},
        **in_line(
            {
                "first": queued(1, frozen + 9_000),
                "second": queued(2, frozen + 9_000),
                "dead": queued(3, frozen - 9_000),  # its entry expired: skipped
                "me": queued(4, frozen + 9_000),
                "later": queued(9, frozen + 9_000),  # behind us
            }
        ),
        hold_ms=300,
    )
    assert estimate(item) == (pytest.approx(0.2 + 2 * 0.3), 3)
    # Not queued (a wait=0 caller): every live waiter is ahead of it.
    assert estimate(item, token="outsider") == (pytest.approx(0.2 + 4 * 0.3), 5)


def test_waiters_ahead_with_no_average_take_what_the_holder_has_held(frozen: int) -> None:
    item = records.LockItem(
        holders={"h": holder(frozen + 60_000, frozen - 400)},
        **in_line({"first": queued(1, frozen + 9_000)}),
    )
    assert estimate(item) == (pytest.approx(0.4 + 0.4), 2)


def test_counting_waits_for_the_first_slot_the_waiters_ahead_leave(frozen: int) -> None:
    """limit=2, slots free at +0.1 s and +0.4 s, two waiters ahead holding 0.3 s each: the
    first takes the slot at +0.1 (until +0.4), the second one at +0.4; ours frees at +0.4."""
    item = records.LockItem(
        holders={
            "a": holder(frozen + 60_000, frozen - 200),
            "b": holder(frozen + 60_000, frozen + 100),
        },
        **in_line({"w1": queued(1, frozen + 9_000), "w2": queued(2, frozen + 9_000)}),
        mode="n",
        limit=2,
        hold_ms=300,
    )
    assert estimate(item) == (pytest.approx(0.4), 3)


def test_counting_with_free_slots_and_a_huge_limit_is_quick(frozen: int) -> None:
    item = records.LockItem(
        holders={"a": holder(frozen + 60_000, frozen)},
        **in_line({"w1": queued(1, frozen + 9_000)}),
        mode="n",
        limit=10**9,
        hold_ms=300,
    )
    assert estimate(item) == (0.0, 2)


def test_a_writer_waits_for_every_reader(frozen: int) -> None:
    readers = {
        "r1": shared_holder(frozen + 60_000, frozen - 100),
        "r2": shared_holder(frozen + 60_000, frozen - 250),
    }
    item = records.LockItem(holders=readers, mode="s", hold_ms=300)
    assert estimate(item).seconds == pytest.approx(0.2)  # the later of 0.2 and 0.05


def test_a_reader_behind_a_queued_writer_waits_for_the_writer(frozen: int) -> None:
    item = records.LockItem(
        holders={"r1": shared_holder(frozen + 60_000, frozen - 100)},
        **in_line({"writer": queued(1, frozen + 9_000)}),
        mode="s",
        hold_ms=300,
    )
    assert estimate(item, shared=True) == (pytest.approx(0.2 + 0.3), 2)


def test_a_reader_behind_queued_readers_goes_in_with_them(frozen: int) -> None:
    """A writer holds; readers queued behind it all go in when it leaves, us with them."""
    item = records.LockItem(
        holders={"w": holder(frozen + 60_000, frozen - 100)},
        **in_line(
            {
                "r1": queued(1, frozen + 9_000, shared=True),
                "r2": queued(2, frozen + 9_000, shared=True),
            }
        ),
        hold_ms=300,
    )
    assert estimate(item, shared=True) == (pytest.approx(0.2), 3)
    assert estimate(item, shared=False) == (pytest.approx(0.2 + 0.3), 3)  # a writer: after them


def test_retry_after_is_whole_seconds_at_least_one_never_past_the_takeover() -> None:
    assert queueing.retry_after(0.0, 65.0) == 1
    assert queueing.retry_after(0.2, 65.0) == 1
    assert queueing.retry_after(1.0, 65.0) == 1
    assert queueing.retry_after(1.2, 65.0) == 2
    assert queueing.retry_after(600.0, 64.2) == 65  # a dead holder is taken over by then
    assert queueing.retry_after(3.0, 0.0) == 1


def test_busy_tells_the_estimate_and_the_queue_position(frozen: int) -> None:
    from dynasem import semaphore
    from dynasem.signals import lock_busy

    item = records.LockItem(
        resource="r",
        holders={"h": holder(frozen + 60_000, frozen - 100, user="alice")},
        **in_line({"first": queued(1, frozen + 9_000)}),
        hold_ms=300,
    )
    sent: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        sent.append(kwargs)

    lock_busy.connect(receiver)
    try:
        run = Attempt(
            semaphore("r"), "me", "bob", None, lease=10.0, skew=0.5, margin=0.0, deadline=0.0
        )
        exc = queueing.busy(run, {"r": queueing.live_holders(item, frozen)}, {"r": item})
        queueing.busy_announced(run, exc).send()  # the acquire loop's last step
    finally:
        lock_busy.disconnect(receiver)
    assert (exc.resource, exc.holder_user_id, exc.retry_after) == ("r", "alice", 1)
    assert (exc.queue_position, exc.estimated_wait) == (2, pytest.approx(0.5))
    assert sent[0]["queue_position"] == 2
    assert sent[0]["estimated_wait"] == pytest.approx(0.5)
    assert sent[0]["retry_after"] == 1


class Counting:
    """What :func:`dynasem._engine.queue.free_room` asks of a semaphore."""

    def __init__(self, limit: int, shared: bool = False):
        self.limit, self.shared = limit, shared


def test_free_room_counts_free_permits_inline_and_in_permit_items(frozen: int) -> None:
    two_held = records.LockItem(
        holders={"a": holder(frozen + 9_000, frozen), "b": holder(frozen + 9_000, frozen)},
        mode="n",
    )
    expired = dataclasses.replace(
        two_held, holders={**two_held.holders, "c": holder(frozen - 9_000, 0)}
    )
    assert queueing.free_room(Counting(3), two_held, frozen) == 1  # type: ignore[arg-type]
    assert queueing.free_room(Counting(3), expired, frozen) == 1  # type: ignore[arg-type]
    permit_row = records.LockItem(slots_used=10, hints=(3, 3, 7))  # a hint twice counts once
    assert queueing.free_room(Counting(12), permit_row, frozen) == 4  # type: ignore[arg-type]
    assert queueing.free_room(Counting(1), two_held, frozen) == 0  # type: ignore[arg-type]
    assert queueing.free_room(Counting(3, shared=True), two_held, frozen) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("push_address", "holder_proc", "counted_on"),
    [
        ("127.0.0.1", "here", True),  # this host's holder pushes to our loopback address
        ("127.0.0.1", "elsewhere", False),  # another host's cannot reach it (seed 20081)
        ("127.0.0.1", None, False),  # not recorded: it may be anywhere
        ("10.0.0.7", "elsewhere", True),  # a routable address: any host's holder reaches it
    ],
)
def test_a_waiter_counts_on_a_push_only_from_holders_that_can_send_it(
    frozen: int, monkeypatch: pytest.MonkeyPatch, push_address: str, holder_proc: str | None,
    counted_on: bool,
) -> None:  # fmt: skip
    from django.test import override_settings

    from dynasem._engine import processes
    from dynasem.conf import settings

    monkeypatch.setattr(processes, "local", lambda recorded: recorded == "here")
    held = dataclasses.replace(holder(frozen + 50_000, frozen), proc=holder_proc)
    seen = records.LockItem(holders={"h": held})
    with override_settings(DYNASEM=dict(settings.raw, PUSH=push_address)):
        assert queueing._pushers_reach_us(seen, frozen) is counted_on
        assert queueing._pushers_reach_us(records.LockItem(), frozen)  # nobody in the way


def test_turn_in_with_a_free_permit_for_us_looks_within_round_trips(frozen: int) -> None:
    """Three permits, all held for a second yet: second in line waits about a hold. With two
    permits free it only waits for the one ahead to take its own: a few round trips; and
    doubling while nothing moves (a dead waiter ahead), at most a second."""
    line = in_line({"first": waiter(1, frozen + 9_000), "me": waiter(2, frozen + 9_000)})
    held = {f"h{i}": holder(frozen + 9_000, frozen) for i in range(3)}
    seen = records.LockItem(holders=held, mode="n", hold_ms=1_000, **line)
    full = pace_of(seen).turn_in(seen, "me", 0.5, room=0, limit=3)
    assert full > 0.9
    pace = pace_of(seen)
    looks = [pace.turn_in(seen, "me", 0.5, room=2, limit=3) for _ in range(12)]
    assert looks[0] == pytest.approx(2 * pace.rtt)
    assert looks[1] == pytest.approx(2 * looks[0])
    assert max(looks) == 1.0
    told = pace_of(seen).turn_in(seen, "me", 0.5, pushed=True, room=2, limit=3)
    assert told == pytest.approx(4 * looks[0])  # the take ahead pushes us: a later fallback


def test_turn_in_of_a_counting_semaphore_serves_limit_waiters_a_turn(frozen: int) -> None:
    """Six waiters ahead, three permits all held: two turns of the holds ahead, not six."""
    line = in_line({**{f"w{i}": waiter(i, frozen + 9_000) for i in range(1, 7)}})
    line = in_line(
        {
            **{f"w{i}": waiter(i, frozen + 9_000) for i in range(1, 7)},
            "me": waiter(7, frozen + 9_000),
        }
    )
    held = {f"h{i}": holder(frozen + 9_000, frozen) for i in range(3)}
    seen = records.LockItem(holders=held, mode="n", hold_ms=100, **line)
    pace = pace_of(seen)
    counting = pace.turn_in(seen, "me", 0.5, room=0, limit=3)
    exclusive = pace_of(seen).turn_in(seen, "me", 0.5)
    rtt_ms = pace.rtt * 1000
    assert counting == pytest.approx((100 + rtt_ms + (100 + 2 * rtt_ms) * 2) / 1000)
    assert exclusive == pytest.approx((100 + rtt_ms + (100 + 2 * rtt_ms) * 6) / 1000)


def test_a_look_at_an_older_row_never_draws_a_second_ticket(lock_table, monkeypatch):
    """On AWS a queued waiter's eventually consistent look may return the row as it was
    before its ticket was drawn (no queue yet: qbase 0). Taken for a new row, it made the
    waiter join again, behind its own first entry, which nobody serves until it expires: the
    waiter sat out the dead holder's takeover (found on the unkind engine, issue 40)."""
    from dynasem import SemaphoreBusy, semaphore

    holder = semaphore("stale:q", lease=10).acquire()
    before_any_ticket = lock_rows.get("stale:q")
    assert before_any_ticket is not None and before_any_ticket.queue_id == 0
    real_get = lock_rows.get

    def stale_get(resource: str, *, consistent: bool = True) -> Any:
        return before_any_ticket if not consistent else real_get(resource)

    monkeypatch.setattr(lock_rows, "get", stale_get)
    try:
        with pytest.raises(SemaphoreBusy):
            semaphore("stale:q", wait=2.0, fair=True).acquire()
    finally:
        monkeypatch.undo()
        holder.release()
    after = lock_rows.get("stale:q")
    assert after is not None and after.queue_in == 1  # one ticket: the waiter never joined again
