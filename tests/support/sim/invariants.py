"""What must hold at every step of a run, checked after every event.

* **Exclusion**: never two processes inside blocks of one resource whose holds both are still
  trusted at that instant, each by its own clock (``held.seconds_left() > 0``, not known
  lost), when one of them is exclusive; never more than ``limit`` trusted counting holders,
  and never counting holders of two limits at once.
  Trust only shrinks between events, so a check after each event sees every overlap begin.
* **Fences**: a hold granted on a resource (a token appearing among a lock row's holders, as
  the database applied the write) has a fence above every hold granted before it; an
  exclusive block begins only with its hold stored in the row, with the fence it was told,
  and never with a hold that a later grant superseded (taken over before it was entered).
* **Commits**: no block begins on a resource while another process's transaction that worked
  under it is still open, unless that process's hold has lapsed (its trusted deadline passed
  or it was told it lost it: then only a fence protects the data, and dynasem says so).
* **Losses**: a hold is never reported taken over when every write that removed its token
  was its own process's (a release or hand-over applied whose answer was lost) and its
  trusted deadline is still ahead.
* **Order** (first come, first served): a write that moves a queue's turn (``qout``) past a
  ticket serves that ticket's waiter, unless its entry may be dead to the writer: gone
  from the database, or its lease end within ``2 * CLOCK_SKEW + SLACK_ORDER`` of the true
  time, or it came that close to lapsing at any renewal, or its process died, left the
  wait, or queued again since. A live waiter passed over by a hand-over or a take is a
  violation. A waiter that told the holder it queued puts its entry only later
  (``queue.ENTRY_DEFER``): passing its ticket with no entry while it lives and waits, sooner
  than ``JOIN_GRACE / 2`` after its word, is a violation too, unless the word came
  ``JOIN_GRACE`` or more after the ticket was drawn (the ticket was missing that long). A
  passed entry put after the writer's last read of the queue is excused when that writer
  read the queue, with the ticket drawn, ``JOIN_GRACE`` or more before its write.
* **Jobs** (``run_once``): never two bodies of one key running whose claims both are still
  trusted (by each one's clock); a body begins only with its claim stored (RUNNING, its
  token, its fence), its fence above every earlier claim's of the key, never on a key once
  DONE, and never while another process's transaction that ran the key's body is open and
  that claim trusted; DONE is stored only for a body that returned, and whose transaction
  (if it ran in one) committed.
* **Unique tasks** (the ``unique`` mix): a run's adopted hold is an exclusive hold of its key,
  checked as blocks are (**Exclusion**, **Fences**: never two runs of a key at once whose
  holds are both trusted); besides, a claim (one message, delivered once or twice) runs at
  most once; a retry never begins while the run that enqueued it is inside and trusted; an
  enqueue refused (``Taken``) leaves no claim of its own in the row and is not refused by
  itself; and a key nobody owns (no message of it waiting or being run, no enqueue in
  flight: its messages lost, its worker dead) is free again, to an enqueue that begins
  ``QUEUE_LEASE`` leases + ``2 * CLOCK_SKEW + SLACK`` after the last owner went.
* **Coalescing** (the ``coalesce`` mix, ``CoalesceMonitor``): every call answered
  ``Coalesced`` is covered, once the run is over, by a run of its key whose hold was granted
  after the call arrived and whose body completed, unless the next run that refused it
  never ran (its runner died, gave up or failed: its callers count on the next caller
  after, docs/how-to/coalesce.md): a lost update otherwise. A registration never refuses a
  caller that arrived after its run's hold was granted; one whose runner died or gave up
  never refuses a caller whose clock (at its write) shows its lease + CLOCK_SKEW over, nor
  has a stored lease more than a lease past its runner's end (renewed for nobody); none is
  replaced for its lease alone (no hold since its fence) while its runner, alive and
  waiting, trusts it; and no runner sends a write certain to be refused (a withdrawal after
  a renewal told it it was replaced).
* **Leadership** (``LeadMonitor``): never two leaders acting at once (each acts in steps no
  longer than its ``lead.seconds_left()``), never two leads ``active`` at once by their own
  clocks, ``on_lost`` called at most once a term.
* **Breaks** (the ``breaks`` mix: an operator's ``dynasem_release``): from the write that
  broke a hold, its block is not counted beside others (its holder trusts it until a renewal
  is refused, and is not told sooner: only its fence protects its work, which the **Fences**
  checks of the others' grants still cover), nor checked as entered after it; but its trust
  never grows: the trusted deadline stays within what a write applied before the break gave
  (a lease less ``CLOCK_SKEW`` from its send; a hand-over's lease end, written by a clock
  ahead), so a renewal that the break did not refuse (an item made anew, a condition that
  misses the token) is a violation.
* **No request storm**: no thread of a process sends more than ``STORM`` requests in one
  second of virtual time. A loop that asks again at once (a writer that read its readers'
  items again and again while they renewed) costs on AWS what it costs here, and holds its
  caller past its wait.
* **Interrupts** (``tests/support/sim/interrupts.py``): an acquisition interrupted (Ctrl-C)
  never runs its body, and leaves nothing live of its tokens stored when control returns to
  its caller, unless a give-back request failed, a write sent before the interrupt applied
  after it, or another's hand-over reached it after it left the queue (gone 5 s later).
  Interrupts of a block's body or of its release: the hold is given back (a body's) or left
  to its lease (a release's), renewed by no new write after control returned, lapsed a
  lease and the skew later, and a hand-over the release wrote used by its heir or lapsed
  by then.
* **Liveness**, once the fault window is over: a resource is never idle (nobody inside) for
  longer than ``lease + 2 * CLOCK_SKEW + SLACK`` while a live process waits for it (for it
  and others at once: while nobody is inside those); the run ends with every live workload
  done. A write sent in the window, applied, whose answer never came is a fault of the
  window until its caller's read timeout ends (up to 10 s after it): the idle clocks of
  its resources (and of those their waiters want at once) start again then.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from dynasem._engine.hold import TAKEN_OVER
from dynasem._storage import reader_items, records
from dynasem._storage.queue_entries import JOIN_GRACE  # as released (a mutation changes it)
from dynasem._storage.records import Mode

from .workload import QUEUE_LEASE, UNIQUE_KEYS

SLACK = 3.0  # seconds: a waiter's paced look (at most a second) and a few round trips
SLACK_ORDER = 1.0  # seconds beyond 2 * CLOCK_SKEW that an entry passed over must still have
# Requests one process may send in a second of virtual time. The CI seeds' busiest second of
# one process (twentieth session, before the storm check): see RELIABILITY.md.
STORM = 100


class Violation(AssertionError):
    """An invariant broke: the seed replays it."""


@dataclasses.dataclass
class Inside:
    proc: Any
    held: Any
    mode: Mode
    limit: int
    since: float


class Monitor:
    def __init__(self, sim: Any, *, lease: float, skew: float, quiet_from: float):
        self.sim = sim
        self.bound = lease + 2 * skew + SLACK
        self.quiet_from = quiet_from
        self.inside: dict[str, dict[str, Inside]] = {}
        self.waiting: dict[str, set[Any]] = {}
        self.idle_since: dict[str, float] = {}
        self.holders: dict[str, dict[str, int]] = {}  # resource -> token -> fence, as stored
        self.grants: dict[tuple[str, str], int] = {}  # (resource, token) -> fence granted
        self.top_fence: dict[str, int] = {}
        self.violations: list[str] = []
        self.longest_idle = 0.0
        self.margins: list[tuple[float, str]] = []  # see _margin
        self.entries = 0
        self.open_work: dict[str, dict[Any, Any]] = {}  # resource -> proc -> its hold, uncommitted
        self.removed_by: dict[tuple[str, str], Any] = {}  # (resource, token) -> the writer
        self.skew = skew
        self.rows: dict[str, records.LockItem] = {}  # resource -> the row as last written
        # (resource, entry sk) -> (its lease end as last written, whether it came close to
        # lapsing at a renewal); (resource, process identity) -> the sk of its latest entry.
        self.entries_seen: dict[tuple[str, str], tuple[int, bool]] = {}
        self.latest_entry: dict[tuple[str, str], str] = {}
        self.entry_put: dict[tuple[str, str], float] = {}
        # Waiters whose word a holder took, by (resource, entry sk): their process, and when.
        self.words: dict[tuple[str, str], tuple[Any, float]] = {}
        # When each ticket was drawn (its queue's qin moved to it), by (resource, entry sk).
        self.drawn: dict[tuple[str, str], float] = {}
        self.queue_in: dict[str, tuple[int, int]] = {}  # by resource: (queue id, qin)
        # When each process read a queue's entries since it last moved that queue's turn, by
        # (resource, process).
        self.queue_reads: dict[tuple[str, Any], list[float]] = {}
        # A thread's sends in the last second of virtual time, by the thread.
        self.sent: dict[Any, collections.deque[float]] = {}
        self.busiest = 0  # the most requests one thread sent in a second
        self.wanted: dict[Any, Any] = {}  # proc -> the semaphore it waits for (its mode, limit)
        self.granted_by: dict[tuple[str, str], Any] = {}  # (resource, token) -> the writer
        self.broken: dict[tuple[str, str, int], float] = {}  # (resource, token, fence) -> when
        self.jobs = JobMonitor(self)
        self.unique = UniqueMonitor(self, bound=QUEUE_LEASE * lease + 2 * skew + SLACK)
        self.coalesce = CoalesceMonitor(self, lease=lease, skew=skew)
        self.leads = LeadMonitor(self)
        self.grant_time: dict[tuple[str, str], float] = {}  # (resource, token) -> when granted
        self.entered_tokens: set[tuple[str, str]] = set()  # (resource, token) of blocks begun

    def finish(self) -> None:
        """The run is over, every workload done: what only its end can show."""
        self.coalesce.finish()

    def fail(self, message: str) -> None:
        said = f"t={self.sim.clock_label()} {message}"
        if said not in self.violations:
            self.violations.append(said)

    def request(self, proc: Any, thread: Any) -> None:
        """``thread`` of ``proc`` sends a request (each attempt counts): a storm if it sent
        more than ``STORM`` in a second."""
        now = self.sim.sched.now
        sent = self.sent.setdefault(thread, collections.deque())
        sent.append(now)
        while sent[0] <= now - 1.0:
            sent.popleft()
        self.busiest = max(self.busiest, len(sent))
        if len(sent) > STORM:
            who = f"{proc.name} ({getattr(thread, 'name', '?')})"
            self.fail(f"request storm: {who} sent {len(sent)} requests within 1 s")
            sent.clear()  # said once per storm second

    def timed_out(self, sent: float, resources: set[str]) -> None:
        """A write to ``resources`` sent at ``sent`` applied, its answer lost, and its caller's
        read timeout ended now: sent in the fault window, it was one of the window's faults
        until now, past the window's end (what it wrote, unconfirmed, held others up while
        its caller waited). The idle clocks of those resources, and of the others their
        waiters wait for at once, start again now, as at the window's end."""
        now = self.sim.sched.now
        if not sent < self.quiet_from <= now:
            return
        wants = self._wants()
        touched = set(resources)
        for proc in {p for r in resources for p in self.waiting.get(r, ())}:
            touched.update(wants.get(proc, ()))
        for resource in touched & set(self.idle_since):
            self.idle_since[resource] = max(self.idle_since[resource], now)

    # -- what the workloads tell -------------------------------------------------------------

    def begin(self, proc: Any, resource: str, sem: Any = None) -> None:
        self.waiting.setdefault(resource, set()).add(proc)
        if sem is not None:
            self.wanted[proc] = sem

    def end(self, proc: Any, resource: str) -> None:
        self.waiting.get(resource, set()).discard(proc)

    def entered(self, proc: Any, sem: Any, held: Any) -> None:
        """``proc`` begins the block of ``held`` (of one resource, or several together)."""
        self.entries += 1
        for resource, fence in held.fences.items():
            self._entered(proc, sem, held, resource, fence)
        self.sim.entered(proc)

    def _entered(self, proc: Any, sem: Any, held: Any, resource: str, fence: int) -> None:
        if self._broken_at(resource, held) is None:  # (broken since its grant: see broke)
            self._check_entry(proc, sem, held, resource, fence)
        if proc.transaction is not None:
            self.open_work.setdefault(resource, {})[proc] = held
        entry = Inside(proc, held, sem.mode, sem.limit, self.sim.sched.now)
        for other in self.inside.get(resource, {}).values():
            if self._broken_at(resource, other.held) is not None:
                continue
            if Mode.EXCLUSIVE in (sem.mode, other.mode):
                self._margin(other)
        self.inside.setdefault(resource, {})[held.token] = entry
        self.entered_tokens.add((resource, held.token))
        self.sim.record("enter", proc, resource, fence)
        self._check_resource(resource)

    def _check_entry(self, proc: Any, sem: Any, held: Any, resource: str, fence: int) -> None:
        if sem.mode == Mode.EXCLUSIVE:
            # Ours in the row as stored, with the fence we were told. (A reader may hold in
            # a reader item, with the row's fence at its admission, while an older entry of
            # its token lapses in the row: only exclusive holds are checked so.)
            stored = self.holders.get(resource, {}).get(held.token)
            if stored is None:
                self.fail(f"{proc.name} entered {resource!r} exclusively with no hold stored")
            elif stored != fence:
                self.fail(f"{proc.name} entered {resource!r} with fence {fence}, stored {stored}")
        top = self.top_fence.get(resource, 0)
        if sem.mode == Mode.EXCLUSIVE and fence < top:
            # Granted to another since ours was: ours was taken over before we entered.
            self.fail(
                f"{proc.name} entered {resource!r} exclusively with fence {fence}, "
                f"superseded by a later grant (fence {top})"
            )
        self._check_commits(proc, resource)

    def _check_commits(self, proc: Any, resource: str) -> None:
        for other, held in self.open_work.get(resource, {}).items():
            if self._broken_at(resource, held) is not None:
                continue  # broken by an operator: only its fence protects it
            if other is not proc and not self._lapsed(other, held):
                self.fail(
                    f"{proc.name} entered {resource!r} before {other.name}'s transaction, which "
                    f"worked under it, ended (its hold, fence {held.fence}, given back first)"
                )

    def _lapsed(self, proc: Any, held: Any) -> bool:
        with self.sim.clock_of(proc):
            return held._lost is not None or self.sim.mono() >= held._deadline

    def transaction_ended(self, proc: Any) -> None:
        for work in self.open_work.values():
            work.pop(proc, None)
        self.jobs.transaction_ended(proc)

    def lost(self, proc: Any, held: Any, exc: Any) -> None:
        """``proc`` was told (LockLost) that ``held`` was lost."""
        if held is None or not exc.reason.startswith(TAKEN_OVER):  # (several: which one)
            return
        with self.sim.clock_of(proc):
            if self.sim.mono() >= held._deadline:
                return
        if all(self.removed_by.get((r, held.token)) is proc for r in held.fences):
            self.fail(
                f"{proc.name} was told its hold (fence {held.fence}) was taken over, yet only "
                f"its own writes removed it, within its trusted deadline"
            )

    def broke(self, resource: str, token: str, fence: int, sk: str) -> None:
        """An operator's write that broke the grant of ``fence`` to ``token`` on
        ``resource`` (its item ``sk``) applied now. (The same token admitted again after it,
        under a later fence, holds anew; a permit of the token that a take whose answer was
        lost wrote, left to lapse, has a fence of its own.)"""
        if (resource, token, fence) not in self.broken:
            self.broken[(resource, token, fence)] = self.sim.sched.now
            self.sim.record("broken", None, resource, token[:8], fence, sk)
            item = {records.PERMIT_PREFIX: "permit", records.READER_PREFIX: "reader"}
            self.sim.stats[f"broken_{item.get(sk[:2], 'row')}"] += 1

    def _broken_at(self, resource: str, held: Any) -> float | None:
        """When ``held``'s grant on ``resource`` was broken (None: it was not)."""
        return self.broken.get((resource, held.token, held.fences.get(resource)))

    def _check_broken(self, resource: str, entry: Inside, at: float) -> None:
        """A broken hold's trust never grows past what a write applied before its break
        gave: a lease less CLOCK_SKEW from its own write's send, or from a hand-over's stored
        lease end, written by a clock up to 2 * spread * CLOCK_SKEW ahead of the heir's."""
        if entry.held._lost is not None:
            return
        with self.sim.clock_of(entry.proc):
            ends = self.sim.sched.now + entry.held._deadline - self.sim.mono()
        clocks = 2 * self.sim.options.spread * self.skew
        over = ends - (at + entry.held.lease - self.skew + clocks)
        if over > 1e-6:
            self.fail(
                f"{entry.proc.name}'s hold on {resource!r} (fence {entry.held.fence}) is "
                f"trusted {over:.3f}s past what any renewal sent before its break could give"
            )

    def _margin(self, earlier: Inside) -> None:
        """How long ago ``earlier`` (still inside) stopped trusting its hold, as another
        enters: the closest call of the run is the smallest (negative: an overlap)."""
        with self.sim.clock_of(earlier.proc):
            margin = self.sim.mono() - earlier.held._deadline
        self.margins.append((margin, earlier.proc.name))

    def left(self, proc: Any, held: Any) -> None:
        for resource, fence in held.fences.items():
            self.inside.get(resource, {}).pop(held.token, None)
            self.sim.record("leave", proc, resource, fence)

    def crashed(self, proc: Any) -> None:
        for inside in self.inside.values():
            for token in [t for t, e in inside.items() if e.proc is proc]:
                del inside[token]
        for waiting in self.waiting.values():
            waiting.discard(proc)
        self.transaction_ended(proc)  # a dead process's transaction rolls back
        self.unique.crashed(proc)
        self.coalesce.crashed(proc)
        self.leads.terms.pop(proc, None)

    # -- what the database applied -----------------------------------------------------------

    def row_written(self, resource: str, item: dict[str, Any] | None, writer: Any) -> None:
        """The lock row of ``resource`` as ``writer``'s write left it (decoded; None: deleted)."""
        row = records.lock_item(item) if item is not None else records.LockItem()
        self._drawn(resource, row)
        before = self.holders.get(resource, {})
        # The readers' sentinel stands for reader items (their grants are the items').
        now = {t: h.fence for t, h in row.holders.items() if t != reader_items.SENTINEL}
        # A unique task's key passes one grant from token to token: a worker's adoption
        # replaces the claim's entry with its run's under a fresh token, and a run that
        # enqueued its retry becomes the retry's claim, both with the same fence, in one write
        # conditional on the entry it replaces (claims.adopt_hold). That is the grant going on
        # (the claim's holder now works under it), not a new one: it keeps its fence, and a
        # later grant must still be above it. Only on the unique mix's keys, and only for the
        # fence of an entry the same write removed: a lock's take that reused a fence stays a
        # violation. (A run's take-over of its announcer, dead, is a new grant: fence above.)
        handed = set()
        if resource in self.unique.keys:
            handed = {fence for token, fence in before.items() if token not in now}
        for token in now.keys() - before.keys():
            self.granted_by[(resource, token)] = writer
        for token, fence in sorted(now.items(), key=lambda tf: tf[1]):
            if token in before or self.grants.get((resource, token)) == fence:
                continue
            if fence in handed and fence == self.top_fence.get(resource):
                handed.discard(fence)  # one entry replaced by one
                self.grants[(resource, token)] = fence
                continue
            top = self.top_fence.get(resource, 0)
            if fence <= top:
                self.fail(f"{resource!r} granted fence {fence} to {token[:8]}, not above {top}")
            self.top_fence[resource] = max(top, fence)
            self.grants[(resource, token)] = fence
            self.grant_time[(resource, token)] = self.sim.sched.now
        for token in before.keys() - now.keys():
            self.removed_by[(resource, token)] = writer
        self.holders[resource] = now
        last = self.rows.get(resource, records.LockItem())
        self.rows[resource] = row
        if row.queue_id == last.queue_id and row.queue_out > last.queue_out + 1:
            for ticket in range(last.queue_out + 1, row.queue_out):
                self._check_passed(resource, row, records.entry_sk(row.queue_id, ticket), writer)
        if row.queue_out != last.queue_out:
            self.queue_reads.pop((resource, writer), None)

    def queue_read(self, resource: str, reader: Any) -> None:
        """``reader`` read the entries of ``resource``'s queue (a Query applied now)."""
        self.queue_reads.setdefault((resource, reader), []).append(self.sim.sched.now)

    def entry_written(self, resource: str, sk: str, item: dict[str, Any] | None) -> None:
        """A queue entry item as a write left it (None: deleted)."""
        if item is None:
            return
        waiter = records.from_item(records.Waiter, item)
        previous = self.entries_seen.get((resource, sk))
        close = previous is not None and (previous[1] or not self._well_ahead(previous[0]))
        self.entries_seen[(resource, sk)] = (waiter.expires_ms, close)
        self.entry_put.setdefault((resource, sk), self.sim.sched.now)
        if waiter.proc is not None:
            self.latest_entry[(resource, waiter.proc)] = sk

    def _drawn(self, resource: str, row: records.LockItem) -> None:
        """Note when each ticket ``row`` shows drawn since the last write was drawn."""
        queue_id, last = self.queue_in.get(resource, (row.queue_id, row.queue_out))
        if queue_id != row.queue_id:
            last = row.queue_out
        for ticket in range(last + 1, row.queue_in + 1):
            self.drawn[(resource, records.entry_sk(row.queue_id, ticket))] = self.sim.sched.now
        self.queue_in[resource] = (row.queue_id, max(last, row.queue_in))

    def told(self, resource: str, sk: str, proc: Any) -> None:
        """``proc``'s waiter, queued at ``sk``, told the holder (its entry may come later)."""
        self.words[(resource, sk)] = (proc, self.sim.sched.now)

    def _check_passed_unput(self, resource: str, row: records.LockItem, sk: str) -> None:
        """``row`` passed a ticket with no entry at all. Fine for a waiter that never told
        the holder (its process died or stalled between its two writes, or a lost answer
        drew the ticket), or long after its word: nobody passes a missing ticket before it
        has been missing JOIN_GRACE, and a waiter that told the holder puts its entry well
        within that (queue.ENTRY_DEFER). Within JOIN_GRACE / 2 of the word, while its process
        lives and waits, it is a violation, unless the word came JOIN_GRACE or more after the
        ticket was drawn."""
        word = self.words.get((resource, sk))
        if word is None or self.sim.sched.now - word[1] >= JOIN_GRACE / 2:
            return
        drawn = self.drawn.get((resource, sk))
        if drawn is not None and word[1] - drawn >= JOIN_GRACE:
            # Its waiter stalled between its draw and its word (the simulator's seed 7113 of
            # exclusive, pauses, pushes across hosts: 11.4 s): the ticket had been missing
            # past JOIN_GRACE, which the protocol passes unless the word has reached the
            # releaser; one still crossing hosts at its read has not.
            return
        proc = word[0]
        if proc.dead or proc not in self.waiting.get(resource, set()):
            return
        self.fail(
            f"order: {resource!r}'s turn moved to ticket {row.queue_out}, passing {sk} of "
            f"{proc.name}, alive and waiting, {self.sim.sched.now - word[1]:.3f}s after it "
            "told the holder, before its entry was put"
        )

    def _missing_to(self, resource: str, sk: str, writer: Any, put: float) -> bool:
        """Whether ``writer`` passed the ticket of ``sk`` as missing, as the protocol does: it
        read the queue (since it last moved its turn) after the ticket was drawn and at least
        JOIN_GRACE before now, and its last read came before the entry was put. Its waiter
        stalled between its draw and its entry (seed 7413 of exclusive and fair, pauses,
        pushes across hosts: 12 s); a writer that passes a missing ticket at once
        (``no_join_grace``) is not excused."""
        drawn = self.drawn.get((resource, sk))
        reads = self.queue_reads.get((resource, writer), [])
        if drawn is None or not reads or reads[-1] >= put:
            return False
        return any(drawn <= read <= self.sim.sched.now - JOIN_GRACE for read in reads)

    def _well_ahead(self, expires_ms: int) -> bool:
        margin = 2 * self.skew + SLACK_ORDER
        return expires_ms / 1000 > self.sim.sched.now + margin

    def _check_passed(self, resource: str, row: records.LockItem, sk: str, writer: Any) -> None:
        """``row`` moved the turn past the entry at ``sk``, not to it: fine unless the entry's
        waiter is alive, waiting, and its entry was live beyond doubt all along."""
        item = self.sim.entry_now(resource, sk)
        if item is None:
            self._check_passed_unput(resource, row, sk)
            return
        waiter = records.from_item(records.Waiter, item)
        if waiter.token in row.holders or not self._well_ahead(waiter.expires_ms):
            return
        seen = self.entries_seen.get((resource, sk))
        if seen is None or seen[1] or self.latest_entry.get((resource, waiter.proc or "")) != sk:
            return
        proc = next((p for p in self.sim.procs if p.identity() == waiter.proc), None)
        if proc is None or proc.dead or proc not in self.waiting.get(resource, set()):
            return
        put = self.entry_put[(resource, sk)]
        if self._missing_to(resource, sk, writer, put):
            return
        self.fail(
            f"order: {resource!r}'s turn moved to ticket {row.queue_out}, passing ticket "
            f"{waiter.ticket} of {proc.name}, alive, waiting, its entry live until "
            f"{waiter.expires_ms / 1000 - self.sim.sched.now:.2f}s from now (written by "
            f"{getattr(writer, 'name', writer)}; its entry put {self.sim.sched.now - put:.3f}s ago)"
        )

    # -- after every event -------------------------------------------------------------------

    def check(self) -> None:
        broken = self.broken  # empty in most runs: no hold inside is broken then
        for resource, inside in self.inside.items():
            if len(inside) > 1 or (
                broken and any(self._broken_at(resource, e.held) for e in inside.values())
            ):
                self._check_resource(resource)
        self.jobs.check()
        self.leads.check()
        if self.sim.sched.now >= self.quiet_from:
            self._check_idle()

    def _trusted(self, entry: Inside) -> bool:
        with self.sim.clock_of(entry.proc):
            return entry.held._lost is None and entry.held.seconds_left() > 0

    def _check_resource(self, resource: str) -> None:
        inside = self.inside.get(resource, {})
        trusted = []
        for entry in inside.values():
            broken_at = self._broken_at(resource, entry.held)
            if broken_at is not None:
                self._check_broken(resource, entry, broken_at)
            elif self._trusted(entry):
                trusted.append(entry)
        if len(trusted) < 2:
            return
        exclusive = [e for e in trusted if e.mode == Mode.EXCLUSIVE]
        counting = [e for e in trusted if e.mode == Mode.COUNTING]
        who = ", ".join(f"{e.proc.name} (fence {e.held.fence})" for e in trusted)
        if exclusive:
            self.fail(f"{resource!r}: an exclusive holder beside others, all trusted: {who}")
        elif len({e.limit for e in counting}) > 1:
            self.fail(f"{resource!r}: counting holders of different limits together: {who}")
        elif counting and len(counting) > counting[0].limit:
            self.fail(f"{resource!r}: {len(counting)} counting holders over the limit: {who}")
        elif counting and len(counting) != len(trusted):
            self.fail(f"{resource!r}: counting and shared holders together: {who}")

    def _kept_out(self, proc: Any, resource: str) -> bool:
        """Whether the holders inside ``resource`` keep ``proc``'s semaphore out."""
        inside = list(self.inside.get(resource, {}).values())
        sem = self.wanted.get(proc)
        if not inside or sem is None:
            return bool(inside)
        if any(e.mode != sem.mode or e.mode == Mode.EXCLUSIVE for e in inside):
            return True
        return sem.mode == Mode.COUNTING and len(inside) >= sem.limit

    def _check_idle(self) -> None:
        now = self.sim.sched.now
        wants: dict[Any, list[str]] | None = None  # proc -> the resources it waits for
        for resource, waiting in self.waiting.items():
            # Nobody waits, or somebody is inside: not idle (no need to look who is live).
            live: list[Any] = []
            if waiting and not self.inside.get(resource):
                if wants is None:
                    wants = self._wants()
                live = self._live(resource, waiting, wants, now)
            if not live:
                if resource in self.idle_since:
                    since = self.idle_since.pop(resource)
                    self.longest_idle = max(self.longest_idle, now - since)
                continue
            since = self.idle_since.setdefault(resource, max(now, self.quiet_from))
            if now - since > self.bound:
                self.fail(
                    f"liveness: {resource!r} idle for {now - since:.1f}s (bound {self.bound:g}s) "
                    f"while {len(live)} live process(es) wait: "
                    + ", ".join(sorted(p.name for p in live))
                )
                self.idle_since[resource] = now  # said once per bound

    def _wants(self) -> dict[Any, list[str]]:
        wants: dict[Any, list[str]] = {}
        for resource, waiting in self.waiting.items():
            for proc in waiting:
                wants.setdefault(proc, []).append(resource)
        return wants

    def _live(
        self, resource: str, waiting: set[Any], wants: dict[Any, list[str]], now: float
    ) -> list[Any]:
        """The processes waiting for ``resource`` that could take it now. A stalled process
        waits for nothing: it is not running (its stall is a fault that began in the
        window). One that waits for several resources at once waits for this one only
        while nobody is inside the others in a way that keeps it out (all or none)."""
        return [
            p
            for p in waiting
            if not p.dead
            and p.stalled_until <= now
            and (
                len(wants[p]) == 1  # this resource only
                or not any(self._kept_out(p, r) for r in wants[p] if r != resource)
            )
        ]


