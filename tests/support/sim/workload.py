"""What simulated processes do: take a semaphore through dynasem's public API, work inside
the block for a while of virtual time, and tell the monitor when they wait, enter and leave.

Kinds of process (a run's ``mix`` names them, one per process, round robin):

* ``exclusive``: ``with semaphore("r")`` (waits as long as it takes);
* ``impatient``: the same with ``wait=`` a fraction of a second to two: it gives up;
* ``counting``: ``with semaphore("c", limit=3)``;
* ``reader`` / ``writer``: ``semaphore("rw", shared=True)`` / ``semaphore("rw")``;
* ``long_reader`` / ``impatient_writer``: the same, a reader working one to three leases (past
  the first few, readers keep items of their own, which they renew), a writer with ``wait=``
  up to two seconds;
* ``fair``: ``semaphore("r", fair=True)`` (beside processes that can be pushed, an exclusive
  waiter queues too: the mix differs from ``exclusive`` only with ``--no-push``);
* ``pair``: ``semaphore(["r", "s"])``, both at once (one transaction), beside ``single``:
  ``semaphore("s")``;
* ``shared_pair``: ``semaphore(["rw", "s"], shared=True)``, beside readers and writers of
  ``"rw"`` and ``single`` writers of ``"s"``;
* ``counting_pair``: ``semaphore(["c", "d"], limit=3)``, beside ``counting`` on ``"c"`` and
  ``counting_d``: ``semaphore("d", limit=3)`` (with ``--permits-from``, in permit items);
* ``cross_pair``: ``semaphore(["c", "s"], limit=3)``: counting on a resource others hold
  exclusively or shared (refused while they do, ``other_limit``); the ``mixed_pairs`` mix
  has a pair of every kind;
* ``long``: ``with semaphore("r")`` around work of one to three leases (its heartbeat renews);
* ``long_pair``, ``long_shared_pair``, ``long_counting_pair``: the pairs above around work of
  one to three leases (renewing holds of several resources), and ``impatient_pair``,
  ``impatient_shared_pair``, ``impatient_counting_pair``: the same with ``wait=`` a fraction
  of a second to two (giving up an all-or-none acquire); the ``long_pairs`` mix;
* ``limits``: one resource, ``"c"``, taken with ``limit=3``, with ``limit=2`` and exclusively,
  by turns: a row (or, with ``--permits-from``, its permit items) changes limit and mode
  once nobody holds it, and a take of another limit while someone does is refused
  (``ValueError``, counted as ``other_limit``);
* ``committer``: ``with semaphore("r")`` inside a database transaction that goes on after the
  block and then commits (one in ten rolls back): dynasem gives the hold back at its end
  (``commit.after_transaction``, simulated: :class:`Transaction`).
* ``job``: ``with run_once(key)`` of one of ``JOB_KEYS`` keys, a body that works as a block
  does (one in five: one to three leases, renewed) and raises one time in four (FAILED: the
  next run_once of the key runs it again); ``job_committer``: the same inside a transaction
  (DONE is written after the commit, FAILED on rollback). The ``jobs`` mix runs them beside
  exclusive holders, and ``JobMonitor`` checks them (``invariants.py``).
* ``enqueuer`` / ``worker``: unique tasks through the framework-neutral API of
  ``dynasem._background.unique`` (what Celery's and django.tasks' unique tasks call). An
  enqueuer claims one of ``UNIQUE_KEYS`` keys for a new task (``claim_for``: refused with
  ``Taken`` while a task holds it) and puts a message carrying the claim on the simulated
  broker (:class:`Broker`, shared by the run's processes): lost one time in ten (a task that
  never starts: its key frees when the queue lease ends), delivered twice one time in seven
  (at-least-once: the second copy comes up to 3 s later), refused by the broker one time in
  twenty (``withdraw``: the key given back). A worker takes messages and runs each (``run``:
  the claim adopted, the body under the hold, the key given back or handed on); a body
  enqueues a retry of itself three times in ten (the hand-on: ``claim_for`` from its own
  run), at most two deep, and works one time in five for one to three leases (renewed).
  The ``unique`` mix; ``UniqueMonitor`` checks it (``invariants.py``).
* ``coalescer`` / ``impatient_coalescer``: ``with semaphore(key, coalesce=True)`` of one of
  ``COALESCE_KEYS`` keys: runs at once, or registers as the next run and waits (the
  impatient ones ``wait=`` 0.2-3 s: they give up and withdraw), or is
  answered ``Coalesced``; one run in ten works for one to three leases (the registration
  renews meanwhile). ``leader``: a term of ``leadership(LEADERSHIP)``, acting in steps no
  longer than ``lead.seconds_left()`` while ``lead.active``, two terms in ten for one to
  two leases. The ``coalesce`` mix; ``CoalesceMonitor`` and ``LeadMonitor`` check them.
* ``operator``: an operator's ``manage.py dynasem_release`` every second or so, until the
  other processes are done (the command's own :func:`locks.holds_on` and
  :func:`locks.break_hold`): a consistent read of one of ``BROKEN``'s resources, then, up to
  half a second later (the question asked), a break of one of its holds, picked at random,
  conditional on its token (refused when it went since the read). The ``breaks`` mix runs
  one beside three readers of ``"rw"`` (past ``READERS_INLINE``: reader items), its writer,
  and a renewing counting pair (with ``--permits-from``, permit items): the monitor excuses
  a broken hold's block beside others (its holder trusts it until a renewal is refused:
  only its fence protects its work) and checks that its trust never grows after the break.
"""

