"""Waiting in a resource's queue: joining it, pacing the looks toward our turn, waiting for a
hand-over pushed to us, and the backoff of a waiter that polls instead."""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import random
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from .. import _clock as clock
from .._observability import telemetry
from .._storage import dynamodb, lock_rows, lock_writes, queue_entries, records
from .._storage.records import Mode
from ..exceptions import SemaphoreBusy, SemaphoreUnavailable
from ..signals import lock_busy
from . import hold, late_handover, processes, push
from .lockspec import Attempt, LockSpec
from .steps import Announce, InQueue, Request, Sleep, Steps, announce

_T = TypeVar("_T")

# Backoff of a waiting acquire: first sleep, cap (seconds); full jitter in between.
BACKOFF_FIRST = 0.02
BACKOFF_CAP = 0.5

# Re-plans at once, in a row, each from the state a refused write returned (another caller
# got there first: no busy lock, no read needed), before an acquire steps back: it waits as
# for a busy lock (a pause, or its place in line; at wait=0 it answers busy though room may
# be free), or gives up (too_slow) when what it took can no longer be trusted. A crowd of
# takers of one row loses races to each other: the bound is generous.
MAX_REPLANS = 25
# How long after joining a resource's queue our next acquire of it joins the queue first.
GUESS_BUSY_FOR = 10.0
# Resources this process recently queued for (monotonic time), for that guess.
queued_recently: dict[str, float] = {}
# Resources a take of this process that could not wait (wait=0) recently found busy, and
# until when (monotonic) the next such take reads the row first: GUESS_BUSY_FOR at most, and
# never past the time the holder in the way could be taken over (then a write takes it).
busy_recently: dict[str, float] = {}
# Resources whose hand-overs recently reached us by push (monotonic time): while they do, a
# queued waiter reads only as a fallback, after PUSH_PATIENCE seconds without one.
pushed_recently: dict[str, float] = {}
PUSH_PATIENCE = 0.5
# The seconds one turn of a resource's queue took lately, as waiters of this process handed
# the lock by push measured it (their wait over the turns ahead of them): a pushed waiter's
# fallback look is due only when its turn is surely overdue by that measure.
turn_seconds: dict[str, float] = {}
# A waiter that told the holder it queued (hold.queued_behind) puts its entry item only if it
# still waits this long after (seconds): the holder hands over from the words it heard, and a
# turn that comes sooner costs no entry at all. The entry is for everyone else: a holder
# that dies, or did not hear the word, or waiters reading the queue. Well within JOIN_GRACE,
# which a consistent read of the queue waits for a missing entry before it passes the ticket.
ENTRY_DEFER = 0.25
# How long past a hold's take-over time a retry's acquire that waits it out (wait_out) keeps
# waiting: the look that finds it free comes a little after that time.
WAIT_OUT_GRACE = 2.0
# Tries of a write that joins a queue while it fails in transit (a backoff between them).
ENQUEUE_TRIES = 8
MAX_REMEMBERED = 4096
# While a holder whose process runs on this host is in a queued waiter's way, the waiter looks
# in /proc this often (seconds) whether that process ended, between its paced reads.
WATCH_EVERY = 0.1


def live_holders(item: records.LockItem | None, stale_ms: int) -> dict[str, records.Holder]:
    """The holders whose lease has not run out (lease end + CLOCK_SKEW, by ``stale_ms``)."""
    holders = item.holders if item is not None else {}
    return {t: h for t, h in holders.items() if h.expires_ms >= stale_ms}


def not_proven_dead(holders: Mapping[str, records.Holder]) -> dict[str, records.Holder]:
    """``holders`` less those whose process this host can prove has ended: they are taken
    over like expired ones (evicted in the taker's own write, conditional on their entry
    being unchanged). A look in /proc per holder of this host; asked only of holders that
    are in our way."""
    return {t: h for t, h in holders.items() if not processes.gone(h.proc)}


def upto_of(seen: records.LockItem, ticket: int | None) -> int:
    """The last ticket ahead of us: ours less one if we are queued (even if ``seen`` is an
    older row, from before our ticket was drawn), else every ticket out."""
    return seen.queue_in if ticket is None else ticket - 1


def entries_ahead(
    seen: records.LockItem | None, ticket: int | None, stale_ms: int
) -> list[records.Waiter] | None:
    """The live entry items ahead of ``ticket`` (of every waiter, if None), as far as they
    were read: the first live one ends a read. None when some may be ahead that were not
    read (see :func:`dynasem._storage.queue_entries.load_entries`)."""
    if seen is None or (upto := upto_of(seen, ticket)) <= seen.queue_out:
        return []
    if seen.entries is None:
        return None
    live = [w for w in seen.entries if w.ticket <= upto and w.expires_ms >= stale_ms]
    if not live and seen.entries_to < upto:
        return None
    # Waiters of this host whose process /proc shows ended are gone, as such holders are: a
    # killed waiter's entry would keep a free lock from everyone behind it for its lease.
    # Only when the read saw every ticket up to ``upto``: a ticket with no entry may be a
    # waiter's on its way (JOIN_GRACE waits for those before the first entry live by its
    # lease, not after it), and a read that stopped at the dead one saw nothing beyond.
    alive = [w for w in live if not processes.gone(w.proc)]
    if len(alive) < len(live):
        read = {w.ticket for w in seen.entries if seen.queue_out < w.ticket <= upto}
        if seen.entries_to < upto or len(read) < upto - seen.queue_out:
            return live
    return alive


