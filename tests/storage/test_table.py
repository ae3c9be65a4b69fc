"""What dynasem sends to DynamoDB: the request counts users pay for, counted by botocore's
event hooks on the real engine."""

from __future__ import annotations

import dataclasses
import time

import hypothesis
import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from django.test import override_settings
from hypothesis import strategies as st

from dynasem import SemaphoreBusy, semaphore
from dynasem import _clock as clock
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from dynasem.conf import settings
from dynasem.testing import abandon
from tests.support.helpers import OwnRequests


def test_uncontended_cycle_is_one_write_to_acquire_and_one_to_release(requests_sent):
    held = semaphore("tbl_issues:1").acquire()
    assert dict(requests_sent.calls) == {"UpdateItem": 1}
    held.release()
    assert dict(requests_sent.calls) == {"UpdateItem": 2}


def test_many_cycles_cost_two_requests_each(requests_sent):
    for i in range(20):
        with semaphore(f"r:{i % 3}"):
            pass
    assert dict(requests_sent.calls) == {"UpdateItem": 40}


def test_refused_acquire_learns_the_holder_without_a_read(requests_sent):
    holder = semaphore("tbl_issues:2", user="alice").acquire()
    requests_sent.reset()
    with pytest.raises(SemaphoreBusy) as busy:
        semaphore("tbl_issues:2", wait=0).acquire()
    assert dict(requests_sent.calls) == {"UpdateItem": 1}  # 0 GetItem, 0 Query
    assert busy.value.holder_user_id == "alice"
    # Just taken, no hold on record: about now (it was its lease end + skew, 10.5 s).
    lease_left = (holder.expires.timestamp() - time.time()) + settings.CLOCK_SKEW
    assert busy.value.retry_after < lease_left - 5
    holder.release()


def test_expired_hold_is_taken_over_in_one_write(requests_sent):
    with override_settings(DYNASEM=dict(settings.raw, CLOCK_SKEW=0.2)):
        old = semaphore("tbl_issues:3", lease=0.5).acquire()
        abandon(old)  # a holder that died
        time.sleep(0.5 + 0.2 + 0.1)
        requests_sent.reset()
        new = semaphore("tbl_issues:3", lease=5).acquire()
        assert dict(requests_sent.calls) == {"UpdateItem": 1}
        assert new.fence > old.fence
        new.release()


def test_a_take_by_another_user_moves_no_index_key_until_its_first_renewal(
    lock_table, requests_sent
):
    """Holds taken in turn by two users (a view lock taken by whoever asks): the row keeps the
    first user in ``userId`` (moving it costs a delete and a put in the userId index), until
    a hold lasts long enough to be renewed: from then on it is listed under its own user."""
    from dynasem._operators import locks as operations

    semaphore("view:1", user="alice", lease=30).acquire().release()
    held = semaphore("view:1", user="bob", lease=30).acquire()
    assert lock_rows.get_item("view:1")["userId"] == "alice"
    assert [h.user_id for h in operations.holds_on("view:1")] == ["bob"]
    held.renew()
    assert lock_rows.get_item("view:1")["userId"] == "bob"
    assert [h.resource for h in operations.active_holds(user_id="bob")] == ["view:1"]
    held.release()


def test_stored_row_carries_user_and_expires_for_the_indexes(lock_table):
    held = semaphore("tbl_issues:4", user="bob", lease=30).acquire()
    row = lock_rows.get_item("tbl_issues:4")
    assert row["userId"] == "bob"
    # The indexed expires is a bucket: rounded up, never before the lease really ends.
    assert isinstance(row["expires"], int)
    assert row["expires"] % records.BUCKET_S == 0
    assert held.expires.timestamp() <= row["expires"] < held.expires.timestamp() + records.BUCKET_S
    assert row["expMs"] == held._expires_ms  # the exact lease end decides
    assert row["shard"] == records.shard_of("tbl_issues:4")
    assert row["holders"][held.token]["f"] == held.fence
    listed = row["expires"]
    held.release()
    row = lock_rows.get_item("tbl_issues:4")
    assert row["holders"] == {}
    # The release moves no index key: userId and the bucket stay (a re-take by bob then
    # moves none either); the row is idle by its exact lease end, from now.
    assert row["userId"] == "bob"
    assert row["expires"] == listed
    assert row["expMs"] <= time.time() * 1000 + settings.CLOCK_SKEW * 1000 + 1000