from __future__ import annotations

import dataclasses
import random
import types
from collections.abc import Callable
from typing import Any

from dynasem import run_once, semaphore
from dynasem.exceptions import AlreadyDone, LockLost, SemaphoreBusy, SemaphoreUnavailable

MIXES = {
    "exclusive": ("exclusive", "exclusive", "impatient"),
    "counting": ("counting",),
    "readers": ("reader", "reader", "writer"),
    "long_readers": ("long_reader", "long_reader", "impatient_writer", "long_reader", "writer"),
    "fair": ("fair", "exclusive", "impatient"),
    "pairs": ("pair", "exclusive", "single"),
    "shared_pairs": ("shared_pair", "writer", "single", "reader", "shared_pair"),
    "counting_pairs": ("counting_pair", "counting", "counting_d", "counting_pair"),
    "long_pairs": (
        *("long_pair", "impatient_shared_pair", "long_counting_pair", "impatient_pair"),
        *("long_shared_pair", "impatient_counting_pair", "single", "counting"),
    ),
    "mixed_pairs": ("pair", "shared_pair", "counting_pair", "cross_pair", "single", "writer"),
    "all": ("exclusive", "impatient", "counting", "reader", "writer", "fair", "pair", "single"),
    "renewing": ("long", "exclusive", "impatient"),
    "commits": ("committer", "exclusive", "committer"),
    "limits": ("counting", "counting2", "exclusive_c"),
    "jobs": ("job", "job_committer", "job", "exclusive", "job_committer", "job"),
    "unique": ("enqueuer", "worker", "enqueuer", "worker", "enqueuer", "worker"),
    "coalesce": (
        *("coalescer", "leader", "impatient_coalescer", "coalescer"),
        *("leader", "impatient_coalescer", "coalescer"),
    ),
    "breaks": ("long_reader", "reader", "operator", "reader", "writer", "long_counting_pair"),
}

JOB_KEYS = 4  # keys a job mix's processes run (each until one run of it succeeds)
UNIQUE_KEYS = 3  # keys the unique mix's enqueuers claim
COALESCE_KEYS = 2  # resources the coalesce mix's processes ask runs of
LEADERSHIP = "sim"  # the election the coalesce mix's leaders stand in
UNIQUE_TASK = "sim.unique"  # the task's name, as a framework would give it
QUEUE_LEASE = 1.5  # a unique task's queue lease, in leases (its run lease is the lease)
RETRY_DEPTH = 2  # retries of retries at most
BROKEN = ("rw", "c", "d")  # what the breaks mix's operator breaks holds of


@dataclasses.dataclass
class Transaction:
    """A committer's open database transaction: what dynasem asked to run at its end."""

    at_end: list[tuple[Callable[[bool], None], Any]] = dataclasses.field(default_factory=list)
    committed: bool | None = None  # how it ended (None: open)


