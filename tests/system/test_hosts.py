"""Several hosts on one machine: partitions, clock skew and cross-host hand-overs.

Every host is a Linux network namespace of its own (``tests/support/netns.py``: a private subnet,
its own address, hostname and iptables rules) running an agent process
(``tests/support/host_agent.py``) that takes dynasem locks on the suite's DynamoDB Local, reached
through the root namespace's address on the subnet. ``PUSH`` is each host's own address. A
host's wall clock is shifted with Debian's libfaketime (``LD_PRELOAD``, ``FAKETIME=±s``,
``DONT_FAKE_MONOTONIC=1``: the monotonic clock stays the kernel's, one clock for every
namespace, so the test compares monotonic timestamps taken on different hosts).

Cut-offs: iptables DROP between a host and DynamoDB's address (a silent black hole), or the
host's link down. iptables and faketime are installed with apt-get when missing; the tests
that need them are skipped, saying why, where that is impossible, and the whole module where
namespaces cannot be made (not root, no ``ip netns``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dynasem._engine import push as wakeup
from dynasem._operators.locks import holds_on
from dynasem._storage import lock_rows, records
from dynasem.conf import settings
from tests.support import netns
from tests.support.helpers import queue_of
from tests.support.host_agent import Agent

LEASE = 2.0  # seconds: short leases keep the module fast; CLOCK_SKEW is the settings' 0.5 s


def skew() -> float:
    return float(settings.CLOCK_SKEW)


# ---------------------------------------------------------------------------------------------
# Fixtures: the hosts, the tools, the agents
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def libfaketime() -> str:
    try:
        return netns.ensure_libfaketime()
    except LookupError as exc:
        pytest.skip(str(exc))


def gateway_endpoint(network: netns.Network, dynamodb_local: str) -> str:
    return f"http://{network.gateway}:{urlsplit(dynamodb_local).port}"


def start_agents(
    network: netns.Network,
    endpoint: str,
    table_name: str,
    logs: Path,
    offsets: dict[str, float] | None = None,
    library: str | None = None,
) -> dict[str, Agent]:
    """An agent on each host (on the hosts of ``offsets`` only, their wall clocks shifted)."""
    names = list(offsets) if offsets is not None else list(network.hosts)
    agents: dict[str, Agent] = {}
    try:
        for name in names:
            host = network.hosts[name]
            env = None
            if offsets is not None:
                assert library is not None
                env = netns.faketime_env(library, offsets[name])
            agents[name] = Agent(
                host,
                endpoint=endpoint,
                table=table_name,
                push=host.address,
                log_path=logs / f"{name}-{time.monotonic_ns()}.log",
                env=env,
            )
        for agent in agents.values():  # they start in parallel
            agent.wait_ready()
    except BaseException:
        for agent in agents.values():
            agent.close()
        raise
    return agents


@pytest.fixture(scope="module")
def agents(
    network: netns.Network, dynamodb_local: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Agent]]:
    made = start_agents(
        network,
        gateway_endpoint(network, dynamodb_local),
        "configured-per-test",
        tmp_path_factory.mktemp("hosts"),
    )
    try:
        yield made
    finally:
        for agent in made.values():
            agent.close()


@pytest.fixture
def hosts(
    network: netns.Network, agents: dict[str, Agent], lock_table: str
) -> Iterator[dict[str, Agent]]:
    """The module's agents, pointed at this test's table; every cut healed afterwards."""
    for agent in agents.values():
        agent.call("configure", table=lock_table, push=agent.host.address, patient=False)
    try:
        yield agents
    finally:
        network.heal_all()


def wall_offset(agent: Agent) -> float:
    """How far the agent's wall clock is from ours, through the monotonic clock both share."""
    mine_wall, mine_mono = time.time(), time.monotonic()
    theirs = agent.call("clock")
    return (theirs["wall"] - theirs["mono"]) - (mine_wall - mine_mono)


