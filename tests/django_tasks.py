"""Django tasks (``django.tasks``, Django >= 6.0) for test_tasks.py; imported only there.

Django runs module-level functions only, so the tasks live here rather than in the test."""

from __future__ import annotations

from django.tasks import task  # type: ignore[import-not-found]

from dynasem import current_hold, semaphore


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
