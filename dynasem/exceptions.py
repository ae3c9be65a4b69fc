"""The exceptions users catch. All derive from ``SemaphoreError``.

Every one survives a task queue: it pickles (and copies) with its class, its attributes and
its message, and its ``args`` are its constructor's arguments, so a result backend that
stores only the class and ``args`` (Celery's JSON serializer) rebuilds it as ``cls(*args)``.
"""

from __future__ import annotations

import copyreg
from typing import Any


class Picklable:
    """Pickles and copies an exception by its ``args`` and attributes, without calling
    ``__init__`` again: a subclass whose ``__init__`` takes other arguments than its ``args``
    (a user's, or one that builds its message) comes back whole, where Python's default
    (``cls(*args)``) raises ``TypeError`` or mixes the message up with an argument."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        args: tuple[Any, ...] = getattr(self, "args", ())
        # copyreg.__newobj__(cls, *args) is cls.__new__(cls, *args): pickle's own NEWOBJ
        # (typeshed does not list it).
        newobj = copyreg.__newobj__  # type: ignore[attr-defined]
        return (newobj, (type(self), *args), getattr(self, "__dict__", None))


class SemaphoreError(Picklable, Exception):
    """Base of every dynasem error: catch it to handle them all."""


class SemaphoreBusy(SemaphoreError):
    """The resource was held by someone else for the whole ``wait``.

    ``retry_after`` is a whole number of seconds (>= 1) after which trying again has a chance:
    the estimated wait, but never later than a dead holder could be taken over;
    ``holder_user_id`` is the holder's recorded user (with several holders, the one whose lease
    ends first), or ``None`` when unknown; ``queue_position`` the caller's place in the
    resource's queue (1 = next: nobody waiting ahead of it; ``None`` when unknown);
    ``estimated_wait`` the seconds (a float) until its turn would likely have come.
    """

    def __init__(
        self,
        resource: str,
        retry_after: int,
        holder_user_id: str | None = None,
        queue_position: int | None = None,
        estimated_wait: float | None = None,
    ):
        self.resource = resource
        self.retry_after = max(1, int(retry_after))
        self.holder_user_id = holder_user_id
        self.queue_position = queue_position
        self.estimated_wait = float(self.retry_after if estimated_wait is None else estimated_wait)
        super().__init__(
            resource, self.retry_after, holder_user_id, queue_position, self.estimated_wait
        )

    def __str__(self) -> str:
        return (
            f"{self.resource!r} is busy (held by {self.holder_user_id or 'unknown'}); "
            f"retry after {self.retry_after}s"
        )


class Coalesced(SemaphoreBusy):
    """A coalescing semaphore (``coalesce=True``) was busy, and a next run is registered that
    has not started yet: it starts after this call arrived, so this call's work is covered
    by it and the call returns at once (a view answers 202 Accepted).

    ``next_user_id`` is the next run's recorded user; the rest as in ``SemaphoreBusy``.
    """

    def __init__(
        self,
        resource: str,
        retry_after: int,
        holder_user_id: str | None = None,
        next_user_id: str | None = None,
    ):
        super().__init__(resource, retry_after, holder_user_id)
        self.next_user_id = next_user_id
        self.args = (resource, self.retry_after, holder_user_id, next_user_id)

    def __str__(self) -> str:
        return (
            f"{self.resource!r} is busy (held by {self.holder_user_id or 'unknown'}) and a run "
            f"that starts after this call is queued (by {self.next_user_id or 'unknown'})"
        )


class LockLost(SemaphoreError):
    """The hold is no longer ours: its lease ran out before it was renewed, ``max_hold``
    passed, another holder took it over, or an operator broke it. ``resource`` names the
    resource (or the ``run_once`` job's key), ``reason`` says why in words."""

    def __init__(self, resource: str, reason: str):
        self.resource, self.reason = resource, reason
        super().__init__(resource, reason)

    def __str__(self) -> str:
        return f"lost the hold on {self.resource!r}: {self.reason}"


class SemaphoreUnavailable(SemaphoreError):
    """DynamoDB could not be reached or refused us (not merely busy).

    ``transient``: worth retrying at once (throttling, a 5xx, a dropped connection).
    ``ambiguous``: the request may have been applied all the same (a 5xx, a timeout after
    sending).
    """

    # Declared here too, so a subclass that does not call this __init__ still has them.
    transient: bool = False
    ambiguous: bool = False

    def __init__(self, *args: object, transient: bool = False, ambiguous: bool = False):
        super().__init__(*args)
        self.transient, self.ambiguous = transient, ambiguous


class LimitExceeded(SemaphoreUnavailable):
    """DynamoDB refused a request for a limit of its own, which ``limit`` names: ``"item
    size"`` (400 KB an item; no write of the lock's own reaches it: holders past a few have
    items of their own),
    ``"throughput"`` (throttled still after the retries: a table's or one partition key's
    capacity) or ``"transaction"`` (a transaction's own limits). A refused request wrote
    nothing, but ``ambiguous`` says an earlier attempt of the same request (botocore's
    retries) may have been applied. Only ``"throughput"`` is ``transient``."""

    def __init__(
        self, message: str, limit: str, *, transient: bool = False, ambiguous: bool = False
    ):
        super().__init__(message, limit, transient=transient, ambiguous=ambiguous)
        self.limit = limit

    def __str__(self) -> str:
        return str(self.args[0])


class TableMissing(SemaphoreUnavailable):
    """The lock table does not exist: run ``manage.py dynasem_createtable``."""


class AlreadyDone(SemaphoreError):
    """``run_once``: the job's status is DONE; it is not run again. ``key`` is the job's
    key, ``finished`` when it finished as stored (milliseconds since the epoch), or
    ``None``."""

    def __init__(self, key: str, finished: int | str | None = None):
        self.key, self.finished = key, finished
        super().__init__(key, finished)

    def __str__(self) -> str:
        return f"job {self.key!r} is already DONE"
