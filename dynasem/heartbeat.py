"""Background lease renewal: one daemon thread per live hold.

It renews well before the lease could run out (every third of ``lease - CLOCK_SKEW``), retries
transient failures quickly, and declares the hold lost only when it can really have run out:
our own deadline (``sent + lease - CLOCK_SKEW``) passed without a successful renewal, or a
renewal was refused because the hold is no longer ours.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from . import core
from .exceptions import LockLost, SemaphoreUnavailable

if TYPE_CHECKING:
    from .core import Held

logger = logging.getLogger("dynasem")

# Shortest pause between two attempts after a transient failure (seconds).
RETRY_MIN = 0.05


class Heartbeat(threading.Thread):
    def __init__(self, held: Held):
        super().__init__(name=f"dynasem-heartbeat:{held.resource[:40]}", daemon=True)
        self.held = held
        self.interval = max(0.05, (held.lease - held.skew) / 3)
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        held = self.held
        pause = self.interval
        while not self._stopped.wait(pause):
            try:
                held.renew()
            except LockLost:
                return  # renew() already marked it lost and sent lock_lost
            except SemaphoreUnavailable as exc:
                left = held.seconds_left()
                if left <= 0:
                    held._check_deadline()
                    return
                # Retry soon, but often enough to get several tries in before the deadline.
                pause = max(RETRY_MIN, min(self.interval / 3, left / 4))
                logger.info("dynasem: renewing %r failed (%s); retrying", held.resource, exc)
                continue
            except Exception:  # never let the thread die silently with a live hold
                logger.exception("dynasem: unexpected error renewing %r", held.resource)
                pause = RETRY_MIN
                continue
            pause = self.interval
        return


__all__ = ["Heartbeat", "core"]
