"""Review 41c: lost answers and ambiguous outcomes on the writes that are not a plain take or
renewal. Each write here is applied and its answer lost (a read timeout: ambiguous), and the
sends after it never connect (a network down: not ambiguous, for they never reached DynamoDB);
each test says in its docstring what failed before its mend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from dynasem import SemaphoreUnavailable, run_once
from dynasem._background import unique
from dynasem._engine import resend
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb, job_rows, lock_rows, records


def landed_unanswered() -> SemaphoreUnavailable:
    """What send_request raises for a write whose answer timed out (it may have landed)."""
    return dynamodb._unavailable(ReadTimeoutError(endpoint_url="http://dynamodb.invalid"))


def never_connected() -> SemaphoreUnavailable:
    """What send_request raises for a write that could not connect (it never landed)."""
    return dynamodb._unavailable(EndpointConnectionError(endpoint_url="http://dynamodb.invalid"))


def first_lands_then_network_down(
    real: Callable[..., Any], mark: str, sent: list[str]
) -> Callable[..., Any]:
    """``real`` (a write's send) for writes whose UpdateExpression holds ``mark``: the first
    is applied and its answer lost, every later one never connects; others pass."""

    def send(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if mark not in action.get("UpdateExpression", ""):
            return real(action, *args, **kwargs)
        sent.append(mark)
        if len(sent) > 1:
            raise never_connected()
        real(action, *args, **kwargs)  # applied
        raise landed_unanswered()

    return send


def test_an_adoption_that_landed_before_the_network_went_down_is_withdrawn(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker adopts a unique task's claim (``unique.adopt``); the adoption lands and its
    answer is lost, and every send after it (``_send_adoption`` sends again while a
    transient cause lasts) never connects. Its last error, "never connected", said nothing
    was applied: the adoption's guard took it for its own clean answer and withdrew nothing,
    and the key stayed held by a run nobody makes (no heartbeat, no task) for the run lease,
    every enqueue of it refused (``Taken``, naming a task that never ran). Failed before its
    mend: the row still held the adoption, and the error said it was not ambiguous."""
    # As send_request says them: a read timeout may have landed, a connection never made
    # did not (both worth sending again).
    assert landed_unanswered().ambiguous and landed_unanswered().transient
    assert not never_connected().ambiguous and never_connected().transient
    resource = "rv41c:adopt-landed"
    carried = unique.claim(resource, "task-1", queue_lease=30)
    sent: list[str] = []
    landing = first_lands_then_network_down(lock_rows.update, "REMOVE #h.#c SET #h.#t", sent)
    monkeypatch.setattr(lock_rows, "update", landing)
    monkeypatch.setattr(resend, "RELEASE_PATIENCE", 0.3)
    with pytest.raises(SemaphoreUnavailable) as failed:
        unique.adopt(carried, lease=30)
    monkeypatch.undo()
    assert len(sent) > 1  # sent again, and given up
    left = holds_on(resource)
    assert [h.token for h in left] == [], "the adopted key is held for a run nobody makes"
    assert failed.value.ambiguous, "an adoption that may have landed is said not to have"
    unique.give_back(unique.claim(resource, "task-2", queue_lease=30))  # free again


def test_done_that_landed_before_the_network_went_down_is_not_said_to_run_again(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run_once body returns; its DONE lands and the answer is lost, and every send after
    it never connects, until the claim's trusted end. The block raised ``SemaphoreUnavailable``
    saying DONE "could not be written" and the job "then can run again", not ``ambiguous``:
    the job was DONE, and never runs again (``AlreadyDone``). Failed before its mend: the
    error was not ambiguous and said the job would run again unconditionally."""
    key = "rv41c:done-landed"
    sent: list[str] = []
    landing = first_lands_then_network_down(job_rows.update_job, "#status = :st", sent)
    monkeypatch.setattr(job_rows, "update_job", landing)
    monkeypatch.setattr(resend, "RELEASE_PATIENCE", 0.3)
    with pytest.raises(SemaphoreUnavailable) as failed, run_once(key, lease=2):
        pass
    monkeypatch.undo()
    assert len(sent) > 1
    row = lock_rows.get_item(key, records.JOB_SK) or {}
    assert row.get("status") == "DONE"
    assert failed.value.ambiguous, "DONE that may have landed is said not to have"
    assert "may not have been written" in str(failed.value)


def test_a_next_run_that_gives_up_withdraws_its_registration_through_a_throttle(
    lock_table: str,
) -> None:
    """A coalescing caller registered as the next run gives up (its wait ran out) and
    withdraws its registration; the delete is throttled through botocore's retries (the
    row's partition is the busy lock's). It was sent once: the registration stayed for the
    rest of its lease, and every busy caller meanwhile was answered ``Coalesced``, covered
    by a run that never comes. Failed before its mend: the next caller was coalesced."""
    from dynasem import Coalesced, SemaphoreBusy, semaphore
    from tests.support.faults import Faults

    resource = "rv41c:next-withdrawn"
    holder = semaphore(resource, wait=0).acquire()
    try:
        with Faults(dynamodb.get_client(), this_thread=True) as faults:
            # One botocore burst and a little more: only a withdrawal sent again gets through.
            throttled = faults.throttle("DeleteItem", 6)
            with pytest.raises(SemaphoreBusy) as gave_up:
                semaphore(resource, coalesce=True, wait=0.3).acquire()
            assert not isinstance(gave_up.value, Coalesced)
        assert throttled.fired == 6
        assert lock_rows.get_item(resource, records.NEXT_SK) is None, "the registration stayed"
        with pytest.raises(SemaphoreBusy) as next_caller:
            semaphore(resource, coalesce=True, wait=0.2).acquire()
        assert not isinstance(next_caller.value, Coalesced), "coalesced on a run never to come"
    finally:
        holder.release()


def test_a_run_handed_on_whose_answer_is_lost_as_its_retry_starts_is_no_lost_hold(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unique task's run enqueued its retry and ends: its hold becomes the retry's claim
    (``Held.become_claim``). That write lands and its answer is lost; the retry, started
    early and waiting for the run's end, adopts its claim at once; botocore's re-send is
    refused, the row showing neither the run's token nor the claim's, but the retry's run,
    under the run's own fence. ``end_run`` raised ``LockLost`` ("another holder took it
    over before the run ended") and sent ``lock_lost``: the run had handed its key on as
    asked. Failed before its mend: LockLost, and a lock_lost signal."""
    from dynasem import LockLost
    from dynasem.signals import lock_lost

    resource = "rv41c:handed-on-lost-answer"
    first = unique.claim(resource, "task-1", queue_lease=30)
    run = unique.adopt(first, lease=30)
    retry = unique.hand_on(run, first)
    assert retry is not None
    real = lock_rows.update
    adopted: list[Any] = []

    def landed_then_adopted(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        handing = "#h.#c.#n = :tok" in action.get("ConditionExpression", "")
        if not handing or adopted:
            return real(action, *args, **kwargs)
        real(action, *args, **kwargs)  # applied; its answer lost
        adopted.append(unique.adopt(retry, lease=30))  # the retry, waiting, adopts it
        raise dynamodb.Refused(lock_rows.get_item(resource), retried=True)

    losses: list[object] = []

    def said_lost(sender: object, **kwargs: object) -> None:
        losses.append(kwargs.get("reason"))

    monkeypatch.setattr(lock_rows, "update", landed_then_adopted)
    lock_lost.connect(said_lost, weak=False)
    try:
        try:
            unique.end_run(run, queue_lease=30)
        except LockLost as exc:
            pytest.fail(f"a run that handed its key on is said to have lost it: {exc.reason}")
        finally:
            monkeypatch.undo()
        assert losses == []
        assert not run.lost
        assert [h.token for h in holds_on(resource)] == [adopted[0].token]
    finally:
        lock_lost.disconnect(said_lost)
        for held in adopted:
            held.release()


def test_a_revoked_retrys_withdrawal_is_sent_again_through_a_throttle(lock_table: str) -> None:
    """A unique task's run enqueued its retry; the retry is revoked before it runs
    (``unique.give_back``), and its announcement is withdrawn from the run's entry, so that
    the run gives its key back at its end. That write was sent once: throttled through
    botocore's retries (the run's row is a busy one), the announcement stayed, the run's
    end made its hold the claim of the revoked retry, and every enqueue of the key was
    refused (``Taken``) for the queue lease. Failed before its mend: Taken."""
    from tests.support.faults import Faults

    resource = "rv41c:revoked-retry-throttled"
    first = unique.claim(resource, "task-1", queue_lease=30)
    run = unique.adopt(first, lease=30)
    retry = unique.hand_on(run, first)
    assert retry is not None
    with Faults(dynamodb.get_client(), this_thread=True) as faults:
        # The give-back's adoption passes (refused: the run goes on); the withdrawal after
        # it is throttled for one botocore burst and a little more.
        throttled = faults.throttle("UpdateItem", 6, after=1)
        unique.give_back(retry)
    assert throttled.fired == 6
    unique.end_run(run, queue_lease=30)
    try:
        again = unique.claim(resource, "task-2", queue_lease=30)
    except unique.Taken as taken:
        pytest.fail(f"the key is held for the revoked retry (task {taken.task_id})")
    unique.give_back(again)
