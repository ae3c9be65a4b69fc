"""Background lease renewal: one scheduler thread per process renews every live hold.

Each hold's :class:`Heartbeat` renews well before the lease could run out (every third of
``lease - CLOCK_SKEW``), retries transient failures quickly, and declares the hold lost only
when it can really have run out: our own deadline (``sent + lease - CLOCK_SKEW``) passed
without a successful renewal, or a renewal was refused because the hold is no longer ours.

Starting and stopping a heartbeat is a heap push and a flag: no thread is started per hold
(that cost about a millisecond per acquire), and the scheduler's thread is woken only for a
task due before its next look at the heap (at least every ``LOOK_EVERY``), so a hold given
back before its first renewal costs no switch to that thread. A due renewal runs in a
short-lived thread of its own, and its request in a worker thread joined only until the
hold's deadline, so neither a request hanging on a dead endpoint nor one slow hold delays
another hold's renewal or loss.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from django.db import connections

from .. import _clock as clock
from .._observability.logs import facts
from ..exceptions import LockLost, SemaphoreUnavailable

logger = logging.getLogger("dynasem")

# Shortest pause between two attempts after a transient failure (seconds).
RETRY_MIN = 0.05
# The scheduler thread looks at its heap at least this often (seconds), so a task due later
# than its next look is added without waking it: a short hold (taken and given back before
# its first renewal) must not cost a switch to that thread per acquire.
LOOK_EVERY = 1.0


def _facts(held: Any, outcome: str, reason: object, wait: float | None = None) -> dict[str, Any]:
    """``extra`` for a record about ``held``: a :class:`~dynasem._engine.hold.Held`, a run_once job,
    or a coalescing registration (these have no fence)."""
    return facts(
        held.resource,
        token=getattr(held, "token", None),
        fence=getattr(held, "fence", None),
        outcome=outcome,
        wait=wait,
        reason=reason,
    )


class Task(Protocol):
    """What the scheduler runs when it is due: a hold's :class:`Heartbeat`, or a late look at
    a row (:func:`dynasem._engine.push.depart`), each in a short-lived thread named ``name``.
    A task that is ``stopped`` is not run."""

    name: str
    stopped: bool

    @property
    def held(self) -> Any:
        """What its log records are about (``resource``, and ``token``, ``fence`` if any)."""

    def beat(self) -> float | None:
        """Run once; the pause until it runs again, or None when it is done."""


class Heartbeat:
    """The renewal schedule of one hold (a :class:`~dynasem._engine.core.Held` or a run_once
    job), renewed by ``renew`` (``held.renew`` if None)."""

    def __init__(self, held: Any, renew: Callable[[], None] | None = None):
        self.held = held
        self._renew_held = held.renew if renew is None else renew
        self.name = f"dynasem-heartbeat:{held.resource[:40]}"
        self.interval: float = max(0.05, (held.lease - held.skew) / 3)
        self.stopped = False

    def start(self) -> None:
        # A hold may start with less than a whole lease left (handed over, or recognised from
        # an earlier write): the first renewal comes early enough for several tries.
        later(self, min(self.interval, self.held.seconds_left() / 3))

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            _ours().dropped()

    def _renew(self) -> BaseException | None:
        """One renewal, given at most until the deadline; its error, or None."""
        errors: list[BaseException] = []

        def attempt() -> None:
            try:
                self._renew_held()
            except BaseException as exc:  # handed to the heartbeat
                errors.append(exc)
            finally:
                close_connections()  # a lock_lost receiver's, sent here

        worker = threading.Thread(target=attempt, name=f"{self.name}:renew", daemon=True)
        try:
            worker.start()
        except RuntimeError as exc:  # "can't start new thread" (a container's pids limit)
            # A renewal that failed: retried until the deadline, which then declares the loss.
            return SemaphoreUnavailable(f"cannot start the renewal's thread: {exc}")
        # In slices, each reckoned again: a join's timeout runs on CLOCK_MONOTONIC, which
        # stops while the host sleeps, the deadline's clock (CLOCK_BOOTTIME) does not.
        while worker.is_alive() and (left := self.held.seconds_left()) > 0:
            worker.join(min(left + 0.01, LOOK_EVERY))
        if worker.is_alive():
            return SemaphoreUnavailable("renewal still unanswered at the lease deadline")
        return errors[0] if errors else None

    def beat(self) -> float | None:
        """One due renewal; the pause until the next, or None when this heartbeat is done."""
        held = self.held
        error = self._renew()
        if self.stopped:
            return None
        if isinstance(error, LockLost):
            return None  # lost (renew() marked it and sent lock_lost), or being released
        if isinstance(error, SemaphoreUnavailable):
            left: float = held.seconds_left()
            if left <= 0:
                held.check_deadline()
                return None
            # Retry soon, but often enough to get several tries in before the deadline.
            pause = max(RETRY_MIN, min(self.interval / 3, left / 4))
            logger.info(
                "dynasem: renewing %r failed (%s); retrying",
                held.resource,
                error,
                extra=_facts(held, "renew_retry", error, wait=pause),
            )
            return pause
        if error is not None:  # never let the schedule end silently with a live hold
            logger.error(
                "dynasem: unexpected error renewing %r: %r",
                held.resource,
                error,
                extra=_facts(held, "renew_failed", error),
            )
            return RETRY_MIN
        # A deadline that renewals cannot push (max_hold) is met on time, to declare the loss.
        until_deadline: float = held.seconds_left() + 0.001
        return min(self.interval, until_deadline)


class _Scheduler:
    """A heap of (due time, task) served by one daemon thread, started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()
        self._beating: set[Task] = set()
        self._thread: threading.Thread | None = None
        self._dropped = 0  # stopped heartbeats possibly still in the heap
        self._wakes_at = 0.0  # when the thread looks at the heap next, on its own
        self._adds = 0
        self.pid = os.getpid()  # the process whose thread (and holds) these are

    def dropped(self) -> None:
        """A heartbeat stopped: rebuild the heap once stopped entries are most of it, so
        long leases taken at a high rate do not pile up entries until their due time."""
        with self._cond:
            self._dropped += 1
            if self._dropped > 64 and self._dropped * 2 > len(self._heap):
                self._heap = [e for e in self._heap if not e[2].stopped]
                heapq.heapify(self._heap)
                self._dropped = 0

    def add(self, task: Task, pause: float) -> None:
        with self._cond:
            self._beating.discard(task)
            due = clock.monotonic() + pause
            heapq.heappush(self._heap, (due, next(self._seq), task))
            self._adds += 1
            if self._thread is None or not self._thread.is_alive():  # (ended by a fault)
                self._thread = threading.Thread(
                    target=self._run, name="dynasem-heartbeat", daemon=True
                )
                self._thread.start()
            elif due < self._wakes_at:
                self._cond.notify()

    def scheduled(self) -> list[Heartbeat]:
        """The heartbeats still running: waiting for their next renewal, or renewing now."""
        with self._cond:
            waiting = {task for _, _, task in self._heap}
            running = waiting | self._beating
        return [hb for hb in running if isinstance(hb, Heartbeat) and not hb.stopped]

    def _run(self) -> None:
        seen = -1  # self._adds at the last look
        while True:
            with self._cond:
                # Stopped tasks leave the heap as soon as they reach its top.
                while self._heap and self._heap[0][2].stopped:
                    heapq.heappop(self._heap)
                # On the clock of the holds' deadlines (CLOCK_BOOTTIME), which counts a
                # suspended host's sleep: on waking, a renewal due meanwhile (and the loss
                # it finds) comes at the next look, not a whole pause later. The wait itself
                # stops while the host sleeps; LOOK_EVERY bounds it.
                now = clock.monotonic()
                if self._heap:
                    self._wakes_at = min(self._heap[0][0], now + LOOK_EVERY)
                elif self._adds != seen:  # tasks came lately: more may, look again soon
                    self._wakes_at = now + LOOK_EVERY
                else:  # none for a whole look: sleep until one comes
                    self._wakes_at = math.inf
                seen = self._adds
                if self._wakes_at > now:
                    self._cond.wait(None if self._wakes_at == math.inf else self._wakes_at - now)
                    continue
                _, _, task = heapq.heappop(self._heap)
                self._beating.add(task)
            try:
                threading.Thread(
                    target=self._beat, args=(task,), name=task.name, daemon=True
                ).start()
            except BaseException as exc:  # e.g. "can't start new thread": never end the loop
                _failed("dynasem: cannot start a renewal of %r: %r", task, exc)
                if _lost_unstarted(task):
                    with self._cond:
                        self._beating.discard(task)
                else:
                    self.add(task, RETRY_MIN)

    def _beat(self, task: Task) -> None:
        pause: float | None = RETRY_MIN
        try:
            pause = task.beat()
        except BaseException as exc:  # a schedule must not end silently with a live hold
            _failed("dynasem: renewing %r failed: %r", task, exc)
        finally:
            close_connections()  # a lock_lost receiver's, sent here at the deadline
        if pause is not None and not task.stopped:
            self.add(task, pause)  # back in the heap before it leaves _beating
        else:
            with self._cond:
                self._beating.discard(task)


