"""Reader items: where a shared resource keeps its readers past the first few, one item per
reader, so that no write grows with the number of readers and their number has no ceiling
but the table's.

The resource's row (``sk = "lock"``) keeps what a writer must agree on, and nothing per
reader: ``rc``, how many readers were admitted to items and have not given them back, under
the epoch ``repoch``; ``rlease``, the longest lease admitted in the epoch (ms); ``rlast``, the
last admission's epoch and token (so that one sent again after its answer was lost is not
counted twice: :func:`admit`); and a holder entry, ``readers``
(:data:`SENTINEL`), whose lease end covers every reader item's. To every writer that entry
is a live shared holder: it waits, as for a reader in the row.

A reader item is ``sk = "r#<token>"`` (:func:`reader_sk`): ``u`` user, ``e`` lease end, ``f``
fence, ``a`` taken at, ``p`` process, ``ep`` the epoch it was admitted under; ``expires`` for
TTL only; in no index. An operator's break (or the reaper's) leaves it as a tombstone, not
deleted: ``bt`` the broken token, its fence and epoch, no lease end, a TTL a bucket from the
break (:func:`break_reader`); no reader, to anyone who reads it (:func:`readers`).

An admission is two writes: the row (``fence + 1``, ``rc + 1`` or a new epoch, the sentinel's
lease end raised to cover ours; the queue's terms as for any take), then the reader's item,
trusted only within ``lease - CLOCK_SKEW`` of the row's write. A renewal writes the item, and
the row first only when the new lease end passes the sentinel's (a bucket end, so once per
15 minutes), conditional on the epoch: a reader whose epoch was written off cannot renew. A
release deletes the item, then counts ``rc`` down (one attempt, never twice: a count too high
only delays a writer, one too low would let it in early); the one that counts it to 0
removes the sentinel and pushes the first waiter.

Readers that died leave their count behind. A writer waiting on the sentinel writes them off
once it has seen the row unchanged (no admission: the fence; no release: ``rc``) for
``rlease + CLOCK_SKEW`` on its own monotonic clock (no reader admitted before could still be
trusted without an item a read now sees): a consistent read of the items finds none of the
epoch live, each dead one is deleted (conditional on its lease end as read: a late renewal
keeps it), and the row's epoch moves on, conditional on the fence and ``rc`` as seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..conf import settings
from . import dynamodb, records
from .dynamodb import Refused as Refused

# A shared resource keeps up to READERS_INLINE readers in its row (their writes cost no more
# than an item's two); the next ones, and every one while the row has reader items, in items.
from .lock_writes import READERS_INLINE as READERS_INLINE
from .lock_writes import QueueTerms, update_action
from .permit_items import Terms, item_sets, listed, listing_page, members, renew_item
from .permit_items import send as send
from .records import LOCK_SK, READER_PREFIX, Holder, LockItem, Mode, Reader, bucket_of, reader_sk

# The row's holder entry that stands for its reader items.
SENTINEL = "readers"
# The sentinel's user, as listings and busy errors name it until its items are read.
READERS_USER = "(readers)"


def has_readers(item: LockItem | None) -> bool:
    """Whether the row stands for reader items (its sentinel holder is there)."""
    return item is not None and SENTINEL in item.holders


def wants_item(seen: LockItem | None, live: Mapping[str, Holder]) -> bool:
    """Whether a reader joining ``seen`` (a shared row, or a row with reader items) takes a
    reader item rather than an entry among the row's holders."""
    if seen is None:
        return False
    if has_readers(seen):
        return True
    return seen.mode == Mode.SHARED and len(live) >= READERS_INLINE and seen.fence > 0


def covers_to(expires_ms: int, seen: LockItem) -> int:
    """The sentinel's lease end that covers a reader's ``expires_ms``: its bucket's end, and
    never below the row's own lease end (which is its holders' latest)."""
    return max(bucket_of(expires_ms) * 1000, seen.expires_ms)