@pytest.fixture
def skewed(
    network: netns.Network,
    dynamodb_local: str,
    lock_table: str,
    libfaketime: str,
    tmp_path: Path,
) -> Iterator[Callable[[dict[str, float]], dict[str, Agent]]]:
    """``skewed({"a": -0.25, ...})``: agents on those hosts whose wall clocks are shifted by
    libfaketime by that many seconds (checked against ours)."""
    started: list[Agent] = []

    def start(offsets: dict[str, float]) -> dict[str, Agent]:
        made = start_agents(
            network,
            gateway_endpoint(network, dynamodb_local),
            lock_table,
            tmp_path,
            offsets,
            libfaketime,
        )
        started.extend(made.values())
        for name, agent in made.items():
            measured = wall_offset(agent)
            assert abs(measured - offsets[name]) < 0.05, (name, measured, offsets[name])
        return made

    try:
        yield start
    finally:
        for agent in started:
            agent.close()


def queued(resource: str, timeout: float = 20) -> tuple[str, dict[str, Any]]:
    """The first waiter queued for ``resource``: (token, entry as stored)."""
    deadline = time.monotonic() + timeout
    while True:
        queue = queue_of(resource)
        if queue:
            first = min(queue.values(), key=lambda w: w.ticket)
            return first.token, records.to_item(first)
        assert time.monotonic() < deadline, f"nobody queued for {resource!r}"
        time.sleep(0.02)


def listener(entry: dict[str, Any]) -> tuple[str, int]:
    """(address, port) a waiter recorded for pushes."""
    _, _, hostport = entry["n"].partition("@")
    address, _, port = hostport.rpartition(":")
    return address, int(port)


def report(name: str, **figures: Any) -> None:
    """Figures for docs/RELIABILITY.md and the README (``pytest -s`` shows them)."""
    shown = ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
    )
    print(f"\n[hosts] {name}: {shown}")


# ---------------------------------------------------------------------------------------------
# Partition: a holder cut off from DynamoDB mid-hold
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["drop", "link"])
def test_a_holder_cut_off_from_dynamodb_stops_trusting_before_another_host_takes_over(
    network: netns.Network, hosts: dict[str, Agent], how: str, request: pytest.FixtureRequest
) -> None:
    """A holds and is cut off from DynamoDB mid-hold (iptables DROP both ways, or its link
    down). A's code, checking ``held.lost``, learns the loss no later than its trusted
    deadline; B, waiting on another host, takes the lock only once the stored lease end plus
    CLOCK_SKEW has passed on its clock, with a larger fence; when A's link heals, A's fenced
    write is refused, its block exit raises LockLost and B's hold stays."""
    if how == "drop":
        request.getfixturevalue("iptables")
    a, b = hosts["a"], hosts["b"]
    resource = f"doc:{how}"
    took = a.call("acquire", id="A", resource=resource, lease=LEASE, wait=5)
    a.call("watch", id="A")
    time.sleep(0.8)  # mid-hold: the heartbeat has renewed once or twice
    network.cut("a", how)
    cut = time.monotonic()
    time.sleep(0.3)  # a request already on its way lands, or is lost, meanwhile
    stored = (lock_rows.get_item(resource) or {})["holders"][took["token"]]
    waiting = b.send("acquire", id="B", resource=resource, lease=LEASE, wait=LEASE + 15)
    lost = a.event("lost", timeout=LEASE + 15)
    got = b.reply(waiting, timeout=LEASE + 30)
    assert "error" not in got, got

    # A learned it no later than its deadline (held.lost flips at it; polled every 5 ms),
    # and the lock_lost signal came before B held.
    assert lost["last_trusted"] < lost["deadline"] <= lost["first_lost"]
    assert lost["first_lost"] - lost["deadline"] < 0.5, lost
    # renew() says LockLost at once, not after the hung renewal's timeouts (tens of seconds).
    assert lost["renew_raised"] == "LockLost", lost
    assert lost["renew_answered"] - lost["first_lost"] < 0.5, lost
    assert lost["signalled"] is not None and lost["signalled"] < got["start"]
    # B only after the stored lease end + CLOCK_SKEW (its clock), with a larger fence.
    assert got["wall"] >= int(stored["e"]) / 1000 + skew()
    assert got["fence"] > took["fence"]
    # No overlap: A's trusted hold ended before B's began.
    assert lost["deadline"] < got["start"]
    assert b.call("fenced_put", id="B", key=resource)["result"] == "accepted"

    network.heal("a", how)
    healed = time.monotonic()
    assert a.call("fenced_put", id="A", key=resource, timeout=90)["result"] == "refused"
    exited = a.reply(a.send("release", id="A"), timeout=90)
    assert exited.get("error") == "LockLost", exited
    released = time.monotonic()
    assert [h.token for h in holds_on(resource)] == [got["token"]]  # B's hold stays
    b.call("release", id="B")
    report(
        f"partition ({how})",
        deadline_after_cut=lost["deadline"] - cut,
        loss_seen_after_deadline=lost["first_lost"] - lost["deadline"],
        signal_after_deadline=lost["signalled"] - lost["deadline"],
        takeover_after_deadline=got["start"] - lost["deadline"],
        takeover_wall_past_end_plus_skew=got["wall"] - int(stored["e"]) / 1000 - skew(),
        a_exit_after_heal=released - healed,
    )


