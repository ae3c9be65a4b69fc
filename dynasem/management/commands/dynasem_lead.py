"""``manage.py dynasem_lead NAME -- COMMAND...``: run COMMAND only while this process leads.

Every host runs the same line (celery beat, a scheduler, a single consumer); one of them
leads ``NAME`` and runs the command, the others wait their turn. The leader sends the command
SIGTERM, then SIGKILL after ``--grace`` seconds, before its lead can be taken over: when the
lead is lost, or when renewals have failed for so long that only ``--grace`` plus a margin of
its trusted deadline (``lease - CLOCK_SKEW`` after the last renewal sent) is left. Nobody can
take the lead before that deadline, so two commands never run at once, given clocks within
``CLOCK_SKEW``. Having stopped it, the process competes again.

The command runs in a pid namespace of its own (``dynasem/_background/command_init.py``), so "the
command" is every process it starts, daemons and ``setsid()`` ones included: when this
process dies by any signal (SIGKILL, the OOM killer), the namespace's init dies with it
(``PR_SET_PDEATHSIG``, and the control pipe's end) and the kernel kills every process in the
namespace; when this process is stopped (SIGSTOP, a frozen VM), the init ends the namespace
just before the lead's trusted deadline, which this process tells it after every renewal.
Either way the command is dead before the lease ends, and since this lead records no
process identity nobody takes it over before then, on this host either. A machine that
refuses pid namespaces (no CAP_SYS_ADMIN and no unprivileged user namespaces) is refused
with the reason, unless ``--no-pid-namespace`` accepts the weaker guarantee: the command's
first process dies with this one, what it started may live on. The command gets
``DYNASEM_LEAD_NAME`` and ``DYNASEM_LEAD_FENCE`` in its environment.

If the command exits by itself, the lead is given back and this process exits with the
command's status (a process manager restarts it; a give-back DynamoDB refuses is said on stderr,
the lead left to its lease; an end seen once the lead is ending, by the init's watchdog or
as the loop stops it, is a stop: this process competes again); anything the command left
running is killed with the namespace. SIGTERM or SIGINT to this process stops the command
the same way (SIGTERM to every process of it, SIGKILL after ``--grace``), gives the lead back
and exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

import dynasem

from ... import _clock as clock
from ..._background.leadership import Lead, Leadership, leadership, resource_of
from ..._engine.arguments import check_lease, resolve_timing
from ..._engine.shutdown import release_all
from ...exceptions import LockLost, SemaphoreUnavailable, TableMissing

# How often the leader looks at its command and its lead (seconds).
POLL = 0.05
# Before a competitor could take over, the command must be dead: SIGKILL this long before
# the trusted deadline, at the latest (plus the time to reap it).
KILL_MARGIN = 0.2


# The command's first process: the init of its pid namespace (see dynasem/_background/
# command_init.py), or, with --no-pid-namespace, what only dies with us and execs it.
COMMAND_INIT = str(Path(dynasem.__file__).resolve().parent / "_background" / "command_init.py")
# How long the keeper may take to start listening, and to end the namespace once told to.
KEEPER_PATIENCE = 10.0
NO_PID_NAMESPACE = (
    "dynasem_lead runs the command in a pid namespace of its own, so that when this process "
    "is killed (SIGKILL, the OOM killer) every process the command started dies with it, "
    "before any other host can take the lead over; this machine refused one ({why}). Run "
    "dynasem_lead as root or with CAP_SYS_ADMIN, or allow unprivileged user namespaces "
    "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1; in a container, "
    "a seccomp profile that permits unshare), or pass --no-pid-namespace to accept that what "
    "the command starts in the background may outlive a killed dynasem_lead (see the how-to "
    "guide 'One leader among many hosts')."
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
            "--lease",
            type=float,
            help="seconds (default: DYNASEM['LEASE']); failover takes about lease + CLOCK_SKEW "
            "after a leader dies",
        )
        parser.add_argument(
            "--grace",
            type=float,
            help="seconds between SIGTERM and SIGKILL (default: a third of lease - CLOCK_SKEW, "
            "at most 10)",
        )
        parser.add_argument(
            "--no-pid-namespace",
            action="store_true",
            help="run the command without a pid namespace of its own (where none can be made): "
            "a killed dynasem_lead then kills only the command's first process, and what it "
            "started may live on",
        )
        parser.add_argument("command", nargs="*", help="after --: the command and its arguments")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after "--" is the command, options that look like ours included (argparse
        # would take them, or refuse "--" after a positional).
        if "--" in argv:
            cut = argv.index("--")
            self._command: list[str] = argv[cut + 1 :]
            argv = argv[:cut]
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        name, command = options["name"], getattr(self, "_command", None) or options["command"]
        if not command:
            raise CommandError("give the command to run after --: dynasem_lead NAME -- cmd ...")
        lease, window, grace = _timing(name, options["lease"], options["grace"])
        self._own_pids = not options["no_pid_namespace"]
        if self._own_pids:
            _check_pid_namespaces()
        stopping, waiting = threading.Event(), threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            stopping.set()
            if waiting.is_set():  # interrupt the wait (an acquire gives back what it took)
                raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        while not stopping.is_set():
            taken = self._take_lead(name, lease, window, waiting)
            if taken is None:
                continue  # told to stop (the loop ends), or DynamoDB unreachable: again
            place, lead = taken
            try:  # told to stop as the lead came: give it back, start nothing
                status = (
                    None if stopping.is_set() else self._lead(name, lead, command, grace, stopping)
                )
            finally:
                self._give_back(name, place)
            if status is not None:
                self._say(name, f"the command exited ({status})")
                sys.exit(status)
        self._say(name, "stopped")

    def _give_back(self, name: str, place: Leadership) -> None:
        """Give the lead back; one DynamoDB refused is left to its lease (renewed no more), said
        as a warning: the command's status, or competing again, goes on."""
        try:
            place.__exit__(None, None, None)
        except SemaphoreUnavailable as exc:
            self._say(name, f"giving the lead back failed ({exc}): it is left to its lease")

    def _say(self, name: str, text: str) -> None:
        self.stderr.write(f"dynasem_lead: {name!r}: {text}")

    def _take_lead(
        self, name: str, lease: float, window: float, waiting: threading.Event
    ) -> tuple[Leadership, Lead] | None:
        """Wait until this process leads ``name``; None if told to stop meanwhile (SIGTERM,
        SIGINT), or if DynamoDB could not be reached (after a pause)."""
        waiting.set()
        try:
            try:
                place = leadership(name, lease=lease)
                # The lead is the command's, not this process's: the end of this process does
                # not end the command at once (the kernel takes a moment to kill a namespace),
                # so nobody may take the lead over before its lease ends, on this host either.
                place.semaphore.detached = True
                lead = place.__enter__()
            finally:
                # From here a signal only sets ``stopping``: one raised between the lead's
                # taking and the end of this function would leave it held, by nobody, for a
                # lease.
                waiting.clear()
            return place, lead
        except KeyboardInterrupt:
            # It may have come just after the lead was taken: give back whatever we hold.
            release_all()
        except TableMissing as exc:
            raise CommandError(str(exc)) from None
        except SemaphoreUnavailable as exc:
            self._say(name, f"{exc}; trying again")
            time.sleep(min(5.0, window / 3))
        return None

    def _lead(
        self, name: str, lead: Lead, command: list[str], grace: float, stopping: threading.Event
    ) -> int | None:
        """Run the command while ``lead`` lasts; its exit status if it exited by itself,
        None if it was stopped (the lead lost or ending, or this process told to stop)."""
        if lead.seconds_left() <= 2 * (grace + KILL_MARGIN):
            # A lead found by a look rather than a push may come with a third of its window,
            # no more than the default grace: renewed first, or the command would be stopped
            # as soon as it started.
            with contextlib.suppress(LockLost, SemaphoreUnavailable):
                lead.held.renew()
        if stopping.is_set():
            return None  # told to stop while the renewal was on its way: start nothing
        if lead.seconds_left() <= grace + KILL_MARGIN + POLL:
            # Lost (taken over: another host may run its command now), or so nearly over
            # (its renewal failed) that the loop below would stop the command at its first
            # look, after it had begun. Start nothing; the lead is given back, and competed
            # for again.
            self._say(name, "the lead is ending or lost before its command could start")
            return None
        env = {**os.environ, "DYNASEM_LEAD_NAME": name, "DYNASEM_LEAD_FENCE": str(lead.fence)}
        child = _Command(command, env, self._own_pids, _deadline(lead))
        pid = child.process.pid
        termed: float | None = None
        try:
            self.stderr.write(
                f"dynasem_lead: leading {name!r} (fence {lead.fence}): started pid {pid}"
            )
            while (code := child.poll()) is None:
                child.trust_until(_deadline(lead))
                left = lead.seconds_left()
                if termed is None and (stopping.is_set() or left <= grace + KILL_MARGIN):
                    why = "stopping" if stopping.is_set() else "the lead is ending or lost"
                    self._say(name, f"{why}: SIGTERM to pid {pid}")
                    child.terminate()
                    termed = time.monotonic()
                if termed is not None and (
                    left <= KILL_MARGIN or time.monotonic() - termed >= grace
                ):
                    if child.poll() is None:
                        self._say(name, f"SIGKILL to pid {pid}")
                        child.kill()
                    break
                time.sleep(POLL)
            left = lead.seconds_left()  # as the end was seen (a pause after it changes nothing)
        finally:
            # Whatever ended it (or if supervising failed), nothing of the command may outlive
            # the lead: what ignored SIGTERM, what it started.
            child.kill()
        if termed is None and left > grace + KILL_MARGIN:
            return code
        # Ended with the lead ending: by the init's watchdog (this process stopped past the
        # deadline: FAILED, or 137 behind the watcher), or as the loop would have stopped it.
        # Not the command's own exit: competed for again, as after a stop.
        self._say(name, f"pid {pid} stopped")
        return None


