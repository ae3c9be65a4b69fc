"""The eighth review: counting, shared and several-resource holds (each test failed before its
mend, or is a strict xfail whose reason says what is left)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._storage import dynamodb, lock_rows, permit_items
from tests.engine.test_readers_lost import no_writer_beside
from tests.support.faults import _error_response
from tests.support.helpers import queue_of, take, wait_for

pytestmark = pytest.mark.django_db(transaction=False)


class ThrottledHints:
    """The first ``times`` attempts of a freed slot's hint (``list_append(#hints``) sent by
    this thread are throttled, never sent: a hot row's partition past its throughput for as
    long as botocore's own tries of one request last."""

    def __init__(self, times: int) -> None:
        self.remaining, self.fired = times, 0
        self.thread = threading.get_ident()
        self.client = dynamodb.get_client()

    def _hook(self, request: Any, **kwargs: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if threading.get_ident() != self.thread or b"list_append(#hints" not in body:
            return None
        if self.remaining <= 0:
            return None
        self.remaining -= 1
        self.fired += 1
        return _error_response(400, "ProvisionedThroughputExceededException", "throttled (test)")

    def __enter__(self) -> ThrottledHints:
        self.client.meta.events.register_first("before-send.dynamodb.UpdateItem", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("before-send.dynamodb.UpdateItem", self._hook)


def test_a_permit_whose_hint_was_throttled_still_reaches_the_waiter_in_line(
    holds: list[Any],
) -> None:
    """Every permit held (their leases 30 s), a waiter in line has read them all: it reads
    them again only once the first of their leases is over. A holder gives its permit back,
    and its slot's hint is throttled through botocore's retries (the row's partition is the
    crowd's): the slot is free, unhinted, nobody is pushed, and the waiter's paced looks
    trust its read, so it waited out the first lease (30 s) beside a free permit. The hint
    is sent again while it is throttled, as any give-back is (resend.patiently)."""
    held = [take(holds, "pool", limit=9, lease=30) for _ in range(9)]
    got: list[Any] = []
    failed: list[BaseException] = []

    def waiter() -> None:
        try:
            got.append(take([], "pool", limit=9, wait=8, lease=30))
        except BaseException as exc:  # busy past its wait: reported below
            failed.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_for(lambda: queue_of("pool"), 10, "the waiter never put its entry")
    with ThrottledHints(4) as throttled:  # botocore's four tries of one request
        held[-1].release()
    holds.remove(held[-1])
    assert throttled.fired == 4
    started = time.monotonic()
    thread.join(20)
    holds.extend(got)
    assert got, f"the waiter never found the free permit: {failed!r}"
    assert time.monotonic() - started < 5


def _gives_a_permit_back(body: dict[str, Any]) -> bool:
    return "SET #lt = :tok" in body.get("UpdateExpression", "")


@pytest.mark.kind_engine_only("loses one write's answer after the engine applied it")
def test_an_interrupted_takes_permit_given_back_with_its_answer_lost_is_hinted(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after a take's permit write: the undo gives the permit back, applied, its answer
    lost, and botocore's re-send is refused (the permit is free, our token gone). The
    refusal shows our own give-back (``lt``: our token), as a release's does: the slot is
    hinted (and the first waiter pushed). Before, it was taken for nothing of ours: the slot
    was free, unhinted, and a waiter in line that had read the permits held waited for the
    first of their leases to end (see the test above)."""
    from tests.engine.test_readers_lost import LoseAnswer

    send = permit_items.send

    def interrupted(action: dict[str, Any], **kwargs: Any) -> Any:
        result = send(action, **kwargs)  # the write lands...
        if str(action.get("UpdateExpression", "")).startswith("SET #k = :tok"):
            raise KeyboardInterrupt  # ...and Ctrl-C comes before its answer is used
        return result

    take(holds, "pool", limit=16, lease=30)
    monkeypatch.setattr(permit_items, "send", interrupted)
    with LoseAnswer(_gives_a_permit_back) as lost:
        with pytest.raises(KeyboardInterrupt), semaphore("pool", limit=16, lease=30):
            pytest.fail("the block must not run")
    monkeypatch.undo()
    assert lost.fired == 1, "the give-back's answer was never lost: the test missed its write"
    assert [p.slot for p in permit_items.permits("pool") if p.token] == [0]
    row = lock_rows.get_item("pool")
    assert row is not None
    assert [int(x) for x in row["hints"]] == [1]


def test_an_admission_cut_short_and_broken_before_its_bar_is_counted_down_once(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a reader's item write is on its way (the admission counted it): the undo
    finds no item to delete, so it bars the item's write with a tombstone of its own and
    counts the reader down. Between its delete and its bar the write lands, and an operator
    breaks that reader (a tombstone; the break counts it down). The bar must not take the
    break's tombstone for an empty place: it wrote over it and counted the reader down a
    second time, the count of the reader beside it: the sentinel came off, and a writer took
    the lock while that reader held (renewing). Now the bar is refused by the break's
    tombstone, whose count-down stands, and the admission's mark comes off the row."""
    from dynasem._engine import reader_hold
    from dynasem._storage import reader_items
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    assert counted("doc") == (1, 1)
    send, barred = reader_items.send, reader_hold._barred
    put: list[dict[str, Any]] = []
    broken: list[bool] = []

    def cut_short(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if not put and sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"]:
            put.append(action)  # on its way: it lands later
            raise KeyboardInterrupt
        return send(action, **kwargs)

    def landed_and_broken(
        resource: str, token: str, fence: int, over: int | None = None
    ) -> bool | None:
        if not broken:
            send(put[0])  # the item's write lands after the undo's delete was refused...
            broken.append(reader_hold.break_reader(resource, token))  # ...and is broken
        return barred(resource, token, fence, over)

    monkeypatch.setattr(reader_items, "send", cut_short)
    monkeypatch.setattr(reader_hold, "_barred", landed_and_broken)
    with pytest.raises(KeyboardInterrupt):
        semaphore("doc", shared=True, lease=30).acquire()
    monkeypatch.undo()
    assert broken == [True], "the operator's break did not land before the bar"
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)  # the reader beside it holds: no writer may
    assert counted("doc") == (1, 1)
