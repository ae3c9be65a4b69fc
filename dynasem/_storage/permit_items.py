"""Permit items: where a counting semaphore of more than :data:`INLINE_MAX` permits keeps its
holders, one item per permit, so that no write grows with the number of holders.

The resource's row (``sk = "lock"``) keeps what every take must agree on, and nothing per
holder: the fence counter, the limit, the queue's counters (as for any lock), ``hw`` (how many
permit slots were ever used: slots ``0 .. hw-1`` exist) and ``hints``, a short list of slots
whose holder gave them back. A permit is an item under the resource's key, ``sk`` =
``s#<slot>`` (:func:`permit_sk`), holding one hold: ``k`` (its token, present only while it is
held), ``u`` user, ``e`` lease end, ``f`` fence, ``a`` taken at, ``p`` process; ``lt`` and
``bt`` the token that gave it back and that an operator broke last (a retried write whose
first answer was lost is recognised by them); ``expires`` for TTL only, a week past its
lease end (:func:`permit_ttl`: its fence outlives any take still to write it). Permits carry no
``userId`` or ``shard``: they are in no index, and moving a permit from one holder to another
writes no index. The row stands for them in the indexes: its ``expires`` is raised to the
bucket of every permit's lease end and its ``expMs`` to that bucket's end, so the row is
listed, and never reaped (nor deleted by TTL), while a permit may be live. It is raised
*before* the permit's lease end passes it: by the take (its row write requires the row to
cover the permit it writes next, :func:`take_slot`'s ``cover_ms``) and by the renewal (the
row first): a row deleted between the two writes would be made anew by the next taker,
which knows nothing of the permit written after.

A take is two writes of one small item each: the row (a fresh fence; a hint popped, or ``hw``
grown by one; the queue's terms as for any take) and then the permit (free, or its lease over
by ``CLOCK_SKEW``). A release is two as well: the permit (our token removed) and the row (the
slot appended to ``hints``, if fewer than :data:`MAX_HINTS` are there). A permit freed without
a hint (a dead holder's; hints full) is found by reading the permits (:func:`find_free`),
only when no hint is left and every slot is in use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..conf import settings
from ..exceptions import SemaphoreUnavailable
from . import dynamodb, lock_rows, records
from .dynamodb import Refused as Refused
from .lock_writes import LEASE, QueueTerms, queue_clauses, update_action
from .records import LOCK_SK, PERMIT_PREFIX, Holder, LockItem, Mode, Permit, permit_of, permit_sk

_T = TypeVar("_T")
# A counting semaphore of at most this many permits keeps its holders in its row (a row of
# 8 holders is under 2 KB: its writes cost no more than the permits' two); above, in permits.
INLINE_MAX = 8
# The most hints a row keeps: the row stays well under 1 KB.
MAX_HINTS = 32
# Permits one read of them covers (a page): it stops at the first free one.
PERMIT_PAGE = 100


def uses_permits(mode: Mode, limit: int) -> bool:
    """Whether holds of this mode and limit live in permit items."""
    return mode == Mode.COUNTING and limit > INLINE_MAX


# -- the row's writes --------------------------------------------------------------------------


@dataclasses.dataclass
class Terms:
    """A row's UpdateItem being built, clause by clause (a take of a slot, an admission):
    its SET, REMOVE and ADD clauses, its conditions (every one must hold) and values."""

    values: dict[str, Any]
    sets: list[str] = dataclasses.field(default_factory=list)
    conds: list[str] = dataclasses.field(default_factory=list)
    removes: list[str] = dataclasses.field(default_factory=list)
    adds: list[str] = dataclasses.field(default_factory=list)

    def need(self, condition: str, values: dict[str, Any] | None = None) -> None:
        """One more condition, and the values it names."""
        self.conds.append(condition)
        self.values.update(values or {})

    def fence(self, fence: int | None) -> None:
        """The fence a take sets (of a permit or a reader item), and its condition: counted
        up from the stored one (``fence`` None), or (named, say in a transaction) above it."""
        if fence is None:
            self.sets.append("#fence = #fence + :one")
            self.need("attribute_exists(#fence)", {":one": 1})
        else:
            self.sets.append("#fence = :fence")
            self.need("(attribute_not_exists(#fence) OR #fence < :fence)", {":fence": fence})

    def action(self, resource: str, queue: QueueTerms) -> dict[str, Any]:
        """The row's UpdateItem, the queue's terms (those of any take) last."""
        q_sets, q_conds = queue_clauses(queue, self.values)
        update = "SET " + ", ".join(self.sets + q_sets)
        if self.removes:
            update += " REMOVE " + ", ".join(self.removes)
        if self.adds:
            update += " ADD " + ", ".join(self.adds)
        condition = " AND ".join(self.conds + q_conds)
        return update_action(resource, LOCK_SK, update, condition, {}, self.values)


def take_slot(
    resource: str,
    *,
    how: str,
    fence: int | None,
    limit: int,
    queue: QueueTerms,
    slot: int | None = None,
    seen: LockItem | None = None,
    holder: Holder | None = None,
    stale_ms: int = 0,
    cover_ms: int | None = None,
) -> dict[str, Any]:
    """The row's part of a take: a fresh fence (above the stored one) and a slot.

    ``how``: ``"create"`` makes the row a permit row (no row, or one whose inline holders
    are all gone: ``stale_ms``; ``holder``: ours, its user and lease end), slot 0 ours;
    ``"pop"`` takes the first hint (``slot``: the one we saw there, for a transaction, which
    cannot return the old row; None: whichever it is, read from the old row); ``"grow"``
    takes slot ``hw`` (with a named fence, ``hw`` as ``seen``: the row as we saw it);
    ``"fence"`` only the fence, for a free slot found by reading the permits; ``"reset"``
    another limit, slot 0 ours, when no permit was live (``seen``: its fence, so that no take
    came between).
    Every one names the limit, and the queue's terms are those of any take.

    ``fence``: ours, above the stored one (the write is refused otherwise); None (a pop,
    grow or fence take whose old row is returned): the stored fence plus one, ours without
    a condition, so that takers of other slots at once do not refuse each other's fences
    (each fence of a busy row would otherwise refuse every take in flight).

    ``cover_ms``: a take of a slot whose permit is written next, in a write of its own, with
    this lease end: only if the row is listed up to it already (``expMs``), so that neither
    the reaper nor TTL deletes the row between the two writes (a row made anew would know
    nothing of that permit: see :func:`raise_row`, sent first when it is not)."""
    if fence is None and how not in ("pop", "grow", "fence"):
        raise ValueError(f"a {how!r} take names its fence")
    terms = Terms({":lim": limit})
    terms.fence(fence)
    if how == "create":
        _create(resource, stale_ms, holder, terms)
    else:
        _slot(how, slot, seen or LockItem(resource=resource), fence is None, terms)
        if cover_ms is not None:
            terms.need("#expMs >= :cover", {":cover": cover_ms})
    return terms.action(resource, queue)


def _create(resource: str, stale_ms: int, holder: Holder | None, terms: Terms) -> None:
    """:func:`take_slot`'s terms for making the row a permit row, slot 0 ours: no row, or
    one whose inline holders are all gone."""
    terms.sets.append(
        "#hw = :one, #hints = :none, #mode = :mode, #lim = :lim, #shard = :shard, " + LEASE
    )
    terms.need("attribute_not_exists(#hw)")
    terms.need("(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale)")
    terms.removes.append("#h")
    bucket = records.bucket_of(holder.expires_ms if holder else 0)
    values = terms.values
    values.update({":one": 1, ":none": [], ":mode": Mode.COUNTING})
    values.update({":shard": records.shard_of(resource), ":uid": holder.user_id if holder else ""})
    values.update({":exp": bucket, ":expMs": bucket * 1000, ":zero": 0, ":stale": stale_ms})


def _slot(how: str, slot: int | None, seen: LockItem, counted: bool, terms: Terms) -> None:
    """:func:`take_slot`'s terms for a slot of a permit row (``how``: pop, grow, fence or
    reset; ``counted``: the fence counted up, the old row returned)."""
    terms.need("attribute_exists(#hw)")
    if how != "reset":
        terms.need("#lim = :lim")
    if how == "pop":
        if slot is None:
            terms.need("size(#hints) > :zero", {":zero": 0})
        else:
            terms.need("#hints[0] = :slot", {":slot": slot})
        terms.removes.append("#hints[0]")
    elif how == "grow":
        terms.sets.append("#hw = #hw + :one")
        terms.values[":one"] = 1
        if counted:
            terms.need("#hw < :lim")
        else:
            terms.need("#hw = :seenHw", {":seenHw": seen.slots_used})
    elif how == "reset":
        # Another limit, and no permit live when we read them: every slot anew.
        terms.sets += ["#hw = :one", "#hints = :none", "#lim = :lim"]
        terms.need("#fence = :seenFence", {":one": 1, ":none": [], ":seenFence": seen.fence})
    elif how == "fence":
        if slot is not None:
            # Only a slot the row does not hint: a slot given back is hinted, and taken
            # past its hint, that hint would later send a take to a slot held (two writes
            # for nothing). Refused, we pop the hint instead.
            terms.need("NOT contains(#hints, :slot)", {":slot": slot})
    else:
        raise ValueError(f"unknown take {how!r}")


def hint(resource: str, slot: int, hold_ms: int | None = None) -> dict[str, Any]:
    """A released slot, appended to the row's hints (unless MAX_HINTS are there already),
    if the row still has that slot: a row reset to another limit since (``hw`` 1 again)
    must not be hinted a slot of the old one (at or above the new limit, it would be one
    permit too many; below, it is grown again in its turn). Nor a slot hinted already: a
    re-send by botocore of an applied hint, its answer lost, would hint it twice, and the
    second hint send a take to the permit held by then (two writes and a plan for nothing)."""
    values: dict[str, Any] = {":slot": [slot], ":n": slot, ":max": MAX_HINTS}
    update = "SET #hints = list_append(#hints, :slot)"
    if hold_ms is not None:
        update += ", #hold = :hold"  # waiters estimate their turn from it
        values[":hold"] = hold_ms
    condition = "attribute_exists(#hints) AND size(#hints) < :max AND #hw > :n"
    condition += " AND NOT contains(#hints, :n)"
    return update_action(resource, LOCK_SK, update, condition, {}, values)


def drop_hint(resource: str, slot: int) -> dict[str, Any]:
    """The row's first hint off, if it is still ``slot``: a hint of a slot that is held (a
    release hints its slot after freeing its permit; a taker that found the permit free by
    reading in between holds it by then). A take of one resource pops such a hint in its row
    write; a take of several, whose pop and permit write are refused together, drops it so."""
    condition = "attribute_exists(#hw) AND #hints[0] = :slot"
    return update_action(resource, LOCK_SK, "REMOVE #hints[0]", condition, {}, {":slot": slot})


def fence_out(item: LockItem, stale_ms: int) -> Permit | None:
    """Before the permit row ``item`` (as read: no permit live) takes another limit, or
    another mode (holders inline again): each slot below its ``hw``, in turn, is fenced at
    the row's fence as read and loses a holder whose lease is over. A take slowed between
    its row write (which drew a fence no larger) and its permit write is then refused,
    instead of holding a permit that the new limit or mode knows nothing of. A fenced permit
    keeps no TTL: it must outlast any such take (the next take of its slot writes it over,
    with a TTL that outlasts them too: :func:`permit_ttl`), even after the row, whose lease
    end is now the new holder's, is reaped.

    Returns the permit that refused (held after all; or fenced past the row as read, which
    moved on then and refuses the change's own write), or None: every slot is fenced."""
    values = {":seen": item.fence, ":stale": stale_ms}
    condition = (
        "(attribute_not_exists(#k) OR #e < :stale) AND (attribute_not_exists(#f) OR #f <= :seen)"
    )
    update = "SET #f = :seen REMOVE #k, #p, #exp"
    for slot in range(item.slots_used or 0):
        try:
            send(update_action(item.resource, permit_sk(slot), update, condition, {}, values))
        except Refused as refused:
            return permit_of(refused.item or {"sk": permit_sk(slot)})
    return None


def fenced_permits(item: LockItem, stale_ms: int) -> LockItem:
    """The permit row ``item``, which another mode is about to take, with its holders read
    from its permits (consistently); if none is live, its slots fenced out first
    (:func:`fence_out`), the holder that refused that counted as live."""
    read = with_permits(item, consistent=True)
    if any(h.expires_ms >= stale_ms for h in read.holders.values()):
        return read
    stopped = fence_out(item, stale_ms)
    if stopped is not None and not stopped.free_at(stale_ms):
        return dataclasses.replace(read, holders={stopped.token: stopped.holder})
    return read


def raise_row(resource: str, expires_ms: int, slot: int | None = None) -> dict[str, Any]:
    """The row's ``expires`` up to the bucket of a permit's lease end, and its ``expMs`` to
    that bucket's end (only ever up: refused when the row is listed that far already, or is
    no permit row): the row is listed, and not reaped, while the permit may be live.

    ``slot``: raised for the holder of that slot (a renewal), refused too unless the row's
    ``hw`` is above it. A row reaped and made anew while the holder was paused has a ``hw``
    of its own: one at or below our slot knows nothing of our permit (it counts the slots
    below its ``hw``, and a change of its limit fences only those), and our renewal must
    not revive it there."""
    bucket = records.bucket_of(expires_ms)
    values: dict[str, Any] = {":exp": bucket, ":expMs": bucket * 1000}
    update = "SET #exp = :exp, #expMs = :expMs"
    condition = "attribute_exists(#hw) AND #exp <= :exp AND #expMs < :expMs"
    if slot is not None:
        condition += " AND #hw > :slot"
        values[":slot"] = slot
    return update_action(resource, LOCK_SK, update, condition, {}, values)


# -- member items (permits and reader items alike) --------------------------------------------


def item_sets(holder: Holder) -> tuple[str, dict[str, Any]]:
    """The SET terms and values that write ``holder`` into its item (a permit or a reader
    item): ``u``, ``e``, ``f``, ``a``, ``p`` if it names a process, ``expires`` (TTL)."""
    values: dict[str, Any] = {":u": holder.user_id, ":e": holder.expires_ms, ":f": holder.fence}
    values.update({":a": holder.acquired_ms, ":exp": _ttl(holder.expires_ms)})
    sets = "#u = :u, #e = :e, #f = :f, #a = :a, #exp = :exp"
    if holder.proc is not None:
        sets += ", #p = :p"
        values[":p"] = holder.proc
    return sets, values


def _ttl(expires_ms: int) -> int:
    return records.epoch_seconds(expires_ms) + records.BUCKET_S


def permit_ttl(expires_ms: int) -> int:
    """A permit's ``expires`` (TTL only): the longest lease and the clock skew after its
    holder's lease end, and a bucket. Its fence must outlast any take that drew an older
    one and is still to write it: a take paused between its row write and its permit write
    finds no fence to refuse it in a permit TTL deleted, and would hold it out of order, or
    beside whoever took the row since (an exclusive holder of a row reaped and made anew,
    which knows nothing of permits). Such a take's lease began before this write: it is
    over by then, and its write, landing later, is trusted by nobody."""
    linger = records.MAX_LEASE_S + math.ceil(settings.CLOCK_SKEW)
    return records.epoch_seconds(expires_ms) + records.BUCKET_S + linger


def renew_item(
    resource: str,
    sk: str,
    expires_ms: int,
    condition: str,
    values: dict[str, Any],
    ttl: Callable[[int], int] = _ttl,
) -> dict[str, Any]:
    """A holder's item (permit or reader item) renewed to ``expires_ms``, on ``condition``
    (``ttl``: its ``expires`` for that lease end)."""
    values = {**values, ":e": expires_ms, ":exp": ttl(expires_ms)}
    return update_action(resource, sk, "SET #e = :e, #exp = :exp", condition, {}, values)


def send(
    action: dict[str, Any], *, old: bool = False, resent: list[bool] | None = None
) -> dict[str, Any] | None:
    """Send one conditional write of a member item (or of the row, by these modules); the
    old item if ``old``. Raises :class:`Refused` (its ``item``: the item as it was).
    ``resent``: told (appended) whether botocore sent it more than once before its answer
    came (an earlier try, timed out, may still land)."""
    response = dynamodb.send_request(
        "update_item",
        TableName=settings.TABLE_NAME,
        ReturnValues="ALL_OLD" if old else "NONE",
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
        **action,
    )
    if resent is not None:
        resent.append(response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0)
    return records.decode(response.get("Attributes")) or {} if old else None


def send_break(action: dict[str, Any], resource: str, sk: str, breaker: str) -> bool:
    """Send an operator's break of the member item ``sk`` (``action``: its write, which
    leaves the break's own word ``breaker`` on it): whether it was applied. Refused, it was
    not (the holder gone), unless the refusal is of botocore's re-send of our own applied
    break; unanswered (the quick client sends once), it was if the item is our tombstone
    (one consistent read); else :class:`SemaphoreUnavailable` is raised."""
    try:
        send(action)
    except dynamodb.Refused as refused:
        return refused.retried and records.broken_by(refused.item, breaker)
    except SemaphoreUnavailable as exc:
        if not exc.ambiguous or not lock_rows.broken_by(resource, sk, breaker):
            raise
    return True


def members(
    resource: str, prefix: str, of: Callable[[dict[str, Any]], _T], **page: Any
) -> Iterator[_T]:
    """The member items of ``resource`` under ``prefix``, as ``of`` reads each, one page at
    a time, as they are iterated (``page``: ``consistent``, and ``limit`` items a page,
    ``after_sk`` the one to read after, as :func:`~dynasem._storage.dynamodb.prefix_pages`
    takes them)."""
    for found in dynamodb.prefix_pages(resource, prefix, **page):
        yield from (of(item) for item in found)


def listing_page(consistent: bool, most: int | None, after_sk: str | None) -> dict[str, Any]:
    """How a listing of no more than ``most`` holders reads member items (:func:`members`):
    one more than ``most`` (to know whether more are left), after ``after_sk``."""
    return {
        "consistent": consistent,
        "limit": None if most is None else most + 1,
        "after_sk": after_sk,
    }


def listed(
    item: LockItem,
    holders: dict[str, Holder],
    found: Iterator[tuple[str, Holder, str]],
    most: int | None,
    **changes: Any,
) -> LockItem:
    """``item`` with ``holders`` and those ``found`` (token, holder, sort key) for a listing:
    no more than ``most`` of them (``holders_next``: the sort key after which the rest are)."""
    count, last = 0, None
    for token, holder, sk in found:
        if most is not None and count >= most:
            return dataclasses.replace(item, holders=holders, holders_next=last, **changes)
        holders[token] = holder
        count, last = count + 1, sk
    return dataclasses.replace(item, holders=holders, **changes)


# -- the permit's writes -----------------------------------------------------------------------


def take_permit(
    resource: str,
    slot: int,
    token: str,
    holder: Holder,
    *,
    stale_ms: int,
    dead: Permit | None = None,
) -> dict[str, Any]:
    """Hold the permit: free, its holder's lease over by CLOCK_SKEW, or held by ``dead`` (a
    holder proven dead) as read; and every fence it had below ours. Or ours already (a retry
    whose first answer was lost).

    The fence condition keeps each permit's fences increasing in the order its holds began: a
    take slowed between its row write (which drew its fence) and this write must not hold the
    permit after someone who drew a later fence held it meanwhile (the slot was free to that
    one: found by reading the permits, or hinted twice). Refused, it draws a fresh fence."""
    sets, values = item_sets(holder)
    values.update({":tok": token, ":stale": stale_ms, ":exp": permit_ttl(holder.expires_ms)})
    update = "SET #k = :tok, " + sets + ("" if holder.proc is not None else " REMOVE #p")
    free = "attribute_not_exists(#k) OR #e < :stale"
    if dead is not None:
        free += " OR (#k = :dead AND #e = :deadE)"
        values.update({":dead": dead.token, ":deadE": dead.holder.expires_ms})
    condition = f"#k = :tok OR ((attribute_not_exists(#f) OR #f < :f) AND ({free}))"
    return update_action(resource, permit_sk(slot), update, condition, {}, values)


def renew_permit(resource: str, slot: int, token: str, expires_ms: int) -> dict[str, Any]:
    values = {":tok": token}
    return renew_item(resource, permit_sk(slot), expires_ms, "#k = :tok", values, permit_ttl)


def give_back_permit(resource: str, slot: int, token: str, now_ms: int) -> dict[str, Any]:
    """Our hold off the permit (the item stays, free: the next take is one small write)."""
    update = "REMOVE #k, #p SET #lt = :tok, #e = :now"
    values = {":tok": token, ":now": now_ms}
    return update_action(resource, permit_sk(slot), update, "#k = :tok", {}, values)


def break_permit(
    resource: str,
    slot: int,
    token: str,
    breaker: str,
    expires_ms: int | None = None,
    fence: int | None = None,
) -> dict[str, Any]:
    """An operator breaks the hold on the permit (under ``fence``, if given; the reaper: a
    dead one, its lease end as read, ``expires_ms``: a holder that renewed meanwhile keeps
    it). ``breaker``: the break's own word, kept (``bk``): a break whose answer was lost
    tells by it that the permit is free, to hint its slot."""
    values: dict[str, Any] = {":tok": token}
    condition = "#k = :tok"
    if expires_ms is not None:
        condition += " AND #e = :e"
        values[":e"] = expires_ms
    if fence is not None:
        condition += " AND #f = :f"
        values[":f"] = fence
    values[":bk"] = breaker
    update = "REMOVE #k, #p SET #bt = :tok, #bk = :bk"
    return update_action(resource, permit_sk(slot), update, condition, {}, values)


# -- reading -----------------------------------------------------------------------------------


def permits(resource: str, *, consistent: bool = True) -> list[Permit]:
    """Every permit item of ``resource``, held or not (for listings and operators)."""
    return list(members(resource, PERMIT_PREFIX, permit_of, consistent=consistent))


def find_free(
    resource: str, slots_used: int, stale_ms: int, dead: Callable[[Permit], bool] | None = None
) -> tuple[int | None, Permit | None, list[Permit]]:
    """A slot whose permit is free or whose holder's lease is over, read page by page until
    one is found (eventually consistent: the take's write decides); a slot below ``hw``
    with no item at all counts as free. ``dead``: whether a live holder's process is proven
    to have ended (then its permit is taken over, conditional on it being as read).
    Returns the slot (None: none), the dead holder's permit taken over (if so), and the held
    permits read on the way (the holders in our way, when there is none)."""
    held: list[Permit] = []
    expected = 0
    for permit in members(resource, PERMIT_PREFIX, permit_of, consistent=False, limit=PERMIT_PAGE):
        if permit.slot >= slots_used:
            continue
        if permit.slot > expected:
            return expected, None, held  # a slot whose item is gone (TTL): free
        expected = permit.slot + 1
        if permit.free_at(stale_ms):
            return permit.slot, None, held
        held.append(permit)
    if expected < slots_used:
        return expected, None, held
    for permit in held:
        if dead is not None and dead(permit):
            return permit.slot, permit, [p for p in held if p is not permit]
    return None, None, held


def with_permits(
    item: LockItem,
    *,
    consistent: bool = False,
    most: int | None = None,
    after_sk: str | None = None,
) -> LockItem:
    """A permit row with its holders read from its permits (for listings); others as they
    are. ``most``: read no further than that many holders (``holders_next`` is where the
    rest begin), so that a listing of 100,000 holders costs a page, not the whole
    collection; ``after_sk``: the holders after that one (a ``holders_next``)."""
    if item.slots_used is None:
        return item
    found = members(
        item.resource, PERMIT_PREFIX, permit_of, **listing_page(consistent, most, after_sk)
    )
    held = ((p.token, p.holder, permit_sk(p.slot)) for p in found if p.token)
    return listed(item, {}, held, most, permits_read=True)


def slot_of(resource: str, token: str, fence: int | None = None) -> Permit | None:
    """The permit ``token`` holds (under ``fence``, if given), if any (a read of every
    permit: for operators)."""
    found = (p for p in permits(resource) if p.token == token)
    return next((p for p in found if fence is None or p.holder.fence == fence), None)
