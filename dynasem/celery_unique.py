"""Celery unique tasks (imports Celery: reach it as ``dynasem.celery.UniqueTask``)::

    from celery import shared_task
    from dynasem.celery import UniqueTask

    @shared_task(base=UniqueTask, unique_key="reindex:{project_id}", queue_lease=600)
    def reindex(project_id): ...

    reindex.delay(42)   # enqueued; a second reindex.delay(42) while it is queued or running
                        # enqueues nothing and returns the AsyncResult of the first

The key is taken at enqueue for ``queue_lease`` seconds and handed to the worker that starts
the task, which holds it for the run (``run_lease``, the LEASE setting by default), renewed
by the heartbeat, and gives it back when the task ends (succeeded or failed). A retry keeps
the key: it goes on with the retry's message, for ``queue_lease`` again. A revoked task gives
it back in the worker that discards it. A task that never starts frees the key when the queue
lease ends; a worker killed mid-task, when the run lease ends. See :mod:`dynasem.unique`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery import Task  # type: ignore[import-untyped]
from celery.signals import task_revoked  # type: ignore[import-untyped]

from .decorators import KeyMaker, _checked
from .exceptions import LockLost
from .unique import Claim, Taken, adopt, claim, give_back, hand_on, running

logger = logging.getLogger("dynasem")

__all__ = ["HEADER", "UniqueTask"]

HEADER = "dynasem_unique"


class UniqueTask(Task):  # type: ignore[misc]  # Celery has no type hints
    """A task whose key (``unique_key``, a template over its arguments as the decorator's,
    or a callable of them) is held from enqueue to the end of its run."""

    unique_key: Any = None
    queue_lease: float = 3600.0
    run_lease: float | None = None  # the LEASE setting
    _keys: KeyMaker | None = None

    def unique_resource(self, args: Any, kwargs: Any) -> str:
        if self.unique_key is None:
            raise TypeError(
                f"{self.name}: a UniqueTask needs unique_key=, e.g. "
                '@shared_task(base=UniqueTask, unique_key="reindex:{project_id}")'
            )
        if self._keys is None:
            type(self)._keys = KeyMaker(self.unique_key, self.run)
        assert self._keys is not None
        resource = self._keys(tuple(args or ()), dict(kwargs or {}), False)
        if not isinstance(resource, str):
            raise TypeError(f"{self.name}: unique_key must make one key, not {resource!r}")
        return str(_checked(resource))

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        headers = dict(options.pop("headers", None) or {})
        carried = Claim.from_header(headers.get(HEADER))
        if carried is not None and carried.task_id == task_id:
            # A retry of this task, sent from its own run: the key goes on with it.
            _hand_on(self, carried)
            return super().apply_async(args, kwargs, task_id=task_id, headers=headers, **options)
        task_id = task_id or str(uuid.uuid4())
        resource = self.unique_resource(args, kwargs)
        try:
            taken = claim(resource, task_id, self.queue_lease)
        except Taken as busy:
            logger.info(
                "dynasem: %s not enqueued: %r is held by task %s", self.name, resource, busy.task_id
            )
            return self.AsyncResult(busy.task_id) if busy.task_id else None
        headers[HEADER] = taken.header()
        try:
            return super().apply_async(args, kwargs, task_id=task_id, headers=headers, **options)
        except BaseException:
            give_back(taken)  # not enqueued: free the key now
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        carried = Claim.from_header(_header_of(self.request))
        if carried is None:  # called directly, or sent without apply_async (send_task)
            return super().__call__(*args, **kwargs)
        try:
            held = adopt(carried, self.run_lease)
        except LockLost:
            logger.warning(
                "dynasem: %s[%s] not run: its key %r was taken by another task after its "
                "queue lease (%gs) ran out",
                self.name,
                self.request.id,
                carried.resource,
                self.queue_lease,
            )
            return None
        self.request.dynasem_held = held
        try:
            with running(held):
                return super().__call__(*args, **kwargs)
        finally:
            if not getattr(held, "handed_on", False):
                try:
                    held.release()
                except LockLost:
                    logger.warning("dynasem: %s lost its key %r", self.name, carried.resource)


def _header_of(request: Any) -> Any:
    value = getattr(request, HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(HEADER)
    return value


def _hand_on(task: UniqueTask, carried: Claim) -> None:
    held = getattr(task.request, "dynasem_held", None)
    if held is not None and held.token == carried.token:
        hand_on(held, task.queue_lease)


def _revoked(request: Any = None, **kwargs: Any) -> None:
    """A revoked task never runs (or stops): give its key back."""
    carried = Claim.from_header(_header_of(request)) if request is not None else None
    if carried is not None:
        give_back(carried)


task_revoked.connect(_revoked, weak=False)
