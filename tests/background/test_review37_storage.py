"""The seventh review, the storage layer on an engine as unkind as AWS: each test failed
before its mend."""

from __future__ import annotations

import time

import pytest

from dynasem import Coalesced, SemaphoreBusy, semaphore
from dynasem._background.unique import adopt, claim, task_of
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb, lock_rows, records
from dynasem.testing import held_elsewhere
from tests.support.faults import Faults

pytestmark = pytest.mark.reentry

# Every attempt botocore makes of one request (legacy mode: the first and three retries).
ONE_REQUEST = 4


def test_an_adoption_throttled_through_the_retries_is_sent_again(lock_table: str) -> None:
    """The worker's adoption of a claim is throttled still after botocore's retries (a hot
    partition, for a second): nothing was written. It was not sent again: the task failed
    (SemaphoreUnavailable) and never ran, and its claim stayed in the row, held for nobody
    for the whole queue lease, every enqueue of the key refused as taken by a task that
    will never run. It is sent again now, as every give-back is while it is throttled."""
    taken = claim("reindex:review37-throttled", "task-1", queue_lease=30)
    with Faults(dynamodb.get_client()) as faults:
        throttled = faults.throttle("UpdateItem", ONE_REQUEST)
        held = adopt(taken, lease=5)
    assert throttled.fired == ONE_REQUEST
    (hold,) = holds_on("reindex:review37-throttled")
    assert hold.token == held.token and task_of(hold.user_id) == "task-1"
    held.release()
    assert holds_on("reindex:review37-throttled") == []


def test_a_registration_whose_answer_is_lost_for_good_coalesces_nobody(lock_table: str) -> None:
    """A busy caller of a coalescing semaphore registers as the next run: applied, its answer
    lost (a 500), and every re-send of botocore's answered with a 500 too. The caller failed
    (SemaphoreUnavailable) and never ran, but its registration stayed, live for its lease:
    every later busy caller was answered Coalesced ("a next run that starts after you covers
    your work"), and none ran after the running one. Their work was dropped. The
    registration that may have landed is now withdrawn, and the caller waits unregistered
    (here its wait runs out while the lock is held: busy)."""
    resource = "rebuild:review37-lost"
    with held_elsewhere(resource):
        with Faults(dynamodb.get_client()) as faults:
            faults.lose_response("PutItem", 1)
            faults.server_error("PutItem", ONE_REQUEST - 1, after=1)
            with pytest.raises(SemaphoreBusy) as first:
                with semaphore(resource, coalesce=True, wait=0.5, lease=5):
                    pass
        assert not isinstance(first.value, Coalesced)
        # A later busy caller is not told that a next run covers it: it is that run (and
        # its wait runs out while the lock is held: busy, its registration withdrawn).
        with pytest.raises(SemaphoreBusy) as busy:
            with semaphore(resource, coalesce=True, wait=0.5, lease=5):
                pass
        assert not isinstance(busy.value, Coalesced)
    assert lock_rows.get_item(resource, records.NEXT_SK) is None


def test_a_registration_whose_read_is_throttled_waits_unregistered(lock_table: str) -> None:
    """A busy caller's registration first reads the row (consistently: the fence as it is
    now); that read throttled through botocore's retries failed the caller at once
    (SemaphoreUnavailable), though the same cause on the registration's write has it wait in
    line unregistered (one run more at worst), and the acquire loop never fails a caller for
    a throttled read while its wait lasts."""
    resource = "rebuild:review37-read-throttled"
    with held_elsewhere(resource):
        with Faults(dynamodb.get_client()) as faults:
            throttled = faults.throttle("GetItem", ONE_REQUEST)
            with pytest.raises(SemaphoreBusy) as busy:
                with semaphore(resource, coalesce=True, wait=0.5, lease=5):
                    pass
        assert throttled.fired == ONE_REQUEST
        assert not isinstance(busy.value, Coalesced)
    assert lock_rows.get_item(resource, records.NEXT_SK) is None


@pytest.mark.django_db(transaction=True)
def test_a_done_answered_with_5xx_through_the_retries_after_the_commit_is_sent_again(
    lock_table: str,
) -> None:
    """The transaction commits; DONE, its first commit hook, is answered with a 500 through
    every attempt botocore makes (a partition's leader failing over: DynamoDB's 5xx are
    transient). A throttle is sent again since the thirty-first session; a 5xx was given up at
    once (not a "passing" cause): the job stayed RUNNING, its heartbeat stopped, and once its
    lease was over it was claimed and run a second time, though its work was committed."""
    from django.contrib.auth.models import User
    from django.db import transaction

    from dynasem import AlreadyDone, run_once
    from tests.background.test_run_once_review import ThrottleFinishes, job_row

    key = "rv37:done-5xx-after-commit"
    with ThrottleFinishes(ONE_REQUEST, status=500) as failed:
        with transaction.atomic():
            with run_once(key, lease=1) as job:
                User.objects.create(username="rv37-committed-work")
    assert failed.fired == ONE_REQUEST
    assert User.objects.filter(username="rv37-committed-work").exists()  # committed
    ran_again = []
    time.sleep(1.7)  # the lease (1 s) and CLOCK_SKEW are over
    with pytest.raises(AlreadyDone), run_once(key) as again:
        ran_again.append(again.attempt)  # a committed job, run a second time
    assert (job_row(key).get("status"), job.status, ran_again) == ("DONE", "DONE", [])


def test_a_retry_announced_while_throttled_through_the_retries_is_sent_again(
    lock_table: str,
) -> None:
    """A unique task's run enqueues its retry (Celery's ``self.retry()``): the run announces
    the retry's token in its entry first. That write, throttled still after botocore's
    retries (the key's partition busy for a second), was not sent again: the enqueue raised
    SemaphoreUnavailable, which Celery's ``retry()`` turns into ``Reject(requeue=False)``:
    the retry was dropped, the task's work never done. The announcement names our token
    (applied twice, it is the same), so it is sent again while it fails for a transient
    cause, as the adoption is."""
    from dynasem._background.unique import hand_on

    taken = claim("reindex:review37-announce", "task-1", queue_lease=30)
    run = adopt(taken, lease=5)
    try:
        with Faults(dynamodb.get_client()) as faults:
            throttled = faults.throttle("UpdateItem", ONE_REQUEST)
            retry = hand_on(run, taken)
        assert throttled.fired == ONE_REQUEST
        assert retry is not None and run.handed_on == retry.token
    finally:
        run.release()
