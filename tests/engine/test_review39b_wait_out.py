"""Review (thirty-ninth session, b): a decorated call that succeeds a hold (a Celery task's
retry, sent from inside its run's block: dynasem.celery names that run's holds) waits it out,
at ``wait=0`` too, and takes the lock as any waiter does: never beside it, never past the
time it could be taken over."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from dynasem import SemaphoreBusy, current_hold, semaphore
from dynasem._engine import decorators, queue
from dynasem._storage import permit_items
from dynasem.testing import abandon, held_elsewhere
from tests.engine.test_core import stored_end

pytestmark = pytest.mark.django_db(transaction=False)

SKEW = 0.5  # the tests' CLOCK_SKEW (tests/support/settings.py)


@pytest.fixture
def succeeded(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The tokens every decorated call succeeds, as a retry's header names its run's."""
    tokens: set[str] = set()
    monkeypatch.setattr(decorators, "succession", [lambda args: frozenset(tokens)])
    return tokens


@semaphore("retried:{key}", wait=0)
def retried(key: str, ran: list[dict[str, Any]]) -> None:
    ran.append({"start": time.time(), "fence": current_hold().fence})


@semaphore("counted:{key}", limit=permit_items.INLINE_MAX + 1, wait=0)
def counted(key: str, ran: list[dict[str, Any]]) -> None:
    ran.append({"start": time.time()})


def in_thread(work: Any) -> threading.Thread:
    """``work`` run in a thread of its own (not a nested acquire of the test's holds)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_a_retry_waits_out_the_hold_of_its_run_past_that_holds_lease(
    lock_table: str, succeeded: set[str]
) -> None:
    """The run goes on holding (renewed) for longer than its lease and CLOCK_SKEW after its
    retry came: the retry (``wait=0``) waits, and runs once the run gave the lock back. Before
    the mend it was refused at once (``SemaphoreBusy``): a task that retries itself failed."""
    ran: list[dict[str, Any]] = []
    with held_elsewhere("retried:k", lease=1.5) as run:
        succeeded.add(run.token)
        thread = in_thread(lambda: retried("k", ran))
        time.sleep(1.5 + SKEW + 1.0)
        assert not ran, "the retry ran beside its run"
        released = time.time()
    thread.join(30)
    assert not thread.errors, thread.errors  # type: ignore[attr-defined]
    assert len(ran) == 1 and ran[0]["start"] >= released
    assert ran[0]["fence"] > run.fence


def test_a_retry_is_refused_at_once_by_a_hold_that_is_not_its_runs(
    lock_table: str, succeeded: set[str]
) -> None:
    """Only the run's own holds are waited out: another holder refuses the retry at
    ``wait=0`` as it refuses any call."""
    succeeded.add("a-token-of-no-hold-here")
    with held_elsewhere("retried:k"):
        started = time.monotonic()
        with pytest.raises(SemaphoreBusy):
            retried("k", [])
        assert time.monotonic() - started < 1.0


def test_a_retry_of_a_run_that_died_takes_the_lock_over_when_its_lease_runs_out(
    lock_table: str, succeeded: set[str]
) -> None:
    """The run's process died holding the lock (its lease no longer renewed): the retry
    waits till it may take it over (the lease's end plus CLOCK_SKEW), not longer, and never
    before."""
    ran: list[dict[str, Any]] = []
    with held_elsewhere("retried:k", lease=1.5) as run:
        abandon(run)
        end = stored_end("retried:k", run.token)
        succeeded.add(run.token)
        thread = in_thread(lambda: retried("k", ran))
        thread.join(30)
    assert not thread.errors, thread.errors  # type: ignore[attr-defined]
    assert len(ran) == 1
    assert end + SKEW <= ran[0]["start"] <= end + SKEW + queue.WAIT_OUT_GRACE
    assert ran[0]["fence"] > run.fence


def test_a_retry_waits_out_its_runs_permit_of_a_counting_semaphore_held_in_items(
    lock_table: str, succeeded: set[str]
) -> None:
    """Every permit of a counting semaphore held in permit items (more than INLINE_MAX) is
    taken, one of them by the run: the retry waits for that one, and takes it once given
    back, not one more than the limit."""
    limit = permit_items.INLINE_MAX + 1
    ran: list[dict[str, Any]] = []
    with contextlib.ExitStack() as others:
        for _ in range(limit - 1):
            others.enter_context(held_elsewhere("counted:k", limit=limit))
        with held_elsewhere("counted:k", limit=limit) as run:
            succeeded.add(run.token)
            thread = in_thread(lambda: counted("k", ran))
            time.sleep(1.0)
            assert not ran, "the retry ran beside its run, past the limit"
            released = time.time()
        thread.join(30)
        assert not thread.errors, thread.errors  # type: ignore[attr-defined]
        assert len(ran) == 1 and ran[0]["start"] >= released