@dataclasses.dataclass
class JobRun:
    """A run_once body: its process, its job, and how it ended."""

    proc: Any
    job: Any
    transaction: Any  # the process's open transaction when the body began (or None)
    returned: bool | None = None  # None: still running (or its process died in it)


class JobMonitor:
    """The invariants of ``run_once`` (the module docstring's **Jobs**)."""

    def __init__(self, monitor: Monitor):
        self.monitor = monitor
        self.inside: dict[str, dict[str, JobRun]] = {}  # key -> token -> its body
        self.runs: dict[str, JobRun] = {}  # token -> its body, once begun
        self.claims: dict[str, dict[str, int]] = {}  # key -> token -> fence, as stored
        self.top_fence: dict[str, int] = {}
        self.done: dict[str, str] = {}  # key -> the token its DONE was stored for
        self.rows: dict[str, records.JobRow] = {}  # key -> its row as last written

    def entered(self, proc: Any, job: Any) -> None:
        """``proc`` begins the body of ``job``."""
        sim, key = self.monitor.sim, job.key
        if key in self.done:
            self.monitor.fail(f"{proc.name} ran job {key!r}, DONE already")
        row = self.rows.get(key) or records.job_row(None)
        if (row.status, row.token, row.fence) != (records.RUNNING, job.token, job.fence):
            self.monitor.fail(
                f"{proc.name} ran job {key!r} (fence {job.fence}) with its claim not stored: "
                f"{row.status} by {(row.token or '-')[:8]}, fence {row.fence}"
            )
        for other in self.inside.get(key, {}).values():
            if other.transaction is not None and other.returned and not self._lapsed(other):
                self.monitor.fail(
                    f"{proc.name} ran job {key!r} before {other.proc.name}'s transaction, "
                    "which ran it, ended"
                )
        run = JobRun(proc, job, proc.transaction)
        self.inside.setdefault(key, {})[job.token] = run
        self.runs[job.token] = run
        sim.record("job", proc, key, job.fence)
        self._check(key)
        sim.entered(proc)

    def left(self, proc: Any, job: Any, *, returned: bool) -> None:
        """``proc``'s body of ``job`` ended (``returned``, or raised). Inside a transaction it
        stays "inside" until the transaction ends: its work is not visible before."""
        run = self.runs[job.token]
        run.returned = returned
        if run.transaction is None:
            self.inside.get(job.key, {}).pop(job.token, None)

    def transaction_ended(self, proc: Any) -> None:
        for inside in self.inside.values():
            for token in [t for t, r in inside.items() if r.proc is proc]:
                del inside[token]

    def written(self, key: str, item: dict[str, Any] | None) -> None:
        """The job row of ``key`` as a write left it (decoded; None: deleted)."""
        row = records.job_row(item)
        self.rows[key] = row
        for run in self.inside.get(key, {}).values():
            ours = row.status == records.RUNNING and row.token == run.job.token
            if run.returned is None and not ours and not self._lapsed(run):
                self.monitor.fail(
                    f"job {key!r}: {run.proc.name}'s claim (fence {run.job.fence}) replaced "
                    f"while its body runs, trusted: now {row.status} by {(row.token or '-')[:8]}"
                )
        if item is None:
            self.claims.pop(key, None)
            return
        claims = self.claims.setdefault(key, {})
        # A new claim (a token may claim again: its first claim was taken over while it
        # paused before its body began, and the job became FAILED meanwhile).
        if row.status == records.RUNNING and row.token and claims.get(row.token) != row.fence:
            top = self.top_fence.get(key, 0)
            if key in self.done:
                self.monitor.fail(f"job {key!r} claimed again by {row.token[:8]}, DONE already")
            if (row.fence or 0) <= top:
                self.monitor.fail(f"job {key!r} claimed with fence {row.fence}, not above {top}")
            self.top_fence[key] = max(top, row.fence or 0)
            claims[row.token] = row.fence or 0
        if row.status == records.DONE and key not in self.done:
            token = row.last_token or ""
            self.done[key] = token
            run = self.runs.get(token)
            if run is None or not run.returned:
                self.monitor.fail(f"job {key!r} stored DONE for a body that did not return")
            elif run.transaction is not None and run.transaction.committed is not True:
                self.monitor.fail(f"job {key!r} stored DONE before its transaction committed")

    def _lapsed(self, run: JobRun) -> bool:
        with self.monitor.sim.clock_of(run.proc):
            return run.job._lost is not None or run.job.seconds_left() <= 0

    def check(self) -> None:
        for key, inside in self.inside.items():
            if len(inside) > 1:
                self._check(key)

    def _check(self, key: str) -> None:
        running = [r for r in self.inside.get(key, {}).values() if r.returned is None]
        trusted = [r for r in running if not self._lapsed(r)]
        if len(trusted) > 1:
            who = ", ".join(f"{r.proc.name} (fence {r.job.fence})" for r in trusted)
            self.monitor.fail(f"job {key!r}: two bodies running, both trusted: {who}")