def ahead_count(seen: records.LockItem | None, ticket: int | None, stale_ms: int) -> int:
    """How many waiters are ahead of ``ticket`` (of everyone, if None): the entry items'
    tickets between ``qout`` and ours (read ones less the dead: a guess from the counters
    alone counts the dead and those who left)."""
    if seen is None or (upto := upto_of(seen, ticket)) <= seen.queue_out:
        return 0
    if seen.entries is not None:
        read = [w for w in seen.entries if w.ticket <= upto]
        dead = sum(1 for w in read if w.expires_ms < stale_ms)
        missing = (min(upto, seen.entries_to) - seen.queue_out) - len(read)
        return max(0, upto - seen.queue_out - dead - missing)
    return upto - seen.queue_out


def before_ticket(seen: records.LockItem | None, pace: Pace) -> bool:
    """Whether ``seen`` is nothing, or a version of the row older than our ticket's draw
    (its queue older than ours, or not our ticket drawn yet): it cannot say who is ahead."""
    if seen is None:
        return True
    if seen.guessed or pace.ticket is None:
        return False
    return seen.queue_id < pace.queue_id or (
        seen.queue_id == pace.queue_id and seen.queue_in < pace.ticket
    )


def read_for_ticket(
    resource: str, seen: records.LockItem | None, pace: Pace, deadline: float
) -> Steps[records.LockItem | None]:
    """The row of a queued waiter that knows it only from before its ticket
    (:func:`before_ticket`), read consistently. Not there, or older still (a read after our
    draw cannot be): it was reaped, and our ticket with it (``pace.ticket`` None: join
    again). Throttled: ``seen``, after a pause."""
    unread: records.LockItem | None = _UNREAD
    row = yield from patient_read(
        functools.partial(lock_rows.get, resource), unread, pace, deadline
    )
    if row is _UNREAD:
        return seen
    if before_ticket(row, pace):
        pace.ticket = None
    return row


_UNREAD = records.LockItem()


def passed(seen: records.LockItem | None, queue_id: int, ticket: int | None) -> bool:
    """Our ticket has had its turn without us (we were seen gone or dead, or drew it just
    after a release that passed every ticket out), or the row was reaped and is a new one:
    we are queued no more, and join again if we still must wait."""
    if ticket is None or seen is None or seen.guessed:
        return False
    if seen.queue_id < queue_id:
        # An older version of the row (an eventually consistent look from before our ticket
        # was drawn; qbase comes from the clock and only grows): it tells nothing of our turn.
        # Joining again would queue us behind our own entry, which nobody serves until it
        # expires (issue 40, found on the unkind engine).
        return False
    return seen.queue_id != queue_id or seen.queue_out >= ticket


def _watched(seen: records.LockItem | None, ticket: int | None, stale_ms: int) -> list[str]:
    """The processes, on this host, of the holders in a queued waiter's way: when one ends,
    the waiter takes over at once. None while a live waiter is ahead of us (its turn first)."""
    if seen is None or ticket is None or ahead_count(seen, ticket, stale_ms):
        return []
    live = live_holders(seen, stale_ms).values()
    return [h.proc for h in live if h.proc is not None and processes.local(h.proc)]


def free_room(sem: LockSpec, seen: records.LockItem | None, stale_ms: int) -> int:
    """The permits of a counting semaphore that ``seen`` shows free (0 for a lock of one
    holder, or for readers: their turns are handed over whole). A row of permit items
    counts its hinted slots (a hint may be stale: a guess that errs toward looking soon)
    and those never used."""
    if sem.limit <= 1 or sem.shared or seen is None:
        return 0
    if seen.slots_used is not None:
        return len(set(seen.hints)) + max(0, sem.limit - seen.slots_used)
    return max(0, sem.limit - len(live_holders(seen, stale_ms)))


def backoff(attempt: int) -> float:
    cap = min(BACKOFF_CAP, BACKOFF_FIRST * (2 ** min(attempt - 1, 16)))
    return random.uniform(cap / 2, cap)


# Who is in our way: live holders, or (nobody holding) live waiters ahead of us.
Blocking = Mapping[str, records.Holder | records.Waiter]


def seconds_until_free(blocked: Mapping[str, Blocking], skew: float) -> float:
    """Until the first holder in the way could be taken over (its lease end + skew)."""
    ends = [h.expires_ms for holders in blocked.values() for h in holders.values()]
    if not ends:
        return BACKOFF_CAP
    return max(0.0, (min(ends) + skew * 1000 - clock.now_ms()) / 1000)


