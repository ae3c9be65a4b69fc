"""Review 38q: the lock engine's paths the suite never ran (a reader item's renewal past its
row's sentinel, ...), reached and their outcome asserted."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import LockLost, SemaphoreUnavailable
from dynasem import _clock as clock
from dynasem._engine import permit_hold
from dynasem._storage import dynamodb, lock_rows, permit_items, records
from dynasem._storage import reader_items as items
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)

INLINE = max(1, items.READERS_INLINE)


def sentinel_end(resource: str = "doc") -> int:
    stored = lock_rows.get_item(resource)
    assert stored is not None
    return int(stored["holders"][items.SENTINEL]["e"])


def item_end(token: str, resource: str = "doc") -> int:
    return {r.token: r for r in items.readers(resource)}[token].holder.expires_ms


def frozen_wall(monkeypatch: pytest.MonkeyPatch, ahead: float) -> None:
    """This process's wall clock stopped ``ahead`` seconds from now (a bucket's end passed)."""
    at = time.time() + ahead
    monkeypatch.setattr(clock, "wall_clock", lambda: at)


def test_a_reader_items_renewal_past_the_sentinel_raises_it_first(
    holds: list[Any], one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    mine = readers[-1]
    before = sentinel_end()
    frozen_wall(monkeypatch, 2)  # past the sentinel's one-second bucket
    mine.renew()
    assert not mine.lost
    renewed = item_end(mine.token)
    assert renewed > before
    assert sentinel_end() >= renewed  # raised before the item claimed the later end


def test_a_reader_items_renewal_finds_the_sentinel_raised_by_another_reader(
    holds: list[Any], one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 2)]
    first, second = readers[-2:]
    frozen_wall(monkeypatch, 2)
    first.renew()  # raises the sentinel to the bucket both renewals end in
    raised = sentinel_end()
    second.renew()  # its own raise refused: already covered
    assert not second.lost
    assert sentinel_end() == raised >= item_end(second.token)


def test_a_written_off_reader_items_renewal_past_the_sentinel_is_lost(
    holds: list[Any], one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    mine = readers[-1]
    # A writer wrote the epoch off (its reader's item left, as a writer that read it dead
    # would not yet have deleted it): the sentinel is gone, the row's epoch moved on.
    seen = lock_rows.get("doc")
    assert seen is not None
    lock_rows.update(items.write_off("doc", seen))
    frozen_wall(monkeypatch, 2)
    with pytest.raises(LockLost):
        mine.renew()
    assert mine.lost


def test_a_permit_take_whose_row_listing_failed_plans_again_and_takes(
    holds: list[Any], one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take of a permit past the row's listing raises the listing first; that write failed
    for a passing cause: the take pauses and plans again (never writes a permit the row does
    not cover), and takes."""
    take(holds, "pool", limit=9, lease=30)
    frozen_wall(monkeypatch, 2)  # the next permit's lease runs past the row's listing
    real, failed = permit_hold.cover, []

    def fails_once(resource: str, expires_ms: int, slot: int | None = None) -> int:
        if not failed:
            failed.append(expires_ms)
            raise SemaphoreUnavailable("throttled (test)", transient=True)
        return real(resource, expires_ms, slot)

    monkeypatch.setattr(permit_hold, "cover", fails_once)
    second = take(holds, "pool", limit=9, lease=30, wait=5)
    assert failed
    (permit,) = [p for p in permit_items.permits("pool") if p.token == second.token]
    stored = lock_rows.get("pool")
    assert stored is not None and stored.expires_ms >= permit.holder.expires_ms


def test_a_permit_renewed_past_its_rows_listing_once_the_row_is_gone_is_lost(
    holds: list[Any], one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permit's renewal past the row's listing raises the listing first; the row is gone
    (reaped while the holder was paused, or deleted by TTL): made anew it would know nothing
    of this permit, so the renewal is refused and the hold lost, never extended."""
    held = take(holds, "pool", limit=9, lease=30)
    dynamodb.send_to_table("delete_item", Key=lock_rows.key("pool", records.LOCK_SK))
    frozen_wall(monkeypatch, 2)
    with pytest.raises(LockLost):
        held.renew()
    assert held.lost


def test_a_permit_take_answered_too_late_to_trust_is_confirmed_by_a_renewal(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permit take whose answer comes with less than the margin of its trust left (the
    process paused a lease after the permit's write was sent): confirmed by a renewal of
    the permit, conditional on our token, and trusted from that renewal's send."""
    take(holds, "pool", limit=9, lease=30)
    real_send, real_mono, offset = permit_items.send, clock.monotonic, [0.0]

    def paused_after_the_permit(action: dict[str, Any], **kwargs: Any) -> Any:
        answer = real_send(action, **kwargs)
        if action["Key"]["sk"]["S"].startswith(records.PERMIT_PREFIX) and not offset[0]:
            offset[0] = 30.0  # its whole lease passed before the answer came
        return answer

    monkeypatch.setattr(clock, "monotonic", lambda: real_mono() + offset[0])
    monkeypatch.setattr(permit_items, "send", paused_after_the_permit)
    late = take(holds, "pool", limit=9, lease=30, wait=5)
    assert offset[0] and not late.lost
    assert late.seconds_left() > 20  # trusted from the renewal's send, not the take's
    (permit,) = [p for p in permit_items.permits("pool") if p.token == late.token]
    assert permit.holder.expires_ms >= clock.now_ms() + 25_000
    late.renew()  # still ours


def test_a_reader_items_renewal_whose_sentinel_raise_keeps_meeting_others_fails_for_now(
    holds: list[Any], one_second_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each raise of the sentinel refused by another's write that left it below our lease:
    after three, the renewal fails for a passing cause (the heartbeat tries again); the hold
    is not lost, the item is not renewed past the sentinel, and the next renewal takes."""
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    mine = readers[-1]
    before = item_end(mine.token)
    real_send, refusals = items.send, []

    def others_first(action: dict[str, Any], **kwargs: Any) -> Any:
        raising = "#h.#s.e < :cover" in action.get("ConditionExpression", "")
        if raising and len(refusals) < 3:
            refusals.append(action)
            raise dynamodb.Refused(lock_rows.get_item("doc"))  # as another's write left it
        return real_send(action, **kwargs)

    monkeypatch.setattr(items, "send", others_first)
    frozen_wall(monkeypatch, 2)
    with pytest.raises(SemaphoreUnavailable) as caught:
        mine.renew()
    assert caught.value.transient and len(refusals) == 3
    assert not mine.lost and item_end(mine.token) == before
    mine.renew()
    assert sentinel_end() >= item_end(mine.token) > before
