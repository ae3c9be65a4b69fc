"""The lock logic: take, renew and give back holds; fences; waiting.

Speaks in lock terms only; every request is built and sent by :mod:`dynasem._storage`.

Safety rules kept here:

* a holder trusts its lease until ``sent + lease - CLOCK_SKEW`` on its own monotonic clock
  (``sent``: when the write that set the lease left); others take it over once the stored end
  is ``CLOCK_SKEW`` past on theirs, or once its process is proven dead (``processes``);
* a hold we only heard of (a read, a push, a refused write's old item showing our token) is
  worth no more than its stored lease end minus ``CLOCK_SKEW`` (a push: nor more than its
  arrival plus our lease): when that is near, we confirm it with a renewal of our own before
  returning it, and no hold is returned whose deadline, read from the clock at the return,
  has passed: the process may have been paused anywhere on the way;
* fences are microseconds of wall time plus ``CLOCK_SKEW``, written only if larger than the
  stored fence (else the stored fence + 1): strictly increasing per resource, and still so
  after the row was reaped, as long as clocks agree within ``CLOCK_SKEW``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import sys
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from .. import _clock as clock
from .._observability import metrics, telemetry
from .._storage import dynamodb, lock_rows, permit_items, queue_entries, records
from .._storage.records import Mode
from .._transactions import commit, fencing
from ..conf import settings
from ..exceptions import SemaphoreBusy, SemaphoreUnavailable
from . import (
    arguments,
    coalescing,
    handover,
    permits,
    processes,
    push,
    queue,
    reader_hold,
    readers,
    take,
)
from .decorators import Decoration, lock_callable
from .hold import (
    Held,
    adelivering,
    announced,
    delivering,
    exit_cut_short,
    give_back_unused,
)
from .late_handover import leave_queue
from .lockspec import Attempt
from .queue import Blocking
from .reentry import (
    Block,
    as_another_process,
    close,
    current_hold,
    exit_failed,
    held_here,
    kept_for_commit,
    leave,
    left,
    opened,
    pending_hold,
    reentered,
    remember_acquired,
)
from .steps import (
    Request,
    Sleep,
    Steps,
    Write,
    announced_after,
    caller_in_transaction,
    on_caller,
    release_to_end,
    run_async,
    run_sync,
    sync_caller,
    withdraw,
)

__all__ = ["Held", "Semaphore", "current_hold", "semaphore"]

# Re-tries of a write that failed in transit, however short the wait.
MIN_TRANSIENT_RETRIES = 2
# A hold is confirmed by a renewal of our own before it is returned when less than this share
# of its trusted window (lease - CLOCK_SKEW) is left, whether we only heard of it or our own
# write's answer came late: the heartbeat would renew that soon anyway, and a block must not
# begin with a hold that is lost before the heartbeat's renewal can land.
CONFIRM_SHARE = 1 / 3


class Semaphore:
    """A distributed semaphore on DynamoDB: a context manager (``with``), an async context
    manager (``async with``) and a decorator of views, functions, methods and tasks. Build it
    with ``semaphore()``, which takes the same arguments. Entering it acquires (see
    ``acquire()``) and gives the ``Held`` hold to ``as``; leaving the block releases it."""

    # The sender of every signal about its holds (subclasses included), as before the split.
    signal_sender: ClassVar[type[Semaphore]]

    def __init__(
        self,
        resource: Any,
        *,
        limit: int = 1,
        shared: bool = False,
        user: Any = None,
        lease: float | None = None,
        wait: float | None = None,
        on_busy: Callable[..., Any] | None = None,
        fair: bool | None = None,
        on_commit: bool = True,
        using: str | None = None,
        max_hold: float | None = None,
        fence_db: bool = False,
        coalesce: bool = False,
        metrics_name: str | None = None,
    ):
        # The arguments as given but the resource, holder and name (here, before any other
        # local): a decorated callable's lock for one call is made of them (with_resource).
        self._options = {
            name: value
            for name, value in locals().items()
            if name not in ("self", "resource", "user", "metrics_name")
        }
        self.resources: list[str] = (
            [] if callable(resource) else arguments.check_resources(resource)
        )
        self.limit = arguments.check_limit(limit, shared)
        arguments.check_several(self.resources, self.limit, shared)
        self.shared = shared
        self.user = user
        if user is not None:
            arguments.user_id_of(user)  # type check now, not at the first request
        self.lease = None if lease is None else arguments.check_lease(lease)
        self.wait = None if wait is None else arguments.check_wait(wait)
        # What only the decorator uses: the key template (maybe a callable) and on_busy.
        self.decoration = Decoration(resource, on_busy)
        if fair is not None and not isinstance(fair, bool):
            raise TypeError(f"fair must be True, False or None (the setting), not {fair!r}")
        if fair and isinstance(resource, list | tuple) and len(resource) > 1:
            raise ValueError(
                "fair=True takes one resource: waiting in several queues at once could deadlock"
            )
        self._fair = fair
        # Give back after the transaction commits (transactions.py).
        self.on_commit = arguments.check_flag(on_commit, "on_commit")
        self.using = commit.check_using(using)
        # Renewed for at most this long, then lost: a hung holder cannot keep it forever.
        self.max_hold = None if max_hold is None else arguments.check_seconds(max_hold, "max_hold")
        # Each block runs in a transaction of `using` whose first statement writes the fence.
        if arguments.check_flag(fence_db, "fence_db"):
            fencing.check_fenceable(self.mode, resource)
        self.fence_db = fence_db
        # Busy: register as the next run, or return at once if one is registered.
        if arguments.check_flag(coalesce, "coalesce"):
            coalescing.check_coalescing(self.mode, resource, self.wait)
        self.coalesce = coalesce
        # Taken for another process (dynasem._background.unique): no identity of ours is recorded.
        self.detached = False
        # The holds a decorated call's acquire succeeds (with_resource): waited out, not refused.
        self.after: frozenset[str] = frozenset()
        # The lock's name in metrics and spans (telemetry.py): never the raw key by default.
        self.metrics_name = (
            None if metrics_name is None else arguments.check_resource(metrics_name, "metrics_name")
        )

    @property
    def fair(self) -> bool:
        """Whether waiters queue first come, first served: ``fair=`` if it was given, else the
        FAIR setting; never for several resources at once."""
        if self._fair is not None:
            return self._fair
        if len(self.resources) > 1:
            return False
        return settings.FAIR  # a TypeError unless a bool: "false" is no True

    # -- derived -----------------------------------------------------------------------------

    @property
    def resource(self) -> str:
        """The resource (with several, the first)."""
        return self.resources[0]

    @property
    def mode(self) -> Mode:
        if self.shared:
            return Mode.SHARED
        return Mode.EXCLUSIVE if self.limit == 1 else Mode.COUNTING

    def __repr__(self) -> str:
        return f"<Semaphore {self.decoration.resource!r} limit={self.limit} shared={self.shared}>"

    # -- acquiring ---------------------------------------------------------------------------

    def _acquire_steps(self, wait: float | None = None, busy_signal: bool = True) -> Steps[Held]:
        """The acquire loop as a generator of steps (a request to send, a pause: see
        :mod:`dynasem._engine.steps`), so one loop serves the sync and the async driver.
        ``busy_signal=False``: a give-up raises ``SemaphoreBusy`` without ``lock_busy`` (a
        coalesced call's wait as the next run: its first attempt sent it)."""
        if self.decoration.is_callable:
            raise TypeError(
                "a callable resource only works when the semaphore decorates a callable; "
                "pass a str (or a list of str) to use it as a context manager"
            )
        if (again := pending_hold(self)) is not None:
            return again  # ours already, until this transaction ends
        if (inner := reentered(self)) is not None:
            return inner  # this thread or task holds it already: a nested acquire
        if not as_another_process.get():  # (held_elsewhere, a unique task's claim: not ours)
            fencing.check_not_fenced(self.resources)  # else it could wait on who waits on us
        lease, wait_s, skew = arguments.resolve_timing(
            self.lease, self.wait if wait is None else wait
        )
        run = Attempt(
            self,
            token=uuid.uuid4().hex,
            user_id=arguments.user_id_of(self.user),
            proc=None if self.detached else processes.identity(),
            lease=lease,
            skew=skew,
            margin=(lease - skew) * CONFIRM_SHARE,
            deadline=clock.monotonic() + wait_s,
            after=self.after,
        )
        try:
            if permits.applies(self):
                # A counting semaphore of many permits: its holders are in items of their own.
                held = yield from permits.acquire_steps(run)
            else:
                held = yield from Acquire(run).steps()
        except SemaphoreBusy as exc:
            if busy_signal:
                yield queue.busy_announced(run, exc)  # lock_busy, before the caller has it
            raise
        finally:
            push.forget(run.token)  # a push that comes now is for a wait that is over
        if (acquired := announced(held)) is not None:
            yield acquired  # lock_acquired, before the caller has the hold
        return held

    def acquire(self) -> Held:
        """Take the semaphore, waiting up to ``wait`` seconds, and return the hold (a
        ``Held``). Raises ``SemaphoreBusy`` when it is still busy after that."""
        return delivering(self._measured)

    def _measured(self) -> Held:
        return telemetry.acquire(self, self._acquire) if telemetry.ON else self._acquire()

    def _acquire(self) -> Held:
        if self.coalesce:
            held = coalescing.acquire(
                self, lambda w, first: run_sync(self._acquire_steps(w, first))
            )
        else:
            held = run_sync(self._acquire_steps())
        remember_acquired(held)
        return held

    async def aacquire(self) -> Held:
        """``acquire()`` for async code: requests run in a thread of dynasem's own executor
        (never the event loop's default one); waits, pushed hand-overs included, are awaited
        on the loop and hold no thread."""
        return await adelivering(self._ameasured)

    async def _ameasured(self) -> Held:
        if telemetry.ON:
            return await telemetry.aacquire(self, self._aacquire)
        return await self._aacquire()

    async def _aacquire(self) -> Held:
        # Asked only under async_to_sync, and only of a first acquire: a nested one follows
        # its outer hold, and asking could wait behind a sync call waiting for that very hold.
        caller = self.on_commit and sync_caller() is not None
        outer = held_here(self) if caller else None
        follows = caller and outer is None and await caller_in_transaction(self.using)
        if self.coalesce:
            held = await coalescing.aacquire(
                self, lambda w, first: run_async(self._acquire_steps(w, first))
            )
        else:
            held = await run_async(self._acquire_steps())
        held.follows_caller = held.follows_caller or follows  # re-entered: the outer's too
        if outer is not None and not self._followed_by(outer):
            # Its work may commit in a transaction of the caller's that the outer hold's
            # give-back does not wait for: kept till that ends, as a sync nested acquire is.
            # Asked though it may wait behind a sync call waiting for this hold (till that
            # call's wait ends): given back before its work commits is worse.
            await on_caller(functools.partial(kept_for_commit, outer, self))
        remember_acquired(held)
        return held

    def _followed_by(self, outer: Held) -> bool:
        """Whether ``outer``'s give-back waits for the transaction of this semaphore's
        database that the caller may be in (the same database, asked at its acquire)."""
        had = outer.semaphore
        return had.on_commit and commit.database(had.using) == commit.database(self.using)

    # -- context managers --------------------------------------------------------------------

    def __enter__(self) -> Held:
        block = Block(self, sys._getframe(1))  # the block's frame
        held = delivering(lambda: opened(block, self.acquire()))
        if self.fence_db:
            fencing.begin(block, self.using, undo=lambda: leave(close(block).value, True))
        return held

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        block = left(self, sys._getframe(1), "semaphore")
        held = block.value
        depth = getattr(held, "outer", held).depth  # plain attributes: no signal lands here
        try:
            if self.fence_db:
                fencing.end(block, exc_type, exc, tb, undo=lambda: leave(held, True))
            leave(held, exc_type is not None)
        except BaseException as failure:
            exit_cut_short(held, depth, failure)
            raise

    async def __aenter__(self) -> Held:
        if self.fence_db:
            raise fencing.no_async()
        task = asyncio.current_task()
        # The block's frame (``async with`` runs us at once), and its task, weakly.
        block = Block(self, sys._getframe(1), None if task is None else weakref.ref(task))
        return await adelivering(lambda: self._aenter(block))

    async def _aenter(self, block: Block) -> Held:
        return opened(block, await self.aacquire())

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        block = left(self, sys._getframe(1), "semaphore")
        held = block.value
        if exc_type is GeneratorExit and block.task is not None and block.task() is None:
            # Its task was destroyed pending (its loop closed without cancelling it): the
            # garbage collector closes the coroutine, in another context than the task's,
            # maybe with no loop running: nothing can be awaited. Given back here and now;
            # else renewed for nobody while we live. (A block closed by ``aclose()`` in its
            # own live task leaves its hold as usual.)
            give_back_unused(held)
            return
        raised = exc_type is not None
        released = release_to_end(leave, held, raised, on_caller=held.follows_caller)
        await announced_after(released, functools.partial(exit_failed, held) if raised else None)

    # -- decorator ---------------------------------------------------------------------------

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate a view, a function, a method or a task: each call takes the semaphore for
        its run, on the key its template makes from the call's arguments. A busy view answers
        423 (``busy_response``); anything else raises ``SemaphoreBusy``, unless ``on_busy``
        says otherwise."""
        return lock_callable(self, func)

    def with_resource(
        self, resource: Any, user: Any, after: frozenset[str] = frozenset()
    ) -> Semaphore:
        """A copy for one call of a decorated callable, on that call's resource(s) and
        holder (the decorator uses it), waiting out the holds ``after`` names (a task's retry:
        the holds of the run it was sent from)."""
        copy = Semaphore(resource, user=user, **self._options)
        copy.after = after
        # Named like the decorator (its template), not by this call's key; not checked as a
        # resource is: a derived name must never refuse a call.
        if telemetry.ON:
            copy.metrics_name = self.metrics_name or metrics.template_name(self.decoration.resource)
        return copy


Semaphore.signal_sender = Semaphore


class Acquire:
    """The acquire loop of holds kept in the resources' rows (exclusive; counting, of a few
    permits; shared, of a few readers), of one resource or of several, all or none. In
    phases: take (plan each resource from what we saw; read what a plan must know first;
    send the write), then, busy, wait (write dead readers off, wait in line or back off) or
    give up once the wait is over."""

    def __init__(self, run: Attempt):
        self.run = run
        self.resources = list(run.sem.resources)
        self.seen = readers.last_seen(run.sem)  # empty unless it last had reader items
        # A queued waiter's timing: request round trip, looks found too early.
        self.pace = queue.Pace()
        self.sleeps = self.replans = self.failures = 0
        self.confirm = False  # a hold of ours we saw must be renewed before it is returned
        # A hold of ours we see must be confirmed under a fresh fence: a take of ours may have
        # landed long after it drew its fence (a pause before the send, an answer that came
        # late or never), on a row reaped meanwhile and made anew by that very take
        # (``attribute_not_exists(fence)``): its fence may be below an earlier holder's
        # (:func:`take.may_be_reaped`). ``drawn``: when the first take of ours whose answer never
        # came drew it (monotonic, wall ms).
        self.refence = False
        self.drawn: tuple[float, int] | None = None
        # What an unanswered write of ours may have taken (an ambiguous failure), by what
        # gives it back: given back if the acquire fails, whatever its last failure was.
        self.unanswered: list[tuple[list[str], Callable[[], None] | None]] = []
        self.given_back = False  # they were, as the acquire failed (give_back_tried)

    def steps(self) -> Steps[Held]:
        try:
            yield from self.first_look()
            while True:
                outcome = yield from self.try_take()
                if isinstance(outcome, Held):
                    return outcome
                if outcome is not None:
                    yield from self.wait(outcome)
        except (ValueError, SemaphoreUnavailable):
            # Held with another limit or mode, or DynamoDB failed a request of our wait (a
            # look throttled past the deadline, a refusal): give back what an unanswered try
            # may have taken, and leave the queue now, rather than stand in the way of every
            # waiter behind us until our entry's lease runs out (a releaser would hand the
            # lock to our entry, or our word, and nobody use it).
            yield from self.give_back_tried(self.resources)
            yield from self.leave_refused()
            raise

    def first_look(self) -> Steps[None]:
        """Before the first take: join the queue at once, or read the row, when a recent
        acquire found the resource busy."""
        run, first = self.run, self.resources[0]
        recently = queue.queued_recently.get(first, -math.inf)
        if (
            len(self.resources) == 1
            and run.sem.mode == Mode.EXCLUSIVE
            and run.remaining() > 0
            and clock.monotonic() - recently < queue.GUESS_BUSY_FOR
        ):
            # Busy last time we looked, a short while ago? Then most likely busy now: join
            # the queue in our first write (it is refused if the lock is free: we take it).
            if_busy_ms = run.stale_ms(clock.now_ms())
            self.seen[first] = yield from queue.join_queue(run, first, None, self.pace, if_busy_ms)
        elif (
            len(self.resources) == 1
            and run.remaining() <= 0
            and not self.seen
            and queue.busy_lately(first)
        ):
            # May not wait, and found busy a short while ago: most likely busy now. A
            # consistent read says so for a read unit; a refused take costs a write unit,
            # and competes with the holder's own writes for the key's partition.
            self.seen[first] = yield Request(functools.partial(lock_rows.get, first))

    def leave_refused(self) -> Steps[None]:
        """Leave the queue of a resource we may not take; a hand-over that reached us
        meanwhile is handed on."""
        pace = self.pace
        leave = queue.leaving(self.run, (pace.queue_id, pace.ticket or 0))
        pace.ticket = None
        if leave is not None:
            yield Request(leave)

    # -- take --------------------------------------------------------------------------------

    def try_take(self) -> Steps[Held | dict[str, Blocking] | None]:
        """One take. Returns the hold; or who is in our way, by resource (busy); or None:
        plan again at once (from what a read or a refusal showed)."""
        run, seen, pace = self.run, self.seen, self.pace
        push_cap, pace.push_cap = pace.push_cap, None  # the state came by push
        sent_mono, now = clock.monotonic(), clock.now_ms()
        stale = run.stale_ms(now)
        entry = run.holder(now, clock.new_fence(run.skew), shared=run.sem.shared)
        if self.confirm or (push_cap is not None and push_cap - sent_mono < run.margin):
            confirm_below = 2**63
        else:
            confirm_below = now + int((run.skew + run.margin) * 1000)
        if len(self.resources) > 1 and readers.items_for(run.sem, seen, stale):
            # Readers of several resources, one of them among many readers: items. Unless
            # each row shows us among its readers already (a join of ours applied, its
            # answer lost: kept, planned below). Else what a join of ours may have left in
            # the rows goes first: a hold in items would never renew or give it back.
            mine = [r for r, row in seen.items() if row is not None and run.token in row.holders]
            if len(mine) < len(self.resources):
                stray = set(mine) | {r for rs, undo in self.unanswered if undo is None for r in rs}
                self.unanswered.clear()
                if stray:
                    yield Request(functools.partial(withdraw, run.token, sorted(stray)))
                return (yield from readers.acquire_many(run))
        if pace.ticket is not None and queue.before_ticket(seen.get(self.resources[0]), pace):
            # Queued, and the row known only as it was before our ticket (or not at all): a
            # plan from it would take it past every waiter ahead (an eventually consistent
            # look can show such a row; the simulator's order check found it). Read it first.
            first = self.resources[0]
            fresh = queue.read_for_ticket(first, seen.get(first), pace, run.deadline)
            seen[first] = yield from fresh
            return None
        if queue.passed(seen.get(self.resources[0]), pace.queue_id, pace.ticket):
            pace.ticket = None  # our turn went by (or the row is new): join again
        if self.drawn is not None and take.may_be_reaped(*self.drawn, self.run.skew):
            self.refence = True
        plans = {
            r: take.plan(
                run.sem,
                r,
                seen.get(r),
                run.token,
                entry,
                stale,
                confirm_below,
                pace.ticket,
                refence=self.refence,
            )
            for r in self.resources
        }
        if any(p.load is not None for p in plans.values()):
            pace.push_cap = push_cap
            yield from self.read_ahead(plans)
            return None
        blocked = {r: p.busy for r, p in plans.items() if p.busy is not None}
        if blocked:
            handed = yield from self.hand_on(plans)
            return None if handed else blocked  # handed on: plan again from what it wrote
        actions = {r: p.action for r, p in plans.items() if p.action is not None}
        if not actions:
            held = take.held_if_trusted(run, plans, seen, sent_mono=None, push_cap=push_cap)
            return (yield from self.confirmed(held, self.resources))
        return (yield from self.write(plans, actions, entry, sent_mono))

    def hand_on(self, plans: dict[str, take.Plan]) -> Steps[bool]:
        """Busy: hand each lock whose holder we proved dead to the first waiters ahead of us
        (a plan's ``hand_on``), and push them the row as written; we wait on for our own
        turn. True: sent (the rows as written, or as they refused it: plan again); False:
        none to send (or past MAX_REPLANS refusals), or failed in transit (maybe applied: it
        takes nothing of ours): wait as busy."""
        handing = {r: p for r, p in plans.items() if p.hand_on is not None}
        if not handing or self.replans > queue.MAX_REPLANS:
            return False
        for resource, plan in handing.items():
            assert plan.hand_on is not None
            send = functools.partial(lock_rows.update, plan.hand_on, return_new=True)
            try:
                after = yield Request(send)
            except dynamodb.Refused as refused:
                self.seen[resource] = refused.lock or records.LockItem()
                self.replans += 1
                # Applied, its answer lost: botocore's re-send was refused by the row it
                # wrote. The heirs hold: tell them, or they learn it at their next look.
                after = refused.lock if refused.retried else None
                if after is None or any(t not in after.holders for t, _ in plan.heirs):
                    continue
            except SemaphoreUnavailable:
                return False
            else:
                self.seen[resource] = after
            if after is not None:
                heirs = plan.heirs
                yield Request(functools.partial(handover.push_heirs, resource, heirs, after))
        return True

    def read_ahead(self, plans: dict[str, take.Plan]) -> Steps[None]:
        """Who waits ahead of us (or holds the permits)? One read, then plan again.
        Throttled (a hot key): no news, after a pause; never the caller's failure while its
        wait lasts (issue 40)."""
        for r, p in plans.items():
            old = self.seen.get(r)
            if p.load is None or old is None:
                continue
            if old.slots_used is not None and not old.permits_read:
                stale = self.run.stale_ms(clock.now_ms())
                read = functools.partial(permit_items.fenced_permits, old, stale)
            else:
                read = functools.partial(queue_entries.load_entries, old, p.load)
            self.seen[r] = yield from queue.patient_read(read, old, self.pace, self.run.deadline)

    def write(
        self,
        plans: dict[str, take.Plan],
        actions: dict[str, dict[str, Any]],
        entry: records.Holder,
        sent_mono: float,
    ) -> Steps[Held | dict[str, Blocking] | None]:
        """Send the take: an update of one row, or one transaction of several (all or
        none). Landed: the hold, if its lease can still be trusted long enough. Refused,
        plan again from what the refusal showed."""
        run, seen, acting = self.run, self.seen, list(actions)
        write = self.take_write(plans, actions)
        undo = write.undo
        try:
            after = yield write
        except dynamodb.Refused as refused:
            seen[acting[0]] = refused.lock or records.LockItem()
            self.slow_take(plans, acting, entry, sent_mono, seen[acting[0]])  # re-sent, ours?
        except dynamodb.Cancelled as cancelled:
            # The items the refusals showed; none refused: another transaction was on
            # these items: step aside briefly.
            reasons = zip(acting, cancelled.reasons, strict=False)
            refusals = {r: old for r, (code, old) in reasons if code == "ConditionalCheckFailed"}
            seen.update({r: old or records.LockItem() for r, old in refusals.items()})
            if not refusals:
                yield Sleep(random.uniform(0.002, 0.02))
        except SemaphoreUnavailable as exc:
            self.unanswered_take(exc, plans, acting, (sent_mono, entry.acquired_ms))
            yield from self.failed(exc, acting, undo)
            return None
        else:
            if len(self.resources) == 1:
                seen[acting[0]] = after
                queue.busy_recently.pop(acting[0], None)
                if not self.pace.enqueued:  # taken at once: free, this time
                    queue.queued_recently.pop(acting[0], None)
            if self.slow_take(plans, acting, entry, sent_mono):
                return (yield from self.confirmed(None, acting))  # plan again from ``after``
            if plans[acting[0]].reader and after is not None:
                now, expires_ms = entry.acquired_ms, entry.expires_ms
                admitted = readers.admitted(
                    run, after, expires_ms=expires_ms, now_ms=now, sent_mono=sent_mono
                )
                held = yield from admitted
            else:
                held = take.held_if_trusted(run, plans, seen, sent_mono=sent_mono, push_cap=None)
            return (yield from self.confirmed(held, acting))
        self.replans += 1
        if self.replans <= queue.MAX_REPLANS:
            return None  # the refusal told us the state: plan again from it at once
        return (yield from self.refused_too_often(acting))

    def take_write(self, plans: dict[str, take.Plan], actions: dict[str, dict[str, Any]]) -> Write:
        """The take's write: an update of one row, or one transaction of several (all or
        none), with what gives back what it may have taken."""
        acting = list(actions)
        if len(actions) > 1:
            send: Callable[[], Any] = functools.partial(lock_rows.transact, list(actions.values()))
            return Write(send, self.run.token, acting)
        resource, plan = acting[0], plans[acting[0]]
        send = functools.partial(lock_rows.update, actions[resource], return_new=True)
        landed = None
        if plan.reader:
            # Applied, its item not sent (cancelled meanwhile): the count is ours.
            landed = functools.partial(
                reader_hold.count_down, resource, plan.epoch, forget=self.run.token
            )
        undo = self.admission_undo(resource, plan)
        return Write(send, self.run.token, acting, undo=undo, landed=landed)

    def slow_take(
        self,
        plans: dict[str, take.Plan],
        acting: list[str],
        entry: records.Holder,
        sent_mono: float,
        refusal: records.LockItem | None = None,
    ) -> bool:
        """Whether the take we sent (``entry``, drawn at ``sent_mono``; not a renewal, nor a
        reader's admission) may have landed, its answer or a ``refusal`` showing our token
        late, on a row reaped since its fence was drawn (:func:`take.may_be_reaped`): then its hold
        is confirmed under a fresh fence before it is returned (``refence``). A renewal that
        confirmed one ends it."""
        if all(plans[r].renewal for r in acting):
            if self.refence and refusal is None:
                self.refence, self.drawn = False, None  # confirmed under a fresh fence
            return False
        if any(plans[r].reader for r in acting):
            return False
        if refusal is not None and self.run.token not in refusal.holders:
            return False
        if not take.may_be_reaped(sent_mono, entry.acquired_ms, self.run.skew):
            return False
        self.refence = True
        return True

    def unanswered_take(
        self,
        exc: SemaphoreUnavailable,
        plans: dict[str, take.Plan],
        acting: list[str],
        drawn: tuple[float, int],
    ) -> None:
        """A take whose answer never came may have landed: a hold of ours seen once a row may
        have been reaped since its fence was drawn is confirmed under a fresh one."""
        if exc.ambiguous and self.drawn is None and not any(plans[r].renewal for r in acting):
            self.drawn = drawn

    def refused_too_often(self, acting: list[str]) -> Steps[dict[str, Blocking] | None]:
        """Past MAX_REPLANS refusals: busy. Unless the rows refused show our token (a write
        of ours applied, its answer lost, refused by itself on botocore's re-send): ours,
        planned once more to keep it; still not taken then, withdrawn, never left behind."""
        token, seen = self.run.token, self.seen
        mine = [r for r in acting if (row := seen.get(r)) is not None and token in row.holders]
        if mine and self.replans <= queue.MAX_REPLANS + 2:
            return None
        if mine:
            yield Request(functools.partial(withdraw, token, mine))
        return {r: {} for r in self.resources}

    def admission_undo(self, resource: str, plan: take.Plan) -> Callable[[], None] | None:
        """What gives back an admission to a reader item (``plan``'s) whose write may have
        been applied: its reader counted down, if the row's mark is still ours (no item was
        written yet). None: the take is a holder entry, withdrawn by our token."""
        if not plan.reader:
            return None
        token, since, skew = self.run.token, clock.monotonic(), self.run.skew
        # The admission's fence is counted up by the write: unknown here. Any is barred (the
        # acquire is over: its token is admitted no more).
        barred = reader_hold.BAR_ANY
        return functools.partial(
            reader_hold.undo, resource, plan.epoch, token, since=since, skew=skew, fence=barred
        )

    def failed(
        self, exc: SemaphoreUnavailable, acting: list[str], undo: Callable[[], None] | None = None
    ) -> Steps[None]:
        """A write failed in transit. An ambiguous failure (5xx, timeout) may hide an applied
        write: the same write again (same token) is refused by our own hold, which tells us
        so. Give it a few tries even past the wait budget, then withdraw what may be ours
        (``undo``: an admission's). A throttled or unconnected request was never applied."""
        self.failures += 1
        if exc.ambiguous:
            self.unanswered.append((acting, undo))
        out_of_time = self.run.remaining() <= 0 and (
            not exc.ambiguous or self.failures > MIN_TRANSIENT_RETRIES
        )
        if not exc.transient or out_of_time:
            yield from self.give_back_tried(acting)
            raise exc
        yield Sleep(min(queue.backoff(self.failures), max(0.05, self.run.remaining())))

    def give_back_tried(self, acting: list[str]) -> Steps[None]:
        """The acquire fails: an earlier try may have been applied, its answer lost, whatever
        the last failure was (a write never sent, a read throttled past the wait): what it
        took is given back (conditional on our token); so is a hold of ours we saw in the
        rows ``acting`` (handed to us, or a take applied unanswered) that a failed write was
        to confirm. Once: the loop's own answer passes by the driver's clean-up as it is."""
        if self.given_back:
            return
        self.given_back = True
        token, seen = self.run.token, self.seen
        rows = sorted(
            {r for rs, u in self.unanswered if u is None for r in rs}
            | {r for r in acting if (row := seen.get(r)) is not None and token in row.holders}
        )
        undos: list[Callable[[], object]] = [
            *{id(u): u for _, u in self.unanswered if u is not None}.values()
        ]
        if rows:
            undos.append(functools.partial(withdraw, token, rows))
        for undo in undos:
            try:  # best effort, each: one that fails must not keep the others from being sent
                yield Request(undo)
            except SemaphoreUnavailable:
                continue

    def confirmed(self, held: Held | None, ours: list[str]) -> Steps[Held | None]:
        """``held``; or, None (its lease can no longer be trusted: we were paused, or it took
        that long), plan again, to renew it before it is returned; after MAX_REPLANS, give
        back what may be ``ours`` and give up."""
        if held is not None:
            return held
        self.confirm = True
        self.replans += 1
        if self.replans <= queue.MAX_REPLANS:
            return None
        yield Request(functools.partial(withdraw, self.run.token, ours))
        raise queue.too_slow(self.run.sem.resources[0], self.run.lease, self.run.skew)

    # -- wait, or give up --------------------------------------------------------------------

    def wait(self, blocked: dict[str, Blocking]) -> Steps[None]:
        """Busy: wait within the budget (never much past the first lease end), then look
        again; past the budget, leave the queue (a hand-over that reached us meanwhile is
        ours to keep: plan from it), and raise ``SemaphoreBusy``."""
        run, pace, seen, first = self.run, self.pace, self.seen, self.resources[0]
        one = len(self.resources) == 1
        for r, blocking in blocked.items():
            if readers.write_off_due(seen.get(r), blocking, run.skew, pace.ticket):
                # Held up by reader items only, unchanged for a lease: are they all dead?
                # (A writer of several resources too: there may be no writer of r alone.)
                write_off = functools.partial(readers.try_write_off, seen[r], run.skew)
                seen[r] = yield from queue.patient_read(write_off, seen[r], pace, run.deadline)
                return
        if run.after:
            queue.wait_out(run, blocked)
        if run.remaining() <= 0:
            if pace.ticket is not None:
                entry = (pace.queue_id, pace.ticket)
                kept = yield from leave_queue(
                    run.sem, run.token, entry, lease=run.lease, skew=run.skew
                )
                if kept is not None:
                    pace.ticket = None  # out of the line, holding
                    seen[first] = kept
                    return
            if one:
                queue.found_busy(first, blocked, run.skew)
            raise queue.busy(run, blocked, seen, pace.ticket)
        queued = one and pace.ticket is not None
        pace.look_by = readers.write_off_at(seen.get(first)) if one else None
        if one and (queued or queue.should_queue(run.sem, seen.get(first))):
            seen[first] = yield from queue.wait_in_queue(
                run, first, seen.get(first), queued=queued, pace=pace
            )
        else:
            self.sleeps += 1
            yield from queue.back_off(run, blocked, seen, self.sleeps)
            for r in blocked:
                seen[r] = yield from self.look_again(r)
        self.replans = 0

    def look_again(self, resource: str) -> Steps[records.LockItem | None]:
        """After a pause: some of several holders are surely still there: read which,
        cheaply; else guess it free (one write tells us otherwise), keeping the fence."""
        old = self.seen.get(resource)
        stale = self.run.stale_ms(clock.now_ms())
        if (
            old is None
            or old.mode not in (Mode.COUNTING, Mode.SHARED)
            or len(queue.live_holders(old, stale)) < 2
        ):
            return records.guessed_free(old.fence if old is not None else 0)
        try:
            item: records.LockItem | None = yield Request(
                functools.partial(lock_rows.get, resource)
            )
        except SemaphoreUnavailable:
            return None
        return item


def semaphore(
    resource: str | Sequence[str] | Callable[..., str],
    *,
    limit: int = 1,
    shared: bool = False,
    user: Any = None,
    lease: float | None = None,
    wait: float | None = None,
    on_busy: Callable[..., Any] | None = None,
    fair: bool | None = None,
    on_commit: bool = True,
    using: str | None = None,
    max_hold: float | None = None,
    fence_db: bool = False,
    coalesce: bool = False,
    metrics_name: str | None = None,
) -> Semaphore:
    """A distributed semaphore on ``resource``: use it as ``with semaphore(...)``,
    ``async with``, ``.acquire()``, or ``@semaphore(...)`` on a view, function or task.
    ``resource`` is a str, or a list of them taken together; a decorator's may also be a
    template such as ``"key:{arg}"``, filled from each call's arguments, or a callable of them.
    Nothing is sent to DynamoDB until it is acquired; bad arguments raise ``TypeError`` or
    ``ValueError`` here.

    Every argument is described in the reference page "The semaphore"."""
    return Semaphore(**locals())  # every argument, as given
