"""Coalesced re-runs (dynasem/_engine/coalescing.py): one run going, one next; every further busy
caller returns at once because the next run starts after it arrived."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest
from django.test import RequestFactory, override_settings

from dynasem import Coalesced, SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows, next_runs, records
from dynasem.testing import held_elsewhere
from tests.engine.test_races import SPAWN
from tests.support.helpers import RequestCounter, dynasem_settings, wait_for


def registered(resource: str) -> dict[str, Any] | None:
    return lock_rows.get_item(resource, records.NEXT_SK)


def wait_until(check: Any, timeout: float = 10) -> Any:
    return wait_for(check, timeout, "never happened")


def register_by_hand(resource: str, after_fence: int, lease_ms: int) -> None:
    """A next run registered with nobody behind it (no heartbeat, no requests meanwhile)."""
    now = int(time.time() * 1000)
    assert (
        next_runs.register_next(
            resource,
            token="by-hand",
            user_id="next",
            after_fence=after_fence,
            until_ms=now + lease_ms,
            stale_ms=now,
        )
        is None
    )


class NextRun(threading.Thread):
    """A busy caller in a thread of its own: it becomes the next run, waits and runs."""

    def __init__(self, resource: str, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.resource, self.kwargs = resource, kwargs
        self.ran_at: float | None = None
        self.fence: int | None = None
        self.error: BaseException | None = None
        self.go_on = threading.Event()

    def run(self) -> None:
        try:
            with semaphore(self.resource, coalesce=True, **self.kwargs) as held:
                self.ran_at, self.fence = time.monotonic(), held.fence
                self.go_on.wait(10)
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            self.error = exc


def test_a_free_lock_is_taken_at_once_and_nothing_is_registered(
    lock_table: str, requests_sent: RequestCounter
) -> None:
    with semaphore("rebuild:1", coalesce=True, wait=5):
        pass
    assert requests_sent.total == 2 and registered("rebuild:1") is None


def test_one_next_run_and_every_further_busy_caller_coalesced(lock_table: str) -> None:
    with held_elsewhere("rebuild:2") as running:
        nxt = NextRun("rebuild:2", wait=30, user="next")
        nxt.start()
        wait_until(lambda: registered("rebuild:2"))
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(Coalesced) as caught:
                with semaphore("rebuild:2", coalesce=True, wait=30):
                    pytest.fail("a coalesced call must not run")
            assert time.monotonic() - started < 1.0  # at once, not after a wait
            assert caught.value.next_user_id == "next"
            assert "a run that starts after this call is queued" in str(caught.value)
        assert nxt.ran_at is None
    # The running one gave back: the next run goes.
    wait_until(lambda: nxt.ran_at)
    assert nxt.fence is not None and nxt.fence > running.fence
    # Now that it runs, a busy caller is not covered by it: it becomes the next run itself.
    after = NextRun("rebuild:2", wait=30, user="after")
    after.start()
    wait_until(lambda: (registered("rebuild:2") or {}).get("u") == "after")
    nxt.go_on.set()
    nxt.join(10)
    wait_until(lambda: after.ran_at)
    after.go_on.set()
    after.join(10)
    assert nxt.error is None and after.error is None


def test_a_next_run_whose_wait_runs_out_withdraws_and_raises_busy(lock_table: str) -> None:
    with held_elsewhere("rebuild:3"):
        with pytest.raises(SemaphoreBusy) as caught:
            with semaphore("rebuild:3", coalesce=True, wait=0.5):
                pass
        assert not isinstance(caught.value, Coalesced)
        assert registered("rebuild:3") is None
        # So the next busy caller becomes the next run (here: gives up too).
        with pytest.raises(SemaphoreBusy) as again:
            with semaphore("rebuild:3", coalesce=True, wait=0.2):
                pass
        assert not isinstance(again.value, Coalesced)


@pytest.mark.parametrize("end", ["loop ends", "cancelled"])
def test_an_async_registration_cut_off_by_the_loop_ending_is_withdrawn(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """``asyncio.run`` returns while a busy async caller registers as the next run: it cancels
    every task left, the registration's own among them. The registration goes on in its
    thread and lands; it is withdrawn once it has, not left renewed by its heartbeat, with
    nobody to run, coalescing every busy caller after it for as long as the process lives
    (as it is when the caller alone is cancelled)."""
    register_next, landed = next_runs.register_next, threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        try:
            return register_next(*args, **kwargs)
        finally:
            landed.set()

    monkeypatch.setattr(next_runs, "register_next", slow)

    async def next_run() -> None:
        async with semaphore("rebuild:loop-ended", coalesce=True, wait=30, lease=2):
            pytest.fail("the block must not run")

    async def main() -> None:
        task = asyncio.create_task(next_run())
        await asyncio.sleep(0.3)  # registering: the loop ends meanwhile, or it is cancelled
        if end == "cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while not landed.is_set():  # the loop runs on meanwhile, as a server's does
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)

    with held_elsewhere("rebuild:loop-ended"):
        asyncio.run(main())
        assert landed.wait(5)
        wait_until(lambda: registered("rebuild:loop-ended") is None, timeout=5)


def test_a_dead_next_runs_registration_is_replaced_after_its_lease(lock_table: str) -> None:
    """A registration nobody renews (its caller died) stops counting after its lease and
    CLOCK_SKEW (0.5 s here): the first busy caller after that is the next run."""
    with held_elsewhere("rebuild:4") as running:
        register_by_hand("rebuild:4", running.fence, lease_ms=300)
        with pytest.raises(Coalesced):
            with semaphore("rebuild:4", coalesce=True, wait=30):
                pass
        time.sleep(0.9)  # 0.3 s lease + 0.5 s CLOCK_SKEW passed
        nxt = NextRun("rebuild:4", wait=30, user="replacement")
        nxt.start()
        wait_until(lambda: (registered("rebuild:4") or {}).get("u") == "replacement")
    wait_until(lambda: nxt.ran_at)
    nxt.go_on.set()
    nxt.join(10)


def _be_the_next_run(endpoint: str, table_name: str, resource: str, out: Any) -> None:
    from tests.support.workers import setup_django

    setup_django(endpoint, table_name)
    with semaphore(resource, coalesce=True, wait=60, lease=2, user="doomed"):
        out.put("ran")


def test_a_next_runner_killed_while_waiting_is_replaced(
    lock_table: str, dynamodb_local: str
) -> None:
    """A real process registered as the next run is killed (SIGKILL, no goodbye): until its
    lease (2 s) is over, busy callers are coalesced; then the first is the next run."""
    out = SPAWN.Queue()
    with held_elsewhere("rebuild:5"):
        proc = SPAWN.Process(
            target=_be_the_next_run, args=(dynamodb_local, lock_table, "rebuild:5", out)
        )
        proc.start()
        try:
            wait_until(lambda: (registered("rebuild:5") or {}).get("u") == "doomed", 30)
            time.sleep(2.5)  # renewed meanwhile: still the next run
            with pytest.raises(Coalesced):
                with semaphore("rebuild:5", coalesce=True, wait=30):
                    pass
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        killed_at = time.monotonic()
        nxt = NextRun("rebuild:5", wait=30, user="replacement")
        while True:  # coalesced until the dead one's lease is over, then registered
            try:
                with semaphore("rebuild:5", coalesce=True, wait=0.01):
                    pytest.fail("busy all along")
            except Coalesced:
                assert time.monotonic() - killed_at < 2 + 0.5 + 1.0
                time.sleep(0.1)
            except SemaphoreBusy:  # was the next run, gave up at once, withdrew
                break
        nxt.start()
        wait_until(lambda: (registered("rebuild:5") or {}).get("u") == "replacement")
    wait_until(lambda: nxt.ran_at)
    nxt.go_on.set()
    nxt.join(10)
    assert out.empty()  # the killed one never ran


def test_a_coalesced_caller_costs_three_requests(
    lock_table: str, requests_sent: RequestCounter
) -> None:
    """The refused take, the fence read, the refused registration: nothing else."""
    with held_elsewhere("rebuild:10") as running:
        register_by_hand("rebuild:10", running.fence, lease_ms=60_000)
        requests_sent.reset()
        with pytest.raises(Coalesced):
            with semaphore("rebuild:10", coalesce=True, wait=30):
                pass
        assert requests_sent.calls == {"UpdateItem": 1, "GetItem": 1, "PutItem": 1}


def test_a_coalescing_view_answers_202_and_a_function_raises_coalesced(lock_table: str) -> None:
    @semaphore("rebuild:{n}", coalesce=True, wait=30)
    def view(request: Any, n: int) -> Any:
        pytest.fail("must not run")

    @semaphore("rebuild:{n}", coalesce=True, wait=30)
    def task(n: int) -> None:
        pytest.fail("must not run")

    with held_elsewhere("rebuild:6"):
        nxt = NextRun("rebuild:6", wait=30)
        nxt.start()
        wait_until(lambda: registered("rebuild:6"))
        response = view(RequestFactory().post("/rebuild/6/"), n=6)
        assert response.status_code == 202
        assert b"a run that starts after this request is queued" in response.content
        with pytest.raises(Coalesced):
            task(6)
    wait_until(lambda: nxt.ran_at)
    nxt.go_on.set()
    nxt.join(10)


def test_async_callers_coalesce_too(lock_table: str) -> None:
    async def main() -> tuple[str, float]:
        running = semaphore("rebuild:7")
        held = await running.aacquire()
        try:
            ran: list[float] = []

            async def next_run() -> None:
                async with semaphore("rebuild:7", coalesce=True, wait=30):
                    ran.append(time.monotonic())

            nxt = asyncio.create_task(next_run())
            while registered("rebuild:7") is None:
                await asyncio.sleep(0.02)
            try:
                async with semaphore("rebuild:7", coalesce=True, wait=30):
                    pass
            except Coalesced as exc:
                outcome = type(exc).__name__
        finally:
            await held.arelease()
        await nxt
        return outcome, ran[0]

    outcome, _ = asyncio.run(main())
    assert outcome == "Coalesced"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"limit": 2}, ValueError, "coalesce=True needs an exclusive semaphore"),
        ({"shared": True}, ValueError, "coalesce=True needs an exclusive semaphore"),
        ({"wait": 0}, ValueError, "needs a wait above 0"),
        ({"coalesce": "yes"}, TypeError, "coalesce must be True or False"),
    ],
)
def test_what_cannot_coalesce_is_refused_at_once(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        semaphore("x", **{"coalesce": True, **kwargs})
    with pytest.raises(ValueError, match="takes one resource"):
        semaphore(["a", "b"], coalesce=True, wait=1)


def test_a_wait_of_zero_from_the_setting_is_refused_before_any_request(
    lock_table: str, requests_sent: RequestCounter
) -> None:
    """wait=None reads DYNASEM['WAIT'] (0 in these tests) at acquire: free or busy, with,
    async with or acquire(), the call is refused before a request is sent, not let in while
    the lock is free and refused only once it is busy (its first busy caller in production)."""

    async def async_with() -> None:
        async with semaphore("rebuild:8", coalesce=True):
            pytest.fail("must not run")

    def refused(attempt: Any) -> None:
        requests_sent.reset()
        with pytest.raises(ValueError, match="needs a wait above 0"):
            attempt()
        assert requests_sent.calls == {}

    for busy in (False, True):
        with held_elsewhere("rebuild:8") if busy else contextlib.nullcontext():
            refused(lambda: semaphore("rebuild:8", coalesce=True).__enter__())
            refused(lambda: semaphore("rebuild:8", coalesce=True).acquire())
            refused(lambda: asyncio.run(async_with()))
    assert registered("rebuild:8") is None
    assert holds_on("rebuild:8") == []


def test_a_decorator_reads_the_wait_setting_at_each_call(
    lock_table: str, dynamodb_local: str, requests_sent: RequestCounter
) -> None:
    """A decorator is made at import, maybe before the settings are final: it is not refused
    then, nor let in later by the WAIT it was made under; each call reads the setting."""
    waits = dynasem_settings(dynamodb_local, lock_table, WAIT=30)
    ran: list[int] = []
    with override_settings(DYNASEM=waits):

        @semaphore("rebuild:{n}", coalesce=True)
        def made_under_30(n: int) -> None:
            ran.append(n)

        @semaphore("rebuild:{n}", coalesce=True)
        async def async_made_under_30(n: int) -> None:
            ran.append(n)

    @semaphore("rebuild:{n}", coalesce=True)  # made under WAIT 0: no error yet
    def made_under_0(n: int) -> None:
        ran.append(n)

    requests_sent.reset()
    for call in (lambda: made_under_30(1), lambda: asyncio.run(async_made_under_30(2))):
        with pytest.raises(ValueError, match=r"DYNASEM\['WAIT'\] = 0 with wait=None"):
            call()
    assert requests_sent.calls == {} and ran == []
    with override_settings(DYNASEM=waits):
        made_under_30(1)
        asyncio.run(async_made_under_30(2))
        made_under_0(3)
    assert ran == [1, 2, 3]


def test_the_registration_is_a_small_item_in_no_index(lock_table: str, dynamodb_local: str) -> None:
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table)):
        with held_elsewhere("rebuild:9"):
            nxt = NextRun("rebuild:9", wait=30)
            nxt.start()
            item = wait_until(lambda: registered("rebuild:9"))
            assert "userId" not in item and "shard" not in item
            assert set(item) == {"pk", "sk", "k", "u", "af", "un", "expires"}
        wait_until(lambda: nxt.ran_at)
        nxt.go_on.set()
        nxt.join(10)


def test_a_coalesced_task_is_not_retried_it_is_covered() -> None:
    """retry_later (Celery's and django.tasks') lets a coalesced task end (None): the next
    run covers it; retrying would run it again for nothing."""
    from dynasem.celery import retry_later as celery_retry_later
    from dynasem.django_tasks import retry_later as tasks_retry_later

    coalesced = Coalesced("rebuild:1", 2, "alice", "bob")
    assert celery_retry_later(coalesced, None) is None
    assert tasks_retry_later(coalesced) is None


def test_a_next_run_told_it_was_replaced_withdraws_without_a_request(
    lock_table: str, requests_sent: RequestCounter
) -> None:
    """A next run whose renewal was refused (another caller replaced it) gives up without
    sending the withdrawal: conditional on its token, now another's for good, it could only
    be refused (found by the simulator's coalesce mix, seed 4 of ``pauses``)."""
    from dynasem._engine.coalescing import Registration
    from dynasem.exceptions import LockLost

    now = int(time.time() * 1000)
    mine = {"user_id": "me", "after_fence": 1, "until_ms": now + 60_000, "stale_ms": now}
    assert next_runs.register_next("rebuild:11", token="mine", **mine) is None
    registration = Registration("rebuild:11", "mine", 60.0, 0.5, time.monotonic(), None)
    try:
        register_by_hand("rebuild:11", after_fence=2, lease_ms=60_000)  # the fence moved on
        with pytest.raises(LockLost):
            registration.renew()
        requests_sent.reset()
        registration.withdraw()
        assert requests_sent.calls == {}
        assert (registered("rebuild:11") or {}).get("k") == "by-hand"
    finally:
        registration.stop()


def test_a_next_run_that_found_the_row_reaped_coalesces_nobody_during_its_run(
    lock_table: str, dynamodb_local: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy caller whose fence read finds the row gone (released and reaped between its
    refused take and its read) used to register with a fence from its own clock: above
    every fence before, but also above those a host whose clock is behind (within
    CLOCK_SKEW) hands out for a while after, here its own run's, handed over by such a
    holder. A caller arriving while that run went then read a fence below the registration's
    and was answered Coalesced by a run that had already begun: its change covered by no
    run. Now such a caller waits unregistered, and the caller during its run registers."""
    from dynasem._engine import coalescing

    offsets: dict[int, float] = {}  # threads' clocks: the next run's 0.9 s ahead, ours behind
    real = time.time
    monkeypatch.setattr(
        "dynasem._clock.wall_clock", lambda: real() + offsets.get(threading.get_ident(), 0.0)
    )
    read, reaped, got, remade = (threading.Event() for _ in range(4))
    get = lock_rows.get

    def get_after_a_reap(resource: str, **kwargs: Any) -> Any:
        if offsets.get(threading.get_ident()) != 0.9 or reaped.is_set():
            return get(resource, **kwargs)
        read.set()  # between the refused take and the fence read: released and reaped
        reaped.wait(10)
        row = get(resource, **kwargs)
        got.set()
        remade.wait(10)  # and made anew before its wait begins
        return row

    class Ahead(NextRun):
        def run(self) -> None:
            offsets[threading.get_ident()] = 0.9
            super().run()

    monkeypatch.setattr(coalescing.lock_rows, "get", get_after_a_reap)
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, CLOCK_SKEW=2.0)):
        first = semaphore("rebuild:12").acquire()
        nxt = Ahead("rebuild:12", wait=30)
        nxt.start()
        assert read.wait(10)
        first.release()
        past = int(real() * 1000) + 60_000 + records.BUCKET_S * 1000  # lease and bucket
        assert lock_rows.delete_expired("rebuild:12", past)  # reaped
        reaped.set()
        assert got.wait(10)
        offsets[threading.get_ident()] = -0.9
        behind = semaphore("rebuild:12").acquire()  # the row made anew by a clock behind
        remade.set()
        wait_until(lambda: (get("rebuild:12") or records.LockItem()).queue_in > 0)
        behind.release()  # handed over to the next run, under a fence from our clock
        del offsets[threading.get_ident()]
        wait_until(lambda: nxt.ran_at)
        try:
            # Arrived while that run goes: not coalesced by it (it registers, and gives up).
            with pytest.raises(SemaphoreBusy) as caught:
                with semaphore("rebuild:12", coalesce=True, wait=0.3):
                    pass
            assert not isinstance(caught.value, Coalesced)
        finally:
            nxt.go_on.set()
            nxt.join(10)
    assert nxt.error is None
