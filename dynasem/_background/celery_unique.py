"""Celery unique tasks (imports Celery: reach it as ``dynasem.celery.UniqueTask``)::

    from celery import shared_task
    from dynasem.celery import UniqueTask

    @shared_task(base=UniqueTask, unique_key="reindex:{project_id}", queue_lease=600)
    def reindex(project_id): ...

    first = reindex.delay(42)   # first.enqueued is True
    again = reindex.delay(42)   # queued or running: nothing enqueued; again.enqueued is
                                # False, again.id is the task that holds the key

The key is taken at enqueue for ``queue_lease`` seconds and handed to the worker that starts
the task, which holds it for the run (``run_lease``, the LEASE setting by default), renewed
by the heartbeat, and gives it back when the task ends (succeeded or failed). A retry keeps
the key: it goes on with the retry's message, for ``queue_lease`` again. A revoked task gives
it back in the worker that discards it. A task that never starts frees the key when the queue
lease ends; a worker killed mid-task, when the run lease ends. See
:mod:`dynasem._background.unique`.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from celery import Task  # type: ignore[import-untyped]
from celery.signals import task_revoked  # type: ignore[import-untyped]

from .._engine.decorators import KeyMaker
from . import unique
from .unique import Claim, Taken

HEADER = "dynasem_unique"


class UniqueTask(Task):  # type: ignore[misc]  # Celery has no type hints
    """A Celery task base (``@shared_task(base=UniqueTask, unique_key=...)``) whose key is
    held from enqueue to the end of its run: a second enqueue while one is queued or running
    enqueues nothing and returns the ``AsyncResult`` of the first. Every result
    ``apply_async``/``delay`` returns says which it was: ``result.enqueued``, True for a task
    sent (or run, in eager mode), False for a refusal.

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
        keys = self._keys or KeyMaker(self.unique_key, self.run, f"{self.name}: unique_key")
        type(self)._keys = keys
        return unique.key_for(self.name, keys, args, kwargs)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        result, enqueued = self._send(args, kwargs, task_id, **options)
        result.enqueued = enqueued
        return result

    def _send(
        self, args: Any, kwargs: Any, task_id: str | None, **options: Any
    ) -> tuple[Any, bool]:
        """The result to return and whether the task was enqueued (run, in eager mode)."""
        # Refused here, before the key is claimed: by the worker's adoption, the key would be
        # held for nobody for the queue lease (see unique.check_leases).
        unique.check_leases(self.name, self.queue_lease, self.run_lease)
        headers = dict(options.pop("headers", None) or {})
        carried = Claim.from_header(headers.pop(HEADER, None))
        # A retry of this task, sent from its own run: the key goes on with it.
        run = None
        if carried is not None and carried.task_id == task_id:
            run = unique.current_run(self.name, carried)
        task_id = task_id or str(uuid.uuid4())
        resource = run[0].resource if run is not None else self.unique_resource(args, kwargs)
        # Anything that stops us once the claim is made (an interrupt as it returns, or as
        # the header is made) gives it back: else the key is held for a task never sent,
        # for the queue lease. The claim is in ``made`` before claim_for returns.
        made: list[Claim] = []
        try:
            try:
                claimed = unique.claim_for(
                    self.name, resource, task_id, self.queue_lease, run, made
                )
            except Taken as busy:
                # The holder's handle; a key held by something else than a task (a semaphore()
                # block) has none: the handle of a task id that never runs says "not run".
                return self.AsyncResult(busy.task_id or task_id), False
            if claimed is None:  # a second retry from one run: the first has the key
                return self.AsyncResult(task_id), False
            if run is None and self.app.conf.task_always_eager:
                return self._run_eagerly(claimed, args, kwargs, task_id, headers, options)
            headers[HEADER] = claimed.header()
            return super().apply_async(
                args, kwargs, task_id=task_id, headers=headers, **options
            ), True
        except BaseException:
            # Not enqueued. Eager: a run that began gave the key back itself (this is then
            # refused: the claim is gone).
            unique.withdraw_made(made, run)
            raise

    def _run_eagerly(
        self, claimed: Claim, args: Any, kwargs: Any, task_id: str, headers: Any, options: Any
    ) -> tuple[Any, bool]:
        """Celery's eager mode (``task_always_eager``): run here and now as a worker would,
        the claim adopted for the run (not run if its queue lease ran out and another task
        took the key). The hold is entered around Celery's ``apply()``, not in ``__call__``:
        an eager retry runs inside ``apply()`` after the first run has returned, and must
        find the key still held, as the docs promise."""
        apply = functools.partial(
            super().apply_async, args, kwargs, task_id=task_id, headers=headers, **options
        )
        refused = self.AsyncResult(task_id)
        result = unique.run(self.name, self, claimed, apply, refused=refused)
        return result, result is not refused

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # No claim: called directly, sent without apply_async (send_task), or run eagerly
        # (its hold is entered around the eager apply, in apply_async). Run as it is.
        carried = Claim.from_header(_header_of(self.request))
        call = functools.partial(super().__call__, *args, **kwargs)
        return unique.run(self.name, self, carried, call)


def _header_of(request: Any) -> Any:
    """The claim's header: an attribute of the request, else one of its headers."""
    found = getattr(request, HEADER, None)
    return found if found is not None else (getattr(request, "headers", None) or {}).get(HEADER)


def _revoked(request: Any = None, terminated: bool = False, **kwargs: Any) -> None:
    """A revoked task that never ran gives its key back. One terminated while it runs may
    still be running (a signal it handles): its run lease ends the key."""
    carried = Claim.from_header(_header_of(request)) if request is not None else None
    if carried is not None and not terminated:
        unique.give_back(carried)


task_revoked.connect(_revoked, weak=False)
