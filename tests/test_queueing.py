"""dynasem.queueing: the pacing and backoff of a waiter, without DynamoDB."""

from __future__ import annotations

import dataclasses

import pytest

from dynasem import clock, queueing, table
from dynasem.queueing import Pace


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> int:
    """The wall clock stopped at 1,000 s (now_ms = 1,000,000)."""
    monkeypatch.setattr(clock, "wall_clock", lambda: 1_000.0)
    return 1_000_000


def holder(ends_ms: int, taken_ms: int, user: str = "u") -> table.Holder:
    return table.Holder(user, ends_ms, 1, acquired_ms=taken_ms)


def waiter(ticket: int, ends_ms: int) -> table.Waiter:
    return table.Waiter(ticket, ends_ms, user_id="w", lease_ms=10_000)


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
    item = table.LockItem(holders={"old": holder(frozen - 1, 0), "live": holder(frozen + 1, 0)})
    assert list(queueing.live_holders(item, frozen)) == ["live"]
    assert queueing.live_holders(None, frozen) == {}


def test_turn_in_aims_at_the_end_of_the_hold_ahead(frozen: int) -> None:
    """A holder that took the lock 5 ms ago with holds of 20 ms: our turn is in about 15 ms
    plus a round trip, never later than the holder's lease end plus the skew."""
    pace = Pace()
    seen = table.LockItem(
        holders={"h": holder(frozen + 10_000, frozen - 5)},
        queue={"me": waiter(1, frozen + 10_000)},
        has_queue=True,
        hold_ms=20,
    )
    turn = pace.turn_in(seen, "me", 0.5)
    assert turn == pytest.approx((20 - 5 + pace.rtt * 1000) / 1000)
    assert pace.until_free == pytest.approx(10.5 + 0.001)


def test_turn_in_backs_off_while_nothing_moves(frozen: int) -> None:
    """An overdue holder: each look that finds the same state doubles the pause."""
    pace = Pace()
    seen = table.LockItem(holders={"h": holder(frozen + 10_000, frozen - 1_000)}, hold_ms=20)
    pauses = [pace.turn_in(seen, "me", 0.5) for _ in range(4)]
    assert pauses[1] == pytest.approx(2 * pauses[0])
    assert pauses[3] == pytest.approx(8 * pauses[0])


def test_turn_in_waits_behind_the_waiters_ahead_only(frozen: int) -> None:
    pace = Pace()
    base = table.LockItem(holders={"h": holder(frozen + 10_000, frozen)}, hold_ms=20)
    alone = pace.turn_in(
        dataclasses.replace(base, queue={"me": waiter(5, frozen + 9_000)}), "me", 0.5
    )
    behind = Pace().turn_in(
        dataclasses.replace(
            base,
            queue={
                "me": waiter(5, frozen + 9_000),
                "first": waiter(1, frozen + 9_000),  # ahead of us
                "dead": waiter(2, frozen - 9_000),  # ahead, but its entry expired
                "later": waiter(9, frozen + 9_000),  # behind us
            },
        ),
        "me",
        0.5,
    )
    rtt = Pace().rtt
    assert behind - alone == pytest.approx((20 + 2 * rtt * 1000) / 1000)


def test_answered_averages_round_trips_and_ignores_outliers() -> None:
    pace = Pace()
    pace.answered(0.009)
    assert pace.rtt == pytest.approx((3 * 0.005 + 0.009) / 4)
    pace.answered(30.0)  # a stalled read counts as half a second at most
    assert pace.rtt < 0.135
