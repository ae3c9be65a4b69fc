"""A deterministic simulation run: dynasem's own lock code, for many simulated processes on
several simulated hosts, in one OS thread; a pure function of its seed and options.

How a run owns what dynasem would take from the machine:

* **threads**: every simulated thread (a workload, the heartbeat's scheduler and renewals,
  the push listener) is a greenlet; ``threading`` in dynasem's modules is a shim whose
  locks, conditions, events and joins block in the scheduler (``shims``, ``scheduler``);
* **time**: ``dynasem._clock`` and ``time`` in dynasem's modules read the current process's
  clocks (its host's wall clock, its own monotonic clock); sleeps are scheduler waits; the
  real ``time`` functions refuse dynasem callers during a run (``shims.guard_real_time``);
* **I/O**: ``dynamodb.get_client()`` is the process's :class:`network.SimClient` (requests
  applied to the database at moments the network draws, answers lost, throttled, retried as
  botocore does); ``socket`` is the simulated UDP network (hand-over pushes);
  ``processes``' view of /proc is the simulated host's;
* **randomness**: ``random`` and ``uuid`` in dynasem draw from each process's seeded rng;
* **module state**: each process's own copy of dynasem's per-process globals, swapped in
  whenever one of its threads runs (``state``).

The database is a constructor away (:data:`DATABASES`): ``MotoDB`` until the simulated
DynamoDB lands, then ``SimDynamoDB``, both ``(rng, now, profile)`` with ``apply()``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import importlib
import json
import logging
import pkgutil
import random
import threading as real_threading
import time as real_time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from . import faults, interrupts, invariants, network, shims, state, workload
from .process import Host, Process
from .scheduler import Scheduler

START = 1_750_000_000.0  # true virtual time at the start of a run (epoch seconds)
TTL_SWEEP = 30.0  # virtual seconds between two TTL sweeps of the database
TTL_SWEEP_SOON = 0.5  # the same, when a fault profile has TTL delete soon (``ttl_within``)


def _moto(rng: random.Random, now: Callable[[], float], profile: str) -> Any:
    from .moto_db import MotoDB

    return MotoDB(rng, now, profile)


def _sim(rng: random.Random, now: Callable[[], float], profile: str) -> Any:
    from .dynamodb import Profile, SimDynamoDB  # type: ignore[import-not-found]

    return SimDynamoDB(rng, now, getattr(Profile, profile)())  # "aws" or "kind"


DATABASES = {"moto": _moto, "sim": _sim}


@dataclasses.dataclass(frozen=True)
class Options:
    seed: int = 1
    processes: int = 6
    hosts: int = 2
    steps: int = 10  # acquisitions per process
    mix: str = "exclusive"  # workload.MIXES
    faults: str = "light"  # faults.PROFILES
    lease: float = 10.0
    skew: float = 1.0
    spread: float = 0.5  # host clocks within spread * skew of true time
    db: str = "sim"  # tests.support.sim.dynamodb; "moto": moto's in process, 20-50 times slower
    db_profile: str = "aws"
    push: bool = True
    # Pushes across hosts: each process listens on its host's address (PUSH = the host's
    # IP), so a releaser on one host pushes the hand-over to an heir on another, whose clock
    # is another's; else PUSH is loopback (the default), and only a host's own waiters are
    # pushed (the others look).
    push_across: bool = False
    # A crashed process's successor starts on the next host, not its own: a holder crashed
    # where no other process of its host waits is proven dead by nobody (a waiter of its
    # host hands its lock on, or takes it over, at once), so the lock waits for its lease
    # end, the take-over every other host relies on.
    restart_elsewhere: bool = False
    max_time: float = 1800.0  # virtual seconds
    mutation: str = ""  # mutations.MUTATIONS: a deliberate protocol bug, for the run
    # Counting semaphores of more permits than this keep their holders in permit items
    # (0: the library's own, permit_items.INLINE_MAX): 1 puts the counting mix there.
    permits_from: int = 0
    # The share of acquisitions interrupted (KeyboardInterrupt) in the fault window, whatever
    # the profile (0: the profile's own ``interrupt``): tests.support.sim.interrupts.
    interrupts: float = 0.0
    # Shared resources keep this many readers in their row, the next in reader items (-1:
    # the library's own, lock_writes.READERS_INLINE): 0 puts every reader there.
    readers_from: int = -1
    trace: bool = True


@dataclasses.dataclass
class Result:
    options: Options
    violations: list[str]
    stats: collections.Counter[str]
    events: int
    virtual_seconds: float
    wall_seconds: float
    trace: list[tuple[Any, ...]]
    failures: list[str]
    # The smallest time by which an earlier holder's trust had ended when another entered
    # beside it (None: no holder was ever inside when another entered).
    closest: float | None = None
    # The longest a resource stayed idle while live processes waited, after the faults.
    longest_idle: float = 0.0
    # The most requests one thread sent in a second of virtual time.
    busiest: int = 0

    @property
    def digest(self) -> str:
        """A short hash of the trace: two runs with the same digest went the same way."""
        return hashlib.sha256(repr(self.trace).encode()).hexdigest()[:16]

    @property
    def ok(self) -> bool:
        return not self.violations and not self.failures

    def summary(self) -> str:
        s = self.stats
        fault_names = (
            *("crash", "stall", "jump", "partition", "cut", "deafened"),
            *("lost", "dropped", "throttled", "unsent"),
        )
        shown = ",".join(f"{k}:{s[k]}" for k in fault_names if s.get(k))
        closest = f" closest={self.closest:.3f}s" if self.closest is not None else ""
        jobs = ("jobs_run", "jobs_failed", "jobs_done_already")
        if any(s.get(k) for k in jobs):  # ran, failed, found DONE
            closest += " jobs=" + "/".join(str(s.get(k, 0)) for k in jobs)
        unique = ("unique_ran", "unique_not_run", "unique_taken", "unique_lost", "unique_retries")
        if any(s.get(k) for k in unique):  # ran, not run, refused, lost, retries enqueued
            closest += " unique=" + "/".join(str(s.get(k, 0)) for k in unique)
        if s.get("handed_on"):  # dead holders' locks handed on by a waiter behind
            closest += f" handed_on={s['handed_on']}"
        if s.get("interrupt"):  # thrown, needed, give-back writes, refused, blind, redundant
            names = ("interrupt", "interrupt_needed", "interrupt_cleanup_writes")
            names += ("interrupt_cleanup_refused", "interrupt_blind_refusals")
            names += ("interrupt_redundant",)
            closest += " int=" + "/".join(str(s.get(k, 0)) for k in names)
            # of which in bodies, in releases; releases' holds left to their lease, hand-overs
            names = ("interrupt_in_body", "interrupt_in_release", "interrupt_left_to_lease")
            names += ("interrupt_handed_over",)
            closest += " int_hold=" + "/".join(str(s.get(k, 0)) for k in names)
        rate = s["acquired"] / self.wall_seconds if self.wall_seconds else 0.0
        return (
            f"seed={self.options.seed} events={self.events} t={self.virtual_seconds:.1f}s "
            f"acq={s['acquired']} busy={s['busy']} lock_lost={s['lock_lost']} "
            f"unavail={s['unavailable']} "
            f"requests={s['requests']} faults=[{shown}] violations={len(self.violations)} "
            f"failures={len(self.failures)}{closest} idle={self.longest_idle:.1f}s "
            f"busiest={self.busiest}/s "
            f"wall={self.wall_seconds:.2f}s acq/s={rate:.0f} trace={self.digest}"
        )

    def raise_if_violated(self) -> None:
        if not self.ok:
            problems = "\n".join(self.violations + self.failures)
            tail = "\n".join(format_event(e) for e in self.trace[-40:])
            raise invariants.Violation(
                f"seed {self.options.seed} ({self.options}):\n{problems}\nlast events:\n{tail}"
            )


# How only lock_writes.hand_on's update begins: the gone holders removed, then the heirs set
# (take_join's removal of dead holders comes after its SET). Not its condition, which the
# hand-on mutations change.
_HAND_ON = "REMOVE #h.#x0"


def format_event(event: tuple[Any, ...]) -> str:
    t, kind, who, *rest = event
    return f"{t:12.6f} {who:>10} {kind:<8} " + " ".join(str(r) for r in rest)


def import_dynasem() -> None:
    """Import every module of dynasem's lock (the shims replace names in loaded modules)."""
    import django
    from django.conf import settings

    if not settings.configured:
        import os

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    import dynasem

    for package in state.CHECKED:
        pkg = importlib.import_module(f"dynasem.{package}")
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"dynasem.{package}.{info.name}")
    importlib.import_module("dynasem._clock")
    # The operators' reaper and breaks run in simulated processes too: imported before the
    # shims go in, or their ``time`` stays the real one (a reap's resend slept for real).
    importlib.import_module("dynasem._operators.reaper")
    assert dynasem