class UniqueMonitor:
    """The invariants of unique tasks (the module docstring's **Unique tasks**). Their runs'
    exclusion and fences are the :class:`Monitor`'s own (a run is entered as a block); this
    keeps who owns each key, which claims ran, and which run enqueued which retry."""

    def __init__(self, monitor: Monitor, *, bound: float):
        self.monitor = monitor
        self.bound = bound
        self.keys = {f"u{n}" for n in range(UNIQUE_KEYS)}
        # key -> its messages on the broker or being run -> the worker that took it (None:
        # on the broker); key -> enqueuers whose enqueue of it goes on -> when it began
        self.owners: dict[str, dict[Any, Any]] = {}
        self.claiming: dict[str, dict[Any, float]] = {}
        self.unowned_since: dict[str, float] = {}  # key -> when its last owner went
        self.ran: dict[str, Any] = {}  # claim token -> the process that ran it
        self.parents: dict[str, tuple[Any, Any]] = {}  # retry's claim token -> (proc, run hold)

    def _own(self, key: str, what: Any, proc: Any) -> None:
        self.owners.setdefault(key, {})[what] = proc

    def _disown(self, key: str, what: Any) -> None:
        owners = self.owners.get(key, {})
        if what in owners:
            del owners[what]
            self._gone(key)

    def _gone(self, key: str) -> None:
        """An owner of ``key`` went (a message run or not run, an enqueue that may have
        claimed it ended): the key's lease runs out from now, if no message owns it. (An
        enqueue still going on may claim it too: a refusal is not judged while one does.)"""
        if not self.owners.get(key):
            self.unowned_since[key] = self.monitor.sim.sched.now

    # -- enqueuers ---------------------------------------------------------------------------

    def enqueuing(self, proc: Any, key: str, task_id: str) -> None:
        """``proc`` begins an enqueue of ``key`` (its claim may stand from now on)."""
        self.claiming.setdefault(key, {})[proc] = self.monitor.sim.sched.now

    def enqueued(self, proc: Any, key: str) -> None:
        """``proc``'s enqueue ended, claimed or maybe claimed: its message is on the broker,
        or lost, or withdrawn, or the claim's answer never came (unavailable)."""
        if not proc.dead and self.claiming.get(key, {}).pop(proc, None) is not None:
            self._gone(key)

    def taken(self, proc: Any, key: str, task_id: str, busy: Any) -> None:
        """``proc``'s enqueue of ``key`` for ``task_id`` was refused (``Taken``): it owned
        nothing."""
        sim, monitor = self.monitor.sim, self.monitor
        began = self.claiming.get(key, {}).pop(proc, sim.sched.now)
        sim.record("taken", proc, key, busy.task_id or "-")
        if busy.task_id == task_id:
            monitor.fail(f"{proc.name}: the enqueue of {key!r} was refused by its own claim")
        row = monitor.rows.get(key, records.LockItem())
        ours = [t for t, h in row.holders.items() if h.user_id == f"task:{task_id}"]
        if ours:
            monitor.fail(
                f"{proc.name}: the enqueue of {key!r} was refused, its claim {ours[0][:8]} "
                "left in the row"
            )
        if self.owners.get(key) or self.claiming.get(key):
            return  # a message of it waits or runs, or another enqueue of it goes on
        since = self.unowned_since.get(key, 0.0)
        if began - since > self.bound:
            monitor.fail(
                f"liveness: {proc.name}'s enqueue of {key!r} refused {began - since:.1f}s after "
                f"its last owner went (bound {self.bound:g}s): held by task {busy.task_id}"
            )

    # -- the broker and workers --------------------------------------------------------------

    def queued(self, message: Any) -> None:
        """A copy of a message on its way to the broker: it owns its key until run or lost."""
        self._own(message.claim.resource, ("message", message.copy), None)

    def taking(self, proc: Any, message: Any) -> None:
        """Worker ``proc`` took ``message``: its key is owned while ``proc`` lives."""
        self._own(message.claim.resource, ("message", message.copy), proc)

    def finished(self, proc: Any, message: Any) -> None:
        """``proc`` is done with ``message`` (run, or not run)."""
        if not proc.dead:
            self._disown(message.claim.resource, ("message", message.copy))

    def began(self, proc: Any, message: Any, held: Any) -> None:
        """``proc`` begins the run of ``message`` under ``held``, its adopted claim."""
        monitor, claim = self.monitor, message.claim
        first = self.ran.get(claim.token)
        if first is not None:
            monitor.fail(
                f"{proc.name} ran the claim {claim.token[:8]} of {claim.resource!r} "
                f"(message {message.copy}), run already by {first.name}"
            )
        self.ran[claim.token] = proc
        parent = self.parents.get(claim.token)
        if parent is None:
            return
        parent_proc, parent_held = parent
        inside = monitor.inside.get(claim.resource, {}).get(parent_held.token)
        if inside is not None and monitor._trusted(inside):
            monitor.fail(
                f"{proc.name} began the retry of {claim.resource!r} (fence {held.fence}) "
                f"beside the run that enqueued it, {parent_proc.name} (fence "
                f"{parent_held.fence}), still trusted"
            )

    def retried(self, proc: Any, carried: Any, claimed: Any, held: Any) -> None:
        """``proc``'s run (``held``, adopted from ``carried``) enqueued the retry ``claimed``."""
        self.parents[claimed.token] = (proc, held)

    def crashed(self, proc: Any) -> None:
        for key, claiming in self.claiming.items():
            if claiming.pop(proc, None) is not None:
                self._gone(key)  # its claim may stand, its message never sent
        for key, owners in self.owners.items():
            for what in [w for w, p in owners.items() if p is proc]:
                self._disown(key, what)


