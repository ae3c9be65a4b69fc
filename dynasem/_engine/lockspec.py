"""What the waiting and holding code reads of a semaphore: :class:`LockSpec`.

``queue`` and ``hold`` take this, not ``core.Semaphore``: ``core`` imports them, so they
never import it back, not even for a type hint. A ``Semaphore`` is a ``LockSpec`` by its
shape alone (mypy checks it wherever one is passed). :class:`Attempt` is one acquisition of
it, which every step of the acquire loop reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .. import _clock as clock
from .._storage.records import Holder, Mode


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


@dataclass
class Attempt:
    """One acquisition, as every step of its loop reads it: the semaphore, our token (one for
    every retry: it recognises our own writes), the holder recorded, the lease and CLOCK_SKEW
    (seconds), the trust a hold must have left when it is returned (``margin``), and the end
    of the wait (``deadline``, monotonic)."""

    sem: LockSpec
    token: str
    user_id: str
    proc: str | None
    lease: float
    skew: float
    margin: float
    deadline: float
    late: int = 0  # takes given back: their answers came too late to trust
    # Resources where a try of one of our reader items' writes timed out (or botocore sent
    # it again): it may still land, after an admission given back and made again too; the
    # hold's release leaves our tombstone there, not a delete (ReaderHeld.late).
    stray: set[str] = field(default_factory=set)
    # The holds this acquire succeeds (their tokens): those of the run a task's retry was sent
    # from, still in their block when it was sent. One of them in the way is waited out, up
    # to when it could be taken over (queue.wait_out), not refused at the wait's end.
    after: frozenset[str] = frozenset()
    # The end of the wait as asked (``deadline`` may be moved past it while one of ``after``
    # is in the way, and back).
    asked: float = field(init=False)

    def __post_init__(self) -> None:
        self.asked = self.deadline

    def remaining(self) -> float:
        """Seconds left of the wait."""
        return self.deadline - clock.monotonic()

    def stale_ms(self, now_ms: int) -> int:
        """The lease end before which a holder may be taken over (``now_ms`` less the skew)."""
        return now_ms - int(self.skew * 1000)

    def holder(self, now_ms: int, fence: int, *, shared: bool) -> Holder:
        """Our entry as a holder, its lease from ``now_ms``."""
        expires_ms = now_ms + int(self.lease * 1000)
        return Holder(
            self.user_id, expires_ms, fence, acquired_ms=now_ms, shared=shared, proc=self.proc
        )
