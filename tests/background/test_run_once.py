"""run_once, the status guard: NEW/FAILED -> RUNNING -> DONE/FAILED, by conditional writes."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from django.core.management import call_command
from django.test import override_settings

from dynasem import AlreadyDone, LockLost, SemaphoreBusy, run_once, semaphore
from dynasem._storage import job_rows, job_writes, lock_rows, lock_writes, records
from dynasem.conf import settings


def job_row(key: str) -> dict:
    return lock_rows.get_item(key, records.JOB_SK)


def test_new_job_runs_once_and_is_done(lock_table):
    ran = []
    with run_once("file:a.txt", user="alice") as job:
        assert (job.key, job.status, job.attempt) == ("file:a.txt", "RUNNING", 1)
        assert job_row("file:a.txt")["status"] == "RUNNING"
        ran.append(1)
    assert job.status == "DONE"
    row = job_row("file:a.txt")
    assert row["status"] == "DONE" and row["userId"] == "alice" and "error" not in row
    assert row["finishedMs"] >= row["startedMs"]
    with pytest.raises(AlreadyDone), run_once("file:a.txt"):
        ran.append(2)
    assert ran == [1]


def test_exception_marks_failed_keeps_message_and_reraises(lock_table):
    with pytest.raises(ValueError, match="bad header"), run_once("file:b.txt"):
        raise ValueError("bad header")
    row = job_row("file:b.txt")
    assert row["status"] == "FAILED"
    assert row["error"] == "ValueError: bad header"
    with run_once("file:b.txt") as job:
        assert job.attempt == 2
    assert job_row("file:b.txt")["status"] == "DONE"
    assert "error" not in job_row("file:b.txt")


def test_live_running_job_is_busy(lock_table):
    with run_once("file:c.txt", user="alice"):
        with pytest.raises(SemaphoreBusy) as busy, run_once("file:c.txt"):
            pytest.fail("must not run while another process runs it")
        assert busy.value.holder_user_id == "alice"
        assert busy.value.retry_after >= 1


def test_a_busy_job_is_estimated_to_run_as_long_again_as_it_has(lock_table):
    """No average is stored for jobs: one that has run 1.2 s is expected to take as long
    again (it said its lease end + CLOCK_SKEW: about 10 s)."""
    with run_once("file:e.txt", user="alice"):
        time.sleep(1.2)
        with pytest.raises(SemaphoreBusy) as busy, run_once("file:e.txt"):
            pytest.fail("must not run while another process runs it")
    assert 1.2 <= busy.value.estimated_wait < 5
    assert busy.value.retry_after == math.ceil(busy.value.estimated_wait)
    assert busy.value.queue_position is None
    assert busy.value.holder_user_id == "alice"


def test_running_job_whose_lease_expired_is_claimed_again(lock_table):
    with override_settings(DYNASEM=dict(settings.raw, CLOCK_SKEW=0.2)):
        dead = run_once("file:d.txt", lease=0.5).claim()
        dead._heartbeat.stop()  # the worker died mid-run
        time.sleep(0.8)
        with run_once("file:d.txt") as job:
            assert job.attempt == 2
            assert job.fence > dead.fence
        assert job_row("file:d.txt")["status"] == "DONE"


def test_job_keys_do_not_collide_with_semaphores(lock_table):
    with semaphore("same-name"), run_once("same-name") as job:
        assert job.status == "RUNNING"
    assert job_row("same-name")["status"] == "DONE"
    assert lock_rows.get_item("same-name")["holders"] == {}


def test_done_and_failed_rows_never_expire_and_are_never_reaped(lock_table):
    with run_once("job:done"):
        pass
    with pytest.raises(RuntimeError), run_once("job:failed"):
        raise RuntimeError("x")
    for key in ("job:done", "job:failed"):
        assert "expires" not in job_row(key)
        assert "expMs" not in job_row(key)
    call_command("dynasem_reap", verbosity=0)
    assert job_row("job:done")["status"] == "DONE"
    assert job_row("job:failed")["status"] == "FAILED"


def test_async_with(lock_table):
    async def main() -> int:
        async with run_once("file:async.txt") as job:
            await asyncio.sleep(0)
            return job.attempt

    assert asyncio.run(main()) == 1
    assert job_row("file:async.txt")["status"] == "DONE"


def test_bad_key_is_refused_before_any_request(requests_sent):
    for bad in ("", None, 3, "x" * 1025):
        with pytest.raises((TypeError, ValueError), match="key"):
            run_once(bad)
    assert requests_sent.total == 0


def test_claim_counts_on_from_a_fence_ahead_of_our_clock(lock_table, monkeypatch):
    with pytest.raises(RuntimeError), run_once("file:clock.txt"):
        raise RuntimeError("first run failed")
    first_fence = job_row("file:clock.txt")["fence"]
    import dynasem._clock

    real = time.time
    monkeypatch.setattr(dynasem._clock, "wall_clock", lambda: real() - 3600)  # an hour behind
    with run_once("file:clock.txt") as job:
        assert job.fence == first_fence + 1
    assert job_row("file:clock.txt")["status"] == "DONE"


@pytest.mark.parametrize("taken_over", [False, True], ids=["nobody-came", "reclaimed"])
def test_a_claim_paused_past_its_lease_never_runs_beside_another(
    lock_table, monkeypatch, taken_over
):
    """The claim lands, then its process stalls past the lease before the body starts: the
    claim is confirmed by a renewal of its own, or (another process reclaimed the expired
    job meanwhile) the body does not run."""
    import threading

    lease, skew = 1.0, settings.CLOCK_SKEW
    real_update = job_rows.update_job
    stalled: list[float] = []

    def stalling_update(action, **kwargs):
        result = real_update(action, **kwargs)
        if not stalled and "#attempt" in action.get("UpdateExpression", ""):  # our claim
            stalled.append(time.monotonic())
            time.sleep(lease + skew + 0.7)  # a GC pause, a stalled VM
        return result

    other: list[str] = []

    def reclaim() -> None:
        time.sleep(lease + skew + 0.2)  # our lease and the skew are over: legitimately
        with run_once("file:stalled.txt", lease=10):
            other.append("start")
            time.sleep(1.5)
            other.append("end")

    thread = threading.Thread(target=reclaim) if taken_over else None
    monkeypatch.setattr(job_rows, "update_job", stalling_update)
    if thread is not None:
        thread.start()
    ran = []
    try:
        with run_once("file:stalled.txt", lease=lease) as job:
            ran.append(list(other))
            assert job.seconds_left() > 0
    except SemaphoreBusy:
        ran.append("busy")
    if thread is not None:
        thread.join(10)
        assert other == ["start", "end"]
        assert ran == ["busy"]  # not run beside the reclaimer's body
    else:
        assert ran == [[]]  # confirmed by its own renewal, then run
        assert job_row("file:stalled.txt")["status"] == "DONE"


def test_a_claim_known_lost_has_no_seconds_left(lock_table):
    """A body told to watch ``job.seconds_left()`` stops once a renewal was refused (the
    claim is another's), though its old lease would still have run for seconds."""
    with pytest.raises(LockLost), run_once("file:lost.txt", lease=30) as job:
        assert job.seconds_left() > 20
        # Another claim's token in the row (as a claim made after ours would leave it).
        other = lock_writes.update_action(
            job.key, records.JOB_SK, "SET #token = :other", "", {}, {":other": "someone"}
        )
        job_rows.update_job(other)
        try:
            job.renew()
        finally:
            assert job.seconds_left() == 0


def test_an_interrupt_after_the_claim_landed_gives_the_job_back(lock_table, monkeypatch):
    """Ctrl-C after the claim's write applied, before its answer was used (found by the
    simulator's interrupt fault: seed 3, ``--mix jobs --faults interrupts``): the body never
    runs, and the job must not sit RUNNING under the interrupted claim's lease, refusing every
    other run_once (SemaphoreBusy) until it runs out."""
    update_job = job_rows.update_job

    def interrupted(*args, **kwargs):
        update_job(*args, **kwargs)  # the claim lands...
        raise KeyboardInterrupt  # ...and Ctrl-C comes before its answer is read

    monkeypatch.setattr(job_rows, "update_job", interrupted)
    with pytest.raises(KeyboardInterrupt), run_once("job:interrupted", lease=60):
        pytest.fail("the body must not run")
    monkeypatch.setattr(job_rows, "update_job", update_job)
    row = job_row("job:interrupted")
    assert row["status"] == "FAILED" and "expMs" not in row
    assert row["error"].startswith("KeyboardInterrupt")
    with run_once("job:interrupted") as job:  # at once, not SemaphoreBusy
        assert job.attempt == 2
    assert job_row("job:interrupted")["status"] == "DONE"


def test_an_interrupt_before_the_claim_was_sent_writes_nothing(lock_table, monkeypatch):
    from dynasem import _clock

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as the claim's fence is drawn: nothing sent yet

    sent = []
    monkeypatch.setattr(_clock, "new_fence", interrupted)
    monkeypatch.setattr(job_writes, "job_finish", lambda *a, **k: sent.append(a) or {})
    with pytest.raises(KeyboardInterrupt), run_once("job:unsent"):
        pytest.fail("the body must not run")
    assert sent == []  # no give-back sent: nothing was


def test_a_cancelled_async_claim_gives_the_job_back(lock_table, monkeypatch):
    """``asyncio.wait_for`` around ``async with run_once(...)`` times out while the claim is
    in its thread: the claim goes on there and lands; nobody will run the body, so the job is
    given back once it has, not left RUNNING under a heartbeat that renews it for good."""
    update_job = job_rows.update_job

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return update_job(*args, **kwargs)

    monkeypatch.setattr(job_rows, "update_job", slow)

    async def enter() -> None:
        async with run_once("job:cancelled", lease=60):
            pytest.fail("the body must not run")

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(enter(), 0.1)

    asyncio.run(main())
    deadline = time.monotonic() + 5  # the claim ends in its thread, then it is given back
    while (job_row("job:cancelled") or {}).get("status") != "FAILED":
        assert time.monotonic() < deadline, job_row("job:cancelled")
        time.sleep(0.05)
    monkeypatch.setattr(job_rows, "update_job", update_job)
    with run_once("job:cancelled") as job:
        assert job.attempt == 2


def test_an_async_claim_cut_off_by_the_loop_ending_gives_the_job_back(lock_table, monkeypatch):
    """``asyncio.run`` returns while a task is still claiming in its thread: it cancels every
    task left, the claim's own among them. The claim goes on in its thread and lands; it is
    given back once it has, not left RUNNING under a heartbeat that renews it for good (the
    claim's task, cancelled, ended before it, and nobody looked at how it ended)."""
    update_job = job_rows.update_job

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return update_job(*args, **kwargs)

    monkeypatch.setattr(job_rows, "update_job", slow)

    async def enter() -> None:
        async with run_once("job:loop-ended", lease=60):
            pytest.fail("the body must not run")

    async def main() -> None:
        asyncio.create_task(enter())
        await asyncio.sleep(0.1)  # claiming: the loop ends meanwhile

    asyncio.run(main())
    deadline = time.monotonic() + 5  # the claim ends in its thread, then it is given back
    while (job_row("job:loop-ended") or {}).get("status") != "FAILED":
        assert time.monotonic() < deadline, job_row("job:loop-ended")
        time.sleep(0.05)
