"""Review 35 (time and trust): where a deadline or a lease is computed, trusted, extended or
compared. Each test fails on the code it was written against."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import pytest

from dynasem import LockLost, SemaphoreBusy, run_once, semaphore
from dynasem._engine.core import CONFIRM_SHARE
from dynasem._storage import dynamodb, lock_rows
from dynasem.testing import abandon

pytestmark = pytest.mark.django_db(transaction=False)

LEASE = 2.0
SKEW = 0.5  # tests/conftest.py's CLOCK_SKEW
MARGIN = (LEASE - SKEW) * CONFIRM_SHARE
# Late by less than the trusted window but by more than its last third.
NEARLY = (LEASE - SKEW) * (1 - CONFIRM_SHARE) + 0.2


class LateJobAnswers:
    """The answer of the first ``times`` successful run_once writes that ``match`` (their
    JSON body) comes back ``delay`` seconds after DynamoDB applied them: a host cut off
    between its write and the answer (botocore's ``needs-retry`` event follows each answer)."""

    def __init__(self, match: Any, delay: float, times: int = 1) -> None:
        self.match, self.delay, self.remaining, self.fired = match, delay, times, 0
        self._lock = threading.Lock()
        self.client = dynamodb.get_client()

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        if response is None or response[0].status_code != 200:
            return
        body = json.loads(request_dict["body"] or b"{}")
        with self._lock:
            if self.remaining <= 0 or not self.match(body):
                return
            self.remaining -= 1
            self.fired += 1
        time.sleep(self.delay)

    def __enter__(self) -> LateJobAnswers:
        self.client.meta.events.register("needs-retry.dynamodb.UpdateItem", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("needs-retry.dynamodb.UpdateItem", self._hook)


def job_claim(body: dict[str, Any]) -> bool:
    return "#attempt" in body.get("UpdateExpression", "")


def job_renewal(body: dict[str, Any]) -> bool:
    return body.get("UpdateExpression") == "SET #expMs = :e"


# -- run_once: a claim answered late begins its body with almost no trust -----------------------


def test_a_run_once_claim_answered_late_is_confirmed_before_its_body(lock_table: str) -> None:
    """The claim was applied, its answer came NEARLY a whole trusted window later (a host cut
    off from DynamoDB between its write and the answer). An acquire (core.CONFIRM_SHARE) and a
    unique task's adoption (unique._renewed) confirm such a hold with a renewal of their own
    when less than a third of ``lease - CLOCK_SKEW`` is left; ``run_once`` confirmed it only
    once nothing was left (``job.seconds_left() > 0``), so the body began with 0.3 s of trust:
    the heartbeat's first renewal, answered a little late too (the same network), came after
    that, the job was lost under its running body, and another process may claim it and run
    the body beside it once the stored lease runs out, though every write was applied."""
    with LateJobAnswers(job_claim, NEARLY) as late_claim, LateJobAnswers(job_renewal, 0.4):
        with run_once("file:late.txt", lease=LEASE) as job:
            left = job.seconds_left()
            time.sleep(0.8)  # the body works; the heartbeat renews meanwhile
            lost_in_body = job.seconds_left() == 0
    assert late_claim.fired == 1, "the claim's late answer never came: the test missed it"
    assert left >= MARGIN, f"the body began with {left:.3f}s of trust, less than {MARGIN:.3f}s"
    assert not lost_in_body, "the claim was lost under its running body, nothing refused"


# -- a join that leaves the row's lease end below its own --------------------------------------


class MeanwhileAfterRefusal:
    """The first refused UpdateItem that ``match`` (its JSON body) waits, before its refusal
    reaches dynasem, while ``meanwhile()`` runs in another thread: the round trip between a
    refused take's answer and the next write, in which others write the row."""

    def __init__(self, match: Any, meanwhile: Any) -> None:
        self.match, self.meanwhile, self.fired = match, meanwhile, False
        self.client = dynamodb.get_client()

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        if self.fired or response is None or response[0].status_code != 400:
            return
        if not self.match(json.loads(request_dict["body"] or b"{}")):
            return
        self.fired = True
        worker = threading.Thread(target=self.meanwhile)
        worker.start()
        worker.join(30)

    def __enter__(self) -> MeanwhileAfterRefusal:
        self.client.meta.events.register("needs-retry.dynamodb.UpdateItem", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("needs-retry.dynamodb.UpdateItem", self._hook)


def by(user: str, body: dict[str, Any]) -> bool:
    return f'"{user}"' in json.dumps(body.get("ExpressionAttributeValues", {}))


def test_a_join_planned_from_a_row_with_a_later_lease_end_keeps_the_row_covering_it(
    lock_table: str,
) -> None:
    """A counting join whose lease ends before the row's ``expMs`` as seen leaves ``expMs``
    alone (lock_writes.take_join: "only ever pushed later"), on no condition of it. But the
    row's ``expMs`` can go down meanwhile: its long-lease holder (60 s) gave back, and a
    short-lease holder (1 s) took the row free, writing its own lease end. The join, planned
    from the refusal that showed the old holder (its fence drawn after that take: a fresh
    one, as every plan draws), lands on a row whose ``expMs`` is the 1 s holder's, below its
    own lease end. Once that is CLOCK_SKEW old, ``take_free`` (whose condition is the row's
    ``expMs``, and which ``plan`` sends whenever the row's ``expMs`` is stale) replaces the
    holders' map while the joiner trusts its hold for half a minute: limit=2, three trusted
    holders."""
    resource = "r35:join"
    first = semaphore(resource, limit=2, lease=60, user="long").acquire()
    short: list[Any] = []

    def long_gives_back_short_takes() -> None:
        first.release()
        short.append(semaphore(resource, limit=2, lease=1, user="short").acquire())
        abandon(short[0])  # its process dies: its entry lapses in 1 s

    def joiner_refused(body: dict[str, Any]) -> bool:
        return by("joiner", body)

    with MeanwhileAfterRefusal(joiner_refused, long_gives_back_short_takes) as meanwhile:
        joiner = semaphore(resource, limit=2, lease=30, user="joiner").acquire()
    assert meanwhile.fired and short, "the race was not staged"
    row = lock_rows.get(resource)
    assert row is not None and joiner.token in row.holders
    time.sleep(1.0 + SKEW + 0.3)  # the short holder's lease and the skew are over
    assert joiner.seconds_left() > 20 and not joiner.lost
    others = [semaphore(resource, limit=2, lease=30, user=f"other{i}", wait=0) for i in (1, 2)]
    taken = []
    try:
        for sem in others:
            try:
                taken.append(sem.acquire())
            except SemaphoreBusy:  # what limit=2 must answer with the joiner and one other
                pass
        row = lock_rows.get(resource)
        trusted = [h for h in [joiner, *taken] if not h.lost and h.seconds_left() > 0]
        assert len(trusted) <= 2, (
            f"limit=2, {len(trusted)} holds trusted at once; the row holds "
            f"{sorted(h.user_id for h in row.holders.values()) if row else None}"
        )
    finally:
        for held in [joiner, *taken]:
            with contextlib.suppress(LockLost):
                held.release()


# -- a lease in milliseconds, truncated ---------------------------------------------------------


class FakeClocks:
    """Both clocks of this process, set by the test (seconds): a pause moves both."""

    def __init__(self, wall: float, mono: float) -> None:
        self.wall, self.mono = wall, mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.mark.parametrize("lease", [2.01, 4.06, 2.0], ids=["2.01", "4.06", "2.0-whole-ms"])
def test_a_lease_stored_in_ms_is_never_shorter_than_the_one_trusted(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, lease: float
) -> None:
    """The stored lease end is ``now_ms + int(lease * 1000)``: 2.01 * 1000 is 2009.99...
    in floating point, stored as 2009 ms, while the holder trusts ``lease - CLOCK_SKEW``
    = 2.010 s from the send. CLOCK_SKEW = 0 is allowed (checks: allow_zero), and with one
    host's one clock the taker's ``expMs < now_ms`` then holds while the holder still
    trusts its hold: under a millisecond of two holders, from rounding alone."""
    from django.conf import settings as django_settings
    from django.test import override_settings

    import dynasem._clock

    clocks = FakeClocks(wall=1_000_000.0009, mono=500.0)
    monkeypatch.setattr(dynasem._clock, "wall_clock", lambda: clocks.wall)
    monkeypatch.setattr(dynasem._clock, "monotonic", lambda: clocks.mono)
    with override_settings(DYNASEM={**django_settings.DYNASEM, "CLOCK_SKEW": 0}):
        first = semaphore("r35:round", lease=lease, user="first").acquire()
        clocks.advance(lease - 0.0005)  # half a millisecond of its trust left
        try:
            second = semaphore("r35:round", lease=lease, user="second", wait=0).acquire()
        except SemaphoreBusy:
            second = None
        try:
            assert second is None or first.lost, (
                f"taken over with {first.seconds_left() * 1000:.2f} ms of the first hold's "
                "trust left"
            )
        finally:
            for held in (first, second):
                if held is not None:
                    with contextlib.suppress(LockLost):
                        held.release()


# -- a reap whose index entry lags: the bucket may_be_reaped counts on has not passed ----------


def test_a_take_paused_over_a_reap_of_a_lagging_index_entry_gets_a_fence_above_the_earlier(
    lock_table: str,
) -> None:
    """``take.may_be_reaped`` confirms a late take under a fresh fence only once its draw's
    ``expires`` bucket has ended, "a row is reaped only once its bucket has passed". That is
    the reaper's *listing* (``#exp < :b`` on the expires index, which is eventually
    consistent); its delete's condition is ``#expMs < :cut`` alone (lock_rows.delete_expired).
    A row idle in a past bucket is taken and given back by B (its ``exp`` moves to the
    current bucket); the index still lists it under the past one; the reaper deletes it
    (expMs CLOCK_SKEW old). A, whose take drew its fence before B's and was paused before
    its send, lands on the empty key mid-bucket: no confirmation, and A holds under a fence
    below B's, who held before it. Here the lagging index is stood in for by the reaper's
    own delete of the row it would list. Mended: the delete's condition asks for the row's
    own bucket to have passed too (``#exp < :before``), as the listing does."""
    from tests.engine.test_review_fencing import PausedBeforeSend

    earlier: list[int] = []

    def b_takes_releases_and_a_lagging_reap_deletes() -> None:
        with semaphore("r35:reap", lease=1) as b:
            earlier.append(b.fence)
        time.sleep(2 * SKEW + 0.2)  # its expMs (release time, at least its fence's) is old
        cutoff = int(time.time() * 1000) - int(SKEW * 1000)
        # A reap of it, as a lagging index entry under a passed bucket would ask for it:
        # refused, its own bucket has not passed (it did land before the mend).
        assert not lock_rows.delete_expired("r35:reap", cutoff), "deleted mid-bucket"

    with PausedBeforeSend("UpdateItem", b_takes_releases_and_a_lagging_reap_deletes) as paused:
        a = semaphore("r35:reap", lease=30).acquire()
    try:
        assert paused.fired and earlier
        assert a.fence > earlier[0], (
            f"A's fence {a.fence} is not above B's {earlier[0]}: B held before A, the fence "
            "went back across the reap"
        )
    finally:
        a.release()
