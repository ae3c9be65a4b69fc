"""A reader admission cut short while its item's write is in flight (review s31-4 of the
thirty-first session's own mend; each test failed on 77f7d2a, before the bar).

Mended: before the undo counts such a reader down on the row's mark, it writes a tombstone of
its own where the item is not (reader_items.bar_reader): the write on the wire is refused
when it lands. What the review found:

Commit 77f7d2a made the undo of an admission whose item it cannot find count the reader down
(``reader_hold.undo``: no item, no tombstone, the row's mark still ours). Its own message says
"a write of the item still on its way makes an item nobody holds, for its TTL". That item is
not harmless: it is a reader item of the live epoch, with a lease end, that every operator
path reads as a reader, and each of them counts it down once more when it breaks it -- the
reaper's dead-reader sweep (``dynasem_reap``) automatically, ``dynasem_release`` / the admin's
break when an operator clears the stuck "holder" it lists. The count then goes one below the
readers really holding: the last real reader is still renewing when the count reaches 0, the
sentinel comes off, and a writer takes the resource beside it.

Interleaving (one real item reader R, one admission A cut short):
1. A's row write lands (rc 1 -> 2, rlast = A's mark).
2. A sends its item's write; an interrupt (Ctrl-C, a task's time limit) raises while it waits
   for the answer: the request is on the wire, not applied yet.
3. The driver runs A's undo: the item's delete finds no item (refused, item None), so the
   undo counts down on the mark: rc 2 -> 1 (R only). Correct so far.
4. A's item write is applied now (DynamoDB answers requests in any order; the undo went on
   another connection): item r#A, epoch as the row's, lease end 30 s ahead. Nobody holds it.
5. The item is listed as a reader of the resource (``locks.holds_on``). Once its lease is
   over, the reaper breaks it as a dead reader (tombstone, then ``count_down``): rc 1 -> 0,
   the sentinel comes off. Or an operator breaks it at once: the same.
6. R still holds (renews, not lost); a writer with wait=0 takes the resource: two holders.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import reader_hold as reader_held
from dynasem._operators import locks, reaper
from dynasem._storage import lock_rows
from dynasem._storage import reader_items as items
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)

INLINE = max(1, items.READERS_INLINE)
SKEW = 0.5  # tests/conftest.py's CLOCK_SKEW


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    reader_held.rows.clear()


def counted(resource: str) -> tuple[int, int]:
    stored = lock_rows.get_item(resource)
    assert stored is not None
    found = [r for r in items.readers(resource) if r.epoch == stored.get("repoch", 0)]
    return int(stored.get("rc", 0)), len(found)


def _admission_cut_short_while_its_item_is_in_flight(
    monkeypatch: pytest.MonkeyPatch, resource: str, lease: float
) -> str:
    """A reader's acquire of ``resource`` interrupted while its item's write is on the wire;
    that write is applied only after the acquire's undo has run. Returns the reader's token."""
    send, in_flight = items.send, []

    def interrupted(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action["Key"]["sk"]["S"]
        if sk.startswith("r#") and "#ep" in action["UpdateExpression"] and not in_flight:
            in_flight.append(action)  # sent, not applied yet
            raise KeyboardInterrupt  # while waiting for its answer
        return send(action, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(items, "send", interrupted)
        with pytest.raises(KeyboardInterrupt):
            semaphore(resource, shared=True, lease=lease).acquire()
    assert in_flight, "the acquire was never interrupted: the test missed its item write"
    # Here the undo has counted the reader down on its mark: rc is R's 1.
    assert not _lands(send, in_flight[0]), "the write on the wire made an item nobody counts"
    return str(in_flight[0]["Key"]["sk"]["S"][2:])


def _lands(send: Any, action: dict[str, Any]) -> bool:
    """The item's write on the wire, applied now; False: refused (the undo's tombstone)."""
    try:
        send(action)
    except items.Refused:
        return False
    return True


def _writer_beside(reader: Any, resource: str, holds: list[Any]) -> None:
    reader.renew()
    assert not reader.lost  # the reader holds, and renews
    try:
        writer = semaphore(resource, wait=0, lease=30).acquire()
    except SemaphoreBusy:
        return
    holds.append(writer)
    pytest.fail(
        f"two holders: reader {reader.token[:8]} (shared, renewing, not lost) and writer "
        f"{writer.token[:8]} (exclusive, fence {writer.fence}); count {counted(resource)}"
    )


def test_the_reaper_breaking_the_item_of_an_admission_cut_short_lets_a_writer_in_beside_a_reader(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    others = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    reader = others[-1]  # in an item
    assert counted("doc") == (1, 1)
    ghost = _admission_cut_short_while_its_item_is_in_flight(monkeypatch, "doc", lease=2.0)
    for held in others[:-1]:  # the inline readers leave: only the item reader holds
        held.release()
        holds.remove(held)
    time.sleep(2.0 + 2 * SKEW + 0.2)  # the ghost's lease and the skew are over
    reader.renew()
    reaper.reap()
    assert ghost not in {r.token for r in items.readers("doc")}
    _writer_beside(reader, "doc", holds)


def test_an_operator_breaking_the_listed_item_of_an_admission_cut_short_lets_a_writer_in(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    others = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    reader = others[-1]
    ghost = _admission_cut_short_while_its_item_is_in_flight(monkeypatch, "doc", lease=30)
    # Had it landed, the operator would see a holder nobody is (dynasem_locks doc, the
    # admin) and break it: it is not there to break.
    assert ghost not in {h.token for h in locks.holds_on("doc")}
    for held in others[:-1]:
        held.release()
        holds.remove(held)
    assert not locks.break_hold("doc", ghost)
    _writer_beside(reader, "doc", holds)


def test_an_admission_interrupted_during_its_item_write_is_counted_down_twice(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No operator at all (found by the simulator: ``--seeds 110 --mix breaks --faults
    interrupts --readers-from 0 --permits-from 1 --interrupts 0.3``, which passes on 39fdb73).

    An interrupt while the item's write is on the wire: the driver (steps._interrupted) gives
    back the step (the item's Write: reader_hold.undo(counted=...)) and then ``taken``, the
    admission's row Write, which since 77f7d2a carries an undo of its own
    (Acquire.admission_undo). The first finds no item and counts the reader down on its mark
    (removing the mark); the item's write lands now; the second finds the item, deletes it
    and counts the reader down again (after a delete that took an item, unconditionally).
    The count is one below the readers holding: the sentinel comes off while R holds, and a
    writer takes the resource beside R."""
    others = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    reader = others[-1]
    for held in others[:-1]:
        held.release()
        holds.remove(held)
    assert counted("doc") == (1, 1)
    send, undo, in_flight, undos = items.send, reader_held.undo, [], []
    landed: list[bool] = []

    def interrupted(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action["Key"]["sk"]["S"]
        if sk.startswith("r#") and "#ep" in action["UpdateExpression"] and not in_flight:
            in_flight.append(action)  # sent, not applied yet
            raise KeyboardInterrupt  # while waiting for its answer
        return send(action, **kwargs)

    def undo_then_the_write_lands(*args: Any, **kwargs: Any) -> Any:
        done = undo(*args, **kwargs)
        undos.append(counted("doc"))
        if len(undos) == 1:  # the item's write on the wire lands between the two undos
            landed.append(_lands(send, in_flight[0]))
        return done

    with monkeypatch.context() as patch:
        patch.setattr(items, "send", interrupted)
        patch.setattr(reader_held, "undo", undo_then_the_write_lands)
        with pytest.raises(KeyboardInterrupt):
            semaphore("doc", shared=True, lease=30).acquire()
    assert in_flight, "the acquire was never interrupted: the test missed its item write"
    # On 77f7d2a: undos == [(1, 1), (0, 1)], counted down by the first and again by the
    # second; now the write is barred and the second finds our tombstone.
    assert landed == [False] and undos == [(1, 1), (1, 1)], (landed, undos)
    _writer_beside(reader, "doc", holds)