def _lost_unstarted(task: Task) -> bool:
    """A hold's renewal that cannot start its thread (a pids limit) past the hold's deadline:
    its loss is declared here, in the scheduler's thread, or nothing would (``lock_lost``, a
    leadership's ``on_lost``). True: the heartbeat is over."""
    held = task.held
    if not isinstance(task, Heartbeat) or held.seconds_left() > 0:
        return False
    try:
        held.check_deadline()
    except Exception as exc:  # a lock_lost receiver's: the loss is marked all the same
        _failed("dynasem: telling the loss of %r failed: %r", task, exc)
    finally:
        close_connections()  # a lock_lost receiver's, sent here
    return True


def _failed(message: str, task: Task, exc: BaseException) -> None:
    logger.error(message, task.held, exc, extra=_facts(task.held, "renew_failed", exc))


_current = _Scheduler()


def _forget_after_fork() -> None:
    # A forked child has no scheduler thread; the parent's holds are the parent's to renew.
    global _current
    _current = _Scheduler()


os.register_at_fork(after_in_child=_forget_after_fork)


def _ours() -> _Scheduler:
    """This process's scheduler. A child forked by C code that runs none of Python's at-fork
    hooks (a uWSGI worker, unless ``py-call-osafterfork``) still has its parent's, whose
    thread did not come along: a hold of the child's would never be renewed."""
    if _current.pid != os.getpid():
        _forget_after_fork()
    return _current


def later(task: Task, seconds: float) -> None:
    """Run ``task`` in ``seconds`` (then again after each pause its ``beat`` returns)."""
    _ours().add(task, seconds)


def scheduled() -> list[Heartbeat]:
    """Every heartbeat of this process that is still running."""
    return _ours().scheduled()


def close_connections() -> None:
    """Close what database connections this thread opened: a thread of dynasem's own (a
    renewal's, one of :func:`io_executor`'s), where a signal receiver's ORM query opened one
    that Django never closes (it does at a request's end). Left open, it stayed so until the
    garbage collector found it (a thread per renewal: a server session for each lost hold),
    or for good in a thread that lives on, and stale past a database restart. An error as it
    closes is logged: the thread's work goes on."""
    try:
        connections.close_all()
    except Exception as exc:
        logger.warning(
            "dynasem: could not close a database connection: %r",
            exc,
            extra=facts(outcome="close_failed", reason=exc),
        )