def _lose_responses(client, operation: str, count: int) -> dict[str, int]:
    """Let DynamoDB apply the next ``count`` requests of ``operation`` but replace each response
    by a 500 before botocore decides about retrying (as a dropped connection would): this
    thread's only (another test's thread must not use them up)."""
    state = {"lost": 0}
    own = OwnRequests(this_thread=True)

    def lose(response, operation, **kwargs):
        if not own(kwargs.get("request_dict")):
            return
        if operation.name == OP and state["lost"] < count and response is not None:
            http_response, parsed = response
            if http_response is not None and http_response.status_code == 200:
                state["lost"] += 1
                http_response.status_code = 500
                parsed.clear()
                parsed.update(
                    {
                        "Error": {"Code": "InternalServerError", "Message": "response lost"},
                        "ResponseMetadata": {"HTTPStatusCode": 500},
                    }
                )

    OP = operation
    client.meta.events.register_first(f"needs-retry.dynamodb.{operation}", lose)
    return state


def test_lost_response_is_recognised_as_our_own_write(requests_sent):
    """The acquire write is applied but its response is lost; the retry is refused by our own
    hold, which the old item (ALL_OLD) shows: we hold it at once, no lease wait."""
    state = _lose_responses(dynamodb.get_client(), "UpdateItem", 1)
    start = time.monotonic()
    held = semaphore("tbl_issues:5", user="carol", wait=0).acquire()
    elapsed = time.monotonic() - start
    assert state["lost"] == 1
    assert elapsed < 2
    row = lock_rows.get_item("tbl_issues:5")
    assert row["holders"][held.token]["u"] == "carol"
    assert row["holders"][held.token]["f"] == held.fence
    held.release()
    assert lock_rows.get_item("tbl_issues:5")["holders"] == {}


def test_lost_release_response_is_no_error(requests_sent):
    held = semaphore("tbl_issues:6").acquire()
    state = _lose_responses(dynamodb.get_client(), "UpdateItem", 1)
    held.release()  # the retry is refused, but lastToken says the release was ours
    assert state["lost"] == 1
    assert lock_rows.get_item("tbl_issues:6")["holders"] == {}


def test_counting_and_shared_holds_cost_one_write_each_way(requests_sent):
    with semaphore("pool", limit=3):  # the item exists from now on, as rows stay until reaped
        pass
    with semaphore("docs", shared=True):
        pass
    requests_sent.reset()
    pool = [semaphore("pool", limit=3).acquire() for _ in range(3)]
    # (The readers a row keeps inline; those past them: test_readers.py.)
    readers = [semaphore("docs", shared=True).acquire() for _ in range(2)]
    assert dict(requests_sent.calls) == {"UpdateItem": 5}
    for held in pool + readers:
        held.release()
    assert dict(requests_sent.calls) == {"UpdateItem": 10}


def test_job_row_decodes_a_stored_job_and_a_missing_one() -> None:
    row = records.job_row(
        {
            "pk": "file:x",
            "sk": records.JOB_SK,
            "status": records.RUNNING,
            "token": "t1",
            "userId": "7",
            "attempt": 2,
            "fence": 123,
            "expMs": 5_000,
            "startedMs": 1_000,
        }
    )
    assert (row.key, row.status, row.token, row.user_id) == ("file:x", "RUNNING", "t1", "7")
    assert (row.attempt, row.fence, row.expires_ms, row.started_ms) == (2, 123, 5_000, 1_000)
    assert row.finished_ms is None and row.error is None and row.last_token is None
    empty = records.job_row(None)
    assert empty.status is None and empty.attempt is None and empty.fence is None


# Any value DynamoDB may return: what dynasem stores and what it never does (sets, binary,
# NULL, fractions, exponents, unicode digits in a string), nested.
_SCALARS = (
    st.text(max_size=8)
    | st.integers(min_value=-(10**38) + 1, max_value=10**38 - 1)
    | st.booleans()
    | st.none()
    | st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-1000, max_value=1000)
    | st.binary(max_size=4)
    | st.frozensets(st.text(min_size=1, max_size=3), min_size=1, max_size=3).map(set)
    | st.frozensets(st.integers(-9, 99), min_size=1, max_size=3).map(set)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.dictionaries(st.text(min_size=1, max_size=4), _VALUES, max_size=4))
def test_decode_reads_every_value_as_boto3_and_plain_would(values) -> None:
    """The direct reader of the common kinds gives what boto3's deserializer, then ``_plain``,
    gave before it: ints for integers (large ones whole), the same for everything else."""
    item = {k: TypeSerializer().serialize(v) for k, v in values.items()}
    slow = {k: records._plain(TypeDeserializer().deserialize(v)) for k, v in item.items()}
    fast = records.decode(item)
    assert fast == slow
    assert repr(fast) == repr(slow)  # types too: 1 (int) is not 1.0 (float)


