"""Multi-host soak: ``soak.py``'s workers and checks on three hosts, with partitions.

    .venv/bin/python benchmarks/soak_hosts.py [--per-host 5] [--seconds 300] [--lease 2]
        [--seed N] [--clock-offsets=-0.2,0,0.2]

Needs root: the hosts are Linux network namespaces (``tests/support/netns.py``) on a private subnet,
and ``iptables`` and ``faketime`` (installed with ``apt-get`` when missing). DynamoDB Local
runs in the root namespace and is reached by every host at the subnet's gateway address.
Each host runs ``--per-host`` of ``soak.py``'s worker processes (spawned, then moved into
the host's network namespace and a UTS namespace of its own name before anything else),
with ``DYNASEM["PUSH"]`` set to the host's address, so hand-overs between hosts are pushed
over UDP between namespaces; each host's wall clock is shifted by libfaketime by its entry
of ``--clock-offsets`` (default -0.2, 0, +0.2 s: 0.4 s apart at most, within the test
settings' CLOCK_SKEW of 0.5 s; the monotonic clock is left alone).

On top of soak.py's faults (each worker injects throttling, 5xx, connection errors, read
timeouts and lost responses into its own client; the parent SIGKILLs a worker every 2-5 s
and SIGSTOPs one for longer than the lease every 10-25 s), the parent cuts a host off every
4-10 s -- preferably one where a worker holds a lock at that moment -- for 0.25-2.5 leases,
then heals it:

* ``drop``: iptables DROP of everything between the host and DynamoDB's address, both ways
  (a silent black hole: requests hang until botocore's timeouts, TCP retransmits after);
* ``link``: the host's link down (DynamoDB and the other hosts are gone: new connections
  fail at once, established ones stall);

and every 15-30 s drops every UDP datagram into a host for 3-10 s (pushes lost: waiters fall
back to reads). One host is cut off at a time; UDP blocks come and go independently. One
hold in 100 lasts 1.2-2.5 leases (soak.py: one in 200), so that cuts land in holds that need
their renewals.

The checks are soak.py's (``soak.analyse``): trusted windows on CLOCK_MONOTONIC (one clock
for every namespace on the kernel, so windows of different hosts compare), fenced
read-modify-writes on files every host writes to (the storage stays reachable when
DynamoDB is not: the asymmetric partition a fence exists for), stuck locks after the reap,
fence order -- with the hosts' clock spread as slack where a lease end written by one host's
clock is read with another's. A partition does not cut a hold's trusted window: a holder
cut off goes on trusting its hold until its deadline, which is exactly what is checked. The
last lines sum up: holds, faults by kind, partitions, shared holds and reader-reader overlaps,
overlaps, lost updates, stuck locks, fence violations. Exit 1 if any check is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
for path in (str(REPO_ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import soak  # noqa: E402 - benchmarks/ is no package: found through sys.path

from tests.support import netns  # noqa: E402

PARTITION_EVERY = (4.0, 10.0)  # seconds between two cuts
PARTITION_LEASES = (0.25, 2.5)  # how long a cut lasts, in leases
UDP_EVERY = (15.0, 30.0)
UDP_FOR = (3.0, 10.0)
# One hold in 100 outlasts the lease (soak.py: one in 200), so more cuts land in a hold that
# must be renewed to go on.
LONG_CHANCE = 0.01


def host_worker_main(
    host_netns: str,
    hostname: str,
    push: str,
    cfg: dict[str, Any],
    slot: int,
    gen: int,
    seed: int,
    flags: Any,
) -> None:
    """soak.worker_main, on a host: its namespaces first (no thread or socket exists yet)."""
    netns.enter(host_netns, hostname)
    netns.sleep_despite_faketime()
    os.environ["DYNASEM_TEST_PUSH"] = push
    soak.worker_main(cfg, slot, gen, seed, flags)


class HostFleet(soak.Fleet):
    """soak.Fleet with its workers spread over hosts, and partitions."""

    def __init__(
        self,
        cfg: dict[str, Any],
        n: int,
        rng: random.Random,
        seed: int,
        network: netns.Network,
        offsets: dict[str, float],
        library: str | None,
    ):
        super().__init__(cfg, n, rng, seed)
        self.network = network
        self.names = list(network.hosts)
        self.offsets = offsets
        self.library = library
        self.cut: tuple[str, str, float, float] | None = None  # host, how, since, heal at
        self.partitions: list[dict[str, Any]] = []
        self.udp: dict[str, tuple[float, float]] = {}  # host -> since, unblock at
        self.udp_blocks: list[dict[str, Any]] = []
        self.next_cut = 0.0
        self.next_udp = 0.0

    def host_of(self, slot: int) -> netns.Host:
        return self.network.hosts[self.names[slot % len(self.names)]]

    def process_target(self, slot: int, gen: int, seed: int) -> tuple[Any, tuple[Any, ...]]:
        host = self.host_of(slot)
        args = (host.netns, host.hostname, host.address, self.cfg, slot, gen, seed, self.flags)
        return host_worker_main, args

    @contextlib.contextmanager
    def spawn_environment(self, slot: int) -> Any:
        offset = self.offsets[self.host_of(slot).name]
        if not offset or self.library is None:
            yield
            return
        extra = netns.faketime_env(self.library, offset)
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def tick(self, now: float) -> None:
        lease = self.cfg["lease"]
        if not self.next_cut:
            self.next_cut = now + self.rng.uniform(*PARTITION_EVERY)
            self.next_udp = now + self.rng.uniform(*UDP_EVERY)
        if self.cut is not None and now >= self.cut[3]:
            name, how, since, _ = self.cut
            self.network.heal(name, how)
            self.partitions[-1]["healed"] = time.monotonic()
            self.cut = None
            self.next_cut = time.monotonic() + self.rng.uniform(*PARTITION_EVERY)
        elif self.cut is None and now >= self.next_cut:
            holding = sorted({self.host_of(s).name for s in self.procs if self.flags[s]})
            name = self.rng.choice(holding or self.names)
            how = self.rng.choice(("drop", "link"))
            self.network.cut(name, how)
            since = time.monotonic()
            self.cut = (name, how, since, since + self.rng.uniform(*PARTITION_LEASES) * lease)
            self.partitions.append(
                {"host": name, "how": how, "since": since, "holder": bool(holding)}
            )
        for name, (_, until) in list(self.udp.items()):
            if now >= until:
                self.network.block_udp(name, False)
                del self.udp[name]
        if now >= self.next_udp:
            name = self.rng.choice(self.names)
            if name not in self.udp:
                self.network.block_udp(name, True)
                self.udp[name] = (now, now + self.rng.uniform(*UDP_FOR))
                self.udp_blocks.append({"host": name, "since": now})
            self.next_udp = now + self.rng.uniform(*UDP_EVERY)

    def progress(self) -> str:
        return f"  partitions {len(self.partitions)}  UDP blocks {len(self.udp_blocks)}"

    def heal_all(self) -> None:
        if self.cut is not None:
            self.partitions[-1]["healed"] = time.monotonic()
            self.cut = None
        self.udp.clear()
        self.network.heal_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-host", type=int, default=5, help="worker processes per host")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--resources", type=int, default=3)
    soak.add_shared_share(parser)
    soak.add_counting(parser)
    soak.add_unkind(parser)
    parser.add_argument("--think", type=float, default=0.1, help="max pause between holds (s)")
    parser.add_argument("--nice", type=int, default=5, help="niceness of the workers")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads per worker, taking turns like workers"
    )
    parser.add_argument(
        "--clock-offsets",
        default="-0.2,0,0.2",
        help="wall-clock shift of hosts a, b, c in seconds (libfaketime)",
    )
    parser.add_argument("--workdir", default=None, help="keep logs and files here")
    parser.add_argument("--keep", action="store_true", help="keep the workdir even on success")
    args = parser.parse_args(argv)
    counting = soak.counting_cfg(args)

    reason = netns.problem()
    if reason is not None:
        print(f"soak_hosts: cannot make hosts here: {reason}", file=sys.stderr)
        return 2
    try:
        netns.ensure_tool("iptables", "iptables")
        offsets = dict(zip("abc", (float(x) for x in args.clock_offsets.split(",")), strict=True))
        library = netns.ensure_libfaketime() if any(offsets.values()) else None
    except (LookupError, ValueError) as exc:
        print(f"soak_hosts: {exc}", file=sys.stderr)
        return 2
    spread = max(offsets.values()) - min(offsets.values())

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    workdir = args.workdir or tempfile.mkdtemp(prefix="dynasem-soak-hosts-")
    for sub in ("logs", "data"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    resources = [f"soak:{i}" for i in range(args.resources)]
    for i in range(len(resources + soak.counting_resources(counting))):
        Path(soak.data_path(workdir, i)).write_text("")
        Path(soak.data_path(workdir, i) + ".hw").write_text("0".rjust(soak.HW_WIDTH))
    processes = 3 * args.per_host

    from tests.support.workers import setup_django

    print(
        f"soak_hosts: 3 hosts x {args.per_host} processes x {args.seconds:g} s, lease "
        f"{args.lease:g} s, {len(resources)} resources, seed {seed}, workdir {workdir}",
        flush=True,
    )
    print(f"soak_hosts: machine: {soak.machine()}", flush=True)
    digest = soak.source_digest()
    print(f"soak_hosts: dynasem source digest {digest}", flush=True)
    with (
        soak.engine(args.unkind, seed, workdir) as (endpoint, unkind),
        netns.Network(("a", "b", "c")) as network,
    ):
        port = endpoint.rpartition(":")[2]
        shown = ", ".join(
            f"{h.name} {h.address} clock {offsets[h.name]:+g} s" for h in network.hosts.values()
        )
        print(f"soak_hosts: hosts {shown}; DynamoDB at {network.gateway}:{port}", flush=True)
        table_name = f"soak-{uuid.uuid4().hex[:8]}"
        setup_django(endpoint, table_name)  # this process: the root namespace
        from django.core.management import call_command

        from dynasem.conf import settings

        skew = float(settings.CLOCK_SKEW)
        if spread >= skew:
            print(
                f"soak_hosts: WARNING: clocks {spread:g} s apart, CLOCK_SKEW is {skew:g} s",
                flush=True,
            )
        call_command("dynasem_createtable", "--wait", stdout=io.StringIO())
        cfg = {
            "endpoint": f"http://{network.gateway}:{port}",
            "table": table_name,
            "workdir": workdir,
            "lease": args.lease,
            "resources": resources,
            "think": args.think,
            "nice": args.nice,
            "long_chance": LONG_CHANCE,
            "shared_share": args.shared_share,
            "counting": counting,
            "threads": args.threads,
        }
        fleet = HostFleet(cfg, processes, rng, seed, network, offsets, library)
        t0 = time.monotonic()
        try:
            fleet.run(args.seconds, args.lease, skew, progress=True)
            fleet.heal_all()
            fleet.shutdown(grace=max(soak.WAITS) + 3 * args.lease + 40)
        finally:
            fleet.heal_all()
            fleet.kill_all()
        ran = time.monotonic() - t0
        reap_said, stuck = soak.finish_table(table_name, args.lease, skew, unkind)

    result = soak.analyse(
        fleet,
        workdir,
        resources,
        args.lease,
        skew,
        ran=ran,
        table_name=table_name,
        digest=digest,
        reap_said=reap_said,
        stuck=stuck,
        slack=spread,
        counting=counting,
    )
    kinds = Counter(p["how"] for p in fleet.partitions)
    with_holder = sum(p["holder"] for p in fleet.partitions)
    lasted = [p["healed"] - p["since"] for p in fleet.partitions if "healed" in p]
    print(
        f"holds: {result['completed']}  faults by kind: {result['fault_detail']} "
        f"(total {result['fault_total']})  kills: {result['kills']}  stops: {result['stops']}"
    )
    print(
        f"partitions: {len(fleet.partitions)} (iptables DROP {kinds['drop']}, link down "
        f"{kinds['link']}; {with_holder} of a host with a worker inside a hold; "
        f"{min(lasted, default=0):.1f}-{max(lasted, default=0):.1f} s, all healed)  "
        f"UDP blocks: {len(fleet.udp_blocks)}"
    )
    print(soak.shared_line(result))
    print(f"overlaps: {result['overlaps']} (exclusive-vs-shared {result['overlaps_mixed']})")
    print(f"lost updates: {result['lost_updates']}")
    print(f"stuck locks after reap: {result['stuck']}")
    print(f"fence violations: {result['fence_violations']}")
    soak.keep_or_remove(workdir, result["failed"], args.keep or bool(args.workdir))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
