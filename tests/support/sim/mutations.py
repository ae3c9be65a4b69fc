"""Deliberate one-line protocol mutations, applied for the duration of a run
(``Options.mutation``): the simulator must find each within a small seed budget, or it
proves nothing about the real code. Each is a change a reviewer could miss:

* ``no_skew_in_trust``: a holder trusts its hold until ``sent + lease``, not
  ``sent + lease - CLOCK_SKEW`` (hold.Held's deadline, at the take and at each renewal);
* ``take_ignores_lease``: a take of a "free" row no longer requires the holders' leases to
  be over (lock_writes.take_free's first condition dropped);
* ``take_ignores_fence``: a take no longer requires its fence to be above the stored one
  (lock_writes.take_free's fence condition dropped);
* ``trust_from_answer``: a take's hold is trusted from when its answer came, not from when
  the write left (core: ``sent_mono`` read after the write);
* ``renewal_ignores_refusal``: a refused renewal (the hold is another's) is taken as done;
* ``renew_without_token``: a renewal's condition no longer names our token;
* ``takeover_waits_a_lease``: a dead holder is taken over a whole lease later than it may
  be (liveness, not safety: the lock idles while waiters wait). Since a waiter of a dead
  holder's host hands its lock on, crashes seldom leave one to its lease end unless a
  crashed process's successor starts on another host (``Options.restart_elsewhere``);
* ``room_ignores_limit``: a counting hold's first try joins whatever the holder count
  (lock_writes.take_room's ``size(#h) < :lim`` dropped);
* ``join_ignores_count``: a join no longer requires the holder count it saw
  (lock_writes.take_join's ``size(#h) = :size`` dropped);
* ``room_ignores_mode``: a shared or counting first try joins a row of another mode
  (lock_writes.take_room's ``#mode = :mode`` dropped);
* ``handover_ignores_queue``: a hand-over no longer requires the queue as seen
  (lock_writes.hand_over's ``#qout = :sqout`` dropped), and ``handover_ignores_fence``: nor
  the heirs' fences above the stored one (``#fence < :low``). Neither is found: while the
  hand-over's token clause holds, its writer is the exclusive holder, and nobody else moves
  the queue's ``qout`` or the fence meanwhile. Both clauses are defence in depth;
* ``hand_on_ignores_entry``, ``hand_on_ignores_queue``, ``hand_on_ignores_fence``: a waiter's
  hand-on of a holder it proved dead to the waiters ahead of it (lock_writes.hand_on) no
  longer requires the dead holder's entry as seen (``#h.#x0.#e = :xe0``), ``qout`` as seen
  (``#qout = :sqout``), or the heirs' fences above the stored one (``#fence < :low``). None
  is found alone: the entry and ``qout`` clauses each refuse what the other would (a write
  that removes or replaces the holder of a row with waiters moves ``qout``, or leaves no
  holder; nothing else moves it), and the heirs' fence is drawn above the row seen, whose
  fence moves only with its holder. ``hand_on_ignores_row``, both the entry and ``qout``
  dropped, is found (a hand-on again from a stale look, to the heir that holds, under
  another fence); so is ``hand_on_fence_not_above``, the fence clause dropped and the
  heirs' fences drawn at the stored one. ``hand_on_unproven``: a waiter hands on a holder
  it did not prove dead (its lease running, its process alive or of another host);
* ``release_without_token``: a release no longer requires our token among the holders
  (lock_writes.give_back's ``attribute_exists(#h.#t)`` dropped);
* ``renewal_trusted_from_answer``: a renewal's lease is trusted from when its answer came,
  not from when it left (hold.Held._renew_once);

* ``no_join_grace``: a ticket with no entry item is passed at once, not after
  ``queue_entries.JOIN_GRACE`` (a waiter that told the holder puts its entry 0.25 s later);

and the faults fixed earlier, put back:

* ``heard_hold_trusted`` (fixed by 7f8bc96, the stalled waiter): a hold we only heard of (a
  read, a push, a refused write showing our token) is taken as a fresh one, whatever its
  stored lease end, and never confirmed by a renewal of our own;
* ``lost_handover_is_a_loss`` (fixed by 60bb716): a hand-over whose answer was lost no
  longer counts as a write that may have been applied when the release that follows is
  refused (its heir held and gave back meanwhile): a hold that was ours is reported lost.
  It needs every attempt of one hand-over unanswered (four, botocore's retries) and a first
  clean refusal of the release after, within the hold's trusted deadline: found by the
  ``deaf`` faults (a host's answers lost for a while) with a 60 s lease;
* ``release_before_commit``: a hold is given back when its block ends, not when its
  transaction commits (``on_commit`` ignored);
* ``queued_plan_from_old_row`` (found by the order check, fixed with it): a queued waiter
  plans its take from the row as an eventually consistent look showed it, older than its
  ticket (or not made yet), instead of reading it first: it takes the lock past the
  waiters ahead of it;
* ``limit_change_unfenced`` and ``hint_past_hw`` (found by review, fixed by 73004a4): a permit
  row takes another limit or mode without fencing its slots first, so a take between its row
  write and its permit write holds a permit the new limit or mode does not count (found:
  the ``limits`` mix, in permits); a slot freed under the old limit is hinted into the reset
  row (not found in 300 seeds: it needs a release stopped between its two writes while the
  row is reset; ``tests/engine/test_permit_limit_change.py`` stops one there);
* ``write_off_looks_at_once`` (found by a test, fixed by aa2aca3): a writer that found item
  readers alive looks whether they died again at once, not when the first may have: it
  reads their items in a loop while they hold (found by the request-storm check, the
  ``long_readers`` mix);
* ``heard_lease_without_skew``: a hold only heard of (a pushed hand-over, a read) is trusted
  until its stored lease end by our clock, not that less CLOCK_SKEW: the releaser's clock
  wrote it. Found only with pushes across hosts (``Options.push_across``);
* ``permit_row_uncovered`` (found by review, fixed by c59bafe): a take's row write leaves the
  permit row listed as it was, raised to cover the permit only after the permit's write: the
  reaper (the ``reaped`` faults) deletes the idle row between the two writes, and the next
  take makes it anew under another limit or mode;
* ``item_release_given_up`` (found by the ``shared_pairs`` mix, fixed in the twenty-second
  session): a reader's or a permit's item whose release meets another request's transaction
  (TransactionConflictException) or a throttle is given up at once, not sent again as a
  row's release is: it holds for its lease, and a writer waits for the write-off. Not
  found since the liveness check excuses a waiter of several resources while another of
  them is held in its way: a release given up holds for a lease, as a crash does;
* ``multi_writer_writes_no_reader_off`` (found by the ``mixed_pairs`` mix in permit items,
  fixed in the twenty-second session): a writer of several resources held up by dead item
  readers of one waits for their sentinel (to a bucket's end) instead of writing them off
  once they have sat unchanged for their lease, as a writer of that resource alone does.

and for ``run_once`` (the ``jobs`` mix):

* ``job_unconfirmed``: a claim whose answer came after its lease could run out (a pause) is
  trusted a whole lease again without the renewal of our own that confirms nobody claimed
  the job meanwhile;
* ``job_finish_ignores_token``: DONE or FAILED is written whoever holds the claim now
  (job_writes.job_finish's ``#token = :tok`` dropped): a run that outlived its lease ends
  the claim of the run that took over;
* ``job_claim_ignores_lease``: a RUNNING job is claimed whatever its lease
  (job_writes.job_claim's lease clause dropped).

and for unique tasks (the ``unique`` mix):

* ``adopt_ignores_claim``: an adoption no longer requires the claim's entry to be there
  (claims.adopt_hold's ``attribute_exists(#h.#c)`` dropped): a message delivered twice, or
  one whose claim a later enqueue took after its queue lease, adds a second holder;
* ``retry_ignores_run_lease``: a retry whose run has not ended takes the key over from it
  at once, whether the run's lease ended or not (unique.adopt's look at the announcing run,
  and claims.adopt_hold's ``#h.#c.#e < :stale``);
* ``claim_keeps_renewing``: the claim taken at enqueue is left to the enqueuing process's
  heartbeat (unique.claim's ``stop_renewing`` dropped): renewed past its queue lease, the key
  of a lost message is never free while that process lives;
* ``adopt_unconfirmed`` (found by the ``unique`` mix, fixed by f894179): an
  adoption whose answer came after its run lease could run out is run without the renewal
  that confirms the key is still the task's.

and for coalesced re-runs and leadership (the ``coalesce`` mix):

* ``register_ignores_fence``: a registration no longer gives way to a caller that read a
  later fence (next_runs.register_next's ``#af < :af`` dropped): a next run that has begun
  answers callers Coalesced;
* ``register_ignores_lease``: a registration is never replaced for its lease
  (``#un < :stale`` dropped): a dead next runner's stands until someone takes the lock;
* ``gave_up_keeps_renewing``: a next run that gives up (or fails) neither withdraws its
  registration nor stops its heartbeat: renewed for nobody;
* ``next_renewal_unsent``: the next run's heartbeat moves its trust on without renewing the
  stored lease: replaced while it trusts its registration;
* ``withdraw_when_replaced`` (found by the ``coalesce`` mix, fixed with it): a next run told
  by a refused renewal that it was replaced still withdraws, a write certain to be refused;
* ``registered_on_a_clock_fence`` (found by review, fixed with the mix): a caller whose fence
  read finds the row reaped registers under a fence from its clock, which a hand-over from
  a clock behind can give its own run's fence less than: callers during that run coalesced;
* ``lead_trusted_until_lost``: a leader trusts its lead (``active``, ``seconds_left``) until
  told it is lost, not to its deadline.
and for an operator's breaks (the ``breaks`` mix):

* ``renew_reader_past_break``: a reader item's renewal no longer requires its lease end
  (reader_items.renew_reader's ``attribute_exists(#e)`` dropped): a broken reader's
  tombstone is renewed, and the reader trusts on;
* ``renew_permit_past_break``: a permit's renewal no longer requires our token in it
  (permit_items.renew_permit's ``#k = :tok`` dropped): a broken permit (or the slot's next
  holder's) is renewed for the holder that was broken.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import pytest

FREE = "(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale)"
FENCE = "(attribute_not_exists(#fence) OR #fence < :fence)"
TOKEN = "attribute_exists(#h.#t)"
ROOM = "size(#h) < :lim"
COUNT = "size(#h) = :size"
MODE = "#mode = :mode"
QUEUE = "#qout = :sqout"
HEIR_FENCE = "#fence < :low"


def drop_condition(action: dict[str, Any], clause: str) -> dict[str, Any]:
    """``action`` without one clause of its condition (and the values only it used)."""
    parts = [p for p in action["ConditionExpression"].split(" AND ") if p != clause]
    assert len(parts) < len(action["ConditionExpression"].split(" AND ")), clause
    if parts:
        action["ConditionExpression"] = " AND ".join(parts)
    else:
        del action["ConditionExpression"]
    used = " ".join(text for key, text in action.items() if key.endswith("Expression"))
    placeholders = set(re.findall(r":\w+", used))
    values = action.get("ExpressionAttributeValues", {})
    action["ExpressionAttributeValues"] = {k: v for k, v in values.items() if k in placeholders}
    names = set(re.findall(r"#\w+", used))
    if "ExpressionAttributeNames" in action:
        kept = {k: v for k, v in action["ExpressionAttributeNames"].items() if k in names}
        action["ExpressionAttributeNames"] = kept
    return action


def _dropping(builder: Callable[..., dict[str, Any]], clause: str) -> Callable[..., Any]:
    @functools.wraps(builder)
    def mutated(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return drop_condition(builder(*args, **kwargs), clause)

    return mutated


def no_skew_in_trust(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import hold

    init, renew_once = hold.Held.__init__, hold.Held._renew_once

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._deadline = min(self._deadline + self.skew, self._max_hold_end)

    def _renew_once(self: Any) -> None:
        before = self._deadline
        renew_once(self)
        if self._deadline != before:
            self._deadline = min(self._deadline + self.skew, self._max_hold_end)

    mp.setattr(hold.Held, "__init__", __init__)
    mp.setattr(hold.Held, "_renew_once", _renew_once)


def take_ignores_lease(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "take_free", FREE)


def take_ignores_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "take_free", FENCE)


def renew_without_token(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "renew_hold", TOKEN)


def trust_from_answer(mp: pytest.MonkeyPatch) -> None:
    from dynasem import _clock
    from dynasem._engine import take

    trusted = take.held_if_trusted

    def held_if_trusted(*args: Any, sent_mono: float | None, **kwargs: Any) -> Any:
        if sent_mono is not None:
            sent_mono = _clock.monotonic()  # the answer's arrival, not the send
        return trusted(*args, sent_mono=sent_mono, **kwargs)

    mp.setattr(take, "held_if_trusted", held_if_trusted)


def renewal_ignores_refusal(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import hold
    from dynasem.exceptions import LockLost

    renew_to = hold.Held._renew_to

    def _renew_to(self: Any, expires: int) -> None:
        try:
            renew_to(self, expires)
        except LockLost:
            self._lost = None  # refused: "renewed" all the same

    mp.setattr(hold.Held, "_renew_to", _renew_to)


def takeover_waits_a_lease(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import lockspec

    def stale_ms(self: Any, now_ms: int) -> int:
        return now_ms - int((self.skew + self.lease) * 1000)

    mp.setattr(lockspec.Attempt, "stale_ms", stale_ms)


def room_ignores_limit(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "take_room", ROOM)


def join_ignores_count(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "take_join", COUNT)


def room_ignores_mode(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "take_room", MODE)


def handover_ignores_queue(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "hand_over", QUEUE)


def handover_ignores_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "hand_over", HEIR_FENCE)


def hand_on_ignores_entry(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import lock_writes

    hand_on = lock_writes.hand_on

    def mutated(resource: str, gone: dict[str, int], *args: Any, **kwargs: Any) -> Any:
        action = hand_on(resource, gone, *args, **kwargs)
        for i in range(len(gone)):  # each gone holder's entry, as seen
            drop_condition(action, f"#h.#x{i}.#e = :xe{i}")
        return action

    mp.setattr(lock_writes, "hand_on", mutated)


def hand_on_ignores_row(mp: pytest.MonkeyPatch) -> None:
    hand_on_ignores_entry(mp)
    hand_on_ignores_queue(mp)


def hand_on_ignores_queue(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "hand_on", QUEUE)


def hand_on_ignores_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "hand_on", HEIR_FENCE)


def hand_on_fence_not_above(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    from dynasem._engine import take

    hand_on = take._Planning.hand_on

    def at_the_stored_fence(self: Any, waiting: Any, ahead: Any, *, gone: bool) -> None:
        entry = self.entry
        if self.seen is not None:  # the heirs' fences from the dead holder's, not above it
            self.entry = dataclasses.replace(entry, fence=self.seen.fence)
        try:
            hand_on(self, waiting, ahead, gone=gone)
        finally:
            self.entry = entry

    mp.setattr(take._Planning, "hand_on", at_the_stored_fence)
    _drop(mp, "hand_on", HEIR_FENCE)


def hand_on_unproven(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import queue, take
    from dynasem._storage.records import Mode

    plan = take._Planning.plan

    def unproven(self: Any, confirm_below_ms: int, ticket: int | None) -> Any:
        planned = plan(self, confirm_below_ms, ticket)
        seen = self.seen
        if planned.busy is None or planned.hand_on is not None or seen is None:
            return planned
        if seen.mode != Mode.EXCLUSIVE or len(seen.holders) != 1 or self.token in seen.holders:
            return planned
        ahead = queue.entries_ahead(seen, ticket, self.stale_ms)
        if ahead is None:  # who waits ahead, read as the hand-on of a proven holder reads it
            return take.Plan(load=queue.upto_of(seen, ticket), queued=planned.queued)
        if ahead:  # the holder in our way taken for dead, unproven
            self.hand_on(planned, ahead, gone=True)
        return planned

    mp.setattr(take._Planning, "plan", unproven)


def release_without_token(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "give_back", TOKEN)


def _drop(mp: pytest.MonkeyPatch, builder: str, clause: str) -> None:
    from dynasem._storage import lock_writes

    mp.setattr(lock_writes, builder, _dropping(getattr(lock_writes, builder), clause))


def renewal_trusted_from_answer(mp: pytest.MonkeyPatch) -> None:
    from dynasem import _clock
    from dynasem._engine import hold

    renew_once = hold.Held._renew_once

    def _renew_once(self: Any) -> None:
        sent, before = _clock.monotonic(), self._deadline
        renew_once(self)
        if self._deadline != before:  # renewed: counted from the answer instead
            self._deadline = min(self._deadline + _clock.monotonic() - sent, self._max_hold_end)

    mp.setattr(hold.Held, "_renew_once", _renew_once)


def heard_hold_trusted(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import take

    def ours(self: Any, seen: Any, confirm_below_ms: int) -> Any:
        # A whole lease from now (our entry's), as if just taken.
        return take.Plan(fence=seen.holders[self.token].fence, expires_ms=self.entry.expires_ms)

    def held_if_trusted(*args: Any, **kwargs: Any) -> Any:
        return trusted(*args, **{**kwargs, "push_cap": None})

    trusted = take.held_if_trusted
    mp.setattr(take._Planning, "ours", ours)
    mp.setattr(take, "held_if_trusted", held_if_trusted)


def lost_handover_is_a_loss(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import hold

    hand_over = hold.Held._hand_over

    def _hand_over(self: Any) -> Any:
        before = self._unanswered
        handed = hand_over(self)
        self._unanswered = before  # an unanswered hand-over counts for nothing
        return handed

    mp.setattr(hold.Held, "_hand_over", _hand_over)


def release_before_commit(mp: pytest.MonkeyPatch) -> None:
    from dynasem._transactions import commit

    # Nothing waits for the transaction: Held.release gives back at once.
    mp.setattr(commit, "after_transaction", lambda *args, **kwargs: False)


def queued_plan_from_old_row(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import queue

    mp.setattr(queue, "before_ticket", lambda seen, pace: False)


def no_join_grace(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import queue_entries

    # A ticket with no entry is passed at once: a waiter whose entry is not put yet (it told
    # the holder, queue.ENTRY_DEFER) is passed by whoever reads the queue without its word.
    mp.setattr(queue_entries, "JOIN_GRACE", 0.0)


def limit_change_unfenced(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import permit_items

    # A permit row changes limit or mode from a read of its permits alone (before 73004a4).
    mp.setattr(permit_items, "fence_out", lambda item, stale_ms: None)


def hint_past_hw(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import permit_items

    hint = permit_items.hint

    def unbounded(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return drop_condition(hint(*args, **kwargs), "#hw > :n")

    # A slot freed under an old limit is hinted into a row reset since (before 73004a4).
    mp.setattr(permit_items, "hint", unbounded)


def write_off_looks_at_once(mp: pytest.MonkeyPatch) -> None:
    import math

    from dynasem._engine import readers

    real = readers.try_write_off

    def try_write_off(seen: Any, skew: float) -> Any:
        after = real(seen, skew)
        if seen is not None:
            key = readers._key(seen)
            if key in readers._watched:
                readers._watched[key] = (0.0, math.inf)  # due again at once
        return after

    mp.setattr(readers, "try_write_off", try_write_off)


def permit_row_uncovered(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import permits
    from dynasem._storage import permit_items

    take_slot = permit_items.take_slot

    def uncovered(*args: Any, cover_ms: int | None = None, **kwargs: Any) -> dict[str, Any]:
        return take_slot(*args, **kwargs)

    def cover(self: Any, expires_ms: int) -> Any:
        return True
        yield  # a generator of no steps, as the real one's are

    # A take's row write leaves the row listed as it was, raised to cover the permit only
    # once the permit is written (before c59bafe): the reaper between the two writes.
    mp.setattr(permit_items, "take_slot", uncovered)
    mp.setattr(permits._Acquire, "cover", cover)


def heard_lease_without_skew(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    from dynasem._engine import take

    real = take.held_if_trusted

    def held_if_trusted(run: Any, plans: Any, *args: Any, sent_mono: Any, **kwargs: Any) -> Any:
        if sent_mono is None:  # heard of (a read, a push): trusted to its stored lease end
            skew_ms = int(run.skew * 1000)
            plans = {
                r: dataclasses.replace(p, expires_ms=p.expires_ms + skew_ms)
                for r, p in plans.items()
            }
        return real(run, plans, *args, sent_mono=sent_mono, **kwargs)

    # A hold we only heard of (a hand-over pushed from another host, a read) trusted until
    # its stored lease end by our clock, the skew between the writer's clock and ours not
    # allowed for.
    mp.setattr(take, "held_if_trusted", held_if_trusted)


def confirm_on_a_row_made_anew(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import permit_hold

    cover = permit_hold.cover

    def any_permit_row(resource: str, expires_ms: int, slot: int | None = None) -> int:
        return cover(resource, expires_ms)

    # A late take's confirming renewal (or a renewal) raises any permit row, not only one
    # whose ``hw`` counts its slot (before the twenty-first session's fix): a row reaped and
    # made anew under a lower limit while the take was paused gets a permit above its limit.
    mp.setattr(permit_hold, "cover", any_permit_row)


def item_release_given_up(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import hold
    from dynasem.exceptions import SemaphoreUnavailable

    def given_up_at_once(self: Any, resource: str, send: Callable[[], object]) -> bool:
        try:
            send()
            return True
        except SemaphoreUnavailable as exc:
            self._log_unreleased(resource, exc)
            return False

    mp.setattr(hold.Held, "_item_given_back", given_up_at_once)


def multi_writer_writes_no_reader_off(mp: pytest.MonkeyPatch) -> None:
    import sys

    from dynasem._engine import readers

    write_off_due = readers.write_off_due

    def due(*args: Any, **kwargs: Any) -> bool:
        if sys._getframe(1).f_locals.get("one") is False:  # core.Acquire.wait, several
            return False
        return write_off_due(*args, **kwargs)

    mp.setattr(readers, "write_off_due", due)


def job_unconfirmed(mp: pytest.MonkeyPatch) -> None:
    from dynasem import _clock as clock
    from dynasem._background import run_once

    def trusted_unconfirmed(job: Any) -> None:
        # Trusted a whole lease from now, as if a renewal of ours had just been sent: no
        # write, so nothing confirms that nobody claimed the job meanwhile.
        job._deadline = clock.monotonic() + job.lease - job.skew
        job._lost = None
        job._start_heartbeat()

    mp.setattr(run_once.Job, "confirm", trusted_unconfirmed)


def job_finish_ignores_token(mp: pytest.MonkeyPatch) -> None:
    from dynasem._background import run_once
    from dynasem._storage import job_writes

    mp.setattr(run_once.job_writes, "job_finish", _dropping(job_writes.job_finish, "#token = :tok"))


def job_claim_ignores_lease(mp: pytest.MonkeyPatch) -> None:
    from dynasem._background import run_once
    from dynasem._storage import job_writes

    claim = job_writes.job_claim

    def job_claim(*args: Any, **kwargs: Any) -> dict[str, Any]:
        action = claim(*args, **kwargs)
        text = action["ConditionExpression"].replace(" AND #expMs < :stale", "")
        action["ConditionExpression"] = text
        del action["ExpressionAttributeValues"][":stale"]
        return action

    mp.setattr(run_once.job_writes, "job_claim", job_claim)


def adopt_ignores_claim(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import claims

    mp.setattr(claims, "adopt_hold", _dropping(claims.adopt_hold, "attribute_exists(#h.#c)"))


def retry_ignores_run_lease(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    from dynasem._background import unique
    from dynasem._storage import claims

    announcer, adopt_hold = unique._announcer, claims.adopt_hold

    def looks_ended(item: Any, next_token: str) -> Any:
        found = announcer(item, next_token)
        if found is None:
            return None
        token, run = found
        return token, dataclasses.replace(run, expires_ms=0)  # as if its lease had ended

    def whatever_its_lease(*args: Any, announced: str | None = None, **kwargs: Any) -> Any:
        action = adopt_hold(*args, announced=announced, **kwargs)
        return drop_condition(action, "#h.#c.#e < :stale") if announced is not None else action

    # A retry takes over from the run that enqueued it without waiting for the run's lease.
    mp.setattr(unique, "_announcer", looks_ended)
    mp.setattr(claims, "adopt_hold", whatever_its_lease)


def claim_keeps_renewing(mp: pytest.MonkeyPatch) -> None:
    from dynasem._background import unique

    # The claim is not let go at enqueue: the enqueuing process's heartbeat renews it.
    mp.setattr(unique, "stop_renewing", lambda held: None)


def renew_reader_past_break(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import reader_items

    # A reader item's renewal no longer requires its lease end (a break's tombstone has none).
    renew = _dropping(reader_items.renew_reader, "attribute_exists(#e)")
    mp.setattr(reader_items, "renew_reader", renew)


def renew_permit_past_break(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import permit_items

    # A permit's renewal no longer requires our token in it (a break takes it off).
    mp.setattr(permit_items, "renew_permit", _dropping(permit_items.renew_permit, "#k = :tok"))


def adopt_unconfirmed(mp: pytest.MonkeyPatch) -> None:
    from dynasem._background import unique

    # A late adoption's hold is run as it is, not confirmed first (before the fix).
    def renewed(held: Any) -> Any:
        unique.start_renewing(held)
        return held

    mp.setattr(unique, "_renewed", renewed)


def interrupt_forgets_taken(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import steps

    # An interrupt at a step after a take landed (a back-off, a read, a wait) gives nothing
    # back but the step's own write (before 6849654): the take sits to its lease.
    interrupted = steps._interrupted
    mp.setattr(steps, "_interrupted", lambda step, queued, taken=None: interrupted(step, queued))


def interrupt_forgets_write(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import steps

    # An interrupt during a write no longer gives back what that write may have taken (its
    # answer lost with the interrupt): only an earlier one that was answered.
    interrupted = steps._interrupted

    def forgetting(step: Any, queued: Any, taken: Any = None) -> None:
        if isinstance(step, steps.Write):
            step = steps.Sleep(0)  # as if interrupted at a step that writes nothing
        interrupted(step, queued, taken)

    mp.setattr(steps, "_interrupted", forgetting)


def interrupted_release_kept(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine.hold import Held

    # A release interrupted before it began (its wait for a renewal in flight, holding the
    # hold's lock) keeps the hold as if never released (before the fix): the heartbeat
    # renewing it, the thread's next acquire re-entering it; a ``with`` block's exit never
    # runs again, and the hold is kept for nobody.
    release_now = Held._release_now

    def kept(self: Held) -> None:
        beating = self._heartbeat
        try:
            release_now(self)
        except BaseException:
            if self.left_to_lease:
                self.left_to_lease = False
                if beating is not None and self._heartbeat is None and self._lost is None:
                    self._heartbeat = beating
                    beating.stopped = False  # still scheduled, or renewing: it beats on
            raise

    mp.setattr(Held, "_release_now", kept)
    # Nor does release() leave it to its lease when the interrupt comes out (review-3's fix
    # of an interrupt before the give-back began, which would mend this one too).
    mp.setattr(Held, "_cut_short", lambda self, exc: None)


def interrupted_claim_kept(mp: pytest.MonkeyPatch) -> None:
    from dynasem._background import run_once

    # A run_once claim interrupted after it landed is not given back (before the fix): the
    # job sits RUNNING under it, every other run_once refused, until its lease runs out.
    # (A claim whose answer was lost for good is given back still: other profiles reach it.)
    real = run_once.give_back

    def kept(key: str, token: str, interrupt: BaseException) -> None:
        if isinstance(interrupt, Exception):
            real(key, token, interrupt)

    mp.setattr(run_once, "give_back", kept)


def interrupted_adoption_kept(mp: pytest.MonkeyPatch) -> None:
    from dynasem._background import unique

    # An adoption interrupted after it landed is not given back (before the fix): the key
    # stays held by a run nobody makes until the run lease runs out.
    mp.setattr(unique, "_withdraw_run", lambda token, resource: None)


def handed_row_kept(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import permits

    # A permit waiter handed the row by an exclusive holder takes its ticket for passed and
    # queues again, the row left held by it, unused, until its lease ends (before the fix).
    mp.setattr(permits, "handed_to", lambda token, seen: False)


def _registering(mp: pytest.MonkeyPatch, clause: str) -> None:
    """next_runs.register_next's condition without one of its OR-ed clauses (and its value)."""
    import types

    from dynasem._storage import dynamodb, next_runs

    def send_to_table(operation: str, values: Any = None, **request: Any) -> Any:
        if operation == "put_item":
            parts = request["ConditionExpression"].split(" OR ")
            assert clause in parts, clause
            request["ConditionExpression"] = " OR ".join(p for p in parts if p != clause)
            values = {k: v for k, v in values.items() if k not in clause}
        return dynamodb.send_to_table(operation, values, **request)

    proxy = types.SimpleNamespace(
        send_to_table=send_to_table, Refused=dynamodb.Refused, REFUSED_OLD=dynamodb.REFUSED_OLD
    )
    mp.setattr(next_runs, "dynamodb", proxy)


