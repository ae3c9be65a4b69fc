"""Unique tasks, the part every task framework shares: a hold taken when a task is enqueued
and handed to the worker that runs it (``dynasem.celery.UniqueTask``).

The hold spans queue and run. At enqueue it is taken with the *queue lease* and no
heartbeat, under the task's id as its user (``task:<id>``), and without this process's
identity (the process that enqueues may exit at once: its end must not free the key). Its
resource, token and fence travel with the message. The worker that starts the task adopts
it: one renewal, conditional on the token, gives it the *run lease*, and the heartbeat keeps
it while the task runs; it is given back when the task ends. A task that never starts (a lost
message, a revoked task, a worker that died with it prefetched) frees its key when the queue
lease ends; a worker killed mid-task, when the run lease ends. An enqueue that finds the key
held gets the id of the task that holds it (:class:`Taken`), and enqueues nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import clock
from .drivers import run_sync
from .entered import forget_entered, remember_acquired, remember_entered
from .exceptions import LockLost, SemaphoreBusy
from .held import Held
from .validation import resolve_timing

__all__ = [
    "Claim",
    "Taken",
    "adopt",
    "claim",
    "give_back",
    "hand_on",
    "running",
    "take_back",
    "task_of",
]

logger = logging.getLogger("dynasem")

USER_PREFIX = "task:"


@dataclass(frozen=True)
class Claim:
    """A key taken for a task about to be enqueued: what travels with its message."""

    resource: str
    token: str
    fence: int
    task_id: str

    def header(self) -> dict[str, Any]:
        return {"resource": self.resource, "token": self.token, "fence": self.fence,
                "task_id": self.task_id}  # fmt: skip

    @classmethod
    def from_header(cls, header: Any) -> Claim | None:
        if not isinstance(header, dict):
            return None
        try:
            return cls(
                str(header["resource"]), str(header["token"]), int(header["fence"]),
                str(header["task_id"]),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None


class Taken(Exception):
    """The key is held by the task ``task_id`` (queued or running): nothing was enqueued."""

    def __init__(self, resource: str, task_id: str | None):
        super().__init__(resource, task_id)
        self.resource = resource
        self.task_id = task_id


def task_of(user_id: str | None) -> str | None:
    """The task id a unique task's hold records as its user, or None."""
    if user_id and user_id.startswith(USER_PREFIX):
        return user_id[len(USER_PREFIX) :]
    return None


def claim(resource: str, task_id: str, queue_lease: float) -> Claim:
    """Take ``resource`` for the task ``task_id`` for ``queue_lease`` seconds (one attempt,
    no heartbeat); :class:`Taken` if a task holds it already."""
    from .core import semaphore  # core imports nothing of this module

    sem = semaphore(
        resource, wait=0, lease=queue_lease, user=USER_PREFIX + task_id, on_commit=False
    )
    sem.detached = True  # not this process's hold: its end must not free the key
    try:
        # Not sem.acquire(): a hold this thread remembered would be re-entered by the next
        # enqueue of the same key in this thread, which must find it taken instead.
        held = run_sync(sem._acquire_steps())
    except SemaphoreBusy as busy:
        raise Taken(resource, task_of(busy.holder_user_id)) from None
    held._stop_heartbeat()  # the queue lease is all it gets until a worker adopts it
    return Claim(resource, held.token, held.fence, task_id)


def adopt(claim: Claim, lease: float | None = None) -> Held:
    """The worker's side: make the claimed hold this process's for the run (``lease``, the
    setting if None), renewed by the heartbeat. :class:`LockLost` if it is not the task's
    any more (its queue lease ran out and another task took the key)."""
    from .core import semaphore

    sem = semaphore(claim.resource, lease=lease, on_commit=False)
    lease_s, _, skew = resolve_timing(lease, 0)
    held = Held(
        sem,
        token=claim.token,
        user_id=USER_PREFIX + claim.task_id,
        fences={claim.resource: claim.fence},
        lease=lease_s,
        skew=skew,
        expires_ms=0,
        sent_mono=clock.monotonic(),
    )
    try:
        held.renew()  # conditional on the token: ours only if nobody took the key since
    except LockLost:
        held._stop_heartbeat()
        raise
    held._start_heartbeat()
    return held


@contextlib.contextmanager
def running(held: Held) -> Iterator[Held]:
    """The task's run: its hold is this thread's or coroutine's, as a ``with semaphore()``
    block's is (``current_hold()``; a ``semaphore()`` of its key inside re-enters it)."""
    remember_entered(held, held)
    remember_acquired(held)
    try:
        yield held
    finally:
        forget_entered(held)


def hand_on(held: Held, queue_lease: float) -> None:
    """A run's hold goes on with its retry's message: the queue lease again, no heartbeat
    here; the run that ends does not give it back (``held.handed_on``)."""
    held.lease = queue_lease
    held.renew()
    held._stop_heartbeat()
    held.handed_on = True


def take_back(held: Held, run_lease: float) -> None:
    """A retry that could not be enqueued: the run keeps its hold, renewed as before."""
    held.handed_on = False
    held.lease = run_lease
    held.renew()
    held._start_heartbeat()


def give_back(taken: Claim) -> None:
    """Free a claimed key now (its task was not enqueued, or was revoked); quietly, since its
    queue lease ends it anyway."""
    try:
        adopt(taken).release()
    except LockLost:
        pass
    except Exception:
        logger.warning("dynasem: could not give back %r", taken.resource, exc_info=True)
