"""Unique tasks, the part every task framework shares (``dynasem.celery.UniqueTask``,
``dynasem.django_tasks.unique_task``): a hold taken when a task is enqueued and handed to the
worker that runs it.

The hold spans queue and run. At enqueue it is *claimed*: taken with the queue lease and no
heartbeat, under the task's id as its user (``task:<id>``), without this process's identity
(the process that enqueues may exit at once: its end must not free the key), and without
re-entering a hold this thread has (a claim is another task's). Its resource, token and fence
travel with the message. The worker that starts the task *adopts* it: one write replaces the
claim's holder entry with the run's, under a fresh token, the run lease and this process's
identity; the heartbeat keeps it while the task runs and it is given back when the task ends.
A claim is adopted once: a message delivered twice finds its token gone and does not run.

A retry hands the key on: the run *announces* the retry's token in its entry when it enqueues
the retry, and when it ends its entry becomes the retry's claim (queue lease, no process). A
retry started before that waits for it; if the run died first, the retry takes over once the
run's lease is over. A task that never starts (a lost message, a revoked task, a worker that
died with it prefetched) frees its key when the queue lease ends; a worker killed mid-task,
when the run lease ends. An enqueue that finds the key held gets the id of the task that
holds it (:class:`Taken`), and enqueues nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from .. import _clock as clock
from .._engine import processes, resend, steps
from .._engine.arguments import check_lease, check_resource, resolve_timing, skew_setting
from .._engine.decorators import KeyMaker, checked_keys
from .._engine.hold import (
    Held,
    confirm,
    delivering,
    give_back_unused,
    start_renewing,
    stop_renewing,
)
from .._engine.queue import too_slow
from .._engine.reentry import Block, as_another_process, close, opened, remember_acquired
from .._engine.steps import run_sync
from .._observability.logs import facts
from .._storage import claims, dynamodb, lock_rows, records
from ..exceptions import LockLost, SemaphoreBusy, SemaphoreUnavailable

logger = logging.getLogger("dynasem")

USER_PREFIX = "task:"
# Confirming renewals of an adoption answered late, each answered late too, before the run
# is given up (too slow: this process is paused or starved past the lease).
CONFIRM_TRIES = 3
# How often a retry started before its run ended looks again (doubling up to the second).
FIRST_NAP, LAST_NAP = 0.05, 0.5


class RunNotEnded(LockLost):
    """A retry's claim whose run has not ended yet, adopted with ``wait=False``: an async
    worker waits for it on its event loop, holding no thread of dynasem's executor."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """A key taken for a task about to be enqueued: what travels with its message."""

    resource: str
    token: str
    fence: int
    task_id: str

    def facts(self, outcome: str, reason: object = None, task: str | None = None) -> dict[str, Any]:
        """``extra`` for a log record about this claim
        (:func:`dynasem._observability.logs.facts`)."""
        return facts(outcome=outcome, reason=reason, task=task, **self.header())

    def header(self) -> dict[str, Any]:
        """What the task's message carries (:meth:`from_header` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_header(cls, header: Any) -> Claim | None:
        """The claim a message carries, or None (none, or not one of ours)."""
        try:
            found = [header[name] for name in ("resource", "token", "fence", "task_id")]
            return cls(str(found[0]), str(found[1]), int(found[2]), str(found[3]))
        except (KeyError, TypeError, ValueError):
            return None


class Taken(Exception):
    """The key is held by the task ``task_id`` (queued or running): nothing was enqueued."""

    def __init__(self, resource: str, task_id: str | None):
        super().__init__(resource, task_id)
        self.resource = resource
        self.task_id = task_id


def task_of(user_id: str | None) -> str | None:
    """The task id a unique task's hold records as its user, or None."""
    if user_id and user_id.startswith(USER_PREFIX):
        return user_id[len(USER_PREFIX) :]
    return None


def user_of(task_id: Any) -> str:
    """The holder a claim of the task ``task_id`` records (``task:<id>``); a TypeError or
    ValueError naming the task id (not the ``user`` it makes) if it cannot be one: no str,
    empty, past the size of a holder's id, or with a control character."""
    return check_resource(task_id, "a unique task's id", USER_PREFIX)


