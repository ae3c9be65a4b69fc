"""The clocks and fences: every read of the wall or monotonic clock goes through this module.

``wall_clock`` and ``monotonic`` are module attributes so that a test can shift one process's
wall clock (``monkeypatch.setattr(dynasem._clock, "wall_clock", ...)``): every module reads them
from here at call time, never a copy of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def _since_boot() -> float:
    """Seconds since boot, the time the host was suspended included. CLOCK_MONOTONIC
    (``time.monotonic``) stops while the host sleeps (a laptop's lid, an instance hibernated,
    a VM suspended), the other hosts' wall clocks do not: a deadline read on it would outlive
    the lease by the whole sleep, the hold trusted beside the holder that took it over."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _since_start() -> float:
    """macOS's ``clock_gettime(CLOCK_MONOTONIC)``, which counts the time the Mac slept (its
    ``time.monotonic``, ``mach_absolute_time``, stops then, as Linux's CLOCK_MONOTONIC does)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _sleep_counting() -> Callable[[], float]:
    """The monotonic clock that counts a suspended host's sleep where we know one."""
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux
        return _since_boot
    if sys.platform == "darwin":
        return _since_start
    return time.monotonic


wall_clock: Callable[[], float] = time.time
monotonic: Callable[[], float] = _sleep_counting()


def now_ms() -> int:
    return int(wall_clock() * 1000)


def new_fence(skew: float) -> int:
    """A fence from the wall clock: microseconds plus ``skew``, so that one made after a reap
    is larger than any made before it by a clock within ``CLOCK_SKEW`` of ours."""
    return int((wall_clock() + skew) * 1_000_000)
