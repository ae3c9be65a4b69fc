"""Third-round review of readers held in items (an item write's late try, after the hold
that it made was given back)."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import SemaphoreBusy, SemaphoreUnavailable, semaphore
from dynasem._storage import dynamodb
from tests.support.helpers import in_another_thread, take

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
    other.renew()
    assert not other.lost  # the reader beside it holds: no writer may
    writers: list[Any] = []

    def writer() -> None:  # another thread: this one holds readers
        try:
            writers.append(semaphore("doc", wait=0, lease=30).acquire())
        except SemaphoreBusy:
            pass

    in_another_thread(writer)
    holds.extend(writers)
    assert not writers, f"two holders: reader {other.token[:8]} and a writer"