# -- the row's writes --------------------------------------------------------------------------


def epoch_of(seen: LockItem, stale_ms: int, now_ms: int) -> int:
    """The epoch an admission planned from ``seen`` joins: the live sentinel's, else the next
    one, drawn from the clock (ms) when that is ahead, so that a row reaped and made again
    never reuses the epoch of readers that may still be on their way."""
    sentinel = seen.holders.get(SENTINEL)
    if sentinel is not None and sentinel.expires_ms >= stale_ms:
        return seen.reader_epoch
    return max(seen.reader_epoch + 1, now_ms)


def admission_mark(token: str, epoch: int) -> str:
    """What an admission leaves on the row (``rlast``): the epoch it counted its reader in
    and the reader's token (the epoch too: a mark of an earlier epoch never matches)."""
    return f"{epoch}.{token}"


def admitted_before(seen: LockItem | None, token: str, stale_ms: int) -> bool:
    """Whether ``seen`` shows that an admission of ``token`` was applied and is still
    counted: the live epoch's last admission was ours (its answer was lost, and botocore's
    re-send of it refused). Then :func:`admit` confirms it instead of counting it again."""
    if seen is None or not token:
        return False
    sentinel = seen.holders.get(SENTINEL)
    live = sentinel is not None and sentinel.expires_ms >= stale_ms
    return live and seen.last_reader == admission_mark(token, seen.reader_epoch)


def admit(
    resource: str,
    *,
    seen: LockItem,
    token: str,
    expires_ms: int,
    lease_ms: int,
    now_ms: int,
    stale_ms: int,
    queue: QueueTerms,
    fence: int | None = None,
    limit: int = 1,
    user_id: str = "",
) -> dict[str, Any]:
    """The row's part of a reader's admission (send it with ``return_new``: the new row has
    our fence, ``fence + 1``, and the epoch). Joins the epoch of the sentinel as ``seen`` if
    it is live (``rc + 1``); else opens the next one (``rc = 1``: a sentinel gone or over
    stands for no reader who could still be trusted; :func:`epoch_of`).

    Conditional on the row being shared (no writer holds it) or, for a row ``seen`` free (no
    live holder; or none at all), still free; the sentinel as seen; its lease end reaching no
    further than ours will (so it covers ours); and the queue's terms. ``fence``: named (in a
    transaction, which returns nothing), above the stored one; None: counted up.

    Counted once per ``token``: the admission marks the row as ours (``rlast``), and a join
    is refused where the mark is ours already (botocore sending it again after its answer
    was lost; an epoch opened is refused by its own terms). Planned from such a row
    (:func:`admitted_before`), it confirms our admission: no count, no turn in the queue, a
    new fence (a writer's wait to write the readers off starts again), the sentinel raised."""
    cover = covers_to(expires_ms, seen)
    epoch = epoch_of(seen, stale_ms, now_ms)
    sent = records.holder_value(Holder(READERS_USER, cover, 0, acquired_ms=now_ms, shared=True))
    terms = Terms({":s": Mode.SHARED, ":cover": cover, ":exp": bucket_of(cover)})
    terms.values.update({":sent": sent, ":E": seen.reader_epoch, ":L": lease_ms})
    terms.values[":mark"] = admission_mark(token, epoch)
    terms.fence(fence)
    terms.sets += ["#h.#s = :sent", "#expMs = :cover", "#exp = :exp", "#rla = :mark"]
    terms.need("#expMs <= :cover")
    if epoch == seen.reader_epoch:
        if admitted_before(seen, token, stale_ms):
            queue = QueueTerms(served=True)  # our turn, if we had one, was had
        else:
            terms.adds.append("#rc :one")
            terms.values[":one"] = 1
        _join(seen, lease_ms, bool(terms.adds), terms)
    else:
        _open(resource, seen, stale_ms, limit, user_id, epoch, terms)
    return terms.action(resource, queue)


