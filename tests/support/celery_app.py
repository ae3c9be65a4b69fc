"""The Celery app that test_celery_broker.py's worker processes run (``celery -A
tests.support.celery_app worker``): the README's recipe as written, and what the test reads back.

Each run of the task appends a line to the file named by ``DYNASEM_TEST_CELERY_LOG``: a run
(key, when it held the lock, its fence, the retries before it), a refusal (``lock_busy``) or
a task's failure. The broker is ``DYNASEM_TEST_BROKER``; the lock table, as for every test
process, ``DYNASEM_TEST_ENDPOINT`` and ``DYNASEM_TEST_TABLE`` (tests/support/settings.py).
"""

from __future__ import annotations

import os
import time
from typing import Any

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.celery_settings"
django.setup()

from celery import Celery, current_task, shared_task  # noqa: E402
from celery.signals import task_failure  # noqa: E402
from django.dispatch import receiver  # noqa: E402

from dynasem import current_hold, semaphore  # noqa: E402
from dynasem.celery import UniqueTask, retry_later  # noqa: E402
from dynasem.signals import lock_busy  # noqa: E402
from tests.support.events import record  # noqa: E402

app = Celery("dynasem-broker-test", broker=os.environ["DYNASEM_TEST_BROKER"])
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)


# The README's recipe: the task decorator on top, the semaphore next to the function, busy
# tasks retried later; every setting at its default but the test's short lease.
@shared_task(bind=True)
@semaphore("broker:{key}", on_busy=retry_later)
def hold(self: Any, key: str, n: int, seconds: float) -> int:
    start = time.time()
    time.sleep(seconds)  # the work, under the lock
    record(
        event="run",
        key=key,
        n=n,
        start=start,
        end=time.time(),
        fence=current_hold().fence,
        retries=self.request.retries,
    )
    return n


# A unique task (tests/background/test_unique_celery.py): its key held from enqueue to the end of
# its run; a run lease of 2 s, so that a worker killed mid-task frees it soon.
@shared_task(bind=True, base=UniqueTask, unique_key="unique:{key}", queue_lease=60, run_lease=2)
def unique_work(self: Any, key: str, n: int, seconds: float) -> int:
    start = time.time()
    record(event="unique-start", key=key, n=n, start=start, task_id=self.request.id)
    time.sleep(seconds)
    record(event="unique-run", key=key, n=n, start=start, end=time.time(), task_id=self.request.id)
    return n


# Retries once (test_unique_celery.py): the key goes on with the retry.
@shared_task(bind=True, base=UniqueTask, unique_key="unique:{key}", queue_lease=60, run_lease=2)
def unique_retried(self: Any, key: str) -> int:
    retries = self.request.retries
    record(event="unique-try", key=key, retries=retries, task_id=self.request.id)
    if retries == 0:
        raise self.retry(countdown=1.0)
    return retries


# Retries itself at once (test_review37e_celery_retry.py), its block going on for ``seconds``
# after the retry was enqueued (a ``finally``'s cleanup, still under the lock): the retry comes
# before the lock is given back. Every setting at its default (wait=0).
@shared_task(bind=True)
@semaphore("retry:{key}")
def retried_at_once(self: Any, key: str, n: int, seconds: float = 1.0) -> int:
    retries, start = self.request.retries, time.time()
    try:
        if retries == 0:
            raise self.retry(countdown=0)
        return retries
    finally:
        time.sleep(seconds)
        fence = current_hold().fence
        record(
            event="retry-run",
            key=key,
            n=n,
            retries=retries,
            start=start,
            end=time.time(),
            fence=fence,
        )


@receiver(lock_busy)
def refused(sender: Any, resource: str, retry_after: int, **kwargs: Any) -> None:
    request = current_task.request if current_task else None
    record(event="busy", resource=resource, retry_after=retry_after, n=request and request.args[1])


@task_failure.connect
def failed(sender: Any, task_id: str, exception: BaseException, args: Any, **kwargs: Any) -> None:
    record(event="failed", n=args[1] if args else None, error=repr(exception))