def test_a_late_release_never_leaves_expires_before_the_rows_lease_end(lock_table, monkeypatch):
    """A holder that releases after the bucket its last write stored has ended (its clock ran
    on, the process was paused): the release moves expires up to its own bucket, so TTL and
    the reaper never read the row as idle before its stored lease end (expMs)."""
    held = semaphore("tbl_issues:late", lease=30).acquire()
    abandon(held)
    listed = lock_rows.get_item("tbl_issues:late")["expires"]
    real = clock.wall_clock
    monkeypatch.setattr(clock, "wall_clock", lambda: real() + records.BUCKET_S + 60)
    held.release()
    row = lock_rows.get_item("tbl_issues:late")
    assert row["holders"] == {}
    assert row["expires"] > listed
    assert row["expires"] * 1000 >= row["expMs"]
    # An on-time release moves nothing.
    monkeypatch.setattr(clock, "wall_clock", real)
    with semaphore("tbl_issues:on-time", lease=30):
        listed = lock_rows.get_item("tbl_issues:on-time")["expires"]
    assert lock_rows.get_item("tbl_issues:on-time")["expires"] == listed


def test_a_release_whose_fence_runs_ahead_of_its_lease_keeps_expires_ahead_too(lock_table):
    """Fences count on from the stored one when an earlier holder's clock was ahead: the
    release then records its fence's time as the row's lease end (so no reap lets a smaller
    fence be made), and expires must follow it into that time's bucket."""
    ahead_ms = int(time.time() * 1000) + 2 * records.BUCKET_S * 1000
    dynamodb.get_client().put_item(
        TableName=lock_table,
        Item=records.encode(
            {
                "pk": "tbl_issues:ahead",
                "sk": records.LOCK_SK,
                "holders": {},
                "fence": ahead_ms * 1000,
                "expMs": ahead_ms - 1,
                "expires": records.bucket_of(ahead_ms - 1),
                "shard": records.shard_of("tbl_issues:ahead"),
            }
        ),
    )
    with semaphore("tbl_issues:ahead", lease=30) as held:
        assert held.fence > ahead_ms * 1000
        listed = lock_rows.get_item("tbl_issues:ahead")["expires"]
        assert listed * 1000 < held.fence // 1000  # its own lease ends well before
    row = lock_rows.get_item("tbl_issues:ahead")
    assert row["expMs"] >= held.fence // 1000
    assert row["expires"] * 1000 >= row["expMs"]


def test_a_row_past_dynamodbs_item_size_is_named_and_nothing_is_written(lock_table, monkeypatch):
    """Readers whose user ids are 1 KB each fill one resource's item toward DynamoDB's
    400 KB when rows keep every reader inline (as they did before reader items: now a row
    keeps two, and counting holders above 8 are in permit items, so nothing the lock writes
    reaches the limit): the acquire that would pass it fails with LimitExceeded("item
    size"), not SemaphoreBusy, and the row is as it was."""
    from dynasem import LimitExceeded
    from dynasem._storage import lock_writes as writes
    from dynasem._storage import reader_items

    monkeypatch.setattr(writes, "READERS_INLINE", 10**6)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 10**6)

    def user(i: int) -> str:
        return f"{i:04}" + "u" * 1_016

    held = [semaphore("crowd", shared=True, lease=600, user=user(0)).acquire()]
    # 340 more readers (340 KB) as 340 acquisitions would have left them, written at once:
    # taken one by one, each reading and writing the growing item, they took 19 s alone.
    row = lock_rows.get_item("crowd")
    ((token, entry),) = row["holders"].items()
    row["holders"] |= {f"{token}-{i}": entry | {"u": user(i)} for i in range(1, 341)}
    assert len(str(row)) > 340_000, "the entry no longer stores its user as 'u'"
    dynamodb.get_client().put_item(TableName=lock_table, Item=records.encode(row))
    try:
        with pytest.raises(LimitExceeded) as raised:
            for i in range(341, 1_000):
                user_id = user(i)
                held.append(semaphore("crowd", shared=True, lease=600, user=user_id).acquire())
        before = lock_rows.get_item("crowd")["holders"]
        assert raised.value.limit == "item size" and not raised.value.transient
        assert "400 KB" in str(raised.value) and "Nothing was written" in str(raised.value)
        assert len(held) > 1 and 300 < len(before) < 400
        assert all(h.token in before for h in held)
        with pytest.raises(LimitExceeded):
            semaphore("crowd", shared=True, lease=600, user="x" * 1_020).acquire()
        assert lock_rows.get_item("crowd")["holders"] == before
    finally:
        for h in held:
            h.release()