def _join(seen: LockItem, lease_ms: int, counted: bool, terms: Terms) -> None:
    """:func:`admit`'s terms for joining the live epoch ``seen``: ``counted`` (a reader
    more) only if the mark is not ours yet; else (a confirmation) only if it still is."""
    terms.conds += ["#mode = :s", "attribute_exists(#h.#s)", "#rep = :E"]
    if counted:
        terms.need("(attribute_not_exists(#rla) OR #rla <> :mark)")
    else:
        terms.need("#rla = :mark")
    if lease_ms > seen.reader_lease_ms:
        terms.sets.append("#rl = :L")
        terms.need("(attribute_not_exists(#rl) OR #rl <= :L)")
    else:
        terms.need("#rl >= :L")


def _open(
    resource: str, seen: LockItem, stale_ms: int, limit: int, user_id: str, epoch: int, terms: Terms
) -> None:
    """:func:`admit`'s terms for opening ``epoch`` (its first reader, ``rc = 1``), on a row
    ``seen`` free, or shared with no live sentinel; a re-send once applied is refused (the
    epoch, the holders)."""
    sentinel = seen.holders.get(SENTINEL)
    sets, conds, values = terms.sets, terms.conds, terms.values
    if seen.expires_ms < stale_ms or not seen.holders or seen.slots_used is not None:
        # Nobody holds it: the holders' map becomes the sentinel alone (dead entries go).
        sets[1] = "#h = :hmap"
        values[":hmap"] = {SENTINEL: values.pop(":sent")}
        values.update({":zero": 0, ":stale": stale_ms, ":lim": limit, ":uid": user_id})
        conds[-1] = "(attribute_not_exists(#expMs) OR #expMs <= :cover)"
        conds.append("(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale)")
        _no_permits(seen, terms)
        sets += ["#mode = :s", "#lim = :lim", "#shard = :shard", "#uid = if_not_exists(#uid, :uid)"]
        values[":shard"] = records.shard_of(resource)
    else:
        conds.append("#mode = :s")
        if sentinel is None:
            conds.append("attribute_exists(#h) AND attribute_not_exists(#h.#s)")
            if len(seen.holders) >= READERS_INLINE:
                # Opened because the row keeps no more readers inline, as seen (perhaps long
                # ago, by reader_hold.rows): only while it still keeps that many; else the
                # refusal shows a row a reader joins inline (its holders may have left).
                terms.need("size(#h) >= :inline", {":inline": READERS_INLINE})
        else:
            terms.need("#h.#s.e = :seenE", {":seenE": sentinel.expires_ms})
    conds.append("(attribute_not_exists(#rep) OR #rep = :E)")
    sets += ["#rep = :E1", "#rc = :first", "#rl = :L"]
    values.update({":E1": epoch, ":first": 1})


def _no_permits(seen: LockItem, terms: Terms) -> None:
    """:func:`_open`'s terms for the row's permits: none (no permit row); or, for a permit
    row ``seen`` whose permits were read, none of them live, and fenced out
    (:func:`~dynasem._storage.permit_items.fenced_permits`), the row shared from now on if
    no take came since (its fence and slots as seen), as any other mode takes it."""
    if seen.slots_used is None:
        terms.need("attribute_not_exists(#hw)")
        return
    if not seen.permits_read:
        raise ValueError(f"{seen.resource!r}: a permit row's permits must be read first")
    values = {":seenHw": seen.slots_used, ":seenFence": seen.fence}
    terms.need("#hw = :seenHw AND #fence = :seenFence", values)
    terms.removes += ["#hw", "#hints"]


