"""Guarantees that had run on no unkind behaviour that could break them, now run on the unkind
engine (tests/support/unkind.py) with the behaviour that could: one leader at a time and
growing fences (in code and through ``dynasem_lead``), every coalesced caller covered by a
run that starts after it arrived, a hold given back in a transaction held until the commit,
one claim and one adoption of a unique task's key, while reads are stale and write answers
are lost; FIFO order of fair waiters while a share of requests and a hot partition key are
throttled; an operator's listing, break and reap while the index lags."""

from __future__ import annotations

import functools
import re
import threading
import time
from typing import Any

import pytest

from tests.storage.test_unkind import engine, local, on_engine
from tests.support.helpers import queue_of, wait_for
from tests.support.unkind import UnkindDynamoDB

__all__ = ["engine", "local", "on_engine"]  # fixtures, used by name

pytestmark = pytest.mark.dynamodb_local_only("the unkind engine stands in front of DynamoDB Local")

# Reads from replicas up to 2 s behind (most within a quarter of a second), a fifth of the
# write answers lost after the write applied (a 500, a closed connection, an answer later
# than the wait for it), a tenth of transactions cancelled for a conflict.
STALE_AND_LOST = {"stale": 2.0, "lost_share": 0.2, "lost_timeout": 0.3, "conflict_share": 0.1}


def counts(engine: UnkindDynamoDB) -> dict[str, int]:
    return dict(engine.stats()["counts"])


def lost_answers(engine: UnkindDynamoDB) -> int:
    return sum(n for what, n in counts(engine).items() if what.startswith("lost answer"))


def run_threads(target: Any, n: int, timeout: float = 60) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    return errors


# -- leader election ----------------------------------------------------------------------------


@pytest.mark.unkind("lag", STALE_AND_LOST)
def test_one_leader_at_a_time_and_fences_grow_while_reads_are_stale_and_answers_lost(
    on_engine: UnkindDynamoDB,
) -> None:
    from dynasem import leadership

    terms: list[tuple[float, float, int, int]] = []  # (began, ended, fence, contender)
    lost: list[int] = []

    def contend(i: int) -> None:
        for _ in range(4):
            with leadership("unkind", lease=5, on_lost=lambda _: lost.append(i)) as lead:
                began = time.monotonic()
                assert lead.active
                time.sleep(0.05)  # the leader's work, checked against lead.active
                assert lead.active
                terms.append((began, time.monotonic(), lead.fence, i))

    assert run_threads(contend, 4) == []
    assert lost == [] and len(terms) == 16
    terms.sort()
    for (_, ended, fence, _), (began, _, next_fence, _) in zip(terms, terms[1:], strict=False):
        assert began >= ended, "two leaders at once"
        assert next_fence > fence, "a later leader's fence is not larger"
    assert lost_answers(on_engine) >= 1


# -- coalesced re-runs ----------------------------------------------------------------------------


@pytest.mark.unkind("lag", STALE_AND_LOST)
def test_each_coalesced_caller_is_covered_by_a_later_run_while_reads_are_stale_and_answers_lost(
    on_engine: UnkindDynamoDB,
) -> None:
    """Each call names its own user. A Coalesced answer names the registered next run
    (``next_user_id``): if that one runs, it begins after the call arrived; it may not run
    (replaced as the next, itself coalesced, when the lock was taken since it registered, by
    a run that began after the call read the fence): some run begins after the call all the
    same."""
    from dynasem import Coalesced, semaphore

    runs: dict[str, tuple[float, float]] = {}  # user -> (began, ended)
    coalesced: list[tuple[str, float, str]] = []  # (user, arrived, covering user)
    lock = threading.Lock()

    def caller(i: int) -> None:
        for n in range(5):
            user = f"c{i}-{n}"
            arrived = time.monotonic()
            try:
                with semaphore("unkind:rebuild", coalesce=True, wait=30, lease=5, user=user):
                    began = time.monotonic()
                    time.sleep(0.15)  # the rebuild
                    with lock:
                        runs[user] = (began, time.monotonic())
            except Coalesced as answer:
                with lock:
                    coalesced.append((user, arrived, answer.next_user_id or ""))
                time.sleep(0.05)

    assert run_threads(caller, 5, timeout=120) == []
    assert coalesced, "no call was coalesced"
    for user, arrived, covering in coalesced:
        if covering in runs:
            assert runs[covering][0] > arrived, f"{user} counted on a run begun before it came"
        assert any(began > arrived for began, _ in runs.values()), f"{user}: no run after it"
    spans = sorted(runs.values())
    assert all(b >= a_end for (_, a_end), (b, _) in zip(spans, spans[1:], strict=False))
    assert lost_answers(on_engine) >= 1


# -- FIFO order -----------------------------------------------------------------------------------


def queued(resource: str) -> int:
    """How many wait in ``resource``'s line (0 when the test's own read is throttled)."""
    from dynasem import SemaphoreUnavailable

    try:
        return len(queue_of(resource))
    except SemaphoreUnavailable:
        return 0


