"""Background lease renewal: one daemon thread per live hold.

It renews well before the lease could run out (every third of ``lease - CLOCK_SKEW``), retries
transient failures quickly, and declares the hold lost only when it can really have run out:
our own deadline (``sent + lease - CLOCK_SKEW``) passed without a successful renewal, or a
renewal was refused because the hold is no longer ours. Each renewal runs in a short-lived
worker thread, so a request hanging on a dead endpoint cannot hold the loss back past the
deadline.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

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

    def _renew(self) -> BaseException | None:
        """One renewal, given at most until the deadline; its error, or None."""
        outcome: dict[str, Any] = {}

        def attempt() -> None:
            try:
                self.held.renew()
                outcome["ok"] = True
            except BaseException as exc:  # handed to the heartbeat thread
                outcome["error"] = exc

        worker = threading.Thread(target=attempt, name=f"{self.name}:renew", daemon=True)
        worker.start()
        worker.join(self.held.seconds_left() + 0.01)
        if worker.is_alive():
            return SemaphoreUnavailable("renewal still unanswered at the lease deadline")
        return outcome.get("error")

    def run(self) -> None:
        held = self.held
        pause = self.interval
        while not self._stopped.wait(pause):
            error = self._renew()
            if self._stopped.is_set():
                return
            if isinstance(error, LockLost):
                return  # renew() already marked it lost and sent lock_lost
            if isinstance(error, SemaphoreUnavailable):
                left = held.seconds_left()
                if left <= 0:
                    held._check_deadline()
                    return
                # Retry soon, but often enough to get several tries in before the deadline.
                pause = max(RETRY_MIN, min(self.interval / 3, left / 4))
                logger.info("dynasem: renewing %r failed (%s); retrying", held.resource, error)
                continue
            if error is not None:  # never let the thread die silently with a live hold
                logger.error("dynasem: unexpected error renewing %r: %r", held.resource, error)
                pause = RETRY_MIN
                continue
            pause = self.interval
