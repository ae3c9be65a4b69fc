"""dynasem._background.unique: a key claimed at enqueue (queue lease, no heartbeat, no process
identity)
and adopted, once, by the worker that runs the task; a retry's claim handed on at the run's
end, waited for if the retry starts first, taken over if the run died."""

from __future__ import annotations

import threading
import time

import pytest

from dynasem import LockLost, current_hold, semaphore
from dynasem._background.unique import (
    Claim,
    Taken,
    adopt,
    claim,
    end_run,
    hand_on,
    running,
    task_of,
)
from dynasem._operators.locks import break_hold, holds_on
from dynasem.testing import abandon

# dynasem's own re-entry rule (tests/conftest.py's no_reentry is off here): a claim must be
# refused even where a nested acquire would re-enter the hold.
pytestmark = pytest.mark.reentry


def test_a_claim_holds_the_key_for_its_task_and_refuses_another(lock_table: str) -> None:
    first = claim("reindex:1", "task-1", queue_lease=30)
    with pytest.raises(Taken) as taken:
        claim("reindex:1", "task-2", queue_lease=30)
    assert taken.value.task_id == "task-1"
    (hold,) = holds_on("reindex:1")
    assert hold.token == first.token and task_of(hold.user_id) == "task-1"
    assert hold.expires_ms > time.time() * 1000 + 25_000  # the queue lease


def test_the_same_thread_enqueueing_twice_finds_the_key_taken(lock_table: str) -> None:
    claim("reindex:2", "task-1", queue_lease=30)
    with pytest.raises(Taken):
        claim("reindex:2", "task-2", queue_lease=30)  # no re-entry of a claim


def test_the_worker_adopts_it_for_the_run_lease_and_gives_it_back(lock_table: str) -> None:
    taken = claim("reindex:3", "task-1", queue_lease=30)
    again = Claim.from_header(taken.header())
    assert again == taken
    held = adopt(again, lease=5)
    (hold,) = holds_on("reindex:3")
    assert hold.expires_ms < time.time() * 1000 + 6_000  # now the run lease
    assert hold.token == held.token != taken.token  # the run's own token
    held.renew()  # the row's lease end is the run's: a renewal is one write, not refused
    held.release()
    assert holds_on("reindex:3") == []
    claim("reindex:3", "task-2", queue_lease=30)  # free again


def test_a_claim_taken_over_meanwhile_is_not_adopted(lock_table: str) -> None:
    taken = claim("reindex:4", "task-1", queue_lease=30)
    assert break_hold("reindex:4", taken.token)
    claim("reindex:4", "task-2", queue_lease=30)
    with pytest.raises(LockLost):
        adopt(taken, lease=5)


def test_a_header_that_is_not_a_claim_is_none() -> None:
    assert Claim.from_header(None) is None
    assert Claim.from_header({"resource": "r"}) is None
    assert Claim.from_header({"resource": "r", "token": "t", "fence": "x", "task_id": "i"}) is None


def test_a_claim_is_adopted_once_a_second_delivery_does_not_run(lock_table: str) -> None:
    taken = claim("reindex:5", "task-1", queue_lease=30)
    held = adopt(taken, lease=5)
    with pytest.raises(LockLost, match="adopted already"):
        adopt(taken, lease=5)  # the same message delivered again
    held.release()
    with pytest.raises(LockLost):
        adopt(taken, lease=5)  # and after the run


def test_a_claim_in_a_running_task_of_the_same_key_is_refused(lock_table: str) -> None:
    held = adopt(claim("reindex:6", "task-1", queue_lease=30), lease=5)
    with running(held):
        assert current_hold() is held
        with pytest.raises(Taken):
            claim("reindex:6", "task-2", queue_lease=30)  # not a re-entry of the run's hold
        with semaphore("reindex:6", wait=0) as inner:  # the run's own code re-enters it
            assert inner.token == held.token
    end_run(held, queue_lease=30)
    assert holds_on("reindex:6") == []


def test_a_retry_gets_the_key_when_its_run_ends_and_waits_if_it_starts_first(
    lock_table: str,
) -> None:
    first = claim("reindex:7", "task-1", queue_lease=30)
    run = adopt(first, lease=5)
    retry = hand_on(run, first)
    assert retry is not None and retry.token != first.token
    assert hand_on(run, first) is None  # one retry goes on with the key
    adopted: list[object] = []
    early = threading.Thread(target=lambda: adopted.append(adopt(retry, lease=5)))
    early.start()  # the retry starts before its run ended: it waits
    time.sleep(0.5)
    assert adopted == []
    end_run(run, queue_lease=30)  # the run's hold becomes the retry's claim ...
    early.join(5)
    (second,) = adopted  # ... which the waiting retry adopts
    assert isinstance(second, type(run)) and holds_on("reindex:7")[0].token == second.token
    second.release()
    assert holds_on("reindex:7") == []


def test_a_retry_whose_run_died_takes_over_after_its_lease(lock_table: str) -> None:
    first = claim("reindex:8", "task-1", queue_lease=30)
    run = adopt(first, lease=1)
    retry = hand_on(run, first)
    assert retry is not None
    abandon(run)  # the run's process dies: no renewal, no end
    started = time.monotonic()
    held = adopt(retry, lease=5)
    waited = time.monotonic() - started
    assert 0.3 < waited < 1 + 0.5 + 1  # its lease (1 s) and CLOCK_SKEW (0.5 s)
    # The run may only have stalled: its successor is fenced against it.
    assert held.fence > run.fence
    assert holds_on("reindex:8")[0].fence == held.fence
    held.release()
    assert holds_on("reindex:8") == []