def key_for(name: str, keys: KeyMaker, args: Any, kwargs: Any) -> str:
    """The one resource a task's ``unique_key`` makes of these arguments (``name``: the task's,
    for the error); a key that cannot be a resource (too long, or a callable's key with a
    control character) is refused as :class:`~dynasem._engine.decorators.BadKey`, before any
    request."""
    resource = keys(tuple(args or ()), dict(kwargs or {}), False)
    if not isinstance(resource, str):
        raise TypeError(f"{name}: unique_key must make one key, not {resource!r}")
    return str(checked_keys(resource, f"{name}'s arguments by its unique_key"))


def claim(
    resource: str, task_id: str, queue_lease: float, made: list[Claim] | None = None
) -> Claim:
    """Take ``resource`` for the task ``task_id`` for ``queue_lease`` seconds (one attempt,
    no heartbeat); :class:`Taken` if a task holds it already. ``made``: the caller's guard,
    which has the claim before this returns (an interrupt as it returns withdraws it)."""
    from .._engine.core import semaphore  # core imports nothing of this module

    sem = semaphore(resource, wait=0, lease=queue_lease, user=user_of(task_id), on_commit=False)
    sem.detached = True  # not this process's hold: its end must not free the key

    def take() -> Claim:
        # Nor a hold this thread gave back inside a transaction not ended yet (held until
        # its commit, renewed): the key is busy for a task's claim, as for another process.
        as_another_process.set(True)
        held = run_sync(sem._acquire_steps())
        stop_renewing(held)  # the queue lease is all it gets until a worker adopts it
        taken = Claim(resource, held.token, held.fence, task_id)
        if made is not None:
            made.append(taken)  # in the caller's guard while ours still covers it
        return taken

    try:
        # In a context of its own: a hold this thread has (a running task of the same key)
        # must not be re-entered, nor a hold remembered for the next enqueue to re-enter.
        # Delivered as an acquire is: an exception before it returns (a task's soft time
        # limit, raised by a signal handler) gives the hold back, renewed no more.
        return contextvars.Context().run(delivering, take)
    except SemaphoreBusy as busy:
        if steps.from_receiver(busy):
            raise  # a signal receiver's (another lock's, the hold given back): not the key's
        raise Taken(resource, task_of(busy.holder_user_id)) from None


def adopt(
    claim: Claim,
    lease: float | None = None,
    *,
    wait: bool = True,
    made: list[Held] | None = None,
) -> Held:
    """The worker's side: make the claimed hold this process's for the run (``lease``, the
    setting if None), renewed by the heartbeat. :class:`LockLost` if the claim is not there
    to adopt: adopted already (a message delivered twice), or its queue lease ran out and
    another task took the key. A retry's claim whose run has not ended yet is waited for
    (unless not ``wait``: LockLost). ``made``: the caller's guard, which ends the run
    whatever comes once the hold is in it (an interrupt as this returns)."""
    token = uuid.uuid4().hex
    sent: list[Held | None] = []  # an adoption was sent (None), the hold made of it
    try:
        held = _adopt(claim, lease, wait, token, sent)
        if made is not None:
            made.append(held)
        return held
    except BaseException as failure:
        made = [held for held in sent if held is not None]
        # Its own answer (LockLost: not ours; unavailable, nothing applied) goes as it is.
        # Else (Ctrl-C, SystemExit, a soft time limit raised by a signal handler; a failure
        # that may hide an applied adoption, or one after it landed) nobody will run the
        # task: without a give-back, the key would stay held by a run nobody makes,
        # refusing every enqueue of it until the run lease ran out (or, renewed, for good).
        own = isinstance(failure, LockLost) or (
            isinstance(failure, SemaphoreUnavailable) and not failure.ambiguous and not made
        )
        if sent and not own:
            for held in made:
                stop_renewing(held)
            _withdraw_run(token, claim.resource)
        raise


def _withdraw_run(token: str, resource: str) -> None:
    """Best effort: the run hold ``token`` of ``resource``, which an interrupted adoption may
    have put in the claim's place, given back (conditional on it: refused if it is not there)."""
    steps.withdraw(token, [resource])


