"""The command a leader runs in tests/test_lead.py: it logs ``start``, then ``alive`` every
20 ms, and ``stop`` when it gets SIGTERM, each line with its host, pid (as the machine's
/proc numbers it), CLOCK_MONOTONIC (one clock for every namespace of the machine) and the
lead's fence."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any


def main() -> None:
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
