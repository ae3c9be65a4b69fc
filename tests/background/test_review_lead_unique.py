"""Leader election and unique tasks under review (thirty-first session): each test failed
before its mend, and says why in its docstring."""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from dynasem import LockLost


class _FrozenLead:
    """A lead whose trusted deadline (CLOCK_MONOTONIC) does not move: the whole dynasem_lead
    process is stopped (SIGSTOP, a frozen VM), so its heartbeat renews nothing either. The
    first ``seconds_left()`` is read just before the process stops for ``pause`` seconds: the
    pause falls between that line and the next one of ``Command._lead``."""

    fence = 7

    def __init__(self, deadline: float, pause: float) -> None:
        self.deadline = deadline
        self.pause = pause
        self.reads = 0

    def seconds_left(self) -> float:
        left = max(0.0, self.deadline - time.monotonic())
        self.reads += 1
        if self.reads == 1 and self.pause:
            time.sleep(self.pause)  # SIGSTOP ... SIGCONT, right after the value was read
        return left


class _Child:
    """The command behind its keeper: records the deadlines the leader tells its init."""

    told: list[float]

    def __init__(
        self, command: list[str], env: dict[str, str], own_pids: bool, deadline: float
    ) -> None:
        self.told = [deadline]  # told before the init starts
        self.killed = False
        self.process = type("P", (), {"pid": 4242})()
        _Child.last = self

    def poll(self) -> int | None:
        return 0 if self.killed else None

    def trust_until(self, deadline: float) -> None:
        self.told.append(deadline)

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        self.killed = True


