"""Django tasks (``django.tasks``, Django >= 6.0) for test_tasks.py; imported only there.

Django runs module-level functions only, so the tasks live here rather than in the test."""

from __future__ import annotations

import datetime
from typing import Any

from django.tasks import TaskResult, TaskResultStatus, task  # type: ignore[import-not-found]
from django.tasks.backends.immediate import ImmediateBackend  # type: ignore[import-not-found]
from django.utils import timezone
from django.utils.crypto import get_random_string

from dynasem import current_hold, semaphore
from dynasem.django_tasks import retry_later


class DeferringBackend(ImmediateBackend):  # type: ignore[misc]
    """Django's ImmediateBackend that honours ``run_after``: a task due now runs at once, a
    task due later waits in ``deferred`` until :meth:`run_due` (what a worker does when its
    time comes)."""

    supports_defer = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.deferred: list[Any] = []

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        if task.run_after is None or task.run_after <= timezone.now():
            return super().enqueue(task, args, kwargs)
        self.validate_task(task)
        result = TaskResult(
            task=task,
            id=get_random_string(32),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        self.deferred.append(result)
        return result

    def run_due(self, now: datetime.datetime) -> int:
        """Run the deferred tasks due by ``now``; how many ran."""
        due = [r for r in self.deferred if r.task.run_after <= now]
        self.deferred = [r for r in self.deferred if r not in due]
        for result in due:
            self._execute_task(result)
        return len(due)


@task
@semaphore("django-task:{file_id}:{mode}", wait=0)
def import_file(file_id: int, mode: str = "full") -> str:
    return current_hold().resource


@task
@semaphore("django-task:async:{file_id}", wait=0)
async def aimport_file(file_id: int) -> int:
    return current_hold().fence


@task(takes_context=True)
@semaphore("django-task:ctx:{file_id}", wait=0)
def with_context(context: object, file_id: int) -> str:
    return current_hold().resource


@task(takes_context=True)
@semaphore("django-task:retry:{file_id}", wait=0, on_busy=retry_later)
def retried_import(context: object, file_id: int, mode: str = "full") -> str:
    return f"{current_hold().resource}:{mode}"


@task(takes_context=True)
@semaphore("django-task:retry:{file_id}", wait=0, on_busy=retry_later)
async def aretried_import(context: object, file_id: int, mode: str = "full") -> str:
    return f"{current_hold().resource}:{mode}"


@task
@semaphore("django-task:no-context:{file_id}", wait=0, on_busy=retry_later)
def retried_without_context(file_id: int) -> str:
    return current_hold().resource
