"""The decorator on tasks: Celery (eager mode) and Django's own tasks (Django >= 6.0).

Put ``@semaphore(...)`` below the task decorator, next to the function: the task then runs
the locked function, keyed by the task's arguments, and a busy lock raises SemaphoreBusy,
which the task framework records as the task's failure — or, with ``on_busy=retry_later``
(``dynasem.celery``, ``dynasem.django_tasks``), runs the task again after the busy estimate.
The same recipe against a real broker and worker processes: test_celery_broker.py.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.test import override_settings

from dynasem import SemaphoreBusy, SemaphoreError, current_hold, semaphore
from dynasem._background.retrying import MAX_JITTER, retry_delay
from dynasem._operators.locks import holds_on
from dynasem.celery import RetryLater, retry_later
from dynasem.signals import lock_busy

celery = pytest.importorskip("celery", reason="celery is in the test extras")

app = celery.Celery("dynasem-tests", broker="memory://")
app.conf.task_always_eager = True  # run in this process, at .delay()
app.conf.task_eager_propagates = True  # the task's exception reaches the caller

# Eager retries run at once, with no countdown; propagating would raise celery's Retry to the
# caller instead. A failure still reaches the caller through the result's get().
retry_app = celery.Celery("dynasem-tests-retry", broker="memory://")
retry_app.conf.task_always_eager = True
retry_app.conf.task_eager_propagates = False

# Celery keeps a task's exception (a failure's, a retry's reason) through pickle. Until every
# dynasem exception pickles (issue 21, point 4), a SemaphoreBusy comes back as the nearest
# class that does, SemaphoreError, with the same message: what these tests check.
BUSY = r"is busy \(held by .*\); retry after \d+s"
celery_signals = pytest.importorskip("celery.signals")


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
    name = "tests.background.test_tasks.bound_import"
    assert bound_import.delay(3).get() == f"celery:bound:3 by {name}"
    with semaphore("celery:bound:3"), pytest.raises(SemaphoreBusy):
        bound_import.delay(3)


def test_decorating_a_celery_task_object_is_refused():
    with pytest.raises(TypeError, match="below the task decorator"):
        semaphore("x")(import_file)


# --- retry when busy ---------------------------------------------------------------------


def test_retry_delay_is_the_estimate_plus_a_jitter_that_doubles_per_refusal():
    rng = random.Random(21)
    for retry_after in (1, 3, 65):
        for refusals in range(12):
            window = min(MAX_JITTER, retry_after * 2**refusals)
            delays = [retry_delay(retry_after, refusals, rng=rng) for _ in range(200)]
            assert all(retry_after <= d <= retry_after + window for d in delays)
            # Spread over the whole window (a herd of refused tasks does not come back at once).
            assert max(delays) - min(delays) > window / 2
    assert retry_delay(1, 40) <= 1 + MAX_JITTER  # bounded, however many refusals
    assert retry_delay(5, 3, max_jitter=0) == 5


@retry_app.task(bind=True)
@semaphore("celery:retry:{file_id}", wait=0, on_busy=retry_later)
def retried_import(self: Any, file_id: int, mode: str = "full") -> str:
    return f"{current_hold().resource}:{mode} after {self.request.retries} retries"


@retry_app.task(bind=True)
@semaphore("celery:retry-twice:{file_id}", wait=0, on_busy=RetryLater(max_retries=2))
def retried_twice(self: Any, file_id: int) -> str:
    return current_hold().resource


@retry_app.task
@semaphore("celery:retry-unbound:{file_id}", wait=0, on_busy=retry_later)
def retried_unbound(file_id: int) -> str:
    return current_hold().resource


@semaphore("plain:{file_id}", wait=0, on_busy=retry_later)
def not_a_task(file_id: int) -> str:
    return current_hold().resource


@pytest.fixture
def retries() -> Iterator[list[tuple[int, float, Any]]]:
    """Each retry Celery makes: (the refused attempt's retries, the countdown, the reason's
    exception), through Celery's task_retry signal (sent in eager mode too)."""
    seen: list[tuple[int, float, Any]] = []

    def on_retry(sender: Any, request: Any, reason: Any, **kwargs: Any) -> None:
        seen.append((request.retries, reason.when, reason.exc))

    celery_signals.task_retry.connect(on_retry, weak=False)
    try:
        yield seen
    finally:
        celery_signals.task_retry.disconnect(on_retry)