# ---------------------------------------------------------------------------------------------
# Cross-host hand-overs: pushes between hosts
# ---------------------------------------------------------------------------------------------


def test_a_waiter_on_another_host_is_handed_the_lock_by_push(hosts: dict[str, Agent]) -> None:
    """With PUSH set to each host's address, A's release hands the lock to B's queued waiter
    and pushes it the item: B holds with no read (its paced looks are 20 s away here)."""
    a, b = hosts["a"], hosts["b"]
    assert a.ready["host_id"] != b.ready["host_id"]  # two hosts, as dynasem sees them
    b.call("configure", patient=True)
    held = a.call("acquire", id="H", resource="deploy:prod", lease=5)
    waiting = b.send("acquire", id="W", resource="deploy:prod", lease=5, wait=30)
    _, entry = queued("deploy:prod")
    assert listener(entry)[0] == b.host.address
    a.call("renew", id="H")  # its answer shows A the queue: the release hands over
    released = a.call("release", id="H")
    assert released["pushes"] == [{"to": entry["n"], "resource": "deploy:prod", "sent": True}]
    got = b.reply(waiting, timeout=15)
    assert "error" not in got, got
    assert got["pushed"] and got["calls"].get("GetItem", 0) == 0, got
    assert got["fence"] > held["fence"]
    assert got["start"] > released["sent"]
    b.call("release", id="W")
    report(
        "cross-host push",
        release_to_hold=got["start"] - released["sent"],
        waiter_requests=got["calls"],
    )


@pytest.mark.parametrize("where", ["loopback", "no-route"])
def test_a_push_that_cannot_reach_the_waiter_falls_back_to_reads(
    hosts: dict[str, Agent], where: str
) -> None:
    """B records a push address A cannot reach: the default loopback (A sees another host's
    127.0.0.1 and does not send), or an address A has no route to (the send fails). B learns
    of the hand-over by its paced reads, and holds all the same."""
    a, b = hosts["a"], hosts["b"]
    b.call("configure", push="127.0.0.1" if where == "loopback" else b.host.unreachable)
    resource = f"deploy:{where}"
    held = a.call("acquire", id="H", resource=resource, lease=5)
    waiting = b.send("acquire", id="W", resource=resource, lease=5, wait=30)
    _, entry = queued(resource)
    a.call("renew", id="H")
    released = a.call("release", id="H")
    assert released["pushes"] == [{"to": entry["n"], "resource": resource, "sent": False}]
    got = b.reply(waiting, timeout=30)
    assert "error" not in got, got
    assert not got["pushed"] and got["calls"].get("GetItem", 0) >= 1, got
    assert got["fence"] > held["fence"]
    assert got["start"] > released["sent"]
    b.call("release", id="W")
    report(
        f"unreachable push ({where})",
        release_to_hold=got["start"] - released["sent"],
        waiter_requests=got["calls"],
    )