def test_a_task_that_waited_past_its_queue_lease_runs_unless_a_later_one_took_the_key(
    lock_table: str,
) -> None:
    late = claim("reindex:9", "task-1", queue_lease=1)
    time.sleep(1.6)  # its queue lease and CLOCK_SKEW are over; nobody enqueued meanwhile
    adopt(late, lease=5).release()  # it still runs
    stale = claim("reindex:9", "task-2", queue_lease=1)
    time.sleep(1.6)
    later = claim("reindex:9", "task-3", queue_lease=30)  # a later enqueue takes the key ...
    with pytest.raises(LockLost):
        adopt(stale, lease=5)  # ... and the task that waited too long does not run
    adopt(later, lease=5).release()


def test_a_retry_taking_over_as_its_run_ends_adopts_what_the_run_handed_on(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's lease ran out, the retry saw it and sends its take-over: the run's end lands
    in between (it hands the key on), the take-over is refused. The retry adopts its claim."""
    from dynasem._background import unique

    first = claim("reindex:10", "task-1", queue_lease=30)
    run = adopt(first, lease=1)
    retry = hand_on(run, first)
    assert retry is not None
    abandon(run)
    time.sleep(1.6)  # the run's lease and CLOCK_SKEW are over: the retry may take over
    seen = unique._announcer

    def run_ends_meanwhile(item: object, token: str) -> object:
        found = seen(item, token)  # type: ignore[arg-type]
        if found is not None:
            monkeypatch.setattr(unique, "_announcer", seen)
            end_run(run, queue_lease=30)
        return found

    monkeypatch.setattr(unique, "_announcer", run_ends_meanwhile)
    held = adopt(retry, lease=5)
    (hold,) = holds_on("reindex:10")
    assert hold.token == held.token
    held.release()


def test_an_adoption_whose_answer_was_lost_is_ours(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore sent the adoption again after a lost answer: the second attempt is refused by
    the first's own write. The run is ours, not dropped."""
    from dynasem._storage import dynamodb, lock_rows

    taken = claim("reindex:11", "task-1", queue_lease=30)
    real = lock_rows.update

    def applied_then_refused(action: dict[str, object], **kwargs: object) -> object:
        monkeypatch.setattr(lock_rows, "update", real)
        after = lock_rows.update_item(action, True)  # applied ...
        raise dynamodb.Refused(after, retried=True)  # ... its answer lost, the retry refused

    monkeypatch.setattr(lock_rows, "update", applied_then_refused)
    held = adopt(taken, lease=5)
    (hold,) = holds_on("reindex:11")
    assert hold.token == held.token
    held.release()
    assert holds_on("reindex:11") == []


@pytest.mark.parametrize("taken_meanwhile", [False, True])
def test_an_adoption_answered_past_its_lease_is_confirmed_before_the_run(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, taken_meanwhile: bool
) -> None:
    """The adoption was applied, but its answer came after the run lease and CLOCK_SKEW were
    over (a pause): another enqueue may have taken the key meanwhile, and its task be running.
    The adoption is confirmed with a renewal of its own before the run: trusted a lease from
    that renewal if the key is still ours, else LockLost (the task does not run). Found by the
    simulator's unique mix (seed 39, light faults: a worker stalled 15 s at the answer, then
    ran beside a later claim of its key)."""
    from dynasem._storage import lock_rows

    taken = claim("reindex:12", "task-1", queue_lease=30)
    real = lock_rows.update

    def applied_then_late(action: dict[str, object], **kwargs: object) -> object:
        monkeypatch.setattr(lock_rows, "update", real)
        answer = real(action, **kwargs)  # applied ...
        time.sleep(1.6)  # ... its answer read past the run lease (1 s) and CLOCK_SKEW (0.5 s)
        if taken_meanwhile:
            claim("reindex:12", "task-2", queue_lease=30)  # a later enqueue took the key
        return answer

    monkeypatch.setattr(lock_rows, "update", applied_then_late)
    if taken_meanwhile:
        with pytest.raises(LockLost):
            adopt(taken, lease=1)
        (hold,) = holds_on("reindex:12")
        assert task_of(hold.user_id) == "task-2"
        return
    held = adopt(taken, lease=1)
    assert held.seconds_left() > 0.2  # trusted from the confirming renewal
    (hold,) = holds_on("reindex:12")
    assert hold.token == held.token
    held.release()
    assert holds_on("reindex:12") == []


def test_an_adoption_interrupted_after_it_landed_gives_the_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as the worker's adoption applied, before its answer was read (found by the
    simulator's interrupt fault: ``--mix unique --faults interrupts``, 14 of seeds 1-40): the
    task never runs, and its key must not stay held by the run nobody makes, refusing every
    enqueue of it until the run lease runs out."""
    from dynasem._storage import lock_rows

    taken = claim("reindex:int", "task-1", queue_lease=30)
    update = lock_rows.update

    def interrupted(*args: object, **kwargs: object) -> object:
        update(*args, **kwargs)  # the adoption lands...
        raise KeyboardInterrupt  # ...and Ctrl-C comes before its answer is read

    monkeypatch.setattr(lock_rows, "update", interrupted)
    with pytest.raises(KeyboardInterrupt):
        adopt(taken, lease=60)
    monkeypatch.setattr(lock_rows, "update", update)
    assert holds_on("reindex:int") == []
    claim("reindex:int", "task-2", queue_lease=30)  # free at once