class Simulation:
    """One run (see the module's docstring); :meth:`run` returns its :class:`Result`."""

    def __init__(self, options: Options):
        import_dynasem()
        network.client_config(False)  # dynasem's client configuration, read before the run
        self.options = o = options
        self.profile = faults.PROFILES[o.faults]
        seeds = random.Random(o.seed)
        self.sched = Scheduler(random.Random(seeds.random()), START, self._enter)
        self.fault_rng = random.Random(seeds.random())
        self.net_rng = random.Random(seeds.random())
        self.world_rng = random.Random(seeds.random())
        self.db_rng = random.Random(seeds.random())
        self.state = state.ModuleState()
        self.threading = shims.Threading(self)
        self.in_db = False
        self._clock_proc: Process | None = None
        self.trace: list[tuple[Any, ...]] = []
        self.stats: collections.Counter[str] = collections.Counter()
        self.monitor = invariants.Monitor(
            self, lease=o.lease, skew=o.skew, quiet_from=START + self.profile.window
        )
        self.hosts = [Host(f"h{i}", self._offset(), f"10.0.0.{i + 1}") for i in range(o.hosts)]
        self.procs: list[Process] = []
        self._pids = 100
        self._mutated: Any = None
        self.restarts = 0  # crashed processes whose successors have not started yet
        self.db: Any = None
        self.requests: network.Requests
        self.datagrams = network.Datagrams(self, self.net_rng, self.profile)
        self.interrupts = interrupts.Interrupts(self, o.interrupts or self.profile.interrupt)
        if self.interrupts.rate:  # (no hook otherwise: every other run goes as it went)
            self.sched.blocking = self.interrupts.blocking

    # -- what the shims and seams ask ------------------------------------------------------------

    def current(self) -> Process:
        if self._clock_proc is not None:
            return self._clock_proc
        thread = self.sched.current
        if thread is None:
            raise RuntimeError("simulation: a process's clock read outside its threads")
        return thread.proc  # type: ignore[return-value]

    def wall(self) -> float:
        return self.sched.now + self.current().host.offset

    @staticmethod
    def _for_the_run(simulated: Callable[[], float], real: Callable[[], float]) -> Any:
        """``simulated`` for the run's threads; ``real`` for a thread a test before the run
        left behind (the heartbeat scheduler of a hold on DynamoDB Local reads dynasem's
        clock too), as the ``time`` shim does."""
        the_run = real_threading.get_ident()

        def read() -> float:
            return simulated() if real_threading.get_ident() == the_run else real()

        return read

    def mono(self) -> float:
        return self.sched.now + self.current().mono_base

    def rng(self) -> random.Random:
        return self.current().rng

    def hostname(self) -> str:
        return self.current().host.name

    def spawn(self, target: Any, name: str) -> Any:
        return self.sched.spawn(self.sched.me().proc, target, name)

    def uuid_drawn(self, token: str) -> None:
        thread = self.sched.current
        if thread is not None:
            self.interrupts.drawn(thread.proc, token)

    def udp_socket(self) -> network.UdpSocket:
        return network.UdpSocket(self.datagrams, self.sched.me().proc)

    def get_client(self, *, quick: bool = False) -> network.SimClient:
        proc = self.current()
        if quick not in proc.clients:
            proc.clients[quick] = network.SimClient(self.requests, proc, quick)
        return proc.clients[quick]  # type: ignore[no-any-return]

    def process_identity(self) -> str:
        """Who holds a lock when no user does (``host:pid``, as dynasem records it)."""
        proc = self.current()
        return f"{proc.host.name}:{proc.pid}"

    def probe(self) -> str:
        return self.current().identity()

    def proc_stat(self, pid: int | str) -> tuple[str, int]:
        host = self.current().host
        for proc in self.procs:
            if proc.host is host and str(proc.pid) == str(pid) and not proc.dead:
                return proc.stat()
        raise FileNotFoundError(f"/proc/{pid}/stat")

    @contextlib.contextmanager
    def clock_of(self, proc: Process) -> Iterator[None]:
        """Read ``proc``'s clocks from the hub (the invariants)."""
        self._clock_proc = proc
        try:
            yield
        finally:
            self._clock_proc = None

    def clock_label(self) -> str:
        return self.clock_label_of(self.sched.now)

    def clock_label_of(self, when: float) -> str:
        return f"{when - START:.6f}"

    def _enter(self, proc: Any) -> None:
        self.state.enter(proc)

    def _offset(self) -> float:
        bound = self.options.spread * self.options.skew
        return self.world_rng.uniform(-bound, bound)

    # -- faults ----------------------------------------------------------------------------------

    def quiet(self) -> bool:
        return self.sched.now >= START + self.profile.window

    def cut_off(self, proc: Process) -> bool:
        """Whether ``proc``'s host is cut off from DynamoDB now (a partition)."""
        return bool(proc.host.cut_until > self.sched.now)

    def request_fault(self, proc: Process, *, write: bool = False) -> str | None:
        if self.cut_off(proc):
            self.stats["cut"] += 1
            return "dropped"  # never reaches DynamoDB: the read timeout ends the attempt
        if self.quiet():
            return None
        if self.deaf(proc):
            self.stats["deaf"] += 1
            return "lost"  # applied; its answer lost on the broken way back
        fault = self.profile.request_fault(self.fault_rng)
        if fault is not None:
            self.stats[fault] += 1
        # A write's answer lost, and the way back stays broken. (No draw without deaf faults:
        # every other profile's seeds go as they went.)
        if (
            fault == "lost"
            and write
            and self.profile.deaf_share
            and self.fault_rng.random() < self.profile.deaf_share
        ):
            self._deafen(proc.host)
        return fault

    def deaf(self, proc: Process) -> bool:
        """Whether DynamoDB's answers to ``proc``'s host are lost now."""
        return bool(proc.host.deaf_until > self.sched.now)

    def _deafen(self, host: Any) -> None:
        seconds = self.fault_rng.uniform(*self.profile.deaf_for)
        end = min(self.sched.now + seconds, START + self.profile.window)
        host.deaf_until = max(host.deaf_until, end)
        self.stats["deafened"] += 1
        self.record("deaf", None, host.name, round(seconds, 3))

    def push_fault(self) -> str | None:
        if self.quiet():
            return None
        p, draw = self.profile, self.fault_rng.random()
        for name, rate in (("push_lost", p.push_lost), ("push_twice", p.push_twice)):
            if draw < rate:
                self.stats[name] += 1
                return name
            draw -= rate
        if draw < p.push_late:
            self.stats["push_late"] += 1
            return "push_late"
        return None

    # -- the database ----------------------------------------------------------------------------

    def apply(self, proc: Any, operation: str, params: dict[str, Any]) -> tuple[str, Any]:
        """Apply one request to the database now (atomic: nothing else runs meanwhile)."""
        from botocore.exceptions import ClientError

        self.stats["requests"] += 1
        self.in_db = True
        try:
            try:
                result: tuple[str, Any] = ("ok", self.db.apply(operation, params))
            except ClientError as exc:
                result = ("error", exc)
            if result[0] == "ok":
                self._written(proc, operation, params)
            else:
                self._refused(proc, operation, params, result[1])
        finally:
            self.in_db = False
        return result

    def _written(self, proc: Any, operation: str, params: dict[str, Any]) -> None:
        """Show the monitor every lock row ``proc``'s write changed, as it is now."""
        from dynasem._storage import records

        if operation == "Query" and ":lo" in params.get("ExpressionAttributeValues", {}):
            self.monitor.queue_read(params["ExpressionAttributeValues"][":pk"]["S"], proc)
            return
        if operation in ("UpdateItem", "PutItem", "DeleteItem"):
            keys = [params.get("Key") or params.get("Item")]
        elif operation == "TransactWriteItems":
            keys = [next(iter(action.values())).get("Key") for action in params["TransactItems"]]
        else:
            return
        for key in keys:
            sk = key["sk"].get("S", "") if key else ""
            breaking = getattr(proc, "breaking", None)
            if breaking is not None and key and key["pk"]["S"] == breaking[0]:
                # An operator's break applied: its first write (the rest count down, hint,
                # hand over). An item's break is by token: the grant it broke is the item's
                # (the same token admitted again since the listing holds under a new fence).
                item = records.decode(self._item(key, params)) or {}
                fence = int(item.get("f", breaking[2])) if sk != records.LOCK_SK else breaking[2]
                self.monitor.broke(breaking[0], breaking[1], fence, sk)
                proc.breaking = None
            if sk.startswith(records.ENTRY_PREFIX):
                self.monitor.entry_written(key["pk"]["S"], sk, self.entry_now(key["pk"]["S"], sk))
            if sk == records.JOB_SK:
                self.monitor.jobs.written(key["pk"]["S"], records.decode(self._item(key, params)))
            if sk == records.NEXT_SK:
                item = records.decode(self._item({"pk": key["pk"], "sk": key["sk"]}, params))
                self.monitor.coalesce.written(key["pk"]["S"], operation, item, proc)
            if sk != records.LOCK_SK:
                continue
            if params.get("UpdateExpression", "").startswith(_HAND_ON):
                # A waiter handed a dead holder's lock on to the first waiter ahead of it.
                self.stats["handed_on"] += 1
                self.record("hand_on", proc, key["pk"]["S"])
            item = records.decode(self._item(key, params))
            self.monitor.row_written(key["pk"]["S"], item, proc)

    def _refused(self, proc: Any, operation: str, params: dict[str, Any], exc: Any) -> None:
        """Show the monitor a refused write of a next-run registration (coalescing)."""
        from dynasem._storage import records

        key = params.get("Key") or params.get("Item")
        if operation not in ("UpdateItem", "PutItem", "DeleteItem") or key is None:
            return
        if key["sk"].get("S") != records.NEXT_SK:
            return
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            return
        item = records.decode(self._item({"pk": key["pk"], "sk": key["sk"]}, params))
        self.monitor.coalesce.refused(key["pk"]["S"], operation, params, item, proc)

    def entry_now(self, resource: str, sk: str) -> dict[str, Any] | None:
        """The queue entry item at ``sk`` as the database has it now (decoded; the monitor
        changes nothing)."""
        from dynasem._storage import records

        key = {"pk": {"S": resource}, "sk": {"S": sk}}
        return records.decode(self._item(key, {"TableName": network.TABLE}))

    # -- transactions ----------------------------------------------------------------------------

    def after_transaction(
        self, using: Any, finish: Any, name: str, *, owner: Any = None, **_: Any
    ) -> bool:
        """``commit.after_transaction``: ``finish`` waits for the calling process's open
        transaction (a committer's), if it has one; else False (given back at once)."""
        transaction = self.current().transaction
        if transaction is None:
            return False
        transaction.at_end.append((finish, owner))
        return True

    def open_transaction(self, using: Any) -> Any:
        """``commit.open_transaction``: the calling process's open transaction, or None."""
        return self.current().transaction

    def pending_owners(self) -> list[Any]:
        transaction = self.current().transaction
        return [] if transaction is None else [o for _, o in transaction.at_end if o is not None]

    def _item(self, key: dict[str, Any], params: dict[str, Any]) -> dict[str, Any] | None:
        """The item at ``key`` now (low-level): without a request if the database can."""
        peek = getattr(self.db, "peek", None)
        if peek is not None:
            return peek(key)  # type: ignore[no-any-return]
        # The simulated DynamoDB's snapshot (a GetItem would count against its throttling
        # and draw from its rng: the monitor must change nothing).
        table = self.db.snapshot().get(params.get("TableName") or network.TABLE, {})
        found: dict[str, Any] | None = table.get(json.dumps([key["pk"]["S"], key["sk"]["S"]]))
        return found

    # -- a run ---------------------------------------------------------------------------------

    def run(self) -> Result:
        started = real_time.perf_counter()
        o = self.options
        self.db = DATABASES[o.db](self.db_rng, lambda: self.sched.now, o.db_profile)
        self._create_table()
        self.requests = network.Requests(self, self.db, self.net_rng, self.profile)
        undo = self._install()
        try:
            self._schedule_faults()
            mix = workload.MIXES[o.mix]
            for i in range(o.processes):
                self._start(self.hosts[i % len(self.hosts)], mix[i % len(mix)], o.steps)
            if self.profile.reap_every:
                self._start_reaper()
            self.sched.run(START + o.max_time, self._finished, self.monitor.check)
            if not self._finished():
                left = [p.name for p in self.procs if not (p.done or p.dead)]
                self.monitor.fail(f"liveness: not done after {o.max_time:g}s: {left}")
            elif not self.monitor.violations:
                self.monitor.finish()
            self._stop_all()
        finally:
            self._uninstall(undo)
            close = getattr(self.db, "close", None)
            if close is not None:
                close()
        return Result(
            options=o,
            violations=self.monitor.violations,
            stats=collections.Counter(self.stats),
            events=self.sched.events,
            virtual_seconds=self.sched.now - START,
            wall_seconds=real_time.perf_counter() - started,
            trace=self.trace,
            failures=[_failure(thread, exc) for thread, exc in self.sched.failures],
            closest=min((m for m, _ in self.monitor.margins), default=None),
            longest_idle=self.monitor.longest_idle,
            busiest=self.monitor.busiest,
        )

    def _create_table(self) -> None:
        from dynasem._storage import records

        self.in_db = True
        try:
            self.db.apply("CreateTable", records.table_definition(network.TABLE))
            ttl = {"Enabled": True, "AttributeName": "expires"}  # as dynasem_createtable does
            self.db.apply(
                "UpdateTimeToLive", {"TableName": network.TABLE, "TimeToLiveSpecification": ttl}
            )
        finally:
            self.in_db = False
        if not hasattr(self.db, "expire_ttl"):
            return
        if self.profile.ttl_within:  # TTL deletes soon: a row gone between two writes
            profile = dataclasses.replace(self.db.profile, ttl_delay=self.profile.ttl_within)
            self.db.profile = profile
        self.sched.at(self._ttl_sweep(), self._expire_ttl)  # DynamoDB's TTL sweep, now and then

    def _ttl_sweep(self) -> float:
        return TTL_SWEEP_SOON if self.profile.ttl_within else TTL_SWEEP

    def _expire_ttl(self) -> None:
        deleted: list[tuple[str, str]] = []
        self.in_db = True
        try:
            self.stats["ttl_deleted"] += self.db.expire_ttl(deleted)
        finally:
            self.in_db = False
        self._tell_deleted(deleted, "ttl")
        self.sched.at(self._ttl_sweep(), self._expire_ttl)

    def _tell_deleted(self, keys: list[tuple[str, str]], by: str) -> None:
        """The monitor shown the lock rows and queue entries TTL deleted."""
        from dynasem._storage import records

        for resource, sk in keys:
            if sk == records.LOCK_SK:
                self.stats["ttl_deleted_rows"] += 1
                self.monitor.row_written(resource, None, by)
            elif sk.startswith(records.ENTRY_PREFIX):
                self.monitor.entry_written(resource, sk, None)
            self.record("ttl_delete", None, f"{resource}/{sk}")

    def _start_reaper(self) -> None:
        """An operator's cron, on the first host: ``dynasem_reap`` (the command's own
        :func:`reaper.reap`, its deletes sent one at a time) every ``reap_every`` seconds on
        average, for as long as the run goes. Not a workload process: the run ends without it,
        no fault picks it as a victim, and if a crash at an answer stops it, cron starts
        another."""
        self._pids += 1
        seed = f"{self.options.seed}:reaper"
        proc = Process(self, self.hosts[0], self._pids, seed, kind="reaper", steps=0)
        proc.done = True
        proc.globals = self.state.fresh(proc)
        self.procs.append(proc)
        self.record("start", proc, "reaper", 0)
        self.sched.spawn(proc, lambda: self._reap_now_and_then(proc), "main")

    def _reap_now_and_then(self, proc: Process) -> None:
        from dynasem._operators import reaper
        from dynasem.exceptions import SemaphoreUnavailable

        every = self.profile.reap_every
        while True:  # half of every apart at least: a reap sends 20-30 requests (the storm check)
            self.sched.sleep(every / 2 + proc.workload_rng.expovariate(2 / every))
            try:
                result = reaper.reap(workers=1)
            except SemaphoreUnavailable as exc:  # the index's listing failed: the next reap
                self.record("reap_failed", proc, str(exc)[:80])
                continue
            self.stats["reaped_rows"] += result.deleted
            self.stats["reaped_items"] += result.permits
            self.record("reap", proc, result.found, result.deleted, result.permits, result.survived)

    def _finished(self) -> bool:
        """Asked before every event: a loop, not a generator's cost each time."""
        if self.monitor.violations:
            return True
        if self.restarts:
            return False
        for p in self.procs:
            if not (p.done or p.dead):
                return False
        return True

    def _install(self) -> list[tuple[Any, str, Any]]:
        """Put the seams in place for the run; what to put back."""
        from django.test import override_settings

        from dynasem import _clock
        from dynasem._engine import hold, processes
        from dynasem._observability import telemetry
        from dynasem._storage import dynamodb
        from dynasem._transactions import commit

        o = self.options
        self._settings = override_settings(DYNASEM=_settings(o))
        self._settings.enable()
        undo = shims.install(self) + shims.guard_real_time(self)
        for target, name, value in (
            (_clock, "wall_clock", self._for_the_run(self.wall, _clock.wall_clock)),
            (_clock, "monotonic", self._for_the_run(self.mono, _clock.monotonic)),
            (processes, "_probe", self.probe),
            (processes, "_stat", self.proc_stat),
            (dynamodb, "get_client", self.get_client),
            (dynamodb, "process_identity", self.process_identity),
            (commit, "after_transaction", self.after_transaction),
            (commit, "pending_owners", self.pending_owners),
            (commit, "open_transaction", self.open_transaction),
            (telemetry, "ON", False),
            (hold, "queued_behind", self._heard(hold.queued_behind)),
        ):
            undo.append((target, name, getattr(target, name)))
            setattr(target, name, value)
        undo += _quiet_logs(self)
        from dynasem._engine import coalescing

        undo.append((coalescing, "Registration", coalescing.Registration))
        undo.append((coalescing.next_runs, "register_next", coalescing.next_runs.register_next))
        coalescing.next_runs.register_next = self.monitor.coalesce.registering(  # type: ignore[assignment]
            coalescing.next_runs.register_next
        )
        coalescing.Registration = self.monitor.coalesce.registration_class(  # type: ignore[misc]
            coalescing.Registration
        )
        from dynasem._operators import reaper

        undo.append((reaper, "ThreadPoolExecutor", reaper.ThreadPoolExecutor))
        setattr(reaper, "ThreadPoolExecutor", InlineExecutor)  # noqa: B010  # its deletes, one by one
        if o.push and o.push_across:
            from dynasem._engine import push

            undo.append((push, "settings", push.settings))
            push.settings = HostSettings(self, push.settings)  # type: ignore[assignment]
        if self.profile.bucket:
            from dynasem._storage import records

            undo.append((records, "BUCKET_S", records.BUCKET_S))
            records.BUCKET_S = self.profile.bucket
        if o.permits_from:
            from dynasem._storage import permit_items

            undo.append((permit_items, "INLINE_MAX", permit_items.INLINE_MAX))
            permit_items.INLINE_MAX = o.permits_from
        if o.readers_from >= 0:
            from dynasem._storage import lock_writes, reader_items

            undo.append((lock_writes, "READERS_INLINE", lock_writes.READERS_INLINE))
            undo.append((reader_items, "READERS_INLINE", reader_items.READERS_INLINE))
            lock_writes.READERS_INLINE = reader_items.READERS_INLINE = o.readers_from
        if o.mutation:
            import pytest

            from .mutations import MUTATIONS

            self._mutated = pytest.MonkeyPatch()
            MUTATIONS[o.mutation](self._mutated)
        return undo

    def _heard(self, queued_behind: Callable[..., bool]) -> Callable[..., bool]:
        """``hold.queued_behind``, telling the monitor of each waiter whose word a holder
        took (its entry may come only ``queue.ENTRY_DEFER`` later)."""

        def told(row: Any, waiter: Any) -> bool:
            from dynasem._storage import records

            heard = queued_behind(row, waiter)
            if heard:
                sk = records.entry_sk(row.queue_id, waiter.ticket)
                self.monitor.told(row.resource, sk, self.current())
            return heard

        return told

    def _uninstall(self, undo: list[tuple[Any, str, Any]]) -> None:
        self.state.restore()
        if self._mutated is not None:
            self._mutated.undo()
        for target, name, value in reversed(undo):
            setattr(target, name, value)
        self._settings.disable()
        logging.getLogger().manager._clear_cache()  # type: ignore[attr-defined]  # the levels we set back

    def _start(self, host: Host, kind: str, steps: int) -> Process:
        self._pids += 1
        seed = f"{self.options.seed}:{self._pids}"
        proc = Process(self, host, self._pids, seed, kind=kind, steps=steps)
        proc.globals = self.state.fresh(proc)
        self.procs.append(proc)
        self.record("start", proc, kind, steps)
        self.sched.spawn(proc, lambda: workload.run(self, proc), "main")
        return proc

    def _stop_all(self) -> None:
        for proc in self.procs:
            if not proc.dead:
                proc.dead = True
                self.sched.kill(proc)

    def _schedule_faults(self) -> None:
        p, rng = self.profile, self.fault_rng
        self.restarts = 0
        for every, action in (
            (p.crash_every, self._crash_one),
            (p.stall_every, self._stall_one),
            (p.jump_every, self._jump_one),
            (p.partition_every, self._partition_one),
        ):
            for t in faults.arrivals(rng, every, p.window):
                self.sched.at(t, action)

    def _victim(self) -> Process | None:
        live = [p for p in self.procs if not p.dead and not p.done]
        return self.fault_rng.choice(live) if live else None

    def entered(self, proc: Process) -> None:
        """``proc`` entered a block: maybe a stall or a crash during it (the profile's
        ``holder_stall``, ``holder_crash``), at a moment drawn within its first second."""
        if self.quiet():
            return
        rng, p = self.fault_rng, self.profile
        draw = rng.random()
        if draw < p.holder_stall:
            self.sched.at(rng.uniform(0.0, 0.5), lambda: self._stall(proc))
        elif draw < p.holder_stall + p.holder_crash:
            self.sched.at(rng.uniform(0.0, 0.5), lambda: self._crash(proc))

    def answered(self, proc: Process) -> None:
        """An answer reached ``proc``: maybe a stall or a crash before it reads it (the
        profile's ``answer_stall``, ``answer_crash``)."""
        if self.quiet() or proc.dead:
            return
        draw, p = self.fault_rng.random(), self.profile
        if draw < p.answer_stall:
            self._stall(proc)
        elif draw < p.answer_stall + p.answer_crash:
            self._crash(proc)

    def _crash_one(self) -> None:
        proc = self._victim()
        if proc is not None:
            self._crash(proc)

    def _crash(self, proc: Process) -> None:
        if proc.dead:
            return
        self.stats["crash"] += 1
        self.record("crash", proc)
        proc.dead = True
        self.monitor.crashed(proc)
        self.datagrams.drop(proc)
        self.sched.kill(proc)
        self.restarts += 1
        low, high = self.profile.restart_after

        def restart() -> None:
            self.restarts -= 1
            if proc.kind == "reaper":  # cron starts it again
                self._start_reaper()
            else:
                host = proc.host
                if self.options.restart_elsewhere:
                    host = self.hosts[(self.hosts.index(host) + 1) % len(self.hosts)]
                self._start(host, proc.kind, proc.steps)

        self.sched.at(self.fault_rng.uniform(low, high), restart)

    def _stall_one(self) -> None:
        proc = self._victim()
        if proc is not None:
            self._stall(proc)

    def _stall(self, proc: Process) -> None:
        if proc.dead:
            return
        lease, rng = self.options.lease, self.fault_rng
        if rng.random() < self.profile.long_stall_share:
            seconds = rng.uniform(lease, 2 * lease)
        else:
            seconds = rng.uniform(0.05, 2.0)
        self.stats["stall"] += 1
        self.record("stall", proc, round(seconds, 3))
        proc.stalled_until = max(proc.stalled_until, self.sched.now + seconds)

    def _partition_one(self) -> None:
        """A host cut off from DynamoDB (both ways) for a while, its processes running on."""
        host = self.fault_rng.choice(self.hosts)
        seconds = self.fault_rng.uniform(0.5, 2 * self.options.lease)
        # Healed by the end of the fault window, as every fault is: liveness is judged after.
        end = min(self.sched.now + seconds, START + self.profile.window)
        host.cut_until = max(host.cut_until, end)
        self.stats["partition"] += 1
        self.record("partition", None, host.name, round(seconds, 3))

    def _jump_one(self) -> None:
        host = self.fault_rng.choice(self.hosts)
        bound = self.options.spread * self.options.skew
        before, host.offset = host.offset, self.fault_rng.uniform(-bound, bound)
        self.stats["jump"] += 1
        self.record("jump", None, host.name, round(before, 4), round(host.offset, 4))

    # -- the trace -------------------------------------------------------------------------------

    def record(self, kind: str, proc: Any, *detail: Any) -> None:
        if self.options.trace:
            who = proc.name if proc is not None else "-"
            self.trace.append((self.sched.now - START, kind, who, *map(_short, detail)))


