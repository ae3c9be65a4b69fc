"""Paths of readers held in items that no test ran (review 39, helper g): ``admitted()``'s
refusal after botocore sent the item's write again (``refused.retried``), and the undo of
an admission whose fence is not known (``reader_hold.BAR_ANY``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import reader_hold
from dynasem._storage import dynamodb
from tests.engine.test_readers_lost import INLINE, BreakBetweenSends, counted, no_writer_beside
from tests.support.faults import _error_response
from tests.support.helpers import in_another_thread, take

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    reader_hold.rows.clear()


class InFlight:
    """The first try of a reader item's write (``UpdateItem ... REMOVE #bt``) still on its
    way (answered 500 before it was sent, its body kept: :meth:`land` sends it later);
    botocore sends the same write again."""

    def __init__(self) -> None:
        self.client = dynamodb.get_client()
        self.first: list[dict[str, Any]] = []

    def _hook(self, request: Any, **kwargs: Any) -> Any:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if self.first or b"REMOVE #bt" not in body:
            return None
        self.first.append(json.loads(body))
        return _error_response(500, "InternalServerError", "timed out (test)")

    def __enter__(self) -> InFlight:
        self.client.meta.events.register_first("before-send.dynamodb.UpdateItem", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister("before-send.dynamodb.UpdateItem", self._hook)

    def land(self) -> bool:
        """The first try lands now; whether it was applied."""
        try:
            self.client.update_item(**self.first[0])
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True


def test_a_try_still_on_its_way_when_botocores_resend_was_refused_is_barred(
    holds: list[Any],
) -> None:
    """A reader's item write: its first try on its way (timed out), the second applied with
    its answer lost, an operator's break between it and the third, which is refused by the
    break's tombstone (``refused.retried``). The admission is made again (a higher fence,
    over the tombstone), held and released. The first try lands after the release: over a
    deleted item it would make a reader nobody counts, whose break counts the row down
    once more, the count of the reader beside it: a writer gets in. The refusal marks the
    resource (``run.stray``): the release leaves our tombstone, which refuses that try."""
    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    with InFlight() as flight, BreakBetweenSends() as hook:
        reader = semaphore("doc", shared=True, lease=30).acquire()
    assert flight.first and hook.broken == [True], "the break did not land between the sends"
    assert "doc" in reader.late
    assert counted("doc") == (2, 2)
    reader.release()
    assert counted("doc") == (1, 1)
    assert not flight.land(), "the first try landed after the release: a reader nobody counts"
    reader_hold.break_reader("doc", reader.token)  # an operator breaks the reader, if listed
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_an_unanswered_admissions_undo_takes_a_breaks_tombstone_for_a_break(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's admission, every try's answer lost (applied: counted, the row's mark
    ours); the next plan confirms it, its item's write applied with its answer lost, an
    operator's break between that and botocore's re-send (the break counts the reader
    down; the mark stays), the re-send refused; taking our mark off the row then fails (a
    throttle), and so does the acquire. Its give-back runs the first admission's undo,
    whose fence is not known (``BAR_ANY``): it finds the break's tombstone of our token,
    an earlier fence than any, and must take it for a break of this admission (the break
    counted it down: the mark off, nothing more). Taken for an earlier admission's, the
    undo bars the item over it and counts the reader down again by the mark still ours: the
    count of the reader beside it, and a writer gets in."""
    from dynasem._storage import lock_rows
    from dynasem.exceptions import SemaphoreUnavailable
    from tests.engine.test_readers_lost import LoseAnswer
    from tests.engine.test_trust_at_return import admission

    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    forget, failed = reader_hold.forget_admission, []

    def throttled_once(*args: Any) -> None:
        if not failed:
            failed.append(args)
            raise SemaphoreUnavailable("throttled (test)", transient=True)
        forget(*args)

    monkeypatch.setattr(reader_hold, "forget_admission", throttled_once)
    with LoseAnswer(admission, times=4, refusals=True) as lost, BreakBetweenSends() as hook:
        with pytest.raises(SemaphoreUnavailable, match="test"):
            semaphore("doc", shared=True, lease=30, wait=5).acquire()
    assert lost.fired == 4 and hook.broken == [True] and failed
    row = lock_rows.get("doc")
    assert row is not None and row.last_reader is None, "our admission's mark left on the row"
    assert counted("doc") == (1, 1)
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_a_write_off_refused_by_a_reader_admitted_meanwhile_leaves_the_writer_waiting(
    holds: list[Any], lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer held up only by a reader in an item, dead (its lease over), reads the
    items, deletes the dead one's, and writes the epoch off; a reader admitted between the
    delete and that write makes it refused (the fence moved). The writer plans again from
    the row the refusal showed and finds that reader: busy, not an error of the engine's
    (``dynamodb.Refused`` out of its acquire), and the new reader holds on."""
    from dynasem import SemaphoreBusy
    from dynasem import _clock as clock
    from dynasem._storage import reader_items
    from dynasem.testing import abandon

    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    dead = take(holds, "doc", shared=True, lease=30)  # in an item
    abandon(dead)  # its process died: its lease ran out (no write-off's wait for its end)
    dynamodb.get_client().update_item(
        TableName=lock_table,
        Key={"pk": {"S": "doc"}, "sk": {"S": f"r#{dead.token}"}},
        UpdateExpression="SET e = :e",
        ExpressionAttributeValues={":e": {"N": str(clock.now_ms() - 60_000)}},
    )
    for held in inline:  # only the reader in an item is left
        held.release()
        holds.remove(held)
    assert counted("doc") == (1, 1)
    drop, admitted = reader_items.drop_reader, []

    def then_admitted(resource: str, token: str, expires_ms: int | None = None) -> None:
        drop(resource, token, expires_ms)
        if not admitted:  # another process's reader, admitted before the write-off lands
            in_another_thread(
                lambda: admitted.append(semaphore("doc", shared=True, lease=30).acquire())
            )
            holds.extend(admitted)

    monkeypatch.setattr(reader_items, "drop_reader", then_admitted)
    with pytest.raises(SemaphoreBusy):
        semaphore("doc", wait=0, lease=30).acquire()
    monkeypatch.undo()
    assert admitted, "the write-off never deleted the dead reader's item"
    admitted[0].renew()
    assert not admitted[0].lost
    no_writer_beside(holds, admitted[0])


def test_an_admission_given_back_after_its_breaks_tombstone_may_have_expired_counts_nothing(
    holds: list[Any], lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's item write applied, its answer lost, and every later try of it failing in
    transit; meanwhile an operator broke that reader (counted it down; the row's mark stays
    ours) and its tombstone went by TTL, a bucket later (this process paused as long). The
    admission's undo then finds no item: whether a break took it is no longer shown, so it
    counts nothing down (``tombstones_show``). Counted down by its mark, the reader goes
    twice: the count of the reader beside it, and a writer gets in."""
    import threading

    from dynasem import _clock as clock
    from dynasem._operators import locks
    from dynasem._storage import reader_items, records
    from dynasem.exceptions import SemaphoreUnavailable

    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    send, monotonic, paused = reader_items.send, clock.monotonic, [0.0]
    here, tries = threading.get_ident(), []

    def lost(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action.get("Key", {}).get("sk", {}).get("S", "")
        if not (sk.startswith("r#") and "REMOVE #bt" in action["UpdateExpression"]):
            return send(action, **kwargs)
        tries.append(action)
        if len(tries) == 1:  # applied, its answer lost; broken, its tombstone gone by TTL
            send(action, **kwargs)
            token = sk[2:]
            in_another_thread(lambda: tries.append(locks.break_hold("doc", token)))
            key = {"pk": {"S": "doc"}, "sk": {"S": sk}}
            dynamodb.get_client().delete_item(TableName=lock_table, Key=key)
            paused[0] = records.BUCKET_S + 60.0
        raise SemaphoreUnavailable("read timeout (test)", transient=True, ambiguous=True)

    monkeypatch.setattr(reader_items, "send", lost)

    def paused_here() -> float:  # this thread's pause alone: the heartbeats keep their time
        return monotonic() + (paused[0] if threading.get_ident() == here else 0.0)

    monkeypatch.setattr(clock, "monotonic", paused_here)
    with pytest.raises(SemaphoreUnavailable, match="test"):
        semaphore("doc", shared=True, lease=30).acquire()
    monkeypatch.undo()
    assert tries[1] is True, "the operator's break did not land"
    assert counted("doc") == (1, 1)
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_a_release_whose_item_delete_was_given_up_leaves_its_reader_counted(
    holds: list[Any],
) -> None:
    """A reader's release, its item's delete throttled past the release's patience: the
    item is still there, so the reader stays counted (a writer waits to write it off).
    Counted down without its item gone, the reader goes twice once that item is broken or
    reaped: the count of the reader beside it, and a writer gets in."""
    from tests.support.faults import Faults

    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    other = take(holds, "doc", shared=True, lease=30)  # in an item
    reader = semaphore("doc", shared=True, lease=30).acquire()
    assert counted("doc") == (2, 2)
    with Faults(dynamodb.get_client()) as faults:
        faults.throttle("DeleteItem", 10_000)
        try:
            reader.release()
        except Exception:  # noqa: BLE001 - whatever it says, the item was not given back
            pass
        assert faults.fired
    assert counted("doc") == (2, 2), "counted down, its item still there"
    assert reader_hold.break_reader("doc", reader.token)  # an operator breaks it, as listed
    for held in inline:  # the readers in the row leave: only the one in an item holds
        held.release()
        holds.remove(held)
    no_writer_beside(holds, other)


def test_a_last_readers_close_that_fails_leaves_the_release_done_and_a_writer_gets_in(
    holds: list[Any],
) -> None:
    """The last reader in an item counts the row down to 0 (this process did not know it
    was the last: no one-write leave), then its write taking the sentinel off fails
    (throttled past botocore's retries). Its release is done all the same (its item gone,
    its count down); a writer finds a sentinel over no reader and writes it off at once."""
    from tests.support.faults import Faults

    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    first = take(holds, "doc", shared=True, lease=30)  # in an item
    last = semaphore("doc", shared=True, lease=30).acquire()  # in an item
    for held in [*inline, first]:
        held.release()
        holds.remove(held)
    assert counted("doc") == (1, 1)
    reader_hold.rows.clear()  # the row not known here: counted down, then closed
    with Faults(dynamodb.get_client()) as faults:
        faults.throttle("UpdateItem", 4)  # the close (the count-down goes by the quick client)
        last.release()
        assert faults.fired == 4
    assert counted("doc") == (0, 0)
    semaphore("doc", lease=30, wait=2).acquire().release()


def _break(body: dict[str, Any]) -> bool:
    """An operator's break of a reader item (not our own undo's tombstone: that sets a fence)."""
    from tests.engine.test_trust_at_return import sk_of

    return sk_of(body).startswith("r#") and "#bt = :tok, #exp" in body["UpdateExpression"]


@pytest.mark.parametrize("quick", [True, False], ids=["quick client", "locks' client"])
def test_a_readers_break_applied_with_its_answer_lost_counts_it_down(
    holds: list[Any], quick: bool
) -> None:
    """An operator's break of a reader in an item, applied, its answer lost. On the quick
    client (every operator's page and command: one attempt) the break reads its own
    tombstone (its word) and counts the reader down; on the locks' client botocore sends it
    again, refused by that tombstone, which it knows the same way. Either way the reader is
    counted down once: not counted down, a writer would wait for a write-off of nobody."""
    import contextlib

    from dynasem import LockLost
    from dynasem._operators import locks
    from tests.engine.test_readers_lost import LoseAnswer

    for _ in range(INLINE + 1):  # the last one in an item
        take(holds, "doc", shared=True, lease=30)
    broken = take(holds, "doc", shared=True, lease=30)  # in an item
    assert counted("doc") == (2, 2)
    with LoseAnswer(_break) as lost:
        client = dynamodb.quick() if quick else contextlib.nullcontext()
        if quick:
            lost.client.meta.events.unregister(lost.event, lost._hook)
            lost.client = dynamodb.get_client(quick=True)
            lost.client.meta.events.register_first(lost.event, lost._hook)
        with client:
            assert locks.break_hold("doc", broken.token)
    assert lost.fired == 1
    assert counted("doc") == (1, 1)
    with pytest.raises(LockLost):
        broken.renew()


def test_the_rows_a_process_remembers_and_watches_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process remembers at most MAX_REMEMBERED rows with reader items, and watches at
    most MAX_WATCHED rows of readers for a write-off (then it starts again)."""
    from dynasem._engine import readers
    from dynasem._storage import reader_items, records

    monkeypatch.setattr(reader_hold, "MAX_REMEMBERED", 3)
    monkeypatch.setattr(reader_hold, "rows", {})
    monkeypatch.setattr(readers, "MAX_WATCHED", 3)
    monkeypatch.setattr(readers, "_watched", {})
    monkeypatch.setattr(readers, "_since", {})
    sentinel = records.Holder(reader_items.READERS_USER, 1, 0, shared=True)
    for n in range(7):
        row = records.LockItem(
            resource=f"doc:{n}",
            holders={reader_items.SENTINEL: sentinel},
            mode=records.Mode.SHARED,
            fence=1,
            reader_count=readers.FEW + 1,  # no early look: nothing read
        )
        reader_hold.remember(row)
        readers.write_off_due(row, {reader_items.SENTINEL: sentinel}, skew=0.5)
        assert len(reader_hold.rows) <= 3 and len(readers._watched) <= 3
        assert len(readers._since) <= 3
    assert "doc:6" in reader_hold.rows


def test_an_epoch_opened_over_a_lapsed_sentinel_is_refused_by_its_late_raise(
    holds: list[Any], lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers inline and one in an item, whose epoch's sentinel looks lapsed (its lease end
    passed by the skew) to a new reader, who plans to open the next epoch. A renewal of the
    reader in the item raises that sentinel before the new reader's write lands (a renewal
    sent in time, answered late). Opened anyway, the next epoch would drop the count of that
    reader, who still trusts its hold: once the new reader and the inline ones leave, a
    writer takes the lock beside it. The opening is conditional on the sentinel as seen
    (``reader_items._open``): refused, the new reader joins the live epoch."""
    import contextlib

    from dynasem import SemaphoreBusy
    from dynasem import _clock as clock
    from dynasem._storage import lock_rows, reader_items

    inline = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE)]
    renewing = take(holds, "doc", shared=True, lease=30)  # in an item
    epoch = renewing.epochs["doc"]
    dynamodb.get_client().update_item(  # the sentinel as it looks once lapsed
        TableName=lock_table,
        Key={"pk": {"S": "doc"}, "sk": {"S": "lock"}},
        UpdateExpression="SET holders.readers.e = :e",
        ExpressionAttributeValues={":e": {"N": str(clock.now_ms() - 60_000)}},
    )
    reader_hold.rows.clear()  # the new reader plans from the row as it is
    update, raised = lock_rows.update, []

    def raised_first(action: dict[str, Any], **kwargs: Any) -> Any:
        opening = "#rc = :first" in action.get("UpdateExpression", "")
        if opening and not raised:  # the renewal's raise lands first
            seen = lock_rows.get("doc")
            assert seen is not None
            expires = clock.now_ms() + 30_000
            reader_items.send(reader_items.raise_sentinel("doc", epoch, expires, seen))
            raised.append(expires)
        return update(action, **kwargs)

    monkeypatch.setattr(lock_rows, "update", raised_first)
    reader = semaphore("doc", shared=True, lease=30).acquire()
    monkeypatch.undo()
    holds.append(reader)
    assert raised, "the new reader never planned to open the next epoch"
    assert reader.epochs["doc"] == epoch
    assert counted("doc") == (2, 2)
    for held in [*inline, reader]:  # only the renewing reader is left
        held.release()
        holds.remove(held)
    assert renewing.seconds_left() > 0  # it trusts its hold, renewed or not
    writers: list[Any] = []

    def writer() -> None:  # another thread: this one holds a reader
        with contextlib.suppress(SemaphoreBusy):
            writers.append(semaphore("doc", wait=0, lease=30).acquire())

    in_another_thread(writer)
    holds.extend(writers)
    assert not writers, f"two holders: reader {renewing.token[:8]} and a writer"