class Pace:
    """When a queued waiter looks again. A turn comes every hold time plus the hand-over's own
    requests (the release write, then our read that sees it), so the waiter sleeps toward the
    time the holder ahead should be done. A look that finds nothing moved (same holders, same
    waiters ahead) doubles the next pause: a late holder, or a dead waiter ahead of us
    blocking a free lock until its entry expires, costs a few reads, not a read every hold
    time."""

    def __init__(self) -> None:
        self.rtt = 0.005  # seconds; an average of our own reads' round trips
        self.early = 0  # looks in a row that found nothing moved
        self.failed_looks = 0  # looks in a row that failed for a passing reason (throttled)
        self.state: Any = None
        self.until_free = 1.0  # seconds until the first holder (or waiter) ahead lapses
        self.enqueued = False  # an enqueue of ours was sent (it may have been applied)
        # Our place in the resource's queue: its name (the row's qbase), our ticket (None:
        # not queued) and our entry's lease end.
        self.queue_id = 0
        self.ticket: int | None = None
        self.entry_ms = 0
        self.queued_mono = 0.0  # when we joined the queue
        self.turns = 1  # the turns until ours when we joined (the waiters ahead, and ours)
        # The last state came by push: a hold it hands us is trusted no later than this.
        self.push_cap: float | None = None
        # Look again by then at the latest (monotonic): a write-off of dead readers is due.
        self.look_by: float | None = None
        # Our entry, not written yet (the holder heard of us), and when it is due (monotonic).
        self.unwritten: records.Waiter | None = None
        self.entry_due = 0.0

    def answered(self, seconds: float) -> None:
        self.rtt = (3 * self.rtt + min(seconds, 0.5)) / 4

    def turn_in(
        self,
        seen: records.LockItem | None,
        token: str,
        skew: float,
        *,
        pushed: bool = False,
        room: int = 0,
        limit: int = 1,
    ) -> float:
        """Seconds until our next look. ``room``: permits ``seen`` shows free, of ``limit``
        (a counting semaphore serves ``limit`` waiters a turn, and the first ``room`` of
        them need no release at all, only the takes of those ahead)."""
        seen = seen or records.LockItem()
        now = clock.now_ms()
        stale = now - int(skew * 1000)
        ahead = ahead_count(seen, self.ticket, stale)
        live = live_holders(seen, stale)
        state = (tuple(sorted(live)), seen.queue_out, ahead)
        self.early = self.early + 1 if state == self.state else 0
        self.state = state
        rtt_ms = self.rtt * 1000
        hold = max(2.0, float(seen.hold_ms or 20))
        step = max(0.002, self.rtt)
        if room > ahead:
            return self._soon(ahead, pushed)
        if room or limit > 1:
            # Holders end one by one: the first release comes after the earliest take, and
            # the waiters ahead beyond the free permits are served ``limit`` a turn.
            start = min((h.acquired_ms or now for h in live.values()), default=now)
            ahead_turns = max(0, ahead - room) / max(1, limit)
        else:
            start = max((h.acquired_ms or now for h in live.values()), default=now)
            ahead_turns = ahead
        # The holder's release lands about one round trip after its hold; every turn ahead
        # of us then takes a hold plus two round trips (that release, its own read).
        turn = (start + hold + rtt_ms + (hold + 2 * rtt_ms) * ahead_turns - now) / 1000
        if live:
            # Until the first holder could be taken over (its lease end + skew). Overdue:
            # back off from a round trip, doubling while nothing moves, at most 64 round
            # trips (a hand-over after a long hold is still seen within a fraction of it).
            first_end = min(h.expires_ms for h in live.values())
            if turn <= 0:
                turn = step * 2 ** min(self.early, 6)
        else:
            # Nobody holds, yet a waiter ahead has not taken its turn: if nothing moved since
            # our last look it is most likely dead; look again ever later, up to a second,
            # until its entry can be evicted.
            read = entries_ahead(seen, self.ticket, stale) or []
            first = min(read, key=lambda w: w.ticket, default=None)
            first_end = first.expires_ms if first else now
            if self.early:
                turn = max(turn, step * 2 ** min(self.early, 10))
        until_free = (first_end + skew * 1000 - now) / 1000 + 0.001
        self.until_free = max(0.001, until_free)
        cap = 1.0
        if pushed and ahead:
            # Pushed its hand-over, with others ahead: a look only stands in for a lost push,
            # due when our turn should come (500 waiters reading a long queue every second
            # are a thousand reads of it per second for nothing): past the turns ahead as
            # this resource's queue lately moved, and half again. Else a look at least every
            # second, so that a hand-over after a long hold is seen soon.
            per_turn = turn_seconds.get(seen.resource)
            if per_turn is not None:
                turn = max(turn, 1.5 * per_turn * (ahead + 1))
            cap = max(1.0, turn)
        return max(0.001, min(turn, until_free, cap))

    def _soon(self, ahead: int, pushed: bool) -> float:
        """Free permits for us and every waiter ahead: our turn comes as soon as those ahead
        took theirs (a write each). Look again within round trips, doubling while nothing
        moves (a waiter ahead that died holds us up until its entry expires, which the
        doubling makes a few reads). Pushed, we are told by the take just ahead of us (it
        pushes the next in line while permits are left): the look is a fallback, later, or
        every waiter within the free permits would read at each take ahead of it (a crowd's
        reads growing with the square of the permits freed at once)."""
        step = max(0.002, self.rtt)
        fallback = step * (ahead + 1) * (4 if pushed and ahead else 1)
        self.until_free = step
        return max(0.001, min(fallback * 2.0 ** min(self.early, 8), 1.0))