def register_ignores_fence(mp: pytest.MonkeyPatch) -> None:
    # A registration no longer gives way to a caller that read a later fence: a next run
    # that has begun (or been overtaken) still answers callers Coalesced.
    _registering(mp, "#af < :af")


def register_ignores_lease(mp: pytest.MonkeyPatch) -> None:
    # A registration is never replaced for its lease: a dead next runner's stands.
    _registering(mp, "#un < :stale")


def _registration_class() -> Any:
    """The library's coalescing.Registration (the simulation wraps it for the monitor)."""
    from dynasem._engine import coalescing

    return getattr(coalescing.Registration, "library", coalescing.Registration)


def gave_up_keeps_renewing(mp: pytest.MonkeyPatch) -> None:
    # A next run that gives up (its wait ran out) or fails neither withdraws its
    # registration nor stops renewing it: callers are answered Coalesced by nobody.
    mp.setattr(_registration_class(), "withdraw", lambda self: None)


def next_renewal_unsent(mp: pytest.MonkeyPatch) -> None:
    # The next run's heartbeat pushes its trust on without renewing the stored lease: its
    # registration lapses, and is replaced, while it trusts it.
    from dynasem import _clock as clock

    def renew(self: Any) -> None:
        self._deadline = clock.monotonic() + self.lease - self.skew

    mp.setattr(_registration_class(), "renew", renew)


