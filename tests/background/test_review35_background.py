"""Background work under review (thirty-fifth session): run_once, dynasem_lead. Each test says
in its docstring what it shows and whether it failed before a mend."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction

import dynasem._clock as clock
from dynasem import SemaphoreBusy, SemaphoreUnavailable, run_once
from dynasem._engine import heartbeat
from dynasem._storage import lock_rows, records
from tests.support.helpers import wait_for


def _job_row(key: str) -> dict[str, Any]:
    return lock_rows.get_item(key, records.JOB_SK) or {}


@pytest.mark.django_db(transaction=True)
def test_a_job_confirmed_after_a_stall_is_renewed_while_its_transaction_goes_on(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ``transaction.atomic`` a body that stalled past its lease is confirmed by a
    renewal of its own when the block ends (``RunOnce._end`` -> ``Job.confirm``), and DONE
    waits for the commit "and the lease renewed meanwhile, so nobody else claims the job while
    its work may still commit". But the stall ended the heartbeat by itself (its next beat
    found the deadline passed: ``Heartbeat.beat`` returns None without setting ``stopped``),
    and ``Job._start_heartbeat`` starts a new one only if the old one is ``stopped``: after
    the confirmation nothing renews the job. The transaction goes on past the lease; another
    process claims the job (RUNNING under a dead lease) and runs it while this one's work
    commits: the job's work done twice at once."""
    key = "rv35:confirmed-then-not-renewed"
    real = clock.monotonic
    shift = [0.0]
    monkeypatch.setattr(clock, "monotonic", lambda: real() + shift[0])
    outcome: list[str] = []

    def another_process_claims() -> None:
        try:
            other = run_once(key).claim()
        except SemaphoreBusy:
            outcome.append("busy")
        else:
            outcome.append(f"claimed, attempt {other.attempt}")
            other._stop_heartbeat()
            other._finish(RuntimeError("the test's second run"))

    with transaction.atomic():
        with run_once(key, lease=1.5) as job:
            User.objects.create(username="rv35-job-work")
            beat = job._heartbeat
            shift[0] = 5.0  # the body stalls past its lease (monotonic: a pause of 5 s)
            wait_for(lambda: beat not in heartbeat.scheduled(), 3, "the heartbeat noticed")
        # Confirmed (nobody had claimed it): DONE waits for the commit, renewed meanwhile.
        assert job.pending_commit and job.seconds_left() > 0
        time.sleep(2.5)  # the transaction goes on: longer than lease + CLOCK_SKEW (2 s)
        claimer = threading.Thread(target=another_process_claims)
        claimer.start()
        claimer.join()
    assert outcome == ["busy"], (
        f"while the first run's transaction was still open, another run_once: {outcome}"
    )
    assert (job.status, _job_row(key).get("status")) == ("DONE", "DONE")


