"""What dynasem's modules see instead of ``time``, ``threading``, ``random``, ``uuid`` and
``socket`` during a simulation: each module attribute bound to one of those modules is
replaced for the run by a shim of the same shape that reads the current simulated process's
clocks, draws from its seeded rng, blocks in the scheduler instead of the OS thread, and
sends datagrams on the simulated network. A name the shim lacks raises AttributeError, so
a new use in dynasem fails loudly instead of reaching the real module.
"""

from __future__ import annotations

import collections
import random as real_random
import socket as real_socket
import sys
import threading as real_threading
import time as real_time
import types
import uuid as real_uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from .scheduler import Scheduler, SimThread, Waiter


class World(Protocol):
    """What the shims read of the running simulation."""

    sched: Scheduler

    def wall(self) -> float: ...
    def mono(self) -> float: ...
    def rng(self) -> real_random.Random: ...
    def hostname(self) -> str: ...
    def spawn(self, target: Any, name: str) -> SimThread: ...
    def udp_socket(self) -> Any: ...


# -- time ------------------------------------------------------------------------------------


class Time:
    """``time``: the current process's wall clock (its host's) and monotonic clock. A real
    thread (not the run's: one a test before the run left behind, such as the heartbeat of a
    hold on DynamoDB Local) keeps the real clock."""

    def __init__(self, world: World):
        self._w = world
        self._thread = real_threading.get_ident()  # the run's: every simulated thread

    def _real(self) -> bool:
        return real_threading.get_ident() != self._thread

    def time(self) -> float:
        return real_time.time() if self._real() else self._w.wall()

    def time_ns(self) -> int:
        return real_time.time_ns() if self._real() else int(self._w.wall() * 1e9)

    def monotonic(self) -> float:
        return real_time.monotonic() if self._real() else self._w.mono()

    def monotonic_ns(self) -> int:
        return real_time.monotonic_ns() if self._real() else int(self._w.mono() * 1e9)

    perf_counter = monotonic

    # dynasem._clock's own monotonic clock (CLOCK_BOOTTIME, counting a suspend), which the run
    # replaces for its threads: a real thread reads it here.
    CLOCK_BOOTTIME = getattr(real_time, "CLOCK_BOOTTIME", None)
    CLOCK_MONOTONIC = real_time.CLOCK_MONOTONIC

    def clock_gettime(self, clock: int) -> float:
        return real_time.clock_gettime(clock) if self._real() else self._w.mono()

    def sleep(self, seconds: float) -> None:
        if self._real():
            real_time.sleep(seconds)
        else:
            self._w.sched.sleep(seconds)


# -- random, uuid ----------------------------------------------------------------------------


class Random:
    """``random``: the current process's own seeded generator (jitter, backoff)."""

    def __init__(self, world: World):
        self._w = world

    def __getattr__(self, name: str) -> Any:
        if name in ("uniform", "random", "randint", "choice", "shuffle", "getrandbits"):
            return getattr(self._w.rng(), name)
        raise AttributeError(f"simulation: random.{name} is not simulated")


class Uuid:
    """``uuid``: uuid4 from the current process's generator (tokens)."""

    UUID = real_uuid.UUID

    def __init__(self, world: World):
        self._w = world

    def uuid4(self) -> real_uuid.UUID:
        drawn = real_uuid.UUID(int=self._w.rng().getrandbits(128), version=4)
        told = getattr(self._w, "uuid_drawn", None)
        if told is not None:
            told(drawn.hex)  # a token (the interrupt fault follows an acquire's)
        return drawn


# -- threading -------------------------------------------------------------------------------


