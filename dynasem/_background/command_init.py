"""The first process of a ``dynasem_lead`` command: the command runs in a pid namespace of its
own, so that nothing it started can outlive the lead.

Run by ``dynasem_lead`` as ``python -I command_init.py CONTROL_FD READY_FD LEADER_PID --
command ...``
(``-I``: nothing from the working directory or the environment is imported; the standard
library only). Two processes:

* the **keeper** (the process ``dynasem_lead`` started) dies with ``dynasem_lead``
  (``PR_SET_PDEATHSIG``), moves its next child into a new pid namespace, forks the init,
  forwards SIGTERM to it, SIGKILLs it on SIGUSR1 (it is the init's parent: no pid reuse can
  misdirect that), and exits with its status once it has been reaped — after every process of
  the namespace has ended; it writes one byte on READY_FD once it listens to those signals;
* the **init**, pid 1 of that namespace, dies with the keeper (``PR_SET_PDEATHSIG``), starts
  the command (nothing if the lead's deadline on the control pipe is past), reaps whatever
  is re-parented to it, forwards SIGTERM to every process of the namespace, and exits —
  which makes the kernel SIGKILL every process left in the namespace, daemons and
  ``setsid()`` ones included, before the init can be reaped — when the command exits, when
  ``dynasem_lead`` is gone (the control pipe is closed: no process holds its writing end any
  more), or when the lead's trusted deadline, which ``dynasem_lead`` writes on the control
  pipe after every renewal, is about to pass (``dynasem_lead`` stopped, not killed: SIGSTOP,
  a frozen VM).

``python -I command_init.py --watch CONTROL_FD LEADER_PID -- command ...`` (``dynasem_lead
--no-pid-namespace``): the **watcher**, the first process of the command's session, starts the
command in its process group (the command dies with the watcher: ``PR_SET_PDEATHSIG``), ignores
the SIGTERM ``dynasem_lead`` sends that group, and SIGKILLs the whole group, itself included,
when ``dynasem_lead`` is gone or the lead's deadline is about to pass, as the init does; it
exits with the command's status, once it has SIGKILLed what the command left in its group.
What the command starts in another session escapes it.

``python -I command_init.py --probe`` only says whether this machine lets us make a pid
namespace (exit 0), or why not (exit 1, the reason on stderr).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
# The init ends the namespace this long before the trusted deadline it was last told: a
# backstop that fires only if dynasem_lead, which kills the command earlier, did not.
WATCHDOG_MARGIN = 0.1
FAILED = 125  # the keeper or the init could not set up: dynasem_lead reports stderr

_libc = ctypes.CDLL(None, use_errno=True)


def _now() -> float:
    """The clock of the deadlines dynasem_lead tells (``dynasem._clock.monotonic``, which
    this script, the standard library only, cannot import): CLOCK_BOOTTIME, which counts a
    suspended host's sleep as the other hosts' wall clocks do."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def _fail(what: str, number: int | None = None) -> None:
    number = ctypes.get_errno() if number is None else number
    sys.stderr.write(f"dynasem_lead: {what}: {os.strerror(number)} (errno {number})\n")
    sys.stderr.flush()
    os._exit(FAILED)


def _die_with_parent(leader: int | None = None) -> None:
    """SIGKILL when our parent dies (``leader``: dynasem_lead, who must still be our parent,
    else we exit FAILED: it died before PR_SET_PDEATHSIG was set)."""
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        _fail("prctl(PR_SET_PDEATHSIG)")
    if leader is not None and os.getppid() != leader:
        os._exit(FAILED)


def _own_pid_namespace() -> str | None:
    """Make our next child the init of a new pid namespace; None, or why it was refused. As
    root (CAP_SYS_ADMIN) a pid namespace alone; otherwise inside a user namespace of our own
    that maps our uid and gid to themselves (where unprivileged user namespaces are allowed)."""
    if _libc.unshare(CLONE_NEWPID) == 0:
        return None
    first = ctypes.get_errno()
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        second = ctypes.get_errno()
        return (
            f"unshare(CLONE_NEWPID): {os.strerror(first)}; unshare(CLONE_NEWUSER | "
            f"CLONE_NEWPID): {os.strerror(second)}"
        )
    try:
        maps = {"uid_map": f"{uid} {uid} 1", "setgroups": "deny", "gid_map": f"{gid} {gid} 1"}
        for path, text in maps.items():  # setgroups before gid_map: the kernel's order
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    except OSError as exc:
        return f"mapping our uid in a user namespace: {exc}"
    return None


def probe() -> int:
    """Exit status 0 where a pid namespace can be made here (one is made and left at once)."""
    refused = _own_pid_namespace()
    if refused is not None:
        sys.stderr.write(refused + "\n")
        return 1
    pid = os.fork()
    if pid == 0:
        os._exit(0 if os.getpid() == 1 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _status(wait_status: int) -> int:
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


_HANDLED = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
# Ignored by Python from its start; an ignored signal stays ignored across exec: the command
# gets them back as any command started from a shell has them (subprocess's restore_signals).
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)


