#!/usr/bin/env python3
"""Leader election, watched: two "hosts" run the same line and one scheduler runs at a time.

    make lead-demo          # sets up .venv first, then runs this (about 40 s)

Starts the embedded DynamoDB (``python -m dynasem.testing``) on a free port, then twice::

    python manage.py dynasem_lead scheduler --lease 6 -- python manage.py run_scheduler

One leads and runs the scheduler, the other waits. After a while the leader is killed
(SIGKILL): its scheduler dies with it (the kernel empties the command's pid namespace), and
the other takes over ``lease + CLOCK_SKEW`` after the last renewal, on this machine as on
another host: a lead is the command's, so no waiter takes it over early from ``/proc``. Then
the survivor gets SIGTERM: it stops its scheduler cleanly and gives the lead back. Every
line is prefixed with the "host" that printed it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
LEASE = "6"


LEADS: list[str] = []  # the hosts in the order they said they lead


def pump(name: str, stream: object, started: float) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        if "dynasem_lead: leading" in line:
            LEADS.append(name)
        print(f"[{time.monotonic() - started:5.1f}s] {name}: {line.rstrip()}", flush=True)


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="dynasem-lead-demo-"))
    engine = subprocess.Popen(
        [PY, "-m", "dynasem.testing", "--port", "0", "--port-file", str(workdir / "port"),
         "--quiet"],
        cwd=REPO,
    )  # fmt: skip
    hosts: dict[str, subprocess.Popen[str]] = {}
    try:
        for _ in range(100):
            if (workdir / "port").exists() and (workdir / "port").read_text().strip():
                break
            time.sleep(0.1)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DYNASEM_ENDPOINT_URL": f"http://127.0.0.1:{(workdir / 'port').read_text().strip()}",
            "DYNASEM_TABLE_NAME": "dynasem-lead-demo",
            "DYNASEM_CLOCK_SKEW": "1",
            "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "demo"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "demo"),
            "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            "PYTHONUNBUFFERED": "1",
        }
        manage = [PY, str(REPO / "manage.py")]
        subprocess.run([*manage, "dynasem_createtable", "--wait"], env=env, check=True, cwd=REPO)
        started = time.monotonic()
        line = [*manage, "dynasem_lead", "scheduler", "--lease", LEASE, "--", *manage,
                "run_scheduler"]  # fmt: skip
        print(f"lead_demo: on each of host-1 and host-2: {' '.join(line[1:])}", flush=True)
        for name in ("host-1", "host-2"):
            proc = subprocess.Popen(
                line, env=env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            hosts[name] = proc
            threading.Thread(target=pump, args=(name, proc.stdout, started), daemon=True).start()
            time.sleep(1)
        time.sleep(8)
        leader = LEADS[0] if LEADS else "host-1"
        print(
            f"lead_demo: SIGKILL to {leader}'s dynasem_lead: its scheduler dies with it; the "
            "other takes over after lease + CLOCK_SKEW",
            flush=True,
        )
        hosts[leader].send_signal(signal.SIGKILL)
        time.sleep(float(LEASE) + 8)
        survivor = "host-2" if leader == "host-1" else "host-1"
        print(f"lead_demo: SIGTERM to {survivor}'s dynasem_lead (a clean stop)", flush=True)
        hosts[survivor].send_signal(signal.SIGTERM)
        hosts[survivor].wait(30)
        time.sleep(0.5)
        return 0
    finally:
        for proc in hosts.values():
            if proc.poll() is None:
                proc.kill()
        engine.terminate()
        engine.wait()


if __name__ == "__main__":
    sys.exit(main())
