"""Review of the acquire loop (core.Acquire, its drivers): faults found, as failing tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import dynasem
from dynasem._storage import lock_rows
from dynasem.exceptions import SemaphoreUnavailable


def lost_then_unsent(
    send: Callable[..., Any], matches: Callable[[dict[str, Any]], bool], calls: list[str]
) -> Callable[..., Any]:
    """``send``, but the first write ``matches`` picks is applied with its answer lost (a
    timeout: ambiguous), and the next one never reaches DynamoDB (not ambiguous)."""

    def flaky(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if not matches(action) or len(calls) >= 2:
            return send(action, *args, **kwargs)
        if not calls:
            calls.append("applied, answer lost")
            send(action, *args, **kwargs)
            raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
        calls.append("never sent")
        raise SemaphoreUnavailable("cannot connect", transient=True, ambiguous=False)

    return flaky


def test_a_take_applied_unanswered_then_a_retry_that_never_connects_leaves_no_hold(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take is applied, its answer lost (a timeout: ambiguous); the acquire sends it again
    after a pause, but that send never reaches DynamoDB (no connection: not ambiguous) and the
    wait is over: the acquire raises. The first write's hold must be withdrawn: before, only
    the last failure's ``ambiguous`` was looked at, and the row kept our token for its whole
    lease, held by nobody (every other acquire found it busy)."""
    resource = "res:review-lost-then-unsent"
    send = lock_rows.update
    calls: list[str] = []

    def row(action: dict[str, Any]) -> bool:
        return bool(action["Key"]["sk"]["S"] == "lock")

    monkeypatch.setattr(lock_rows, "update", lost_then_unsent(send, row, calls))
    with pytest.raises(SemaphoreUnavailable):
        dynasem.semaphore(resource, lease=60, wait=0).acquire()
    assert calls == ["applied, answer lost", "never sent"]
    row = lock_rows.get(resource)
    holders = {} if row is None else row.holders
    assert not holders, f"a hold left behind by the failed acquire: {holders}"


