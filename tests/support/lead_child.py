"""The command a leader runs in tests/background/test_lead.py: it logs ``start``, then ``alive``
every 20 ms, and ``stop`` when it gets SIGTERM, each line with its host, pid (as the machine's
/proc numbers it), CLOCK_MONOTONIC (one clock for every namespace of the machine) and the
lead's fence. Before ``start`` it logs ``forked``: when its process was made (/proc/self/stat,
to 10 ms) on the same clock: a hand-over timed to it leaves out this interpreter's own start
(slow under coverage on a loaded machine), which is not dynasem's.

``python -m tests.support.lead_child LOG --escape`` runs the logging loop in a process that left:
the command forks, the child calls ``setsid()`` and forks again, and that grandchild (a daemon, its
parent gone) logs while the command itself only sleeps. A process group kill or
``PR_SET_PDEATHSIG`` on the command reaches the daemon no more."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any


def escape() -> None:
    """Fork a daemon (setsid, fork again) that returns to log; the command itself sleeps."""
    if os.fork() != 0:
        while True:
            time.sleep(60)  # the command: alive, doing nothing
    os.setsid()
    if os.fork() != 0:
        os._exit(0)


def forked_at() -> float:
    """When this process was made, on CLOCK_MONOTONIC: its start time (clock ticks since boot)
    taken back from CLOCK_BOOTTIME's now."""
    stat = open("/proc/self/stat").read()  # noqa: SIM115
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command's name
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age


def main() -> None:
    if sys.argv[2:] == ["--escape"]:
        escape()
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # The pid in the machine's /proc (this process may be in a pid namespace of its own).
    me = f"{socket.gethostname()} {os.readlink('/proc/self')}"
    fence = os.environ.get("DYNASEM_LEAD_FENCE", "-")

    def write(kind: str, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        os.write(fd, f"{kind} {me} {at:.6f} {fence}\n".encode())

    def stop(signum: int, frame: Any) -> None:
        write("stop")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    write("forked", forked_at())
    write("start")
    exit_after = float(os.environ.get("LEAD_CHILD_EXIT_AFTER", "inf"))
    started = time.monotonic()
    while time.monotonic() - started < exit_after:
        time.sleep(0.02)
        write("alive")
    os._exit(3)


if __name__ == "__main__":
    main()
