"""A hold of permits (:mod:`dynasem._engine.permits`): renewing, releasing and losing it touch the
permit items, and the row only to hint a freed slot (pushing the first waiter) or to keep it
listed; an operator's or the reaper's break of a permit; what an interrupted take undoes."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any

from .. import _clock as clock
from .._storage import dynamodb, lock_rows, permit_items, records
from . import handover, resend
from .hold import TAKEN_OVER, Held

# The rows of permit resources as this process last saw them (a first take plans from it
# instead of reading): bounded.
MAX_REMEMBERED = 1024
rows: dict[str, records.LockItem] = {}


def remember(item: records.LockItem) -> None:
    if item.slots_used is None:  # no permit row (any more): nothing to plan a take from
        rows.pop(item.resource, None)
        return
    if len(rows) >= MAX_REMEMBERED:
        rows.clear()
    rows[item.resource] = item


def undo(resource: str, slot: int, token: str) -> None:
    """Best effort: give back a permit an unanswered (or interrupted) write may have taken
    (sent again while it fails for a passing cause, as a release is). Refused by our own
    give-back (its answer lost, botocore's re-send refused: the permit free, ``lt`` our token),
    the slot is hinted too, as a release's is (:meth:`PermitHeld._gave_back`)."""

    def ours(refused: dynamodb.Refused) -> bool:
        permit = records.permit_of(refused.item) if refused.item else None
        return permit is not None and not permit.token and permit.last_token == token

    give_back = functools.partial(_give_back_permit, resource, slot, token)
    if resend.undone(give_back, resource, token, refused=ours):
        hint_freed(resource, slot, None)


def _give_back_permit(resource: str, slot: int, token: str) -> None:
    now = clock.now_ms()  # the time it was freed: sent again, the time it is sent
    permit_items.send(permit_items.give_back_permit(resource, slot, token, now))


def break_permit(
    resource: str, token: str, permit: records.Permit | None = None, fence: int | None = None
) -> bool:
    """An operator breaks the permit ``token`` holds (if it still does; under ``fence``, if
    given); its slot is hinted and the first waiter told, as for a release. False: ``token``
    holds none. ``permit``: the permit as read, freed only if its lease end is unchanged (the
    reaper's dead holders)."""
    until = None if permit is None else permit.holder.expires_ms
    permit = permit or permit_items.slot_of(resource, token, fence)
    if permit is None:
        return False
    breaker = secrets.token_hex(8)
    action = permit_items.break_permit(resource, permit.slot, token, breaker, until, fence)
    if not permit_items.send_break(action, resource, records.permit_sk(permit.slot), breaker):
        return False
    # Applied (its answer lost too): the slot is free and only this break would hint it and
    # push the first waiter, asleep until a lease ends.
    hint_freed(resource, permit.slot, None)
    return True


def hint_freed(resource: str, slot: int, hold_ms: int | None) -> None:
    """A slot given back: hint it in the row, and push the first waiter if any wait.

    Sent again while it fails for a passing cause (throttled: the row's partition is the
    crowd's), as the give-back itself is (a hint is never applied twice): unhinted, the slot
    is found only by a read of the permits, which a waiter that read them all held makes only
    once the first of their leases is over; it would wait that long beside a free permit."""
    written: list[records.LockItem | None] = []
    action = permit_items.hint(resource, slot, hold_ms)

    def send() -> None:
        written.append(lock_rows.update(action, return_new=True))

    try:
        if not resend.patiently(send):
            return  # the slot is found by reading the permits, once a lease is over
    except dynamodb.Refused as refused:
        written.append(refused.lock)  # hints full (the slot is found by reading), row gone
    row = written[-1]
    if row is None:
        return
    remember(row)
    if row.waiting:
        handover.push_first(resource, row, readers_only=False)


def cover(resource: str, expires_ms: int, slot: int | None = None) -> int:
    """The permit row of ``resource`` listed (and so never reaped, nor deleted by TTL) up to
    the bucket of ``expires_ms`` at least: that bucket, or the row's own if it was listed
    further already; 0 if it is no permit row any more (gone: made anew, it would know
    nothing of a permit renewed past its listing), or, for the holder of ``slot``, none that
    counts that slot (made anew with ``hw`` at or below it: see permit_items.raise_row).
    Raises SemaphoreUnavailable if the write failed."""
    try:
        permit_items.send(permit_items.raise_row(resource, expires_ms, slot))
        return records.bucket_of(expires_ms)
    except dynamodb.Refused as refused:
        row = refused.lock
        if row is None or row.slots_used is None:
            return 0
        if slot is not None and row.slots_used <= slot:
            return 0
        return max(row.listed_s or 0, records.bucket_of(row.expires_ms))


def undo_many(
    taken: dict[str, int], token: str, undo_one: Callable[[str, int, str], None] = undo
) -> None:
    """Best effort: :func:`undo` (or ``undo_one``) what a take of several resources may
    have written (``taken``: by resource, its slot; or the epoch of its reader item)."""
    for resource, member in taken.items():
        undo_one(resource, member, token)


class PermitHeld(Held):
    """A hold of permits: renewing, releasing and losing them touch the permit items (and
    the row only to hint a freed slot, or to keep it listed)."""

    slots: dict[str, int]  # by resource, the slot of our permit

    def __init__(self, *args: Any, slots: dict[str, int], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.slots = slots
        self._listed: dict[str, int] = {}  # the row's ``expires`` as we last knew it

    def raise_row(self, resource: str, expires_ms: int, listed_s: int | None) -> bool:
        """Keep the row listed (and unreaped) while our permit may be live: up to the bucket
        of ``expires_ms``. False if it is no permit row any more (gone: made anew, it would
        know nothing of our permit). Raises SemaphoreUnavailable if the write failed."""
        if listed_s is not None:
            self._listed[resource] = max(self._listed.get(resource, 0), listed_s)
        if records.bucket_of(expires_ms) <= self._listed.get(resource, 0):
            return True
        listed = cover(resource, expires_ms, self.slots[resource])
        if listed:
            self._listed[resource] = listed
        return bool(listed)

    def _renew_to(self, expires: int) -> None:
        # The row first: a permit renewed past the row's listing could outlive the row
        # (reaped, or deleted by TTL) and be held beside whoever made it anew. A failure to
        # raise it is the renewal's (the heartbeat tries again; the lease is not extended).
        for resource in self.slots:
            if not self.raise_row(resource, expires, None):
                self._lost_by_refusal(TAKEN_OVER, resource)
        for resource, slot in self.slots.items():
            try:
                permit_items.send(permit_items.renew_permit(resource, slot, self.token, expires))
            except dynamodb.Refused:
                self._lost_by_refusal(TAKEN_OVER, resource)

    def _give_back(self) -> bool:
        ok = True
        hold_ms = self._hold_ms() if len(self.slots) == 1 else None
        for resource, slot in self.slots.items():
            try:
                send = functools.partial(_give_back_permit, resource, slot, self.token)
                if not self._item_given_back(resource, send):
                    continue
            except dynamodb.Refused as refused:
                if not self._gave_back(refused):
                    ok = False
                    continue
            hint_freed(resource, slot, hold_ms)
        return ok

    def _gave_back(self, refused: dynamodb.Refused) -> bool:
        """Was the permit ours until the release began, though its release was refused?"""
        permit = records.permit_of(refused.item) if refused.item else None
        if permit is not None and permit.last_token == self.token:
            return True
        broken = permit is not None and permit.broken_token == self.token
        return not broken and self._gone_after_work(refused.retried)