def withdraw_when_replaced(mp: pytest.MonkeyPatch) -> None:
    # The withdrawal is sent whatever a renewal said (before the coalesce mix's first runs):
    # a runner told it was replaced deletes, conditional on a token no longer there.
    registration = _registration_class()
    renew = registration.renew

    def renew_and_forget(self: Any) -> None:
        try:
            renew(self)
        finally:
            self._replaced = False

    mp.setattr(registration, "renew", renew_and_forget)


def registered_on_a_clock_fence(mp: pytest.MonkeyPatch) -> None:
    # A caller whose fence read finds the row reaped registers under a fence from its clock
    # (before the fix), not waiting unregistered.
    import dataclasses
    import types

    from dynasem import _clock as clock
    from dynasem._engine import coalescing
    from dynasem._storage import lock_rows, records

    def get(resource: str, **kwargs: Any) -> Any:
        row = lock_rows.get(resource, **kwargs)
        if row is not None:
            return row
        skew = coalescing.resolve_timing(None, None)[2]
        return dataclasses.replace(records.LockItem(), fence=clock.new_fence(skew))

    mp.setattr(coalescing, "lock_rows", types.SimpleNamespace(get=get))


def lead_trusted_until_lost(mp: pytest.MonkeyPatch) -> None:
    # A leader trusts its lead until told it is lost, not to its deadline: a leader stalled
    # past its lease acts on beside the one that took over.
    from dynasem._background.leadership import Lead

    def active(self: Any) -> bool:
        return not (self._given_back or self._lost.is_set() or self.held._lost is not None)

    mp.setattr(Lead, "active", property(active))
    mp.setattr(Lead, "seconds_left", lambda self: self.held.lease if self.active else 0.0)