def end_transaction(sim: Any, proc: Any, *, committed: bool) -> None:
    """``proc``'s transaction commits (its work visible from now) or rolls back; then what
    waited for it runs, as Django's on_commit hooks do."""
    transaction, proc.transaction = proc.transaction, None
    if transaction is None:
        return
    transaction.committed = committed
    sim.monitor.transaction_ended(proc)
    sim.record("commit" if committed else "rollback", proc)
    for finish, _ in transaction.at_end:
        finish(committed)


def commit_later(sim: Any, proc: Any, rng: Any) -> None:
    """A committer's transaction goes on after its block a while, then commits (one in ten
    rolls back)."""
    if proc.transaction is not None:
        sim.sched.sleep(rng.uniform(0.001, 0.3) if rng.random() < 0.9 else 2.0)
        end_transaction(sim, proc, committed=rng.random() < 0.9)


PAIRS = {
    "pair": (["r", "s"], {}),
    "shared_pair": (["rw", "s"], {"shared": True}),
    "counting_pair": (["c", "d"], {"limit": 3}),
}


def lock_of(kind: str, rng: Any) -> Any:
    base = kind.removeprefix("long_").removeprefix("impatient_")
    if base in PAIRS and base != kind:
        resources, options = PAIRS[base]
        if kind.startswith("impatient_"):
            options = dict(options, wait=rng.uniform(0.1, 2.0))
        return semaphore(resources, **options)
    if kind == "impatient":
        return semaphore("r", wait=rng.uniform(0.1, 2.0))
    if kind == "counting":
        return semaphore("c", limit=3)
    if kind == "counting2":
        return semaphore("c", limit=2)
    if kind == "exclusive_c":
        return semaphore("c")
    if kind in ("reader", "long_reader"):
        return semaphore("rw", shared=True)
    if kind == "impatient_writer":
        return semaphore("rw", wait=rng.uniform(0.1, 2.0))
    if kind == "writer":
        return semaphore("rw")
    if kind == "fair":
        return semaphore("r", fair=True)
    if kind == "pair":
        return semaphore(["r", "s"])
    if kind == "single":
        return semaphore("s")
    if kind == "shared_pair":
        return semaphore(["rw", "s"], shared=True)
    if kind == "counting_pair":
        return semaphore(["c", "d"], limit=3)
    if kind == "cross_pair":
        return semaphore(["c", "s"], limit=3)
    if kind == "counting_d":
        return semaphore("d", limit=3)
    return semaphore("r")


def run(sim: Any, proc: Any) -> None:
    """A process's main thread: ``proc.steps`` acquisitions (what a crashed predecessor left
    undone included), a pause between them."""
    rng, monitor, stats = proc.workload_rng, sim.monitor, sim.stats
    profile = sim.profile
    while proc.steps > 0:
        pause = rng.uniform(0.0, 0.3)
        if profile.rest_share and rng.random() < profile.rest_share:
            pause += rng.uniform(*profile.rest_for)  # its resource may go idle, its row reaped
        sim.sched.sleep(pause)
        step = STEPS.get(proc.kind)
        if step is not None:
            step(sim, proc, rng)
            proc.steps -= 1
            continue
        if proc.kind == "worker":
            work_messages(sim, proc, rng)
            break
        if proc.kind == "operator":
            while not all(p.done or p.dead for p in sim.procs if p.kind != "operator"):
                break_one(sim, proc, rng)
            break
        sem = lock_of(proc.kind, rng)
        for resource in sem.resources:
            monitor.begin(proc, resource, sem)
        if proc.kind == "committer":
            proc.transaction = Transaction()
        held = None
        sim.interrupts.arm(proc, proc.kind)
        try:
            with sem as held:
                sim.interrupts.began(proc)
                for resource in sem.resources:
                    monitor.end(proc, resource)
                monitor.entered(proc, sem, held)
                work_in_block(sim, proc, held, work(sim, proc, rng))
                if sim.interrupts.arm_release(proc, held):
                    held.release()  # explicitly (``__exit__`` then finds it released)
            sim.interrupts.ended(proc)
            commit_later(sim, proc, rng)
            stats["acquired"] += 1
            proc.acquired += 1
        except SemaphoreBusy:
            stats["busy"] += 1
        except LockLost as exc:
            stats["lock_lost"] += 1
            monitor.lost(proc, held, exc)
        except SemaphoreUnavailable as exc:
            stats["unavailable"] += 1
            sim.record("unavailable", proc, str(exc)[:80])
        except ValueError as exc:
            if "must use the same limit" not in str(exc):
                raise
            stats["other_limit"] += 1  # held with another limit or mode: refused, as it should
        except KeyboardInterrupt:  # the caller's Ctrl-C, handled: on with the next step
            stats["interrupted"] += 1
            for resource in sem.resources:
                monitor.end(proc, resource)
            if sim.interrupts.phase(proc) != "acquire":  # atomic left: pending holds given
                end_transaction(sim, proc, committed=False)
            sim.interrupts.returned(proc)
        finally:
            sim.interrupts.disarm(proc)
            for resource in sem.resources:
                monitor.end(proc, resource)
            end_transaction(sim, proc, committed=False)  # an exception leaves atomic
        proc.steps -= 1
    proc.done = True


