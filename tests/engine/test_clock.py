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


def test_the_lock_reads_no_clock_but_through_dynasem_clock() -> None:
    """The engine and storage read the wall and monotonic clocks only through _clock (a test
    or the simulator that shifts one host's clock shifts all of it). Found by the simulator:
    queue_entries.load_entries read time.time() and push its arrivals from time.monotonic()."""
    import re
    from pathlib import Path

    import dynasem

    root = Path(dynasem.__file__).parent
    read = re.compile(r"\btime\.(time|monotonic|time_ns|monotonic_ns)\(")
    # When to log, when the heartbeat's timer thread wakes (its waits are real), how long a
    # hand-over's request took (a span): none of them a lease decision.
    allowed = {
        "_engine/push.py:_bad_mac",
        "_engine/heartbeat.py:add",
        "_engine/heartbeat.py:_run",
        "_engine/hold.py:_send_hand_over",
    }
    found = []
    for path in [*root.glob("_engine/*.py"), *root.glob("_storage/*.py")]:
        current = ""
        for line in path.read_text().splitlines():
            if m := re.match(r"\s*def (\w+)", line):
                current = m.group(1)
            if read.search(line) and f"{path.parent.name}/{path.name}:{current}" not in allowed:
                found.append(f"{path.parent.name}/{path.name}:{current}: {line.strip()}")
    assert found == []