def _adopt(
    claim: Claim, lease: float | None, wait: bool, token: str, sent: list[Held | None]
) -> Held:
    from .._engine.core import semaphore

    sem = semaphore(claim.resource, lease=lease, on_commit=False)
    lease_s, _, skew = resolve_timing(lease, 0)
    user_id = USER_PREFIX + claim.task_id
    claimed, announced, stale_ms, nap = claim.token, None, 0, FIRST_NAP
    fence = claim.fence
    while True:
        sent_mono, now_ms = clock.monotonic(), clock.now_ms()
        expires_ms = now_ms + int(lease_s * 1000)
        entry = records.Holder(
            user_id, expires_ms, fence, acquired_ms=now_ms, proc=processes.identity()
        )
        action = claims.adopt_hold(
            claim.resource, claimed, token, entry, announced=announced, stale_ms=stale_ms
        )
        sent.append(None)
        try:
            _send_adoption(action)
            break
        except dynamodb.Refused as refused:
            item = refused.lock
        holders = item.holders if item is not None else {}
        if token in holders:
            break  # our write was applied; its answer was lost and botocore sent it again
        claimed, announced, fence = claim.token, None, claim.fence  # the claim itself, next
        if claim.token in holders:  # ours to adopt now (the run it waited for has ended)
            continue
        announcer = _announcer(item, claim.token)
        if announcer is None:
            raise LockLost(
                claim.resource,
                "its claim is gone: adopted already, or taken by another task after its "
                "queue lease ran out",
            )
        run_token, run = announcer
        stale_ms = clock.now_ms() - int(skew * 1000)
        if run.expires_ms < stale_ms:  # the run that enqueued us died before handing on
            claimed, announced = run_token, claim.token
            # It may only be stalled: take over with a larger fence, as any take-over does.
            fence = max(clock.new_fence(skew), (item.fence if item is not None else 0) + 1)
            continue
        if not wait:
            raise RunNotEnded(claim.resource, "the run that enqueued it has not ended yet")
        time.sleep(nap)  # it runs: wait for its end
        nap = min(nap * 2, LAST_NAP)
    held = Held(
        sem,
        token=token,
        user_id=user_id,
        fences={claim.resource: fence},
        lease=lease_s,
        skew=skew,
        expires_ms=expires_ms,
        sent_mono=sent_mono,
    )
    sent.append(held)
    return _renewed(held)


def _send_adoption(action: dict[str, Any]) -> None:
    """The adoption write, sent again (the same write: its entry, its lease end) after a
    pause while it fails for a transient cause (throttled, another request's transaction, a
    5xx or a dropped connection), for up to ``resend.RELEASE_PATIENCE``: given up at once, the
    task would not run and its claim stay held for nobody for the queue lease, every enqueue
    of the key refused. An earlier attempt applied, its answer lost, refuses the next one:
    the refusal shows our token (the caller's loop). Its trust runs from the first send.
    Also a run's announcement of its retry (:func:`hand_on`), which names our token: given up
    at once, the retry's enqueue failed, and Celery's ``retry()`` drops a task whose retry
    cannot be sent (``Reject(requeue=False)``). Given up, the error raised is ``ambiguous``
    if any attempt was: the last one may never have connected, after an earlier one landed
    (the adoption then withdrawn by :func:`adopt`'s guard, not left holding for nobody)."""
    failures, started, ambiguous = 0, clock.monotonic(), False
    while True:
        try:
            lock_rows.update(action)
            return
        except SemaphoreUnavailable as exc:
            failures += 1
            ambiguous |= exc.ambiguous
            if not resend.paused(exc.transient, failures, started):
                exc.ambiguous = ambiguous
                raise