@dataclasses.dataclass(eq=False)
class Call:
    """One coalesced call (``semaphore(key, coalesce=True)``): when it arrived, what it was
    answered, and its run, if it ran."""

    proc: Any
    key: str
    arrived: float
    token: str | None = None  # its registration as the next run, if it registered
    refusal: tuple[str, int] | None = None  # (the registration refusing it, its lease end)
    sent_wall: float = 0.0  # its clock when it sent its registration
    refused_by: str | None = None  # answered Coalesced: the registration that covers it
    outcome: str | None = None  # ran, coalesced, gave_up, failed, lost, died (None: going)
    ended: float | None = None  # when it gave up, failed or died (its own wall clock)
    grant: float | None = None  # when its hold was granted (the run began), if it ran
    done: bool = False  # its body completed


@dataclasses.dataclass(eq=False)
class NextRun:
    """A registration as the next run: its call, the fence it recorded, the calls it
    answered Coalesced, and the library's Registration object (trust, what it was told)."""

    call: Call
    after_fence: int
    coalesced: list[Call] = dataclasses.field(default_factory=list)
    registration: Any = None
    told_replaced: float | None = None  # when a renewal told its runner it was replaced
    withdrawing: float | None = None  # when its runner began to withdraw it


class CoalesceMonitor:
    """The invariants of coalesced re-runs (the module docstring's **Coalescing**): every
    call answered ``Coalesced`` is covered by a run that begins after it arrived, unless
    the next runner that refused it died or gave up; no registration whose run began refuses
    a caller that arrived after it began; none whose runner died or gave up refuses one past
    the lease it could have had (a later caller can register); never two next runs both
    trusting their registrations, one replaced for its lease alone; no write of a runner
    certain to be refused (it was told it was replaced)."""

    def __init__(self, monitor: Monitor, *, lease: float, skew: float):
        self.monitor = monitor
        self.lease, self.skew = lease, skew
        self.calls: dict[Any, Call] = {}  # proc -> its current (or last) call
        self.coalesced: list[Call] = []
        self.runs: dict[str, list[Call]] = {}  # key -> its calls that ran, as they began
        self.regs: dict[str, NextRun] = {}  # registration token -> it
        self.stored: dict[str, dict[str, Any] | None] = {}  # key -> its next item as stored

    def registration_class(self, base: Any) -> Any:
        """``coalescing.Registration`` for the run: tells the monitor of each registration
        made, of a renewal refused (replaced) and of a withdrawal begun."""
        monitor = self
        from dynasem.exceptions import LockLost

        class Registration(base):  # type: ignore[misc,valid-type]
            library = base

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                reg = monitor.regs.get(self.token)
                if reg is not None:
                    reg.registration = self

            def renew(self) -> None:
                try:
                    super().renew()
                except LockLost:
                    reg = monitor.regs.get(self.token)
                    if reg is not None and reg.told_replaced is None:
                        reg.told_replaced = monitor.monitor.sim.sched.now
                    raise

            def withdraw(self) -> None:
                reg = monitor.regs.get(self.token)
                if reg is not None:
                    reg.withdrawing = monitor.monitor.sim.sched.now
                super().withdraw()

        return Registration

    def registering(self, register_next: Any) -> Any:
        """``next_runs.register_next`` for the run: the caller's clock as it sends it."""
        monitor = self

        def registering(resource: str, **kwargs: Any) -> Any:
            call = monitor.calls.get(monitor.monitor.sim.current())
            if call is not None:
                call.sent_wall = monitor.monitor.sim.wall()
            return register_next(resource, **kwargs)

        return registering

    # -- the workload --------------------------------------------------------------------------

    def arrived(self, proc: Any, key: str) -> None:
        self.calls[proc] = Call(proc, key, self.monitor.sim.sched.now)

    def entered(self, proc: Any, held: Any) -> None:
        """``proc``'s call runs: its hold was granted when its token appeared in the row."""
        call, sim = self.calls[proc], self.monitor.sim
        call.outcome = "ran"
        call.grant = self.monitor.grant_time.get((call.key, held.token), sim.sched.now)
        self.runs.setdefault(call.key, []).append(call)
        reg = self.regs.get(call.token or "")
        for other in reg.coalesced if reg is not None else ():
            self._check_began_after(other, call)

    def left(self, proc: Any) -> None:
        self.calls[proc].done = True

    def answered(self, proc: Any, outcome: str) -> None:
        """``proc``'s call ended without a run: ``coalesced``, ``gave_up`` (its wait ran
        out), ``failed`` (SemaphoreUnavailable) or ``lost``."""
        call = self.calls[proc]
        call.outcome = call.outcome or outcome
        if outcome != "coalesced":
            call.ended = self._wall(proc)
            return
        if call.refusal is None:
            self.monitor.fail(f"{proc.name} was answered Coalesced for {call.key!r} unrefused")
            return
        token, until_ms = call.refusal
        call.refused_by = token
        self.coalesced.append(call)
        reg = self.regs.get(token)
        if reg is None:
            self.monitor.fail(f"{proc.name}: {call.key!r} coalesced by {token[:8]}, never seen")
            return
        reg.coalesced.append(call)
        runner = reg.call
        if runner.grant is not None:
            self._check_began_after(call, runner)
        # The registration refused it for a lease end the caller's own clock (less
        # CLOCK_SKEW) had not reached when it sent the write (the condition). That lease end
        # must come from a write its runner sent before it went: nobody renews a next run that
        # died or gave up, so that a caller a lease + CLOCK_SKEW after can replace it.
        if runner.ended is not None and until_ms / 1000 + self.skew < call.sent_wall:
            self.monitor.fail(
                f"{proc.name}'s call of {call.key!r} coalesced by the next run {token[:8]} of "
                f"{runner.proc.name}, which {runner.outcome}, its lease over by "
                f"{call.sent_wall - until_ms / 1000:.2f}s by the caller's clock: not replaced"
            )
        if runner.ended is not None and until_ms / 1000 > runner.ended + self._lease_bound():
            self.monitor.fail(
                f"{proc.name}'s call of {call.key!r} coalesced by the next run {token[:8]} of "
                f"{runner.proc.name}, which {runner.outcome}: its lease stored "
                f"{until_ms / 1000 - runner.ended:.2f}s past its end (at most "
                f"{self._lease_bound():g}s): renewed for nobody"
            )

    def _lease_bound(self) -> float:
        """How far past its runner's end (by the runner's clock) a registration's stored
        lease may reach: its last write, sent before, a lease on; the host's clock may have
        jumped since, within ``spread * skew`` of true time either way."""
        return self.lease + 2 * self.monitor.sim.options.spread * self.skew + 0.01

    def _wall(self, proc: Any) -> float:
        with self.monitor.sim.clock_of(proc):
            return float(self.monitor.sim.wall())

    def _check_began_after(self, call: Call, runner: Call) -> None:
        """``call`` was coalesced by ``runner``'s registration: the run must begin after it
        arrived."""
        assert runner.grant is not None
        if runner.grant <= call.arrived:
            self.monitor.fail(
                f"{call.proc.name}'s call of {call.key!r} (arrived "
                f"{self.monitor.sim.clock_label_of(call.arrived)}) coalesced by the next run of "
                f"{runner.proc.name}, which began {call.arrived - runner.grant:.3f}s before it "
                "arrived"
            )

    def crashed(self, proc: Any) -> None:
        call = self.calls.get(proc)
        if call is not None and call.outcome is None:
            call.outcome, call.ended = "died", self._wall(proc)

    # -- the database --------------------------------------------------------------------------

    def written(self, key: str, operation: str, item: dict[str, Any] | None, writer: Any) -> None:
        """The next item of ``key`` as ``writer``'s applied write left it."""
        before = self.stored.get(key)
        self.stored[key] = item
        if operation != "PutItem" or item is None:
            return
        run = records.from_item(records.NextRun, item)
        call = self.calls.get(writer)
        if call is None or call.key != key:
            self.monitor.fail(f"{getattr(writer, 'name', writer)} registered {key!r} uncalled")
            return
        call.token = run.token
        self.regs[run.token] = NextRun(call, run.after_fence)
        if not self.monitor.holders.get(key):
            self.monitor.sim.stats["coalesce_registered_free"] += 1
        if before is not None:
            self._replaced(key, records.from_item(records.NextRun, before), run)

    def _replaced(self, key: str, old: Any, new: Any) -> None:
        """``new`` replaced ``old``: for ``old``'s lease alone (no hold taken since its
        fence), its runner must not trust it still."""
        reg = self.regs.get(old.token)
        if reg is None or old.token == new.token or old.after_fence < new.after_fence:
            return
        runner, registration = reg.call, reg.registration
        if runner.outcome is not None or runner.proc.dead or registration is None:
            return
        if registration._heartbeat.stopped and reg.told_replaced is None:
            return  # given up, or its hold taken
        with self.monitor.sim.clock_of(runner.proc):
            left = registration.seconds_left()
        if left > 0:
            self.monitor.fail(
                f"{key!r}: {runner.proc.name}'s registration as the next run (fence "
                f"{old.after_fence}) replaced for its lease while it trusts it {left:.3f}s more"
            )

    def refused(
        self, key: str, operation: str, params: dict[str, Any], item: Any, writer: Any
    ) -> None:
        """A write of ``key``'s next item by ``writer`` refused; ``item``: the one there."""
        stats = self.monitor.sim.stats
        there = records.from_item(records.NextRun, item or {})
        if operation == "PutItem":
            call = self.calls.get(writer)
            if call is not None and there.token != call.token:
                call.refusal = (there.token, there.until_ms)
                stats["coalesce_register_refused"] += 1
            return
        token = params["ExpressionAttributeValues"][":k"]["S"]
        refused = "renew" if operation == "UpdateItem" else "withdraw"
        stats[f"coalesce_{refused}_refused"] += 1
        reg = self.regs.get(token)
        if reg is None:
            return
        told, sent = reg.told_replaced, reg.withdrawing
        if operation == "DeleteItem" and told is not None and sent is not None and told <= sent:
            stats["coalesce_certain_refused"] += 1
            self.monitor.fail(
                f"{reg.call.proc.name} withdrew its registration of {key!r}, told it was "
                f"replaced {sent - told:.3f}s before: a write certain to be refused"
            )

    # -- at the end ----------------------------------------------------------------------------

    def finish(self) -> None:
        """Every call answered Coalesced is covered: a run of its key began after it arrived
        and its body completed; or the next run that refused it never ran (its runner died,
        gave up or failed: the callers after count on whoever comes next, docs/how-to)."""
        stats = self.monitor.sim.stats
        for call in self.coalesced:
            if any(r.done and r.grant > call.arrived for r in self.runs.get(call.key, ())):
                stats["coalesce_covered"] += 1
                continue
            runner = self.regs[call.refused_by or ""].call
            if runner.outcome in ("died", "gave_up", "failed") or (
                runner.outcome == "ran" and not runner.done
            ):
                stats["coalesce_uncovered_excused"] += 1
                continue
            self.monitor.fail(
                f"lost update: {call.proc.name}'s call of {call.key!r} (arrived "
                f"{self.monitor.sim.clock_label_of(call.arrived)}) answered Coalesced by the "
                f"next run of {runner.proc.name} ({runner.outcome}), and no run began after it"
            )


