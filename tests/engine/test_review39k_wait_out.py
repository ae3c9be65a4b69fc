"""Review 39k: a decorated call that succeeds a hold (a Celery task's retry: queue.wait_out,
39b, 80cef00) of a counting semaphore of several resources held in permit items."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._storage import permit_items
from dynasem.testing import held_elsewhere
from tests.engine.test_review39b_wait_out import in_thread, succeeded  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=False)

LIMIT = permit_items.INLINE_MAX + 1
PAIR = ["counted-a:{key}", "counted-b:{key}"]


@semaphore(PAIR, limit=LIMIT, wait=0)
def counted_pair(key: str, ran: list[dict[str, Any]]) -> None:
    ran.append({"start": time.time()})


def test_a_retry_waits_out_its_runs_permits_of_several_resources(
    lock_table: str,
    succeeded: set[str],  # noqa: F811
) -> None:
    """Every permit of both resources is taken, one of each by the run: the retry waits for
    those and takes them once given back, as a retry of one permit resource does (39b). A
    take of several permit resources (all_or_none) never waited out its run's holds: the
    retry was refused at once (``wait=0``), SemaphoreBusy, by its own run."""
    resources = [r.format(key="k") for r in PAIR]
    ran: list[dict[str, Any]] = []
    with contextlib.ExitStack() as others:
        for _ in range(LIMIT - 1):
            others.enter_context(held_elsewhere(resources, limit=LIMIT))
        with held_elsewhere(resources, limit=LIMIT) as run:
            succeeded.add(run.token)
            thread = in_thread(lambda: counted_pair("k", ran))
            time.sleep(1.0)
            assert not ran, "the retry ran beside its run, past the limit"
            released = time.time()
        thread.join(30)
        assert not thread.errors, thread.errors  # type: ignore[attr-defined]
        assert len(ran) == 1 and ran[0]["start"] >= released