def _renewed(held: Held) -> Held:
    """The adopted ``held``, renewed by the heartbeat from now on; confirmed first by a
    renewal of our own if its adoption's answer came late (a pause, a slow network): the run
    lease may have run out meanwhile, and another task taken the key and begun its run. As
    an acquire does (core.Acquire.confirmed): LockLost, and the task does not run, if the key
    is not ours any more."""
    from .._engine.core import CONFIRM_SHARE

    margin = (held.lease - held.skew) * CONFIRM_SHARE
    for _ in range(CONFIRM_TRIES):
        if held.seconds_left() >= margin:
            start_renewing(held)
            return held
        # The confirming renewal's answer can come late too (a second pause): trusted only
        # with as much left as the adoption needs; else confirmed again, or given up.
        confirm(held)
    raise too_slow(held.resource, held.lease, held.skew)


def _announcer(item: records.LockItem | None, next_token: str) -> tuple[str, records.Holder] | None:
    """The holder (a run) that announced ``next_token`` as its retry's, if it holds still."""
    holders = item.holders if item is not None else {}
    return next(((t, run) for t, run in holders.items() if run.next_token == next_token), None)


# The unique runs going on in this thread or coroutine, innermost last: (task, claim, hold).
_runs: contextvars.ContextVar[tuple[tuple[str, Claim | None, Held], ...]] = contextvars.ContextVar(
    "dynasem_unique_runs", default=()
)


@contextlib.contextmanager
def running(held: Held, task: str = "", carried: Claim | None = None) -> Iterator[Held]:
    """The run of ``task`` (adopted from ``carried``): its hold is this thread's or
    coroutine's, as a ``with semaphore()`` block's is (``current_hold()``; a ``semaphore()``
    of its key inside re-enters it), and the task's to hand on (:func:`current_run`)."""
    block, runs = Block(held, None), None
    # Opened inside the try: an interrupt as it is entered (a soft time limit) closes it,
    # never leaves it open in the worker's context, where its next tasks run.
    try:
        opened(block, held)
        remember_acquired(held)
        runs = _runs.set((*_runs.get(), (task, carried, held)))
        yield held
    finally:
        if runs is not None:
            _runs.reset(runs)
        close(block)


def inline_retry(carried: Claim) -> Held | None:
    """The run, going on in this thread or coroutine, whose retry ``carried`` is: a retry run
    at once, inside it (Celery's eager mode, django.tasks' ImmediateBackend). Its key is the
    outer run's: the retry does not adopt it (that would wait for the outer run's end), and
    the outer run gives it back at its end as if no retry had been enqueued."""
    for _, _, held in reversed(_runs.get()):
        if held.handed_on == carried.token:
            held.handed_on = None
            return held
    return None


def current_run(task: str, key: str | Claim) -> tuple[Claim, Held] | None:
    """The run of ``task`` on the resource ``key`` (or adopted from the claim ``key``) going
    on in this thread or coroutine, if it is the innermost run: a task enqueued from it (a
    retry) goes on with its key."""
    for name, adopted, held in _runs.get()[-1:]:
        if name == task and adopted is not None and key in (adopted.resource, adopted):
            return adopted, held
    return None


def hand_on(held: Held, carried: Claim, made: list[Claim] | None = None) -> Claim | None:
    """The run ``held`` (adopted from ``carried``) enqueues its retry: announce the retry's
    token and return its claim, which the run's hold becomes when the run ends. None if the
    run has enqueued a retry already (one retry goes on with the key). ``made``: as
    :func:`claim`'s."""
    if held.handed_on is not None:
        return None
    next_token = uuid.uuid4().hex
    try:
        _send_adoption(claims.announce_next(carried.resource, held.token, next_token))
    except dynamodb.Refused:
        raise LockLost(carried.resource, "the run's hold was lost before its retry") from None
    held.handed_on = next_token
    taken = Claim(carried.resource, next_token, held.fence, carried.task_id)
    if made is not None:
        made.append(taken)
    return taken


def end_run(held: Held, queue_lease: float) -> None:
    """The run ends: its hold is given back, or, if it enqueued a retry, becomes the retry's
    claim for ``queue_lease`` (no process, no heartbeat)."""
    if held.handed_on is None:
        held.release()
    else:
        held.become_claim(held.handed_on, queue_lease)


