"""Bodies of the OS processes the race tests start (spawned, so each is a fresh interpreter
with its own boto3 client, as separate web workers would be)."""

from __future__ import annotations

import os
import time
from typing import Any


def setup_django(endpoint: str, table_name: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
    os.environ["DYNASEM_TEST_ENDPOINT"] = endpoint
    os.environ["DYNASEM_TEST_TABLE"] = table_name
    for key, value in (("AWS_ACCESS_KEY_ID", "dummy"), ("AWS_SECRET_ACCESS_KEY", "dummy")):
        os.environ.setdefault(key, value)
    import django

    django.setup()
    if os.environ.get("DYNASEM_TEST_PERMITS_FROM"):  # see conftest.PERMITS_ENV
        from dynasem._storage import permit_items

        permit_items.INLINE_MAX = int(os.environ["DYNASEM_TEST_PERMITS_FROM"])
    if os.environ.get("DYNASEM_TEST_READERS_FROM"):  # see conftest.READERS_ENV
        readers_from(os.environ["DYNASEM_TEST_READERS_FROM"])


def readers_from(value: str) -> None:
    """Shared resources keep ``value`` readers in their row, the next in reader items."""
    from dynasem._storage import lock_writes as writes
    from dynasem._storage import reader_items

    writes.READERS_INLINE = reader_items.READERS_INLINE = int(value)


def rerun_failed_job(endpoint: str, table_name: str, key: str, barrier: Any, out: Any) -> None:
    """The seed scenario: re-process a FAILED job; report whether this process ran it."""
    setup_django(endpoint, table_name)
    from dynasem import AlreadyDone, SemaphoreBusy, run_once

    barrier.wait()
    try:
        with run_once(key, user=f"worker-{os.getpid()}") as job:
            out.put(("ran", os.getpid(), job.attempt))
            time.sleep(1.0)  # the work: long enough that every other process tries meanwhile
    except SemaphoreBusy:
        out.put(("busy", os.getpid(), None))
    except AlreadyDone:
        out.put(("done", os.getpid(), None))


def count_under_lock(
    endpoint: str,
    table_name: str,
    resource: str,
    counter: str,
    rounds: int,
    barrier: Any,
    out: Any,
) -> None:
    """Increment a number in a shared file while holding the lock; report hold intervals."""
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    intervals = []
    fences = []
    barrier.wait()
    for _ in range(rounds):
        with semaphore(resource, wait=120) as held:
            start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on a host
            with open(counter, "r+") as f:
                value = int(f.read() or 0)
                f.seek(0)
                f.write(str(value + 1))
                f.truncate()
            fences.append(held.fence)
            intervals.append((start, time.monotonic()))
    out.put((os.getpid(), intervals, fences))


def hold_with_limit(
    endpoint: str,
    table_name: str,
    resource: str,
    limit: int,
    rounds: int,
    hold: float,
    barrier: Any,
    out: Any,
) -> None:
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    intervals = []
    barrier.wait()
    for _ in range(rounds):
        with semaphore(resource, limit=limit, wait=120):
            start = time.monotonic()
            time.sleep(hold)
            intervals.append((start, time.monotonic()))
    out.put((os.getpid(), intervals))


def hold_until_killed(endpoint: str, table_name: str, resource: str, lease: float, out: Any):
    """Take the lock, say so, then work 'forever' (the test SIGKILLs us)."""
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    held = semaphore(resource, lease=lease, user="doomed").acquire()
    out.put(("held", held.fence))
    time.sleep(600)


def hold_then_pause(
    endpoint: str, table_name: str, resource: str, lease: float, out: Any, go_on: Any
):
    """Take the lock, get paused (SIGSTOP) past the lease by the test, then try to write
    fenced and to leave the block: both must tell us the hold is gone."""
    setup_django(endpoint, table_name)
    from dynasem import LockLost, semaphore
    from tests.support.fencing import FencedWriteRefused, fenced_put

    try:
        with semaphore(resource, lease=lease, user="sleepy") as held:
            out.put(("held", held.fence))
            go_on.wait(60)  # we are stopped and resumed somewhere around here
            try:
                fenced_put("document", "stale body", held.fence)
                out.put(("fenced-write", "accepted"))
            except FencedWriteRefused:
                out.put(("fenced-write", "refused"))
    except LockLost as exc:
        out.put(("exit", f"LockLost: {exc.reason}"))
    else:
        out.put(("exit", "no error"))


def wait_in_line(
    endpoint: str, table_name: str, resource: str, name: str, lease: float, out: Any
) -> None:
    """Queue for the resource (fair) and report when served."""
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    with semaphore(resource, fair=True, wait=60, lease=lease, user=name):
        out.put((name, time.monotonic()))
        time.sleep(0.05)


def reader_writer(
    endpoint: str,
    table_name: str,
    resource: str,
    role: str,
    seconds: float,
    barrier: Any,
    out: Any,
) -> None:
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    intervals = []
    barrier.wait()
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        t0 = time.monotonic()
        with semaphore(resource, shared=(role == "reader"), wait=60):
            start = time.monotonic()
            time.sleep(0.03 if role == "reader" else 0.02)
            intervals.append((start, time.monotonic(), start - t0))
        if role == "writer":
            time.sleep(0.05)
    out.put((role, os.getpid(), intervals))


def take_pair(
    endpoint: str, table_name: str, pair: list[str], rounds: int, barrier: Any, out: Any
) -> None:
    """Take both resources atomically, in the given order, again and again."""
    setup_django(endpoint, table_name)
    from dynasem import LockLost, semaphore

    intervals = []
    lost = 0
    barrier.wait()
    for _ in range(rounds):
        try:
            with semaphore(pair, wait=60) as held:
                start = time.monotonic()
                time.sleep(0.005)
                # The window it was trusted in (to its deadline), not only the block.
                intervals.append((start, min(time.monotonic(), start + held.seconds_left())))
        except LockLost:
            lost += 1  # said, never silent: counted (the unkind engine may cause it)
    out.put((pair, intervals, lost))


def stall_through_hand_over(
    endpoint: str,
    table_name: str,
    resource: str,
    lease: float,
    push: str | None,
    stop_on_own_hold: bool,
    stopped: Any,
    out: Any,
) -> None:
    """Queue (fair) for the resource and report when our block starts and ends.

    ``stop_on_own_hold``: SIGSTOP ourselves the first time the acquire loop is about to plan
    from an item that shows us holding (whatever brought it: a read, a refused write, a push),
    after setting ``stopped``; the test resumes us. Otherwise the test stops us from outside."""
    import signal

    setup_django(endpoint, table_name)
    from django.test import override_settings

    from dynasem import semaphore
    from dynasem._engine import take as planning
    from dynasem.conf import settings

    if stop_on_own_hold:
        plan = planning.plan
        done = []

        def stalling_plan(self: Any, resource: str, seen: Any, *args: Any, **kwargs: Any) -> Any:
            holders = seen.holders if seen is not None else {}
            if not done and any(h.user_id == "W" for h in holders.values()):
                done.append(True)
                stopped.set()
                os.kill(os.getpid(), signal.SIGSTOP)  # a GC pause, a stalled VM, swapping
            return plan(self, resource, seen, *args, **kwargs)

        planning.plan = stalling_plan

    with override_settings(DYNASEM=dict(settings.raw, PUSH=push)):
        with semaphore(resource, fair=True, wait=120, lease=lease, user="W") as held:
            entered = time.monotonic()
            time.sleep(0.05)
            out.put(("block", entered, time.monotonic(), held.fence))


def take_and_report(
    endpoint: str,
    table_name: str,
    resource: str,
    wait: float,
    push: str | None,
    out: Any,
) -> None:
    """Queue for the resource (fair, so that we wait in its queue) for up to ``wait`` seconds
    and report when we held it, with what fence, or that we gave up."""
    setup_django(endpoint, table_name)
    from django.test import override_settings

    from dynasem import SemaphoreBusy, semaphore
    from dynasem.conf import settings

    with override_settings(DYNASEM=dict(settings.raw, PUSH=push)):
        try:
            with semaphore(resource, fair=True, wait=wait, user="heir") as held:
                out.put(("held", time.monotonic(), held.fence, held.token))
        except SemaphoreBusy:
            out.put(("busy", time.monotonic(), None, None))


def hold_and_exit(endpoint: str, table_name: str, resource: str, how: str, out: Any) -> None:
    """Take the lock with a long lease and never release it; then end this process ``how``:

    ``exit``: ``sys.exit(0)``, a normal exit (atexit runs); ``sigterm-handler``: SIGTERM caught
    by a handler of the application's, after which its loop ends with ``sys.exit`` (what a
    gunicorn worker does); ``daemon-thread``: the hold was taken by a daemon thread still inside its
    block at exit; ``forked-child``: a child forked while we hold leaves the block (it releases
    its copy of the hold) and exits normally (it must not give back our hold), then we report
    and release it ourselves."""
    import signal
    import sys
    import threading

    setup_django(endpoint, table_name)
    from dynasem import semaphore
    from dynasem._storage import lock_rows, records

    stop: list[int] = []
    if how == "sigterm-handler":
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if how == "daemon-thread":
        taken = threading.Event()

        def work() -> None:
            with semaphore(resource, lease=60, user="leaver") as held:
                out.put(("held", held.fence))
                taken.set()
                time.sleep(600)  # still inside the block when the process exits

        threading.Thread(target=work, daemon=True).start()
        taken.wait(60)
        sys.exit(0)
    held = semaphore(resource, lease=60, user="leaver").acquire()
    out.put(("held", held.fence))
    if how == "forked-child":
        import atexit

        child = os.fork()
        if child == 0:
            held.release()  # what leaving a block forked in does (sys.exit, a return)
            atexit._run_exitfuncs()  # what a normal exit runs, then nothing else of the parent's
            os._exit(0)
        os.waitpid(child, 0)
        holders = list((lock_rows.get(resource) or records.LockItem()).holders)
        out.put(("after-child", holders == [held.token]))
        held.release()
        return
    if how == "sigterm-handler":
        while not stop:  # serving, until SIGTERM tells the loop to end
            time.sleep(0.02)
    sys.exit(0)


def reader_stalled_between_writes(
    endpoint: str, table_name: str, resource: str, lease: float, out: Any, go_on: Any
) -> None:
    """A reader admitted to a reader item that stops between its two writes (the row's, then
    its item's): it says so and waits there; the test kills or stops it. Resumed, it goes on
    and reports when it entered its block."""
    setup_django(endpoint, table_name)
    from dynasem import semaphore
    from dynasem._storage import reader_items as items

    real = items.put_reader

    def stalled(*args: Any, **kwargs: Any) -> Any:
        if not go_on.is_set():
            out.put(("admitted", args[2].fence))
            go_on.wait(120)
        return real(*args, **kwargs)

    items.put_reader = stalled
    with semaphore(resource, shared=True, lease=lease, wait=60, user="stalled") as held:
        out.put(("entered", held.fence, time.time()))


def read_until_killed(
    endpoint: str, table_name: str, resource: str, lease: float, out: Any
) -> None:
    """Take a shared hold, say so, then read 'forever' (the test SIGKILLs us)."""
    setup_django(endpoint, table_name)
    from dynasem import semaphore

    held = semaphore(resource, shared=True, lease=lease, user="doomed").acquire()
    out.put(("held", held.fence))
    time.sleep(600)


def give_up_waiting(
    endpoint: str,
    table_name: str,
    resource: str,
    wait: float,
    lease: float,
    linger: float,
    out: Any,
    how: str = "wait",
) -> None:
    """Queue for the resource (fair, pushes off) and give up after ``wait`` seconds (``how``:
    "wait", its wait runs out; "cancel", an asyncio task cancelled); report how it ended,
    then live on for ``linger`` seconds (a web worker that answered 423 goes on serving: its
    process is alive, so its holds are not taken for a dead process's)."""
    setup_django(endpoint, table_name)
    import asyncio

    from django.conf import settings
    from django.test import override_settings

    from dynasem import SemaphoreBusy, semaphore

    async def cancelled() -> str:
        sem = semaphore(resource, fair=True, wait=wait + 60, lease=lease, user="leaver")
        task = asyncio.ensure_future(sem.aacquire())
        await asyncio.sleep(wait)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "busy"
        return "acquired"

    with override_settings(DYNASEM={**settings.DYNASEM, "PUSH": None}):
        try:
            if how == "cancel":
                out.put((asyncio.run(cancelled()), time.monotonic()))
            else:
                semaphore(resource, fair=True, wait=wait, lease=lease, user="leaver").acquire()
                out.put(("acquired", time.monotonic()))
        except SemaphoreBusy:
            out.put(("busy", time.monotonic()))
        except BaseException as exc:  # reported to the test, which says what it was
            out.put((repr(exc), time.monotonic()))
        time.sleep(linger)


def hold_in_a_child_forked_without_hooks(
    endpoint: str, table_name: str, resource: str, lease: float, warm: str
) -> None:
    """A uWSGI master and one of its workers. This process (the master) used dynasem before
    it forks: its identity probed, and with ``warm`` ("sync" or "async") a hold taken and
    given back that way (its heartbeat's thread started, its client made; "async": its
    executor's threads too). Then C code forks a child and runs none of Python's at-fork
    hooks, as uWSGI does unless ``py-call-osafterfork``. The child takes ``resource`` (as
    ``warm`` says; at once otherwise) and holds it for 20 s; the master prints the child's
    pid and token, and whether the child's client was the master's, then exits at once (the
    child lives on, as a uWSGI worker does when its master is killed). A child that cannot
    take it within 15 s is ended (the master prints nothing)."""
    setup_django(endpoint, table_name)
    import asyncio
    import ctypes
    import json
    import signal
    import traceback

    from dynasem import semaphore
    from dynasem._engine import processes
    from dynasem._storage import dynamodb

    async def take_async() -> Any:
        return await semaphore(resource, lease=lease, wait=10, user="child").aacquire()

    async def warm_async() -> None:
        async with semaphore(f"{resource}:warm", lease=lease):
            pass

    processes.identity()
    if warm == "async":
        asyncio.run(warm_async())
        time.sleep(0.2)  # its threads are idle by the time a master forks its workers
    elif warm:
        with semaphore(f"{resource}:warm", lease=lease):
            pass
    if warm:
        dynamodb.get_client().dynasem_test_master = True  # type: ignore[attr-defined]
    read, write = os.pipe()
    pid = ctypes.PyDLL(None).fork()  # PyDLL: the GIL kept across the call, as in a C server
    if pid == 0:
        try:
            os.close(read)
            signal.alarm(15)  # a stuck child ends, and the master prints nothing
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # the test reads the master's output to its end
            if warm == "async":
                held = asyncio.run(take_async())
            else:
                held = semaphore(resource, lease=lease, wait=10, user="child").acquire()
            signal.alarm(20)
            ours = not getattr(dynamodb.get_client(), "dynasem_test_master", False)
            said = {"pid": os.getpid(), "token": held.token, "own_client": ours}
            os.write(write, json.dumps(said).encode())
            time.sleep(20)
        except BaseException:
            traceback.print_exc()  # the master then prints nothing: the test shows this
        finally:
            os._exit(0)
    os.close(write)
    print(os.read(read, 4096).decode(), flush=True)
    os._exit(0)


def hand_over_in_a_child_forked_without_hooks(
    endpoint: str, table_name: str, resource: str, held: str
) -> None:
    """A uWSGI master forks a worker (C code, none of Python's at-fork hooks run) while a
    thread of the master is inside ``dynasem._engine.push``'s module lock ``held`` (this
    process takes it: the thread that would give it back did not come along). The worker
    holds ``resource``, a thread of its own waits for it, and the hold is handed over to
    that waiter: the master prints "ok" if the waiter got it, "stuck" if the worker did not
    get that far within 15 s."""
    setup_django(endpoint, table_name)
    import ctypes
    import threading

    from dynasem import semaphore
    from dynasem._engine import push

    def hand_over(done: list[bool]) -> None:
        first = semaphore(resource, lease=10).acquire()
        got: list[bool] = []

        def wait() -> None:
            with semaphore(resource, lease=10, wait=8):
                got.append(True)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(0.5)  # queued behind the hold
        first.release()
        waiter.join(9)
        done.extend(got)

    getattr(push, held).acquire()
    read, write = os.pipe()
    pid = ctypes.PyDLL(None).fork()  # PyDLL: the GIL kept across the call, as in a C server
    if pid == 0:
        try:
            os.close(read)
            done: list[bool] = []
            worker = threading.Thread(target=hand_over, args=(done,), daemon=True)
            worker.start()
            worker.join(15)
            os.write(write, b"ok" if done == [True] else b"stuck")
        finally:
            os._exit(0)
    os.close(write)
    print(os.read(read, 4096).decode(), flush=True)
    os._exit(0)


def hold_and_fork_a_worker(
    endpoint: str, table_name: str, resource: str, lease: float, report: str, out: Any
) -> None:
    """Take ``resource`` and fork a child inside the block (``multiprocessing`` with fork, a
    pool of workers, ``os.fork``) that keeps the hold's copy. Say ("held", fence, child pid),
    then work "forever" (the test SIGKILLs us). The child, once we are gone, waits 1.5 s (a
    waiter of this host takes the lock meanwhile) and writes to the file ``report`` what
    its copy says: ``[lost, seconds_left]``."""
    setup_django(endpoint, table_name)
    import json

    from dynasem import semaphore

    held = semaphore(resource, lease=lease, user="forker").acquire()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            deadline = time.monotonic() + 30
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)
            with open(report + ".tmp", "w") as f:
                json.dump([held.lost, held.seconds_left()], f)
            os.rename(report + ".tmp", report)
        finally:
            os._exit(0)
    out.put(("held", held.fence, child))
    time.sleep(600)