def work_in_block(sim: Any, proc: Any, held: Any, seconds: float) -> None:
    """A block's work: ``seconds`` of virtual time, maybe cut short by a Ctrl-C (the
    interrupt fault), which leaves the block."""
    sim.interrupts.arm_body(proc, held, seconds)
    try:
        sim.sched.sleep(seconds)
    except KeyboardInterrupt:
        sim.monitor.left(proc, held)
        raise
    sim.monitor.left(proc, held)


def break_one(sim: Any, proc: Any, rng: Any) -> None:
    """An operator's ``dynasem_release RESOURCE --token T`` (the command's own reads and
    writes): the holders of a resource, one consistent read, then a break of one of them."""
    from dynasem._operators import locks

    stats = sim.stats
    sim.sched.sleep(rng.uniform(0.2, 2.0))
    resource = rng.choice(BROKEN)
    try:
        holds = locks.holds_on(resource)
        if not holds:
            stats["break_nothing"] += 1
            return
        hold = rng.choice(holds)
        sim.sched.sleep(rng.uniform(0.0, 0.5))  # "Break 1 hold(s)?": the operator reads
        proc.breaking = (resource, hold.token, hold.fence)  # its first write applied breaks
        broken = locks.break_hold(resource, hold.token, user_id=hold.user_id, fence=hold.fence)
    except SemaphoreUnavailable as exc:
        stats["unavailable"] += 1
        sim.record("unavailable", proc, str(exc)[:80])
        return
    finally:
        proc.breaking = None
    stats["broken" if broken else "break_refused"] += 1
    sim.record("break" if broken else "break_refused", proc, resource, hold.token[:8])


class JobFailed(Exception):
    """A job's body failing on purpose: the job becomes FAILED, and runs again."""


def run_job(sim: Any, proc: Any, rng: Any) -> None:
    """One ``run_once`` of a job key (see the module docstring)."""
    stats, jobs = sim.stats, sim.monitor.jobs
    key = f"job{rng.randrange(JOB_KEYS)}"
    if proc.kind == "job_committer":
        proc.transaction = Transaction()
    sim.interrupts.arm(proc, proc.kind)
    try:
        with run_once(key) as job:
            sim.interrupts.began(proc)
            jobs.entered(proc, job)
            long = rng.random() < 0.2
            sim.sched.sleep(
                rng.uniform(1.0, 3.0) * sim.options.lease if long else work(sim, proc, rng)
            )
            fails = rng.random() < 0.25
            jobs.left(proc, job, returned=not fails)
            if fails:
                raise JobFailed(key)
        commit_later(sim, proc, rng)
        stats["jobs_run"] += 1
        proc.acquired += 1
    except JobFailed:
        stats["jobs_failed"] += 1
    except AlreadyDone:
        stats["jobs_done_already"] += 1
    except SemaphoreBusy:
        stats["busy"] += 1
    except LockLost:
        stats["lock_lost"] += 1
    except SemaphoreUnavailable as exc:
        stats["unavailable"] += 1
        sim.record("unavailable", proc, str(exc)[:80])
    except KeyboardInterrupt:
        stats["interrupted"] += 1
        sim.interrupts.returned(proc)
    finally:
        sim.interrupts.disarm(proc)
        end_transaction(sim, proc, committed=False)  # an exception leaves atomic