def give_back(taken: Claim) -> None:
    """Free a claimed key now (its task was not enqueued, or was revoked); quietly, since its
    queue lease ends it anyway. A retry's claim whose run goes on is withdrawn from the run's
    entry: the run gives the key back at its end instead of keeping it for the retry."""
    try:
        for _ in range(3):
            try:
                _adopt_and_release(taken)
                return
            except RunNotEnded:
                if _unannounce(taken):
                    return
            # The run ended meanwhile: its hold is the retry's claim now, adopted next.
    except LockLost:
        pass
    except Exception as exc:
        if steps.from_receiver(exc):  # given back: only a lock_released receiver raised
            message = "dynasem: a lock_released receiver raised giving back %r: %r"
            logger.warning(message, taken.resource, exc, extra=taken.facts("receiver_failed", exc))
            return
        logger.warning(
            "dynasem: could not give back %r",
            taken.resource,
            exc_info=True,
            extra=taken.facts("give_back_failed"),
        )


def _adopt_and_release(taken: Claim) -> None:
    """The claim ``taken`` adopted and given back at once. The adopted hold is in our guard
    before ``adopt`` returns: an interrupt (a signal handler's: a web worker's timeout, a
    soft time limit) as it returns, or before its release began, gives it back too, never
    leaves it renewed by its heartbeat for nobody, every enqueue of the key refused."""
    adopted: list[Held] = []
    try:
        adopt(taken, wait=False, made=adopted)
        for held in adopted:
            held.release()
    except BaseException:
        for held in adopted:
            if not held.released:  # a release that began has given it back, or says why not
                give_back_unused(held)
        raise


def _unannounce(taken: Claim) -> bool:
    """The retry ``taken`` withdrawn from the entry of the run that announced it; False if
    that run holds no more (it ended: its hold became the retry's claim)."""
    announcer = _announcer(lock_rows.get(taken.resource, consistent=True), taken.token)
    if announcer is None:
        return False
    try:
        # Sent again while it fails for a transient cause, as the adoption before it is:
        # left announced (a throttle of the run's busy row), the run's hold becomes the
        # claim of a retry that was revoked, every enqueue of the key refused for the queue
        # lease. Our own write applied, its answer lost, refuses the next: False, and the
        # adoption that follows finds the claim gone.
        _send_adoption(claims.withdraw_next(taken.resource, announcer[0], taken.token))
    except dynamodb.Refused:
        return False
    return True


# What a framework's unique task does at enqueue and around its run (Celery's UniqueTask,
# django.tasks' UniqueTask), the same for both.


def check_leases(task: str, queue_lease: Any, run_lease: Any, *, against_skew: bool = True) -> None:
    """A TypeError or ValueError naming ``task`` and the lease, unless ``queue_lease`` and
    ``run_lease`` (None: the LEASE setting) are leases a hold can take, and (``against_skew``)
    longer than ``CLOCK_SKEW``. Asked when a task is declared and before its key is claimed:
    a lease refused only by the worker's adoption left the key claimed for nobody for the
    queue lease, every enqueue of it refused meanwhile."""
    leases = {"queue_lease": queue_lease, "run_lease": run_lease}
    for name, lease in leases.items():
        if lease is None and name == "run_lease":
            continue
        seconds = check_lease(lease, f"{task}: {name}")
        skew = skew_setting() if against_skew else 0.0
        if seconds <= skew:
            raise ValueError(
                f"{task}: {name} ({seconds:g}s) must be longer than DYNASEM['CLOCK_SKEW'] "
                f"({skew:g}s): a holder trusts its lease only until lease - CLOCK_SKEW"
            )


def claim_for(
    task: str,
    resource: str,
    task_id: str,
    queue_lease: float,
    run: tuple[Claim, Held] | None,
    made: list[Claim] | None = None,
) -> Claim | None:
    """The claim the message of ``task`` carries: a retry's, sent from its own ``run``, goes
    on with that run's key (None for a second retry of one run: the first has the key);
    another takes ``resource`` for ``task_id``. :class:`Taken` (logged) if a task holds it.
    ``made``: the enqueue's guard, which has the claim before this returns: an interrupt
    as it returns (a signal handler's) withdraws it too (:func:`withdraw_made`)."""
    if run is not None:
        return hand_on(run[1], run[0], made)
    try:
        return claim(resource, task_id, queue_lease, made)
    except Taken as busy:
        holder = f"task {busy.task_id}" if busy.task_id else "a hold that is not a task's"
        logger.info(
            "dynasem: %s not enqueued: %r is held by %s",
            task,
            resource,
            holder,
            extra=facts(resource, outcome="not_enqueued", task=task, holder_task_id=busy.task_id),
        )
        raise


