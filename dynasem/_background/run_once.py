"""The status guard: of many processes, exactly one runs a NEW or FAILED job.

``with run_once("file:test.txt") as job:`` claims the job by one conditional write
(NEW/FAILED, or RUNNING under a dead lease -> RUNNING), renews its lease in the background while
the body runs, and writes DONE on return or FAILED (with the message) on an exception, which
is re-raised. Rows live under their own sort key, so a job never collides with a semaphore of
the same name, and DONE/FAILED rows carry no ``expires``: no TTL, no reaping.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import sys
import uuid
from typing import Any

from .. import _clock as clock
from .._engine import arguments as validation
from .._engine import resend
from .._engine.heartbeat import Heartbeat
from .._engine.queue import retry_after, too_slow
from .._engine.reentry import Block, close, left, opened
from .._engine.steps import caller_in_transaction, release_to_end, run_io_taking, sync_caller
from .._observability.logs import facts
from .._storage import dynamodb, job_rows, job_writes, records
from .._transactions import commit as transactions
from ..exceptions import AlreadyDone, LockLost, SemaphoreBusy, SemaphoreUnavailable

logger = logging.getLogger("dynasem")

# Claims sent again at once when a refusal showed a state we had not seen (as core does).
MAX_CLAIMS = 25
# Confirmations of a claim answered late before its body begins (unique.CONFIRM_TRIES).
CONFIRM_TRIES = 3
# Why a write of ours was refused: the job is not our claim any more.
RECLAIMED = "another process claimed it, or it was reset by an operator"


@dataclasses.dataclass(eq=False, repr=False)
class Job:
    """A claimed job, as ``with run_once(key) as job`` gives it. Its lease is renewed in the
    background while the body runs.

    ``key`` is the job's key; ``status`` is ``"RUNNING"`` while the body runs, ``"DONE"`` or
    ``"FAILED"`` once written; ``attempt`` how many times the job has been claimed, this run
    included (1 for the first run); ``fence`` is larger than every earlier run's (write it
    with the job's results); ``token`` is this claim's token, as the table records it, and
    ``user_id`` the user recorded for this run."""

    key: str
    token: str
    user_id: str
    attempt: int
    fence: int
    lease: float
    skew: float
    _deadline: float  # when the claim stops being trusted (clock.monotonic())
    status: str = records.RUNNING
    _lost: str | None = None
    _released: bool = False
    _pending_commit: bool = False  # finished, waiting for the transaction to end
    _heartbeat: Heartbeat | None = None
    # Entered by async code that a sync thread in a transaction runs (async_to_sync): its
    # end runs on that thread, DONE after that transaction's commit (steps.release_to_end).
    _follows_caller: bool = False
    # The process that claimed it: a child forked inside the body that leaves the block
    # (sys.exit, a return) finishes nothing; the parent, still in it, does.
    _pid: int = dataclasses.field(default_factory=os.getpid)

    @property
    def pending_commit(self) -> bool:
        """True while DONE/FAILED waits for the transaction around the body to end."""
        return self._pending_commit

    def __repr__(self) -> str:  # what logs name it by (a hold's is alike)
        return f"<Job {self.key!r} attempt={self.attempt} fence={self.fence} {self.status}>"

    # The heartbeat speaks to any hold through these.
    @property
    def resource(self) -> str:
        return self.key

    def seconds_left(self) -> float:
        """How long the claim can be trusted without renewing (our clock, skew allowed); 0
        once it is known lost (a renewal refused), deadline or not."""
        if self._lost is not None:
            return 0.0
        return max(0.0, self._deadline - clock.monotonic())

    def check_deadline(self) -> None:
        if self._lost is None and clock.monotonic() >= self._deadline:
            self._lost = "its lease ran out before it could be renewed"

    def renew(self) -> None:
        """Extend the job's lease now (the heartbeat does this by itself while the body runs).
        Raises ``LockLost`` if the claim is no longer ours."""
        self.check_deadline()
        if self._lost is not None or self._released:
            raise LockLost(self.key, self._lost or "it has finished")
        self._write_renewal()
        self._trusted_still()

    def confirm_in_time(self) -> None:
        """:meth:`confirm`, and ``LockLost`` if its answer came past the trust it gave."""
        self.confirm()
        self._trusted_still()

    def _trusted_still(self) -> None:
        # A renewal is trusted from its send: answered past our deadline, it extended nothing
        # we may trust (the stored end is a lease from the send: another may claim it now).
        self.check_deadline()
        if self._lost is not None:
            self._stop_heartbeat()
            raise LockLost(self.key, self._lost)

    def confirm(self) -> None:
        """Renew with a write of our own even past our deadline (a stall in the body): if the
        claim is still ours (nobody claimed or reset the job since), the lease is ours again;
        else ``LockLost``."""
        try:
            self._write_renewal()
        except LockLost:
            self._stop_heartbeat()
            raise
        self._lost = None
        # A heartbeat that found the deadline passed has ended by itself without being
        # ``stopped``: a new one, or nothing renews the job while its transaction goes on.
        self._stop_heartbeat()
        self._heartbeat = None
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.stopped:
            self._heartbeat = Heartbeat(self)
            self._heartbeat.start()

    def _write_renewal(self) -> None:
        """Renew the lease in the table, and trust it a lease from when the write was sent
        (our clock, skew allowed); ``LockLost`` if the claim is not ours."""
        sent_mono = clock.monotonic()
        expires_ms = clock.now_ms() + int(self.lease * 1000)
        try:
            job_rows.update_job(job_writes.job_renew(self.key, self.token, expires_ms))
        except dynamodb.Refused:
            self._lost = RECLAIMED
            raise LockLost(self.key, self._lost) from None
        # Past the old deadline (a stalled body that confirms): a whole lease from now.
        self._deadline = max(self._deadline, sent_mono + self.lease - self.skew)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def _after_transaction(
        self, error: BaseException | None, committed: bool, using: str | None
    ) -> None:
        """DONE only if the body returned and its transaction committed; FAILED otherwise."""
        if not committed and error is None:
            error = TransactionRolledBack(
                "a savepoint around the job rolled back (or its database connection was "
                "closed inside the transaction): its work was not committed"
                if transactions.open_transaction(using) is not None
                else "the transaction around the job rolled back"
            )
        try:
            self._finish(error)
        except LockLost as exc:
            logger.error(
                "dynasem: job %r was claimed or reset by someone else before its transaction "
                "ended (%s); its status is theirs now",
                self.key,
                exc.reason,
                extra=self._facts(outcome="lost", reason=exc.reason),
            )
        finally:
            self._pending_commit = False

    def _facts(self, **more: Any) -> dict[str, Any]:
        """``extra`` for a log record about this run of the job."""
        return facts(self.key, token=self.token, fence=self.fence, **more)

    def _finish(self, error: BaseException | None) -> None:
        """DONE (``error`` None) or FAILED, conditional on our claim; sent again while it
        is throttled or meets another request's transaction, as a hold's release is, and
        while it fails for any transient cause (a 5xx, a dropped connection; a release is
        not: it costs a lease of idleness, where this costs the job's work done twice), DONE
        until the claim's trusted end: given up, the job sits RUNNING for the rest of its
        lease, then runs again, after a commit too. An attempt applied unanswered refuses the
        next (``lastToken`` ours). Raises LockLost if the claim is not ours,
        SemaphoreUnavailable (saying the job will run again) if given up."""
        self._released = True
        self._stop_heartbeat()
        status = records.FAILED if error is not None else records.DONE
        message = None if error is None else f"{type(error).__name__}: {error}"

        def send() -> None:
            now = clock.now_ms()  # sent again, the time it is sent
            job_rows.update_job(job_writes.job_finish(self.key, self.token, status, message, now))

        failed: list[SemaphoreUnavailable] = []
        # DONE: sent again until the claim's trusted end (RELEASE_PATIENCE at least: a body
        # that stalled past it is confirmed by this write), as the job is ours until then;
        # given up, it runs again once its lease ends. FAILED: it runs again either way.
        now = clock.monotonic()
        until = max(self._deadline, now + resend.RELEASE_PATIENCE) if error is None else math.inf
        patience = math.inf if error is None else resend.RELEASE_PATIENCE
        try:
            if not resend.patiently(send, until, failed.append, transient=True, patience=patience):
                raise self._not_finished(status, failed[0])
        except dynamodb.Refused as refused:
            if refused.job.last_token != self.token:
                raise LockLost(self.key, RECLAIMED) from None
        self.status = status

    def _not_finished(self, status: str, why: SemaphoreUnavailable) -> SemaphoreUnavailable:
        """What the caller is told when ``status`` could not be written (``why``): the job
        stays RUNNING until its lease ends, and then runs again (its work done: DONE)."""
        done = "its body returned, but " if status == records.DONE else ""
        # An attempt that got no answer may have landed: the job may be DONE (FAILED) after
        # all, never to run again (AlreadyDone), where "then can run again" would be untrue.
        written = "may not have been written" if why.ambiguous else "could not be written"
        maybe = "unless an attempt landed unanswered, " if why.ambiguous else ""
        return SemaphoreUnavailable(
            f"job {self.key!r}: {done}{status} {written} ({why}); {maybe}it stays RUNNING "
            "until its lease ends, then can run again",
            transient=why.transient,
            ambiguous=why.ambiguous,
        )


class TransactionRolledBack(Exception):
    """What a FAILED job records when its body returned but its transaction rolled back."""


@dataclasses.dataclass(eq=False)
class RunOnce:
    """``run_once(key, user=None, lease=None)``, its arguments checked; see the module
    docstring."""

    key: str
    user: Any
    lease: float | None
    on_commit: bool
    using: str | None

    def claim(self, block: Block | None = None) -> Job:
        """Claim the job or raise :class:`AlreadyDone` / :class:`SemaphoreBusy`. ``block``:
        as that block's entry (the job its record's, under the same guard: an interrupt
        before the block begins gives it back)."""
        token = uuid.uuid4().hex
        sent: list[Job | None] = []  # a claim was sent (None), the Job made of it
        try:
            job = self._claim(token, sent)
            return job if block is None else opened(block, job)
        except BaseException as failure:
            made = [job for job in sent if job is not None]
            # Its own answer (busy, done, unavailable) with nothing of ours there goes as it
            # is; else (Ctrl-C, SystemExit; a failure after the claim landed, or one that
            # may hide it) nobody will run the body: the claim is given back, renewed no more.
            doubt = isinstance(failure, SemaphoreUnavailable) and failure.ambiguous
            if sent and (made or doubt or not isinstance(failure, Exception)):
                for job in made:
                    job._stop_heartbeat()  # renewed for nobody if the give-back fails
                if block is not None:
                    close(block)
                give_back(self.key, token, failure)
            raise

    def _claim(self, token: str, sent: list[Job | None]) -> Job:
        from .._engine.core import CONFIRM_SHARE  # core imports nothing of this module

        lease, _wait, skew = validation.resolve_timing(self.lease, 0)
        user_id = validation.user_id_of(self.user)
        stored_fence = 0
        for _ in range(MAX_CLAIMS):
            sent_mono = clock.monotonic()
            now = clock.now_ms()
            # A stored fence ahead of our clock: count on from it instead.
            fence = max(clock.new_fence(skew), stored_fence + 1)
            stale = now - int(skew * 1000)
            sent.append(None)
            try:
                row = job_rows.update_job(
                    job_writes.job_claim(
                        self.key, token, user_id, now + int(lease * 1000), fence, now, stale
                    ),
                    return_new=True,
                ) or records.job_row(None)
            except dynamodb.Refused as refused:
                row = refused.job
                if row.token != token:  # not our own claim, its response lost
                    if row.status == records.DONE:
                        raise AlreadyDone(self.key, row.finished_ms) from None
                    expires_ms = row.expires_ms or 0
                    if row.status == records.RUNNING and expires_ms >= stale:
                        # No average is stored for jobs: one that has run this long is
                        # expected to run as long again (a semaphore's rule past its
                        # average), told never later than a dead claim could be taken over.
                        ran = max(0, clock.now_ms() - (row.started_ms or now)) / 1000
                        raise SemaphoreBusy(
                            self.key,
                            retry_after(ran, (expires_ms - stale) / 1000),
                            row.user_id,
                            estimated_wait=ran,
                        ) from None
                    # Claimable after all (our fence was behind the stored one): go again.
                    stored_fence = row.fence or 0
                    continue
            attempt = 1 if row.attempt is None else row.attempt
            deadline = sent_mono + lease - skew
            job = Job(self.key, token, user_id, attempt, row.fence or 0, lease, skew, deadline)
            sent.append(job)
            with contextlib.suppress(LockLost):  # reclaimed meanwhile: the next claim says by whom
                # Claimed, but paused (or slow) past most of the lease before the body could
                # start: someone may have reclaimed it, or the heartbeat could not renew it in
                # time (as an acquire: core.CONFIRM_SHARE). Confirmed with a renewal of our own
                # first, whose answer can come late too: checked again, as an acquire's and a
                # unique task's adoption's (unique._renewed), confirmed again, or given up.
                for _ in range(CONFIRM_TRIES):
                    if job.seconds_left() >= (lease - skew) * CONFIRM_SHARE:
                        job._start_heartbeat()
                        return job
                    job.confirm()
                raise too_slow(self.key, lease, skew)
        raise SemaphoreUnavailable(f"could not claim job {self.key!r}: the row kept changing")

    def __enter__(self) -> Job:
        return self.claim(Block(self, sys._getframe(1)))

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        job = left(self, sys._getframe(1), "run_once").value
        try:
            self._leave(job, exc)
        except BaseException:
            # An interrupt before DONE or FAILED was sent (a signal's exception, at _leave's
            # first line too), or a failure of its own: left to its lease, renewed no more.
            job._stop_heartbeat()
            raise

    def _leave(self, job: Job, exc: BaseException | None) -> None:
        if job._pid != os.getpid():
            return  # a child forked in the body leaves it: the parent finishes the job
        try:
            self._end(job, exc)
        except BaseException:
            # An interrupt before DONE or FAILED was sent (a signal's exception), or a
            # failure of its own: the job is left to its lease, renewed no more.
            job._stop_heartbeat()
            raise

    def _end(self, job: Job, exc: BaseException | None) -> None:
        # Inside transaction.atomic the body's work is not done until it commits: DONE (or
        # FAILED) is written after that, and the lease renewed meanwhile, so nobody else
        # claims the job while its work may still commit. See docs/how-to/run-once.md for the rule.
        job.check_deadline()
        if self.on_commit and transactions.open_transaction(self.using) is not None:
            if job._lost is not None:
                # Stalled past the lease in the body. Still the claimant? Our own write says;
                # if not, raise here, so the transaction rolls the stale run's work back.
                try:
                    job.confirm_in_time()
                except LockLost:
                    if exc is None:
                        raise
                    logger.warning(
                        "dynasem: job %r was lost while its body raised",
                        job.key,
                        extra=job._facts(outcome="lost"),
                    )
                    return
            job._pending_commit = True  # first: a transaction that can never commit ends it now
            if transactions.after_transaction(
                self.using,
                lambda committed: job._after_transaction(exc, committed, self.using),
                job.key,
                owner=job,
                savepoint_ends_it=True,  # the whole body was inside that savepoint
            ):
                return
            job._pending_commit = False
        try:
            job._finish(exc)
        except LockLost:
            if exc is None:
                raise

    async def __aenter__(self) -> Job:
        # Cancelled (a timeout around it, the loop ending) while the claim goes on in its
        # thread: once it ends, what it claimed is given back, or the job would sit RUNNING,
        # renewed by the heartbeat, with nobody to run its body or finish it.
        block = Block(self, sys._getframe(1))  # the block's frame (``async with`` runs us at once)
        # A sync view in a transaction calling this through async_to_sync: the body's ORM work
        # (sync_to_async) commits with that transaction, so DONE must wait for its commit, as
        # a ``with`` block's does. Asked before the claim, as an async acquire asks.
        follows = (
            self.on_commit and sync_caller() is not None and await caller_in_transaction(self.using)
        )
        job = await run_io_taking(self.claim, self._cut_off)
        job._follows_caller = follows
        return opened(block, job)

    def _cut_off(self, claimed: Job) -> None:
        claimed._stop_heartbeat()
        give_back(self.key, claimed.token, asyncio.CancelledError())

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        job = left(self, sys._getframe(1), "run_once").value
        await release_to_end(self._leave, job, exc, on_caller=job._follows_caller)


def give_back(key: str, token: str, interrupt: BaseException) -> None:
    """Best effort: a claim of ``key`` under ``token`` that may have landed, interrupted
    before its body ran (Ctrl-C, a cancelled task), ends FAILED at once (the next run_once
    runs the job), conditional on our claim: without it, the job would sit RUNNING under our
    lease, every other run_once refused (SemaphoreBusy) until it ran out. Refused if the
    claim did not land (nothing of ours there); sent again while throttled."""
    message = f"{type(interrupt).__name__}: interrupted before its body ran"
    if isinstance(interrupt, Exception):  # a claim whose answer was lost, or not confirmed
        message = f"{type(interrupt).__name__}: {interrupt} (given back before its body ran)"

    def send() -> None:
        update = job_writes.job_finish(key, token, records.FAILED, message, clock.now_ms())
        job_rows.update_job(update)

    resend.undone(send, key, token)


def run_once(
    key: str,
    *,
    user: Any = None,
    lease: float | None = None,
    on_commit: bool = True,
    using: str | None = None,
) -> RunOnce:
    """Run the ``with`` (or ``async with``) body for ``key`` in exactly one process, until it
    succeeds. The job is claimed (NEW or FAILED becomes RUNNING) and ``as`` gets the ``Job``;
    it becomes DONE when the body returns, FAILED with the message when it raises (the
    exception is re-raised). A DONE job raises ``AlreadyDone``; one RUNNING elsewhere under a
    live lease raises ``SemaphoreBusy``. Inside ``transaction.atomic`` DONE is written after
    the commit and FAILED on rollback (``on_commit=False``: at once); ``using`` names the
    database (None: where the routers send dynasem's writes, ``default`` without them).
    ``lease``: seconds (default: the LEASE setting); ``user``: whom to record."""
    key = validation.check_resource(key, "key")
    if user is not None:
        validation.user_id_of(user)
    lease = None if lease is None else validation.check_lease(lease)
    validation.check_flag(on_commit, "on_commit")
    return RunOnce(key, user, lease, on_commit, transactions.check_using(using))