@dataclasses.dataclass
class Message:
    """A unique task's message on the broker: the claim it carries, which copy of it this
    is, and how deep in retries its task is."""

    claim: Any  # unique.Claim
    copy: int
    depth: int


@dataclasses.dataclass
class Broker:
    """The simulated broker the unique mix's processes share: messages in the order they
    arrived (taken from the front), and copies still on their way (a late second delivery)."""

    messages: list[Message] = dataclasses.field(default_factory=list)
    on_the_way: int = 0
    copies: int = 0

    def put(self, sim: Any, proc: Any, claim: Any, depth: int) -> None:
        """``claim``'s message sent by ``proc``: lost, delivered once, or twice."""
        rng, unique = proc.workload_rng, sim.monitor.unique
        draw = rng.random()
        if draw < 0.1:
            sim.stats["unique_lost"] += 1
            sim.record("msg_lost", proc, claim.resource, claim.token[:8])
            return
        self.copies += 1
        message = Message(claim, self.copies, depth)
        unique.queued(message)
        self.messages.append(message)
        sim.record("msg", proc, claim.resource, claim.token[:8], message.copy)
        if draw < 0.1 + 1 / 7:  # at least once: a second copy, a while later
            self.copies += 1
            again = Message(claim, self.copies, depth)
            unique.queued(again)
            self.on_the_way += 1
            sim.stats["unique_twice"] += 1

            def arrive() -> None:
                self.on_the_way -= 1
                self.messages.append(again)

            sim.sched.at(rng.uniform(0.0, 3.0), arrive)

    def idle(self, sim: Any) -> bool:
        """Nothing left to deliver, and nothing more will come but the workers' retries (a
        worker that enqueues one runs on to take it)."""
        enqueuers = [p for p in sim.procs if p.kind == "enqueuer"]
        return (
            not self.messages
            and not self.on_the_way
            and not sim.restarts
            and all(p.done or p.dead for p in enqueuers)
        )


def broker_of(sim: Any) -> Broker:
    broker: Broker | None = getattr(sim, "broker", None)
    if broker is None:
        broker = sim.broker = Broker()
    return broker


def enqueue(sim: Any, proc: Any, rng: Any) -> None:
    """One enqueue of a unique task (see the module docstring)."""
    from dynasem._background import unique

    stats, monitor = sim.stats, sim.monitor.unique
    if rng.random() < 0.2:  # a rest: keys' leases run out, and their claims are looked at
        sim.sched.sleep(rng.uniform(1.0, 2.5) * sim.options.lease)
    key = f"u{rng.randrange(UNIQUE_KEYS)}"
    task_id = f"{proc.name}#{proc.steps}-{rng.randrange(10**6)}"
    queue_lease = QUEUE_LEASE * sim.options.lease
    monitor.enqueuing(proc, key, task_id)
    sim.interrupts.arm(proc, proc.kind)
    try:
        claimed = unique.claim_for(UNIQUE_TASK, key, task_id, queue_lease, None)
        sim.interrupts.began(proc)
    except KeyboardInterrupt:
        stats["interrupted"] += 1
        sim.interrupts.returned(proc)
        monitor.enqueued(proc, key)
        return
    except unique.Taken as busy:
        stats["unique_taken"] += 1
        monitor.taken(proc, key, task_id, busy)
        return
    except SemaphoreUnavailable as exc:
        stats["unavailable"] += 1
        sim.record("unavailable", proc, str(exc)[:80])
        monitor.enqueued(proc, key)
        return
    finally:
        sim.interrupts.disarm(proc)
    assert claimed is not None
    stats["unique_enqueued"] += 1
    if rng.random() < 0.05:  # the broker refused it: given back
        stats["unique_withdrawn"] += 1
        sim.record("withdraw", proc, key, claimed.token[:8])
        unique.withdraw(claimed, None)
    else:
        broker_of(sim).put(sim, proc, claimed, 0)
    monitor.enqueued(proc, key)


