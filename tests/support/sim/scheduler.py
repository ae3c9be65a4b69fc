"""The scheduler of a simulation: one OS thread, a greenlet per simulated thread, virtual time.

Every point where dynasem's code would block or take time (a request in flight, a sleep, a
wait on a lock, an event, a condition or a socket) switches to the hub greenlet. The hub runs
the next event of a heap ordered by virtual time; events due at the same instant run in an
order drawn from the seeded rng when they were scheduled. A thread's resumption is its
process's: it waits while the process is stalled, and never comes for a crashed process.
Nothing here reads a real clock.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any, Protocol

import greenlet  # type: ignore[import-untyped]


class Proc(Protocol):
    """What the scheduler reads of a simulated process."""

    name: str
    dead: bool
    stalled_until: float
    threads: list[SimThread]


class Event:
    """An action due at ``time`` (virtual seconds); a cancelled one is skipped."""

    __slots__ = ("action", "cancelled", "time")

    def __init__(self, time: float, action: Callable[[], None]):
        self.time, self.action, self.cancelled = time, action, False


class Waiter:
    """A blocked thread, resolved once: by a wake-up (with a value or an error) or by its
    timeout."""

    __slots__ = ("done", "error", "thread", "timed_out", "timer", "value")

    def __init__(self, thread: SimThread):
        self.thread = thread
        self.done = self.timed_out = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.timer: Event | None = None


class SimThread:
    """A simulated thread of a simulated process: a greenlet whose parent is the hub. The
    ``threading.Thread`` of the simulation (``shims.Thread``) wraps one."""

    _ids = itertools.count(1)

    def __init__(self, sched: Scheduler, proc: Proc, target: Callable[[], Any], name: str):
        self.sched, self.proc, self.target, self.name = sched, proc, target, name
        self.ident = next(self._ids)
        self.greenlet = greenlet.greenlet(self._main, parent=sched.hub)
        self.started = self.finished = False
        self.joiners: list[Waiter] = []
        self.waiter: Waiter | None = None  # what it is blocked on (an interrupt resolves it)

    def _main(self) -> None:
        self.started = True
        try:
            self.target()
        except greenlet.GreenletExit:
            pass
        except BaseException as exc:  # a simulated thread died of an error: a finding
            if not self.proc.dead:  # (a crashed process's threads unwind as they can)
                self.sched.thread_failed(self, exc)
        finally:
            self.finished = True
            for waiter in self.joiners:
                self.sched.resolve(waiter, True)

    def __repr__(self) -> str:
        return f"<SimThread {self.proc.name}/{self.name}>"


class Scheduler:
    """The heap of events and the virtual clock (``now``: true time, seconds since the
    epoch, which no host reads directly: each reads it through its own offset)."""

    def __init__(self, rng: random.Random, start: float, enter: Callable[[Proc], None]):
        self.rng = rng
        self.now = start
        self._heap: list[tuple[float, float, int, Event]] = []
        self._seq = itertools.count()
        self.hub = greenlet.getcurrent()
        self.current: SimThread | None = None
        self._enter = enter  # makes a process's module state current before its thread runs
        self.events = 0
        self.failures: list[tuple[SimThread, BaseException]] = []
        # Told of every wait a thread begins (the interrupt fault may end it at once).
        self.blocking: Callable[[Waiter], None] | None = None

    # -- events ------------------------------------------------------------------------------

    def at(self, delay: float, action: Callable[[], None]) -> Event:
        """Run ``action`` in the hub ``delay`` seconds from now."""
        event = Event(self.now + max(0.0, delay), action)
        heapq.heappush(self._heap, (event.time, self.rng.random(), next(self._seq), event))
        return event

    def run(self, until: float, done: Callable[[], bool], after: Callable[[], None]) -> None:
        """Run events until ``done()``, none is left, or the next is due after ``until``;
        ``after()`` after each event (the invariants)."""
        heap = self._heap
        while heap and not done():
            if heap[0][0] > until:
                break
            _, _, _, event = heapq.heappop(heap)
            if event.cancelled:
                continue
            self.now = event.time
            self.events += 1
            event.action()
            after()

    def pending(self) -> int:
        return sum(1 for entry in self._heap if not entry[3].cancelled)

    # -- threads -----------------------------------------------------------------------------

    def spawn(self, proc: Proc, target: Callable[[], Any], name: str) -> SimThread:
        thread = SimThread(self, proc, target, name)
        proc.threads.append(thread)
        self._resume(thread, None, None)
        return thread

    def _resume(self, thread: SimThread, value: Any, error: BaseException | None) -> None:
        self.at(0.0, lambda: self._run_thread(thread, value, error))

    def _run_thread(self, thread: SimThread, value: Any, error: BaseException | None) -> None:
        proc = thread.proc
        if proc.dead or thread.finished:
            return
        if proc.stalled_until > self.now:  # stopped (SIGSTOP, a long GC pause): later
            self.at(proc.stalled_until - self.now, lambda: self._run_thread(thread, value, error))
            return
        self.switch(thread, value, error)

    def switch(
        self, thread: SimThread, value: Any = None, error: BaseException | None = None
    ) -> None:
        """Run ``thread`` (in its process's module state) until it blocks or ends."""
        self._enter(thread.proc)
        self.current = thread
        try:
            if error is not None:
                thread.greenlet.throw(error)
            elif not thread.started:
                thread.greenlet.switch()
            else:
                thread.greenlet.switch(value)
        finally:
            self.current = None

    def kill(self, proc: Proc) -> None:
        """``proc`` crashed (``proc.dead`` is set): unwind its threads now. Every simulated
        call they make on the way out raises GreenletExit, so none has any effect."""
        for thread in list(proc.threads):
            if not thread.finished:
                self.switch(thread, error=greenlet.GreenletExit())

    def thread_failed(self, thread: SimThread, exc: BaseException) -> None:
        self.failures.append((thread, exc))

    # -- blocking (called from a simulated thread) -------------------------------------------

    def me(self) -> SimThread:
        thread = self.current
        if thread is None:
            raise RuntimeError("a blocking call outside a simulated thread")
        if thread.proc.dead:
            raise greenlet.GreenletExit()  # a crashed process does nothing more
        return thread

    def block(self, waiter: Waiter, timeout: float | None = None) -> bool:
        """Switch to the hub until ``waiter`` is resolved (True) or ``timeout`` seconds
        pass (False). Raises the error it was resolved with."""
        if timeout is not None:
            waiter.timer = self.at(timeout, lambda: self._time_out(waiter))
        waiter.thread.waiter = waiter
        if self.blocking is not None:
            self.blocking(waiter)
        try:
            self.hub.switch()
        finally:
            waiter.thread.waiter = None
        if waiter.error is not None:
            raise waiter.error
        return not waiter.timed_out

    def resolve(
        self, waiter: Waiter, value: Any = None, error: BaseException | None = None
    ) -> bool:
        """Wake ``waiter``'s thread (unless it was woken or timed out already); True if so."""
        if waiter.done:
            return False
        waiter.done, waiter.value, waiter.error = True, value, error
        if waiter.timer is not None:
            waiter.timer.cancelled = True
        self._resume(waiter.thread, None, None)
        return True

    def _time_out(self, waiter: Waiter) -> None:
        if not waiter.done:
            waiter.done = waiter.timed_out = True
            self._resume(waiter.thread, None, None)

    def sleep(self, seconds: float) -> None:
        """Pause the current thread (``seconds`` <= 0: yield to whatever is due now)."""
        self.block(Waiter(self.me()), max(0.0, seconds))
