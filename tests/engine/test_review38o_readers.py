"""Third-round review of readers held in items (an item write's late try, after the hold
that it made was given back)."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreUnavailable, semaphore
from dynasem._storage import dynamodb
from tests.engine.test_readers_lost import no_writer_beside
from tests.support.faults import _error_response
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)


def test_an_item_write_whose_first_try_lands_after_the_release_is_barred(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's item write times out once (that try still on its way); the next try lands
    and the reader holds, then releases: its item deleted, its count down. The first try
    lands then, over no tombstone: a reader nobody counts, whose operator's break counts
    the row down once more, the count of the reader beside it: the sentinel comes off, a
    writer takes the lock beside it."""
    from dynasem._engine import reader_hold
    from dynasem._storage import reader_items
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    assert counted("doc") == (1, 1)
    send = reader_items.send
    put: list[dict[str, Any]] = []

    def timed_out_once(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"] and not put:
            put.append(action)  # the first try: still on its way
            raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
        return send(action, **kwargs)

    monkeypatch.setattr(reader_items, "send", timed_out_once)
    reader = semaphore("doc", shared=True, lease=30).acquire()
    monkeypatch.undo()
    assert put and counted("doc") == (2, 2)
    reader.release()
    assert counted("doc") == (1, 1)
    try:
        send(put[0])  # the first try lands after the release
    except dynamodb.Refused:
        pass  # barred
    reader_hold.break_reader("doc", reader.token)  # an operator breaks the reader, if listed
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_an_item_write_resent_by_botocore_whose_first_try_lands_after_the_release_is_barred(
    holds: list[Any],
) -> None:
    """As above, but the item's write timed out inside botocore, which sent it again at
    once (that one landed, and answered): our code saw one answer, no failure. The first
    try lands after the release's delete: a reader nobody counts, whose break counts the
    row down again, the count of the reader beside it."""
    import json

    from dynasem._engine import reader_hold
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    client = dynamodb.get_client()
    first: list[dict[str, Any]] = []

    def timed_out_once(request: Any, **kwargs: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if first or b"REMOVE #bt" not in body:
            return None
        first.append(json.loads(body))  # still on its way: botocore sends it again
        return _error_response(500, "InternalServerError", "timed out (test)")

    event = "before-send.dynamodb.UpdateItem"
    client.meta.events.register_first(event, timed_out_once)
    try:
        reader = semaphore("doc", shared=True, lease=30).acquire()
    finally:
        client.meta.events.unregister(event, timed_out_once)
    assert first and counted("doc") == (2, 2)
    reader.release()
    assert counted("doc") == (1, 1)
    try:
        client.update_item(**first[0])  # the first try lands after the release
    except client.exceptions.ConditionalCheckFailedException:
        pass  # barred
    reader_hold.break_reader("doc", reader.token)  # an operator breaks the reader, if listed
    for held in inline:
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_an_earlier_admissions_item_write_landing_over_the_same_tokens_next_item_is_refused(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's item write times out (that try still on its way); the next try lands, its
    answer late (the process paused): the admission is given back, its item our tombstone,
    its count down (the epoch closes), and the same token admitted again, in the next
    epoch, whose item is written over the tombstone. The first try lands then, over that
    item: its epoch, the old one. A writer finds no reader of the live epoch, writes it off
    and takes the lock, while that reader holds (and renews)."""
    from dynasem import _clock as clock
    from dynasem._engine import reader_hold, readers
    from dynasem._storage import lock_rows, reader_items
    from tests.engine.test_readers_lost import INLINE

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=300) for _ in range(INLINE)]
    send, monotonic, paused = reader_items.send, clock.monotonic, [0.0]
    put: list[dict[str, Any]] = []

    def late(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"] and len(put) < 2:
            put.append(action)
            if len(put) == 1:  # the first try: still on its way
                raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
            paused[0] = 30.0  # the next lands, its answer late: the process paused
        return send(action, **kwargs)

    monkeypatch.setattr(reader_items, "send", late)
    monkeypatch.setattr(clock, "monotonic", lambda: monotonic() + paused[0])
    reader = semaphore("doc", shared=True, lease=30, wait=30).acquire()
    holds.append(reader)
    monkeypatch.setattr(reader_items, "send", send)
    assert len(put) == 2
    epoch = reader.epochs["doc"]
    assert put[0]["ExpressionAttributeValues"][":ep"] != {"N": str(epoch)}
    try:
        send(put[0])  # the first admission's first try lands now
    except dynamodb.Refused:
        pass  # refused: the item of a later admission is there
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    readers.try_write_off(lock_rows.get("doc"), skew=0.5)  # a writer, its wait over
    no_writer_beside(holds, reader)


def test_an_earlier_admissions_item_write_landing_after_the_same_tokens_release_is_barred(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, beside another reader in an item (the epoch stays open): the same token
    admitted again joins it, and releases (its own item's write was answered at once). The
    earlier admission's first try lands after that release's delete: a reader nobody
    counts, whose break counts the row down again, the count of the reader beside it."""
    from dynasem import _clock as clock
    from dynasem._engine import reader_hold
    from dynasem._storage import reader_items
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=300) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=300)  # in an item
    send, monotonic, paused = reader_items.send, clock.monotonic, [0.0]
    put: list[dict[str, Any]] = []

    def late(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"] and len(put) < 2:
            put.append(action)
            if len(put) == 1:  # the first try: still on its way
                raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
            paused[0] = 30.0  # the next lands, its answer late: the process paused
        return send(action, **kwargs)

    monkeypatch.setattr(reader_items, "send", late)
    monkeypatch.setattr(clock, "monotonic", lambda: monotonic() + paused[0])
    reader = semaphore("doc", shared=True, lease=30, wait=30).acquire()
    monkeypatch.setattr(reader_items, "send", send)
    assert len(put) == 2 and counted("doc") == (2, 2)
    reader.release()
    try:
        send(put[0])  # the first admission's first try lands now
    except dynamodb.Refused:
        pass  # barred
    reader_hold.break_reader("doc", reader.token)  # an operator breaks the reader, if listed
    for held in inline:
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_an_admission_whose_item_never_landed_is_counted_down_over_an_earlier_tombstone(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admission answered late is given back (its item our tombstone) and the same token
    admitted again, whose item's write times out at every try, none landed. Its undo finds
    the earlier admission's tombstone of ours, not a break of this one: the reader is
    counted down (the tombstone barring the write under this admission's fence). Before,
    it was taken for a break, and the count stayed one too high: writers waited for a
    write-off though nobody read."""
    from dynasem import _clock as clock
    from dynasem._engine import reader_hold
    from dynasem._storage import reader_items
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    for _ in range(INLINE):
        take(holds, "doc", shared=True, lease=300)
    take(holds, "doc", shared=True, lease=300)  # in an item: the epoch stays open
    send, monotonic, paused = reader_items.send, clock.monotonic, [0.0]
    put: list[dict[str, Any]] = []

    def late_then_lost(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"]:
            put.append(action)
            if len(put) > 1:  # the next admission's: none lands
                raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
            paused[0] = 30.0  # the first lands, its answer late: the process paused
        return send(action, **kwargs)

    monkeypatch.setattr(reader_items, "send", late_then_lost)
    monkeypatch.setattr(clock, "monotonic", lambda: monotonic() + paused[0])
    with pytest.raises(SemaphoreUnavailable):
        semaphore("doc", shared=True, lease=30, wait=30).acquire()
    monkeypatch.setattr(reader_items, "send", send)
    assert len(put) == 1 + 4
    assert counted("doc") == (1, 1)  # the reader beside it, alone