def wait_out(run: Attempt, blocked: Mapping[str, Blocking]) -> None:
    """Wait on while a hold ``run`` succeeds (``run.after``: a task's retry, sent by its run
    before that run's block gave its holds back) is in the way, rather than be refused by it:
    the wait ends no sooner than when it could be taken over (its lease end as last seen,
    plus the skew, plus ``WAIT_OUT_GRACE`` for the look that finds it so); a hold renewed
    since moves that on. Once none of them is in the way, the wait ends as it was asked to.
    Never a hold of anyone's: the lock is taken as every waiter takes it, handed over at the
    release or taken over when it could be. A resource in the way (of several) with none of
    them among its holders refuses as it refuses any call: waiting out the others first would
    keep the caller only to be refused then."""
    ends: list[int] = []
    for holders in blocked.values():
        ours = [
            holder.expires_ms
            for token, holder in holders.items()
            if token in run.after and isinstance(holder, records.Holder)
        ]
        if not ours:
            ends = []
            break
        ends += ours
    if not ends:
        run.deadline = run.asked
        return
    until = (max(ends) - clock.now_ms()) / 1000 + run.skew + WAIT_OUT_GRACE
    run.deadline = max(run.asked, clock.monotonic() + until)


def should_queue(sem: LockSpec, seen: records.LockItem | None) -> bool:
    """Queue up (rather than poll with backoff) when fair, when others already do, or as
    a writer behind readers: new readers then queue behind us, so writers never starve."""
    seen = seen or records.LockItem()
    exclusive = sem.mode == Mode.EXCLUSIVE
    writer_behind_readers = exclusive and seen.mode == Mode.SHARED
    if sem.fair or seen.waiting or writer_behind_readers:
        return True
    # A waiter that can be pushed the hand-over queues too: the releasing holder then
    # hands it the lock in its release write and tells it at once, which beats polling
    # on both requests and idle time.
    return exclusive and seen.mode == Mode.EXCLUSIVE and push.available()


class WaitEstimate(NamedTuple):
    """When a caller's turn is likely to come, from a resource's item as last seen."""

    seconds: float  # from now until the caller could take it
    position: int  # its place in the resource's queue: 1 = next, nobody waiting ahead


def _expected_end(holder: records.Holder, hold_ms: int | None, now: int, skew_ms: int) -> int:
    """When a holder is likely done (wall clock, ms)."""
    if holder.expires_ms < now:
        # Its lease ran out unrenewed: dead or paused. Free once it can be taken over.
        return holder.expires_ms + skew_ms
    if not holder.acquired_ms:
        return now + (hold_ms or 0)  # a row from before holders recorded it
    held = max(0, now - holder.acquired_ms)
    if hold_ms is not None and held < hold_ms:
        return holder.acquired_ms + hold_ms
    # Past the average (or none recorded yet): nothing says when it ends; a hold that has
    # lasted this long is as likely as not to last as long again. A caller told so comes back
    # ever later while the hold goes on, like a backoff, instead of every average hold.
    return now + held


def estimate_wait(
    item: records.LockItem | None,
    *,
    shared: bool,
    skew: float,
    now_ms: int | None = None,
    ticket: int | None = None,
) -> WaitEstimate:
    """How long until the caller (shared or not; queued with ``ticket``, if given) could take
    the resource, from the item alone: each live holder is done at its acquired time + the
    recorded average hold (``holdMs``), or, past that, after as long again as it has held; one
    whose lease ran out unrenewed at its lease end + CLOCK_SKEW. Then every live waiter ahead
    of the caller (all of them, for a caller not in the queue) holds for the average hold in
    turn — with a ``limit``, in whichever slot frees first; readers in a row as one turn,
    which a reader caller joins. Waiters whose entries were not read count as writers. Round
    trips are left out: milliseconds, against whole seconds told."""
    item = item or records.LockItem()
    now = clock.now_ms() if now_ms is None else now_ms
    skew_ms = int(skew * 1000)
    stale = now - skew_ms
    live = live_holders(item, stale)
    read = entries_ahead(item, ticket, stale) or []
    unread = max(0, ahead_count(item, ticket, stale) - len(read))
    ahead = read + [records.Waiter(ticket=0, expires_ms=now)] * unread
    ends = [_expected_end(h, item.hold_ms, now, skew_ms) for h in live.values()]
    # What a waiter ahead will hold: the average, else what the holders have held so far.
    typical = item.hold_ms
    if typical is None:
        typical = max((now - h.acquired_ms for h in live.values() if h.acquired_ms), default=0)
    typical = max(0, typical)
    if item.limit > 1:
        # Counting: each waiter ahead takes the first slot to free and holds it a turn; ours
        # is the first to free after them. Free slots now count as freeing now (only as many
        # as the waiters ahead can use: the limit may be 10**9).
        free = max(0, item.limit - len(ends))
        slots = ends + [now] * min(free, len(ahead) + 1)
        heapq.heapify(slots)
        for _ in ahead:
            heapq.heappush(slots, heapq.heappop(slots) + typical)
        start = slots[0] if slots else now
    else:
        # Exclusive or shared: after every holder; then a turn per writer ahead, one per run
        # of readers; a reader caller goes in with the readers queued last ahead of it.
        start = max(ends, default=now)
        turns, last_shared = 0, False
        for w in ahead:
            if not (w.shared and last_shared):
                turns += 1
            last_shared = w.shared
        if shared and last_shared:
            turns -= 1
        start += turns * typical
    return WaitEstimate(max(0.0, (start - now) / 1000), len(ahead) + 1)


