"""run_once under review (thirty-first session): each test failed before its mend.

* A DONE (or FAILED) write that DynamoDB throttles still after botocore's retries is not sent
  again (a hold's release is: tests/engine/test_throttled.py): after a commit, the committed
  job stays RUNNING, its heartbeat stopped, and runs a second time once the lease lapses.
* A claim whose answer is lost for good (applied, then a 500 on every retry botocore makes)
  is not given back (an interrupted claim is; a lock's take withdraws what may be its own):
  the job sits RUNNING under a claim nobody renews or runs, every run_once of it refused
  (SemaphoreBusy, "someone is on it") for a whole lease.
* An interrupt (a signal's exception) that lands in ``__exit__`` before ``_finish`` stops the
  heartbeat, or in ``_claim`` after the heartbeat started when the give-back then fails,
  leaves the Job's heartbeat renewing the job for good: RUNNING for nobody while the process
  lives.
* A child forked inside the body that leaves the block finishes the parent's claim (no pid
  check in the Job): FAILED under the parent's token while its body runs trusted, and the
  job is claimed and run beside it.
* One ``run_once(...)`` object entered by two threads (or tasks): the jobs it entered are kept
  on the object, not per thread/task (a Semaphore keeps them in a ContextVar), so the first
  block to leave finishes the other thread's claim: a run whose claim lapsed writes DONE under
  the claim that replaced it, while that claim's body still runs, and is told nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from dynasem import AlreadyDone, LockLost, SemaphoreBusy, SemaphoreUnavailable, run_once
from dynasem._storage import dynamodb, lock_rows, records
from tests.support.faults import Faults, _error_response

# Every attempt botocore makes of one request (legacy mode: the first and three retries).
ONE_REQUEST = 4


def job_row(key: str) -> dict[str, Any]:
    return lock_rows.get_item(key, records.JOB_SK) or {}


def stop_heartbeats_of(key: str) -> None:
    """Stop what the bug leaves renewing (else it outlives the test, and its table)."""
    from dynasem._engine import heartbeat

    for beat in heartbeat.scheduled():
        if getattr(beat.held, "key", None) == key:
            beat.stop()


class ThrottleFinishes:
    """Throttle (as DynamoDB does: never applied) the next ``n`` attempts of run_once's
    DONE/FAILED write only (job_writes.job_finish's UpdateExpression), through botocore's
    hooks: renewals and claims pass. ``status=500``: answer them with a 500 instead."""

    MARK = b"SET #status = :st, #finishedMs = :now, #lastToken = :tok"

    def __init__(self, n: int, status: int = 400):
        self.remaining = n
        self.fired = 0
        self.status = status
        self.client = dynamodb.get_client()

    def _before_send(self, request: Any, **kwargs: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if self.remaining and self.MARK in body:
            self.remaining -= 1
            self.fired += 1
            if self.status != 400:
                return _error_response(self.status, "InternalServerError", "injected 5xx")
            return _error_response(
                400, "ProvisionedThroughputExceededException", "injected throttling"
            )
        return None

    def __enter__(self) -> ThrottleFinishes:
        self.client.meta.events.register_first("before-send.dynamodb", self._before_send)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("before-send.dynamodb", self._before_send)


@pytest.mark.django_db(transaction=True)
def test_a_done_throttled_after_the_commit_is_sent_again(lock_table):
    """The transaction commits; DONE, the first commit hook, is throttled through botocore's
    retries (one burst on a hot partition). It is never sent again: the error is logged, the
    heartbeat is already stopped, the job stays RUNNING and, its lease over, runs a second
    time although its work is committed. (A hold's release throttled the same way is sent
    again for up to RELEASE_PATIENCE: test_throttled.py.)"""
    key = "rv:done-throttled-after-commit"
    with ThrottleFinishes(ONE_REQUEST) as throttled:
        with transaction.atomic():
            with run_once(key, lease=1) as job:
                User.objects.create(username="rv-committed-work")
    assert throttled.fired == ONE_REQUEST
    assert User.objects.filter(username="rv-committed-work").exists()  # committed
    ran_again = []
    time.sleep(1.7)  # the lease (1 s) and CLOCK_SKEW are over
    with pytest.raises(AlreadyDone), run_once(key) as again:
        ran_again.append(again.attempt)  # a committed job, run a second time
    assert (job_row(key).get("status"), job.status, ran_again) == ("DONE", "DONE", [])


def test_a_done_throttled_outside_a_transaction_is_sent_again(lock_table):
    """Autocommit: the body returned (its work done), DONE is throttled through botocore's
    retries once: the block raises SemaphoreUnavailable and the job is left RUNNING, its
    heartbeat stopped, for a whole lease (every other run_once: SemaphoreBusy, which the
    documented pattern drops as "someone is on it"), then runs again."""
    key = "rv:done-throttled"
    with ThrottleFinishes(ONE_REQUEST) as throttled:
        try:
            with run_once(key, lease=30):
                pass
        except SemaphoreUnavailable as exc:  # the failure under test, shown below
            error: Exception | None = exc
        else:
            error = None
    assert throttled.fired == ONE_REQUEST
    assert (job_row(key).get("status"), error) == ("DONE", None)


def test_a_claim_applied_whose_answers_are_all_lost_is_given_back(lock_table):
    """The claim is applied; its answer is lost (a 500), and botocore's three retries are
    answered 500 too (never applied): run_once raises SemaphoreUnavailable, ambiguous. What it
    may have claimed is not given back: the job is RUNNING under its token, renewed by
    nobody, its body run by nobody, and the next run_once (this caller's retry, or any other
    worker's) is refused SemaphoreBusy until the lease (30 s here; LEASE, 60 s by default)
    runs out. An interrupted claim is given back for exactly this reason
    (test_run_once.py::test_an_interrupt_after_the_claim_landed_gives_the_job_back)."""
    key = "rv:claim-unanswered"
    with Faults(dynamodb.get_client(), this_thread=True) as faults:
        lost = faults.lose_response("UpdateItem", 1)
        errors = faults.server_error("UpdateItem", ONE_REQUEST - 1, after=1)
        with pytest.raises(SemaphoreUnavailable) as raised, run_once(key, lease=30):
            pytest.fail("the body must not run")
    assert (lost.fired, errors.fired) == (1, ONE_REQUEST - 1)
    assert raised.value.ambiguous
    assert job_row(key)["status"] == "FAILED"  # the claim was applied, then given back
    try:
        with run_once(key) as again:  # at once: nobody runs it
            attempt: Any = again.attempt
    except SemaphoreBusy as busy:
        attempt = busy
    assert attempt == 2, f"refused for a claim nobody holds: {attempt!r}"


def test_one_run_once_object_entered_by_two_threads_finishes_each_ones_own_claim(lock_table):
    """``nightly = run_once("rv:shared", lease=1)`` at module level, entered by two threads.
    A's claim lapses (its renewals fail for a whole lease: here its heartbeat is stopped), B
    claims the job again (as documented: a dead claim is taken over) and runs its body. A's
    block then ends: it must raise LockLost and leave B's claim alone. Instead A's exit pops
    B's Job from the shared list and writes DONE under B's token while B's body still runs
    (a third process now gets AlreadyDone; had B's body failed, the job would stay DONE), and
    A, whose claim was lost, is told nothing; B's own exit then fails with A's LockLost."""
    nightly = run_once("rv:shared", lease=1)
    b_inside, a_left, b_may_leave = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def thread_b() -> None:
        try:
            with nightly as b:
                seen["b_token"] = b.token
                b_inside.set()
                a_left.wait(10)
                seen["row_while_b_runs"] = job_row("rv:shared")
                b_may_leave.wait(10)
        except LockLost as exc:  # B's exit finishes A's lost Job (shown by the asserts)
            seen["b_error"] = exc

    other = threading.Thread(target=thread_b)
    try:
        with nightly as a:
            a._heartbeat.stop()  # A's renewals fail for a whole lease
            time.sleep(1.7)  # past the lease (1 s) and CLOCK_SKEW (0.5 s): B may claim it
            other.start()
            assert b_inside.wait(10)
    except LockLost as exc:
        seen["a_error"] = exc
    a_left.set()
    time.sleep(0.3)
    b_may_leave.set()
    other.join(10)
    row = seen["row_while_b_runs"]
    assert isinstance(seen.get("a_error"), LockLost), "A's lost claim was not reported"
    assert (row.get("status"), row.get("token")) == ("RUNNING", seen["b_token"]), row


def test_an_interrupt_as_the_block_is_left_does_not_keep_the_job_renewed(lock_table, monkeypatch):
    """The body returned; a signal's exception (Ctrl-C, Celery's SoftTimeLimitExceeded) lands
    in ``__exit__`` before ``_finish`` stops the heartbeat: here in the Django lookup of the
    open transaction (``transactions.open_transaction``: the routers' code). The Job was
    popped already and nothing stops its heartbeat: the job stays RUNNING, renewed for good
    as long as the process lives, and every other run_once of it is refused SemaphoreBusy.
    (A hold's release interrupted before it began is left to its lease, its heartbeat
    stopped: hold.py's ``left_to_lease``.)"""
    from dynasem._background import run_once as module

    lookup = module.transactions.open_transaction
    calls: list[int] = []

    def interrupted(using: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the signal lands in the lookup
        return lookup(using)

    key = "rv:exit-interrupted"
    monkeypatch.setattr(module.transactions, "open_transaction", interrupted)
    with pytest.raises(KeyboardInterrupt), run_once(key, lease=1):
        pass
    monkeypatch.undo()
    time.sleep(2.5)  # twice the lease and the skew: left to its lease, it is over by now
    try:
        with run_once(key) as again:
            outcome: Any = again.attempt
    except SemaphoreBusy as busy:
        outcome = busy
    finally:
        stop_heartbeats_of(key)
    assert outcome == 2, f"refused, still renewed by the interrupted block's heartbeat: {outcome!r}"


def test_an_interrupted_claim_whose_give_back_fails_is_not_renewed_for_good(
    lock_table, monkeypatch
):
    """The claim lands and its heartbeat starts; a signal's exception lands right after (here
    as the heartbeat is started, before ``_claim`` returns): claim() gives the job back, but
    that FAILED write gets a 500 through botocore's retries (not a passing cause: given up at
    once, logged "it expires"). The Job's heartbeat is never stopped on this path (the async
    cut-off does stop it): it renews the job for good, RUNNING for nobody, every other
    run_once refused SemaphoreBusy as long as the process lives."""
    from dynasem._background import run_once as module

    class Interrupted(module.Heartbeat):
        def start(self) -> None:
            super().start()
            raise KeyboardInterrupt  # the signal lands as the heartbeat starts

    key = "rv:claim-give-back-failed"
    monkeypatch.setattr(module, "Heartbeat", Interrupted)
    with ThrottleFinishes(ONE_REQUEST, status=500) as failed:
        with pytest.raises(KeyboardInterrupt), run_once(key, lease=1):
            pytest.fail("the body must not run")
    monkeypatch.undo()
    assert failed.fired == ONE_REQUEST  # the give-back failed
    time.sleep(2.5)  # twice the lease and the skew: left to its lease, it is over by now
    try:
        with run_once(key) as again:
            outcome: Any = again.attempt
    except SemaphoreBusy as busy:
        outcome = busy
    finally:
        stop_heartbeats_of(key)
    assert outcome == 2, f"refused, still renewed by the interrupted claim's heartbeat: {outcome!r}"


def test_a_child_forked_in_the_body_that_leaves_the_block_keeps_its_parents_claim(lock_table):
    """A child forked inside the body leaves the block (``sys.exit()``: SystemExit; or a
    return) and exits. Its ``__exit__`` finishes the PARENT's claim (the Job has no pid check;
    a hold's release has one, 3f74094): FAILED "SystemExit: 0" under the parent's token while
    the parent's body still runs, its claim trusted (seconds left, heartbeat on). Another
    run_once then claims and runs the job beside it: two bodies, both trusted. (A child that
    returns writes DONE instead: the job is DONE before its work is, and the parent's own
    DONE, refused, is then taken for its own lost answer: lastToken is its token.)"""
    import os
    import sys
    import warnings

    key = "rv:forked-child"
    parent = os.getpid()
    seen: dict[str, Any] = {}

    def body() -> None:
        with run_once(key, lease=30) as job:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # fork() of a process with threads
                child = os.fork()
            if child == 0:
                sys.exit(0)  # the child leaves the block (SystemExit through __exit__)
            os.waitpid(child, 0)
            seen["trusted"] = job.seconds_left()
            seen["row"] = job_row(key)
            try:
                with run_once(key, lease=30) as other:  # another worker, meanwhile
                    seen["beside"] = other.attempt
            except SemaphoreBusy:
                seen["beside"] = None

    try:
        body()
    except LockLost as exc:  # the parent's exit: the job was claimed beside it (shown below)
        if os.getpid() != parent:
            os._exit(0)
        seen["parent_lost"] = exc
    except BaseException:
        if os.getpid() != parent:
            os._exit(0)
        raise
    if os.getpid() != parent:
        os._exit(0)
    assert seen["trusted"] > 20  # the parent's claim, trusted all along
    assert (seen["beside"], seen["row"]["status"]) == (None, "RUNNING"), seen


def test_an_interrupt_after_the_claim_returned_and_before_the_block_gives_the_job_back(
    lock_table, monkeypatch
):
    """claim() returned the Job (its heartbeat on); a signal's exception lands in
    ``__enter__`` as the Job is remembered (``self._jobs.append``), before the block begins:
    claim()'s guard is over and nothing else gives the job back or stops its heartbeat. The
    job is RUNNING for nobody, renewed as long as the process lives (the window e9bce8c
    closed for a semaphore's entry: ``hold.delivering``)."""

    from dynasem._engine import reentry as module

    class Interrupting:
        """The ContextVar of entered blocks, whose first set is interrupted once done."""

        def __init__(self, real: Any):
            self.real, self.fired = real, False

        def get(self) -> Any:
            return self.real.get()

        def set(self, value: Any) -> Any:
            token = self.real.set(value)
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt  # the signal lands as the job is remembered
            return token

    key = "rv:enter-interrupted"
    monkeypatch.setattr(module, "_entered", Interrupting(module._entered))
    with pytest.raises(KeyboardInterrupt), run_once(key, lease=1):
        pytest.fail("the body must not run")
    monkeypatch.undo()
    time.sleep(2.5)  # twice the lease and the skew: left to its lease, it is over by now
    try:
        with run_once(key) as again:
            outcome: Any = again.attempt
    except SemaphoreBusy as busy:
        outcome = busy
    finally:
        stop_heartbeats_of(key)
    assert outcome == 2, f"refused, still renewed for nobody: {outcome!r}"
