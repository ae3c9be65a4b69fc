"""Unique ``django.tasks`` tasks (Django >= 6.0) for test_unique_tasks.py: module-level, as
Django runs them. The worker processes (``db_worker``, tests/support/tasks_db_settings.py) append
their start and end to the test's event file (tests/support/events.py)."""

from __future__ import annotations

import os
import time
from typing import Any

from dynasem import current_hold
from dynasem.django_tasks import retry_later, unique_task
from tests.support.events import record

RUN_LEASE = 2.0
RUNS: list[tuple[str, int]] = []  # in-process runs (ImmediateBackend): (key, n)


def _log(**event: Any) -> None:
    if os.environ.get("DYNASEM_TEST_CELERY_LOG"):
        # The pid outside a pid namespace of its own too: /proc is the test's.
        record(host_pid=int(os.readlink("/proc/self")), **event)


@unique_task(unique_key="unique:{key}", queue_lease=60, run_lease=RUN_LEASE, takes_context=True)
def unique_work(context: Any, key: str, n: int, seconds: float) -> int:
    """The test's work: logs its start and its end with its task result's id."""
    task_id = context.task_result.id
    start = time.time()
    _log(event="unique-start", key=key, n=n, start=start, task_id=task_id)
    time.sleep(seconds)
    RUNS.append((key, n))
    _log(event="unique-run", key=key, n=n, start=start, end=time.time(), task_id=task_id)
    return n


@unique_task(unique_key="unique-plain:{key}", queue_lease=30)
def plain(key: str) -> str:
    return current_hold().resource  # the task's hold, entered for its run


@unique_task(unique_key="unique-async:{key}", queue_lease=30)
async def aplain(key: str) -> str:
    return key


@unique_task(unique_key="unique-retry:{key}", queue_lease=30, takes_context=True)
def retried(context: Any, key: str, again: bool) -> str:
    """Enqueues itself once more from its run (a retry): the key goes on with it."""
    if again:
        return "retry" if unique_retry_of(key) is not None else "refused"
    return "second"


def unique_retry_of(key: str) -> Any:
    return retried.enqueue(key, False)


@unique_task(unique_key="unique-fail:{key}", queue_lease=30)
def fails(key: str) -> None:
    raise RuntimeError("the task's own failure")


def bare(project_id: int) -> None:
    """Not a task: test_unique_tasks.py declares it wrongly (Django wants module-level)."""


__all__ = ["aplain", "fails", "plain", "retried", "retry_later", "unique_work"]