class _FrozenLead:
    """A lead whose trusted deadline does not move (dynasem_lead stopped: nothing renews)."""

    fence = 7

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.held = self

    def renew(self) -> None:
        pass  # sent, never answered before dynasem_lead stops

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def test_without_a_pid_namespace_a_stopped_leader_s_command_ends_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--no-pid-namespace`` (a machine that refuses a pid namespace): nothing but
    dynasem_lead's own loop watched the lead's trusted deadline (``command_init.py
    --die-with`` set PR_SET_PDEATHSIG and exec'd the command; ``trust_until`` wrote to no
    pipe). dynasem_lead stopped (SIGSTOP, a debugger; here: its loop not running, from the
    command's start until 0.5 s past the lead's deadline) left the command itself running
    after the lead could be taken over: another host's command starts beside it. Mended: the
    command runs behind a watcher (``command_init.py --watch``) that SIGKILLs its process
    group 0.1 s before the deadline it was last told, as the pid namespace's init does."""
    from dynasem.management.commands import dynasem_lead

    lead = _FrozenLead(deadline=time.monotonic() + 1.0)
    alive_after_deadline: list[bool] = []
    real = dynasem_lead._Command

    class StoppedAsItStarts(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            time.sleep(max(0.0, lead.deadline + 0.5 - time.monotonic()))  # stopped ...
            alive_after_deadline.append(self.process.poll() is None)  # ... past the deadline

    monkeypatch.setattr(dynasem_lead, "_Command", StoppedAsItStarts)
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command._own_pids = False
    command._lead("beat", lead, ["sleep", "30"], 0.3, threading.Event())  # type: ignore[arg-type]
    assert alive_after_deadline == [False], (
        "with --no-pid-namespace the command still ran 0.5 s past the lead's trusted deadline "
        "while dynasem_lead was stopped"
    )


@pytest.mark.reentry
def test_a_retry_revoked_while_its_run_goes_on_does_not_keep_the_key_for_nobody(
    lock_table: str,
) -> None:
    """Celery's ``task_revoked`` (``celery_unique._revoked``) gives a discarded task's key back
    with ``unique.give_back`` -> ``adopt(claim, wait=False)``. A retry shares its run's task id,
    so revoking that id while the run goes on discards the retry at its receipt (Celery checks
    revocation when a message arrives, ETA or not), often before its run has ended: the
    adoption answers ``RunNotEnded`` (a ``LockLost``), which ``give_back`` swallows, and
    nothing else is done. The run then ends (``end_run`` -> ``Held.become_claim``, conditional
    only on the run's own entry) and its hold becomes the claim of a retry that will never
    run: every enqueue of the key is refused (``Taken``, naming the revoked task) for the whole
    ``queue_lease`` (600 s by default). The guide says "A revoked task gives it back in the
    worker that discards it". Held for nobody, bounded by queue_lease. Mended: the give-back
    withdraws the announcement from the run's entry, and the run's hold becomes the retry's
    claim only while it is announced still (else the run gives it back)."""
    from dynasem._background import unique

    key = "rv35:revoked-retry"
    first = unique.claim(key, "task-1", queue_lease=30)
    run = unique.adopt(first, lease=5)
    retry = unique.hand_on(run, first)  # self.retry(): the retry's message is sent
    assert retry is not None
    unique.give_back(retry)  # the retry's message discarded as revoked, its run not ended
    unique.end_run(run, queue_lease=30)  # the run returns (Celery's Retry) and ends
    try:
        again = unique.claim(key, "task-2", queue_lease=30)
    except unique.Taken as taken:
        pytest.fail(f"the key is held for the revoked retry (task {taken.task_id}) for 30 s")
    unique.give_back(again)


class _LateLead:
    """A lead found by a look rather than a push: a little trust left, a whole window once
    renewed (``held.renew()``)."""

    fence = 9

    def __init__(self, left: float, window: float) -> None:
        self.deadline = time.monotonic() + left
        self.window = window
        self.held = self
        self.renewals = 0

    def renew(self) -> None:
        self.renewals += 1
        self.deadline = time.monotonic() + self.window

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class _ExitsAfterThreePolls:
    """The command: exits by itself on the fourth poll; records a SIGTERM sent to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.polls, self.termed = 0, False
        self.process = type("P", (), {"pid": 4343})()
        _ExitsAfterThreePolls.last = self

    def poll(self) -> int | None:
        self.polls += 1
        return 0 if self.polls > 3 else None

    def trust_until(self, deadline: float) -> None:
        pass

    def terminate(self) -> None:
        self.termed = True

    def kill(self) -> None:
        pass


def test_a_lead_that_comes_with_little_trust_is_renewed_before_its_command_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An acquire returns a hold with as little as a third of its window left (a hand-over
    found by a look rather than a push: ``take.held_if_trusted``'s margin), and the default
    ``--grace`` is a third of the window: ``Command._lead`` stopped the command it had just
    started (``left <= grace + KILL_MARGIN``) without renewing first, gave the lead back and
    competed again. Now a lead with less than twice that is renewed before the command
    starts. Failed before the mend (the command was sent SIGTERM at its first look)."""
    from dynasem.management.commands import dynasem_lead

    monkeypatch.setattr(dynasem_lead, "_Command", _ExitsAfterThreePolls)
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command._own_pids = True
    lead = _LateLead(left=1.0, window=3.0)
    status = command._lead("beat", lead, ["true"], 0.9, threading.Event())  # type: ignore[arg-type]
    assert (status, _ExitsAfterThreePolls.last.termed) == (0, False)
    assert lead.renewals == 1


class _UnrenewedLateLead(_LateLead):
    """A late lead whose renewal DynamoDB does not answer (a lost answer, an outage)."""

    def renew(self) -> None:
        self.renewals += 1
        raise SemaphoreUnavailable("the renewal's answer was lost")


def test_a_late_lead_whose_renewal_fails_starts_no_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same late lead, its renewal unanswered: more than ``KILL_MARGIN`` was left, so
    ``Command._lead`` started the command and sent it SIGTERM at its first look (the lead
    ending), then competed again and ran it a second time (issue 43's CI: three runs of two
    leaders). Now a lead that the loop would stop at once starts nothing. Failed before the
    mend (the command was started, then stopped)."""
    from dynasem.management.commands import dynasem_lead

    monkeypatch.setattr(dynasem_lead, "_Command", _ExitsAfterThreePolls)
    _ExitsAfterThreePolls.last = None
    said = io.StringIO()
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=said)
    command._own_pids = True
    lead = _UnrenewedLateLead(left=1.0, window=3.0)
    status = command._lead("beat", lead, ["true"], 0.9, threading.Event())  # type: ignore[arg-type]
    assert (status, _ExitsAfterThreePolls.last, lead.renewals) == (None, None, 1)
    assert "before its command could start" in said.getvalue()


def _left_in_another_thread(block: Any) -> None:
    """A generator suspended inside ``with block:`` (entered in a context of its own) and run
    to its end by another thread: leaving the block must raise nothing."""
    import contextvars

    def work() -> Any:
        with block:
            yield "inside"

    it = work()
    assert contextvars.copy_context().run(next, it) == "inside"
    errors = _resumed_in_another_thread(it)
    assert errors == [], f"leaving the block raised {errors!r}"


def _resumed_in_another_thread(it: Any) -> list[BaseException]:
    """``it`` (suspended inside its block, entered in a context of its own) run to its end by
    another thread; what that raised."""
    errors: list[BaseException] = []

    def resume() -> None:
        try:
            for _ in it:
                pass
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    thread = threading.Thread(target=resume)
    thread.start()
    thread.join()
    return errors


def test_a_run_once_block_left_in_another_thread_finishes_its_job(lock_table: str) -> None:
    """A generator suspended inside ``with run_once(key)`` and resumed by another thread: the
    block's exit runs where its enter is not on the context's stack. It raised
    ``RuntimeError('run_once exited without a matching enter')`` and left the job RUNNING,
    renewed by the heartbeat for nobody while the process lived (every later run_once
    refused). Failed before the mend; now the job ends DONE."""
    _left_in_another_thread(run_once("rv35:job-in-generator", lease=5))
    assert _job_row("rv35:job-in-generator").get("status") == "DONE"


def test_a_leadership_block_left_in_another_thread_gives_the_lead_back(lock_table: str) -> None:
    """The same for ``with leadership(name)``: its exit found no entry, raised, and the lead
    stayed held, renewed for nobody. Failed before the mend; now it is given back."""
    from dynasem import leadership

    _left_in_another_thread(leadership("rv35-gen", lease=5))
    assert lock_rows.get("leader:rv35-gen") is None or not lock_rows.get("leader:rv35-gen").holders