class LeadMonitor:
    """The invariants of ``leadership`` (the module docstring's **Leadership**): never two
    leads active at once, each by its own process's clock (``Lead.active``, read without
    its side effects); ``on_lost`` called at most once a term, and once for a lead known
    lost; never for a lead given back, not lost."""

    def __init__(self, monitor: Monitor):
        self.monitor = monitor
        self.terms: dict[Any, tuple[Any, list[float]]] = {}  # proc -> (its lead, on_lost's)
        self.acts: dict[Any, float] = {}  # proc -> until when it acts as the leader

    def acting(self, proc: Any, seconds: float) -> None:
        """``proc`` acts as the leader for ``seconds`` from now (as long as its lead said it
        may): never while another does."""
        now = self.monitor.sim.sched.now
        for other, until in self.acts.items():
            if other is not proc and not other.dead and until > now:
                self.monitor.fail(
                    f"two leaders act at once: {proc.name} from now, {other.name} for "
                    f"{until - now:.3f}s more"
                )
        self.acts[proc] = now + seconds

    def entered(self, proc: Any, lead: Any, lost: list[float]) -> None:
        self.terms[proc] = (lead, lost)
        self.check()

    def left(self, proc: Any) -> None:
        self.acts.pop(proc, None)
        term = self.terms.pop(proc, None)
        if term is None:
            return
        lead, lost = term
        if len(lost) > 1:
            self.monitor.fail(f"{proc.name}: on_lost called {len(lost)} times in one term")
        elif lost and not lead._lost.is_set():
            self.monitor.fail(f"{proc.name}: on_lost called for a lead not lost")
        elif lead._lost.is_set() and not lost:
            self.monitor.fail(f"{proc.name}: its lead was lost, and on_lost never called")

    def _active(self, proc: Any, lead: Any) -> bool:
        if proc.dead or lead._given_back or lead._lost.is_set() or lead.held._lost is not None:
            return False
        with self.monitor.sim.clock_of(proc):
            return bool(lead.held.seconds_left() > 0)

    def check(self) -> None:
        if len(self.terms) < 2:
            return
        active = [(p, lead) for p, (lead, _) in self.terms.items() if self._active(p, lead)]
        if len(active) > 1:
            who = ", ".join(f"{p.name} (fence {lead.fence})" for p, lead in active)
            self.monitor.fail(f"two leaders active at once: {who}")
