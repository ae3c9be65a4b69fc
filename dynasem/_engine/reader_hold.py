"""A reader's hold in a reader item (:mod:`dynasem._storage.reader_items`): renewing it writes the
item (and the row's sentinel only when the lease passes it), releasing it deletes the item
and counts the row's readers down (the last one takes the sentinel off and pushes the first
waiter); an operator's break of a reader; what an interrupted admission undoes."""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import secrets
import time
from typing import Any

from .. import _clock as clock
from .._observability.logs import facts
from .._storage import dynamodb, lock_rows, permit_items, reader_items, records
from ..exceptions import SemaphoreUnavailable
from . import handover, resend
from .hold import Held

logger = logging.getLogger("dynasem")

# Tries of the count-down on a failure that was never applied (throttled, unconnected), and
# the pause between them (seconds, at most; at least half). Each try on the quick client is
# sent up to four times when throttled, 50, 100 and 200 ms apart (table.client): a try
# more, after this pause, outlasts a throttle of about a second and holds a release up
# about a second at most.
COUNT_TRIES = 2
COUNT_PAUSE = 0.2
# The rows of resources with reader items as this process last saw them: a reader's first
# write plans from one (its admission) instead of trying the row's holders first. Bounded.
MAX_REMEMBERED = 1024
rows: dict[str, records.LockItem] = {}


def remember(item: records.LockItem | None) -> None:
    """Keep a shared row whose next reader takes an item (it has reader items, or as many
    readers as it keeps inline); forget others."""
    if item is None:
        return
    crowded = item.mode == records.Mode.SHARED and len(item.holders) >= reader_items.READERS_INLINE
    if not (reader_items.has_readers(item) or crowded):
        rows.pop(item.resource, None)
        return
    if len(rows) >= MAX_REMEMBERED:
        rows.clear()
    rows[item.resource] = dataclasses.replace(item, entries=None)


def count_down(
    resource: str, epoch: int, *, forget: str | None = None, marked: str | None = None
) -> None:
    """One reader of ``epoch`` gone from the row's count; the last one takes the sentinel
    off and pushes the first waiter. Sent once per attempt, never again after an answer that
    may hide an applied write: a count too high only keeps a writer waiting for the
    write-off, one too low would let it in beside a reader. ``forget``: the token of an
    admission given back; ``marked``: only if the row's mark is still this token's admission (see
    :func:`dynasem._storage.reader_items.count_down`)."""
    known = rows.get(resource)
    if known is not None and known.reader_epoch == epoch and known.reader_count <= 1:
        # Most likely the epoch's only reader: leave and close it in one write.
        try:
            leave = reader_items.leave_last(resource, epoch, marked)
            row = lock_rows.update(leave, return_new=True)
            remember(row)
            handover.push_if_free(resource, row)  # the last reader gone
            return
        except dynamodb.Refused as refused:
            remember(refused.lock)
            if not _still_open(refused.lock, epoch):
                # Our own write (its answer lost, botocore's re-send refused), or a write-off:
                # no count left to take down. Pushed as its answer would have been.
                handover.push_if_free(resource, refused.lock)
                return
            # others came: count down
        except SemaphoreUnavailable:
            pass
    try:
        row = _count_once(resource, epoch, forget, marked)
    except dynamodb.Refused as refused:
        # The epoch was written off (the count is gone with it), or closed by our own
        # leave_last, applied though unanswered: pushed as its answer would have been.
        remember(refused.lock)
        handover.push_if_free(resource, refused.lock)
        return
    if row is None or row.reader_count > 0:
        return
    remember(row)
    try:
        row = lock_rows.update(reader_items.close(resource, epoch), return_new=True)
    except dynamodb.Refused as refused:
        # A reader admitted since closes the epoch; or our own close, its answer lost and
        # botocore's re-send refused, left the row free: pushed as its answer would have been.
        remember(refused.lock)
        handover.push_if_free(resource, refused.lock)
        return
    except SemaphoreUnavailable:
        return  # the sentinel lapses, or a waiting writer writes the epoch off
    remember(row)
    handover.push_if_free(resource, row)  # the last reader gone


def _still_open(row: records.LockItem | None, epoch: int) -> bool:
    """Whether ``row`` (a refusal's) still has ``epoch``'s sentinel: a count to take down.
    Once off, it never comes back to that epoch (an admission opens the next one)."""
    return row is not None and reader_items.has_readers(row) and row.reader_epoch == epoch