def _deadline(lead: Lead) -> float:
    """The lead's trusted deadline on its own clock (``_clock.monotonic``: CLOCK_BOOTTIME,
    which counts a suspended host's sleep), for the command's init: the time read before what
    is left of the lead, so that a pause between the two shortens it, never stretches it past
    the lead's own."""
    now = clock.monotonic()
    return now + lead.seconds_left()


def _timing(name: str, lease: float | None, grace: float | None) -> tuple[float, float, float]:
    """The lead's lease, its trusted window (``lease - CLOCK_SKEW``) and the command's grace
    (seconds), checked."""
    try:
        resource_of(name)
        lease_s, _, skew = resolve_timing(None if lease is None else check_lease(lease), 0)
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    window = lease_s - skew
    grace_s = min(10.0, window / 3) if grace is None else grace
    # A healthy leader renews every third of the window: at least two thirds are left just
    # before each renewal. Stopping must start below that, or a leader would stop its
    # command between two renewals.
    if not 0 <= grace_s or grace_s + KILL_MARGIN > window / 2:
        raise CommandError(
            f"--grace {grace_s:g} s must be >= 0 and leave {KILL_MARGIN:g} s inside half of "
            f"lease - CLOCK_SKEW ({window:g} s): take a longer --lease or a shorter --grace"
        )
    return lease_s, window, grace_s