@pytest.mark.unkind("throttle", {"throttle_share": 0.15, "partition_wcu": 20.0})
def test_fair_waiters_are_served_in_the_order_they_queued_while_throttled(
    on_engine: UnkindDynamoDB,
) -> None:
    from dynasem import semaphore

    served: list[int] = []

    def wait_in_line(i: int) -> None:
        with semaphore("unkind:line", fair=True, wait=45, lease=10):
            served.append(i)
            time.sleep(0.05)

    holder = semaphore("unkind:line", lease=10).acquire()
    threads = []
    for i in range(5):
        thread = threading.Thread(target=wait_in_line, args=(i,), daemon=True)
        threads.append(thread)
        thread.start()
        wait_for(lambda n=i + 1: queued("unkind:line") >= n, 30, "never queued")
    holder.release()
    for thread in threads:
        thread.join(60)
    assert served == list(range(5))
    throttles = {k: v for k, v in counts(on_engine).items() if k.startswith("throttled")}
    assert sum(throttles.values()) >= 3, throttles


# -- operators ------------------------------------------------------------------------------------


@pytest.mark.unkind("lag", {"stale": 3.0})
def test_a_hold_listed_from_a_lagging_index_and_given_back_is_not_broken_in_its_successor(
    on_engine: UnkindDynamoDB,
) -> None:
    """The operator's list comes from an index up to seconds behind: a hold in it may have
    been given back and the resource taken by another since. Breaking the listed hold
    breaks nothing; the one holding now keeps its hold; the resource's own page (one
    consistent read) shows who holds now, at once."""
    from dynasem import semaphore
    from dynasem._operators.locks import active_holds, break_hold, holds_on

    first = semaphore("unkind:op", lease=30).acquire()
    listed = wait_for(
        lambda: [h for h in active_holds() if h.token == first.token], 15, "never listed"
    )[0]
    first.release()
    second = semaphore("unkind:op", lease=30).acquire()
    assert [h.token for h in holds_on("unkind:op")] == [second.token]  # at once
    assert not break_hold("unkind:op", listed.token, fence=listed.fence)
    assert [h.token for h in holds_on("unkind:op")] == [second.token]
    second.renew()  # still ours
    second.release()


# Every version reaches the replicas (and the indexes) 1.5-2.5 s after its write: a read or an
# index query straight after a write misses it, always.
LAGGING = {"stale": 1.5, "spike": 2.5, "spike_share": 1.0}