@pytest.mark.parametrize(
    ("code", "message", "reasons", "limit", "transient"),
    [
        (
            "ValidationException",
            "Item size has exceeded the maximum allowed size",
            None,
            "item size",
            False,
        ),
        (
            "TransactionCanceledException",
            "Transaction cancelled, please refer cancellation reasons for specific reasons",
            [
                {"Code": "None"},
                {
                    "Code": "ValidationError",
                    "Message": "Item size to update has exceeded the maximum allowed size",
                },
            ],
            "item size",
            False,
        ),
        (
            "ProvisionedThroughputExceededException",
            "The level of configured provisioned throughput for the table was exceeded",
            None,
            "throughput",
            True,
        ),
        (
            "ThrottlingException",
            "Throughput exceeds the current capacity for one or more global secondary indexes",
            None,
            "throughput",
            True,
        ),
        (
            "ValidationException",
            "Transaction request cannot exceed the maximum allowed size of 4 MB",
            None,
            "transaction",
            False,
        ),
    ],
)
def test_a_refusal_for_a_dynamodb_limit_names_the_limit(code, message, reasons, limit, transient):
    from botocore.exceptions import ClientError

    from dynasem import LimitExceeded
    from dynasem._storage import dynamodb

    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    if reasons is not None:
        response["CancellationReasons"] = reasons
    error = dynamodb._unavailable(ClientError(response, "UpdateItem"))
    assert isinstance(error, LimitExceeded)
    assert (error.limit, error.transient, error.ambiguous) == (limit, transient, False)
    assert code in str(error)


def test_a_refusal_for_no_limit_stays_a_plain_unavailable():
    from botocore.exceptions import ClientError

    from dynasem import LimitExceeded
    from dynasem._storage import dynamodb

    response = {
        "Error": {
            "Code": "ValidationException",
            "Message": "One or more parameter values were invalid",
        }
    }
    error = dynamodb._unavailable(ClientError(response, "UpdateItem"))
    assert not isinstance(error, LimitExceeded) and "ValidationException" in str(error)


def test_a_join_is_not_refused_by_a_renewal_that_ends_before_it(lock_table):
    """A join of a counting semaphore planned from the row as seen, then another holder
    renews (the row's lease end moves, still before ours): the join goes through. Its
    condition once wanted the row's lease end to be the very value seen, which every renewal
    moves: with a hundred holders renewing one row, a wait=0 acquire of one of its free
    permits answered "busy, held by unknown" (measured: the 175th holder of limit=6000)."""
    other = semaphore("renewed", limit=8, lease=5).acquire()  # holders in the row
    try:
        seen = lock_rows.get("renewed")
        now = clock.now_ms()
        entry = lock_writes.holder_entry("joiner", now + 60_000, clock.new_fence(0.5), now, False)
        join = lock_writes.take_join(
            "renewed", "joiner", entry, mode="n", limit=8, seen=seen, evict=[]
        )
        other.renew()  # the row's lease end moves: later than seen, earlier than ours
        assert lock_rows.get("renewed").expires_ms > seen.expires_ms
        lock_rows.update(join)
        stored = lock_rows.get("renewed")
        assert set(stored.holders) == {other.token, "joiner"}
        assert stored.expires_ms == entry.expires_ms  # ours, the latest, is the row's
        # A join that would end before the row's lease end may not set it lower: refused.
        late = lock_writes.holder_entry("late", now + 1_000, clock.new_fence(0.5), now, False)
        stale_view = dataclasses.replace(stored, expires_ms=0)
        with pytest.raises(dynamodb.Refused):
            lock_rows.update(
                lock_writes.take_join(
                    "renewed", "late", late, mode="n", limit=10, seen=stale_view, evict=[]
                )
            )
        lock_rows.update(lock_writes.give_back("renewed", "joiner", clock.now_ms(), sole=False))
    finally:
        other.release()