def raise_sentinel(resource: str, epoch: int, expires_ms: int, seen: LockItem) -> dict[str, Any]:
    """The sentinel's lease end up to cover ``expires_ms`` (a renewal that passes it): only
    while the epoch is ours. Refused: written off (the renewal is lost), or raised already
    by another reader (the old row says which)."""
    cover = covers_to(expires_ms, seen)
    values = {":E": epoch, ":cover": cover, ":exp": bucket_of(cover)}
    update = "SET #h.#s.e = :cover, #expMs = :cover, #exp = :exp"
    condition = "attribute_exists(#h.#s) AND #rep = :E AND #expMs <= :cover AND #h.#s.e < :cover"
    return update_action(resource, LOCK_SK, update, condition, {}, values)


def count_down(
    resource: str, epoch: int, *, forget: str | None = None, marked: str | None = None
) -> dict[str, Any]:
    """One reader of the epoch gone (``rc - 1``; send with ``return_new``). ``forget``: the
    token of an admission given back (its reader never held it): the row's mark goes with
    its count, in the same write, so that the same token admitted again is counted again,
    never taken for the admission given back (:func:`admitted_before`); only if the mark is
    still that admission's (:func:`marked_terms`): a later admission's mark stays, for
    botocore's re-send of it (its answer lost) to find, or it would count its reader twice.
    Refused for that, it is sent again without ``forget``. ``marked``: only if the row's
    mark is still this token's admission."""
    update = "ADD #rc :minus" + (" REMOVE #rla" if forget else "")
    condition = "#rep = :E AND attribute_exists(#h.#s)"
    values: dict[str, Any] = {":minus": -1, ":E": epoch}
    condition += marked_terms(epoch, marked or forget, values)
    return update_action(resource, LOCK_SK, update, condition, {}, values)


def leave_last(resource: str, epoch: int, marked: str | None = None) -> dict[str, Any]:
    """The epoch's one reader gone, and the sentinel with it, in one write (send with
    ``return_new``); refused if others were admitted (then :func:`count_down`). A retry of
    an applied one is refused too: never counted twice. ``marked``: as for count_down."""
    condition = "#rep = :E AND #rc = :one AND attribute_exists(#h.#s)"
    values: dict[str, Any] = {":E": epoch, ":zero": 0, ":one": 1}
    condition += marked_terms(epoch, marked, values)
    return update_action(resource, LOCK_SK, "SET #rc = :zero REMOVE #h.#s", condition, {}, values)


def marked_terms(epoch: int, token: str | None, values: dict[str, Any]) -> str:
    """The condition that the row's mark (``rlast``) is ``token``'s admission to ``epoch``
    (none if ``token`` is None): an admission whose item was never written counts its
    reader down only so, as nothing else shows that it was counted and not counted down
    since (a break, a write-off or a release needs the item, or moves the epoch on). A
    later admission moves the mark: then it stays counted, for a writer to write off."""
    if token is None:
        return ""
    values[":mark"] = admission_mark(token, epoch)
    return " AND #rla = :mark"


def close(resource: str, epoch: int) -> dict[str, Any]:
    """The epoch's last reader gone: its sentinel off the row (send with ``return_new``, to
    push the first waiter); only while nobody was admitted since."""
    condition = "#rep = :E AND #rc <= :zero AND attribute_exists(#h.#s)"
    return update_action(
        resource, LOCK_SK, "REMOVE #h.#s", condition, {}, {":E": epoch, ":zero": 0}
    )


def write_off(resource: str, seen: LockItem) -> dict[str, Any]:
    """The epoch's readers written off (every one found dead): the sentinel off the row and
    the next epoch, conditional on no admission (the fence) and no release (``rc``) since."""
    update = "SET #rc = :zero, #rep = :E1 REMOVE #h.#s"
    condition = "attribute_exists(#h.#s) AND #rep = :E AND #fence = :F AND #rc = :rc"
    epoch = seen.reader_epoch
    values = {":zero": 0, ":E": epoch, ":E1": epoch + 1, ":F": seen.fence, ":rc": seen.reader_count}
    return update_action(resource, LOCK_SK, update, condition, {}, values)


# -- the reader item's writes ------------------------------------------------------------------


