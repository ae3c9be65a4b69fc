"""dynasem._clock: the one place clocks are read, so that shifting it shifts every module."""

from __future__ import annotations

import time

import pytest

from dynasem import _clock as clock
from dynasem import semaphore
from dynasem.testing import abandon


def test_now_ms_and_new_fence_follow_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "wall_clock", lambda: 1_000.25)
    assert clock.now_ms() == 1_000_250
    # Microseconds, with the skew added: ahead of any fence a clock within the skew made.
    assert clock.new_fence(0) == 1_000_250_000
    assert clock.new_fence(0.5) == 1_000_750_000


def test_a_shifted_wall_clock_shifts_the_hold_taken(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails if any module kept its own copy of the clock: the lease end and the fence of a
    hold are both read from the patched clock (an hour ahead)."""
    ahead = 3600.0
    monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + ahead)
    with semaphore("clock:shifted", lease=30) as held:
        expires_in = held.expires.timestamp() - time.time()
        fence_s = held.fence / 1_000_000 - time.time()
    assert ahead + 25 < expires_in < ahead + 35
    assert ahead - 5 < fence_s < ahead + 60


def test_a_shifted_monotonic_clock_is_read_by_the_hold(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held reads clock.monotonic at call time: moving it past the trusted deadline makes the
    hold lost without waiting a lease."""
    held = semaphore("clock:mono", lease=30).acquire()
    try:
        assert held.seconds_left() > 20
        real = time.monotonic
        monkeypatch.setattr(clock, "monotonic", lambda: real() + 60)
        assert held.seconds_left() == 0
        assert held.lost
    finally:
        monkeypatch.undo()
        abandon(held)
