"""The command a leader runs in tests/background/test_lead.py: it logs ``start``, then ``alive``
every 20 ms, and ``stop`` when it gets SIGTERM, each line with its host, pid (as the machine's
/proc numbers it), CLOCK_MONOTONIC (one clock for every namespace of the machine) and the
lead's fence.

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


def main() -> None:
    if sys.argv[2:] == ["--escape"]:
        escape()
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # The pid in the machine's /proc (this process may be in a pid namespace of its own).
    me = f"{socket.gethostname()} {os.readlink('/proc/self')}"
    fence = os.environ.get("DYNASEM_LEAD_FENCE", "-")

    def write(kind: str) -> None:
        os.write(fd, f"{kind} {me} {time.monotonic():.6f} {fence}\n".encode())

    def stop(signum: int, frame: Any) -> None:
        write("stop")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    write("start")
    exit_after = float(os.environ.get("LEAD_CHILD_EXIT_AFTER", "inf"))
    started = time.monotonic()
    while time.monotonic() - started < exit_after:
        time.sleep(0.02)
        write("alive")
    os._exit(3)


if __name__ == "__main__":
    main()