class Lock:
    """``threading.Lock`` for greenlets: a blocked acquire waits in the scheduler, first come
    first served; a release hands the lock to the first waiter."""

    def __init__(self, sched: Scheduler):
        self._s = sched
        self._locked = False
        self._waiters: collections.deque[Waiter] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._locked:
            self._locked = True
            return True
        if not blocking or timeout == 0:
            return False
        waiter = Waiter(self._s.me())
        self._waiters.append(waiter)
        if self._s.block(waiter, None if timeout is None or timeout < 0 else timeout):
            return True  # handed to us by release()
        self._waiters.remove(waiter)
        return False

    def release(self) -> None:
        if not self._locked:
            raise RuntimeError("release unlocked lock")
        while self._waiters:
            if self._s.resolve(self._waiters.popleft(), True):
                return  # still locked: now the waiter's
        self._locked = False

    def locked(self) -> bool:
        return self._locked

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class RLock:
    """``threading.RLock`` for greenlets: owned by a simulated thread, re-entered by it only
    (a real RLock would let every greenlet of the OS thread in)."""

    def __init__(self, sched: Scheduler):
        self._s = sched
        self._lock = Lock(sched)
        self._owner: SimThread | None = None
        self._count = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self._s.me()
        if self._owner is me:
            self._count += 1
            return True
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner, self._count = me, 1
        return True

    def release(self) -> None:
        if self._owner is not self._s.current:
            raise RuntimeError("cannot release un-acquired lock")
        self._count -= 1
        if not self._count:
            self._owner = None
            self._lock.release()

    def _release_all(self) -> int:
        count, self._count, self._owner = self._count, 0, None
        self._lock.release()
        return count

    def _restore(self, count: int) -> None:
        self._lock.acquire()
        self._owner, self._count = self._s.me(), count

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Condition:
    """``threading.Condition`` for greenlets (over an :class:`RLock` unless given a lock)."""

    def __init__(self, sched: Scheduler, lock: Lock | RLock | None = None):
        self._s = sched
        self._lock = lock if lock is not None else RLock(sched)
        self._waiters: list[Waiter] = []

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        waiter = Waiter(self._s.me())
        self._waiters.append(waiter)
        lock, saved = self._lock, 1
        if isinstance(lock, RLock):
            saved = lock._release_all()
        else:
            lock.release()
        try:
            return self._s.block(waiter, timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if isinstance(lock, RLock):
                lock._restore(saved)
            else:
                lock.acquire()

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """As ``threading.Condition.wait_for``: wait until ``predicate()``, or ``timeout``."""
        deadline = None if timeout is None else self._s.now + timeout
        result = predicate()
        while not result:
            left = None if deadline is None else deadline - self._s.now
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        while n and self._waiters:
            if self._s.resolve(self._waiters.pop(0), True):
                n -= 1

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class Event:
    """``threading.Event`` for greenlets."""

    def __init__(self, sched: Scheduler):
        self._s = sched
        self._flag = False
        self._waiters: list[Waiter] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            self._s.resolve(waiter, True)

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        waiter = Waiter(self._s.me())
        self._waiters.append(waiter)
        self._s.block(waiter, timeout)
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        return self._flag


class Thread:
    """``threading.Thread``: a simulated thread of the process that starts it."""

    def __init__(
        self,
        world: World,
        group: None = None,
        target: Any = None,
        name: str | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        daemon: bool | None = None,
    ):
        self._w = world
        self._target, self._args, self._kwargs = target, args, kwargs or {}
        self.name = name or "Thread"
        self.daemon = bool(daemon)
        self._sim: SimThread | None = None

    def start(self) -> None:
        if self._sim is not None:
            raise RuntimeError("threads can only be started once")
        self._sim = self._w.spawn(self.run, self.name)
        self._sim.handle = self  # type: ignore[attr-defined]

    def run(self) -> None:
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    @property
    def ident(self) -> int | None:
        return None if self._sim is None else self._sim.ident

    def is_alive(self) -> bool:
        return self._sim is not None and not self._sim.finished

    def join(self, timeout: float | None = None) -> None:
        sim = self._sim
        if sim is None:
            raise RuntimeError("cannot join thread before it is started")
        if sim.finished:
            return
        waiter = Waiter(self._w.sched.me())
        sim.joiners.append(waiter)
        self._w.sched.block(waiter, timeout)
        if waiter in sim.joiners:
            sim.joiners.remove(waiter)


# The classes, under names the methods of Threading (named as threading's) do not hide.
_Lock: TypeAlias = Lock
_RLock: TypeAlias = RLock
_Condition: TypeAlias = Condition
_Event: TypeAlias = Event
_Thread: TypeAlias = Thread


class Threading:
    """``threading``: locks, conditions, events and threads that block in the scheduler."""

    TIMEOUT_MAX = real_threading.TIMEOUT_MAX

    def __init__(self, world: World):
        self._w = world
        self._main = _Thread(world, name="MainThread")

    def Lock(self) -> _Lock:  # noqa: N802 - threading's own names
        return _Lock(self._w.sched)

    def RLock(self) -> _RLock:  # noqa: N802
        return _RLock(self._w.sched)

    def Condition(self, lock: _Lock | _RLock | None = None) -> _Condition:  # noqa: N802
        return _Condition(self._w.sched, lock)

    def Event(self) -> _Event:  # noqa: N802
        return _Event(self._w.sched)

    def Thread(self, *args: Any, **kwargs: Any) -> _Thread:  # noqa: N802
        return _Thread(self._w, *args, **kwargs)

    def current_thread(self) -> _Thread:
        thread = self._w.sched.current
        if thread is None:
            return self._main
        handle = getattr(thread, "handle", None)
        if handle is None:  # a process's first thread, started by the runtime
            handle = _Thread(self._w, name=thread.name)
            handle._sim = thread
            thread.handle = handle  # type: ignore[attr-defined]
        return handle


# -- socket ----------------------------------------------------------------------------------


class Socket:
    """``socket``: UDP sockets on the simulated network (hand-over pushes)."""

    AF_INET = real_socket.AF_INET
    SOCK_DGRAM = real_socket.SOCK_DGRAM
    error = OSError

    def __init__(self, world: World):
        self._w = world

    def socket(self, family: int = AF_INET, kind: int = SOCK_DGRAM) -> Any:
        if family != self.AF_INET or kind != self.SOCK_DGRAM:
            raise OSError("simulation: only UDP over IPv4")
        return self._w.udp_socket()

    def gethostname(self) -> str:
        return self._w.hostname()


# -- installing them -------------------------------------------------------------------------

REAL = {
    real_time: Time,
    real_threading: Threading,
    real_random: Random,
    real_uuid: Uuid,
    real_socket: Socket,
}


def simulated_modules() -> list[types.ModuleType]:
    """dynasem's modules whose code runs in simulated processes (not its test helpers)."""
    return [
        module
        for name, module in sorted(sys.modules.items())
        if (name == "dynasem" or name.startswith("dynasem."))
        and not name.startswith("dynasem.testing")
        and module is not None
    ]


def install(world: World) -> list[tuple[types.ModuleType, str, Any]]:
    """Bind every dynasem module attribute that names one of the real modules to its shim;
    returns what to put back (:func:`uninstall`)."""
    shims = {id(real): make(world) for real, make in REAL.items()}
    undo = []
    for module in simulated_modules():
        for name, value in list(vars(module).items()):
            shim = shims.get(id(value)) if isinstance(value, types.ModuleType) else None
            if shim is not None:
                undo.append((module, name, value))
                setattr(module, name, shim)
    return undo


def uninstall(undo: list[tuple[types.ModuleType, str, Any]]) -> None:
    for module, name, value in undo:
        setattr(module, name, value)


class RealClockRead(AssertionError):
    """dynasem read a real clock (or slept for real) inside a simulation."""


def guard_real_time(world: Any) -> list[tuple[Any, str, Any]]:
    """Make the real ``time`` functions refuse callers in dynasem while a simulated thread
    runs (a clock read that bypasses the shims, e.g. ``from time import monotonic``). Other
    callers (logging's record times, moto, botocore inside the simulated database) are let
    through: they do not decide anything in dynasem."""
    undo = []
    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "sleep"):
        real = getattr(real_time, name)

        def guarded(*args: Any, _real: Any = real, _name: str = name) -> Any:
            if world.sched.current is not None and not world.in_db:
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if caller.startswith("dynasem"):
                    raise RealClockRead(f"{caller} called time.{_name}() in a simulation")
            return _real(*args)

        undo.append((real_time, name, real))
        setattr(real_time, name, guarded)
    return undo