def work_messages(sim: Any, proc: Any, rng: Any) -> None:
    """A worker: takes the broker's messages and runs each, until nothing more will come."""
    broker = broker_of(sim)
    while True:
        if not broker.messages:
            if broker.idle(sim):
                return
            sim.sched.sleep(rng.uniform(0.05, 0.3))
            continue
        message = broker.messages.pop(0)
        sim.monitor.unique.taking(proc, message)
        try:
            if _revoked(sim, message):
                revoke(sim, proc, message)
            else:
                run_message(sim, proc, rng, message)
        finally:
            sim.monitor.unique.finished(proc, message)


def _revoked(sim: Any, message: Message) -> bool:
    """One message in twenty is revoked (drawn from the run's seed and the copy, so that
    the workload's other draws stay as they were)."""
    return random.Random(f"{sim.options.seed}:revoke:{message.copy}").random() < 0.05


def revoke(sim: Any, proc: Any, message: Message) -> None:
    """The worker discards a revoked task's message and gives its key back (Celery's
    ``task_revoked``): a retry's claim whose run goes on is withdrawn from that run."""
    from dynasem._background import unique

    sim.stats["unique_revoked"] += 1
    sim.record("revoked", proc, message.claim.resource, message.claim.token[:8])
    unique.give_back(message.claim)  # quietly: a failure leaves it to the queue lease


def run_message(sim: Any, proc: Any, rng: Any, message: Message) -> None:
    from dynasem._background import unique

    stats, monitor = sim.stats, sim.monitor
    sim.sched.sleep(rng.uniform(0.0, 0.3))  # prefetched: a crash now loses it
    carried = message.claim
    # The task's options, as a framework's task has them (run lease: the LEASE setting).
    options = types.SimpleNamespace(run_lease=None, queue_lease=QUEUE_LEASE * sim.options.lease)

    def body() -> bool:
        sim.interrupts.began(proc)
        adopted, held = unique.current_run(UNIQUE_TASK, carried) or (None, None)
        assert adopted is carried and held is not None
        monitor.unique.began(proc, message, held)
        monitor.entered(proc, held.semaphore, held)
        try:
            long = rng.random() < 0.2
            seconds = rng.uniform(1.0, 3.0) * sim.options.lease if long else work(sim, proc, rng)
            retry_at = rng.uniform(0.0, seconds) if rng.random() < 0.3 else None
            if retry_at is not None and message.depth < RETRY_DEPTH:
                sim.sched.sleep(retry_at)
                seconds -= retry_at
                retry(sim, proc, rng, message, held)
            sim.sched.sleep(seconds)
        finally:
            monitor.left(proc, held)
        return True

    sim.interrupts.arm(proc, "adopt")
    try:
        ran = unique.run(UNIQUE_TASK, options, carried, body, refused=False)
    except LockLost:  # the retry's announcement refused: the run's hold was lost
        stats["lock_lost"] += 1
        return
    except SemaphoreUnavailable as exc:
        stats["unavailable"] += 1
        sim.record("unavailable", proc, str(exc)[:80])
        return
    except KeyboardInterrupt:  # the worker's Ctrl-C as it adopted the claim: on to the next
        stats["interrupted"] += 1
        sim.interrupts.returned(proc)
        return
    finally:
        sim.interrupts.disarm(proc)
    if ran:
        stats["acquired"] += 1
        stats["unique_ran"] += 1
        proc.acquired += 1
    else:
        stats["unique_not_run"] += 1


def retry(sim: Any, proc: Any, rng: Any, message: Message, held: Any) -> None:
    """The run of ``message`` enqueues a retry of itself: the key goes on with it."""
    from dynasem._background import unique

    carried, stats = message.claim, sim.stats
    queue_lease = QUEUE_LEASE * sim.options.lease
    run = unique.current_run(UNIQUE_TASK, carried)
    claimed = unique.claim_for(UNIQUE_TASK, carried.resource, carried.task_id, queue_lease, run)
    if claimed is None:  # a second retry of one run: the first has the key
        stats["unique_second_retry"] += 1
        return
    sim.monitor.unique.retried(proc, carried, claimed, held)
    stats["unique_retries"] += 1
    if rng.random() < 0.05:
        stats["unique_withdrawn"] += 1
        sim.record("withdraw", proc, carried.resource, claimed.token[:8])
        unique.withdraw(claimed, run)
        return
    broker_of(sim).put(sim, proc, claimed, message.depth + 1)
    if rng.random() < 0.1:  # and once more: nothing goes on with it
        again = unique.claim_for(UNIQUE_TASK, carried.resource, carried.task_id, queue_lease, run)
        if again is not None:
            sim.monitor.fail(f"{proc.name}: a second retry of one run got a claim")