def _short(value: Any) -> Any:
    if isinstance(value, dict):
        key = value.get("Key") or value.get("Item") or {}
        if "pk" in key:
            return f"{key['pk'].get('S')}/{key['sk'].get('S')}"
        if "TransactItems" in value:
            return f"transaction of {len(value['TransactItems'])}"
        return ",".join(sorted(value))[:40]
    if isinstance(value, tuple) and len(value) == 2 and value[0] in ("ok", "error"):
        if value[0] == "ok":
            return "ok"
        return value[1].response.get("Error", {}).get("Code", "error")
    return value


class HostSettings:
    """dynasem's settings as the push module of the current process reads them: ``PUSH`` is
    its host's address (``Options.push_across``)."""

    def __init__(self, sim: Simulation, settings: Any):
        self._sim, self._settings = sim, settings

    def __getattr__(self, name: str) -> Any:
        if name == "PUSH":
            return self._sim.current().host.ip
        return getattr(self._settings, name)


class InlineExecutor:
    """``ThreadPoolExecutor`` for the reaper's deletes: each run at once, in the reaper's own
    (simulated) thread, in the order submitted."""

    def __init__(self, **_: Any) -> None:
        pass

    def __enter__(self) -> InlineExecutor:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        import concurrent.futures

        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # as a pool's thread would keep it for result()
            future.set_exception(exc)
        return future