def _count_once(
    resource: str, epoch: int, forget: str | None, marked: str | None = None
) -> records.LockItem | None:
    """The count-down's write, applied at most once: one attempt at a time (botocore must
    not send it again), tried again only after a failure that was surely not applied
    (throttled: all of a crowd's reader items share the row's partition; unconnected),
    after a pause of about COUNT_PAUSE. None: given up (logged: writers wait to write the
    reader off, a lease and the skew after the row last changed). Raises Refused."""
    tries = 0
    while True:  # every pass returns or raises, save a failure surely not applied
        tries += 1
        try:
            with dynamodb.quick():  # one attempt: botocore must not send it twice
                down = reader_items.count_down(resource, epoch, forget=forget, marked=marked)
                return lock_rows.update(down, return_new=True)
        except dynamodb.Refused as refused:
            if not _mark_moved(refused, epoch, forget, marked):
                raise
            # Not applied (one attempt, refused): the mark is a later admission's, whose
            # re-send (its answer lost) must still find it. Our count goes without it.
            return _count_once(resource, epoch, None)
        except SemaphoreUnavailable as exc:
            if exc.transient and not exc.ambiguous and tries < COUNT_TRIES:
                # Spread: a crowd's readers leave together, on one partition.
                time.sleep(random.uniform(COUNT_PAUSE / 2, COUNT_PAUSE))
                continue
            logger.warning(
                "dynasem: could not count a reader of %r down (%s); a writer waits to write "
                "it off, a lease and the skew after the row last changed",
                resource,
                exc,
                extra=facts(resource, outcome="count_failed", reason=exc),
            )
            return None


def _mark_moved(
    refused: dynamodb.Refused, epoch: int, forget: str | None, marked: str | None
) -> bool:
    """Whether a count-down that ``forget``s our admission's mark (and needs nothing else of
    it) was refused for that alone, surely not applied: the epoch is still open, and the row's
    mark is another admission's (or none)."""
    if forget is None or marked is not None or refused.retried:
        return False
    row = refused.lock
    mark = reader_items.admission_mark(forget, epoch)
    return _still_open(row, epoch) and row is not None and row.last_reader != mark


def undo(
    resource: str,
    epoch: int,
    token: str,
    *,
    counted: float | None = None,
    skew: float = 0.0,
    since: float | None = None,
    fence: int | None = None,
) -> None:
    """Best effort: give back a reader an unanswered (or interrupted) admission may have
    made (its item deleted, sent again while it fails for a passing cause as a release is;
    then counted down: only if the delete took it). Under ``fence``, the item is left our
    tombstone, not deleted: a try of its write still on its way would land over a delete.
    ``counted``: the admission is known applied (its answer came), and no write of the item
    was sent before that time (monotonic): an item gone by our own delete, its answer lost,
    is counted down too (:func:`deleted_by_us`), once barred as below (that item may never
    have landed: a timed-out write of it may still land, and land again after our delete).
    None: the admission may not have been applied (a transaction unanswered), and a reader
    never counted must not be counted down. No item at all, and no break of it: its write
    was never applied (cut short, throttled to the end), and the reader is counted down if
    the row's mark is still ours (nothing else could count it down): only while a break's
    tombstone would still show (:func:`deleted_by_us`), of an item written after ``since``
    (monotonic: ``counted``, or when the admission was sent), and once a tombstone of ours
    under ``fence`` (the admission's, or above) bars the item's write that may still be on
    its way (:func:`reader_items.bar_reader`).

    Refused by a break's tombstone of our item (an operator, or the reaper, broke it: the
    break counted us down), our admission's mark comes off the row, or the same token
    admitted again would be taken for that admission confirmed and not counted: its
    release would then count out a reader beside it (:func:`forget_admission`)."""

    def refused(exc: dynamodb.Refused) -> bool:
        earlier = _earlier(exc.item, fence)
        if exc.item is not None and exc.item.get("bt") == token and not earlier:
            forget_admission(resource, epoch, token)
            return False
        # Our own delete, its answer lost; or the item's write never landed yet (a timed-out
        # try may still land, as may botocore's re-send of one after our delete): barred too.
        ours = counted is not None and deleted_by_us(exc, counted, skew)
        sent = counted if counted is not None else since
        if (exc.item is not None and not earlier) or fence is None or sent is None:
            return ours
        if not tombstones_show(sent, skew):
            return False
        barred = _barred(resource, token, fence, fence if earlier else None)
        if barred is False:  # the item landed since: take it, count it down
            undo(resource, epoch, token, counted=counted, skew=skew, fence=fence)
        elif barred and not ours:
            count_down(resource, epoch, forget=token, marked=token)
        return bool(barred) and ours

    drop = functools.partial(reader_items.drop_reader, resource, token)
    if fence is not None:  # an earlier try of the item's write may land after it
        drop = functools.partial(_retire, resource, token, fence, secrets.token_hex(8))
    if resend.undone(drop, resource, token, refused=refused):
        count_down(resource, epoch, forget=token)  # the same token may be admitted again