def test_a_forged_push_from_a_third_host_is_ignored(
    hosts: dict[str, Agent], lock_table: str
) -> None:
    """C, a third host signing with another SECRET_KEY, pushes B's waiter a hand-over that
    never happened. B drops it (and says so), keeps waiting, and is handed the lock for real
    when A releases."""
    a, b, c = hosts["a"], hosts["b"], hosts["c"]
    b.call("configure", patient=True)  # B can take the lock from a push only
    b.call("warnings")
    held = a.call("acquire", id="H", resource="deploy:qa", lease=5)
    waiting = b.send("acquire", id="W", resource="deploy:qa", lease=5, wait=30)
    token, entry = queued("deploy:qa")
    address, port = listener(entry)
    item = lock_rows.get_item("deploy:qa") or {}
    now_ms = int(time.time() * 1000)
    forged_fence = held["fence"] + 10**9
    item["holders"] = {token: {"u": "W", "e": now_ms + 4000, "f": forged_fence, "a": now_ms}}
    message = {"r": "deploy:qa", "k": token, "i": item, "tb": lock_table, "ts": now_ms}
    body = json.dumps(message, separators=(",", ":")).encode()
    key = wakeup._derive("another project's SECRET_KEY")  # exactly as dynasem derives its key
    datagram = hmac.new(key, body, hashlib.sha256).digest() + body
    c.call("udp", host=address, port=port, data=base64.b64encode(datagram).decode())
    time.sleep(1.0)
    assert not b.answered(waiting), "B took the lock on a forged push"
    warned = b.call("warnings")["warnings"]
    assert any("signature matches neither SECRET_KEY" in w for w in warned), warned
    stored = lock_rows.get_item("deploy:qa") or {}
    assert list(stored["holders"]) == [held["token"]] and token in queue_of("deploy:qa")
    released = a.call("release", id="H")  # A had not renewed: a plain release wakes B
    got = b.reply(waiting, timeout=15)
    assert "error" not in got, got
    assert got["pushed"] and got["start"] > released["sent"]
    assert held["fence"] < got["fence"] < forged_fence
    b.call("release", id="W")


