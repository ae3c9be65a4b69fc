"""Unique Celery tasks (dynasem.celery.UniqueTask) in Celery's eager mode
(``task_always_eager``), where users' own test suites run them: the body runs as on a worker,
holding its key as ``current_hold()`` under the task's id, and a ``semaphore()`` of the same
key inside re-enters it; a retry runs under the key too; the key is free after the run,
returned or raised. The same tasks on a real broker: tests/background/test_unique_celery.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import current_hold, semaphore
from dynasem._operators.locks import holds_on

celery = pytest.importorskip("celery", reason="celery is in the test dependency group")

pytestmark = pytest.mark.reentry  # dynasem's own rule: a nested acquire re-enters its hold

app = celery.Celery("dynasem-unique-eager", broker="memory://")
app.conf.task_always_eager = True
app.conf.task_eager_propagates = True
# Eager retries run at once, inside apply(); propagating would raise Celery's Retry to the
# caller instead (as in tests/background/test_tasks.py).
retry_app = celery.Celery("dynasem-unique-eager-retry", broker="memory://")
retry_app.conf.task_always_eager = True
retry_app.conf.task_eager_propagates = False


def live(resource: str) -> list[Any]:
    return [h for h in holds_on(resource) if h.expires_ms > time.time() * 1000]


def what_the_run_holds(task_id: str, key: str) -> dict[str, Any]:
    """The run's own view of its hold, and a re-entry of its key (wait=0: busy if not ours)."""
    held = current_hold()
    with semaphore(f"eager:{key}", wait=0) as inner:
        reentered = inner.token == held.token
    return {
        "resource": held.resource,
        "user_id": held.user_id,
        "task_id": task_id,
        "reentered": reentered,
        "stored": [h.user_id for h in live(f"eager:{key}")],
    }


from dynasem.celery import UniqueTask  # noqa: E402 - imports Celery, found above

runs: list[str] = []  # the ids of work's runs


@app.task(bind=True, base=UniqueTask, name="eager.work", unique_key="eager:{key}")
def work(self: Any, key: str) -> dict[str, Any]:
    runs.append(self.request.id)
    return what_the_run_holds(self.request.id, key)


@retry_app.task(bind=True, base=UniqueTask, name="eager.retried", unique_key="eager:{key}")
def retried(self: Any, key: str) -> dict[str, Any]:
    if self.request.retries == 0:
        what_the_run_holds(self.request.id, key)  # the first run holds it too
        raise self.retry(countdown=0)
    return {**what_the_run_holds(self.request.id, key), "retries": self.request.retries}


@app.task(bind=True, base=UniqueTask, name="eager.fails", unique_key="eager:{key}")
def fails(self: Any, key: str) -> None:
    what_the_run_holds(self.request.id, key)
    raise RuntimeError("the task's own failure")


def test_an_eager_run_holds_its_key_as_a_worker_run_does(lock_table: str) -> None:
    result = work.delay("a")
    assert result.enqueued is True  # run, in eager mode
    seen = result.get()
    assert seen["resource"] == "eager:a"
    assert seen["user_id"] == f"task:{result.id}"  # the task's hold, not a hold of its own
    assert seen["reentered"] is True  # a semaphore() of its key re-enters it
    assert seen["stored"] == [f"task:{result.id}"]  # one hold on the key: the run's
    assert live("eager:a") == []  # given back at the end of the run
    assert work.delay("a").get()["reentered"] is True  # free again


def test_an_eager_retry_runs_under_the_key_and_gives_it_back(lock_table: str) -> None:
    seen = retried.delay("r").get()
    assert seen["retries"] == 1
    assert seen["reentered"] is True
    assert seen["user_id"] == f"task:{seen['task_id']}"
    assert live("eager:r") == []


def test_an_eager_run_that_raises_gives_its_key_back(lock_table: str) -> None:
    with pytest.raises(RuntimeError, match="the task's own failure"):
        fails.delay("x")
    assert live("eager:x") == []


def test_an_eager_enqueue_of_a_held_key_runs_nothing(lock_table: str) -> None:
    with semaphore("eager:b", user="someone-else"):
        before = len(runs)
        result = work.delay("b")
        assert result.enqueued is False
        assert len(runs) == before  # not run
        assert result.id not in runs  # the handle of an id never enqueued
        assert [h.user_id for h in live("eager:b")] == ["someone-else"]  # nothing claimed
    assert live("eager:b") == []