def locks_json(*args: str) -> list[dict[str, Any]]:
    import io
    import json

    from django.core.management import call_command

    out = io.StringIO()
    call_command("dynasem_locks", *args, "--json", stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


@pytest.mark.unkind("lag", LAGGING)
def test_locks_of_one_resource_shows_its_row_permit_and_reader_holds_at_once_on_a_lagging_engine(
    on_engine: UnkindDynamoDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dynasem_locks RESOURCE`` reads one resource consistently: a hold taken (in the row,
    a permit item, a reader item) is shown at once, one given back is gone at once, while
    the list through the indexes does not show them yet."""
    from dynasem import semaphore
    from dynasem._storage import lock_writes, permit_items, reader_items

    monkeypatch.setattr(permit_items, "INLINE_MAX", 1)
    monkeypatch.setattr(lock_writes, "READERS_INLINE", 1)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 1)
    options: dict[str, dict[str, Any]] = {
        "lag:row": {},
        "lag:permits": {"limit": 3},
        "lag:readers": {"shared": True},
    }
    taken = {
        resource: [semaphore(resource, lease=30, **kw).acquire() for _ in range(n)]
        for (resource, kw), n in zip(options.items(), (1, 2, 3), strict=True)
    }
    for resource, holds in taken.items():
        shown = locks_json(resource)
        assert all(line["consistent"] for line in shown)
        assert sorted(line["token"] for line in shown) == sorted(h.token[:8] for h in holds)
    assert locks_json() == []  # the index has none of them yet
    for resource, holds in taken.items():
        for held in holds:
            held.release()
        assert locks_json(resource) == [], resource


# The index must still show the dead lease end on every replica when the reap reads it, a
# few seconds after the row was taken again (the take-over waits out the dead lease; the reap
# reads every shard through the engine's latency).
LAGGING_LONG = {"stale": 4.0, "spike": 5.0, "spike_share": 1.0}


@pytest.mark.unkind("lag", LAGGING_LONG)
def test_a_reap_that_finds_a_row_taken_again_listed_expired_in_a_lagging_index_keeps_it(
    on_engine: UnkindDynamoDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead holder's row, listed expired by the index; taken over, and the reap run while
    the index still lists it with the dead lease end: the reap keeps the live row (its
    delete is conditional on the row as it is) and says it changed since listed."""
    import io

    from django.core.management import call_command

    from dynasem import _clock as clock
    from dynasem import semaphore
    from dynasem._operators.locks import holds_on
    from dynasem._storage import index_queries, records
    from dynasem.testing import abandon

    dead = semaphore("lag:reaped", lease=1).acquire()
    abandon(dead)
    listed = lambda: any(  # noqa: E731
        e.resource == "lag:reaped"
        for s in range(records.SHARDS)
        for e in index_queries.query_expiring(s, since=0)[0]
    )
    wait_for(listed, 15, "the dead row never reached the index")
    # Every replica of the index has it (a query reads one of them, at random).
    wait_for(lambda: on_engine.stats()["replica_versions_pending"] == 0, 15, "replicas lag")
    # This process's clock past the dead lease's expires bucket, as a cron's reap is.
    monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + records.BUCKET_S + 60)
    retaken = semaphore("lag:reaped", lease=3 * records.BUCKET_S, wait=5).acquire()
    out = io.StringIO()
    call_command("dynasem_reap", stdout=out)
    assert [h.token for h in holds_on("lag:reaped")] == [retaken.token]
    assert "changed since the index listed it" in out.getvalue(), out.getvalue()
    retaken.renew()  # still ours
    retaken.release()


@pytest.mark.unkind("lag", STALE_AND_LOST)
def test_dynasem_lead_runs_one_command_at_a_time_while_reads_are_stale_and_answers_lost(
    on_engine: UnkindDynamoDB, lock_table: str, tmp_path: Any
) -> None:
    """Two ``dynasem_lead`` processes, each running a command that ends after 0.3 s (its
    lead given back then): each command starts after the one before ended, under a larger
    fence. (Few writes: a lost answer among them is likely, not certain.)"""
    from tests.background.test_lead import Leader, assert_one_at_a_time, runs

    log = tmp_path / "runs.log"
    leaders = [
        Leader(on_engine.endpoint_url, lock_table, log, LEAD_CHILD_EXIT_AFTER="0.3")
        for _ in range(2)
    ]
    try:
        for leader in leaders:
            assert leader.proc.wait(60) == 3, leader.said
    finally:
        for leader in leaders:
            leader.close()
    # A leader whose renewals went unanswered until its lead was ending stops its command
    # ("pid N stopped": SIGTERM, or its init's watchdog), competes again and runs it anew: one
    # run more for each stop it says.
    said = [leader.said for leader in leaders]
    stops = sum(len(re.findall(r"pid \d+ stopped", text)) for text in said)
    assert len(runs(log)) == 2 + stops, (runs(log), said)
    assert_one_at_a_time(runs(log))


# -- release after the commit -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.unkind("lag", STALE_AND_LOST)
def test_a_hold_given_back_in_a_transaction_is_held_until_the_commit_while_answers_are_lost(
    on_engine: UnkindDynamoDB,
) -> None:
    """Given back inside ``transaction.atomic`` the hold stays until the commit, then is
    free at once (its release applied, whatever became of its answer); a run_once DONE
    likewise lands with the commit."""
    from django.db import transaction

    from dynasem import AlreadyDone, run_once, semaphore
    from dynasem._storage import job_rows
    from tests.transactions.test_transactions import is_busy

    for i in range(6):
        with transaction.atomic():
            with semaphore("unkind:commit", lease=5, wait=10):
                pass
            assert is_busy("unkind:commit")
            with run_once(f"unkind:job{i}"):
                pass
            assert job_rows.get_job(f"unkind:job{i}").status == "RUNNING"  # type: ignore[union-attr]
        assert not is_busy("unkind:commit")
        with pytest.raises(AlreadyDone), run_once(f"unkind:job{i}"):
            pytest.fail("a DONE job must not run again")
    assert lost_answers(on_engine) >= 1


# -- unique tasks ---------------------------------------------------------------------------------


@pytest.mark.unkind("lag", STALE_AND_LOST)
def test_one_claim_of_a_unique_tasks_key_and_one_adoption_while_answers_are_lost(
    on_engine: UnkindDynamoDB,
) -> None:
    """Four enqueues of one key at once: one claims it (the others are told which task
    holds it), its worker adopts the claim once (a message delivered twice does not run
    again), and the key is free after the run."""
    from dynasem import LockLost
    from dynasem._background.unique import Claim, Taken, adopt, claim
    from dynasem._operators.locks import holds_on

    def enqueue(key: str, claims: list[Claim], taken: list[str | None], i: int) -> None:
        try:
            claims.append(claim(key, f"{key}-task{i}", queue_lease=30))
        except Taken as busy:
            taken.append(busy.task_id)

    for n in range(4):
        key = f"unkind:unique{n}"
        claims: list[Claim] = []
        taken: list[str | None] = []
        assert run_threads(functools.partial(enqueue, key, claims, taken), 4) == []
        assert len(claims) == 1 and len(taken) == 3, (claims, taken)
        assert set(taken) <= {claims[0].task_id}
        run = adopt(claims[0], lease=5)
        with pytest.raises(LockLost):
            adopt(claims[0], lease=5, wait=False)  # delivered twice
        assert [h.token for h in holds_on(key)] == [run.token]
        run.release()
        assert holds_on(key) == []
    assert lost_answers(on_engine) >= 1
