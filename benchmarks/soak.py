"""Soak test: many OS processes fight over a few semaphores under injected faults, SIGKILLs and
SIGSTOPs, and every hold is checked afterwards. Not part of the test suite.

    .venv/bin/python benchmarks/soak.py [--processes 16] [--seconds 300] [--lease 2] [--seed N]
        [--shared-share 0.3]

It starts its own DynamoDB Local (``tests.support.dynamodb_local``), creates a table with
``dynasem_createtable`` (settings: ``tests.support.settings``, so ``CLOCK_SKEW`` = 0.5 s), and keeps
``--processes`` worker processes (multiprocessing *spawn*) running for ``--seconds``.

Each worker loops: take one of ``--resources`` resources (one time in five two of them at
once, which is a ``TransactWriteItems``) with ``semaphore(res, lease=LEASE, wait=...)``; while
holding, sleep 0-50 ms (one hold in 200: 1.2-2.5 leases, kept alive by the heartbeat), then
do a *fenced read-modify-write* on the resource's append-only file (``fence value``, value =
last value + 1, flush + fsync); log its hold interval (``time.monotonic()``: one clock for all
processes on Linux) to its own log, line by line. A share of the holds (``--shared-share``,
default 0.3; 0: writers only) are readers instead: ``semaphore(res, shared=True, fair=True,
...)`` on one resource (``fair=True`` takes one), which only *read* the file -- a fenced read,
twice, 1-5 ms apart -- and log their windows the same way. Readers queue behind waiting
writers, so a writer's release hands the lock to the readers at the head of the line at once
(``MAX_ADMIT`` of them in one write, each with a fence of its own); the readers beyond join by
their own writes. From time to time it adds a fault rule
(``tests.support.faults.Faults`` on its dynasem client: throttle, 5xx, connection error, read
timeout, lost response; on ``UpdateItem`` or ``TransactWriteItems``) and logs how often each fired.
``SemaphoreBusy`` and ``SemaphoreUnavailable`` from the acquire just loop; ``LockLost`` at
block exit is counted.

The parent SIGKILLs a random worker every 2-5 s and, every 10-25 s, SIGSTOPs one (a worker
that holds a lock at that moment, when there is one) for 1.25-2.25 leases + CLOCK_SKEW, then
SIGCONTs it; killed workers are replaced at once. The table's TTL is on during the run
(DynamoDB Local deletes expired rows by TTL at moments of its own, see tests/conftest.py:
fences must stay increasing when a resource's row vanished between holds).
At the end it stops the workers, turns TTL off (so the reaper is what is checked), waits
``lease + CLOCK_SKEW`` (+ 2 s, the cutoff's whole seconds), runs ``dynasem_reap`` as it would run
a bucket later (this process's wall clock 960 s ahead: the reaper lists a row once
its 15-minute ``expires`` bucket has ended, and a hold that died in the run's last minutes is in
a bucket still running; no worker is left whose lease that could cut short), and counts the
holds still stored (``operations.active_holds(include_expired=True)``).

The fenced file write
---------------------
The README's pattern -- the store refuses a write whose fence is not larger than the last one
it accepted -- is enough for a blind write. This is a read-modify-write, so the fence must
guard the read too: under an ``flock`` the read records the fence in the resource's
high-water file (``.hw``) and is refused if a larger fence was recorded or written; the
append, a few ms later under the ``flock`` again, is refused if a larger fence was recorded
meanwhile or the last line's fence is not smaller than ours. (With the write check alone, a
holder paused between its read and its append that wakes up after its successor's read but
before its successor's append lands ``v+1`` twice: a lost update that dynasem cannot prevent.)
A refused read or append is counted as "fenced out".

A reader's read, under the ``flock``, is refused if a writer with a larger fence read the file
(that writer's hold came after ours) or the last line's fence is not smaller than ours (a later
writer wrote); its second read, if that happened in between. It records its fence as the
readers' high-water mark (second field of ``.hw``), and a writer's read or append is refused
if a reader with a larger fence read the file: that reader's hold came after the writer's.
Readers never refuse each other (those holding together read in any order).

The overlap rule
----------------
Two holds of the same resource overlap when their *trusted windows* intersect; an exclusive
hold must overlap no other hold, exclusive or shared, while two shared holds may (those
overlaps are counted apart: the evidence that readers held together). A hold's
trusted window starts when ``acquire`` returned (``start``) and ends at the earliest of:

* its logged end (the last moment inside the block, logged before the block exits);
* ``start + min(L, lease) - CLOCK_SKEW``, where ``L`` = ``held.expires`` minus the wall clock at
  ``start``: the lease left when the hold was handed over. This is the holder's own trust
  deadline (``sent + lease - CLOCK_SKEW``), never later than ``start + lease - CLOCK_SKEW``;
  it is earlier when the acquire was slow (botocore's own retries of a throttled write may
  sleep seconds after the lease end was fixed);
* the moment the parent SIGSTOPped or SIGKILLed the worker (a killed hold never logs its end);

unless the block itself saw ``held.lost`` False later than that (a ``V`` line, logged just
before the file write, and every 0.1 s of a hold longer than the lease: renewals kept the
hold): then the window runs until that moment, since the holder trusted its hold then.

So a hold whose block ended within ``lease - CLOCK_SKEW`` and whose worker was not stopped is
checked whole (the rule of the brief), and every other hold is checked over its first part,
while no lease can have run out, and up to the last moment its block saw it trusted. Past
that a paused or slow holder and the next holder do run at once in wall time; that is
legitimate (renewals count only where the block saw them) and is what fencing is for. A
correct dynasem keeps two trusted windows at least ``2 * CLOCK_SKEW`` apart on one host: a
takeover needs the stored lease end + skew.

Checks (all must be 0; the script exits 1 otherwise):

* overlaps: pairs of intersecting trusted windows on one resource, one of them exclusive
  (exclusive-exclusive + exclusive-shared);
* lost updates: in each resource's file, values not exactly 1, 2, 3, ... (duplicates + gaps);
* stuck locks after reap: holders still stored after the reap;
* fence violations: a fence handed out twice on a resource, or not larger than the fence of a
  hold that had started before this hold's lease was even written (readers included: every
  take and every heir of a hand-over gets a fence of its own), or not larger than the fence of
  a hold whose trusted window had ended before this hold started, when one of the two is
  exclusive (readers holding together get distinct fences in any order), or file fences not
  strictly increasing;
* fenced out while trusted: a file read/append (a reader's read) refused while the hold was
  inside its trusted window (a larger fence touched the file meanwhile: mutual exclusion or
  fence order failed);
* unexpected errors: any other exception in a worker, or a worker dying by itself.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import fcntl
import hashlib
import heapq
import io
import itertools
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

FAULT_KINDS = {  # Rule.kind -> the name printed
    "throttle": "throttle",
    "server": "5xx",
    "connection": "connection error",
    "timeout": "read timeout",
    "lose": "lost response",
}
WAITS = (0, 0.25, 1.0, 3.0)  # wait= of an acquire, picked at random
FAULT_CHANCE = 0.06  # per loop iteration, a new fault rule
MULTI_CHANCE = 0.2  # per hold, two resources at once (taken in one TransactWriteItems)
SHARED_SHARE = 0.3  # per hold, a reader (--shared-share); two resources: MULTI_CHANCE at most
LONG_CHANCE = 0.005  # per hold, a hold longer than the lease
HW_WIDTH = 20  # digits of the high-water fence file


# ---------------------------------------------------------------------------------------------
# The fenced read-modify-write on a resource's append-only file
# ---------------------------------------------------------------------------------------------


def data_path(workdir: str, index: int) -> str:
    return os.path.join(workdir, "data", f"resource-{index}.log")


# The high-water file holds two marks: the largest fence a writer read the file with (offset
# 0), and the largest a reader read it with (offset HW_WIDTH; absent until a reader came).
WRITER_HW, READER_HW = 0, HW_WIDTH


def _read_hw(hw_fd: int, offset: int = WRITER_HW) -> int:
    raw = os.pread(hw_fd, HW_WIDTH, offset)
    return int(raw) if raw.strip() else 0


def _write_hw(hw_fd: int, fence: int, offset: int = WRITER_HW) -> None:
    os.pwrite(hw_fd, str(fence).rjust(HW_WIDTH).encode(), offset)  # one syscall


def _last_line(fd: int) -> tuple[int, int]:
    """(fence, value) of the last line, (0, 0) for an empty file."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, 0
    n = min(size, 256)
    tail = os.pread(fd, n, size - n).decode()
    if not tail.endswith("\n"):
        raise RuntimeError(f"torn last line in data file: {tail[-60:]!r}")
    fence, value = tail.rstrip("\n").rsplit("\n", 1)[-1].split()
    return int(fence), int(value)


