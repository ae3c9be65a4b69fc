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
* ``fair``: ``semaphore("r", fair=True)``;
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
"""

from __future__ import annotations

import dataclasses
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
}

JOB_KEYS = 4  # keys a job mix's processes run (each until one run of it succeeds)


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
        if proc.kind in ("job", "job_committer"):
            run_job(sim, proc, rng)
            proc.steps -= 1
            continue
        sem = lock_of(proc.kind, rng)
        for resource in sem.resources:
            monitor.begin(proc, resource, sem)
        if proc.kind == "committer":
            proc.transaction = Transaction()
        held = None
        try:
            with sem as held:
                for resource in sem.resources:
                    monitor.end(proc, resource)
                monitor.entered(proc, sem, held)
                sim.sched.sleep(work(sim, proc, rng))
                monitor.left(proc, held)
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
        finally:
            for resource in sem.resources:
                monitor.end(proc, resource)
            end_transaction(sim, proc, committed=False)  # an exception leaves atomic
        proc.steps -= 1
    proc.done = True


class JobFailed(Exception):
    """A job's body failing on purpose: the job becomes FAILED, and runs again."""


def run_job(sim: Any, proc: Any, rng: Any) -> None:
    """One ``run_once`` of a job key (see the module docstring)."""
    stats, jobs = sim.stats, sim.monitor.jobs
    key = f"job{rng.randrange(JOB_KEYS)}"
    if proc.kind == "job_committer":
        proc.transaction = Transaction()
    try:
        with run_once(key) as job:
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
    finally:
        end_transaction(sim, proc, committed=False)  # an exception leaves atomic


def work(sim: Any, proc: Any, rng: Any) -> float:
    """How long a block works, in virtual seconds."""
    if proc.kind in ("long", "long_reader") or proc.kind.startswith("long_"):
        return float(rng.uniform(1.0, 3.0) * sim.options.lease)
    return float(rng.uniform(0.001, 0.4) if rng.random() < 0.9 else 2.0)