def test_a_blocked_push_port_costs_latency_not_correctness(
    network: netns.Network, hosts: dict[str, Agent], iptables: str
) -> None:
    """A and B take turns on one lock (each queues while the other holds): with UDP open
    between them; with every datagram into either host dropped from the start (a firewall
    that was never opened); and dropped on a lock whose hand-overs were being pushed until
    then. Blocked, no push arrives and each waiter learns of its hand-over by reading, a
    little later (at most PUSH_PATIENCE later while pushes had been arriving); every hold is
    still alone and fences still grow."""
    a, b = hosts["a"], hosts["b"]
    rounds, hold = 8, 0.05
    figures: dict[str, dict[str, Any]] = {}
    for phase, resource, blocked in (
        ("open", "turns:1", False),
        ("blocked from the start", "turns:2", True),
        ("blocked after pushes came", "turns:1", True),
    ):
        network.block_udp("a", blocked)
        network.block_udp("b", blocked)
        sent = [
            agent.send(
                "loop", resource=resource, rounds=rounds, hold=hold, lease=3, wait=30, user=name
            )
            for name, agent in (("A", a), ("B", b))
        ]
        holds: list[dict[str, Any]] = []
        for agent, rid in zip((a, b), sent, strict=True):
            answer = agent.reply(rid, timeout=120)
            assert "error" not in answer, answer
            holds += answer["holds"]
        assert len(holds) == 2 * rounds
        holds.sort(key=lambda h: h["start"])
        for before, after in zip(holds, holds[1:], strict=False):
            assert after["start"] > before["end"], (phase, before, after)  # never two at once
            assert after["fence"] > before["fence"], (phase, before, after)
        handovers = [
            after["start"] - before["end"]
            for before, after in zip(holds, holds[1:], strict=False)
            if after["user"] != before["user"]
        ]
        figures[phase] = {
            "hand-overs": len(handovers),
            "median_gap": statistics.median(handovers) if handovers else float("nan"),
            "max_gap": max(handovers, default=float("nan")),
            "pushed": sum(h["pushed"] for h in holds),
            "reads_per_hold": sum(h["calls"].get("GetItem", 0) for h in holds) / len(holds),
            "writes_per_hold": sum(h["calls"].get("UpdateItem", 0) for h in holds) / len(holds),
        }
    network.block_udp("a", False)
    network.block_udp("b", False)
    assert figures["open"]["pushed"] > 0
    for phase in ("blocked from the start", "blocked after pushes came"):
        assert figures[phase]["pushed"] == 0 and figures[phase]["reads_per_hold"] > 0
    for phase, values in figures.items():
        report(f"turns, UDP {phase}", **values)


# ---------------------------------------------------------------------------------------------
# Clock skew: hosts whose wall clocks disagree
# ---------------------------------------------------------------------------------------------


def reap_row(reaper: Agent, resource: str, timeout: float = 20) -> float:
    """Reap from ``reaper`` (its clock decides) until ``resource``'s row is gone."""
    deadline = time.monotonic() + timeout
    while lock_rows.get_item(resource) is not None:
        assert time.monotonic() < deadline, f"{resource!r} was never reaped"
        reaper.call("reap")
        time.sleep(0.1)
    return time.monotonic()


def takeover_gap(
    holder: Agent, taker: Agent, resource: str, lease: float = LEASE
) -> tuple[float, int, int]:
    """``holder`` takes ``resource`` for ``lease`` and hangs (no renewal, no release);
    ``taker`` waits and takes it over. Returns (taker's start - holder's trusted deadline, both
    fences)."""
    took = holder.call("acquire", id=resource, resource=resource, lease=lease)
    hung = holder.call("abandon", id=resource)
    over = taker.call("acquire", id=resource, resource=resource, lease=LEASE, wait=lease + 10)
    taker.call("release", id=resource)
    return over["start"] - hung["deadline"], took["fence"], over["fence"]