def _settings(o: Options) -> dict[str, Any]:
    return {
        "TABLE_NAME": network.TABLE,
        "ENDPOINT_URL": network.ENDPOINT,
        "REGION_NAME": "us-east-1",
        "LEASE": o.lease,
        "CLOCK_SKEW": o.skew,
        "WAIT": None,  # forever, unless a semaphore says wait=
        "PUSH": "127.0.0.1" if o.push else None,
        "TELEMETRY": False,
    }


def _quiet_logs(sim: Simulation) -> list[tuple[Any, str, Any]]:
    """dynasem's log records go to the trace (and nowhere else) during the run."""

    class ToTrace(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            thread = sim.sched.current
            proc = thread.proc if thread is not None else None
            sim.record("log", proc, record.levelname, record.getMessage()[:120])

    logger = logging.getLogger("dynasem")
    undo = [(logger, "handlers", logger.handlers), (logger, "propagate", logger.propagate)]
    undo.append((logger, "level", logger.level))
    logger.handlers, logger.propagate, logger.level = [ToTrace()], False, logging.INFO
    logger.manager._clear_cache()  # type: ignore[attr-defined]
    return undo


def _failure(thread: Any, exc: BaseException) -> str:
    lines = traceback.format_exception(exc)
    return f"{thread!r} died: {exc!r}\n" + "".join(lines[-6:])


def run(options: Options) -> Result:
    """Run the simulation of ``options`` (a pure function of them)."""
    return Simulation(options).run()