def _check_pid_namespaces() -> None:
    probe = subprocess.run(
        [sys.executable, "-I", COMMAND_INIT, "--probe"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        why = probe.stderr.strip() or f"exit status {probe.returncode}"
        raise CommandError(NO_PID_NAMESPACE.format(why=why))


class _Command:
    """The command, started in a pid namespace of its own behind a keeper process
    (dynasem/_background/command_init.py), or (``own_pids=False``) in a session of its own
    behind a watcher that ends its process group when this process is gone or stopped past
    the lead's deadline."""

    def __init__(
        self, command: list[str], env: dict[str, str], own_pids: bool, deadline: float
    ) -> None:
        """``deadline``: the lead's, told to the init before it starts (it must never run
        the command untold: this process may stop, SIGSTOP, while the keeper starts)."""
        self.own_pids = own_pids
        self._told = 0.0
        ready_r = -1
        # The control pipe: the keeper's init (or the watcher) reads the lead's trusted
        # deadline from it, and its end (this process gone) ends the command. The ready pipe
        # says the keeper listens to our signals.
        control_r, self._control = os.pipe()
        os.set_blocking(self._control, False)  # a stuck reader must never stall the leader
        fds: tuple[int, ...] = (control_r,)
        if own_pids:
            ready_r, ready_w = os.pipe()
            fds = (control_r, ready_w)
        self.trust_until(deadline)  # in the pipe before the init reads it
        leader = str(os.getpid())
        first = [*map(str, fds), leader] if own_pids else ["--watch", str(control_r), leader]
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", COMMAND_INIT, *first, "--", *command],
                env=env,
                start_new_session=True,
                pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)
        if own_pids:
            try:
                select.select([ready_r], [], [], KEEPER_PATIENCE)  # a byte, or its end: failed
            finally:
                os.close(ready_r)

    def poll(self) -> int | None:
        code = self.process.poll()
        return None if code is None else code if code >= 0 else 128 - code

    def trust_until(self, deadline: float) -> None:
        """Tell the namespace's init the lead's trusted deadline (CLOCK_BOOTTIME): it ends
        the namespace by itself just before, should this process stop acting (SIGSTOP)."""
        if self._control < 0 or abs(deadline - self._told) < 0.01:
            return
        # The init gone or not reading (BlockingIOError, BrokenPipeError) ends the namespace on
        # its own.
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._control, f"{deadline:.6f}\n".encode())
            self._told = deadline

    def terminate(self) -> None:
        """SIGTERM to every process of the command."""
        if self.own_pids:
            self.process.send_signal(signal.SIGTERM)  # the keeper: to the init: to all
        else:
            self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to every process of the command; returns once they are all dead (with a
        pid namespace: the keeper is reaped after its init, and the kernel reaps the init only
        after every process of its namespace)."""
        if self.own_pids:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGUSR1)  # the keeper SIGKILLs its init
                try:
                    self.process.wait(KEEPER_PATIENCE)
                except subprocess.TimeoutExpired:
                    # Never seen: the keeper dies, and its init with it (PR_SET_PDEATHSIG).
                    self.process.kill()
        else:
            self._signal_group(signal.SIGKILL)  # the watcher, the command, its group
        self.process.wait()  # at once if reaped already
        if self._control >= 0:
            os.close(self._control)
            self._control = -1

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)  # its own session: the command and what it started