def retry_after(estimate: float, until_free: float) -> int:
    """``SemaphoreBusy.retry_after``: the estimate, but never later than the first holder in
    the way could be taken over if it died (``until_free``), in whole seconds (HTTP's
    ``Retry-After`` has no others), rounded up, at least 1."""
    # Rounded to the millisecond first: 1.0000001 s of float arithmetic is 1 s, not 2.
    return max(1, math.ceil(round(min(estimate, until_free), 3)))


def busy(
    run: Attempt,
    blocked: Mapping[str, Blocking],
    seen: Mapping[str, records.LockItem | None],
    ticket: int | None = None,
) -> SemaphoreBusy:
    """The wait is over and the lock still busy (for ``run``, queued with ``ticket`` if
    given): the error to raise, after ``lock_busy`` (:func:`busy_announced`).

    ``blocked``: who was in our way, by resource; ``seen``: the items last seen (a refused
    write's old item, a read, a push), which the estimate is made from: never a request more."""
    resource = next(iter(blocked))
    # The holders in the way (waiters ahead of us hold nothing: no holder is named for them).
    holders = [h for h in blocked[resource].values() if isinstance(h, records.Holder)]
    first = min(holders, key=lambda h: h.expires_ms, default=None)
    now = clock.now_ms()
    sem = run.sem
    estimates = [
        estimate_wait(seen.get(r), shared=sem.shared, skew=run.skew, now_ms=now, ticket=ticket)
        for r in blocked
    ]
    # All of them are needed: the wait is the longest; the place is in the named one's queue.
    wait = max(e.seconds for e in estimates)
    retry = retry_after(wait, seconds_until_free(blocked, run.skew))
    holder_user_id = first.user_id if first else None
    return SemaphoreBusy(resource, retry, holder_user_id, estimates[0].position, wait)


def busy_announced(run: Attempt, exc: SemaphoreBusy) -> Announce:
    """``lock_busy`` for ``exc`` (:func:`busy`'s, which ``run`` gives up with), as the
    acquire loop's last step before it raises that: sent as Django's own async code sends a
    signal, for an async acquire. A receiver's exception is raised instead."""
    return announce(
        lock_busy,
        sender=run.sem.signal_sender,
        resource=exc.resource,
        user_id=run.user_id,
        token=run.token,
        fence=None,
        holder_user_id=exc.holder_user_id,
        retry_after=exc.retry_after,
        queue_position=exc.queue_position,
        estimated_wait=exc.estimated_wait,
    )


def back_off(
    run: Attempt,
    blocked: Mapping[str, Blocking],
    seen: Mapping[str, records.LockItem | None],
    sleeps: int,
) -> Steps[None]:
    """A busy take that does not queue: past the wait, give up (``busy``); else sleep
    (``sleeps``: the how-manieth time), never much past the first lease end in the way."""
    remaining = run.remaining()
    if remaining <= 0:
        raise busy(run, blocked, seen)
    if telemetry.ON:
        telemetry.waiting()  # the span's wait event, once
    until_free = seconds_until_free(blocked, run.skew)
    yield Sleep(max(0.0, min(backoff(sleeps), until_free + 0.005, remaining)))


def wait_in_queue(
    run: Attempt, resource: str, seen: records.LockItem | None, *, queued: bool, pace: Pace
) -> Steps[records.LockItem | None]:
    """Join the queue (once), then sleep toward our likely turn and look again: with a
    cheap read, or by renewing our place when its lease is half gone. Returns the state.

    ``seen``: the resource as last seen (None: not seen); ``queued``: we are in its queue
    already; ``pace``: this acquisition's timing."""
    if not queued:
        return (yield from join_queue(run, resource, seen, pace))
    done, item = yield from _wait_for_turn(run, resource, seen, pace)
    if done:
        return item
    if (yield from _entry_due(run, resource, pace)):
        return seen
    return (yield from _look(run, resource, seen, pace))


