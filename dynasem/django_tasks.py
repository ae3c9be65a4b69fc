"""django.tasks (Django >= 6.0), which has no retry of its own: a task refused by a busy
lock is enqueued again, to run after the busy estimate plus jitter.

::

    from django.tasks import task
    from dynasem import semaphore
    from dynasem.django_tasks import retry_later

    @task(takes_context=True)
    @semaphore("thumbnails:{photo_id}", on_busy=retry_later)
    def make_thumbnails(context, photo_id): ...

``django.tasks`` is imported only when a task is refused, so this module imports on any
Django dynasem supports.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction
from django.utils import timezone

from ._background.retrying import retry_delay
from .exceptions import Coalesced, SemaphoreBusy

if TYPE_CHECKING:  # imported when asked for (__getattr__): django.tasks is Django >= 6.0's
    from ._background.tasks_unique import UniqueTask, unique_task

__all__ = ["UniqueTask", "retry_later", "unique_task"]


def retry_later(exc: SemaphoreBusy, *args: Any, **kwargs: Any) -> Any:
    """An ``on_busy`` for ``django.tasks``: enqueue the refused task again with the same
    arguments, ``run_after`` = now + ``exc.retry_after`` + a random jitter of up to
    ``exc.retry_after``, then raise ``exc``.

    This attempt's result is FAILED with the ``SemaphoreBusy``, whose traceback names the
    new result (``enqueued again as task result <id>``); the task runs under that new
    result. Needs the task's context (``@task(takes_context=True)``, ``def f(context,
    ...)``): a ``TypeError`` says so otherwise. A backend that cannot run a task later
    (``supports_defer`` false, such as ``ImmediateBackend``) enqueues nothing: the busy error
    is the task's failure, with a note saying why. django.tasks keeps no count across
    enqueues, so the task is enqueued again each time it is refused, until it gets the lock.
    An async task enqueues with ``aenqueue``. A ``Coalesced`` refusal (``coalesce=True``)
    is not enqueued again: the task returns None, its work covered by the next run.
    """
    if isinstance(exc, Coalesced):
        return None
    from django.tasks import TaskContext

    context = args[0] if args else None
    if not isinstance(context, TaskContext):
        raise TypeError(
            "dynasem.django_tasks.retry_later enqueues the refused task again and needs its "
            "context to find it: @task(takes_context=True) over @semaphore(..., "
            "on_busy=retry_later) over def f(context, ...)"
        ) from exc
    result = context.task_result
    task = result.task
    backend = task.get_backend()
    if not backend.supports_defer:
        exc.add_note(
            f"dynasem.django_tasks.retry_later: the task backend {result.backend!r} "
            f"({type(backend).__name__}) cannot run a task later (supports_defer is false); "
            "the task was not enqueued again"
        )
        raise exc
    run_after = timezone.now() + datetime.timedelta(seconds=retry_delay(exc.retry_after, 0))
    later = task.using(run_after=run_after)

    def refused(again: Any) -> SemaphoreBusy:
        exc.add_note(
            f"dynasem.django_tasks.retry_later: enqueued again as task result {again.id}, to "
            f"run after {run_after.isoformat()}"
        )
        return exc

    if iscoroutinefunction(task.func):
        # Called in the event loop: a backend that writes to a database must not be called
        # from it synchronously. The decorator awaits what on_busy returns.
        async def enqueue_again() -> Any:
            raise refused(await later.aenqueue(*result.args, **result.kwargs))

        return enqueue_again()
    raise refused(later.enqueue(*result.args, **result.kwargs))


def __getattr__(name: str) -> Any:
    # Unique tasks subclass django.tasks.Task (Django >= 6.0): imported when asked for.
    if name in ("unique_task", "UniqueTask"):
        from ._background import tasks_unique

        return getattr(tasks_unique, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
