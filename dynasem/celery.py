"""Celery: a task refused by a busy lock is retried after the busy estimate, plus jitter.

::

    from celery import shared_task
    from dynasem import semaphore
    from dynasem.celery import retry_later

    @shared_task(bind=True)
    @semaphore("import:{upload_id}", on_busy=retry_later)
    def import_upload(self, upload_id): ...

Celery is imported only when a task is refused, never by importing this module
(``pip install "dynasem[celery]"`` pins a Celery it is tested with).
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

from ._background.retrying import MAX_JITTER, retry_delay
from ._engine import reentry
from .exceptions import Coalesced, SemaphoreBusy

if TYPE_CHECKING:  # imported when asked for (__getattr__): it imports Celery
    from ._background.celery_unique import UniqueTask

__all__ = ["RetryLater", "UniqueTask", "retry_later"]

# Retries of one task before the busy error is its failure. Not Celery's max_retries (3 by
# default, meant for errors): every refusal means more tasks want the lock than one estimate
# serves, and a herd of tasks over one key needs several turns to be served (60 tasks over 3
# keys: tests/background/test_celery_broker.py). Ten turns, the jitter window doubling each time,
# are about 7 minutes of patience for holds of a second, half an hour for holds of a minute.
MAX_RETRIES = 10
# The header of a task's message sent from its own run (a retry: ``raise self.retry()``, the
# running task's id): the tokens of the holds that run had open then. Celery sends the retry
# before the run's block gives them back; the retry's decorated acquire waits them out.
AFTER_HEADER = "dynasem_after"


class RetryLater:
    """An ``on_busy`` for Celery tasks: retry the refused task (``task.retry(countdown=...,
    exc=...)``) after ``exc.retry_after`` plus a random jitter, drawn from a window of
    ``retry_after`` seconds that doubles with each refusal, at most ``max_jitter`` seconds:
    the tasks one busy lock refused do not all come back at once.

    ``max_retries``: the task's retries (Celery counts them all, for any cause) after which
    the ``SemaphoreBusy`` is raised as the task's failure; ``None`` leaves the limit to the
    task's own ``max_retries`` (Celery's ``retry(max_retries=None)``), so
    ``@shared_task(max_retries=None)`` with ``RetryLater(max_retries=None)`` retries until
    the lock is free. Works for bound tasks (``bind=True``) and unbound ones; outside a
    running task (a task called as a function, a plain function) it raises the
    ``SemaphoreBusy``, as if there were no ``on_busy``. A ``Coalesced`` refusal
    (``coalesce=True``) is not retried: the task returns None, its work covered by the next
    run, which starts after it.
    """

    __slots__ = ("max_jitter", "max_retries")

    def __init__(self, *, max_retries: int | None = MAX_RETRIES, max_jitter: float = MAX_JITTER):
        if max_retries is not None and (not isinstance(max_retries, int) or max_retries < 0):
            raise ValueError(f"max_retries must be None or an int >= 0, not {max_retries!r}")
        if not isinstance(max_jitter, int | float) or not 0 <= max_jitter < float("inf"):
            raise ValueError(f"max_jitter must be a number of seconds >= 0, not {max_jitter!r}")
        self.max_retries = max_retries
        self.max_jitter = float(max_jitter)

    def __call__(self, exc: SemaphoreBusy, *args: Any, **kwargs: Any) -> Any:
        if isinstance(exc, Coalesced):
            return None  # coalesce=True: the next run, queued after this task began, covers it
        if (task := running_task(args)) is None:
            raise exc
        countdown = retry_delay(exc.retry_after, task.request.retries, max_jitter=self.max_jitter)
        # Raises celery.exceptions.Retry (the worker records RETRY and sends the task again
        # with the countdown), or ``exc`` once the retries are used up.
        raise task.retry(countdown=countdown, exc=exc, max_retries=self.max_retries)

    def __repr__(self) -> str:
        return f"RetryLater(max_retries={self.max_retries!r}, max_jitter={self.max_jitter!r})"


retry_later = RetryLater()
"""``on_busy=retry_later``: ``RetryLater`` with its defaults (10 retries, a jitter window of
at most 5 minutes)."""


def running_task(args: tuple[Any, ...]) -> Any:
    """The Celery task this call runs in: a bound task's ``self`` (the first argument), else
    the task Celery is running in this thread; ``None`` when there is none."""
    if "celery" not in sys.modules:  # no task can be running: do not import Celery for it
        return None
    from celery import Task  # type: ignore[import-untyped]
    from celery._state import get_current_task  # type: ignore[import-untyped]

    if args and isinstance(args[0], Task):
        return args[0]
    return get_current_task()


def succeeded_holds(args: tuple[Any, ...]) -> frozenset[str]:
    """The holds a decorated call in a running Celery task succeeds (the decorator asks,
    :data:`dynasem._engine.decorators.succession`): those of the run its message, a retry,
    was sent from. Makes sure the retries this process sends carry theirs."""
    if (task := running_task(args)) is None:
        return frozenset()
    _hand_on_retries()
    request = task.request
    tokens = getattr(request, AFTER_HEADER, None)
    if tokens is None:
        tokens = (getattr(request, "headers", None) or {}).get(AFTER_HEADER)
    if not isinstance(tokens, list | tuple):
        return frozenset()
    return frozenset(t for t in tokens if isinstance(t, str))


@functools.cache
def _hand_on_retries() -> None:
    """Connect :func:`_hand_on` (once), in a process that runs tasks."""
    from celery.signals import before_task_publish  # type: ignore[import-untyped]

    before_task_publish.connect(_hand_on, weak=False, dispatch_uid="dynasem-hand-on")


def _hand_on(headers: Any = None, **kwargs: Any) -> None:
    """A task's message sent from its own run (its retry: the running task's id) names the
    holds that run has open (their block is not over: the retry is sent from inside it)."""
    from celery._state import get_current_task

    task = get_current_task()
    if task is None or not isinstance(headers, dict) or headers.get("id") != task.request.id:
        return
    if tokens := reentry.open_tokens():
        headers[AFTER_HEADER] = tokens
    else:  # a header the run's own message carried (Celery sends its headers on)
        headers.pop(AFTER_HEADER, None)


def __getattr__(name: str) -> Any:
    # Unique tasks subclass Celery's Task: Celery is imported when they are asked for.
    if name == "UniqueTask":
        from ._background.celery_unique import UniqueTask

        return UniqueTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