def join_queue(
    run: Attempt,
    resource: str,
    seen: records.LockItem | None,
    pace: Pace,
    if_busy_ms: int | None = None,
) -> Steps[records.LockItem | None]:
    """Draw a ticket (one write to the row), then write our entry; returns the row as the
    ticket left it.

    ``if_busy_ms``: join only if someone holds it (a lease ending at or after this) or
    waits; otherwise the refusal's old item is returned, to take it from (free, most
    likely)."""
    # Where the holder that hands us the lock tells us (None: nowhere): listening before
    # our entry can be read.
    address = push.expect(resource, run.token, lease=run.lease, skew=run.skew, now_ms=clock.now_ms)
    pace.enqueued = True  # from now on, giving up means leaving the queue
    pace.unwritten = None
    # A fresh queue name and lease end, for a row reaped since we saw it (see take_ticket).
    queue_id, idle_ms = clock.new_fence(0), clock.now_ms() + int(run.lease * 1000)
    ticket = lock_writes.take_ticket(resource, queue_id, idle_ms=idle_ms, if_busy_ms=if_busy_ms)
    # Our place once the draw's answer told it: what an interrupt leaves until our next step
    # in line says (the word to the holder below comes before it).
    joined: list[tuple[int, int]] = []
    try:
        # A lost answer leaves a ticket nobody uses: a gap, which the next hand-over
        # passes. Never a refusal by another waiter: ADD commutes.
        after = yield from _enqueue(
            run,
            functools.partial(_draw, ticket, joined),
            resource,
            None,
            leave=functools.partial(_leave_joined, run, joined),
        )
    except dynamodb.Refused as refused:
        # Not queued (unless an earlier attempt was applied): a take at once now ends the
        # guess that the resource is busy (core's Acquire.write), as for a take not queued.
        pace.enqueued = refused.retried
        return refused.lock or records.LockItem()  # free, most likely: plan from it
    if after is None:
        return seen
    pace.queue_id, pace.ticket = after.queue_id, after.queue_in
    if not joined:
        joined.append((after.queue_id, after.queue_in))
    if telemetry.ON:
        telemetry.waiting(ahead=max(0, after.queue_in - after.queue_out - 1))
    pace.queued_mono = clock.monotonic()
    pace.turns = max(1, after.queue_in - after.queue_out)
    pace.entry_ms = clock.now_ms() + int(run.lease * 1000)
    waiter = records.Waiter(
        ticket=after.queue_in,
        expires_ms=pace.entry_ms,
        user_id=run.user_id,
        shared=run.sem.shared,
        lease_ms=int(run.lease * 1000),
        address=address,
        proc=run.proc,  # None for a detached hold (a lead): a hand-over copies it to the row
        token=run.token,
        since_ms=clock.now_ms(),
    )
    deferrable = run.sem.mode == Mode.EXCLUSIVE and ENTRY_DEFER < run.lease / 2
    if hold.queued_behind(after, waiter) and deferrable:
        # The holder heard of us and hands over from what it heard: our entry is put only if
        # we still wait ENTRY_DEFER from now (for a holder that dies, or a word lost).
        pace.unwritten = waiter
        pace.entry_due = clock.monotonic() + ENTRY_DEFER
    else:
        yield from put_entry(run, resource, pace, waiter)
    if len(queued_recently) >= MAX_REMEMBERED:
        queued_recently.clear()
        pushed_recently.clear()
        turn_seconds.clear()
    queued_recently[resource] = clock.monotonic()
    return after


def put_entry(run: Attempt, resource: str, pace: Pace, waiter: records.Waiter) -> Steps[None]:
    """Write our queue entry (a put is idempotent: the same again, if it failed)."""
    pace.unwritten = None
    put = functools.partial(queue_entries.put_entry, resource, pace.queue_id, waiter)
    yield from _enqueue(run, put, resource, (pace.queue_id, waiter.ticket))


def _entry_due(run: Attempt, resource: str, pace: Pace) -> Steps[bool]:
    """Put our entry if it is due (see ENTRY_DEFER): True if it was."""
    waiter = pace.unwritten
    if waiter is None or clock.monotonic() < pace.entry_due:
        return False
    pace.entry_ms = clock.now_ms() + int(run.lease * 1000)
    expires = dataclasses.replace(waiter, expires_ms=pace.entry_ms)
    yield from put_entry(run, resource, pace, expires)
    pace.early = max(0, pace.early - 1)  # not a look: the next nap's count stays as it was
    return True


def found_busy(resource: str, blocked: Mapping[str, Blocking], skew: float) -> None:
    """A take whose wait was over found ``resource`` busy, ``blocked`` in the way (see
    :data:`busy_recently`)."""
    if len(busy_recently) >= MAX_REMEMBERED:
        busy_recently.clear()
    until_free = min(GUESS_BUSY_FOR, seconds_until_free(blocked, skew))
    busy_recently[resource] = clock.monotonic() + until_free


def busy_lately(resource: str) -> bool:
    """Whether a take of ``resource`` that could not wait found it busy a short while ago,
    held by someone who cannot be taken over yet."""
    return clock.monotonic() < busy_recently.get(resource, -math.inf)


def _enqueue(
    run: Attempt,
    send: Callable[[], _T],
    resource: str,
    entry: tuple[int, int] | None,
    *,
    leave: Callable[[], None] | None = None,
) -> Steps[_T | None]:
    """One write of joining the queue, tried again (ENQUEUE_TRIES) while it fails in transit.
    ``leave``: what leaves the queue if the caller is interrupted (default: ``entry``'s)."""
    leave = leave or leaving(run, entry)
    for attempt in range(1, ENQUEUE_TRIES + 1):
        try:
            answer: _T = yield InQueue(send, run.token, resource, write=True, leave=leave)
            return answer
        except SemaphoreUnavailable as exc:
            if not exc.transient or attempt == ENQUEUE_TRIES:
                raise
            yield Sleep(min(backoff(attempt), max(0.001, run.remaining())))
    return None


