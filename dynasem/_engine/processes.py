"""Who this process is on its host, and whether a process another one recorded has ended.

A holder records ``<host>.<pid>.<start>`` in its entry (about 35 bytes): ``host`` is a 96-bit
hash of the kernel's boot id and of this process's pid and time namespaces, ``pid`` its pid
there, ``start`` its start time in clock ticks since boot (field 22 of ``/proc/<pid>/stat``).
A waiter that computes the same ``host`` sees the same processes under the same pids and the
same start times, so ``/proc`` alone can prove that the holder has ended:

* no ``/proc/<pid>``: no such process any more;
* a later start time under that pid: the pid was reused by a newer process;
* a zombie with no thread left (its parent has not reaped it yet).

Anything else is not proof, and the holder is treated as alive until its lease ends: another
host (or another pid or time namespace: a container), a live process with the same pid and
start time (running, sleeping or stopped), a ``/proc`` we cannot read, or one we cannot trust
(not Linux; ``/proc`` of another pid namespace than ours, where ``/proc/<our pid>`` is a
stranger; mounted with ``hidepid``, which hides other users' processes: a missing directory
proves nothing then). Where this process cannot be sure of its own view it records nothing,
and nobody can take its holds over early.

The whole rule assumes that two processes computing the same ``host`` see the same process
table. Machines cloned from one memory snapshot (Lambda SnapStart, Firecracker clones) break
it: they share the boot id and, without containers, the namespaces, yet a process started
after the restore lives in one clone's table only. ``DYNASEM['SAME_HOST_TAKEOVER'] = False``
turns the rule off (holders are taken over when their lease ends, as on another host); left
at ``None`` it is off by itself where such a runtime is detected (:func:`takeover_rule`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import sys

logger = logging.getLogger("dynasem")

SEP = "."
# The states of a process that runs no more code (with no thread left: see _no_thread_left).
_ENDED_STATES = frozenset("ZXx")


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _stat(pid: int | str) -> tuple[str, int]:
    """The state (field 3) and start time (field 22) of ``/proc/<pid>/stat``; the command name
    (field 2) may hold spaces and parentheses: the fields we read follow its last ``)``. Read
    with one system call each for open, read and close (a buffered text file costs twice as
    much: this is what a waiter pays per look)."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    try:
        line = os.read(fd, 4096)
    finally:
        os.close(fd)
    fields = line.rpartition(b")")[2].split()
    return fields[0].decode("ascii", "replace"), int(fields[19])


def _proc_hides_pids() -> bool:
    """Is ``/proc`` mounted with ``hidepid`` (other users' processes hidden or unreadable)?"""
    options = ""
    for line in _read("/proc/self/mountinfo").splitlines():
        head, _, tail = line.partition(" - ")
        if head.split()[4:5] == ["/proc"]:
            options = tail.split()[-1]  # the last mount on /proc is the one we see
    for option in options.split(","):
        name, _, value = option.partition("=")
        if name == "hidepid" and value not in ("0", "off"):
            return True
    return False


def _probe() -> str | None:
    """This process's identity, if it can be sure of its own view of ``/proc``: probed once
    per pid. A child forked by C code that runs no at-fork hook of Python's (a uWSGI worker,
    unless ``py-call-osafterfork``) keeps its parent's cache, and would otherwise record its
    parent's pid and start time: taken over while it holds, once the parent ends."""
    return _probe_of(os.getpid())


@functools.cache
def _probe_of(pid: int) -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # /proc must be our own pid namespace's. /proc/self names us in the namespace /proc
        # was mounted for: another number than getpid() says it is not ours (then
        # /proc/<getpid()> is a stranger). NSpid lists our pid in each namespace from that one
        # down to ours, so one entry, ours, says it again.
        if os.readlink("/proc/self") != str(pid):
            return None
        status = _read("/proc/self/status")
        nspid = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
        if nspid != [[str(pid)]] or _proc_hides_pids():
            return None
        boot = _read("/proc/sys/kernel/random/boot_id").strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
        try:
            # Start times as /proc shows them depend on the reader's time namespace.
            time_ns = os.readlink("/proc/self/ns/time")
        except FileNotFoundError:
            time_ns = ""  # a kernel without time namespaces: one clock for everyone
        _, start = _stat("self")
        _, again = _stat("self")  # the same twice, or we do not understand what we read
    except (OSError, ValueError, IndexError):
        return None
    if not boot or start != again:
        return None
    return SEP.join([host_key(boot, pid_ns, time_ns), str(pid), str(start)])


