"""The decorator on tasks: Celery (eager mode) and Django's own tasks (Django >= 6.0).

Put ``@semaphore(...)`` below the task decorator, next to the function: the task then runs
the locked function, keyed by the task's arguments, and a busy lock raises SemaphoreBusy,
which the task framework records as the task's failure.
"""

from __future__ import annotations

from typing import Any

import django
import pytest

from dynasem import SemaphoreBusy, current_hold, semaphore
from dynasem.operations import holds_on

celery = pytest.importorskip("celery", reason="celery is in the test extras")

app = celery.Celery("dynasem-tests", broker="memory://")
app.conf.task_always_eager = True  # run in this process, at .delay()
app.conf.task_eager_propagates = True  # the task's exception reaches the caller


@app.task
@semaphore("celery:{file_id}:{mode}", wait=0)
def import_file(file_id: int, mode: str = "full") -> str:
    return current_hold().resource


@app.task(bind=True)
@semaphore("celery:bound:{file_id}", wait=0)
def bound_import(self: Any, file_id: int) -> str:
    return f"{current_hold().resource} by {self.name}"  # self: the Celery task


def test_celery_task_locks_by_its_arguments(lock_table):
    assert import_file.delay(5).get() == "celery:5:full"
    assert import_file.apply_async(args=(6,), kwargs={"mode": "quick"}).get() == "celery:6:quick"
    assert import_file(7) == "celery:7:full"  # called directly, as a function
    assert holds_on("celery:5:full") == [] and holds_on("celery:6:quick") == []


def test_busy_celery_task_raises_semaphore_busy(lock_table):
    with semaphore("celery:5:full", user="other-worker"):
        with pytest.raises(SemaphoreBusy) as busy:
            import_file.delay(5)
        assert import_file.delay(8).get() == "celery:8:full"  # another file: runs
    assert busy.value.holder_user_id == "other-worker"
    assert import_file.delay(5).get() == "celery:5:full"


def test_bound_celery_task_binds_self(lock_table):
    assert bound_import.delay(3).get() == "celery:bound:3 by tests.test_tasks.bound_import"
    with semaphore("celery:bound:3"), pytest.raises(SemaphoreBusy):
        bound_import.delay(3)


def test_decorating_a_celery_task_object_is_refused():
    with pytest.raises(TypeError, match="below the task decorator"):
        semaphore("x")(import_file)


needs_django_tasks = pytest.mark.skipif(
    django.VERSION < (6, 0),
    reason=f"django.tasks exists from Django 6.0 (this is {django.get_version()})",
)


@needs_django_tasks
def test_django_task_locks_by_its_arguments(lock_table):
    from tests import django_tasks

    result = django_tasks.import_file.enqueue(5)
    assert result.status == "SUCCESSFUL"
    assert result.return_value == "django-task:5:full"
    assert django_tasks.import_file.enqueue(6, mode="quick").return_value == "django-task:6:quick"
    assert django_tasks.aimport_file.enqueue(1).return_value > 0
    assert django_tasks.with_context.enqueue(2).return_value == "django-task:ctx:2"
    assert holds_on("django-task:5:full") == []


@needs_django_tasks
def test_busy_django_task_fails_with_semaphore_busy(lock_table):
    from tests import django_tasks

    with semaphore("django-task:5:full"):
        result = django_tasks.import_file.enqueue(5)
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is SemaphoreBusy
    assert django_tasks.import_file.enqueue(5).status == "SUCCESSFUL"


@needs_django_tasks
def test_decorating_a_django_task_object_is_refused():
    from tests import django_tasks

    with pytest.raises(TypeError, match="below the task decorator"):
        semaphore("x")(django_tasks.import_file)