def withdraw(claimed: Claim, run: tuple[Claim, Held] | None) -> None:
    """The message carrying ``claimed`` (from :func:`claim_for`) could not be sent: the run
    gives its key back at its end, as if it had not tried (the announcement stays in its
    entry, unused), or the claimed key is freed now."""
    if run is not None:
        run[1].handed_on = None
    else:
        give_back(claimed)


def withdraw_made(made: list[Claim], run: tuple[Claim, Held] | None = None) -> None:
    """The claims an enqueue made (``claim_for``'s ``made``), withdrawn as :func:`withdraw`
    does: its message was not sent. A retry's from ``run``, or (None) from the run going on
    here that hands its key on to it (an enqueue interrupted before it knew its run)."""
    for claimed in made:
        if run is None:
            runs = [(adopted, held) for _, adopted, held in _runs.get() if adopted is not None]
            run = next(((a, h) for a, h in runs if h.handed_on == claimed.token), None)
        withdraw(claimed, run)


def start_run(
    task: str,
    carried: Claim,
    run_lease: float | None,
    *,
    wait: bool = True,
    made: list[Held] | None = None,
) -> Held | None:
    """The worker starts ``task``: its claim adopted, or None (logged) if the key is not the
    task's any more, and the task must not run. Not ``wait``: :class:`RunNotEnded` while the
    run that enqueued it goes on. ``made``: as :func:`adopt`'s."""
    try:
        return adopt(carried, run_lease, wait=wait, made=made)
    except RunNotEnded:
        raise
    except LockLost as lost:
        logger.warning(
            "dynasem: %s (task %s) not run: its key %r is not its own (%s)",
            task,
            carried.task_id,
            carried.resource,
            lost.reason,
            extra=carried.facts("not_run", lost.reason, task),
        )
        return None


def run(
    task: str, options: Any, carried: Claim | None, call: Callable[[], Any], refused: Any = None
) -> Any:
    """The worker runs ``task`` (its ``options``: ``run_lease``, ``queue_lease``) from a
    message carrying ``carried``: ``call()`` inside its run (:func:`start_run`,
    :func:`running`, :func:`finish_run`), or ``refused`` if the key is not the task's any
    more. Without a claim (called directly, sent another way) or as a retry run at once
    inside the run that enqueued it (:func:`inline_retry`: the outer run's key covers it),
    ``call()`` as it is."""
    if carried is None or inline_retry(carried) is not None:
        return call()
    # The adopted hold in our guard before start_run returns: an interrupt (a task's soft
    # time limit, raised by a signal handler) before the run begins ends it too, never
    # leaves it renewed for nobody, the key refused to every enqueue.
    started: list[Held] = []
    try:
        held = start_run(task, carried, options.run_lease, made=started)
        if held is None:
            return refused
        with running(held, task, carried):
            return call()
    finally:
        for adopted in started:
            finish_run(task, carried, adopted, options.queue_lease)


def finish_run(task: str, carried: Claim, held: Held, queue_lease: float) -> None:
    """The run of ``task`` ends (:func:`end_run`); the task's own outcome stands if the key
    cannot be given back (logged): its lease ends it."""
    try:
        end_run(held, queue_lease)
    except Exception as exc:
        finish_failed(task, carried, exc)


def finish_failed(task: str, carried: Claim, exc: Exception) -> None:
    """:func:`finish_run`'s failure (its give-back's, or a lock_released receiver's that an
    async run sends after it): logged, the task's own outcome stands."""
    logger.warning(
        "dynasem: %s could not give back %r: %s",
        task,
        carried.resource,
        exc,
        extra=carried.facts("give_back_failed", exc, task),
    )
