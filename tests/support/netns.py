"""Several hosts on one machine: Linux network namespaces joined by a bridge.

Used by ``tests/system/test_hosts.py`` and ``benchmarks/soak_hosts.py``. ``Network`` builds, for one
run, a private subnet ``10.211.N.0/24`` (N picked free) and these namespaces, all named
``dynasem-<pid>-<run>-<role>`` so that a crashed run is recognised and removed by the next::

    root namespace (DynamoDB Local, the test)  10.211.N.1 ──┐
    "sw": a bridge, no address                              ├── br0
    host "a"  eth0 10.211.N.11   (+ 10.212.N.11 on lo)     ┤
    host "b"  eth0 10.211.N.12   (+ 10.212.N.12 on lo)     ┤
    host "c"  eth0 10.211.N.13   ...                        ┘

Each host is a network namespace of its own: its own interfaces, addresses, routes and
iptables rules. The hosts have no default route, so nothing they send can leave the subnet;
the only address of the root namespace they reach is the gateway, where DynamoDB Local
listens (it binds every interface). The ``10.212.N.x`` address of a host is reachable from
no other host: an address a waiter may record that a releaser cannot send to.

A process joins a host with :func:`enter` (its network namespace, and a UTS namespace with
the host's own name, so ``socket.gethostname()`` differs per host as it does between real
machines). Every namespace shares the kernel's ``CLOCK_MONOTONIC``, so monotonic timestamps
taken on different hosts are comparable: the tests and the soak rely on that.

Faults: :meth:`Network.cut` takes a host off DynamoDB (``"drop"``: iptables DROP both ways
between the host and the gateway, a silent black hole; ``"link"``: its link down, which also
cuts it off from the other hosts), :meth:`Network.heal` undoes it;
:meth:`Network.block_udp` drops every UDP datagram into a host from the subnet (pushes).

Debian packages the tests need are installed with :func:`apt_install` when missing (iptables,
faketime); :func:`libfaketime` finds the preload library that shifts one process's wall clock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from types import TracebackType

SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"
LOCK_PATH = "/tmp/dynasem-netns.lock"  # serialises subnet choice between concurrent runs
PREFIX = "dynasem-"
_NAME = re.compile(r"^dynasem-(\d+)-([0-9a-f]+)-")

CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000


def which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":" + SBIN_PATH)


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        env=dict(os.environ, PATH=os.environ.get("PATH", "") + ":" + SBIN_PATH),
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr}")
    return done


# ---------------------------------------------------------------------------------------------
# What this machine allows
# ---------------------------------------------------------------------------------------------

_apt_updated = False


def apt_install(package: str) -> str | None:
    """``apt-get install -y PACKAGE`` (``apt-get update`` once first); None when done, else
    why it could not be done."""
    global _apt_updated
    found = which("apt-get")
    if found is None:
        return f"{package} is missing and there is no apt-get to install it"
    prefix: list[str] = []
    if os.geteuid() != 0:
        if which("sudo") is None:
            return f"{package} is missing; installing it needs root or sudo"
        prefix = ["sudo", "-n"]
    # Another test (an xdist worker, a step run beside) may be installing a package too:
    # wait for dpkg's lock rather than fail on it (and skip what this install was for).
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    commands = [[*prefix, found, "install", "-y", "-qq", package, *wait]]
    if not _apt_updated:
        commands.insert(0, [*prefix, found, "update", "-qq", *wait])
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in commands:
        shown = " ".join(command)
        print(f"tests.support.netns: {shown}", file=sys.stderr)
        try:
            done = subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=900,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{package} is missing and `{shown}` failed: {exc}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return f"{package} is missing and `{shown}` failed (exit {done.returncode}): " + (
                " / ".join(tail)
            )
        if "update" in command:
            _apt_updated = True
    return None


def ensure_tool(tool: str, package: str) -> str:
    """The path of ``tool``, installing ``package`` with apt when it is missing; raises
    ``LookupError`` (with the reason) when that is impossible."""
    path = which(tool)
    if path is None:
        reason = apt_install(package)
        if reason is not None:
            raise LookupError(reason)
        path = which(tool)
        if path is None:
            raise LookupError(f"`apt-get install {package}` succeeded but left no `{tool}`")
    return path


def problem() -> str | None:
    """Why hosts cannot be made here (None if they can): Linux, root, iproute2, and a
    namespace that can really be created."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return (
            "making hosts (network namespaces, veth pairs) needs root; the suite runs as uid "
            f"{os.geteuid()}"
        )
    try:
        ensure_tool("ip", "iproute2")
    except LookupError as exc:
        return str(exc)
    probe = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    done = _run("ip", "netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed here: {done.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def libfaketime() -> str | None:
    """The multi-threaded libfaketime preload library, if installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    found += sorted(glob.glob("/usr/lib/faketime/libfaketimeMT.so.1"))
    return found[0] if found else None


def ensure_libfaketime() -> str:
    """libfaketime's path, installing Debian's ``faketime`` when missing (``LookupError``
    with the reason when impossible)."""
    path = libfaketime()
    if path is None:
        reason = apt_install("faketime")
        if reason is not None:
            raise LookupError(reason)
        path = libfaketime()
        if path is None:
            raise LookupError("`apt-get install faketime` left no libfaketimeMT.so.1")
    return path


def faketime_env(library: str, offset: float) -> dict[str, str]:
    """Environment variables that shift a process's wall clock by ``offset`` seconds and
    leave its monotonic clock alone (dynasem trusts a hold on the monotonic clock: it must be
    the host's real one)."""
    return {
        "LD_PRELOAD": library,
        "FAKETIME": f"{offset:+.3f}",
        "DONT_FAKE_MONOTONIC": "1",
    }


def sleep_despite_faketime() -> None:
    """Under libfaketime 0.9.10 (Debian 12) with ``DONT_FAKE_MONOTONIC``, ``clock_nanosleep``
    on an absolute CLOCK_MONOTONIC deadline fails with EINVAL, and that is how Python's
    ``time.sleep`` sleeps: every call raises ``OSError``. In a process started with
    libfaketime preloaded, replace it with ``select()`` on a relative timeout (until the
    monotonic deadline), which libfaketime leaves alone. Threading waits are not affected."""
    if "faketime" not in os.environ.get("LD_PRELOAD", ""):
        return
    import select
    import time

    def sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = sleep


# ---------------------------------------------------------------------------------------------
# Joining a host from inside a process
# ---------------------------------------------------------------------------------------------


def enter(netns: str, hostname: str | None = None) -> None:
    """Move this process into the network namespace ``netns`` (and, with ``hostname``, into a
    UTS namespace of its own named so). Call it first thing, before any thread or socket is
    made: a namespace switch applies to the calling thread and what it starts afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)
    if hostname:
        if libc.unshare(CLONE_NEWUTS) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWUTS): {os.strerror(err)}")
        name = hostname.encode()
        if libc.sethostname(name, len(name)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sethostname({hostname}): {os.strerror(err)}")


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans in namespaces)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


# ---------------------------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------------------------


@dataclass
class Host:
    name: str  # "a"
    netns: str  # dynasem-<pid>-<run>-a
    address: str  # on eth0, reachable from every host and the gateway
    unreachable: str  # on its loopback: no other host has a route to it
    hostname: str
    cut: set[str] = field(default_factory=set)  # the cuts in place ("drop", "link")
    # CLOCK_MONOTONIC when the last cut stopped the host's requests (its first rule was in
    # place): no write the host sends is applied after it.
    cut_at: float = 0.0
    udp_blocked: bool = False


class Network:
    """Hosts on a bridge; a context manager that removes everything it made."""

    def __init__(self, names: tuple[str, ...] = ("a", "b", "c")) -> None:
        self.names = names
        self.run = secrets.token_hex(3)[:5]
        self.base = f"{PREFIX}{os.getpid()}-{self.run}"
        self.switch = f"{self.base}-sw"
        self.root_if = f"ds{self.run}r0"  # at most 15 characters
        self.hosts: dict[str, Host] = {}
        self.gateway = ""
        self.subnet = ""
        self._made: list[str] = []

    # -- building ----------------------------------------------------------------------------

    def start(self) -> Network:
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            remove_stale()
            n = self._free_subnet()
            try:
                self._build(n)
            except BaseException:
                self.stop()
                raise
        return self

    def _free_subnet(self) -> int:
        used = set()
        for line in _run("ip", "-4", "-o", "addr", "show").stdout.splitlines():
            match = re.search(r"inet 10\.211\.(\d+)\.", line)
            if match:
                used.add(int(match.group(1)))
        free = [n for n in range(1, 255) if n not in used]
        if not free:
            raise RuntimeError("every 10.211.N.0/24 subnet is in use")
        return secrets.choice(free)

    def _netns(self, role: str) -> str:
        name = f"{self.base}-{role}"
        _run("ip", "netns", "add", name)
        self._made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _build(self, n: int) -> None:
        self.subnet = f"10.211.{n}.0/24"
        self.gateway = f"10.211.{n}.1"
        sw = self._netns("sw")
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        # The root namespace's leg: DynamoDB Local and the test are there.
        peer = f"ds{self.run}r1"
        _run("ip", "link", "add", self.root_if, "type", "veth", "peer", "name", peer, "netns", sw)
        _run("ip", "-n", sw, "link", "set", peer, "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.root_if)
        _run("ip", "link", "set", self.root_if, "up")
        for i, name in enumerate(self.names):
            ns = self._netns(name)
            leg, peer = f"ds{self.run}{name}0", f"ds{self.run}{name}1"
            _run(
                "ip", "link", "add", leg, "netns", ns, "type", "veth", "peer", "name", peer,
                "netns", sw,
            )  # fmt: skip
            _run("ip", "-n", ns, "link", "set", leg, "name", "eth0")
            host = Host(
                name=name,
                netns=ns,
                address=f"10.211.{n}.{11 + i}",
                unreachable=f"10.212.{n}.{11 + i}",
                hostname=f"host-{name}",
            )
            _run("ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", sw, "link", "set", peer, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{host.unreachable}/32", "dev", "lo")
            self.hosts[name] = host

    def stop(self) -> None:
        """Remove every namespace (their interfaces, routes and iptables rules go with them;
        deleting the switch removes the root namespace's veth leg too)."""
        for name in reversed(self._made):
            _run("ip", "netns", "del", name, check=False)
        self._made.clear()
        if _run("ip", "link", "show", self.root_if, check=False).returncode == 0:
            _run("ip", "link", "del", self.root_if, check=False)

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------------

    def exec(self, host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", self.hosts[host].netns, *cmd, check=check)

    def _iptables(self, host: str, action: str, rule: list[str]) -> None:
        self.exec(host, "iptables", "-w", action, *rule)

    def _cut_rules(self) -> list[list[str]]:
        return [
            ["OUTPUT", "-d", self.gateway, "-j", "DROP"],
            ["INPUT", "-s", self.gateway, "-j", "DROP"],
        ]

    def cut(self, host: str, how: str = "drop") -> None:
        """Cut ``host`` off: ``"drop"`` its traffic with the gateway (DynamoDB) is dropped
        both ways, silently; ``"link"`` its link is down (the other hosts are gone too)."""
        h = self.hosts[host]
        if how in h.cut:
            return
        if how == "drop":
            outgoing, incoming = self._cut_rules()
            self._iptables(host, "-I", outgoing)
            h.cut_at = time.monotonic()
            self._iptables(host, "-I", incoming)
        elif how == "link":
            _run("ip", "-n", h.netns, "link", "set", "eth0", "down")
            h.cut_at = time.monotonic()
        else:
            raise ValueError(f"how must be 'drop' or 'link', not {how!r}")
        h.cut.add(how)

    def heal(self, host: str, how: str | None = None) -> None:
        """Undo :meth:`cut` (``how=None``: every cut of the host)."""
        h = self.hosts[host]
        for kind in [how] if how else sorted(h.cut):
            if kind not in h.cut:
                continue
            if kind == "drop":
                for rule in self._cut_rules():
                    self._iptables(host, "-D", rule)
            else:
                _run("ip", "-n", h.netns, "link", "set", "eth0", "up")
            h.cut.discard(kind)

    def block_udp(self, host: str, blocked: bool = True) -> None:
        """Drop (or stop dropping) every UDP datagram into ``host`` from the subnet: pushes to
        waiters on that host are lost."""
        h = self.hosts[host]
        if blocked == h.udp_blocked:
            return
        rule = ["INPUT", "-p", "udp", "-s", self.subnet, "-j", "DROP"]
        self._iptables(host, "-I" if blocked else "-D", rule)
        h.udp_blocked = blocked

    def heal_all(self) -> None:
        for name in self.hosts:
            self.heal(name)
            self.block_udp(name, False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces of runs whose process is gone (a crashed run); their names."""
    removed = []
    listed = _run("ip", "netns", "list", check=False).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed
