"""Unique django.tasks tasks (dynasem.django_tasks.unique_task).

In process, on Django's ImmediateBackend and DummyBackend: the key taken at enqueue, adopted
by the run and given back at its end (returned or raised), a refused enqueue returning None,
a retry keeping the key. Then with real workers: django-tasks-db's DatabaseBackend on a SQLite
file and two ``db_worker`` processes; 60 enqueues over 3 keys from another process; from the
enqueues and the workers' own log, never two tasks of one key queued or running at once,
every enqueued task run exactly once, no key held after; a worker SIGKILLed mid-task frees its
key within the run lease (2 s) and CLOCK_SKEW (0.5 s)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.test import override_settings

from dynasem._background.unique import Taken, claim, give_back
from dynasem._operators.locks import holds_on
from tests.support.events import read_events, wait_events

pytestmark = pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")

ROOT = Path(__file__).resolve().parents[2]
ENQUEUES, KEYS, WORKERS = 60, 3, 2
RUN_LEASE, SKEW = 2.0, 0.5


def live(resource: str) -> list[Any]:
    return [h for h in holds_on(resource) if h.expires_ms > time.time() * 1000]


def test_the_key_is_held_for_the_run_and_given_back(lock_table: str) -> None:
    from tests.support import unique_tasks

    result = unique_tasks.plain.enqueue("a")  # ImmediateBackend: runs now
    assert result.status == "SUCCESSFUL"
    assert result.return_value == "unique-plain:a"  # current_hold(): the task's own
    assert live("unique-plain:a") == []
    assert unique_tasks.plain.enqueue("a").status == "SUCCESSFUL"  # free again
    assert "dynasem_claim" in result.kwargs  # the claim travels with the task
    assert unique_tasks.aplain.enqueue("b").return_value == "b"
    assert live("unique-async:b") == []


def test_a_task_that_raises_gives_its_key_back(lock_table: str) -> None:
    from tests.support import unique_tasks

    assert unique_tasks.fails.enqueue("x").status == "FAILED"
    assert live("unique-fail:x") == []


def test_an_enqueue_while_queued_is_refused_until_the_task_ran(lock_table: str) -> None:
    from tests.support import unique_tasks

    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        task = unique_tasks.plain.using(backend="default")
        queued = task.enqueue("q")
        assert queued is not None
        assert task.enqueue("q") is None  # queued: refused, nothing enqueued
        assert task.enqueue("other") is not None  # another key
        (hold,) = live("unique-plain:q")
        assert hold.expires_ms > time.time() * 1000 + 25_000  # the queue lease
        # What a worker does with it: its run takes the key over and gives it back.
        assert task.call(*queued.args, **queued.kwargs) == "unique-plain:q"
        assert live("unique-plain:q") == []
        assert task.enqueue("q") is not None


def test_a_retry_from_its_own_run_keeps_the_key(lock_table: str) -> None:
    from tests.support import unique_tasks

    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        task = unique_tasks.retried
        first = task.enqueue("r", True)
        from django.tasks import TaskContext

        assert task.call(TaskContext(task_result=first), *first.args, **first.kwargs) == "retry"
        (hold,) = live("unique-retry:r")  # handed on to the retry, for its queue lease
        assert hold.expires_ms > time.time() * 1000 + 25_000
        assert task.enqueue("r", False) is None  # still the retry's
        retry = task.get_backend().results[-1]
        handed, claimed = retry.kwargs["dynasem_claim"], first.kwargs["dynasem_claim"]
        assert handed["token"] != claimed["token"]  # the retry's own claim ...
        assert {**handed, "token": ""} == {**claimed, "token": ""}  # ... of the same key
        assert task.call(TaskContext(task_result=first), *first.args, **first.kwargs) is None
        assert task.call(TaskContext(task_result=retry), *retry.args, **retry.kwargs) == "second"
        assert live("unique-retry:r") == []


def test_a_retry_run_at_once_inside_its_run_runs_under_its_key(lock_table: str) -> None:
    from tests.support import unique_tasks

    result = unique_tasks.retried.enqueue("inline", True)  # ImmediateBackend: runs now
    assert result.status == "SUCCESSFUL"
    assert result.return_value == "retry"  # the retry ran, inside, when enqueued
    assert live("unique-retry:inline") == []  # and the key went back at the outer end


@pytest.mark.parametrize("cut", ["aenqueue", "acall"])
def test_an_async_claim_or_adoption_cancelled_in_its_thread_gives_the_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """An async enqueue cancelled while its claim is on its way, or an async run cancelled
    while its adoption of the claim is: the write goes on in its thread and lands, and the
    key is given back once it has. It was kept for nobody: the claim for its queue lease,
    refusing every enqueue of the key with no task queued; the run's hold for as long as the
    worker lived, renewed by its heartbeat."""
    from dynasem._background import unique
    from tests.support import unique_tasks

    name = "claim_for" if cut == "aenqueue" else "start_run"
    write, landed = getattr(unique, name), threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        try:
            return write(*args, **kwargs)
        finally:
            landed.set()

    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        task = unique_tasks.aplain.using(backend="default")
        queued = task.enqueue("cut") if cut == "acall" else None
        monkeypatch.setattr(unique, name, slow)

        async def main() -> None:
            if queued is None:
                call = asyncio.create_task(task.aenqueue("cut"))
            else:
                call = asyncio.create_task(task.acall(*queued.args, **queued.kwargs))
            await asyncio.sleep(0.1)  # the write is on its way
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            while not landed.is_set():  # the loop runs on meanwhile, as a worker's does
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)

        asyncio.run(main())
    assert live("unique-async:cut") == []


def test_an_async_enqueue_cancelled_while_the_backend_stores_the_task_keeps_its_claim(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async enqueue cancelled while the backend stores the task (its ``enqueue`` in
    ``sync_to_async``'s thread, which goes on): the task is stored, so its claim stays, and
    the task runs. The claim was withdrawn at once: the task stored after it was refused
    when a worker started it (its key not its own any more), and never ran."""
    from django.tasks.backends.dummy import DummyBackend

    from tests.support import unique_tasks

    enqueue, stored = DummyBackend.enqueue, threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        try:
            return enqueue(*args, **kwargs)
        finally:
            stored.set()

    monkeypatch.setattr(DummyBackend, "enqueue", slow)
    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        task = unique_tasks.aplain.using(backend="default")

        async def main() -> None:
            call = asyncio.create_task(task.aenqueue("stored"))
            await asyncio.sleep(0.2)  # the backend is storing it
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            while not stored.is_set():  # the loop runs on meanwhile, as a server's does
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)

        asyncio.run(main())
        (queued,) = task.get_backend().results
        assert task.call(*queued.args, **queued.kwargs) == "stored"
    assert live("unique-async:stored") == []