def _draw(ticket: dict[str, Any], joined: list[tuple[int, int]]) -> records.LockItem | None:
    """The ticket's draw, sent; our place noted in ``joined`` as soon as its answer comes,
    before the loop sees it: an async caller cancelled meanwhile (the driver waits for the
    answer, and never hands it to the loop) leaves from there, rather than leave a ticket
    with no entry that every passer waits JOIN_GRACE for."""
    after = lock_rows.update(ticket, return_new=True)
    if after is not None and not joined:
        joined.append((after.queue_id, after.queue_in))
    return after


def _leave_joined(run: Attempt, joined: list[tuple[int, int]]) -> None:
    """The ticket's draw interrupted, or a step after it before the next step in line: leave
    the place the draw's answer gave us (``joined``), if it came. Nothing else knows of it
    then, and the holder may have heard our word already (``hold.queued_behind``): a hand-over
    to us would be held for nobody for our whole lease."""
    leave = leaving(run, joined[0]) if joined else None
    if leave is not None:
        leave()


def leaving(run: Attempt, entry: tuple[int, int] | None) -> Callable[[], None] | None:
    """What leaves the queue (``entry``: its qbase, our ticket), handing on whatever reached
    us (``late_handover.abandon``): when our caller is interrupted while we wait in it, or we
    may not take the resource after all; None before our ticket is known (then nobody waits
    for it)."""
    if entry is None or not entry[1]:
        return None
    return functools.partial(
        late_handover.abandon, run.sem, run.token, entry, lease=run.lease, skew=run.skew
    )


def _nap(run: Attempt, resource: str, seen: records.LockItem | None, pace: Pace) -> float:
    """How long a queued waiter sleeps before its next look (or until a push wakes it)."""
    now = clock.now_ms()
    stale = run.stale_ms(now)
    room = free_room(run.sem, seen, stale)
    pushed = push.listening(run.token) and _pushers_reach_us(seen, stale)
    nap = pace.turn_in(seen, run.token, run.skew, pushed=pushed, room=room, limit=run.sem.limit)
    remaining = run.remaining()
    nap = max(0.001, min(nap, remaining))
    # Look (and renew our entry, below) while a quarter of its lease is left at least.
    nap = min(nap, max(0.001, (pace.entry_ms - now) / 1000 - run.lease / 4))
    if pace.look_by is not None:  # a write-off falls due then (readers.write_off_at)
        nap = min(nap, max(0.001, pace.look_by - clock.monotonic()))
    imminent = room > ahead_count(seen, pace.ticket, stale)
    recently = clock.monotonic() - pushed_recently.get(resource, -math.inf) < GUESS_BUSY_FOR
    if pushed and not imminent and not run.sem.shared and recently:
        # Hand-overs of this resource reached us by push lately: a read before the
        # next one would most likely find nothing new. Look only as a fallback.
        nap = max(nap, min(PUSH_PATIENCE, pace.until_free, remaining))
    if pace.unwritten is not None:  # our entry is put then (ENTRY_DEFER), pushed or not
        nap = min(nap, max(0.001, pace.entry_due - clock.monotonic()))
    return nap


def _pushers_reach_us(seen: records.LockItem | None, stale_ms: int) -> bool:
    """Whether the holders in our way can push us their hand-over: from any host when we
    listen on a routable address; on loopback (the default) only from this host, which a
    holder's recorded process proves (one not recorded may be anywhere). A waiter that
    cannot be pushed looks as often as one that does not listen (seed 20081: a hand-over
    from another host waited 16 s for the heir's look, timed by this host's pushes)."""
    if not push.loopback_only():
        return True
    holders = live_holders(seen, stale_ms).values()
    return all(h.proc is not None and processes.local(h.proc) for h in holders)


def _wait_for_turn(
    run: Attempt, resource: str, seen: records.LockItem | None, pace: Pace
) -> Steps[tuple[bool, records.LockItem | None]]:
    """Sleep toward our turn. ``(True, item)``: the state to plan from, without a look (a
    hand-over pushed to us; a holder in our way on this host ended); ``(False, None)``: the
    nap is over, look again."""
    leave = leaving(run, (pace.queue_id, pace.ticket or 0))
    listening = push.listening(run.token)
    last_fence = seen.fence if seen is not None else 0
    # A holder in our way runs on this host: look in /proc whether it ended every
    # WATCH_EVERY, not only at our next read (a dead holder's lease may have a minute left).
    watched = _watched(seen, pace.ticket, run.stale_ms(clock.now_ms()))
    until = clock.monotonic() + _nap(run, resource, seen, pace)
    while True:
        left = until - clock.monotonic()
        part = max(0.001, min(left, WATCH_EVERY) if watched else left)
        if listening:
            pushed: push.Push | None = yield InQueue(
                functools.partial(push.wait, run.token, part, fence_above=last_fence),
                run.token,
                resource,
                asend=functools.partial(push.await_push, run.token, part, fence_above=last_fence),
                leave=leave,
            )
            if pushed is not None:
                return True, _pushed(run, resource, pace, pushed)
        else:
            yield Sleep(part)
        if any(processes.gone(p) for p in watched):
            # Its holder is dead: take it over from what we saw (the write's condition is
            # that the dead holder's entry is unchanged; a refusal shows what changed).
            return True, seen
        if not watched or left <= WATCH_EVERY:
            return False, None