def test_hosts_whose_clocks_disagree_by_clock_skew_never_hold_at_once(
    skewed: Callable[[dict[str, float]], dict[str, Agent]],
) -> None:
    """Wall clocks: A half of CLOCK_SKEW behind, B half ahead (they disagree by CLOCK_SKEW), C
    right. A taker ahead of a hung holder, a hand-over written by the host behind and taken
    over by the host ahead, and fences across a reap done by the host ahead then a take by
    the host behind: never two trusted holds at once, fences always larger."""
    half = skew() / 2
    hosts = skewed({"a": -half, "b": half, "c": 0.0})
    a, b, c = hosts["a"], hosts["b"], hosts["c"]

    # A hangs holding (its clock wrote the lease end); B, ahead, takes over.
    gap, fence_a, fence_b = takeover_gap(a, b, "skew:takeover")
    assert gap > 0 and fence_b > fence_a

    # A (behind) hands the lock to C's waiter, whose hold C then hangs on; B (ahead) takes over.
    # H's own lease is longer: it must outlast C's queuing and our look at the queue, which
    # on a saturated CI machine (simulate beside the suite) once took past 1.5 s (ci50).
    held = a.call("acquire", id="H", resource="skew:hand-over", lease=3 * LEASE)
    waiting = c.send("acquire", id="W", resource="skew:hand-over", lease=LEASE, wait=30)
    queued("skew:hand-over")
    a.call("renew", id="H")
    released = a.call("release", id="H")
    handed = c.reply(waiting, timeout=15)
    assert "error" not in handed, handed
    assert handed["start"] > released["sent"] and handed["fence"] > held["fence"]
    hung = c.call("abandon", id="W")
    over = b.call("acquire", id="X", resource="skew:hand-over", lease=LEASE, wait=LEASE + 10)
    b.call("release", id="X")
    hand_over_gap = over["start"] - hung["deadline"]
    assert hand_over_gap > 0 and over["fence"] > handed["fence"]

    # B (ahead) holds, releases and reaps the row as soon as its clock lets it; A (behind)
    # takes the resource again: its fence, made from its own clock, is still larger.
    before = b.call("acquire", id="R", resource="skew:reap", lease=LEASE)
    b.call("release", id="R")
    reap_row(b, "skew:reap")
    after = a.call("acquire", id="R", resource="skew:reap", lease=LEASE)
    a.call("release", id="R")
    assert after["fence"] > before["fence"]
    report(
        f"clock skew within CLOCK_SKEW ({skew():g} s apart)",
        takeover_gap=gap,
        hand_over_takeover_gap=hand_over_gap,
        fence_margin_after_reap_s=(after["fence"] - before["fence"]) / 1e6,
    )


def test_beyond_clock_skew_holds_overlap_and_fences_go_back(
    skewed: Callable[[dict[str, float]], dict[str, Agent]],
) -> None:
    """The documented limit, shown: CLOCK_SKEW is a promise the operator makes about the
    clocks. A 3 s behind and B 3 s ahead (6 s apart, twelve times CLOCK_SKEW), A's lease 8 s:
    B takes over a lease A still trusts for 5 s more, so two trusted holds overlap (what is
    left of A's trust when B's take-over comes, the agents' round trips included: with A's
    2 s lease they took 3.8 s in a CI run on a saturated machine). B reaping with its clock
    ahead and C, 5 s behind, taking the resource again: C's fence is smaller than the
    reaped row's (the reap itself takes 2.5-4.5 s: the lease, the 1 s bucket, the skew and the
    reaper's rounding; C 3 s behind, 4 s from B, left the violation to luck). (Up to
    2 x CLOCK_SKEW apart, the holder's lease - CLOCK_SKEW and the taker's lease + CLOCK_SKEW
    still keep holds apart; the reaper's whole-second rounding adds 1-2 s to that for fences.
    Nothing is promised past CLOCK_SKEW.)"""
    hosts = skewed({"a": -3.0, "b": 3.0, "c": -5.0})
    a, b, c = hosts["a"], hosts["b"], hosts["c"]
    gap, fence_a, fence_b = takeover_gap(a, b, "limit:takeover", lease=8.0)
    assert gap < 0, f"B took over {gap:.3f} s after A's trusted deadline: no overlap shown"
    assert fence_b > fence_a  # the row was there: fences count on from the stored one

    # A short lease: a released row is found by the reaper once the expires bucket of its
    # lease end has passed (1 s buckets on these hosts), so the lease decides when it can go.
    before = b.call("acquire", id="R", resource="limit:reap", lease=1.0)
    b.call("abandon", id="R")  # (a release may come after its 0.5 s of trust on a busy machine)
    reap_row(b, "limit:reap")
    after = c.call("acquire", id="R", resource="limit:reap", lease=LEASE)
    c.call("release", id="R")
    assert after["fence"] < before["fence"], "fences did not go back: no violation shown"
    report(
        "clock skew beyond CLOCK_SKEW",
        overlap_of_trusted_holds=-gap,
        fence_went_back_by_s=(before["fence"] - after["fence"]) / 1e6,
    )