def put_reader(resource: str, token: str, holder: Holder, epoch: int) -> dict[str, Any]:
    """The reader's item (its token is its key: a retry writes the same item again), unless
    it was broken under this admission's fence or a later one (:func:`break_reader`).

    The admission counted its reader in the row first: an operator's break that lands
    between this write (applied, its answer lost) and its re-send counts it down again,
    and the last one takes the sentinel off. Sent again over a deleted item, the write
    would make a reader nobody counts, whom a writer does not wait for. Refused (the
    tombstone's fence is ours): broken while admitted; the admission must be made again.
    A later admission of the same token (a fresh fence, above the tombstone's) writes over
    it; never the other way round: a try of an earlier admission's write still on its way
    (timed out; that admission given back) is refused by the later one's item, which it
    would leave claiming the earlier epoch, a reader that a writer's write-off of the live
    epoch does not find, beside whom the writer takes the lock."""
    sets, values = item_sets(holder)
    values[":ep"] = epoch
    update = f"SET {sets}, #ep = :ep REMOVE #bt"
    condition = "attribute_not_exists(#f) OR #f < :f OR (#f = :f AND attribute_not_exists(#bt))"
    return update_action(resource, reader_sk(token), update, condition, {}, values)


def renew_reader(resource: str, token: str, expires_ms: int) -> dict[str, Any]:
    return renew_item(resource, reader_sk(token), expires_ms, "attribute_exists(#e)", {})


def break_reader(
    resource: str,
    token: str,
    until_ms: int,
    breaker: str,
    expires_ms: int | None = None,
    fence: int | None = None,
) -> dict[str, Any]:
    """An operator breaks reader ``token`` (the reaper: a dead one, its lease end as read,
    ``expires_ms``: a reader that renewed meanwhile keeps it). Not a delete: the item
    becomes a tombstone, its lease end and holder gone, ``bt`` its token, fence and epoch
    kept, so that a re-send of the reader's own :func:`put_reader` (its first answer lost)
    is refused and does not make the broken reader again; it goes with TTL a bucket after
    ``until_ms`` (the later of the reader's lease end and now). ``fence``: only the reader of
    that admission (an operator's, as listed). ``breaker``: this break's own word, kept in
    the tombstone (``bk``): a break whose answer was lost tells its tombstone by it."""
    values: dict[str, Any] = {":tok": token, ":exp": records.ttl_of(until_ms)}
    condition = "attribute_exists(#e)"
    if expires_ms is not None:
        condition = "#e = :e"
        values[":e"] = expires_ms
    if fence is not None:
        condition += " AND #f = :f"
        values[":f"] = fence
    values[":bk"] = breaker
    update = "REMOVE #e, #u, #a, #p SET #bt = :tok, #exp = :exp, #bk = :bk"
    return update_action(resource, reader_sk(token), update, condition, {}, values)


def bar_reader(
    resource: str, token: str, fence: int, until_ms: int, word: str, over: int | None = None
) -> dict[str, Any]:
    """Our own tombstone where our reader item is not: the item's write of an admission cut
    short may still be on its way (its answer lost with an interrupt), and landing after its
    count was taken back it would be an item nobody counts, whose later delete (our other
    undo, the reaper's or an operator's break) counts the row down once more, beside a live
    reader. :func:`put_reader` is refused by a tombstone of its fence or a later one. Refused
    if the item is there (it landed: delete it instead), or a break's tombstone (it landed
    and was broken, and the break counted the reader down: written over, the bar would count
    it down again); ``word``: this bar's own (``bk``), so that botocore's re-send of it is
    not refused by it. ``over``: a tombstone of a fence below it is written over (an earlier
    admission's of the same token, given back: not a break of this one). TTL a bucket after
    ``until_ms``."""
    values: dict[str, Any] = {":tok": token, ":f": fence, ":exp": records.ttl_of(until_ms)}
    values[":bk"] = word
    update = "SET #bt = :tok, #f = :f, #exp = :exp, #bk = :bk"
    passes = "attribute_not_exists(#bt) OR #bk = :bk"
    if over is not None:
        passes += " OR #f < :over"
        values[":over"] = over
    condition = f"attribute_not_exists(#e) AND ({passes})"
    return update_action(resource, reader_sk(token), update, condition, {}, values)


