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
lease ends; a worker killed mid-task, when the run lease ends. See
:mod:`dynasem._background.unique`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery import Task  # type: ignore[import-untyped]
from celery.signals import task_revoked  # type: ignore[import-untyped]

from .._engine.decorators import KeyMaker
from .._engine.hold import Held
from .._observability.logs import facts
from ..exceptions import LockLost
from .unique import (
    Claim,
    Taken,
    adopt,
    claim,
    end_run,
    give_back,
    hand_on,
    inline_retry,
    key_for,
    running,
    take_back,
)

logger = logging.getLogger("dynasem")

__all__ = ["HEADER", "UniqueTask"]

HEADER = "dynasem_unique"


class UniqueTask(Task):  # type: ignore[misc]  # Celery has no type hints
    """A Celery task base (``@shared_task(base=UniqueTask, unique_key=...)``) whose key is
    held from enqueue to the end of its run: a second enqueue while one is queued or running
    enqueues nothing and returns the ``AsyncResult`` of the first.

    Task options: ``unique_key``, a template over the task's arguments as the decorator's
    (``"reindex:{project_id}"``), or a callable of them; ``queue_lease``, seconds the key is
    held for a task waiting in the queue (600); ``run_lease``, the lease while it runs
    (default: the LEASE setting), renewed by the heartbeat. A retry keeps the key; a task that
    never starts frees it when the queue lease ends."""

    unique_key: Any = None
    queue_lease: float = 600.0
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
        return key_for(self.name, self._keys, args, kwargs)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        headers = dict(options.pop("headers", None) or {})
        carried = Claim.from_header(headers.pop(HEADER, None))
        run = _run_of(self, carried) if carried is not None and carried.task_id == task_id else None
        if run is not None and carried is not None:
            # A retry of this task, sent from its own run: the key goes on with it.
            following = hand_on(run, carried)
            if following is None:  # a second retry from one run: the first has the key
                return self.AsyncResult(task_id)
            headers[HEADER] = following.header()
            try:
                return super().apply_async(
                    args, kwargs, task_id=task_id, headers=headers, **options
                )
            except BaseException:
                take_back(run)
                raise
        task_id = task_id or str(uuid.uuid4())
        resource = self.unique_resource(args, kwargs)
        try:
            taken = claim(resource, task_id, self.queue_lease)
        except Taken as busy:
            logger.info(
                "dynasem: %s not enqueued: %r is held by %s",
                self.name,
                resource,
                f"task {busy.task_id}" if busy.task_id else "a hold that is not a task's",
                extra=facts(
                    resource,
                    outcome="not_enqueued",
                    task=self.name,
                    task_id=task_id,
                    holder_task_id=busy.task_id,
                ),
            )
            # The holder's handle; a key held by something else than a task (a semaphore()
            # block) has none: the handle of a task id that never runs says "not run".
            return self.AsyncResult(busy.task_id or task_id)
        if self.app.conf.task_always_eager:
            return self._run_eagerly(taken, args, kwargs, task_id, headers, options)
        headers[HEADER] = taken.header()
        try:
            return super().apply_async(args, kwargs, task_id=task_id, headers=headers, **options)
        except BaseException:
            give_back(taken)  # not enqueued: free the key now
            raise

    def _run_eagerly(
        self, taken: Claim, args: Any, kwargs: Any, task_id: str, headers: Any, options: Any
    ) -> Any:
        """Celery's eager mode (``task_always_eager``): run here and now as a worker would,
        the claim adopted for the run. The hold is entered around Celery's ``apply()``, not
        in ``__call__``: an eager retry runs inside ``apply()`` after the first run has
        returned, and must find the key still held, as the docs promise."""
        try:
            held = adopt(taken, self.run_lease)
        except LockLost as lost:  # its queue lease ran out and another task took the key
            self._not_run(taken, task_id, lost)
            return self.AsyncResult(task_id)
        try:
            with running(held):
                return super().apply_async(
                    args, kwargs, task_id=task_id, headers=headers, **options
                )
        finally:
            self._end_run(taken, held)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        carried = Claim.from_header(_header_of(self.request))
        if carried is None or inline_retry(carried) is not None:
            # Called directly, sent without apply_async (send_task), or run eagerly (its hold
            # is entered around the eager apply: _run_eagerly).
            return super().__call__(*args, **kwargs)
        try:
            held = adopt(carried, self.run_lease)
        except LockLost as lost:
            self._not_run(carried, self.request.id, lost)
            return None
        self.request.dynasem_run = (carried, held)
        try:
            with running(held):
                return super().__call__(*args, **kwargs)
        finally:
            self._end_run(carried, held)

    def _not_run(self, carried: Claim, task_id: str | None, lost: LockLost) -> None:
        logger.warning(
            "dynasem: %s[%s] not run: its key %r is not its own (%s)",
            self.name,
            task_id,
            carried.resource,
            lost.reason,
            extra=carried.facts("not_run", lost.reason, self.name),
        )

    def _end_run(self, carried: Claim, held: Held) -> None:
        try:
            end_run(held, self.queue_lease)
        except Exception as exc:  # the task's own outcome stands; the lease ends the key
            logger.warning(
                "dynasem: %s could not give back %r: %s",
                self.name,
                carried.resource,
                exc,
                extra=carried.facts("give_back_failed", exc, self.name),
            )


def _header_of(request: Any) -> Any:
    value = getattr(request, HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(HEADER)
    return value


def _run_of(task: UniqueTask, carried: Claim | None) -> Held | None:
    """The run of ``carried`` going on in this worker (a retry is being sent from it)."""
    run = getattr(task.request, "dynasem_run", None)
    if run is not None and run[0] == carried:
        return run[1]  # type: ignore[no-any-return]
    return None


def _revoked(request: Any = None, terminated: bool = False, **kwargs: Any) -> None:
    """A revoked task that never ran gives its key back. One terminated while it runs may
    still be running (a signal it handles): its run lease ends the key."""
    carried = Claim.from_header(_header_of(request)) if request is not None else None
    if carried is not None and not terminated:
        give_back(carried)


task_revoked.connect(_revoked, weak=False)