MUTATIONS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    f.__name__: f
    for f in (
        no_skew_in_trust,
        take_ignores_lease,
        take_ignores_fence,
        trust_from_answer,
        renewal_ignores_refusal,
        renew_without_token,
        takeover_waits_a_lease,
        room_ignores_limit,
        join_ignores_count,
        room_ignores_mode,
        handover_ignores_queue,
        handover_ignores_fence,
        release_without_token,
        hand_on_ignores_entry,
        hand_on_ignores_queue,
        hand_on_ignores_fence,
        hand_on_ignores_row,
        hand_on_fence_not_above,
        hand_on_unproven,
        renewal_trusted_from_answer,
        heard_hold_trusted,
        lost_handover_is_a_loss,
        release_before_commit,
        queued_plan_from_old_row,
        no_join_grace,
        limit_change_unfenced,
        hint_past_hw,
        write_off_looks_at_once,
        permit_row_uncovered,
        heard_lease_without_skew,
        confirm_on_a_row_made_anew,
        item_release_given_up,
        multi_writer_writes_no_reader_off,
        job_unconfirmed,
        job_finish_ignores_token,
        job_claim_ignores_lease,
        adopt_ignores_claim,
        retry_ignores_run_lease,
        claim_keeps_renewing,
        adopt_unconfirmed,
        interrupt_forgets_taken,
        interrupt_forgets_write,
        interrupted_release_kept,
        interrupted_claim_kept,
        interrupted_adoption_kept,
        handed_row_kept,
        register_ignores_fence,
        register_ignores_lease,
        gave_up_keeps_renewing,
        next_renewal_unsent,
        withdraw_when_replaced,
        registered_on_a_clock_fence,
        lead_trusted_until_lost,
        renew_reader_past_break,
        renew_permit_past_break,
    )
}