def _earlier(item: dict[str, Any] | None, fence: int | None) -> bool:
    """Whether ``item`` is the tombstone of an earlier admission of our token (given back,
    or broken), below ``fence``, ours (not :data:`BAR_ANY`, which stands for a fence not
    known): not a break of this admission, which counted nothing of it down."""
    if item is None or "bt" not in item or fence is None or fence == BAR_ANY:
        return False
    return int(item.get("f", fence)) < fence


def _barred(resource: str, token: str, fence: int, over: int | None = None) -> bool | None:
    """Our tombstone written (True), or refused by our item, which landed (False; or landed
    and was broken: the break counted it down); None: not known (the write failed), and the
    reader stays counted, for a writer to write off. ``over``: see
    :func:`reader_items.bar_reader`."""
    word = secrets.token_hex(8)
    now = clock.now_ms()
    try:
        reader_items.send(reader_items.bar_reader(resource, token, fence, now, word, over))
        return True
    except dynamodb.Refused:
        return False
    except SemaphoreUnavailable:
        return None


def _retire(resource: str, token: str, fence: int, word: str) -> None:
    """Our reader item left our tombstone under ``fence`` (:func:`reader_items.retire_reader`)."""
    reader_items.send(reader_items.retire_reader(resource, token, fence, clock.now_ms(), word))


def deleted_by_us(refused: dynamodb.Refused, written: float, skew: float) -> bool:
    """Whether our reader item's delete, refused with the item not there, was taken away by
    an attempt of ours whose answer was lost, so that the reader is ours to count down.

    An attempt of ours may have been applied (``retried``), no tombstone is there, and a break
    of the item would still show as one: no break of it is older than ``written`` (monotonic,
    no later than our last write of the item was sent: a renewal or the admission's), and a
    tombstone's TTL is a bucket past its break (on the breaker's clock, in whole seconds).
    Then a break before our first attempt left its tombstone, still there (it counted the
    reader down, and we do not); one between our attempts found no item and counted nothing
    down; a writer's write-off moves the epoch on, and the count-down's condition refuses it.
    Counted down once."""
    if not refused.retried or refused.item is not None:
        return False
    return tombstones_show(written, skew)


def tombstones_show(written: float, skew: float) -> bool:
    """Whether a break's tombstone of an item written after ``written`` (monotonic) would
    still be there: its TTL is a bucket past its break (on the breaker's clock, in whole
    seconds)."""
    return clock.monotonic() < written + records.BUCKET_S - skew - 1


def break_reader(
    resource: str, token: str, reader: records.Reader | None = None, fence: int | None = None
) -> bool:
    """An operator breaks reader ``token`` (if it still holds; under ``fence``, if given); the
    reaper a dead one, as read (``reader``: its lease end must be unchanged). False: no such
    reader.

    Its item is left a tombstone (:func:`reader_items.break_reader`), not deleted: a reader
    whose item's write was applied, its answer lost, sends it again, and over a deleted item
    that write would make a reader again after this count-down (a writer let in beside it).
    The tombstone's answer lost, the break knows its own tombstone by its word (``bk``) and
    counts the reader down: nothing else would (a break run again finds no reader)."""
    until = None if reader is None else reader.holder.expires_ms
    if reader is None:
        # Its item, by its key (not every reader item of the resource: a release of all of
        # them would read N² items).
        item = lock_rows.get_item(resource, records.reader_sk(token))
        reader = None if item is None else records.reader_of(item)
        if reader is None or reader.broken_token is not None:
            return False
        if fence not in (None, reader.holder.fence):
            return False
    tombstone_until = max(reader.holder.expires_ms, clock.now_ms())
    breaker = secrets.token_hex(8)
    action = reader_items.break_reader(resource, token, tombstone_until, breaker, until, fence)
    if not permit_items.send_break(action, resource, records.reader_sk(token), breaker):
        return False
    # Applied (its answer lost too: only our own tombstone says so, another's break counts
    # its reader itself), the break must count the reader down.
    count_down(resource, reader.epoch)
    return True


