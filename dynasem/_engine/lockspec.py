"""What the waiting and holding code reads of a semaphore: :class:`LockSpec`.

``queueing`` and ``held`` take this, not ``core.Semaphore``: ``core`` imports them, so they
never import it back, not even for a type hint. A ``Semaphore`` is a ``LockSpec`` by its
shape alone (mypy checks it wherever one is passed). This module imports nothing of dynasem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .._storage.records import Mode


class LockSpec(Protocol):
    """What one semaphore asks for (its resources, mode and limit) and how its holds are
    kept, given back and announced. Read-only: the waiting and holding code never sets it."""

    @property
    def resources(self) -> Sequence[str]:
        """The resource(s) taken together, in order; the first names the hold."""

    @property
    def mode(self) -> Mode:
        """The mode as stored: ``Mode.EXCLUSIVE``, ``Mode.COUNTING`` or
        ``Mode.SHARED``."""

    @property
    def limit(self) -> int:
        """How many may hold at once (1 unless counting)."""

    @property
    def shared(self) -> bool:
        """A reader: it holds together with other readers."""

    @property
    def fair(self) -> bool:
        """A waiter always queues (first come, first served) rather than polls."""

    @property
    def max_hold(self) -> float | None:
        """Seconds after which a hold is no longer renewed, but lost (None: no bound)."""

    @property
    def on_commit(self) -> bool:
        """Inside ``transaction.atomic``, give back after the transaction commits."""

    @property
    def using(self) -> str | None:
        """The database alias whose transaction ``on_commit`` waits for (None: default)."""

    @property
    def signal_sender(self) -> type[object]:
        """The ``sender`` of the signals about its holds (the semaphore's class)."""