def test_a_permit_applied_unanswered_then_a_retry_that_never_connects_leaves_no_permit(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a permit item's write (permits.hold_permit): applied, answer lost; the
    retry never sent; the wait over. The permit must be given back: every permit free."""
    from dynasem._storage import permit_items, records

    monkeypatch.setattr(permit_items, "INLINE_MAX", 1)
    resource, send = "res:review-permit-lost-then-unsent", permit_items.send
    calls: list[str] = []

    def permit(action: dict[str, Any]) -> bool:
        return bool(action["Key"]["sk"]["S"].startswith(records.PERMIT_PREFIX))

    monkeypatch.setattr(permit_items, "send", lost_then_unsent(send, permit, calls))
    with pytest.raises(SemaphoreUnavailable):
        dynasem.semaphore(resource, limit=2, lease=60, wait=0).acquire()
    assert calls == ["applied, answer lost", "never sent"]
    monkeypatch.setattr(permit_items, "send", send)
    taken = []
    try:
        for _ in range(2):  # every permit free again at once
            taken.append(dynasem.semaphore(resource, limit=2, lease=60, wait=0).acquire())
    finally:
        for held in taken:
            held.release()


@pytest.mark.parametrize("limit", [1, 3], ids=["exclusive", "counting"])
def test_a_take_resent_by_botocore_and_refused_by_itself_is_kept_then_given_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """The take is applied, its answer lost; botocore sends the same request again, which is
    refused by the take it repeats (``Refused.retried``, the row as it is). The hold is found
    in the refusal and returned; released, nothing of it is left."""
    from dynasem._storage import dynamodb

    resource, send = f"res:review-resent-{limit}", lock_rows.update
    resent: list[bool] = []

    def resend_once(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if action["Key"]["sk"]["S"] != "lock" or resent:
            return send(action, *args, **kwargs)
        resent.append(True)
        send(action, *args, **kwargs)  # applied; its answer lost
        try:
            return send(action, *args, **kwargs)
        except dynamodb.Refused as refused:
            refused.retried = True
            raise

    monkeypatch.setattr(lock_rows, "update", resend_once)
    held = dynasem.semaphore(resource, limit=limit, lease=60, wait=0).acquire()
    assert resent and held.seconds_left() > 30
    row = lock_rows.get(resource)
    assert row is not None and list(row.holders) == [held.token]
    assert held.fence == row.holders[held.token].fence
    held.release()
    row = lock_rows.get(resource)
    assert row is None or not row.holders


def test_a_take_refused_by_itself_after_many_refusals_is_kept_not_left_behind(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crowd of takers of one counting row: each of our joins is refused (another take
    changed the row first), MAX_REPLANS times; the next one is applied, its answer lost, and
    botocore's re-send is refused by that very join (``Refused.retried``: the row shows our
    token). Past MAX_REPLANS, write() answered "busy" without looking at what the refusal
    showed, and at wait=0 the acquire raised SemaphoreBusy: our applied join stayed in the
    row, held by nobody, for its whole lease (a permit of two lost to every other acquire)."""
    from dynasem._engine import queue
    from dynasem._storage import dynamodb

    resource, send = "res:review-refused-by-itself-late", lock_rows.update
    other = dynasem.semaphore(resource, limit=3, lease=60).acquire()
    refusals: list[int] = []

    def crowded(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if action["Key"]["sk"]["S"] != "lock" or len(refusals) > queue.MAX_REPLANS:
            return send(action, *args, **kwargs)
        refusals.append(1)
        if len(refusals) <= queue.MAX_REPLANS:  # another taker changed the row first
            raise dynamodb.Refused(lock_rows.get_item(resource), retried=False)
        send(action, *args, **kwargs)  # applied; its answer lost
        try:
            return send(action, *args, **kwargs)  # botocore's re-send
        except dynamodb.Refused as refused:
            refused.retried = True
            raise

    monkeypatch.setattr(lock_rows, "update", crowded)
    sem = dynasem.semaphore(resource, limit=3, lease=60, wait=0)
    try:
        held = sem.acquire()
    except dynasem.SemaphoreBusy:
        held = None
    monkeypatch.setattr(lock_rows, "update", send)
    try:
        row = lock_rows.get(resource)
        assert row is not None
        ours = [t for t in row.holders if t != other.token]
        if held is None:
            assert not ours, f"busy, but a join of ours is left in the row: {ours}"
        else:
            assert ours == [held.token]
    finally:
        other.release()
        if held is not None:
            held.release()


@pytest.mark.parametrize("where", ["row", "permit"])
def test_a_soft_time_limit_as_a_take_lands_leaves_no_hold(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Celery's SoftTimeLimitExceeded is an ``Exception`` (billiard's), raised by a signal
    handler at any line: here while the take's answer is read, the write applied. The driver
    handed it to the loop as the write's error; the loop, which knows only DynamoDB's errors,
    let it through, and the driver re-raised it as "the loop's own answer: it cleaned up what
    it had" (``except Exception: raise``): the hold stayed in the row, nobody's, for its whole
    lease (every acquire found it busy). A KeyboardInterrupt at the same line is cleaned up."""
    from billiard.exceptions import SoftTimeLimitExceeded

    from dynasem._storage import permit_items, records

    resource = f"res:review-soft-limit-{where}"
    options: dict[str, Any] = {"lease": 60, "wait": 0}
    if where == "row":
        module, name, prefix = lock_rows, "update", "lock"
    else:
        monkeypatch.setattr(permit_items, "INLINE_MAX", 1)
        module, name, prefix = permit_items, "send", records.PERMIT_PREFIX
        options["limit"] = 2
    send = getattr(module, name)
    fired: list[bool] = []

    def landed_then_time_limit(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        answer = send(action, *args, **kwargs)
        if fired or not action["Key"]["sk"]["S"].startswith(prefix):
            return answer
        fired.append(True)
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(module, name, landed_then_time_limit)
    with pytest.raises(SoftTimeLimitExceeded):
        dynasem.semaphore(resource, **options).acquire()
    monkeypatch.setattr(module, name, send)
    limit = int(options.get("limit", 1))
    taken = []
    try:
        for _ in range(limit):  # every permit free again at once
            taken.append(dynasem.semaphore(resource, **options).acquire())
    finally:
        for held in taken:
            held.release()


def test_a_hold_of_ours_whose_confirming_renewal_never_connects_is_withdrawn(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row names our token as a holder (a hand-over that reached us as the wait ended,
    or a take of ours applied with its answer lost), its lease end too near to trust: the
    acquire confirms it with a renewal, which never reaches DynamoDB (throttled, no
    connection: not ambiguous), and the wait is over. The acquire raises, so nobody holds
    that hold: it must be given back, not left in the row until its lease ends, with every
    other acquire finding the lock busy meanwhile."""
    import types

    from dynasem import testing
    from dynasem._clock import now_ms
    from dynasem._engine import core
    from dynasem._storage import lock_writes

    resource, token = "res:review-confirm-unsent", "f" * 32
    fixed = types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex=token))
    monkeypatch.setattr(core, "uuid", fixed)  # both acquires under one token
    first = dynasem.semaphore(resource, lease=60).acquire()
    testing.abandon(first)
    # Its lease end near: a hold we only heard of is confirmed before it is returned.
    near = lock_writes.renew_hold(resource, token, now_ms() + 3000, raise_item=False)
    lock_rows.update(near)
    send, calls = lock_rows.update, []

    def unsent(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if action.get("UpdateExpression", "").startswith("SET #h.#t.#e = :e"):
            calls.append("renewal never sent")
            raise SemaphoreUnavailable("cannot connect", transient=True, ambiguous=False)
        return send(action, *args, **kwargs)

    monkeypatch.setattr(lock_rows, "update", unsent)
    with pytest.raises(SemaphoreUnavailable):
        dynasem.semaphore(resource, lease=60, wait=0).acquire()
    assert calls, "the acquire never confirmed the hold: the test missed the path"
    row = lock_rows.get(resource)
    holders = {} if row is None else row.holders
    assert token not in holders, f"a hold left behind by the failed acquire: {holders}"


def test_a_take_applied_unanswered_then_a_read_failing_past_the_wait_leaves_no_hold(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take is applied, its answer lost (ambiguous); the loop plans again, and a read it
    needs first (who waits ahead, the permits) stays throttled past the wait: the loop
    raises from the read, not from a write's failure. What the unanswered take may have
    taken must be given back all the same: the acquire answers, so nobody holds it."""
    from dynasem._engine import core

    resource = "res:review-lost-then-read-fails"
    send, calls = lock_rows.update, []

    def row(action: dict[str, Any]) -> bool:
        return bool(action["Key"]["sk"]["S"] == "lock")

    def lost(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if row(action) and not calls:
            calls.append("applied, answer lost")
            send(action, *args, **kwargs)
            raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
        return send(action, *args, **kwargs)

    monkeypatch.setattr(lock_rows, "update", lost)
    real, tries = core.Acquire.try_take, []

    def try_take(self: Any) -> Any:
        tries.append(1)
        if len(tries) > 1:  # after the lost answer: a read throttled past the wait
            raise SemaphoreUnavailable("throttled", transient=True)
        return (yield from real(self))

    monkeypatch.setattr(core.Acquire, "try_take", try_take)
    with pytest.raises(SemaphoreUnavailable, match="throttled"):
        dynasem.semaphore(resource, lease=60, wait=0).acquire()
    assert calls == ["applied, answer lost"]
    row_now = lock_rows.get(resource)
    holders = {} if row_now is None else row_now.holders
    assert not holders, f"a hold left behind by the failed acquire: {holders}"


def test_a_take_withdrawn_after_a_waiter_queued_behind_it_pushes_that_waiter(
    lock_table: str, holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C as a take lands: the acquire withdraws our token from the row. A waiter that
    queued behind that token meanwhile (it found the row held) was not told: the withdrawal
    wrote the row free and pushed nobody, so the waiter took the lock only at its next paced
    look (0.55 s idle, measured by review), where a release pushes it at once."""
    import threading

    from tests.support.helpers import pushes_recorded, queue_of, take, wait_for

    send = lock_rows.update
    me = threading.current_thread()
    got: list[Any] = []
    queued: dict[str, Any] = {}

    def landed_then_interrupted(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        answer = send(action, *args, **kwargs)
        if threading.current_thread() is not me or queued:
            return answer
        waiter = threading.Thread(target=lambda: got.append(take(holds, "gone", wait=20)))
        waiter.start()
        queued.update(wait_for(lambda: queue_of("gone"), 10, "the waiter's entry"))
        raise KeyboardInterrupt

    pushed = pushes_recorded(monkeypatch)
    monkeypatch.setattr(lock_rows, "update", landed_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        dynasem.semaphore("gone", lease=30).acquire()
    monkeypatch.setattr(lock_rows, "update", send)
    wait_for(lambda: got, 20, "the waiter's hold")
    assert pushed == list(queued), "the withdrawal told no waiter"
