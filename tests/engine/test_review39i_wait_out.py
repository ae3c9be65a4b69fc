"""Review 39i: a decorated call that succeeds a hold (a Celery task's retry: queue.wait_out,
39b) on several resources, one of them held by someone else."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import decorators
from dynasem.testing import held_elsewhere
from tests.engine.test_review39b_wait_out import SKEW, in_thread

pytestmark = pytest.mark.django_db(transaction=False)


@semaphore(["pair-a:{key}", "pair-b:{key}"], wait=0)
def paired(key: str, ran: list[str]) -> None:
    ran.append(key)


def test_a_retry_of_several_resources_is_refused_at_once_by_another_holder_of_one(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run holds one resource of the pair, another holder the other: that holder refuses
    the retry (``wait=0``) at once, as it refuses any call. Waiting out the run's hold first
    (its whole hold, renewed: here past its lease and CLOCK_SKEW) only to be refused by the
    other holder after it kept a worker for nothing (for as long as the run held on)."""
    ran: list[Any] = []
    with held_elsewhere("pair-a:k", lease=1.5) as run, held_elsewhere("pair-b:k"):
        monkeypatch.setattr(decorators, "succession", [lambda args: frozenset({run.token})])
        thread = in_thread(lambda: paired("k", ran))
        thread.join(1.5 + SKEW + 1.0)
        waited = thread.is_alive()
    thread.join(30)
    assert not waited, "the retry waited out its run's hold, another holder in its way"
    assert [type(e) for e in thread.errors] == [SemaphoreBusy]  # type: ignore[attr-defined]
    assert not ran
