"""Interrupts: a user's Ctrl-C (``KeyboardInterrupt``) thrown into an acquire.

In production a ``KeyboardInterrupt`` can arrive at any bytecode of a blocking acquire; a
process spends nearly all of an acquire's time blocked (a request's wait, a back-off, a wait
in the queue, a lock), so that is where the simulator throws it, into the process's main
thread, in one of three shapes drawn per interrupted acquire:

* ``timed``: at a moment drawn from the start of the acquire (half within its first 30 ms,
  where its first writes are in flight, half exponential of mean 1.5 s: back-offs and queue
  waits), at whatever the thread is blocked on then; a request whose wait it ends still
  reaches DynamoDB and applies (it had left);
* ``before_send``: as the ``n``-th write of the acquire is about to be sent (never sent);
* ``after_apply``: as the ``n``-th write is applied, its answer lost with the interrupt (the
  write landed; the process never learns it did);
* ``after_answer``: at the first wait after the ``n``-th write's answer was read (the next
  step: a back-off, a read, a confirming renewal, a wait in the queue), what it took known.

The caller handles the interrupt as a server's request handler does a cancelled request: it
goes on with its next step (a process that stopped would hide what the interrupt left behind
from the liveness checks, and a heartbeat that renewed a leftover would never show).

Invariants (on top of the monitor's, which see interrupted acquirers as waiters that stop
waiting): an interrupted acquire never runs its body; and when the ``KeyboardInterrupt``
comes out of dynasem, nothing live of the acquire's tokens is left in the database (a lock
row's holder, a queue entry whose turn has not passed, a reader item, a permit, a job claim
whose lease end is ahead)
unless it is excused: a give-back request of the process failed (an error or a lost answer:
it holds until its lease runs out, as documented), a write sent before the interrupt applied
after it (the sync driver cannot wait for the request it was interrupted in), or another
process's hand-over made the token a holder (handed on by ``push.depart``; checked again
``RECHECK`` seconds later, when it must be gone).

Holds too (the ``run`` workload's blocks; the bodies' and releases' draws come from an rng
of their own, so an acquire's interrupts fall as they did):

* in the **body** (half the rate): ``timed``, at a moment drawn within the block's work; the
  block is left by the interrupt, and ``__exit__`` gives the hold back with the exception;
* in the **release** (the rate): the acquire's shapes, counted in the release's own writes
  (a hand-over, a plain release, a reader's or a permit's delete and count-down, a
  transaction of several resources), ``timed`` mostly within its first 30 ms, and
  ``first_wait``: at its first wait (for the heartbeat's renewal in flight, which holds the
  hold's lock; else its first request's answer). Half of them are an explicit
  ``held.release()`` in the block (``__exit__`` then runs with the exception and finds the
  hold released, or not begun), half ``__exit__``'s own.

What must hold once the interrupt came out (a committer's open transaction rolled back
first: a hold pending its commit is given back then):

* a body's hold is given back, as an acquire's leftovers are (nothing of its token live,
  unless a give-back request failed or a write sent before applied after);
* a release's hold is given back or left to its lease: both fine (stats
  ``interrupt_given_back``, ``interrupt_left_to_lease``);
* for either, **no new write** of the process's other threads names its token from then on
  (a heartbeat's renewal for nobody, or a write refused for certain; an attempt again of a
  request sent before, or a renewal that was in flight then, which the release waited for,
  is not new: ``interrupt_given_up_in_flight``);
* a lease and the skew after the return, nothing of its token is live (a renewal sent
  before the interrupt wrote a lease end within half the skew of a lease from then): it
  lapsed, not kept for nobody;
* and each **hand-over** the process wrote since the release began (a grant of another
  token in a row) has reached its heir (whose block began with it) or lapsed by then: no
  waiter waits behind a hand-over nobody will use for longer than a lease (the liveness
  check does not watch the fault window);
* and an interrupt thrown never vanishes in dynasem (the block ending normally after it).
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

from .scheduler import Waiter

SHAPES = ("timed", "before_send", "after_apply", "after_answer")
PHASES = ("acquire", "body", "release")
# A release's: besides, at its first wait (for a renewal in flight, holding the hold's lock;
# else its first request's answer).
RELEASE_SHAPES = (*SHAPES, "first_wait")
RECHECK = 5.0  # seconds after the return: a stray hand-over must be handed on by then
REFUSED_CODES = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})


@dataclasses.dataclass
class Plan:
    """One armed acquire of a process: how it is interrupted, and what happened."""

    shape: str
    nth_write: int
    delay: float
    started: float
    tokens: list[str] = dataclasses.field(default_factory=list)
    writes: int = 0  # write attempts of the acquire so far
    fired: float | None = None  # when the interrupt was thrown
    next_wait: bool = False  # ``after_answer``: at the main thread's next wait
    returned: bool = False
    in_flight: int = 0  # requests of the acquire sent before the interrupt, not yet applied
    late: bool = False  # one of them applied after the interrupt
    faulted: bool = False  # a request of the give-back failed (lost, error, throttled)
    held_at_fire: bool = False  # something live of its tokens was stored when it fired
    cleanup_writes: int = 0
    cleanup_refused: int = 0
    # The give-backs that applied (their keys and expressions): one sent again is refused.
    cleaned: set[tuple[Any, ...]] = dataclasses.field(default_factory=set)
    applied: dict[Any, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    label: str = ""
    phase: str = "acquire"  # PHASES: what it interrupts
    threads: set[Any] = dataclasses.field(default_factory=set)  # the process's, at the return
    held: Any = None  # a release's hold
    # The hand-overs its release wrote (resource, token) -> their lease end, at the return.
    handed_ends: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    explicit: bool = False  # a release: ``held.release()`` in the block, not ``__exit__``'s


# What a request of an armed acquisition carries: of the acquire or of its cleanup, and its plan.
Tag = tuple[str, Plan] | None


class Interrupts:
    """The interrupt fault of a run (``Profile.interrupt`` or ``Options.interrupts``: the
    share of acquires interrupted, in the fault window)."""

    def __init__(self, sim: Any, rate: float):
        self.sim, self.rate = sim, rate
        self.plans: dict[Any, Plan] = {}  # proc -> its armed acquire, body or release
        # Bodies' and releases' draws: an acquire's (the fault rng's) go as they went.
        self.rng = random.Random(f"{sim.options.seed}:interrupts")
        # proc -> the holds its interrupted bodies and releases gave up (their plans), while
        # anything of theirs may be live: no write of the process may name them any more.
        self.given_up: dict[Any, list[Plan]] = {}

    # -- the workload's side -------------------------------------------------------------------

    def arm(self, proc: Any, label: str) -> None:
        """``proc``'s main thread begins an acquire (``label``: which); maybe interrupted."""
        self.plans.pop(proc, None)
        sim = self.sim
        if not self.rate or sim.quiet():
            return
        rng = sim.fault_rng
        if rng.random() >= self.rate:
            return
        shape = rng.choice(SHAPES)
        nth = 1
        while rng.random() < 0.5 and nth < 6:
            nth += 1
        delay = rng.uniform(0.0, 0.03) if rng.random() < 0.5 else rng.expovariate(1 / 1.5)
        plan = Plan(shape, nth, delay, sim.sched.now, label=label)
        self.plans[proc] = plan
        if shape == "timed":
            sim.sched.at(delay, lambda: self._fire_timed(proc, plan))

    def arm_body(self, proc: Any, held: Any, seconds: float) -> None:
        """``proc``'s block begins, to work ``seconds``: maybe a Ctrl-C in it (timed), which
        leaves the block: ``__exit__`` gives the hold back with the exception."""
        sim, rng = self.sim, self.rng
        if not self.rate or sim.quiet() or rng.random() >= self.rate / 2:
            return
        plan = Plan("timed", 0, rng.uniform(0.0, seconds), sim.sched.now, phase="body")
        plan.tokens.append(held.token)
        plan.label = f"{proc.kind} body"
        self.plans[proc] = plan
        sim.sched.at(plan.delay, lambda: self._fire_timed(proc, plan))

    def arm_release(self, proc: Any, held: Any) -> bool:
        """``proc``'s block ends: maybe a Ctrl-C in its release (the shapes of an acquire's,
        counted in the release's writes). True: released explicitly (``held.release()`` in
        the block; ``__exit__`` then finds it released)."""
        self.plans.pop(proc, None)  # a body's interrupt that never came
        sim, rng = self.sim, self.rng
        if not self.rate or sim.quiet() or rng.random() >= self.rate:
            return False
        shape = rng.choice(RELEASE_SHAPES)
        nth = 1
        while rng.random() < 0.3 and nth < 4:
            nth += 1
        delay = rng.uniform(0.0, 0.03) if rng.random() < 0.75 else rng.expovariate(1 / 0.3)
        plan = Plan(shape, nth, delay, sim.sched.now, phase="release")
        plan.explicit = rng.random() < 0.5
        plan.held = held
        plan.tokens.append(held.token)
        plan.label = f"{proc.kind} {'release()' if plan.explicit else '__exit__'}"
        self.plans[proc] = plan
        if shape == "timed":
            sim.sched.at(delay, lambda: self._fire_timed(proc, plan))
        plan.next_wait = shape == "first_wait"
        return plan.explicit

    def phase(self, proc: Any) -> str:
        """What ``proc``'s interrupt, if one was thrown, interrupted."""
        plan = self.plans.get(proc)
        return plan.phase if plan is not None else "acquire"

    def drawn(self, proc: Any, token: str) -> None:
        """``proc`` drew ``token`` (a uuid4): if it is in an armed acquire, one of its tokens."""
        plan = self.plans.get(proc)
        if plan is not None and not plan.returned and self._main(proc):
            plan.tokens.append(token)

    def began(self, proc: Any) -> None:
        """``proc``'s body begins: the acquire is over (an interrupted one must never get here)."""
        plan = self.plans.pop(proc, None)
        if plan is not None and plan.fired is not None:
            self.sim.monitor.fail(
                f"{proc.name}: an interrupted acquire ({plan.label}, {plan.shape}) ran its body"
            )

    def ended(self, proc: Any) -> None:
        """``proc``'s block ended, its hold given back, no exception: a body's or release's
        interrupt must have come out."""
        plan = self.plans.pop(proc, None)
        if plan is not None and plan.fired is not None:
            self.sim.monitor.fail(
                f"{proc.name}: dynasem swallowed a KeyboardInterrupt ({plan.label}, {plan.shape})"
            )

    def disarm(self, proc: Any) -> None:
        """The acquire ended without an interrupt (busy, unavailable, refused, done)."""
        plan = self.plans.get(proc)
        if plan is not None and plan.fired is None:
            del self.plans[proc]

    def returned(self, proc: Any) -> None:
        """The ``KeyboardInterrupt`` came out of dynasem to ``proc``'s caller: check what it
        left behind."""
        sim, stats = self.sim, self.sim.stats
        plan = self.plans.pop(proc, None)
        if plan is None or plan.fired is None:
            sim.monitor.fail(f"{proc.name}: a KeyboardInterrupt nobody threw")
            return
        plan.returned = True
        stats["interrupt_returned"] += 1
        stats["interrupt_cleanup_writes"] += plan.cleanup_writes
        stats["interrupt_cleanup_refused"] += plan.cleanup_refused
        if plan.phase != "acquire":
            self._returned_hold(proc, plan)
            return
        if plan.held_at_fire:
            stats["interrupt_needed"] += 1
        elif plan.cleanup_refused and not plan.in_flight and not plan.late:
            # Nothing of ours stored when it fired, nothing in flight: every refusal blind.
            stats["interrupt_blind_refusals"] += plan.cleanup_refused
        left = self.leftovers(plan.tokens)
        sim.record(
            "int_ret", proc, plan.shape, len(left), plan.cleanup_writes, plan.cleanup_refused
        )
        self._judge(proc, plan, left, now=True)
        if left:
            sim.sched.at(RECHECK, lambda: self._judge(proc, plan, self.leftovers(plan.tokens)))

    def _returned_hold(self, proc: Any, plan: Plan) -> None:
        """An interrupted body's or release's ``KeyboardInterrupt`` came out: a body's hold
        was given back by ``__exit__`` (unless a give-back request failed); a release's
        was, or is left to its lease. Either way: no write for it from now on, nothing of it
        live once a lease and the skew are over, and no hand-over of the release left
        unused by then (:meth:`_lapsed`)."""
        sim, stats = self.sim, self.sim.stats
        stats[f"interrupt_{plan.phase}_returned"] += 1
        left = self.leftovers(plan.tokens)
        handed = [
            key
            for key, writer in sim.monitor.granted_by.items()
            if writer is proc
            and key[1] not in plan.tokens
            and sim.monitor.grant_time.get(key, -1.0) >= plan.started
        ]
        stats["interrupt_handed_over"] += len(handed)
        rows = sim.monitor.rows
        plan.handed_ends = {
            (r, t): rows[r].holders[t].expires_ms
            for r, t in handed
            if r in rows and t in rows[r].holders
        }
        sim.record("int_ret", proc, plan.phase, plan.shape, len(left), len(handed))
        if plan.phase == "release":
            stats["interrupt_left_to_lease" if left else "interrupt_given_back"] += 1
            # Its wait for a renewal in flight interrupted: the release never began.
            stats["interrupt_release_not_begun"] += bool(getattr(plan.held, "left_to_lease", 0))
        elif left and not (plan.faulted or plan.late):
            sim.monitor.fail(
                f"interrupt: {proc.name}'s interrupted block ({plan.label}) left "
                f"{', '.join(left)} as control returned, its give-back answered"
            )
        elif left:
            stats["interrupt_leftover_excused"] += 1
        # Its threads now (a renewal in flight, which the release waited for: its writes
        # are not new ones; a renewal begun from now on is).
        plan.threads = {t for t in proc.threads if not t.finished}
        self.given_up.setdefault(proc, []).append(plan)
        bound = sim.options.lease + sim.options.skew
        sim.sched.at(bound, lambda: self._lapsed(proc, plan, handed))

    def _lapsed(self, proc: Any, plan: Plan, handed: list[tuple[str, str]]) -> None:
        """A lease and the skew after ``plan``'s interrupt came out: its hold lapsed, and
        each hand-over its release wrote reached its heir or lapsed too."""
        sim = self.sim
        self.given_up[proc].remove(plan)
        left = self.leftovers(plan.tokens)
        if left:
            sim.monitor.fail(
                f"interrupt: {proc.name}'s hold ({plan.label}, {plan.shape}) still live "
                f"a lease and the skew after its interrupt came out: {', '.join(left)}"
            )
        now_ms = int(sim.sched.now * 1000)
        for resource, token in handed:
            row = sim.monitor.rows.get(resource)
            holder = row.holders.get(token) if row is not None else None
            if holder is None or holder.expires_ms <= now_ms:
                continue
            if holder.expires_ms != plan.handed_ends.get((resource, token)):
                sim.stats["interrupt_handover_taken_up"] += 1  # its heir renewed it
                continue
            if (resource, token) not in sim.monitor.entered_tokens:
                sim.monitor.fail(
                    f"interrupt: the hand-over of {resource!r} to {token[:8]} that "
                    f"{proc.name}'s interrupted release ({plan.label}) wrote is still live, "
                    "unused, a lease and the skew after the interrupt came out"
                )

    def _after_given_up(self, proc: Any, params: Any, attempt: int) -> None:
        """A write of ``proc``'s other threads (a heartbeat's renewal) while holds it gave
        up may be live: one that names them renews for nobody or is refused for certain
        (an attempt again of a request sent before, as botocore retries it, is not new)."""
        text = json.dumps(params, default=str)
        for plan in self.given_up[proc]:
            if not any(t in text for t in plan.tokens):
                continue
            if attempt or self.sim.sched.current in plan.threads:
                self.sim.stats["interrupt_given_up_in_flight"] += 1
                continue
            self.sim.monitor.fail(
                f"interrupt: {proc.name} ({self.sim.sched.current.name}) sent a write for "
                "its hold after its interrupted "
                f"{plan.phase} ({plan.label}, {plan.shape}) came out (renewed for nobody, "
                "or refused for certain)"
            )

    def _judge(self, proc: Any, plan: Plan, left: list[str], *, now: bool = False) -> None:
        sim, stats = self.sim, self.sim.stats
        if not left:
            return
        if plan.faulted or plan.late:
            stats["interrupt_leftover_excused" if now else "interrupt_leftover_expires"] += 1
            return
        if now:  # another's hand-over (push.depart hands it on): looked at again later
            stray = [s for s in left if s.startswith("row ") and self._handed(s, proc)]
            if len(stray) == len(left):
                stats["interrupt_leftover_stray"] += 1
                return
        when = "as" if now else f"{RECHECK:g}s after"
        sim.monitor.fail(
            f"interrupt: {proc.name}'s interrupted acquire ({plan.label}, {plan.shape}, "
            f"write {plan.nth_write}) left {', '.join(left)} {when} control returned"
        )

    def _handed(self, leftover: str, proc: Any) -> bool:
        _, resource, token = leftover.split(" ", 2)
        writer = self.sim.monitor.granted_by.get((resource, token))
        return writer is not None and writer is not proc

    # -- the scheduler's and the network's side ------------------------------------------------

    def _main(self, proc: Any) -> bool:
        thread = self.sim.sched.current
        return thread is not None and thread.proc is proc and thread.name == "main"

    def _throw(self, proc: Any, plan: Plan) -> None:
        plan.fired = self.sim.sched.now
        plan.held_at_fire = bool(self.leftovers(plan.tokens))
        self.sim.stats["interrupt"] += 1
        self.sim.stats[f"interrupt_{plan.shape}"] += 1
        self.sim.stats[f"interrupt_in_{plan.phase}"] += 1
        self.sim.record("interrupt", proc, plan.label, plan.shape, plan.writes)

    def _fire_timed(self, proc: Any, plan: Plan) -> None:
        if self.plans.get(proc) is not plan or plan.fired is not None or proc.dead:
            return
        main = next((t for t in proc.threads if t.name == "main" and not t.finished), None)
        waiter = main.waiter if main is not None else None
        if waiter is None or waiter.done:
            return  # running (cannot be, in the hub) or already woken: no interrupt
        self._throw(proc, plan)
        self.sim.sched.resolve(waiter, error=KeyboardInterrupt())

    def blocking(self, waiter: Waiter) -> None:
        """A thread begins a wait: an ``after_answer`` interrupt ends it at once."""
        thread = waiter.thread
        plan = self.plans.get(thread.proc)
        if plan is None or not plan.next_wait or thread.name != "main":
            return
        plan.next_wait = False
        if plan.fired is None and not plan.returned:
            self._throw(thread.proc, plan)
            self.sim.sched.resolve(waiter, error=KeyboardInterrupt())

    def sending(self, proc: Any, write: bool, params: Any = None, attempt: int = 0) -> Tag:
        """A request attempt of ``proc`` is about to be sent: its tag (``"acquire"``: of an
        armed acquire, body or release, ``"cleanup"``: of the give-back after the interrupt;
        with the plan, which a request that applies after the interrupt came out still
        finds), or raises the interrupt (``before_send``)."""
        if write and self.given_up.get(proc) and not self._main(proc):
            self._after_given_up(proc, params, attempt)
        plan = self.plans.get(proc)
        if plan is None or plan.returned or not self._main(proc):
            return None
        if plan.fired is not None:
            return ("cleanup", plan)
        if write:
            plan.writes += 1
            if plan.shape == "before_send" and plan.writes == plan.nth_write:
                self._throw(proc, plan)
                raise KeyboardInterrupt
        plan.in_flight += 1
        return ("acquire", plan)

    def applied(
        self,
        proc: Any,
        waiter: Waiter,
        write: bool,
        result: tuple[str, Any],
        tag: Tag,
        params: dict[str, Any],
    ) -> bool:
        """A request of ``proc`` was applied (``result``). True: the interrupt comes now, its
        answer lost (``after_apply``)."""
        if tag is None:
            return False
        kind, plan = tag
        if kind == "cleanup":
            if write:
                plan.cleanup_writes += 1
                same = _give_back_of(params)
                if result[0] == "error" and _code(result[1]) in REFUSED_CODES:
                    plan.cleanup_refused += 1
                    if same in plan.cleaned:  # this very give-back applied already: certain
                        self.sim.stats["interrupt_redundant"] += 1
                        self.sim.record("redundant", proc, *same[0])
                elif result[0] == "ok":
                    plan.applied[waiter] = same  # seen applied once its answer comes
            if result[0] == "error" and (
                _code(result[1]) not in REFUSED_CODES or _conflict(result[1])
            ):
                plan.faulted = True  # (a transaction's conflict passes: given up past the
            return False  # deadline, the hold is left to its lease, as a throttle's)
        plan.in_flight -= 1
        if plan.fired is not None:
            if write:
                plan.late = True  # sent before the interrupt, applied after it
                self.sim.stats["interrupt_late_write"] += 1
            return False
        if write and plan.shape == "after_answer" and plan.writes == plan.nth_write:
            plan.next_wait = not waiter.done  # answered now (unless its wait timed out)
            return False
        if write and plan.shape == "after_apply" and plan.writes == plan.nth_write:
            if waiter.done:
                return False  # its wait ended already (a read timeout)
            self._throw(proc, plan)
            self.sim.sched.resolve(waiter, error=KeyboardInterrupt())
            return True
        return False

    def failed(self, proc: Any, tag: Tag) -> None:
        """A request attempt of ``proc`` failed without an answer (lost, dropped, unsent)."""
        if tag is not None and tag[0] == "cleanup":
            tag[1].faulted = True

    def answered(self, proc: Any, waiter: Waiter) -> None:
        """The answer to a request of ``proc`` reached it (a give-back seen applied: one
        sent again after it is certain to be refused; one whose answer was lost, botocore
        sends again itself)."""
        plan = self.plans.get(proc)
        if plan is not None and waiter in plan.applied:
            plan.cleaned.add(plan.applied.pop(waiter))

    @staticmethod
    def _waits(table: dict[str, Any], resource: str, sk: str, ticket: int) -> bool:
        """Whether the queue entry at ``sk`` still stands before anyone: of the row's queue,
        its turn not passed (an entry the turn has passed, or of an older queue, blocks
        nobody: a waiter that found itself passed joins again, its old entry left to expire)."""
        from dynasem._storage import records

        row = _row_of(table, resource)
        if row is None:
            return False
        return sk == records.entry_sk(row.queue_id, ticket) and ticket > row.queue_out

    def dropped(self, proc: Any, tag: Tag) -> None:
        """A request attempt of ``proc`` was lost on its way (never applied)."""
        if tag is not None and tag[0] == "acquire":
            tag[1].in_flight -= 1

    # -- the database ----------------------------------------------------------------------------

    def leftovers(self, tokens: list[str]) -> list[str]:
        """What live of ``tokens`` the database stores now (its lease end ahead of true time)."""
        if not tokens:
            return []
        from dynasem._storage import records

        sim = self.sim
        wanted = set(tokens)
        now_ms = int(sim.sched.now * 1000)
        found: list[str] = []
        snapshot = getattr(sim.db, "snapshot", None)
        if snapshot is None:
            return found
        from .network import TABLE

        table = snapshot().get(TABLE, {})
        for key, raw in table.items():
            resource, sk = json.loads(key)
            text = repr(raw)
            if not any(t in text for t in wanted):
                continue
            item = records.decode(raw)
            if sk == records.LOCK_SK:
                row = records.lock_item(item)
                for token, holder in row.holders.items():
                    if token in wanted and holder.expires_ms > now_ms:
                        found.append(f"row {resource} {token}")
            elif sk.startswith(records.ENTRY_PREFIX):
                waiter = records.from_item(records.Waiter, item)
                if waiter.token in wanted and waiter.expires_ms > now_ms:
                    if self._waits(table, resource, sk, waiter.ticket):
                        found.append(f"entry {resource}/{sk}")
            elif sk.startswith(records.READER_PREFIX):
                reader = records.reader_of(item)
                if reader.token in wanted and not reader.broken_token:
                    if reader.holder.expires_ms > now_ms:
                        found.append(f"reader {resource}/{sk}")
            elif sk.startswith(records.PERMIT_PREFIX):
                permit = records.permit_of(item)
                if permit.token in wanted and permit.holder.expires_ms > now_ms:
                    found.append(f"permit {resource}/{sk}")
            elif sk == records.JOB_SK:
                job = records.job_row(item)
                running = job.status == "RUNNING" and (job.expires_ms or 0) > now_ms
                if job.token in wanted and running:
                    found.append(f"job {resource}")
        return found


def _row_of(table: dict[str, Any], resource: str) -> Any:
    from dynasem._storage import records

    raw = table.get(json.dumps([resource, records.LOCK_SK]))
    return records.lock_item(records.decode(raw)) if raw is not None else None


def _give_back_of(params: dict[str, Any]) -> tuple[Any, ...]:
    """A write as what it does: its items' keys and its expressions (not its values' times)."""
    actions = [next(iter(a.values())) for a in params.get("TransactItems", [])] or [params]
    keys = tuple(sorted(_key(a.get("Key") or a.get("Item") or {}) for a in actions))
    texts = tuple((a.get("UpdateExpression"), a.get("ConditionExpression")) for a in actions)
    return keys, texts


def _key(key: dict[str, Any]) -> str:
    return f"{key.get('pk', {}).get('S')}/{key.get('sk', {}).get('S')}"


def _conflict(error: Any) -> bool:
    """A transaction cancelled only for another request's transaction on its rows."""
    response = getattr(error, "response", None) or {}
    codes = {r.get("Code") for r in response.get("CancellationReasons") or []}
    return "TransactionConflict" in codes and codes <= {"TransactionConflict", "None", None}


def _code(error: Any) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))