def fenced_increment(path: str, fence: int, pause: float) -> tuple[str, int]:
    """Append ``fence value+1`` unless a larger fence touched the file; (result, value). A
    reader's read with a larger fence counts too: that reader's hold came after ours."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    hw_fd = os.open(path + ".hw", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            slots_used = _read_hw(hw_fd)
            last_fence, value = _last_line(fd)
            if fence < slots_used or fence < _read_hw(hw_fd, READER_HW) or fence <= last_fence:
                return "fenced-read", value
            if fence > slots_used:
                _write_hw(hw_fd, fence)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep(pause)  # the "work" between read and write: only dynasem excludes others
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            slots_used = _read_hw(hw_fd)
            last_fence, _ = _last_line(fd)
            if fence < slots_used or fence < _read_hw(hw_fd, READER_HW) or fence <= last_fence:
                return "fenced-write", value + 1
            os.write(fd, f"{fence} {value + 1}\n".encode())  # O_APPEND, one syscall
            os.fsync(fd)
            return "ok", value + 1
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(hw_fd)
        os.close(fd)


def fenced_read(path: str, fence: int, pause: float) -> tuple[str, int]:
    """A reader's read: the last value, twice, ``pause`` apart (the reader's "work" in
    between); (result, value). Each read, under the ``flock``, is refused if a writer with a
    larger fence read the file (that writer's hold came after ours) or the last line's fence is
    not smaller than ours (a later writer wrote); "fenced-reread" when that happened during the
    pause. A read records our fence as the readers' high-water mark, so a writer with a
    smaller fence (its hold came before ours) can no longer append. Readers do not refuse each
    other: those holding together read in any order."""
    fd = os.open(path, os.O_RDONLY)
    hw_fd = os.open(path + ".hw", os.O_RDWR)
    first = None
    value = 0
    try:
        for result in ("fenced-read", "fenced-reread"):
            if first is not None:
                time.sleep(pause)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                last_fence, value = _last_line(fd)
                if fence < _read_hw(hw_fd) or fence <= last_fence:
                    return result, value
                if first is not None and value != first:
                    return "changed", value  # a write with a smaller fence got in: store bug
                first = value
                if fence > _read_hw(hw_fd, READER_HW):
                    _write_hw(hw_fd, fence, READER_HW)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        return "ok", value
    finally:
        os.close(hw_fd)
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------


def worker_main(cfg: dict[str, Any], slot: int, gen: int, seed: int, flags: Any) -> None:
    """One worker: loop over holds until the parent raises the stop flag (``flags[-1]``).
    ``flags[slot]`` is 1 while this worker is inside a hold (the parent prefers to SIGSTOP
    a holder)."""
    rng = random.Random(seed)
    base = os.path.join(cfg["workdir"], "logs", f"w{slot:02d}-{gen:03d}")
    err = os.open(base + ".err", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 2)  # warnings and tracebacks of this worker go to its own file
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    with contextlib.suppress(OSError):
        os.nice(cfg["nice"])
    import logging

    logging.basicConfig(
        level=logging.INFO,
        format="%(created).6f %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    log = open(base + ".log", "a", buffering=1)  # noqa: SIM115 - line-buffered: a write per line
    monotonic = time.monotonic

    write_lock = threading.Lock()  # --threads: the lanes of this worker share its log

    def emit(*parts: Any) -> None:
        line = " ".join(str(p) for p in parts) + "\n"
        with write_lock:
            log.write(line)

    emit("S", os.getpid(), slot, gen, seed, f"{monotonic():.6f}", f"{time.time():.6f}")

    from tests.support.workers import setup_django

    setup_django(cfg["endpoint"], cfg["table"])
    import dynasem
    from dynasem import (
        LockLost,
        SemaphoreBusy,
        SemaphoreUnavailable,
        semaphore,
    )
    from dynasem._storage import dynamodb
    from dynasem.signals import lock_lost
    from tests.support.faults import Faults

    emit("P", dynasem.__file__)

    def on_lost(sender: Any, token: str, reason: str = "", **kwargs: Any) -> None:
        thread = threading.current_thread().name
        emit("L", token[:16], f"{monotonic():.6f}", thread, json.dumps(reason))

    lock_lost.connect(on_lost, weak=False)
    faults = Faults(dynamodb.get_client())
    fired_retired: Counter[str] = Counter()  # rules used up and dropped from the list
    counters: Counter[str] = Counter()
    lease = cfg["lease"]
    resources = cfg["resources"]
    checked = resources + counting_resources(cfg.get("counting"))
    paths = {r: data_path(cfg["workdir"], i) for i, r in enumerate(checked)}
    share = cfg.get("shared_share", 0.0)
    multi_chance = min(MULTI_CHANCE, 1.0 - share)
    counting = cfg.get("counting") or {}

    def count(key: str, n: int = 1) -> None:
        with write_lock:
            counters[key] += n

    holding = [0]  # lanes inside a hold now: flags[slot] is 1 while any is

    def inside(delta: int) -> None:
        with write_lock:
            holding[0] += delta
            flags[slot] = 1 if holding[0] else 0

    def add_fault(rng: random.Random) -> None:
        kind = rng.choice(list(FAULT_KINDS))
        op = "TransactWriteItems" if rng.random() < 0.25 else "UpdateItem"
        # Throttling is retried by botocore with 1-4 s sleeps: keep those rules short.
        n = rng.choice((1, 1, 2, 3)) if kind == "throttle" else rng.choice((1, 1, 2, 2, 3, 4, 6))
        after = rng.randint(0, 4)
        if kind == "throttle":
            rule = faults.throttle(op, n, after=after)
        elif kind == "server":
            rule = faults.server_error(op, n, status=rng.choice((500, 503)), after=after)
        elif kind == "connection":
            rule = faults.connection_error(op, n, after=after)
        elif kind == "timeout":
            rule = faults.read_timeout(op, n, after=after)
        else:
            rule = faults.lose_response(op, n, after=after)
        take = rule.take

        def logged_take(operation: str) -> bool:  # a line per fault fired, for the evidence
            hit = take(operation)
            if hit:
                thread = threading.current_thread().name
                emit("F", kind, operation, f"{monotonic():.6f}", thread)
            return hit

        rule.take = logged_take  # type: ignore[method-assign]

    def fired() -> dict[str, int]:
        # Rules that can fire no more are dropped; a rule still live may be firing in the
        # heartbeat thread right now, so it stays in the list.
        live = []
        for rule in list(faults.rules):
            if rule.remaining == 0:
                fired_retired[rule.kind] += rule.fired
            else:
                live.append(rule)
        faults.rules = live
        out = Counter(fired_retired)
        for rule in live:
            out[rule.kind] += rule.fired
        return dict(out)

    def snapshot() -> None:
        with write_lock:
            said = json.dumps({"counters": dict(counters), "faults": fired()}, sort_keys=True)
        emit("C", said)

    def lane(rng: random.Random) -> None:
        while not flags[len(flags) - 1]:
            one_hold(rng)
            snapshot()
            time.sleep(rng.uniform(0.0, cfg["think"]))

    def one_hold(rng: random.Random) -> None:
        if rng.random() < FAULT_CHANCE:
            add_fault(rng)
        # One draw: a reader (one resource: fair=True takes one), two resources (exclusive),
        # or one resource exclusive.
        draw = rng.random()
        shared = draw < share
        multi = not shared and draw < share + multi_chance
        names = rng.sample(resources, 2) if multi else [rng.choice(resources)]
        # A counting hold instead (--counting): one permit of a semaphore of limit N, checked
        # as an exclusive hold of its permit's slot ("count:0#s3": see counting_resources).
        limit = 1
        if counting and rng.random() < counting["share"]:
            shared, multi, limit = False, False, counting["limit"]
            names = [rng.choice(counting["resources"])]
        if rng.random() < cfg.get("long_chance", LONG_CHANCE):
            hold = rng.uniform(1.2, 2.5) * lease
        else:
            hold = rng.uniform(0.0, 0.05)
        token = None
        try:
            sem = semaphore(
                names if len(names) > 1 else names[0],
                lease=lease,
                wait=rng.choice(WAITS),
                user=f"soak-{slot}",
                limit=limit,
                **({"shared": True, "fair": True} if shared else {}),
            )
            began = monotonic()
            with sem as held:
                start = monotonic()
                expires = held.expires.timestamp()
                left = expires - time.time()
                inside(1)
                token = held.token[:16]
                try:
                    mode = "s" if shared else "x"
                    if limit > 1:
                        emit("A", token, f"{began:.6f}")
                        # The permit's slot stands for the resource from here on.
                        slot_no = held.slots[names[0]]  # type: ignore[attr-defined]
                        fence = held.fences[names[0]]
                        names = [f"{names[0]}#s{slot_no}"]
                        held.fences[names[0]] = fence
                        count("counting")
                    for r in names:
                        emit(
                            "B",
                            *(token, r, held.fences[r], f"{start:.6f}", f"{left:.6f}"),
                            *(mode, f"{expires:.3f}"),
                        )
                    count("holds")
                    count("multi", len(names) > 1)
                    count("shared", shared)
                    # A reader in a reader item of its own (past the readers a row keeps).
                    count("reader-items", type(held).__name__ == "ReaderHeld")
                    count("long", hold > lease)
                    if hold > lease:
                        # A long hold watches its trust as it goes: every moment the block saw
                        # it trusted counts in the overlap check (renewals, cut-offs).
                        until = monotonic() + hold
                        while (remaining := until - monotonic()) > 0:
                            checked = monotonic()
                            if not held.lost:
                                emit("V", token, f"{checked:.6f}")
                            time.sleep(min(0.1, remaining))
                    else:
                        time.sleep(hold)
                    checked = monotonic()
                    if not held.lost:  # the hold was still trusted at ``checked``
                        emit("V", token, f"{checked:.6f}")
                    for r in names:
                        pause = rng.uniform(0.001, 0.005)
                        if shared:
                            result, value = fenced_read(paths[r], held.fences[r], pause)
                            emit("R", token, r, result, f"{monotonic():.6f}", value)
                            count(f"read-{result}")
                            continue
                        result, value = fenced_increment(paths[r], held.fences[r], pause)
                        emit("W", token, r, result, f"{monotonic():.6f}", value)
                        count(f"write-{result}")
                finally:
                    emit("E", token, f"{monotonic():.6f}")
                    inside(-1)
            emit("X", token, "ok", f"{monotonic():.6f}")
        except SemaphoreBusy:
            count("busy")
        except LockLost as exc:
            count("lost")
            emit("X", token, "lost", f"{monotonic():.6f}", json.dumps(exc.reason))
        except SemaphoreUnavailable as exc:
            count("unavailable")
            if counters["unavailable"] <= 20:
                emit("U", f"{monotonic():.6f}", json.dumps(str(exc)))
        except Exception as exc:
            count("unexpected")
            emit(
                "T",
                token,
                f"{monotonic():.6f}",
                json.dumps(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"),
            )

    # --threads: that many lanes in this process take turns with each other as with the
    # other workers (hand-overs between threads of one process), each with its own draws.
    lanes = [
        threading.Thread(target=lane, args=(random.Random(seed * 1000 + i),), name=f"lane-{i}")
        for i in range(1, cfg.get("threads", 1))
    ]
    for t in lanes:
        t.start()
    lane(rng)
    for t in lanes:
        t.join()
    snapshot()
    emit("Z", f"{monotonic():.6f}")
    log.close()


# ---------------------------------------------------------------------------------------------
# The parent: processes, kills, stops
# ---------------------------------------------------------------------------------------------


@dataclass
class Proc:
    slot: int
    gen: int
    process: Any
    log: str

    @property
    def pid(self) -> int:
        return int(self.process.pid)


@dataclass
class Events:
    kills: dict[int, float] = field(default_factory=dict)  # pid -> monotonic time
    end_kills: dict[int, float] = field(default_factory=dict)  # stragglers at the end
    stops: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    died: list[tuple[int, int | None, str]] = field(default_factory=list)  # unexpected exits
    logs: dict[int, str] = field(default_factory=dict)  # pid -> log path


class Fleet:
    def __init__(self, cfg: dict[str, Any], n: int, rng: random.Random, seed: int):
        self.cfg = cfg
        self.n = n
        self.rng = rng
        self.seed = seed
        self.ctx = multiprocessing.get_context("spawn")
        self.flags = self.ctx.RawArray("b", n + 1)  # no lock: a SIGKILL must never hold one
        self.procs: dict[int, Proc] = {}
        self.gens: Counter[int] = Counter()
        self.spawned = 0
        self.events = Events()
        self.stopped: tuple[Proc, float, float] | None = None  # proc, since, resume at

    def spawn(self, slot: int) -> None:
        gen = self.gens[slot]
        self.gens[slot] += 1
        self.spawned += 1
        self.flags[slot] = 0
        seed = self.seed * 1_000_003 + self.spawned
        log = os.path.join(self.cfg["workdir"], "logs", f"w{slot:02d}-{gen:03d}.log")
        target, args = self.process_target(slot, gen, seed)
        process = self.ctx.Process(target=target, args=args, name=f"soak-{slot}-{gen}", daemon=True)
        with self.spawn_environment(slot):
            process.start()
        proc = Proc(slot, gen, process, log)
        self.procs[slot] = proc
        self.events.logs[proc.pid] = log

    def process_target(self, slot: int, gen: int, seed: int) -> tuple[Any, tuple[Any, ...]]:
        """What a worker process runs (a subclass may run it somewhere else first)."""
        return worker_main, (self.cfg, slot, gen, seed, self.flags)

    @contextlib.contextmanager
    def spawn_environment(self, slot: int) -> Any:
        """The environment a worker process starts with (spawned processes inherit
        ``os.environ`` as it is at ``start()``)."""
        yield

    def tick(self, now: float) -> None:
        """Called every 20 ms of the run: more faults, in a subclass."""

    def progress(self) -> str:
        return ""

    def reap_dead(self) -> None:
        for slot, proc in list(self.procs.items()):
            if not proc.process.is_alive():
                proc.process.join()
                self.events.died.append((proc.pid, proc.process.exitcode, proc.log))
                self.spawn(slot)

    def kill_one(self) -> None:
        busy = self.stopped[0].slot if self.stopped else None
        slots = [s for s in self.procs if s != busy]
        if not slots:
            return
        proc = self.procs[self.rng.choice(slots)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        self.events.kills[proc.pid] = time.monotonic()
        proc.process.join()
        self.spawn(proc.slot)

    def stop_one(self, lease: float, skew: float, *, holder_only: bool) -> bool:
        """SIGSTOP a worker (one inside a hold, unless ``holder_only`` is False) for longer
        than the lease; False if there was none to pick."""
        slots = [s for s in self.procs if self.flags[s]] or ([] if holder_only else [*self.procs])
        if not slots:
            return False
        proc = self.procs[self.rng.choice(slots)]
        os.kill(proc.pid, signal.SIGSTOP)
        now = time.monotonic()
        self.stopped = (proc, now, now + self.rng.uniform(1.25 * lease, 2.25 * lease) + skew)
        return True

    def cont(self) -> None:
        if self.stopped is None:
            return
        proc, since, _ = self.stopped
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        self.events.stops[proc.pid].append((since, time.monotonic()))
        self.stopped = None

    def run(self, seconds: float, lease: float, skew: float, progress: bool) -> None:
        for slot in range(self.n):
            self.spawn(slot)
        started = time.monotonic()
        deadline = started + seconds
        next_kill = started + self.rng.uniform(2, 5)
        next_stop = started + self.rng.uniform(5, 15)
        stop_tries_until = None
        next_report = started + 30
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            self.reap_dead()
            if self.stopped and now >= self.stopped[2]:
                self.cont()
            if now >= next_kill:
                self.kill_one()
                next_kill = time.monotonic() + self.rng.uniform(2, 5)
            if self.stopped is None and now >= next_stop:
                # Prefer a worker inside a hold; after 3 s without one, take any.
                stop_tries_until = stop_tries_until or now + 3.0
                if self.stop_one(lease, skew, holder_only=now < stop_tries_until):
                    stop_tries_until = None
                    next_stop = now + self.rng.uniform(10, 25)
            self.tick(now)
            if progress and now >= next_report:
                print(
                    f"soak: {now - started:5.0f} s  kills {len(self.events.kills)}  "
                    f"stops {sum(map(len, self.events.stops.values())) + bool(self.stopped)}"
                    + self.progress(),
                    file=sys.stderr,
                    flush=True,
                )
                next_report += 30
            time.sleep(0.02)

    def shutdown(self, grace: float) -> None:
        self.cont()
        self.flags[self.n] = 1
        until = time.monotonic() + grace
        for proc in self.procs.values():
            proc.process.join(max(0.0, until - time.monotonic()))
        for proc in self.procs.values():
            if proc.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                self.events.end_kills[proc.pid] = time.monotonic()
                proc.process.join()
            elif proc.process.exitcode != 0:
                self.events.died.append((proc.pid, proc.process.exitcode, proc.log))

    def kill_all(self) -> None:
        self.cont()
        for proc in self.procs.values():
            if proc.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.process.join()


# ---------------------------------------------------------------------------------------------
# Analysis of the logs and files
# ---------------------------------------------------------------------------------------------


@dataclass
class Hold:
    pid: int
    token: str
    resource: str
    fence: int
    start: float
    left: float  # lease left at start (wall clock)
    end: float | None = None
    outcome: str | None = None  # ok / lost / None
    exit_at: float | None = None  # when the block had exited (after the release)
    reason: str | None = None
    window_end: float = 0.0
    cut_by: str = ""

    plan: float = 0.0  # when the lease end was fixed (end - lease), on the monotonic clock
    shared: bool = False  # a reader (shared=True, fair=True)
    expires: float = 0.0  # held.expires at start (wall clock, ms): equal for readers let in
    # by one hand-over


@dataclass
class Report:
    holds: list[Hold] = field(default_factory=list)
    writes: list[tuple[int, str, str, str, float, int]] = field(default_factory=list)
    reads: list[tuple[int, str, str, str, float, int]] = field(default_factory=list)  # readers'
    counters: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    unavailable_samples: list[str] = field(default_factory=list)
    lost_reasons: Counter[str] = field(default_factory=Counter)
    losses: dict[str, tuple[float, str, str]] = field(default_factory=dict)  # token -> L line
    imported: set[str] = field(default_factory=set)  # where workers found dynasem
    killed_unstarted: int = 0  # workers SIGKILLed before they opened their log
    verified: dict[str, float] = field(default_factory=dict)  # token -> last V (trusted then)
    began: dict[str, float] = field(default_factory=dict)  # token -> when its acquire began
    fired: dict[int, list[tuple[float, str, str, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # pid -> (at, kind, operation, thread) of every fault that fired


def read_logs(events: Events, lease: float) -> Report:
    rep = Report()
    by_token: dict[str, list[Hold]] = {}
    for pid, path in sorted(events.logs.items()):
        last_c: dict[str, Any] | None = None
        try:
            lines = Path(path).read_text().splitlines()
        except FileNotFoundError:
            if pid in events.kills or pid in events.end_kills:
                # SIGKILLed while still starting (a spawned interpreter on a loaded machine
                # takes seconds before it opens its log): it never held anything.
                rep.killed_unstarted += 1
            else:
                rep.unexpected.append(f"pid {pid}: no log file {path}")
            continue
        for line in lines:
            kind, _, rest = line.partition(" ")
            parts = rest.split(" ")
            try:
                if kind == "B":
                    tok, res, fence, start, left, mode, expires = parts
                    hold = Hold(pid, tok, res, int(fence), float(start), float(left))
                    hold.plan = hold.start + hold.left - lease
                    hold.shared = mode == "s"
                    hold.expires = float(expires)
                    rep.holds.append(hold)
                    by_token.setdefault(tok, []).append(hold)
                elif kind == "E":
                    for hold in by_token.get(parts[0], []):
                        hold.end = float(parts[1])
                elif kind == "X":
                    for hold in by_token.get(parts[0], []):
                        hold.outcome = parts[1]
                        hold.exit_at = float(parts[2])
                        if parts[1] == "lost":
                            hold.reason = json.loads(" ".join(parts[3:]))
                elif kind in "WR":
                    tok, res, result, at, value = parts
                    done = rep.writes if kind == "W" else rep.reads
                    done.append((pid, tok, res, result, float(at), int(value)))
                elif kind == "A":
                    rep.began[parts[0]] = float(parts[1])
                elif kind == "V":
                    rep.verified[parts[0]] = max(float(parts[1]), rep.verified.get(parts[0], 0))
                elif kind == "P":
                    rep.imported.add(rest)
                elif kind == "L":
                    rep.losses[parts[0]] = (
                        float(parts[1]),
                        parts[2],
                        json.loads(" ".join(parts[3:])),
                    )
                elif kind == "F":
                    rep.fired[pid].append((float(parts[2]), parts[0], parts[1], parts[3]))
                elif kind == "C":
                    last_c = json.loads(rest)
                elif kind == "U":
                    if len(rep.unavailable_samples) < 200:
                        rep.unavailable_samples.append(json.loads(" ".join(parts[1:])))
                elif kind == "T":
                    rep.unexpected.append(
                        f"pid {pid} token {parts[0]} at {parts[1]}: "
                        + json.loads(" ".join(parts[2:]))
                    )
            except (ValueError, json.JSONDecodeError) as exc:
                if pid in events.kills or pid in events.end_kills:
                    continue  # a torn last line of a killed worker
                rep.unexpected.append(f"pid {pid}: unreadable log line {line!r}: {exc}")
        if last_c:
            rep.counters.update(last_c["counters"])
            rep.faults.update(last_c["faults"])
    for hold in {h.token: h for h in rep.holds}.values():
        if hold.outcome == "lost":
            rep.lost_reasons[hold.reason or "?"] += 1
    return rep


def trusted_windows(rep: Report, events: Events, lease: float, skew: float) -> None:
    for hold in rep.holds:
        candidates = [(hold.start + min(hold.left, lease) - skew, "lease - skew")]
        if hold.end is not None:
            candidates.append((hold.end, "end"))
        killed = events.kills.get(hold.pid) or events.end_kills.get(hold.pid)
        if killed is not None and killed > hold.start:
            candidates.append((killed, "SIGKILL"))
        for since, _until in events.stops.get(hold.pid, []):
            if since > hold.start:
                candidates.append((since, "SIGSTOP"))
        hold.window_end, hold.cut_by = min(candidates)
        # The block saw ``held.lost`` False at this moment: trusted until then at least
        # (renewals kept it), whatever the lease and stops say.
        verified = rep.verified.get(hold.token, 0.0)
        if verified > hold.window_end:
            hold.window_end, hold.cut_by = verified, "verified trust"


@dataclass
class Overlaps:
    exclusive: int = 0  # two exclusive holds: a violation
    mixed: int = 0  # an exclusive hold and a shared one: a violation
    readers: int = 0  # two shared holds: allowed, the evidence that readers held together
    readers_held: int = 0  # shared holds that overlapped at least one other shared hold
    examples: list[tuple[Hold, Hold]] = field(default_factory=list)  # of the violations

    @property
    def violations(self) -> int:
        return self.exclusive + self.mixed


def find_overlaps(rep: Report) -> Overlaps:
    """Pairs of holds of one resource whose trusted windows intersect: an exclusive hold must
    overlap no other hold; shared holds may overlap each other (counted apart)."""
    found = Overlaps()
    together: set[tuple[str, str]] = set()  # (token, resource) of readers that held together
    per_resource: dict[str, list[Hold]] = defaultdict(list)
    for hold in rep.holds:
        if hold.window_end > hold.start:
            per_resource[hold.resource].append(hold)
    for holds in per_resource.values():
        holds.sort(key=lambda h: h.start)
        active: list[tuple[float, int, Hold]] = []
        for i, hold in enumerate(holds):
            while active and active[0][0] <= hold.start:
                heapq.heappop(active)
            for _, _, other in active:
                if other.token == hold.token:
                    continue
                if other.shared and hold.shared:
                    found.readers += 1
                    together.update({(other.token, other.resource), (hold.token, hold.resource)})
                    continue
                if other.shared or hold.shared:
                    found.mixed += 1
                else:
                    found.exclusive += 1
                if len(found.examples) < 10:
                    found.examples.append((other, hold))
            heapq.heappush(active, (hold.window_end, i, hold))
    found.readers_held = len(together)
    return found


def admitted_together(rep: Report) -> Counter[int]:
    """Hand-overs that let several readers in at once, by how many: shared holds of one
    resource with the same lease end (the releaser's clock + lease, to the ms) and consecutive
    fences (fence, fence + 1, ...: one write's). Readers that joined by their own write each
    fix their own lease end and fence."""
    groups: dict[tuple[str, float], list[int]] = defaultdict(list)
    for hold in rep.holds:
        if hold.shared:
            groups[(hold.resource, hold.expires)].append(hold.fence)
    sizes: Counter[int] = Counter()
    for fences in groups.values():
        fences.sort()
        run = 1
        for a, b in zip(fences, fences[1:] + [None], strict=True):
            if b is not None and b == a + 1:
                run += 1
                continue
            if run > 1:
                sizes[run] += 1
            run = 1
    return sizes


def same_process(rep: Report) -> int:
    """Exclusive holds that came right after another of the same worker process on their
    resource (by fence): with --threads, turns taken between threads of one process."""
    by_resource: dict[str, list[Hold]] = {}
    for hold in {h.token + h.resource: h for h in rep.holds if not h.shared}.values():
        by_resource.setdefault(hold.resource, []).append(hold)
    follows = 0
    for holds in by_resource.values():
        holds.sort(key=lambda h: h.fence)
        follows += sum(1 for a, b in itertools.pairwise(holds) if a.pid == b.pid)
    return follows


def fence_checks(rep: Report, slack: float = 0.0) -> tuple[int, list[str]]:
    """Fences handed out twice, or out of the order the leases were written in (every take,
    exclusive or shared, and every heir of a hand-over gets a fence of its own, larger than the
    stored one), or out of the order exclusion puts the holds in. ``slack``:
    how far the wall clocks of the hosts may be apart (a hold's lease end may have been
    written by another host's clock, which moves its estimated ``plan`` by that much)."""
    problems: list[str] = []
    count = 0
    per_resource: dict[str, list[Hold]] = defaultdict(list)
    for hold in rep.holds:
        per_resource[hold.resource].append(hold)
    for res, holds in sorted(per_resource.items()):
        count += _window_order(res, holds, slack, problems)
        owners: dict[int, str] = {}
        for hold in holds:
            if owners.setdefault(hold.fence, hold.token) != hold.token:
                count += 1
                if len(problems) < 10:
                    problems.append(f"{res}: fence {hold.fence} handed to two holds")
        # H1 started (its write was applied) before H2's lease end was even computed, so H1's
        # write came first and H1.fence < H2.fence must hold. Not between two readers: a
        # reader handed its hold with little lease left confirms it by a renewal first, which
        # fixes a new lease end (``plan``) after the fence, while other readers may start.
        by_start = sorted(holds, key=lambda h: h.start)
        starts = [h.start for h in by_start]
        top_any: list[Hold] = []  # the largest fence among by_start[:k + 1]
        top_exclusive: list[Hold | None] = []  # the same among the exclusive ones
        best_any: Hold | None = None
        best_x: Hold | None = None
        for h in by_start:
            if best_any is None or h.fence > best_any.fence:
                best_any = h
            if not h.shared and (best_x is None or h.fence > best_x.fence):
                best_x = h
            top_any.append(best_any)
            top_exclusive.append(best_x)
        for h2 in holds:
            k = bisect.bisect_left(starts, h2.plan - slack)
            if not k:
                continue
            h1 = top_exclusive[k - 1] if h2.shared else top_any[k - 1]
            if h1 is None or h1.fence < h2.fence or h1.token == h2.token:
                continue
            count += 1
            if len(problems) < 10:
                problems.append(
                    f"{res}: pid {h2.pid} token {h2.token} got fence {h2.fence} at "
                    f"{h2.start:.6f} (lease fixed at {h2.plan:.6f}), not larger than fence "
                    f"{h1.fence} of pid {h1.pid} token {h1.token} that started at "
                    f"{h1.start:.6f}"
                )
    return count, problems


def _window_order(res: str, holds: list[Hold], slack: float, problems: list[str]) -> int:
    """Exclusion orders fences: of two holds of one resource that are not both shared, one
    whose trusted window ended before the other's began must have the smaller fence (a reader's
    fence is larger than every earlier writer's; a writer's than every earlier reader's).
    Readers that hold together take distinct fences in any order: two shared holds are not
    compared. Holds with an empty window (handed over already past their deadline) are left
    out: their start says nothing about when their lease was written."""
    count = 0
    live = sorted((h for h in holds if h.window_end > h.start), key=lambda h: h.window_end)
    ends = [h.window_end for h in live]
    top_any: list[Hold] = []  # the largest fence among live[:k + 1]
    top_exclusive: list[Hold | None] = []  # the same among the exclusive ones
    best_any: Hold | None = None
    best_x: Hold | None = None
    for h in live:
        if best_any is None or h.fence > best_any.fence:
            best_any = h
        if not h.shared and (best_x is None or h.fence > best_x.fence):
            best_x = h
        top_any.append(best_any)
        top_exclusive.append(best_x)
    for h2 in live:
        k = bisect.bisect_right(ends, h2.start - slack)  # windows ended before h2 started
        if not k:
            continue
        h1 = top_exclusive[k - 1] if h2.shared else top_any[k - 1]
        if h1 is None or h1.fence < h2.fence or h1.token == h2.token:
            continue
        count += 1
        if len(problems) < 10:
            problems.append(
                f"{res}: {'shared' if h2.shared else 'exclusive'} hold pid {h2.pid} token "
                f"{h2.token} started at {h2.start:.6f} with fence {h2.fence}, after the trusted "
                f"window of {'shared' if h1.shared else 'exclusive'} hold pid {h1.pid} token "
                f"{h1.token} (fence {h1.fence}) ended at {h1.window_end:.6f}"
            )
    return count


def check_file(path: str) -> tuple[int, int, int, int]:
    """(lines, duplicates, gaps, fence order errors) of one append-only file."""
    lines = dups = gaps = order = 0
    prev_value = prev_fence = 0
    for line in Path(path).read_text().splitlines():
        lines += 1
        fence, value = (int(x) for x in line.split())
        if value <= prev_value:
            dups += 1
        elif value > prev_value + 1:
            gaps += value - prev_value - 1
        if fence <= prev_fence:
            order += 1
        prev_value = max(prev_value, value)
        prev_fence = max(prev_fence, fence)
    return lines, dups, gaps, order


SPURIOUS = "release refused within the lease"


def classify_loss(hold: Hold, events: Events, rep: Report, lease: float, skew: float) -> str:
    """Why a hold was lost: a SIGSTOP during it; its release, after the block, refused once the
    lease could have run out (a slow release) or before (a spurious LockLost: the hold was ours
    until we released it); a renewal that failed (in the heartbeat, during the block); other."""
    until = hold.exit_at if hold.exit_at is not None else math.inf
    if any(hold.start <= since <= until for since, _ in events.stops.get(hold.pid, [])):
        return "SIGSTOP"
    at, thread, _ = rep.losses.get(hold.token, (None, "", ""))
    if at is not None and hold.end is not None and at >= hold.end:
        if at < hold.start + min(hold.left, lease) - skew:
            return SPURIOUS
        return "release outlived the lease"
    if thread.startswith("dynasem-heartbeat"):
        return "renewal failed"
    return "other"


def describe(hold: Hold) -> str:
    end = f"{hold.end:.6f}" if hold.end is not None else "never logged"
    return (
        f"{'shared' if hold.shared else 'exclusive'} "
        f"pid {hold.pid} token {hold.token} fence {hold.fence} start {hold.start:.6f} "
        f"end {end} lease-left-at-start {hold.left:.3f}s trusted until {hold.window_end:.6f} "
        f"(cut by {hold.cut_by}) exit {hold.outcome or '-'}"
        + (f" ({hold.reason})" if hold.reason else "")
    )


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def source_digest() -> str:
    """A digest of dynasem's source: respawned workers import it afresh, so an edit during the
    run would mix two versions (reported)."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "dynasem").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def machine() -> str:
    mem = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB RAM"
    return f"{os.cpu_count()} CPUs, {mem}, Python {sys.version.split()[0]}"


def analyse(
    fleet: Fleet,
    workdir: str,
    resources: list[str],
    lease: float,
    skew: float,
    *,
    ran: float,
    table_name: str,
    digest: str,
    reap_said: str,
    stuck: list[Any],
    slack: float = 0.0,
    counting: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check every hold in the logs and files; print the findings (all but the last lines,
    which the caller prints from what this returns). ``slack``: how far the workers' wall
    clocks may be apart (see :func:`fence_checks`)."""
    events = fleet.events
    with open(os.path.join(workdir, "events.json"), "w") as f:
        json.dump(
            {
                "kills": events.kills,
                "end_kills": events.end_kills,
                "stops": events.stops,
                "died": events.died,
                "logs": events.logs,
            },
            f,
            indent=1,
        )
    rep = read_logs(events, lease)
    trusted_windows(rep, events, lease, skew)
    found = find_overlaps(rep)
    overlaps = found.violations
    count_over, count_peak, count_problems = (
        counting_checks(rep, counting["limit"], slack) if counting else (0, 0, [])
    )
    overlaps += count_over
    resources = resources + counting_resources(counting)
    together = admitted_together(rep)
    fence_errors, fence_problems = fence_checks(rep, slack)
    windows = {(h.token, h.resource): h for h in rep.holds}
    trusted_refusals = []
    stale_accepted = 0
    stale_reads = 0
    for _pid, tok, res, result, at, value in rep.writes + rep.reads:
        hold = windows.get((tok, res))
        if hold is None:
            continue
        if result != "ok" and at < hold.window_end:
            trusted_refusals.append(f"{res}: {result} value {value} at {at:.6f}; {describe(hold)}")
        if result == "ok" and at >= hold.window_end:
            if hold.shared:
                stale_reads += 1
            else:
                stale_accepted += 1
    lost_updates = 0
    file_lines = 0
    file_problems = []
    for i, res in enumerate(resources):
        lines, dups, gaps, order = check_file(data_path(workdir, i))
        file_lines += lines
        lost_updates += dups + gaps
        fence_errors += order
        if dups or gaps or order:
            file_problems.append(
                f"{res}: {lines} lines, {dups} duplicates, {gaps} gaps, {order} fence order errors"
            )
    ok_writes = sum(1 for w in rep.writes if w[3] == "ok")
    fenced_out = sum(1 for w in rep.writes if w[3] != "ok")
    ok_reads = sum(1 for r in rep.reads if r[3] == "ok")
    read_refusals = Counter(r[3] for r in rep.reads if r[3] != "ok")
    shared_started = len({h.token for h in rep.holds if h.shared})
    shared_completed = len({h.token for h in rep.holds if h.shared and h.end is not None})
    completed = len({h.token for h in rep.holds if h.end is not None})
    started = len({h.token for h in rep.holds})
    stops = sum(map(len, events.stops.values()))
    lost_holds = list({h.token: h for h in rep.holds if h.outcome == "lost"}.values())
    loss_kinds = Counter(classify_loss(h, events, rep, lease, skew) for h in lost_holds)
    first = {h.token: h for h in rep.holds}.values()
    slow_grants = sum(1 for h in first if h.left < lease - 0.5)
    dead_grants = sum(1 for h in first if h.left <= skew)
    died = [d for d in events.died if d[0] not in events.kills]
    unexpected = len(rep.unexpected) + len(died)
    c = rep.counters
    fault_total = sum(rep.faults.values())
    fault_detail = ", ".join(f"{FAULT_KINDS[k]} {rep.faults.get(k, 0)}" for k in FAULT_KINDS)

    if counting:
        print(
            f"counting holds (limit {counting['limit']}, permit items): "
            f"{c.get('counting', 0)} taken; at most {count_peak} trusted windows at once on "
            f"one resource; {count_over} over the limit or out of fence order"
        )
        for line in count_problems:
            print(f"  {line}")
    if c.get("shared"):
        print(f"reader holds in reader items: {c.get('reader-items', 0)} of {c['shared']} counted")
    print(
        f"soak: ran {ran:.0f} s; {len(events.logs)} worker processes in all "
        f"({rep.killed_unstarted} SIGKILLed before they had opened their log); table {table_name}"
    )
    if rep.imported - {str(REPO_ROOT / "dynasem" / "__init__.py")}:
        print(f"soak: WARNING: workers imported dynasem from {sorted(rep.imported)}")
    if source_digest() != digest:
        print("soak: WARNING: dynasem's source changed during the run (respawned workers mixed)")
    print(
        f"holds: started {started}, completed {completed} (two resources {c['multi']}, "
        f"longer than the lease {c['long']}), busy {c['busy']}, unavailable {c['unavailable']}"
    )
    print(f"holds that followed one of the same process on a resource: {same_process(rep)}")
    print(
        f"LockLost at block exit: {len(lost_holds)} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(loss_kinds.items()))
        + f"); reasons: {dict(rep.lost_reasons)}"
    )
    print(
        f"file writes: {ok_writes} accepted ({file_lines} lines in the files), {fenced_out} fenced "
        f"out, {stale_accepted} accepted past the trusted window (nobody had touched the file)"
    )
    print(
        f"shared holds (readers): started {shared_started}, completed {shared_completed}; "
        f"file reads {ok_reads} accepted, {sum(read_refusals.values())} fenced out "
        f"{dict(read_refusals)}, {stale_reads} accepted past the trusted window"
    )
    print(
        f"readers holding together: {found.readers} reader-reader overlaps of trusted windows "
        f"({found.readers_held} shared holds overlapped another); hand-overs that let several "
        f"readers in at once: {sum(together.values())} "
        f"(by readers let in: {dict(sorted(together.items()))})"
    )
    print(
        f"overlaps by kind: exclusive-exclusive {found.exclusive}, exclusive-shared {found.mixed}"
    )
    print(
        f"holds handed over more than 0.5 s after their lease end was fixed: {slow_grants} "
        f"({dead_grants} already past the holder's own trust deadline)"
    )
    extended = sum(1 for h in rep.holds if h.cut_by == "verified trust")
    print(f"holds trusted past their first lease - CLOCK_SKEW (renewed, verified): {extended}")
    print(f"reap (TTL sweep turned off when the workers stopped): {reap_said}")
    print(f"fence violations: {fence_errors}")
    print(f"fenced out while trusted: {len(trusted_refusals)}")
    print(f"unexpected errors: {unexpected}")
    for sample in sorted(set(rep.unavailable_samples))[:3]:
        print(f"  sample SemaphoreUnavailable: {sample}")
    evidence = []
    for a, b in found.examples:
        evidence.append(f"OVERLAP on {a.resource}:\n    {describe(a)}\n    {describe(b)}")
    evidence += [f"FENCE: {p}" for p in fence_problems]
    evidence += [f"FILE: {p}" for p in file_problems]
    evidence += [f"FENCED OUT WHILE TRUSTED: {p}" for p in trusted_refusals[:10]]
    evidence += [f"UNEXPECTED: {u}" for u in rep.unexpected[:10]]
    evidence += [f"DIED: pid {pid} exit code {code}, log {log}" for pid, code, log in died]
    evidence += [
        f"STUCK: {h.resource} token {h.token} user {h.user_id} fence {h.fence} "
        f"expires {h.expires.isoformat()}"
        for h in stuck[:10]
    ]
    for line in evidence:
        print(line)
    unexplained = [
        (h, kind)
        for h in lost_holds
        if (kind := classify_loss(h, events, rep, lease, skew)) != "SIGSTOP"
    ]
    for hold, kind in unexplained[:5]:
        at, thread, reason = rep.losses.get(hold.token, (0.0, "?", "?"))
        print(f"  LockLost ({kind}) on {hold.resource}: {describe(hold)}")
        print(f"    declared lost at {at:.6f} in {thread}: {reason}")
        for f_at, f_kind, op, f_thread in rep.fired.get(hold.pid, []):
            if hold.start <= f_at <= (hold.exit_at or hold.start + 60):
                print(f"    fault {FAULT_KINDS[f_kind]} on {op} at {f_at:.6f} in {f_thread}")
        if kind == SPURIOUS:
            for other in sorted(rep.holds, key=lambda h: h.start):
                if other.resource == hold.resource and hold.start < other.start < at:
                    print(f"    next holder: {describe(other)}")
    return {
        "completed": completed,
        "faults": {FAULT_KINDS[k]: rep.faults.get(k, 0) for k in FAULT_KINDS},
        "fault_total": fault_total,
        "fault_detail": fault_detail,
        "kills": len(events.kills),
        "stops": stops,
        "overlaps": overlaps,
        "overlaps_mixed": found.mixed,
        "counting_peak": count_peak,
        "shared": shared_completed,
        "reader_overlaps": found.readers,
        "readers_held": found.readers_held,
        "admitted_together": sum(together.values()),
        "lost_updates": lost_updates,
        "stuck": len(stuck),
        "fence_violations": fence_errors,
        "trusted_refusals": len(trusted_refusals),
        "unexpected": unexpected,
        "failed": bool(
            overlaps or lost_updates or stuck or fence_errors or trusted_refusals or unexpected
        ),
    }


@contextlib.contextmanager
def engine(unkind: str | None, seed: int, workdir: str) -> Iterator[tuple[str, Any]]:
    """DynamoDB Local, or with ``--unkind PROFILE`` the unkind engine in front of it
    (tests/support/unkind.py: stale reads, lagging indexes, throttling, conflicts, lost answers):
    (its endpoint, the unkind engine or None). The engine's journal goes to the workdir."""
    from tests.support.dynamodb_local import DynamoDBLocal

    with DynamoDBLocal() as ddb:
        if not unkind:
            yield ddb.endpoint_url, None
            return
        from tests.support.unkind import UnkindDynamoDB

        journal = os.path.join(workdir, "unkind.jsonl")
        with UnkindDynamoDB(ddb.endpoint_url, seed=seed, profile_name=unkind, journal=journal) as u:
            print(f"soak: unkind engine, profile {unkind}, seed {seed}, journal {journal}")
            yield u.endpoint_url, u


def add_unkind(parser: argparse.ArgumentParser) -> None:
    from tests.support.unkind import PROFILES

    parser.add_argument(
        "--unkind",
        choices=sorted(PROFILES),
        default=None,
        help="run on the unkind engine (tests/support/unkind.py) with this profile ('aws': "
        "everything at AWS's bounds) in front of DynamoDB Local (seeded by --seed)",
    )


def settle(unkind: Any) -> None:
    """Wait until the unkind engine's replicas have every version (what the reaper and the
    final count read is then what the table holds)."""
    if unkind is None:
        return
    deadline = time.monotonic() + 60
    while unkind.stats()["replica_versions_pending"] and time.monotonic() < deadline:
        time.sleep(0.5)


@contextlib.contextmanager
def reaping_later() -> Iterator[None]:
    """This process's wall clock (dynasem._clock.wall_clock) a bucket and a minute ahead
    (records.BUCKET_S + 60 s) while the final reap runs: as if it ran once the buckets of
    the run's last leases had ended."""
    from dynasem import _clock as clock
    from dynasem._storage import records

    real = clock.wall_clock
    clock.wall_clock = lambda: real() + records.BUCKET_S + 60
    try:
        yield
    finally:
        clock.wall_clock = real


def finish_table(
    table_name: str, lease: float, skew: float, unkind: Any = None
) -> tuple[str, list[Any]]:
    """After the run: TTL off, leases waited out, ``dynasem_reap`` a bucket later
    (:func:`reaping_later`); (what it said, the holds still stored). On the unkind engine its
    replicas are let catch up before each read."""
    from django.core.management import call_command

    from dynasem._operators import locks as operations
    from dynasem._storage import dynamodb

    # DynamoDB Local's TTL sweep deletes expired rows (so during the run fences had to
    # survive rows vanishing between holds); off now, so what is checked is the reaper.
    dynamodb.get_client().update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires"},
    )
    time.sleep(lease + skew + 2.0)
    settle(unkind)
    out = io.StringIO()
    with reaping_later():
        call_command("dynasem_reap", stdout=out)
    settle(unkind)
    if unkind is not None:
        print(f"soak: unkind engine: {json.dumps(unkind.stats()['counts'], sort_keys=True)}")
    return " ".join(out.getvalue().split()), operations.active_holds(include_expired=True)


def shared_share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share between 0 and 1, not {text}")
    return value


def counting_resources(counting: dict[str, Any] | None) -> list[str]:
    """The files a counting soak checks: one per permit slot of each counting resource (its
    holds are exclusive holds of their slot: fenced increments, no overlap)."""
    if not counting:
        return []
    return [f"{r}#s{slot}" for r in counting["resources"] for slot in range(counting["limit"])]


def add_counting(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--counting",
        type=int,
        default=0,
        help="also take counting semaphores of this limit (above 8: permit items), on "
        "--counting-resources resources of their own, for --counting-share of the holds; "
        "checked per permit slot, and at most LIMIT holds at once (default 0: none)",
    )
    parser.add_argument("--counting-share", type=shared_share, default=0.3)
    parser.add_argument("--counting-resources", type=int, default=2)


def counting_cfg(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.counting:
        return None
    return {
        "limit": args.counting,
        "share": args.counting_share,
        "resources": [f"count:{i}" for i in range(args.counting_resources)],
    }


def counting_checks(rep: Report, limit: int, slack: float) -> tuple[int, int, list[str]]:
    """A counting resource's holds (its slots' together): more than ``limit`` trusted windows
    at once (violations), the most at once, and its fences: each handed out once, and in the
    order the takes were written."""
    problems: list[str] = []
    over = peak = 0
    groups: dict[str, list[Hold]] = defaultdict(list)
    for hold in rep.holds:
        if "#s" in hold.resource:
            groups[hold.resource.split("#s")[0]].append(hold)
    for res, holds in sorted(groups.items()):
        edges = sorted(
            [(h.start, 1) for h in holds if h.window_end > h.start]
            + [(h.window_end, -1) for h in holds if h.window_end > h.start]
        )
        now = 0
        for _at, step in edges:
            now += step
            peak = max(peak, now)
            if now > limit:
                over += 1
                if len(problems) < 10:
                    problems.append(f"{res}: {now} holds at once, limit {limit}")
        owners: dict[int, str] = {}
        for hold in holds:
            if owners.setdefault(hold.fence, hold.token) != hold.token:
                over += 1
                problems.append(f"{res}: fence {hold.fence} handed to two holds")
        # Holders of different permits hold together, as readers do: a window that ended
        # before another began says nothing of their takes' order (a take slowed between its
        # row write, which draws the fence, and its permit write starts after holds that drew
        # later). The order of the takes does: one that returned before another's acquire
        # even began drew the smaller fence. (Not the lease end it reports: a slow take's
        # hold is renewed at once by its heartbeat, which fixes a later one. Each permit's
        # holds are checked as an exclusive resource's, windows included: counting_resources.)
        by_start = sorted(holds, key=lambda h: h.start)
        starts = [h.start for h in by_start]
        best: list[Hold] = []
        for h in by_start:
            best.append(h if not best or h.fence > best[-1].fence else best[-1])
        for h2 in holds:
            began = rep.began.get(h2.token)
            if began is None:
                continue
            k = bisect.bisect_left(starts, began - slack)
            if k and best[k - 1].fence >= h2.fence and best[k - 1].token != h2.token:
                over += 1
                if len(problems) < 10:
                    h1 = best[k - 1]
                    problems.append(
                        f"{res}: token {h2.token} got fence {h2.fence} (its acquire began at "
                        f"{began:.6f}), not larger than fence {h1.fence} of token "
                        f"{h1.token}, which started at {h1.start:.6f}"
                    )
    return over, peak, problems


def add_shared_share(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shared-share",
        type=shared_share,
        default=SHARED_SHARE,
        help="share of holds that are readers: semaphore(res, shared=True, fair=True), one "
        f"resource each; 0 for writers only (default {SHARED_SHARE})",
    )


def shared_line(result: dict[str, Any]) -> str:
    return (
        f"shared holds: {result['shared']}  reader-reader overlaps: {result['reader_overlaps']} "
        f"({result['readers_held']} readers held alongside another)  hand-overs to several "
        f"readers: {result['admitted_together']}"
    )


def keep_or_remove(workdir: str, failed: bool, keep: bool) -> None:
    if failed or keep:
        print(f"soak: logs and files kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--resources", type=int, default=3)
    add_shared_share(parser)
    add_counting(parser)
    parser.add_argument("--think", type=float, default=0.1, help="max pause between holds (s)")
    parser.add_argument("--nice", type=int, default=5, help="niceness of the workers")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads per worker, taking turns like workers"
    )
    parser.add_argument("--workdir", default=None, help="keep logs and files here")
    parser.add_argument("--keep", action="store_true", help="keep the workdir even on success")
    add_unkind(parser)
    args = parser.parse_args(argv)
    counting = counting_cfg(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    workdir = args.workdir or tempfile.mkdtemp(prefix="dynasem-soak-")
    for sub in ("logs", "data"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    resources = [f"soak:{i}" for i in range(args.resources)]
    for i in range(len(resources + counting_resources(counting))):
        Path(data_path(workdir, i)).write_text("")
        Path(data_path(workdir, i) + ".hw").write_text("0".rjust(HW_WIDTH))

    from tests.support.workers import setup_django

    print(
        f"soak: {args.processes} processes x {args.seconds:g} s, lease {args.lease:g} s, "
        f"{len(resources)} resources, seed {seed}, workdir {workdir}",
        flush=True,
    )
    print(f"soak: machine: {machine()}", flush=True)
    digest = source_digest()
    print(f"soak: dynasem source digest {digest}", flush=True)
    with engine(args.unkind, seed, workdir) as (endpoint, unkind):
        table_name = f"soak-{uuid.uuid4().hex[:8]}"
        setup_django(endpoint, table_name)
        from django.core.management import call_command

        from dynasem.conf import settings

        skew = float(settings.CLOCK_SKEW)
        call_command("dynasem_createtable", "--wait", stdout=io.StringIO())
        cfg = {
            "endpoint": endpoint,
            "table": table_name,
            "workdir": workdir,
            "lease": args.lease,
            "resources": resources,
            "think": args.think,
            "nice": args.nice,
            "shared_share": args.shared_share,
            "counting": counting,
            "threads": args.threads,
        }
        fleet = Fleet(cfg, args.processes, rng, seed)
        t0 = time.monotonic()
        try:
            fleet.run(args.seconds, args.lease, skew, progress=True)
            fleet.shutdown(grace=max(WAITS) + 3 * args.lease + 20)
        finally:
            fleet.kill_all()
        ran = time.monotonic() - t0
        reap_said, stuck = finish_table(table_name, args.lease, skew, unkind)

    result = analyse(
        fleet,
        workdir,
        resources,
        args.lease,
        skew,
        ran=ran,
        table_name=table_name,
        digest=digest,
        reap_said=reap_said,
        stuck=stuck,
        counting=counting,
    )
    print(
        f"acquisitions: {result['completed']}  faults injected: {result['fault_total']} "
        f"({result['fault_detail']})  kills: {result['kills']}  stops: {result['stops']}"
    )
    print(shared_line(result))
    print(f"overlaps: {result['overlaps']} (exclusive-vs-shared {result['overlaps_mixed']})")
    print(f"lost updates: {result['lost_updates']}")
    print(f"stuck locks after reap: {result['stuck']}")
    keep_or_remove(workdir, result["failed"], args.keep or bool(args.workdir))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
