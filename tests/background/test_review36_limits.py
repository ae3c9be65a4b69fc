"""Review 36 (bad input and DynamoDB's limits), background work: a unique task's leases.

A ``run_lease`` (or ``queue_lease``) that no hold can take was accepted when the task was
declared and at every enqueue, which claimed the key; the worker's adoption then refused it
(``ValueError: lease must be ...``, naming neither the task nor which lease), the task failed
unrun, and the key stayed claimed for nobody for the queue lease: every enqueue of it refused
meanwhile. Both leases are now checked when the task is declared (by name) and before the key
is claimed (against ``CLOCK_SKEW`` too, a setting)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import django
import pytest
from django.test import override_settings

from dynasem._operators.locks import holds_on

needs_django_tasks = pytest.mark.skipif(
    django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0"
)


def live(resource: str) -> list[Any]:
    return [h for h in holds_on(resource) if h.expires_ms > time.time() * 1000]


def work(project_id: int) -> int:
    return project_id


if django.VERSION >= (6, 0):
    from dynasem.django_tasks import unique_task

    # Valid leases both; the run lease is no longer than the tests' CLOCK_SKEW (0.5 s).
    @unique_task(unique_key="r36-skew:{project_id}", queue_lease=30, run_lease=0.4)
    def short_run(project_id: int) -> int:
        return project_id


@needs_django_tasks
@pytest.mark.parametrize(
    ("leases", "error", "said"),
    [
        ({"run_lease": 10**7}, ValueError, "run_lease must be at most"),
        ({"run_lease": -1}, ValueError, "run_lease must be > 0"),
        ({"run_lease": float("nan")}, ValueError, "run_lease must be a number of seconds"),
        ({"run_lease": "60"}, TypeError, "run_lease must be a number of seconds"),
        ({"queue_lease": float("inf")}, ValueError, "queue_lease must be finite"),
        ({"queue_lease": 10**7}, ValueError, "queue_lease must be at most"),
        ({"queue_lease": "600"}, TypeError, "queue_lease must be a number of seconds"),
    ],
    ids=["run-week", "run-negative", "run-nan", "run-str", "queue-inf", "queue-week", "queue-str"],
)
def test_a_unique_task_with_a_lease_no_hold_can_take_is_refused_when_declared(
    leases: dict[str, Any], error: type[Exception], said: str
) -> None:
    """Before: declared, and every enqueue claimed the key; the worker failed the task, its
    key held for the queue lease (queue_lease=inf, "600": an unclear TypeError, or an error
    at every enqueue naming "lease")."""
    with pytest.raises(error, match=f"work: {said}"):
        unique_task(unique_key="r36:{project_id}", **{"queue_lease": 30, **leases})(work)


@needs_django_tasks
def test_a_run_lease_within_clock_skew_is_refused_before_the_key_is_claimed(
    lock_table: str,
) -> None:
    """run_lease=0.4 with CLOCK_SKEW=0.5: before, the enqueue claimed the key and the worker's
    adoption raised "lease (0.4s) must be longer than DYNASEM['CLOCK_SKEW']"; the task failed
    unrun and the key was held for its 30 s queue lease, every enqueue refused (None)."""
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        task = short_run.using(backend="default")
        with pytest.raises(ValueError, match=r"short_run: run_lease \(0.4s\) must be longer"):
            task.enqueue(project_id=1)
    assert live("r36-skew:1") == []


def test_a_celery_unique_task_with_a_bad_run_lease_claims_nothing(lock_table: str) -> None:
    """A Celery UniqueTask's leases are class attributes, read at enqueue: a run lease of
    more than a week was refused by the worker only, after the key was claimed."""
    celery = pytest.importorskip("celery", reason="celery is in the test dependency group")
    from dynasem.celery import UniqueTask

    app = celery.Celery("dynasem-review36", broker="memory://")

    @app.task(base=UniqueTask, name="r36.work", unique_key="r36-celery:{key}", run_lease=10**7)
    def celery_work(key: str) -> str:
        return key

    with pytest.raises(ValueError, match="r36.work: run_lease must be at most"):
        celery_work.delay("a")
    assert live("r36-celery:a") == []


@pytest.mark.parametrize(
    ("name", "error", "said"),
    [
        (5, TypeError, "a leadership's name must be a str, not int"),
        ("a" * 1020, ValueError, "a leadership's name is 1020 UTF-8 bytes; at most 1017"),
        ("beat\x1b[2K", ValueError, "a leadership's name 'beat.*contains the control"),
        ("beat\udcff", ValueError, "a leadership's name is not valid UTF-8"),
    ],
    ids=["int", "too-long", "control", "surrogate"],
)
def test_a_bad_leadership_name_is_refused_naming_the_name(
    name: Any, error: type[Exception], said: str
) -> None:
    """Before: "resource is 1027 UTF-8 bytes; at most 1024" for a name of 1,020 (the limit
    counted the prefix ``leader:`` the caller never wrote), "resource 'leader:...'" for the
    others, and a ValueError for a name that is no str."""
    from dynasem import leadership

    with pytest.raises(error, match=said):
        leadership(name)


@pytest.mark.parametrize(
    ("task_id", "error", "said"),
    [
        ("x" * 1030, ValueError, "a unique task's id is 1030 UTF-8 bytes; at most 1019"),
        ("a\x1bb", ValueError, "a unique task's id 'a.*contains the control character"),
        (uuid.UUID(int=7), TypeError, "a unique task's id must be a str, not UUID"),
    ],
    ids=["too-long", "control", "uuid"],
)
def test_a_bad_celery_task_id_is_refused_naming_the_task_id(
    lock_table: str, task_id: Any, error: type[Exception], said: str
) -> None:
    """``apply_async(task_id=...)`` is recorded as the holder ``task:<id>``: before, a bad id
    was refused as "user is longer than 1024 UTF-8 bytes" or "user 'task:a...'" (no user was
    given), and a UUID (which Celery itself sends) with "can only concatenate str"."""
    celery = pytest.importorskip("celery", reason="celery is in the test dependency group")
    from dynasem.celery import UniqueTask

    app = celery.Celery("dynasem-review36-ids", broker="memory://")

    @app.task(base=UniqueTask, name="r36.ids", unique_key="r36-ids:{key}")
    def celery_work(key: str) -> str:
        return key

    with pytest.raises(error, match=said):
        celery_work.apply_async(("a",), task_id=task_id)
    assert live("r36-ids:a") == []