def retire_reader(
    resource: str, token: str, fence: int, until_ms: int, word: str
) -> dict[str, Any]:
    """Our reader item, if it is there, left our own tombstone under ``fence`` (as
    :func:`bar_reader` writes where it is not), not deleted: the undo of an admission whose
    item's write timed out, a try of it still on its way after a later one landed, which
    over a deleted item would make a reader nobody counts. ``word``: this write's own
    (``bk``), so that botocore's re-send of it passes. TTL a bucket after ``until_ms``."""
    values: dict[str, Any] = {":tok": token, ":f": fence, ":exp": records.ttl_of(until_ms)}
    values[":bk"] = word
    update = "REMOVE #e, #u, #a, #p SET #bt = :tok, #f = :f, #exp = :exp, #bk = :bk"
    condition = "attribute_exists(#e) OR (#bt = :tok AND #bk = :bk)"
    return update_action(resource, reader_sk(token), update, condition, {}, values)


def unmark(resource: str, epoch: int, token: str) -> dict[str, Any]:
    """The row's mark of our admission (``rlast``) off, if it is still ours: an admission
    broken before its item was written (:func:`put_reader` refused) was counted down by the
    break; admitted again, it must be counted again, not taken for the admission confirmed
    (:func:`admitted_before`)."""
    values = {":mark": admission_mark(token, epoch)}
    return update_action(resource, LOCK_SK, "REMOVE #rla", "#rla = :mark", {}, values)


def drop_reader(resource: str, token: str, expires_ms: int | None = None) -> None:
    """Delete the reader's item, if it is there (``expires_ms``: and its lease end is as
    read, so a reader that renewed meanwhile keeps it). Raises :class:`Refused` if not."""
    values: dict[str, Any] = {}
    condition = "attribute_exists(#e)"
    if expires_ms is not None:
        condition = "#e = :e"
        values[":e"] = expires_ms
    dynamodb.send_request(
        "delete_item",
        TableName=settings.TABLE_NAME,
        Key=records.key(resource, reader_sk(token)),
        ConditionExpression=condition,
        ExpressionAttributeNames=records.names_in(condition),
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
        **({"ExpressionAttributeValues": records.encode(values)} if values else {}),
    )


# -- reading -----------------------------------------------------------------------------------


def readers(resource: str, *, consistent: bool = True) -> list[Reader]:
    """Every reader item of ``resource``, of any epoch, live or not; no tombstone (a reader
    broken: :func:`break_reader`)."""
    found = members(resource, READER_PREFIX, records.reader_of, consistent=consistent)
    return [r for r in found if r.broken_token is None]


def with_readers(
    item: LockItem,
    *,
    consistent: bool = False,
    most: int | None = None,
    after_sk: str | None = None,
) -> LockItem:
    """A row with its sentinel replaced by the reader items of its epoch (for listings);
    others as they are. ``most``: read no further than that many reader items of the epoch
    (``holders_next`` is where the rest begin); ``after_sk``: only the reader items after
    that one (a ``holders_next``: the row's own readers were on the page before)."""
    if not has_readers(item):
        return item
    holders = {} if after_sk else {t: h for t, h in item.holders.items() if t != SENTINEL}
    page = listing_page(consistent, most, after_sk)
    found = members(item.resource, READER_PREFIX, records.reader_of, **page)
    ours = (
        (r.token, r.holder, reader_sk(r.token))
        for r in found
        if r.epoch == item.reader_epoch and r.broken_token is None
    )
    return listed(item, holders, ours, most)