def run_coalesced(sim: Any, proc: Any, rng: Any) -> None:
    """One coalesced call (see the module docstring)."""
    from dynasem.exceptions import Coalesced

    stats, monitor = sim.stats, sim.monitor
    calls = monitor.coalesce
    key = f"n{rng.randrange(COALESCE_KEYS)}"
    impatient = proc.kind == "impatient_coalescer"
    sem = semaphore(key, coalesce=True, wait=rng.uniform(0.2, 3.0) if impatient else None)
    monitor.begin(proc, key, sem)
    calls.arrived(proc, key)
    held = None
    try:
        with sem as held:
            monitor.end(proc, key)
            calls.entered(proc, held)
            monitor.entered(proc, sem, held)
            long = rng.random() < 0.1
            sim.sched.sleep(
                rng.uniform(1.0, 3.0) * sim.options.lease if long else work(sim, proc, rng)
            )
            monitor.left(proc, held)
            calls.left(proc)
        stats["acquired"] += 1
        stats["coalesce_ran"] += 1
        proc.acquired += 1
    except Coalesced:
        stats["coalesced"] += 1
        calls.answered(proc, "coalesced")
    except SemaphoreBusy:
        stats["busy"] += 1
        calls.answered(proc, "gave_up")
    except LockLost as exc:
        stats["lock_lost"] += 1
        monitor.lost(proc, held, exc)
        calls.answered(proc, "lost")
    except SemaphoreUnavailable as exc:
        stats["unavailable"] += 1
        sim.record("unavailable", proc, str(exc)[:80])
        calls.answered(proc, "failed")
    finally:
        monitor.end(proc, key)


def lead(sim: Any, proc: Any, rng: Any) -> None:
    """One term of a leader (see the module docstring)."""
    from dynasem import leadership

    stats, monitor = sim.stats, sim.monitor
    election = leadership(LEADERSHIP, on_lost=lambda lead: lost.append(sim.sched.now))
    lost: list[float] = []
    resource = election.semaphore.resources[0]
    monitor.begin(proc, resource, election.semaphore)
    held = None
    try:
        with election as term:
            held = term.held
            monitor.end(proc, resource)
            monitor.leads.entered(proc, term, lost)
            monitor.entered(proc, held.semaphore, held)
            seconds = rng.uniform(1.0, 2.0) * sim.options.lease if rng.random() < 0.2 else 1.0
            while seconds > 0 and term.active:  # a leader acts only while it leads,
                step = min(seconds, rng.uniform(0.1, 1.0), term.seconds_left())  # in time
                monitor.leads.acting(proc, step)
                sim.sched.sleep(step)
                seconds -= step
            monitor.left(proc, held)
        stats["acquired"] += 1
        stats["lead_terms"] += 1
        stats["lead_lost"] += bool(lost)
        proc.acquired += 1
    except LockLost as exc:
        stats["lock_lost"] += 1
        monitor.lost(proc, held, exc)
    except SemaphoreUnavailable as exc:
        stats["unavailable"] += 1
        sim.record("unavailable", proc, str(exc)[:80])
    finally:
        monitor.end(proc, resource)
        monitor.leads.left(proc)


def work(sim: Any, proc: Any, rng: Any) -> float:
    """How long a block works, in virtual seconds."""
    if proc.kind in ("long", "long_reader") or proc.kind.startswith("long_"):
        return float(rng.uniform(1.0, 3.0) * sim.options.lease)
    return float(rng.uniform(0.001, 0.4) if rng.random() < 0.9 else 2.0)


# A step of the kinds that do something else than hold a semaphore (run_once, unique tasks,
# coalesced calls, leadership), by kind: one of ``proc.steps``.
STEPS: dict[str, Callable[[Any, Any, Any], None]] = {
    "job": run_job,
    "job_committer": run_job,
    "enqueuer": enqueue,
    "coalescer": run_coalesced,
    "impatient_coalescer": run_coalesced,
    "leader": lead,
}
