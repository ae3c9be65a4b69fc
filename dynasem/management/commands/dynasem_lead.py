"""``manage.py dynasem_lead NAME -- COMMAND...``: run COMMAND only while this process leads.

Every host runs the same line (celery beat, a scheduler, a single consumer); one of them
leads ``NAME`` and runs the command, the others wait their turn. The leader sends the command
SIGTERM, then SIGKILL after ``--grace`` seconds, before its lead can be taken over: when the
lead is lost, or when renewals have failed for so long that only ``--grace`` plus a margin of
its trusted deadline (``lease - CLOCK_SKEW`` after the last renewal sent) is left. Nobody can
take the lead before that deadline, so two commands never run at once, given clocks within
``CLOCK_SKEW``. Having stopped it, the process competes again. The command runs in a session
of its own (signals go to its whole process group) with ``DYNASEM_LEAD_NAME`` and
``DYNASEM_LEAD_FENCE`` in its environment, and is SIGKILLed by Linux if this process dies
(``PR_SET_PDEATHSIG``; its own children should exit with it).

If the command exits by itself, the lead is given back and this process exits with the
command's status (a process manager restarts it). SIGTERM or SIGINT to this process stops
the command the same way (SIGTERM, SIGKILL after ``--grace``), gives the lead back and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dynasem.exceptions import SemaphoreUnavailable, TableMissing
from dynasem.leadership import Lead, leadership, resource_of
from dynasem.shutdown import release_all
from dynasem.validation import check_lease, resolve_timing

# How often the leader looks at its command and its lead (seconds).
POLL = 0.05
# Before a competitor could take over, the command must be dead: SIGKILL this long before
# the trusted deadline, at the latest (plus the time to reap it).
KILL_MARGIN = 0.2


# Run in the child before the command: PR_SET_PDEATHSIG(SIGKILL), then exec the command (the
# setting survives exec); if the parent died before it was set, exit at once.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class Command(BaseCommand):
    help = (
        "Run a command only while this process leads NAME (one leader among every process "
        "and host on the lock table): `manage.py dynasem_lead NAME [options] -- command ...`. "
        "The command gets SIGTERM (SIGKILL after --grace) before the lead could be taken "
        "over, and this process then competes again; it exits with the command's status if "
        "the command exits by itself."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="the leadership's name (the resource leader:NAME)")
        parser.add_argument(
            "--lease", type=float, help="seconds (default: DYNASEM['LEASE']); failover takes "
            "about lease + CLOCK_SKEW after a leader dies",
        )  # fmt: skip
        parser.add_argument(
            "--grace", type=float, help="seconds between SIGTERM and SIGKILL (default: a "
            "third of lease - CLOCK_SKEW, at most 10)",
        )  # fmt: skip
        parser.add_argument("command", nargs="*", help="after --: the command and its arguments")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after "--" is the command, options that look like ours included (argparse
        # would take them, or refuse "--" after a positional).
        if "--" in argv:
            cut = argv.index("--")
            self._command: list[str] = argv[cut + 1 :]
            argv = argv[:cut]
        super().run_from_argv(argv)

    def handle(self, *args: Any, name: str, lease: float | None, grace: float | None,
               command: list[str], **options: Any) -> None:  # fmt: skip
        command = getattr(self, "_command", None) or command
        if not command:
            raise CommandError("give the command to run after --: dynasem_lead NAME -- cmd ...")
        try:
            resource_of(name)
            lease_s, _, skew = resolve_timing(None if lease is None else check_lease(lease), 0)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        window = lease_s - skew
        grace_s = min(10.0, window / 3) if grace is None else grace
        # A healthy leader renews every third of the window: at least two thirds are left
        # just before each renewal. Stopping must start below that, or a leader would stop
        # its command between two renewals.
        if not 0 <= grace_s or grace_s + KILL_MARGIN > window / 2:
            raise CommandError(
                f"--grace {grace_s:g} s must be >= 0 and leave {KILL_MARGIN:g} s inside half "
                f"of lease - CLOCK_SKEW ({window:g} s): take a longer --lease or a shorter "
                "--grace"
            )
        stopping = threading.Event()
        waiting = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            stopping.set()
            if waiting.is_set():  # interrupt the wait (an acquire gives back what it took)
                raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        while not stopping.is_set():
            waiting.set()
            try:
                place = leadership(name, lease=lease_s)
                lead = place.__enter__()
            except KeyboardInterrupt:
                # It may have come just after the lead was taken: give back whatever we hold.
                waiting.clear()
                release_all()
                break
            except TableMissing as exc:
                raise CommandError(str(exc)) from None
            except SemaphoreUnavailable as exc:  # DynamoDB unreachable: try again
                waiting.clear()
                self.stderr.write(f"dynasem_lead: {name!r}: {exc}; trying again")
                time.sleep(min(5.0, window / 3))
                continue
            finally:
                waiting.clear()
            try:
                status = self._lead(name, lead, command, grace_s, stopping)
            finally:
                place.__exit__(None, None, None)
            if status is not None:
                self.stderr.write(f"dynasem_lead: {name!r}: the command exited ({status})")
                sys.exit(status)
        self.stderr.write(f"dynasem_lead: {name!r}: stopped")

    def _lead(
        self, name: str, lead: Lead, command: list[str], grace: float, stopping: threading.Event
    ) -> int | None:
        """Run the command while ``lead`` lasts; its exit status if it exited by itself,
        None if it was stopped (the lead lost or ending, or this process told to stop)."""
        env = {**os.environ, "DYNASEM_LEAD_NAME": name, "DYNASEM_LEAD_FENCE": str(lead.fence)}
        # The command dies with this process (SIGKILL at our death, set before its exec): a
        # leader killed alone must not leave it running while another host takes over.
        child = subprocess.Popen(
            [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *command],
            env=env,
            start_new_session=True,
        )
        try:
            return self._supervise(name, lead, child, grace, stopping)
        finally:
            # Whatever ended it (or if supervising failed), nothing of the command's process
            # group may outlive the lead: what ignored SIGTERM, what it started.
            _signal_group(child, signal.SIGKILL)
            if child.poll() is None:
                child.wait()

    def _supervise(
        self,
        name: str,
        lead: Lead,
        child: subprocess.Popen[Any],
        grace: float,
        stopping: threading.Event,
    ) -> int | None:
        self.stderr.write(
            f"dynasem_lead: leading {name!r} (fence {lead.fence}): started pid {child.pid}"
        )
        termed: float | None = None
        while True:
            code = child.poll()
            if code is not None:
                if termed is not None:
                    self.stderr.write(f"dynasem_lead: {name!r}: pid {child.pid} stopped")
                    return None
                return code if code >= 0 else 128 - code
            left = lead.seconds_left()
            if termed is None and (stopping.is_set() or left <= grace + KILL_MARGIN):
                why = "stopping" if stopping.is_set() else "the lead is ending or lost"
                self.stderr.write(f"dynasem_lead: {name!r}: {why}: SIGTERM to pid {child.pid}")
                _signal_group(child, signal.SIGTERM)
                termed = time.monotonic()
            if termed is not None and (left <= KILL_MARGIN or time.monotonic() - termed >= grace):
                if child.poll() is None:
                    self.stderr.write(f"dynasem_lead: {name!r}: SIGKILL to pid {child.pid}")
                    _signal_group(child, signal.SIGKILL)
                    child.wait()
                self.stderr.write(f"dynasem_lead: {name!r}: pid {child.pid} stopped")
                return None
            time.sleep(POLL)


def _signal_group(child: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(child.pid, sig)  # its own session: the command and what it started
    except ProcessLookupError:
        pass
