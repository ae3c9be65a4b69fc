"""No hold reaches the caller with its trusted deadline behind it, or barely ahead of it.

The three-host soak of 2026-11-27 (docs/RELIABILITY.md) found shared and permit holds
returned by ``acquire`` with their lease already over: the host had been cut off from
DynamoDB between the winning write and its answer. Here the answer of the winning write (or
of a read the take waited on) comes back late through botocore's own events, on every route
a shared or counting hold takes to its caller: permit items, one resource or several, sync
and async; reader items, one resource or several; holders inline in the row. Whatever came
late, the hold returned must be trusted for at least ``CONFIRM_SHARE`` of its window (then
the heartbeat has time to renew it), the table must hold it for us for as long as we trust
it, and the other holders keep theirs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine.core import CONFIRM_SHARE
from dynasem._engine.hold import Held
from dynasem._storage import dynamodb, lock_rows, records
from dynasem._storage import lock_writes as writes
from dynasem._storage import permit_items as slots
from dynasem._storage import reader_items as items
from dynasem.testing import abandon
from tests.support.helpers import queue_of, take, wait_for

pytestmark = pytest.mark.django_db(transaction=False)

LEASE = 2.0
SKEW = 0.5  # tests/conftest.py's CLOCK_SKEW
# Late by more than the lease: the hold's trust (lease - skew from the write's send) is over.
PAST = LEASE + 0.3
# Late by less than the window but by more than its last third: a hold returned then would be
# lost moments into its block, before the heartbeat's first renewal could land.
NEARLY = (LEASE - SKEW) * (1 - CONFIRM_SHARE) + 0.2
MARGIN = (LEASE - SKEW) * CONFIRM_SHARE


class LateAnswers:
    """The answer of the first ``times`` requests of ``operation`` that ``match`` (their JSON
    body) and succeed comes back ``delay`` seconds after DynamoDB applied them: a host cut off
    between its write and the answer (botocore's ``needs-retry`` event follows each answer)."""

    def __init__(
        self, operation: str, match: Callable[[dict[str, Any]], bool], delay: float, times=1
    ):
        self.operation, self.match, self.delay = operation, match, delay
        self.remaining, self.fired = times, 0
        self._lock = threading.Lock()
        self.client = dynamodb.get_client()

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        if response is None or response[0].status_code != 200:
            return  # no answer, or a refusal: the write that wins is the one made late
        body = json.loads(request_dict["body"] or b"{}")
        with self._lock:
            if self.remaining <= 0 or not self.match(body):
                return
            self.remaining -= 1
            self.fired += 1
        time.sleep(self.delay)

    def __enter__(self) -> LateAnswers:
        self.client.meta.events.register(f"needs-retry.dynamodb.{self.operation}", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister(f"needs-retry.dynamodb.{self.operation}", self._hook)


def sk_of(body: dict[str, Any]) -> str:
    return str(body.get("Key", {}).get("sk", {}).get("S", ""))


def by(user: str, body: dict[str, Any]) -> bool:
    return f'"{user}"' in json.dumps(body.get("ExpressionAttributeValues", {}))


def permit_take(body: dict[str, Any]) -> bool:
    return sk_of(body).startswith(records.PERMIT_PREFIX) and by("late", body)


def row_take(body: dict[str, Any]) -> bool:
    return sk_of(body) == "lock" and "#fence" in body.get("UpdateExpression", "")


def reader_item(body: dict[str, Any]) -> bool:
    return sk_of(body).startswith(records.READER_PREFIX) and by("late", body)


def admission(body: dict[str, Any]) -> bool:
    update = body.get("UpdateExpression", "")
    return sk_of(body) == "lock" and "#rc" in update and "#fence" in update


def late_users_write(body: dict[str, Any]) -> bool:
    return sk_of(body) == "lock" and by("late", body)


def any_transaction(body: dict[str, Any]) -> bool:
    return True


def stored_lease_ends(held: Held) -> dict[str, int]:
    """Each resource's lease end of ``held`` as the table has it (ms): its permit, its reader
    item or its entry among the row's holders."""
    ends = {}
    for resource in held.resources:
        found = {p.token: p.holder.expires_ms for p in slots.permits(resource) if p.token}
        found.update({r.token: r.holder.expires_ms for r in items.readers(resource)})
        row = lock_rows.get(resource, consistent=True)
        if row is not None:
            found.update({t: h.expires_ms for t, h in row.holders.items()})
        assert held.token in found, f"{resource!r}: the table has no hold of {held.token}"
        ends[resource] = found[held.token]
    return ends


def check_returned(held: Held, left: float, at: float, others: list[Held]) -> None:
    """``held`` was returned at wall time ``at`` with ``left`` seconds of trust: comfortably
    ahead, the table holds it for us at least that long, and the others still hold."""
    assert not held.lost
    assert left >= MARGIN, f"returned with {left:.3f}s of trust left, less than {MARGIN:.3f}s"
    for resource, end_ms in stored_lease_ends(held).items():
        # Others take it over CLOCK_SKEW after the stored end: we stop trusting before.
        assert at + left <= end_ms / 1000 - SKEW + 0.05, (
            f"{resource!r}: trusted until {at + left:.3f}, the table's lease ends "
            f"{end_ms / 1000:.3f}"
        )
    for other in others:
        other.renew()  # still theirs: a take never disturbed them
        assert not other.lost
    held.release()  # ours to the end: no LockLost


def acquire_late(
    holds: list[Any], late: LateAnswers, resource: Any, **kwargs: Any
) -> tuple[Held, float, float]:
    with late:
        held = semaphore(resource, user="late", lease=LEASE, **kwargs).acquire()
        left, at = held.seconds_left(), time.time()
    holds.append(held)
    assert late.fired == 1, "the late answer never came: the test missed its write"
    return held, left, at


@pytest.fixture
def permit_items(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting semaphores of more than one permit keep their holders in permit items."""
    monkeypatch.setattr(slots, "INLINE_MAX", 1)


@pytest.fixture
def reader_items(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared resource keeps one reader in its row, the next ones in reader items."""
    monkeypatch.setattr(writes, "READERS_INLINE", 1)
    monkeypatch.setattr(items, "READERS_INLINE", 1)


@pytest.fixture
def inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every holder in the row: no permit items, no reader items."""
    monkeypatch.setattr(slots, "INLINE_MAX", 100)
    monkeypatch.setattr(writes, "READERS_INLINE", 100)
    monkeypatch.setattr(items, "READERS_INLINE", 100)


# -- permit items ------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [PAST, NEARLY], ids=["past", "nearly"])
@pytest.mark.parametrize("which", ["row", "permit"])
def test_permit_answered_late(holds: list[Any], permit_items: None, which: str, delay: float):
    other = take(holds, "pool-late", limit=4, user="other", lease=30)
    match = permit_take if which == "permit" else (lambda b: row_take(b) and not by("other", b))
    late = LateAnswers("UpdateItem", match, delay)
    held, left, at = acquire_late(holds, late, "pool-late", limit=4)
    check_returned(held, left, at, [other])


def test_permit_planned_before_a_slow_read(holds: list[Any], permit_items: None) -> None:
    """The permit's lease end is fixed from the clock: read after the look for a free slot
    (which took longer than the lease), not before it."""
    dead = [semaphore("pool-read", limit=2, user=f"dead{i}", lease=1).acquire() for i in range(2)]
    for held in dead:
        abandon(held)  # they died holding: no release, no renewal
    time.sleep(1 + SKEW + 0.1)
    look = LateAnswers("Query", lambda b: True, PAST)
    held, left, at = acquire_late(holds, look, "pool-read", limit=2)
    check_returned(held, left, at, [])


@pytest.mark.parametrize("delay", [PAST, NEARLY], ids=["past", "nearly"])
def test_permits_of_several_resources_answered_late(
    holds: list[Any], permit_items: None, delay: float
) -> None:
    other = take(holds, ["pool-x", "pool-y"], limit=4, user="other", lease=30)
    late = LateAnswers("TransactWriteItems", any_transaction, delay)
    held, left, at = acquire_late(holds, late, ["pool-x", "pool-y"], limit=4)
    check_returned(held, left, at, [other])


def test_permit_answered_late_async(holds: list[Any], permit_items: None) -> None:
    other = take(holds, "pool-async", limit=4, user="other", lease=30)

    async def main() -> tuple[Held, float, float]:
        held = await semaphore("pool-async", limit=4, user="late", lease=LEASE).aacquire()
        return held, held.seconds_left(), time.time()

    with LateAnswers("UpdateItem", permit_take, PAST) as late:
        held, left, at = asyncio.run(main())
    holds.append(held)
    assert late.fired == 1
    check_returned(held, left, at, [other])


# -- reader items ------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [PAST, NEARLY], ids=["past", "nearly"])
@pytest.mark.parametrize("which", ["admission", "item"])
def test_reader_item_answered_late(
    holds: list[Any], reader_items: None, which: str, delay: float
) -> None:
    first = take(holds, "doc-late", shared=True, user="other", lease=30)
    second = take(holds, "doc-late", shared=True, user="other2", lease=30)
    assert items.has_readers(lock_rows.get("doc-late", consistent=True))  # items are in use
    match = reader_item if which == "item" else admission
    late = LateAnswers("UpdateItem", match, delay)
    held, left, at = acquire_late(holds, late, "doc-late", shared=True)
    check_returned(held, left, at, [first, second])


@pytest.mark.parametrize("delay", [PAST, NEARLY], ids=["past", "nearly"])
def test_readers_of_several_resources_answered_late(
    holds: list[Any], reader_items: None, delay: float
) -> None:
    others = [take(holds, ["doc-x", "doc-y"], shared=True, user=f"o{i}", lease=30) for i in (1, 2)]
    late = LateAnswers("TransactWriteItems", any_transaction, delay)
    held, left, at = acquire_late(holds, late, ["doc-x", "doc-y"], shared=True)
    check_returned(held, left, at, others)


def test_reader_item_answered_late_async(holds: list[Any], reader_items: None) -> None:
    first = take(holds, "doc-async", shared=True, user="other", lease=30)
    second = take(holds, "doc-async", shared=True, user="other2", lease=30)

    async def main() -> tuple[Held, float, float]:
        held = await semaphore("doc-async", shared=True, user="late", lease=LEASE).aacquire()
        return held, held.seconds_left(), time.time()

    with LateAnswers("UpdateItem", reader_item, PAST) as late:
        held, left, at = asyncio.run(main())
    holds.append(held)
    assert late.fired == 1
    check_returned(held, left, at, [first, second])


# -- holders in the row ------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [PAST, NEARLY], ids=["past", "nearly"])
@pytest.mark.parametrize("kind", ["shared", "counting", "several"])
def test_inline_hold_answered_late(holds: list[Any], inline: None, kind: str, delay: float):
    resource: Any = ["row-x", "row-y"] if kind == "several" else f"row-{kind}"
    how: dict[str, Any] = {"shared": True} if kind != "counting" else {"limit": 3}
    other = take(holds, resource, user="other", lease=30, **how)
    if kind == "several":
        late = LateAnswers("TransactWriteItems", any_transaction, delay)
    else:
        late = LateAnswers("UpdateItem", late_users_write, delay)
    held, left, at = acquire_late(holds, late, resource, **how)
    check_returned(held, left, at, [other])


@pytest.mark.parametrize("delay", [PAST, NEARLY], ids=["past", "nearly"])
def test_hand_over_answered_late(holds: list[Any], delay: float) -> None:
    """A reader in line is handed the lock by the writer's release, whose answer (and so the
    push that follows it) comes late: the reader trusts it from the release's send, through
    the stored lease end, and confirms it before its block begins."""
    writer = take(holds, "hand-late", user="writer", lease=30)
    got: list[tuple[Held, float, float]] = []

    def wait_in_line() -> None:
        sem = semaphore("hand-late", shared=True, fair=True, user="late", lease=LEASE, wait=30)
        held = sem.acquire()
        got.append((held, held.seconds_left(), time.time()))

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    wait_for(lambda: queue_of("hand-late"), 30, "the reader in line")
    with LateAnswers("UpdateItem", late_users_write, delay) as late:
        writer.release()  # hands over to the reader in its release write
        waiter.join(30)
    assert late.fired == 1 and got, "no hand-over came"
    held, left, at = got[0]
    holds.append(held)
    check_returned(held, left, at, [])
