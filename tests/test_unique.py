"""dynasem.unique: a key claimed at enqueue (queue lease, no heartbeat, no process identity)
and adopted by the worker that runs the task."""

from __future__ import annotations

import time

import pytest

from dynasem import LockLost
from dynasem.operations import break_hold, holds_on
from dynasem.unique import Claim, Taken, adopt, claim, task_of


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
