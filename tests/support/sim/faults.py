"""Which faults a run injects, drawn from its seed: a profile of rates, and the draws.

Faults happen during the first ``window`` virtual seconds only; after it the run is quiet,
so that liveness can be judged (every live waiter served, no lock left taken by the dead).
"""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class Profile:
    """Rates of faults: per process-second for crashes and stalls, per host-second for
    clock jumps, per request and per datagram for the network's."""

    window: float = 60.0  # virtual seconds with faults; none after
    crash_every: float = 0.0  # mean virtual seconds between crashes (0: none)
    stall_every: float = 0.0
    jump_every: float = 0.0
    partition_every: float = 0.0  # per run: a host cut off from DynamoDB for 0.5 s-2 leases
    long_stall_share: float = 0.5  # stalls longer than the lease (SIGSTOP, swapping)
    # Per block entered: a stall (a GC pause during the work) or a crash while holding, at a
    # moment drawn within the block (the moments that matter most).
    holder_stall: float = 0.0
    holder_crash: float = 0.0
    # Per answer to a write that reaches its process: a stall (or a crash) before the
    # process reads it.
    answer_stall: float = 0.0
    answer_crash: float = 0.0
    restart_after: tuple[float, float] = (0.5, 5.0)  # a crashed process's successor starts
    # Per request attempt: applied and its answer lost (the client's read timeout); lost on
    # its way (not applied; the read timeout too); never sent (connection refused);
    # throttled (not applied); a 500 before or after applying.
    lost: float = 0.0
    dropped: float = 0.0
    unsent: float = 0.0
    throttled: float = 0.0
    error_before: float = 0.0
    error_after: float = 0.0
    # Per answer to a write lost (``lost``): the host's return path stays broken for
    # ``deaf_for`` seconds (a half-open route, a NAT entry gone): its requests still apply,
    # every answer is lost.
    deaf_share: float = 0.0
    deaf_for: tuple[float, float] = (0.5, 50.0)
    # Per hand-over push (datagram): lost, sent twice, late.
    push_lost: float = 0.0
    push_twice: float = 0.0
    push_late: float = 0.0
    # An operator's ``dynasem_reap`` (cron), the whole run long: mean virtual seconds between
    # two reaps by a process of its own (0: none). And DynamoDB's TTL deleting an expired
    # item at most ``ttl_within`` seconds after its ``expires`` (0: the database profile's
    # own delay, up to 48 hours for AWS's, so that hardly any item is deleted in a run),
    # swept every ``TTL_SWEEP_SOON`` seconds then: a row or item gone between two writes.
    reap_every: float = 0.0
    ttl_within: float = 0.0
    # The expires index's bucket in seconds (0: the library's, 15 minutes, which hardly any
    # run reaches): a row is listed, and deletable, only once its bucket has passed.
    bucket: int = 0
    # Per acquisition, the share of processes that rest a while (``rest_for`` seconds) before
    # the next: resources left idle, their rows' leases over, so that there is something to
    # reap while others come back for them.
    rest_share: float = 0.0
    rest_for: tuple[float, float] = (10.0, 60.0)
    # Per acquisition (a lock's, a run_once's, a unique task's claim or adoption): a
    # KeyboardInterrupt thrown into it (tests.support.sim.interrupts): the caller's Ctrl-C.
    interrupt: float = 0.0

    def request_fault(self, rng: random.Random) -> str | None:
        """The fault of one request attempt, or None."""
        draw = rng.random()
        for name in ("lost", "dropped", "unsent", "throttled", "error_before", "error_after"):
            rate: float = getattr(self, name)
            if draw < rate:
                return name
            draw -= rate
        return None


PROFILES: dict[str, Profile] = {
    "none": Profile(),
    # Pauses only (a GC pause, SIGSTOP), at the moments that matter: inside a block, and
    # between a write's answer and its reading. For finding bugs of trust and time.
    "pauses": Profile(
        stall_every=20.0,
        long_stall_share=0.8,
        holder_stall=0.2,
        answer_stall=0.1,
    ),
    # Crashes only (with successors): for liveness (dead holders taken over in time).
    "crashes": Profile(
        crash_every=15.0,
        holder_crash=0.1,
        answer_crash=0.02,
    ),
    # Hosts cut off from DynamoDB (iptables DROP both ways) for up to two leases, their
    # processes running on: holders must stop trusting, the rest must take over.
    "partitions": Profile(partition_every=10.0),
    # Answers lost for up to 50 s from one lost write answer on (every attempt of botocore's retries
    # unanswered, its writes applied), with dynasem's default 60 s lease (``--lease 60``): a
    # release or hand-over that may have applied must not be taken for a loss. A fault window
    # long enough for a few such spells.
    "deaf": Profile(window=150.0, lost=0.05, deaf_share=0.5),
    "light": Profile(
        crash_every=40.0,
        stall_every=40.0,
        jump_every=30.0,
        lost=0.005,
        dropped=0.002,
        unsent=0.002,
        throttled=0.01,
        error_before=0.002,
        error_after=0.002,
        push_lost=0.05,
        push_twice=0.02,
        push_late=0.05,
        holder_stall=0.03,
        holder_crash=0.01,
        answer_stall=0.01,
        answer_crash=0.005,
    ),
    # Cleanup at its most eager: reaps every few seconds and TTL deleting within a few seconds
    # of expiry, beside pauses (a holder or taker stopped between its writes, past its lease)
    # and crashes (dead holders' rows, permits and reader items left to the reaper): nothing
    # a reap or TTL deletes may let a second holder in.
    "reaped": Profile(
        crash_every=20.0,
        stall_every=20.0,
        long_stall_share=0.5,
        holder_stall=0.1,
        holder_crash=0.05,
        answer_stall=0.05,
        answer_crash=0.01,
        reap_every=2.0,
        ttl_within=30.0,
        bucket=5,
        window=200.0,
        rest_share=0.6,
    ),
    # Ctrl-C in acquires, alone (every give-back answered: nothing may be left behind), and
    # beside the network's faults and stalls (a give-back that fails may leave a hold to its
    # lease). Any profile takes them with ``--interrupts``.
    "interrupts": Profile(interrupt=0.3),
    "interrupts_heavy": Profile(
        interrupt=0.2,
        stall_every=20.0,
        lost=0.02,
        dropped=0.005,
        unsent=0.005,
        throttled=0.03,
        error_before=0.005,
        error_after=0.005,
        push_lost=0.1,
        push_late=0.1,
        answer_stall=0.03,
    ),
    "heavy": Profile(
        crash_every=12.0,
        stall_every=12.0,
        jump_every=10.0,
        lost=0.03,
        dropped=0.01,
        unsent=0.01,
        throttled=0.05,
        error_before=0.01,
        error_after=0.01,
        push_lost=0.2,
        push_twice=0.1,
        push_late=0.2,
        holder_stall=0.1,
        holder_crash=0.03,
        answer_stall=0.04,
        answer_crash=0.01,
    ),
}


def arrivals(rng: random.Random, every: float, until: float) -> list[float]:
    """Times of a Poisson process of mean gap ``every`` in [0, ``until``)."""
    times: list[float] = []
    if every <= 0:
        return times
    t = rng.expovariate(1 / every)
    while t < until:
        times.append(t)
        t += rng.expovariate(1 / every)
    return times
