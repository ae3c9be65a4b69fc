"""Second-round review of the session's counting mends (readers: the bar of an interrupted
admission's item write)."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreUnavailable, semaphore
from dynasem._storage import dynamodb
from tests.engine.test_readers_lost import no_writer_beside
from tests.support.faults import _error_response
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)


class LostUndo:
    """The first try of the undo's write of a reader item (it leaves our tombstone, if the
    item is there) answered with a 500, never sent: botocore sends it again."""

    def __init__(self) -> None:
        self.fired = 0
        self.client = dynamodb.get_client()

    def _hook(self, request: Any, **kwargs: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if self.fired or b"attribute_exists(#e) OR (#bt" not in body:
            return None
        self.fired += 1
        return _error_response(500, "InternalServerError", "lost (test)")

    def __enter__(self) -> LostUndo:
        self.client.meta.events.register_first("before-send.dynamodb.UpdateItem", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("before-send.dynamodb.UpdateItem", self._hook)


def test_an_item_write_timed_out_whose_delete_was_sent_twice_is_barred_too(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's item write times out at every try (the admission counted it): the undo's
    delete of the item is answered with a 500 (never applied: there was no item) and
    botocore's re-send is refused, no item there. Taken for our own write whose answer was
    lost, the reader was counted down at once, unbarred; the first try then landed: a reader
    nobody counts, whose operator's break counted the row down once more, the count of the
    reader beside it: the sentinel came off and a writer took the lock while that reader
    held. Now the undo bars the item's write before it counts the reader down."""
    from dynasem._engine import reader_hold
    from dynasem._storage import reader_items
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    assert counted("doc") == (1, 1)
    send = reader_items.send
    put: list[dict[str, Any]] = []

    def cut_short(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"]:
            put.append(action)  # timed out, each try: the first one lands later
            raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
        return send(action, **kwargs)

    monkeypatch.setattr(reader_items, "send", cut_short)
    reader = semaphore("doc", shared=True, lease=30)
    with LostUndo() as lost, pytest.raises(SemaphoreUnavailable):
        reader.acquire()  # the undo's first try never applied; botocore sends it again
    monkeypatch.undo()
    assert lost.fired == 1, "the undo's write was not sent twice"
    token = put[0]["Key"]["sk"]["S"][2:]
    try:
        send(put[0])  # the item's first write lands after the undo
    except dynamodb.Refused:
        pass  # barred
    reader_hold.break_reader("doc", token)  # an operator breaks the reader listed, if any
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)  # the reader beside it holds: no writer may
    assert counted("doc") == (1, 1)


def test_an_item_write_timed_out_that_lands_after_the_undos_delete_is_barred(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's item write times out at every try (the admission counted it); the first
    try is still on its way, the later ones landed (their answers lost). The undo deletes
    the item and counts the reader down; then the first try lands, over no tombstone: a
    reader nobody counts, whose operator's break counts the row down once more, the count
    of the reader beside it: the sentinel comes off, a writer takes the lock beside it."""
    from dynasem._engine import reader_hold
    from dynasem._storage import reader_items
    from tests.engine.test_readers_lost import INLINE, counted

    reader_hold.rows.clear()
    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    assert counted("doc") == (1, 1)
    send = reader_items.send
    put: list[dict[str, Any]] = []

    def timed_out(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"]:
            if put:  # a later try: applied, its answer lost
                send(action, **kwargs)
            put.append(action)  # the first: still on its way
            raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)
        return send(action, **kwargs)

    monkeypatch.setattr(reader_items, "send", timed_out)
    with pytest.raises(SemaphoreUnavailable):
        semaphore("doc", shared=True, lease=30).acquire()
    monkeypatch.undo()
    assert counted("doc") == (1, 1)  # counted down, its item deleted
    token = put[0]["Key"]["sk"]["S"][2:]
    try:
        send(put[0])  # the first try lands after the undo
    except dynamodb.Refused:
        pass  # barred
    reader_hold.break_reader("doc", token)  # an operator breaks the reader listed, if any
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)  # the reader beside it holds: no writer may