def test_retry_later_retries_a_bound_task_after_the_estimate_until_the_lock_is_free(
    lock_table, retries
):
    held = semaphore("celery:retry:4", user="other-worker").acquire()
    estimates: list[int] = []

    def on_busy(retry_after: int, **kwargs: Any) -> None:
        estimates.append(retry_after)

    lock_busy.connect(on_busy, weak=False)

    def free_after_two(sender: Any, request: Any, **kwargs: Any) -> None:
        if request.retries == 1:
            held.release()

    celery_signals.task_retry.connect(free_after_two, weak=False)
    try:
        # Eager mode runs a retry at once (no countdown): the third attempt finds the lock free.
        result = retried_import.apply_async(args=(4,), kwargs={"mode": "quick"})
    finally:
        celery_signals.task_retry.disconnect(free_after_two)
        lock_busy.disconnect(on_busy)
    assert result.get() == "celery:retry:4:quick after 2 retries"  # args and kwargs kept
    assert [n for n, _, _ in retries] == [0, 1]
    for (n, countdown, exc), estimate in zip(retries, estimates, strict=True):
        assert isinstance(exc, SemaphoreError) and f"retry after {estimate}s" in str(exc)
        assert estimate <= countdown <= estimate + min(MAX_JITTER, estimate * 2**n)
    assert holds_on("celery:retry:4") == []


def test_retry_later_gives_up_after_its_max_retries_with_semaphore_busy(lock_table, retries):
    with semaphore("celery:retry:5", user="other-worker"):
        result = retried_import.delay(5)
    with pytest.raises(SemaphoreError, match=BUSY) as busy:
        result.get()
    assert "held by other-worker" in str(busy.value)
    # Ten retries by default (not Celery's max_retries of 3, meant for errors), then the
    # busy error itself, as the task's failure.
    assert [n for n, _, _ in retries] == list(range(10))
    assert RetryLater().max_retries == 10


def test_retry_later_takes_its_own_max_retries(lock_table, retries):
    with semaphore("celery:retry-twice:6"), pytest.raises(SemaphoreError, match=BUSY):
        retried_twice.delay(6).get()
    assert [n for n, _, _ in retries] == [0, 1]


def test_max_retries_none_leaves_the_limit_to_the_task(lock_table, retries):
    @retry_app.task(bind=True, max_retries=1, name="tests.background.test_tasks.task_limit")
    @semaphore("celery:task-limit:{n}", wait=0, on_busy=RetryLater(max_retries=None))
    def task_limit(self: Any, n: int) -> int:
        return n

    with semaphore("celery:task-limit:1"), pytest.raises(SemaphoreError, match=BUSY):
        task_limit.delay(1).get()
    assert [n for n, _, _ in retries] == [0]


def test_retry_later_finds_an_unbound_task(lock_table, retries):
    with semaphore("celery:retry-unbound:7"), pytest.raises(SemaphoreError, match=BUSY):
        retried_unbound.delay(7).get()
    assert len(retries) == 10
    assert retried_unbound.delay(7).get() == "celery:retry-unbound:7"


def test_retry_later_outside_a_task_raises_the_busy_error(lock_table, retries):
    with semaphore("celery:retry:8"), pytest.raises(SemaphoreBusy):
        retried_import(8)  # the task called as a function: nothing to retry
    with semaphore("plain:9"), pytest.raises(SemaphoreBusy):
        not_a_task(9)
    assert retries == []


def test_retry_later_refuses_bad_limits():
    with pytest.raises(ValueError, match="max_retries"):
        RetryLater(max_retries=-1)
    with pytest.raises(ValueError, match="max_jitter"):
        RetryLater(max_jitter=-1)


needs_django_tasks = pytest.mark.skipif(
    django.VERSION < (6, 0),
    reason=f"django.tasks exists from Django 6.0 (this is {django.get_version()})",
)