def forget_admission(resource: str, epoch: int, token: str) -> None:
    """Our admission was broken (an operator's break between the item's write, whose answer
    was lost, and its re-send; or before its give-back): the break counted it down.
    Its mark comes off the row (if still ours), so that admitted again it is counted again.
    Raises :class:`SemaphoreUnavailable` if that write failed (the mark may still be ours:
    an admission planned from it would not be counted)."""
    try:
        lock_rows.update(reader_items.unmark(resource, epoch, token))
    except dynamodb.Refused:
        pass  # not ours any more (another admission since, or our own write sent again)


WRITTEN_OFF = "its readers were written off, or it was broken by an operator"
# A tombstone's fence that bars every write of a token's reader item (see undo).
BAR_ANY = 2**63 - 1


class ReaderHeld(Held):
    """A shared hold in reader items: one per resource, each admitted under its row's epoch."""

    epochs: dict[str, int]
    covers: dict[str, int]  # each row's sentinel lease end as we last knew it (our epoch's)
    # Resources whose item's write timed out before one landed: an earlier try may land
    # after our release, and over a deleted item it would make a reader nobody counts
    # (its break would count the row down again, beside a live reader): the release
    # leaves our tombstone under our fence instead (:func:`_retire`).
    late: set[str]

    def __init__(
        self,
        *args: Any,
        epochs: dict[str, int],
        covers: dict[str, int],
        late: set[str] | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.epochs = epochs
        self.covers = covers
        self.late = late or set()

    def _covered(self, resource: str, expires_ms: int) -> bool:
        """The row's sentinel up to ``expires_ms`` (it must cover our lease before our item
        may claim it). False: our epoch was written off, or the sentinel taken off."""
        epoch = self.epochs[resource]
        seen = records.LockItem(resource=resource, expires_ms=self.covers[resource])
        for _ in range(3):
            try:
                reader_items.send(reader_items.raise_sentinel(resource, epoch, expires_ms, seen))
                self.covers[resource] = reader_items.covers_to(expires_ms, seen)
                return True
            except dynamodb.Refused as refused:
                old = refused.lock
                if old is None or old.reader_epoch != epoch or not reader_items.has_readers(old):
                    return False
                self.covers[resource] = old.holders[reader_items.SENTINEL].expires_ms
                if self.covers[resource] >= expires_ms:
                    return True  # raised by another reader meanwhile
                seen = old
        raise SemaphoreUnavailable(
            f"could not renew {resource!r}: conflicting writes", transient=True
        )

    def _renew_to(self, expires: int) -> None:
        for resource in self.epochs:
            try:
                if expires > self.covers[resource] and not self._covered(resource, expires):
                    raise dynamodb.Refused(None)
                reader_items.send(reader_items.renew_reader(resource, self.token, expires))
            except dynamodb.Refused:
                self._lost_by_refusal(WRITTEN_OFF, resource)

    def _give_back(self) -> bool:
        ok = True
        for resource, epoch in self.epochs.items():
            try:
                drop = functools.partial(reader_items.drop_reader, resource, self.token)
                if resource in self.late:
                    word, fence = secrets.token_hex(8), self.fences[resource]
                    drop = functools.partial(_retire, resource, self.token, fence, word)
                if not self._item_given_back(resource, drop):
                    continue
            except dynamodb.Refused as refused:
                # Not there: broken or written off (after our deadline: once the work had
                # ended, see _gone_after_work), unless a retry hides our own delete.
                # A tombstone of ours: broken by an operator (or the reaper), surely.
                broken = (refused.item or {}).get("bt") == self.token
                ok = ok and not broken and self._gone_after_work(refused.retried)
                # Our last write of the item (a renewal or the admission) was sent no
                # earlier than the deadline less the lease and the skew.
                written = self._deadline - self.lease + self.skew
                if deleted_by_us(refused, written, self.skew):
                    count_down(resource, epoch)
                continue
            count_down(resource, epoch)
        return ok