def test_bad_definitions_are_refused_when_declared() -> None:
    from dynasem.django_tasks import unique_task
    from tests.support.unique_tasks import bare as work

    with pytest.raises(TypeError, match="unique_key"):
        unique_task(unique_key=None)(work)
    with pytest.raises(ValueError, match="queue_lease"):
        unique_task(unique_key="r:{project_id}", queue_lease=0)(work)
    with pytest.raises(TypeError, match="'nope', which is not a parameter"):
        unique_task(unique_key="r:{nope}")(work)


# --- real workers -----------------------------------------------------------------------

needs_tasks_db = pytest.mark.skipif(
    importlib.util.find_spec("django_tasks_db") is None,
    reason="django-tasks-db is in the dev dependency group (.venv), not in the matrix's",
)


def env_for(tmp_path: Path, events: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.tasks_db_settings",
        "DYNASEM_TEST_TASKS_DB": str(tmp_path / "tasks.sqlite3"),
        "DYNASEM_TEST_CELERY_LOG": str(events),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


@contextlib.contextmanager
def db_workers(tmp_path: Path, events: Path, own_pids: bool = False) -> Iterator[Any]:
    """``WORKERS`` ``db_worker`` processes on a migrated SQLite file; stopped with SIGTERM.
    ``own_pids``: each in a pid namespace of its own (tests/support/in_host.py's way), where no
    other process can know it dead: as if on another host, only its lease frees its key."""
    env = env_for(tmp_path, events)
    admin = [sys.executable, "-m", "django"]
    subprocess.run([*admin, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    logs = [tmp_path / f"db_worker{i}.log" for i in range(WORKERS)]
    alone = ["unshare", "--pid", "--fork", "--kill-child", "--"] if own_pids else []
    procs = [
        subprocess.Popen(
            [*alone, *admin, "db_worker", "--interval", "0.05", "--no-startup-delay", "-v", "2"],
            env=env,
            cwd=ROOT,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        for log in logs
    ]

    def tails() -> str:
        return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs)

    try:
        yield env, tails
    finally:
        for p in procs:
            if p.poll() is None:
                # unshare --fork ignores SIGTERM while it waits; --kill-child ends its worker.
                p.send_signal(signal.SIGKILL if own_pids else signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@needs_tasks_db
def test_sixty_enqueues_over_three_keys_on_two_db_workers(lock_table: str, tmp_path: Path) -> None:
    events_file = tmp_path / "events.jsonl"
    with db_workers(tmp_path, events_file) as (env, tails):
        out = subprocess.run(
            [sys.executable, "-m", "tests.support.unique_enqueue", str(ENQUEUES), str(KEYS), "25"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        sent = [json.loads(line) for line in out.stdout.splitlines()]
        enqueued = {e["id"]: e for e in sent if e["id"] is not None}
        refused = len(sent) - len(enqueued)
        wait_events(events_file, "unique-run", len(enqueued), timeout=60, tails=tails)
    runs = [e for e in read_events(events_file) if e["event"] == "unique-run"]
    pids = {e["pid"] for e in runs}
    print(f"\n{len(enqueued)} enqueued, {refused} refused, {len(runs)} ran in {len(pids)} workers")
    assert len(sent) == ENQUEUES and refused > 0
    assert sorted(e["task_id"] for e in runs) == sorted(enqueued), tails()  # each once
    assert len(pids) == WORKERS, tails()  # both workers ran tasks
    for key in {f"k{i}" for i in range(KEYS)}:
        assert any(e["key"] == key for e in runs)
        # From the enqueue's return (queued by then at the latest) to the end of its run (the
        # key is given back after it), and each run from its start to its end.
        spans = sorted(
            (enqueued[e["task_id"]]["queued"], e["end"]) for e in runs if e["key"] == key
        )
        ran = sorted((e["start"], e["end"]) for e in runs if e["key"] == key)
        for before, after in [
            *zip(spans, spans[1:], strict=False),
            *zip(ran, ran[1:], strict=False),
        ]:
            assert after[0] >= before[1], (
                f"{key}: two tasks queued or running at once: {before} {after}"
            )
        assert live(f"unique:{key}") == []  # the workers have stopped: nothing held


CAN_UNSHARE = os.geteuid() == 0 and shutil.which("unshare") is not None


@needs_tasks_db
@pytest.mark.parametrize(
    "where",
    [
        "same host",
        pytest.param(
            "another host",
            marks=pytest.mark.skipif(
                not CAN_UNSHARE, reason="a pid namespace of its own needs root and unshare"
            ),
        ),
    ],
)
def test_a_db_worker_killed_mid_task_frees_its_key_within_the_run_lease(
    lock_table: str, tmp_path: Path, where: str
) -> None:
    """On the same host the dead worker is known dead (its process is recorded with its
    hold): the next enqueue takes the key at once. From another host only its lease tells:
    the key is free within the run lease and CLOCK_SKEW."""
    events_file = tmp_path / "events.jsonl"
    with db_workers(tmp_path, events_file, own_pids=where == "another host") as (env, tails):
        script = (
            "import os,sys,json,time,django;"
            "os.environ['DJANGO_SETTINGS_MODULE']='tests.support.tasks_db_settings';django.setup();"
            "from tests.support.unique_tasks import unique_work as t;"
            "r=t.enqueue(sys.argv[1],int(sys.argv[2]),float(sys.argv[3]));"
            "print(json.dumps(None if r is None else str(r.id)))"
        )

        def enqueue(n: int, seconds: float) -> str | None:
            out = subprocess.run(
                [sys.executable, "-c", script, "kill", str(n), str(seconds)],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            return json.loads(out.stdout)  # type: ignore[no-any-return]

        first = enqueue(0, 30.0)
        assert first is not None
        (start,) = wait_events(events_file, "unique-start", tails=tails)
        assert enqueue(1, 0.1) is None  # running: not enqueued
        os.kill(start["host_pid"], signal.SIGKILL)  # the db_worker running it
        killed = time.time()
        # What an enqueue asks first, asked every 50 ms from here (an enqueue of the
        # enqueuing process's takes a Python start-up of its own). A probe refused was sent
        # while the key was held, or before: none sent past lease + skew may be refused.
        refused_at = killed
        while True:
            asked = time.time()
            try:
                probe = claim("unique:kill", "probe", queue_lease=30)
                break
            except Taken:
                refused_at = asked
                assert asked - killed < RUN_LEASE + SKEW, "still held past lease + skew"
                time.sleep(0.05)
        give_back(probe)
        freed_after = time.time() - killed
        print(
            f"\nthe killed task's key: last seen held {refused_at - killed:.2f} s after the kill, "
            f"taken again after {freed_after:.2f} s (bound {RUN_LEASE + SKEW} s)"
        )
        assert freed_after < RUN_LEASE + SKEW + 1  # the probes' own round trips and naps
        if where == "same host":
            assert freed_after < 1.0  # known dead: not a lease's wait
        else:
            assert refused_at - killed > 1.0  # unknown: held until its lease ran out
        again = enqueue(2, 0.1)
        assert again is not None
        wait_events(events_file, "unique-run", tails=tails)
        (run,) = [e for e in read_events(events_file) if e["event"] == "unique-run"]
        assert run["task_id"] == again
        # Its run gives the key back as it ends, a moment after it said it ran.
        deadline = time.monotonic() + 10
        while live("unique:kill") and time.monotonic() < deadline:
            time.sleep(0.05)
    assert live("unique:kill") == []