@needs_django_tasks
def test_django_task_locks_by_its_arguments(lock_table):
    from tests.support import django_tasks

    result = django_tasks.import_file.enqueue(5)
    assert result.status == "SUCCESSFUL"
    assert result.return_value == "django-task:5:full"
    assert django_tasks.import_file.enqueue(6, mode="quick").return_value == "django-task:6:quick"
    assert django_tasks.aimport_file.enqueue(1).return_value > 0
    assert django_tasks.with_context.enqueue(2).return_value == "django-task:ctx:2"
    assert holds_on("django-task:5:full") == []


@needs_django_tasks
def test_busy_django_task_fails_with_semaphore_busy(lock_table):
    from tests.support import django_tasks

    with semaphore("django-task:5:full"):
        result = django_tasks.import_file.enqueue(5)
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is SemaphoreBusy
    assert django_tasks.import_file.enqueue(5).status == "SUCCESSFUL"


@needs_django_tasks
def test_decorating_a_django_task_object_is_refused():
    from tests.support import django_tasks

    with pytest.raises(TypeError, match="below the task decorator"):
        semaphore("x")(django_tasks.import_file)


@pytest.fixture
def deferring_backend() -> Iterator[Any]:
    """django.tasks through tests.support.django_tasks.DeferringBackend: a task due later waits
    until the test runs it, as a worker would once its time comes."""
    from django.tasks import task_backends  # type: ignore[import-not-found]

    backend = {"default": {"BACKEND": "tests.support.django_tasks.DeferringBackend"}}
    with override_settings(TASKS=backend):
        yield task_backends["default"]


@pytest.fixture
def estimates() -> Iterator[list[int]]:
    seen: list[int] = []

    def on_busy(retry_after: int, **kwargs: Any) -> None:
        seen.append(retry_after)

    lock_busy.connect(on_busy, weak=False)
    try:
        yield seen
    finally:
        lock_busy.disconnect(on_busy)


@needs_django_tasks
@pytest.mark.parametrize("name", ["retried_import", "aretried_import"])
def test_busy_django_task_is_enqueued_again_to_run_after_the_estimate(
    lock_table, deferring_backend, estimates, name
):
    from tests.support import django_tasks

    task = getattr(django_tasks, name)
    with semaphore("django-task:retry:5", user="other-worker"):
        before = datetime.datetime.now(datetime.UTC)
        first = task.enqueue(5, mode="quick")
        after = datetime.datetime.now(datetime.UTC)
    # This attempt failed, and says where the task went.
    assert first.status == "FAILED"
    assert first.errors[0].exception_class is SemaphoreBusy
    [again] = deferring_backend.deferred
    assert f"enqueued again as task result {again.id}" in first.errors[0].traceback
    assert again.task.func is task.func and again.status == "READY"
    assert again.args == [5] and again.kwargs == {"mode": "quick"}
    [estimate] = estimates
    assert before + datetime.timedelta(seconds=estimate) <= again.task.run_after
    assert again.task.run_after <= after + datetime.timedelta(seconds=2 * estimate)
    # Its time comes and the lock is free: it runs.
    assert deferring_backend.run_due(now=again.task.run_after) == 1
    assert again.status == "SUCCESSFUL"
    assert again.return_value == "django-task:retry:5:quick"


@needs_django_tasks
def test_django_retry_later_needs_a_backend_that_defers(lock_table):
    from tests.support import django_tasks

    # The default backend (ImmediateBackend) runs at once and cannot run later.
    with semaphore("django-task:retry:6"):
        result = django_tasks.retried_import.enqueue(6)
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is SemaphoreBusy
    assert "cannot run a task later" in result.errors[0].traceback


@needs_django_tasks
def test_django_retry_later_needs_the_task_context(lock_table, deferring_backend):
    from tests.support import django_tasks

    with semaphore("django-task:no-context:7"):
        result = django_tasks.retried_without_context.enqueue(7)
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is TypeError
    assert "takes_context=True" in result.errors[0].traceback
    assert deferring_backend.deferred == []
