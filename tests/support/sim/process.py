"""Simulated hosts and processes: clocks, identity, /proc, module state, rngs.

A host's wall clock is true virtual time plus its offset (within ``spread * CLOCK_SKEW`` of
true time; a jump moves it within the same bounds). A process's monotonic clock runs at true
rate from a base of its own, so code that compares monotonic times across processes would
show it. A process's identity is what ``dynasem._engine.processes`` records
(``<host key>.<pid>.<start>``); the host's simulated /proc answers for its processes only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

from .scheduler import SimThread


@dataclasses.dataclass
class Host:
    name: str
    offset: float  # wall clock minus true time, seconds
    ip: str
    cut_until: float = 0.0  # cut off from DynamoDB until then (a partition), virtual time
    deaf_until: float = 0.0  # DynamoDB's answers to it lost until then (requests still apply)

    @property
    def boot_id(self) -> str:
        return f"sim-boot-{self.name}"

    @property
    def push_id(self) -> str:
        """``dynasem._engine.push.HOST_ID`` on this host (loopback pushes stay on it)."""
        return hashlib.sha256(f"{self.name}|{self.boot_id}".encode()).hexdigest()[:12]


class Process:
    """A simulated process: its threads (greenlets), module state, clocks and rngs."""

    def __init__(self, world: Any, host: Host, pid: int, seed: str, *, kind: str, steps: int):
        self.world, self.host, self.pid = world, host, pid
        self.name = f"{host.name}/p{pid}"
        self.kind, self.steps = kind, steps
        rng = random.Random(seed)
        self.rng = random.Random(rng.random())  # dynasem's own draws: tokens, jitter
        self.workload_rng = random.Random(rng.random())  # what the workload does
        self.mono_base = rng.uniform(1_000.0, 1_000_000.0)
        self.start_ticks = int(world.sched.now * 100) % 10**9  # its start, in clock ticks
        self.dead = False
        self.stalled_until = 0.0
        self.threads: list[SimThread] = []
        self.globals: list[Any] = []
        self.clients: dict[bool, Any] = {}
        self.done = False  # its workload ended
        self.acquired = 0
        self.transaction: Any = None  # a committer's open transaction (workload.Transaction)
        self.breaking: tuple[str, str, int] | None = None  # a break: resource, token, fence
        self._identity: str | None = None

    def identity(self) -> str:
        """Made once (from what never changes for a process), as a real process's probe is."""
        if self._identity is None:
            from dynasem._engine import processes

            host = processes.host_key(self.host.boot_id, "pid:[sim]", "time:[sim]")
            self._identity = processes.SEP.join([host, str(self.pid), str(self.start_ticks)])
        return self._identity

    def stat(self) -> tuple[str, int]:
        """What ``/proc/<pid>/stat`` shows of it: (state, start time)."""
        return ("T" if self.stalled_until > self.world.sched.now else "S"), self.start_ticks

    def __repr__(self) -> str:
        return f"<Process {self.name}>"