def test_the_deadline_told_to_the_command_s_init_is_never_past_the_lead_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Command._lead`` tells the namespace's init ``time.monotonic() + left``, with ``left``
    read a line earlier (``lead.seconds_left()``). A pause between the two lines (SIGSTOP, a
    frozen VM, a GC: the brief's "pauses of any length between any two lines") adds its whole
    length to the deadline the init trusts: read 2.0 s left at t0, stopped 1.2 s, the init is
    told t0 + 3.2 although the lead's trusted deadline is t0 + 2.0. The init keeps the last
    deadline it was told (command_init._watch), so if dynasem_lead is stopped again before its
    next look (50 ms later), which is the very case the init's watchdog exists for, the
    command lives on until t0 + 3.1: past the lead's trusted deadline, by the length of the
    first pause, while another host takes the lead over at lease + CLOCK_SKEW after the last
    renewal and starts its own command. Two commands at once. (The told deadline should be
    the lead's own: ``held._deadline``, or ``monotonic`` read before ``seconds_left``.)"""
    from dynasem.management.commands import dynasem_lead

    monkeypatch.setattr(dynasem_lead, "_Command", _Child)
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command._own_pids = True
    start = time.monotonic()
    # 0.8 s left after the pause: enough to start the command (more than grace + KILL_MARGIN).
    lead = _FrozenLead(deadline=start + 2.0, pause=1.2)
    stopping = threading.Event()
    command._lead("beat", lead, ["true"], 0.3, stopping)  # type: ignore[arg-type]
    told = _Child.last.told
    assert told, "the init was told no deadline"
    late = [round(d - lead.deadline, 3) for d in told if d > lead.deadline + 0.01]
    assert not late, (
        f"the init was told deadlines past the lead's trusted deadline by {late} s: a second "
        "stop of dynasem_lead leaves the command running that long after another host may "
        "have taken the lead"
    )


# -- unique tasks: a signal handler's exception that is an Exception (Celery's soft time limit)


def _soft_time_limit() -> BaseException:
    from billiard.exceptions import SoftTimeLimitExceeded

    return SoftTimeLimitExceeded()  # an Exception, raised by a signal handler at any line


@pytest.mark.reentry
def test_a_soft_time_limit_as_the_adoption_lands_gives_the_key_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``adopt`` gives its run hold back when an interrupt comes after the adoption was sent
    (test_unique.py's test_an_adoption_interrupted_after_it_landed_gives_the_key_back), but
    only for a ``BaseException``: ``except Exception: raise`` takes any ``Exception`` for the
    request's own answer (LockLost, unavailable). Celery's soft time limit
    (``billiard.exceptions.SoftTimeLimitExceeded``) is an ``Exception`` raised by a SIGUSR1
    handler at whatever line the task is on, and ``UniqueTask.__call__`` adopts inside the
    task's time: arriving as the adoption lands (a slow answer, botocore's retries), the task
    fails and its key stays held by a run nobody makes, refusing every enqueue of it, for the
    whole run lease."""
    from dynasem._background.unique import adopt, claim
    from dynasem._operators.locks import holds_on
    from dynasem._storage import lock_rows

    taken = claim("reindex:soft", "task-1", queue_lease=30)
    update = lock_rows.update

    def limited(*args: object, **kwargs: object) -> object:
        update(*args, **kwargs)  # the adoption lands ...
        raise _soft_time_limit()  # ... and the soft time limit fires before its answer is read

    monkeypatch.setattr(lock_rows, "update", limited)
    with pytest.raises(Exception) as raised:
        adopt(taken, lease=60)
    assert type(raised.value).__name__ == "SoftTimeLimitExceeded"
    monkeypatch.setattr(lock_rows, "update", update)
    assert holds_on("reindex:soft") == [], "the key stays held by a run nobody makes"


@pytest.mark.reentry
def test_a_soft_time_limit_as_the_run_s_heartbeat_starts_does_not_keep_the_key_for_ever(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worse: the same ``Exception`` raised once ``_renewed`` has started the heartbeat
    (inside ``start_renewing``, after the hold went into the scheduler's heap, or on its
    return) leaves the run hold renewed by the heartbeat with nobody to give it back: the
    task failed, ``unique.run`` never reached its ``finally``. The key is held as long as the
    worker process lives (a prefork child: until max_tasks_per_child, often for ever); every
    enqueue of it is refused. A KeyboardInterrupt at the same line is withdrawn (the heartbeat
    then finds its token gone); an Exception is not."""
    from dynasem._background import unique
    from dynasem._background.unique import Taken, adopt, claim
    from dynasem._engine import heartbeat
    from dynasem.testing import abandon

    taken = claim("reindex:soft2", "task-1", queue_lease=30)
    start = unique.start_renewing

    def started_then_limited(held: Any) -> None:
        start(held)
        raise _soft_time_limit()

    monkeypatch.setattr(unique, "start_renewing", started_then_limited)
    with pytest.raises(Exception) as raised:
        adopt(taken, lease=1)
    assert type(raised.value).__name__ == "SoftTimeLimitExceeded"
    monkeypatch.setattr(unique, "start_renewing", start)
    try:
        time.sleep(1 + 0.5 + 1.0)  # the run lease (1 s), CLOCK_SKEW (0.5 s), a margin
        try:
            claim("reindex:soft2", "task-2", queue_lease=30)
        except Taken:
            pytest.fail("the key is still held, renewed by a heartbeat for a run nobody makes")
    finally:
        for beat in heartbeat.scheduled():
            if beat.held.resource == "reindex:soft2":
                abandon(beat.held)


@pytest.mark.reentry
def test_a_soft_time_limit_at_the_end_of_the_claim_s_acquire_does_not_keep_the_key_for_ever(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``claim()`` drives ``sem._acquire_steps()`` with ``run_sync`` itself, not through
    ``acquire()``: without ``hold.delivering``, which gives back a hold made by an acquire that
    an interrupt ends before its caller has it. ``steps._drive`` cleans up after a
    ``BaseException`` only (``except Exception: raise`` takes any Exception for the loop's own
    answer), so a signal handler's ``Exception`` (Celery's soft time limit, in a task that
    enqueues unique tasks: a periodic fan-out) arriving after the take landed, in the acquire
    loop's last lines (here its ``finally``, ``push.forget``), leaves the claim's hold made,
    its heartbeat running (``hold.acquired`` started it), and ``stop_renewing`` never reached:
    the heartbeat renews the claim, a queue lease at a time, as long as the enqueuing process
    lives. Nothing was enqueued, and every enqueue of the key is refused (Taken) for ever.
    ``semaphore().acquire()`` gives the same hold back (``delivering`` catches any
    exception)."""
    from dynasem._background.unique import Taken, claim
    from dynasem._engine import heartbeat, push
    from dynasem.testing import abandon

    forget = push.forget
    interrupts = [_soft_time_limit()]

    def forget_then_interrupted(token: str) -> None:
        forget(token)
        if interrupts:
            raise interrupts.pop()

    monkeypatch.setattr(push, "forget", forget_then_interrupted)
    with pytest.raises(Exception) as raised:
        claim("reindex:int2", "task-1", queue_lease=1)
    assert type(raised.value).__name__ == "SoftTimeLimitExceeded"
    monkeypatch.setattr(push, "forget", forget)
    try:
        time.sleep(1 + 0.5 + 1.0)  # the queue lease (1 s), CLOCK_SKEW (0.5 s), a margin
        try:
            claim("reindex:int2", "task-2", queue_lease=30)
        except Taken:
            pytest.fail("the key is still held: the claim is renewed by this process for ever")
    finally:
        for beat in heartbeat.scheduled():
            if beat.held.resource == "reindex:int2":
                abandon(beat.held)


@pytest.mark.reentry
def test_an_adoption_whose_confirmation_is_answered_late_too_does_not_run(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unique._renewed`` confirms an adoption answered late with one renewal (``confirm``)
    and then starts the run, without looking at what that renewal left: if its answer is
    read late as well (a second pause: the simulator's ``pauses`` profile stalls a thread
    between a write's answer and its reading), the hold's trusted deadline (the renewal's
    send + run lease - CLOCK_SKEW) is already over when the task begins, and another enqueue
    may have claimed the key meanwhile and its task be running. The engine's own acquire
    plans again in that case (``core.Acquire.confirmed``: renew again, or give up); adopt
    returns the hold and the task runs beside the other. Found by the simulator:
    ``python -m tests.support.sim --seeds 149 --mix unique --faults pauses`` (and seed 154;
    2 of seeds 100-199): "h1/p102 entered 'u2' exclusively with fence ..., superseded by a
    later grant" (adopted at 23.62, answer read 15.1 s later; the confirming renewal at
    38.76, its answer read 18.4 s later; a later enqueue claimed u2 at 51.76; p102's task
    began at 57.11)."""
    from dynasem._background.unique import adopt, claim, task_of
    from dynasem._operators.locks import holds_on
    from dynasem._storage import lock_rows
    from dynasem.testing import abandon

    taken = claim("reindex:late2", "task-1", queue_lease=30)
    real = lock_rows.update
    answers: list[object] = []

    def answered_late(action: dict[str, object], **kwargs: object) -> object:
        answer = real(action, **kwargs)  # applied ...
        answers.append(answer)
        time.sleep(1.6)  # ... its answer read past the run lease (1 s) and CLOCK_SKEW (0.5 s)
        if len(answers) == 2:  # the confirming renewal, answered late too
            monkeypatch.setattr(lock_rows, "update", real)
            claim("reindex:late2", "task-2", queue_lease=30)  # a later enqueue took the key
        return answer

    monkeypatch.setattr(lock_rows, "update", answered_late)
    try:
        held = adopt(taken, lease=1)
    except LockLost:
        return  # not run: right
    left = held.seconds_left()
    (hold,) = holds_on("reindex:late2")
    abandon(held)
    pytest.fail(
        f"adopt returned the run's hold with {left:.3f} s of trust left while the key is held "
        f"by task {task_of(hold.user_id)}: two runs of the key at once"
    )


@pytest.mark.parametrize("seed", [149, 154])
def test_the_simulator_s_unique_mix_under_pauses_finds_no_two_runs(seed: int) -> None:
    """The simulator's runs that found the late confirmation above (the CLI's defaults:
    6 processes on 2 hosts, 10 steps): ``python -m tests.support.sim --seeds 149 --mix unique
    --faults pauses --trace``."""
    from tests.support.sim.runtime import Options, run

    run(Options(seed=seed, mix="unique", faults="pauses")).raise_if_violated()


@pytest.mark.reentry
@pytest.mark.skipif(
    __import__("django").VERSION < (6, 0), reason="django.tasks is Django's from 6.0"
)
def test_an_async_retry_waiting_for_its_run_neither_ignores_a_cancel_nor_holds_an_io_thread(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``UniqueTask.acall`` of a retry whose run (the one that enqueued it) still runs: the
    adoption waits for that run's end (``unique._adopt``'s ``time.sleep`` loop, as long as the
    run lasts: minutes, hours) inside ``run_io_taking``, in a thread of dynasem's io executor,
    where "only requests run: waits are asyncio's" (steps.IO_THREADS). ``run_io_taking``
    waits for its call to end whatever cancels the caller, so a cancel of the retry's run is
    not honoured until the other run ends; and each such retry holds one of the executor's
    32 threads meanwhile: 32 of them, and every async acquire, renewal and release of the
    process waits behind them (here one thread, one retry: another key's ``aacquire`` stalls
    as long as the run lasts)."""
    from django.test import override_settings

    from dynasem import semaphore
    from dynasem._background import unique
    from dynasem._engine import steps
    from tests.support import unique_tasks

    dummy = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    monkeypatch.setattr(steps, "IO_THREADS", 1)
    monkeypatch.setattr(steps, "_io", None)
    with override_settings(TASKS=dummy):
        task = unique_tasks.aplain.using(backend="default")
        queued = task.enqueue("waits")
        first = unique.Claim.from_header(queued.kwargs["dynasem_claim"])
        assert first is not None
        run = unique.adopt(first, lease=5)  # the first run, in another worker, going on
        retry = unique.hand_on(run, first)  # it enqueued its retry
        assert retry is not None
        kwargs = {**queued.kwargs, "dynasem_claim": retry.header()}
        ends = threading.Timer(6.0, unique.end_run, (run, 30))  # the first run ends in 6 s
        ends.start()
        outcome: dict[str, float] = {}

        async def main() -> None:
            call = asyncio.create_task(task.acall(*queued.args, **kwargs))
            await asyncio.sleep(0.3)  # the retry waits for its run
            cancelled = time.monotonic()
            call.cancel()  # its worker shuts down, say
            began = time.monotonic()
            try:
                other = await asyncio.wait_for(semaphore("elsewhere").aacquire(), 8.0)
                outcome["other acquire"] = time.monotonic() - began
                await other.arelease()
            except TimeoutError:
                outcome["other acquire"] = math.inf
            with contextlib.suppress(asyncio.CancelledError):
                await call
            outcome["cancel"] = time.monotonic() - cancelled

        try:
            asyncio.run(main())
        finally:
            ends.join()
    assert outcome["cancel"] < 1.0 and outcome["other acquire"] < 1.0, (
        f"the cancelled retry ended {outcome['cancel']:.1f} s after its cancel; another "
        f"key's aacquire waited {outcome['other acquire']:.1f} s behind the retry's wait for "
        "its run, in the io executor"
    )


def test_a_leader_stopped_as_its_command_starts_still_has_it_end_by_the_lead_s_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The namespace's init starts with no deadline (``command_init._watch``: ``inf``) and is
    told the lead's first only by ``Command._lead``'s loop, after ``_Command`` has started the
    keeper and waited for it to be ready (up to KEEPER_PATIENCE, 10 s). dynasem_lead stopped
    in that window (SIGSTOP, a frozen VM: what the init's watchdog is for, "the init ends the
    namespace just before the lead's trusted deadline, which this process tells it after
    every renewal") leaves the command running with no deadline at all: the lead runs out,
    another host takes it over and starts its command beside this one, for as long as this
    process stays stopped. Here the lead's trusted deadline is 1.5 s away; dynasem_lead is
    stopped from the command's start until 0.5 s past that deadline: the command is still
    alive then. (The command needs the lead's deadline before it starts: on the keeper's
    command line, or written on the control pipe before the Popen.)"""
    from dynasem.management.commands import dynasem_lead

    if subprocess.run(
        [sys.executable, "-I", dynasem_lead.COMMAND_INIT, "--probe"], capture_output=True
    ).returncode:
        pytest.skip("no pid namespace on this machine")
    lead = _FrozenLead(deadline=time.monotonic() + 1.5, pause=0.0)
    alive_after_deadline: list[bool] = []
    real = dynasem_lead._Command

    class StoppedAsItStarts(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # dynasem_lead is stopped here, before its loop's first trust_until ...
            time.sleep(max(0.0, lead.deadline + 0.5 - time.monotonic()))
            # ... until 0.5 s past the lead's trusted deadline: is the command still running?
            alive_after_deadline.append(self.process.poll() is None)

    monkeypatch.setattr(dynasem_lead, "_Command", StoppedAsItStarts)
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command._own_pids = True
    command._lead("beat", lead, ["sleep", "30"], 0.3, threading.Event())  # type: ignore[arg-type]
    assert alive_after_deadline == [False], (
        "the command still ran 0.5 s past the lead's trusted deadline while dynasem_lead was "
        "stopped: its init had been told no deadline"
    )