def test_a_join_evicts_at_most_max_evict_dead_holders_and_still_joins(lock_table, monkeypatch):
    """A counting semaphore with one live holder and 150 whose leases ran out (their
    processes died): each join evicts the 64 oldest in its own write and joins. (Holders in
    the row, as for readers, or limit <= 8: not permit items.)"""
    from dynasem._storage import lock_writes as writes
    from dynasem._storage import permit_items

    monkeypatch.setattr(permit_items, "INLINE_MAX", 10**9)

    now = clock.now_ms()
    for i in range(150):
        entry = lock_writes.holder_entry("dead", now - 60_000 + i, 1_000 + i, now - 70_000, False)
        build = lock_writes.take_room if i else lock_writes.take_free
        extra = {} if i else {"stale_ms": now}
        lock_rows.update(build("graveyard", f"dead{i:03}", entry, mode="n", limit=1_000, **extra))
    # A live holder whose lease ends after the joiners' own: their blind first write is
    # refused, and they join from the row as it is, evicting the dead.
    live = semaphore("graveyard", limit=1_000, lease=600).acquire()
    joined, sizes = [], []
    try:
        for _ in range(3):
            joined.append(semaphore("graveyard", limit=1_000, lease=30, wait=5).acquire())
            sizes.append(len(lock_rows.get_item("graveyard")["holders"]))
        assert sizes == [
            151 - writes.MAX_EVICT + 1,
            151 - 2 * writes.MAX_EVICT + 2,
            1 + 3,
        ]
    finally:
        for held in [live, *joined]:
            held.release()


def test_a_client_built_from_old_settings_is_not_kept_after_a_reset(lock_table, monkeypatch):
    """A settings change (``reset_client``) while a thread builds the client from the old
    settings: the client built is forgotten, not cached for good (a heartbeat kept renewing
    through a dead endpoint's client after ``override_settings`` ended)."""
    import threading

    from dynasem._storage import dynamodb

    started, go, built = threading.Event(), threading.Event(), []
    real = dynamodb.build_client

    def slow(quick: bool):
        started.set()
        go.wait(5)
        built.append(real(quick))
        return built[-1]

    dynamodb.reset_client()
    monkeypatch.setattr(dynamodb, "build_client", slow)
    builder = threading.Thread(target=dynamodb.get_client)
    builder.start()
    assert started.wait(5)
    resetter = threading.Thread(target=dynamodb.reset_client)
    resetter.start()
    resetter.join(0.2)  # the reset waits for the build, or (before the fix) clears at once
    go.set()
    builder.join(5)
    resetter.join(5)
    monkeypatch.setattr(dynamodb, "build_client", real)
    assert dynamodb.get_client() is not built[0]


def test_a_confirming_renewal_names_the_fence_of_the_entry_it_saw(lock_table):
    """A waiter that saw a hold of its own (a hand-over) confirms it with a renewal of the
    entry of that fence: a read that may be stale can show an entry of ours that was taken
    over and handed to us again since, under a later fence (the simulator's seed 1760, mix
    fair, faults pauses: the block began with the older fence). Renewing the entry of
    another fence is refused, showing the entry as it is."""
    held = semaphore("fenced-renewal", lease=30).acquire()
    try:
        later = clock.now_ms() + 60_000
        with pytest.raises(dynamodb.Refused) as refused:
            lock_rows.update(
                lock_writes.renew_hold(
                    "fenced-renewal", held.token, later, raise_item=True, fence=held.fence - 1
                )
            )
        assert refused.value.lock.holders[held.token].fence == held.fence
        lock_rows.update(
            lock_writes.renew_hold(
                "fenced-renewal", held.token, later, raise_item=True, fence=held.fence
            )
        )
        assert lock_rows.get("fenced-renewal").holders[held.token].expires_ms == later
    finally:
        held.release()


def test_a_ticket_missing_for_good_is_waited_for_once_then_passed(
    lock_table, requests_sent, monkeypatch
):
    # A waiter that died between drawing its ticket and putting its entry leaves a gap for
    # good: the first consistent read of the line waits JOIN_GRACE for it (reading again), a
    # later one of this process passes it at once; an eventually consistent read never waits.
    from dynasem._storage import queue_entries
    from tests.support.helpers import enqueue_entry

    monkeypatch.setattr(queue_entries, "JOIN_GRACE", 0.3)
    resource = "gap:for-good"
    assert lock_rows.update(lock_writes.take_ticket(resource, 1), return_new=True) is not None
    now = clock.now_ms()
    enqueue_entry(resource, "behind", records.Waiter(0, now + 30_000, lease_ms=30_000))
    row = lock_rows.get(resource)
    assert row is not None and (row.queue_out, row.queue_in) == (0, 2)
    requests_sent.reset()
    started = time.monotonic()
    first = queue_entries.load_entries(row)
    assert time.monotonic() - started >= 0.3
    assert [w.ticket for w in first.entries or ()] == [2]
    assert requests_sent.calls["Query"] >= 3, requests_sent.calls
    requests_sent.reset()
    again = queue_entries.load_entries(row)
    quick = queue_entries.load_entries(row, consistent=False)
    assert [w.ticket for w in again.entries or ()] == [2]
    assert [w.ticket for w in quick.entries or ()] == [2]
    assert requests_sent.calls["Query"] == 2, requests_sent.calls