def keeper(control: int, ready: int, leader: int, command: list[str]) -> int:
    _die_with_parent(leader)
    refused = _own_pid_namespace()
    if refused is not None:
        _fail(f"no pid namespace for the command ({refused})", errno.EPERM)
    # Signals wait until their handlers are set, in the keeper and in the init alike.
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
    init_pid = os.fork()
    if init_pid == 0:
        os.close(ready)
        os._exit(init(control, command))
    os.close(control)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(init_pid, signal.SIGTERM))
    signal.signal(signal.SIGUSR1, lambda signum, frame: os.kill(init_pid, signal.SIGKILL))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
    os.write(ready, b"1")
    os.close(ready)
    # A signal handled meanwhile does not end the wait: Python retries it (PEP 475).
    _, wait_status = os.waitpid(init_pid, 0)
    return _status(wait_status)


def init(control: int, command: list[str]) -> int:
    _die_with_parent()  # with the keeper: it dies with dynasem_lead
    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    told = _told(control)
    if told is None:
        return FAILED  # the lead's deadline passed, or dynasem_lead is gone: start nothing
    child = os.fork()
    if child == 0:
        os.close(control)
        for sig in (*_HANDLED, *_PYTHON_IGNORES):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)  # exec keeps the mask
        os.setsid()  # a session of its own: no terminal's signals
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(f"dynasem_lead: cannot run {command[0]!r}: {exc}\n")
            os._exit(127)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
    status = _watch(control, child, *told)
    return FAILED if status is None else status  # our exit ends the namespace


def _forward(signum: int, frame: Any) -> None:
    with contextlib.suppress(ProcessLookupError):  # none left
        os.kill(-1, signum)  # from pid 1: every other process of the namespace


def watcher(control: int, leader: int, command: list[str]) -> int:
    if os.getppid() != leader:
        return FAILED  # dynasem_lead died before we started: start nothing
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
    told = _told(control)
    if told is None:
        return FAILED  # the lead's deadline passed, or dynasem_lead is gone: start nothing
    me = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(control)
        _die_with_parent(me)
        for sig in _PYTHON_IGNORES:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)  # exec keeps the mask
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(f"dynasem_lead: cannot run {command[0]!r}: {exc}\n")
            os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGINT):  # the group's SIGTERM is the command's
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
    status = _watch(control, child, *told)
    if status is None:
        os.killpg(0, signal.SIGKILL)  # the command's whole group, this process included
    # The command exited: what it left in its group ends with it, as a namespace's processes
    # end with its init (dynasem_lead, which kills the group at its next look, may be stopped
    # meanwhile, and nothing would watch the lead's deadline for them).
    _end_others()
    return FAILED if status is None else status


def _end_others() -> None:
    """SIGKILL every other process of our process group (not us: we exit with the command's
    status), until none is left (one may fork while we read)."""
    me = os.getpid()
    for _ in range(100):
        others = [pid for pid in _group_of(me) if pid != me]
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _group_of(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != b"Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            found.append(int(name))
    return found


def _told(control: int) -> tuple[float, bytes] | None:
    """The lead's trusted deadline dynasem_lead wrote on the control pipe before it started us
    (and what follows its line); None if it is about to pass or dynasem_lead is gone. Read
    before the command starts: dynasem_lead stopped (SIGSTOP) between its last look and our
    start, or we slow to start, must not start the command after the lead's deadline."""
    deadline, pending = None, b""
    while deadline is None:
        data = os.read(control, 4096)  # written before we were started: there at once
        if not data:
            return None
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            deadline = float(line)
    if deadline - WATCHDOG_MARGIN - _now() <= 0:
        return None
    return deadline, pending


def _watch(
    control: int, child: int, deadline: float = float("inf"), pending: bytes = b""
) -> int | None:
    """Reap until the command exits (its status), or until dynasem_lead is gone or its lead's
    deadline is about to pass (None: the caller ends the command)."""
    while True:
        status = _reap(child)
        if status is not None:
            return status
        left = deadline - WATCHDOG_MARGIN - _now()
        if left <= 0:
            return None
        ready, _, _ = select.select([control], [], [], min(0.05, left))
        if ready:
            data = os.read(control, 4096)
            if not data:
                return None  # dynasem_lead is gone: nobody renews the lead
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                deadline = float(line)


def _reap(child: int) -> int | None:
    """Reap every ended process (pid 1 adopts the orphans); the command's status once it
    exited."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return FAILED
        if pid == 0:
            return None
        if pid == child:
            return _status(wait_status)


def main(argv: list[str]) -> int:
    if argv == ["--probe"]:
        return probe()
    if argv[0] == "--watch":
        return watcher(int(argv[1]), int(argv[2]), argv[4:])
    control, ready, leader, dashes, *command = argv
    if dashes != "--" or not command:
        sys.stderr.write("usage: command_init.py CONTROL_FD READY_FD LEADER_PID -- cmd ...\n")
        return 2
    return keeper(int(control), int(ready), int(leader), command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