def _pushed(run: Attempt, resource: str, pace: Pace, pushed: push.Push) -> records.LockItem:
    """Handed the lock (or told it is free) by push: the item as written. A hand-over is
    worth no more than its arrival plus our own lease."""
    pushed_recently[resource] = clock.monotonic()
    # Our turn, by push: handed the lock, or (a counting semaphore's waiter takes a permit
    # itself) pushed as the next in line. How long a turn took.
    our_turn = run.token in pushed.item.holders or (
        run.sem.limit > 1 and pace.ticket is not None and pushed.item.queue_out >= pace.ticket - 1
    )
    if our_turn and pace.queued_mono:
        took = (pushed_recently[resource] - pace.queued_mono) / pace.turns
        before = turn_seconds.get(resource, took)
        turn_seconds[resource] = (before + took) / 2
    pace.push_cap = pushed.arrived + run.lease - run.skew
    if pushed.line and run.token in pushed.item.holders:
        # Handed the lock with the line after us: ours to hand on without a read while fresh.
        read = pushed.arrived - pushed.line_age
        return dataclasses.replace(pushed.item, line=pushed.line, line_read=read)
    return pushed.item


def _look(
    run: Attempt, resource: str, seen: records.LockItem | None, pace: Pace
) -> Steps[records.LockItem | None]:
    """A queued waiter's look: renew our entry when half its lease is gone, then read the
    row (:func:`patient_read`: a throttled read is no news) before the wait's end."""
    lease = run.lease
    ticket = pace.ticket
    address = _listening_late(run, resource, pace)
    due = pace.entry_ms - clock.now_ms() < lease * 500 or address is not None
    if ticket is not None and due and pace.unwritten is None:  # (else put: _entry_due)
        renew_to = clock.now_ms() + int(lease * 1000)
        try:
            yield Request(
                lambda: lock_rows.update(
                    lock_writes.renew_waiter(resource, pace.queue_id, ticket, renew_to, address)
                )
            )
            pace.entry_ms, address = renew_to, None
        except dynamodb.Refused:
            pace.ticket = None  # our entry is gone (reaped by TTL after a long stall): join again
        except SemaphoreUnavailable as exc:
            if not exc.transient:
                raise
            # Idempotent: sent again at the next look (our entry outlives a few of them).
        finally:
            if address is not None:  # not recorded: no push comes (and our naps say so)
                push.forget(run.token)
    sent = clock.monotonic()
    # Eventually consistent (half the units): a look only tells when to write, and every
    # write is conditional on the row as it is; an older row is read as such (upto_of).
    item = yield from patient_read(
        lambda: lock_rows.get(resource, consistent=False), seen, pace, run.deadline
    )
    if not pace.failed_looks:
        pace.answered(clock.monotonic() - sent)
    return item


def _listening_late(run: Attempt, resource: str, pace: Pace) -> str | None:
    """The push address of a waiter that queued while its process could not listen (short of
    sockets or threads for a moment: ``push.LISTEN_RETRY``) and can now: its entry records it
    at this look (a renewal: one write), or the waiter read the row at the fallback pace for
    the rest of its wait, each hand-over to it idle until its next read. None: nothing to do."""
    if pace.ticket is None or pace.unwritten is not None or push.listening(run.token):
        return None
    if not push.available():
        return None  # pushes off, or still short
    return push.expect(resource, run.token, lease=run.lease, skew=run.skew, now_ms=clock.now_ms)


def patient_read(send: Callable[[], _T], last_seen: _T, pace: Pace, deadline: float) -> Steps[_T]:
    """A read of a waiting acquire, sent: its answer; or, when it failed for a passing reason
    (throttled still after botocore's retries, a 5xx, a dropped connection) before the wait's
    ``deadline`` (monotonic), ``last_seen`` after a pause that doubles with each such failure
    in a row. Raises any other failure, and one past the deadline. A waiter never fails its
    caller, or gives up its place in line, for one throttled read of a hot key, and never
    reads again at once, which would only add to the throttling."""
    try:
        answer: _T = yield Request(send)
    except SemaphoreUnavailable as exc:
        if not exc.transient or clock.monotonic() >= deadline:
            raise
        pace.failed_looks += 1
        yield Sleep(min(backoff(pace.failed_looks), max(0.001, deadline - clock.monotonic())))
        return last_seen
    pace.failed_looks = 0
    return answer


def too_slow(resource: str, lease: float, skew: float) -> SemaphoreUnavailable:
    return SemaphoreUnavailable(
        f"could not take {resource!r}: every hold we got had run out of its lease "
        f"({lease:g}s, less CLOCK_SKEW {skew:g}s) by the time it could be returned; this "
        "process is paused or starved for longer than the lease",
        transient=True,
    )