def host_key(boot_id: str, pid_ns: str, time_ns: str) -> str:
    """The ``host`` part of an identity: 96 bits of a hash of what must be the same for two
    processes to see one another alike in ``/proc`` (16 characters)."""
    digest = hashlib.sha256(f"{boot_id}|{pid_ns}|{time_ns}".encode()).digest()
    return base64.urlsafe_b64encode(digest[:12]).decode()


_told: tuple[bool, str] | None = None  # the rule last logged


def takeover_rule() -> tuple[bool, str]:
    """Whether a holder of this host may be taken over once ``/proc`` proves it ended (before
    its lease ends), and why: ``DYNASEM['SAME_HOST_TAKEOVER']``, or where it is ``None``, on
    unless this runtime may be one of several clones of a memory snapshot. Costs no system
    call."""
    from ..conf import settings  # read live: override_settings follows

    chosen = settings.SAME_HOST_TAKEOVER
    if chosen is not None:
        rule = (chosen, f"DYNASEM['SAME_HOST_TAKEOVER'] = {chosen}")
    elif os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start":
        rule = (
            False,
            "a runtime restored from a snapshot (AWS_LAMBDA_INITIALIZATION_TYPE=snap-start)",
        )
    elif os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        rule = (False, "AWS Lambda (its execution environments may be restored from snapshots)")
    else:
        rule = (True, "the default (DYNASEM['SAME_HOST_TAKEOVER'] = None)")
    # One log line per process (and per change) says which rule is in force.
    global _told
    if rule != _told:
        _told = rule
        level = logging.DEBUG if rule[0] and "default" in rule[1] else logging.INFO
        state = "on" if rule[0] else "off (holders are taken over when their lease ends)"
        logger.log(level, "dynasem: same-host takeover of dead holders is %s: %s", state, rule[1])
    return rule


def identity() -> str | None:
    """What a holder (or a waiter) of this process records, or None where we cannot be sure
    of our own view of ``/proc`` or same-host takeover is off (then nobody takes our holds
    over before their lease ends)."""
    return _probe() if takeover_rule()[0] else None


def _parse(recorded: str | None) -> tuple[int, int] | None:
    """(pid, start) of an identity recorded on this host, or None."""
    mine = identity() if recorded else None
    if recorded is None or mine is None:
        return None
    host, _, rest = recorded.partition(SEP)
    if host != mine.partition(SEP)[0]:
        return None
    pid_text, _, start_text = rest.partition(SEP)
    if not (pid_text.isdigit() and start_text.isdigit()):
        return None
    return int(pid_text), int(start_text)


def local(recorded: str | None) -> bool:
    """Was ``recorded`` written by a process whose end this one could prove (same host, same
    namespaces)? Costs one system call (``getpid``)."""
    return _parse(recorded) is not None


def _no_thread_left(pid: int) -> bool:
    """A zombie is over only if no thread of it runs: a thread group whose first thread
    exited shows that thread as a zombie while the others go on."""
    try:
        return os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except FileNotFoundError:
        return True  # reaped meanwhile
    except OSError:
        return False


def gone(recorded: str | None) -> bool:
    """True only when ``recorded`` names a process of this host that has surely ended.

    One read of ``/proc/<pid>/stat`` (a zombie: also a listing of its threads); for an identity
    recorded elsewhere, only ``getpid``; none for one recorded nowhere."""
    parsed = _parse(recorded)
    if parsed is None:
        return False
    pid, start = parsed
    try:
        state, started = _stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        # No such process: unless /proc itself went away under us (then we know nothing).
        return os.path.isdir("/proc/self")
    except (OSError, ValueError, IndexError):
        return False
    if started != start:
        # The pid was reused by a newer process. A start time *earlier* than the recorded one
        # cannot be: we do not understand what we read, so we do not decide.
        return started > start
    return state in _ENDED_STATES and _no_thread_left(pid)


def _forget_after_fork() -> None:
    # A forked child is another process: its own pid and start time (and the parent's entry
    # is of no use to it).
    _probe_of.cache_clear()


os.register_at_fork(after_in_child=_forget_after_fork)
