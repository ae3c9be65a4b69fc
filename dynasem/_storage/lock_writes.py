"""The writes: each builder returns the keyword arguments of one conditional ``UpdateItem``
(without ``TableName``), usable alone or as one action of a transaction;
:func:`dynasem._storage.lock_rows.update` and :func:`~dynasem._storage.lock_rows.transact`
send them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import records
from .records import LOCK_SK, Holder, LockItem, Mode, bucket_of, holder_value, key, with_expressions

# A shared row keeps this many readers among its holders; the next take reader items
# (reader_items.py, which builds on this module). Two: with them and the items' sentinel
# the row stays under 1 KB, so each of a crowd's row writes costs 1 WCU (eight inline
# readers made it 2 KB: every admission and count-down 2 WCU).
READERS_INLINE = 2
# The most dead holders one take removes.
MAX_EVICT = 64

# A take's lease: the row's user (a take leaves one that is there: see renew_hold), its
# ``expires`` bucket and its lease end.
LEASE = "#uid = if_not_exists(#uid, :uid), #exp = :exp, #expMs = :expMs"
# Nobody waits in the queue of entry items.
QUEUE_IDLE = "(attribute_not_exists(#qin) OR #qin = #qout)"


def update_action(
    pk: str, sk: str, update: str, condition: str, names: dict[str, str], values: dict[str, Any]
) -> dict[str, Any]:
    """UpdateItem's arguments (without ``TableName``). ``names``: the placeholders that are
    not in :data:`~dynasem._storage.records.NAMES` (a holder's token, say)."""
    action = {"Key": key(pk, sk), "UpdateExpression": update}
    if condition:
        action["ConditionExpression"] = condition
    return with_expressions(action, names, values)


def lease_values(entry: Holder) -> dict[str, Any]:
    """The values of :data:`LEASE` for a holder entry."""
    return {":uid": entry.user_id, ":exp": bucket_of(entry.expires_ms), ":expMs": entry.expires_ms}


def holder_entry(
    user_id: str, expires_ms: int, fence: int, now_ms: int, shared: bool, proc: str | None = None
) -> Holder:
    return Holder(user_id, expires_ms, fence, acquired_ms=now_ms, shared=shared, proc=proc)


@dataclass(frozen=True, kw_only=True)
class QueueTerms:
    """How a take treats the resource's waiters (see core: nobody cuts in line).

    The queue of entry items: ``mine``, our ticket if we are queued (the take then moves
    ``qout`` to it, conditional on ``qout`` being as seen: whoever was between was seen gone
    or dead); else, with ``qin`` > ``qout`` seen (every waiter seen gone or dead), the take
    passes them all, conditional on ``qin`` and ``qout`` as seen; else nobody may be waiting.
    ``served``: an earlier write of this take had its turn already (it moved ``qout``, and
    the slot it named proved taken): no term of the queue.
    """

    mine: int | None = None
    queue_in: int = 0
    queue_out: int = 0
    served: bool = False


def queue_clauses(terms: QueueTerms | None, values: dict[str, Any]) -> tuple[list[str], list[str]]:
    """SET clauses and conditions for a take, per :class:`QueueTerms`."""
    terms = terms or QueueTerms()
    if terms.served:
        return [], []
    if terms.mine is not None:
        values.update({":sqout": terms.queue_out, ":mine": terms.mine})
        return ["#qout = :mine"], ["#qout = :sqout"]
    if terms.queue_in > terms.queue_out:
        values.update({":sqin": terms.queue_in, ":sqout": terms.queue_out})
        return ["#qout = :sqin"], ["#qin = :sqin AND #qout = :sqout"]
    return [], [QUEUE_IDLE]


def take_free(
    resource: str,
    token: str,
    entry: Holder,
    *,
    mode: Mode,
    limit: int,
    stale_ms: int,
    queue: QueueTerms | None = None,
    permits_row: LockItem | None = None,
) -> dict[str, Any]:
    """Take a resource nobody holds (no item, no holders, or every lease long over).

    ``permits_row``: the row kept its holders in permit items (permit_items.py) and none of
    them was live when read: it becomes a row of holders inline again, conditional on no
    take since (its fence and slots as seen).

    Replaces the holders map with ours alone; the fence condition keeps fences strictly
    increasing even when our clock is behind the previous holder's.
    """
    sets = ["#h = :h, #mode = :mode, #lim = :lim, #fence = :fence", LEASE, "#shard = :shard"]
    conds = ["(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale)"]
    conds.append("(attribute_not_exists(#fence) OR #fence < :fence)")
    values = {":h": {token: holder_value(entry)}, ":mode": mode, ":lim": limit, ":zero": 0}
    values |= {":fence": entry.fence, ":shard": records.shard_of(resource), ":stale": stale_ms}
    if permits_row is None:
        conds.append("attribute_not_exists(#hw)")
    else:
        conds.append("#hw = :seenHw AND #fence = :seenFence")
        values |= {":seenHw": permits_row.slots_used, ":seenFence": permits_row.fence}
    q_sets, q_conds = queue_clauses(queue, values)
    update = "SET " + ", ".join(sets + q_sets)
    if permits_row is not None:
        update += " REMOVE #hw, #hints"
    values |= lease_values(entry)
    return update_action(resource, LOCK_SK, update, " AND ".join(conds + q_conds), {}, values)


def take_join(
    resource: str,
    token: str,
    entry: Holder,
    *,
    mode: Mode,
    limit: int,
    seen: LockItem,
    evict: list[str],
    replace: bool = False,
    queue: QueueTerms | None = None,
) -> dict[str, Any]:
    """Join the holders of a counting or shared resource, evicting expired holders (and
    holders whose process was proven dead: see :mod:`dynasem._engine.processes`).

    Conditional on the item being exactly as ``seen`` (mode, limit, holder count, fence and
    the evicted holders' lease ends), so a concurrent change makes us look again instead of
    overfilling the semaphore; an evicted holder that renewed or left meanwhile refuses it.
    ``replace`` (every seen holder evicted) lets us set another mode and limit, as nobody is
    left to disagree, and makes our lease end the item's own (an evicted dead holder's may
    have been later).
    """
    if len(evict) > MAX_EVICT:
        # The oldest only: a write's expressions are bounded (4 KB each), and 150 dead
        # holders would not fit one. The rest stay, dead, for the next joins, so not every
        # holder goes and the row keeps its mode and limit.
        evict = sorted(evict, key=lambda t: (seen.holders[t].expires_ms, t))[:MAX_EVICT]
        replace = False
    # The evicted holders: #x0, #x1..., each removed only if its lease end is still the one seen.
    names = {"#t": token} | {f"#x{i}": gone for i, gone in enumerate(evict)}
    values = {":entry": holder_value(entry), ":fence": entry.fence, ":mode": mode, ":lim": limit}
    values |= {":size": len(seen.holders), ":shard": records.shard_of(resource)}
    sets = ["#h.#t = :entry", "#fence = :fence", "#shard = :shard"]
    # attribute_exists first: a row moved to permit items has no holders map (moto, unlike
    # DynamoDB, fails on size() of a missing attribute instead of reading it false).
    conds = ["attribute_exists(#h)", "size(#h) = :size", "#fence < :fence"]
    (sets if replace else conds).extend(["#mode = :mode", "#lim = :lim"])
    if replace or entry.expires_ms >= seen.expires_ms:
        # Item-level expiry is the latest lease end of all holders: when we replace every
        # holder, set to ours over the very value we saw; else only ever pushed later, so
        # ours must end at or after the stored one (a holder may have renewed since). Not
        # "the value we saw": with hundreds of holders renewing the row, that condition
        # failed a join again and again (a wait=0 acquire of a semaphore with free permits
        # answered "busy, held by unknown").
        sets.append(LEASE)
        values |= lease_values(entry)
        conds.append("#expMs = :seenExp" if replace else "#expMs <= :expMs")
        if replace:
            values[":seenExp"] = seen.expires_ms
    else:
        # Left as it is, the item-level expiry must still cover our lease: it can have gone
        # down since ``seen`` (its last holder gave back, and one of a shorter lease took the
        # row free), and a row whose expMs is CLOCK_SKEW old is taken free over every holder
        # in it (take_free), ours too. Refused, the next plan raises it (LEASE above).
        conds.append("#expMs >= :ourExp")
        values[":ourExp"] = entry.expires_ms
    values |= {f":xe{i}": seen.holders[gone].expires_ms for i, gone in enumerate(evict)}
    conds += [f"#h.#x{i}.#e = :xe{i}" for i in range(len(evict))]
    q_sets, q_conds = queue_clauses(queue, values)
    update = "SET " + ", ".join(sets + q_sets)
    if evict:
        update += " REMOVE " + ", ".join(f"#h.#x{i}" for i in range(len(evict)))
    return update_action(resource, LOCK_SK, update, " AND ".join(conds + q_conds), names, values)


def take_room(
    resource: str, token: str, entry: Holder, *, mode: Mode, limit: int
) -> dict[str, Any]:
    """A counting or shared hold's first, blind try: join if there is room, same mode and
    limit, nobody queued, and our lease ends last (so it becomes the item's expiry). Anything
    else is refused and planned from the old item."""
    values = {":entry": holder_value(entry), ":fence": entry.fence, ":mode": mode, ":lim": limit}
    values |= lease_values(entry)
    room = "size(#h) < :lim"
    if mode == Mode.SHARED:
        # Readers past the first few (or while the row has reader items: its "readers"
        # holder) take reader items (reader_items.py): planned from the refusal.
        room = "size(#h) < :inline AND attribute_not_exists(#h.#s)"
        values[":inline"] = READERS_INLINE
    conds = ["attribute_exists(#h)", room, "attribute_not_exists(#hw)", "#mode = :mode"]
    conds += ["#lim = :lim", "#fence < :fence", "#expMs <= :expMs", QUEUE_IDLE]
    update = "SET #h.#t = :entry, #fence = :fence, " + LEASE
    return update_action(resource, LOCK_SK, update, " AND ".join(conds), {"#t": token}, values)


def renew_hold(
    resource: str,
    token: str,
    expires_ms: int,
    *,
    raise_item: bool,
    user_id: str | None = None,
    fence: int | None = None,
    refence: int | None = None,
) -> dict[str, Any]:
    """Push our lease end; conditional on our token still being among the holders (and,
    given ``fence``, on its entry being the one of that fence: a hold we only saw in a read
    that may be stale, which a later hand-over to the same waiter replaced).

    ``refence``: our entry and the row take this fresh fence (conditional on the stored one
    being below it): a take whose fence was drawn long before it may have landed, on a row
    reaped meanwhile and made anew by that very take, holds under a fence drawn before an
    earlier holder's (see :meth:`dynasem._engine.core.Acquire.write`).

    ``raise_item`` also pushes the item-level expiry, only ever later (another holder of a
    counting or shared resource may have a later one), and names ``user_id`` in ``userId``:
    a take leaves the row's ``userId`` as it was (moving it costs two index writes, and most
    holds end before their first renewal); a hold that lasts shows under its user from its
    first renewal on.
    """
    values: dict[str, Any] = {":e": expires_ms}
    update = "SET #h.#t.#e = :e"
    condition = "attribute_exists(#h.#t)"
    if fence is not None:
        condition += " AND #h.#t.#f = :f"
        values[":f"] = fence
    if refence is not None:
        update += ", #h.#t.#f = :nf, #fence = :nf"
        condition += " AND #fence < :nf"
        values[":nf"] = refence
    if raise_item:
        update += ", #exp = :exp, #expMs = :e"
        condition += " AND #expMs <= :e"
        values[":exp"] = bucket_of(expires_ms)
        if user_id is not None:
            update += ", #uid = :uid"
            values[":uid"] = user_id
    return update_action(resource, LOCK_SK, update, condition, {"#t": token}, values)


def give_back(
    resource: str,
    token: str,
    now_ms: int,
    *,
    sole: bool,
    hold_ms: int | None = None,
    lease_end_ms: int | None = None,
    queue_idle: bool = False,
    pass_to: int | None = None,
) -> dict[str, Any]:
    """Release our hold only; conditional on our token.

    ``queue_idle``: only if nobody waits in the queue of entry items (an exclusive holder's
    release: a refusal tells it that waiters came, and it hands the lock over instead).
    ``pass_to``: every waiter up to this ticket was seen gone or dead: the release passes
    them (``qout`` moves to it), only if no ticket was taken since (``qin`` is still it).

    ``lastToken`` remembers who released, so a retried release whose first response was lost
    is recognised as done.

    ``lease_end_ms``: the lease end our last write stored (its bucket is the row's
    ``expires``). A sole holder releasing after the bucket it stored has ended (a late
    release) moves ``expires`` up to ``now_ms``'s bucket, which must never read earlier than
    the row's ``expMs``."""
    values: dict[str, Any] = {":tok": token}
    sets = ["#lastToken = :tok"]
    if sole:
        # The sole holder leaves: the item is idle from now (reapable CLOCK_SKEW later)
        # instead of at its old lease end. ``now_ms`` may be a little ahead of the clock: see
        # Held._give_back. userId and the ``expires`` bucket stay: moving them would cost
        # index writes, and the listings decide from the holders, not from the index.
        sets.append("#expMs = :now")
        values[":now"] = now_ms
        if lease_end_ms is not None and bucket_of(now_ms) > bucket_of(lease_end_ms):
            sets.append("#exp = :exp")
            values[":exp"] = bucket_of(now_ms)
    if hold_ms is not None:
        sets.append("#hold = :hold")  # waiters estimate their turn from it
        values[":hold"] = hold_ms
    condition = "attribute_exists(#h.#t)"
    if pass_to is not None:
        sets.append("#qout = :pass")
        condition += " AND #qin = :pass"
        values[":pass"] = pass_to
    elif queue_idle:
        condition += " AND " + QUEUE_IDLE
    update = "REMOVE #h.#t SET " + ", ".join(sets)
    return update_action(resource, LOCK_SK, update, condition, {"#t": token}, values)


def hand_over(
    resource: str,
    token: str,
    heirs: Sequence[tuple[str, int, Holder]],
    *,
    hold_ms: int,
    mode: Mode | None = None,
    queue_out: int,
) -> dict[str, Any]:
    """Release our exclusive hold straight to the first waiters, in the same write: each heir
    (its token, its ticket, its entry: user, lease, a fresh fence) holds the lock from now
    and leaves the queue. One exclusive heir, or the readers at the head of the queue
    together; ``mode``: the row's mode from now (None: left as it is, exclusive).

    ``qout``: the row's ``qout`` we saw; it moves to the last heir's ticket, conditional on
    it being as we saw (nobody else took a turn meanwhile).

    Conditional on our token and on the stored fence being below every heir's (the heirs'
    fences differ: the row keeps the largest). The row's lease end and ``userId`` are the
    heir's whose lease ends last."""
    names, values, sets = _heirs_terms(heirs, mode, queue_out)
    names["#t"] = token
    values |= {":tok": token, ":hold": hold_ms}
    sets += ["#lastToken = :tok", "#hold = :hold"]
    condition = "attribute_exists(#h.#t) AND #qout = :sqout AND #fence < :low"
    update = "REMOVE #h.#t SET " + ", ".join(sets)
    return update_action(resource, LOCK_SK, update, condition, names, values)


def hand_on(
    resource: str,
    gone: dict[str, int],
    heirs: Sequence[tuple[str, int, Holder]],
    *,
    mode: Mode | None = None,
    queue_out: int,
) -> dict[str, Any]:
    """A waiter's write that hands an exclusive lock whose holders are all ``gone`` (their
    token and lease end as seen: each one's process proven ended on the waiter's host, or
    its lease over) to the first waiters ahead of it, as their release would have
    (:func:`hand_over`): a waiter of another host ahead cannot prove them dead, and would
    wait for their lease. Conditional on the holders being exactly these, each with the
    lease end seen (one that renewed, gave back, or was joined or taken over refuses it), on
    the row's mode, on ``qout`` as seen and on the stored fence being below every heir's.
    ``lastToken`` and the queue's hold time are left as they are: nobody released."""
    names, values, sets = _heirs_terms(heirs, mode, queue_out)
    names |= {f"#x{i}": token for i, token in enumerate(gone)}
    values |= {f":xe{i}": expires_ms for i, expires_ms in enumerate(gone.values())}
    values |= {":size": len(gone), ":seenMode": Mode.EXCLUSIVE}
    conds = ["attribute_exists(#h)", "size(#h) = :size", "#mode = :seenMode"]
    conds += [f"#h.#x{i}.#e = :xe{i}" for i in range(len(gone))]
    conds += ["#qout = :sqout", "#fence < :low"]
    removed = ", ".join(f"#h.#x{i}" for i in range(len(gone)))
    update = f"REMOVE {removed} SET " + ", ".join(sets)
    return update_action(resource, LOCK_SK, update, " AND ".join(conds), names, values)


def _heirs_terms(
    heirs: Sequence[tuple[str, int, Holder]], mode: Mode | None, queue_out: int
) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """The names, values and SET clauses that make ``heirs`` the holders (a hand-over's):
    each from now with its entry, ``qout`` moved to the last one's ticket (``:sqout``: as
    seen, for the condition), the largest fence (``:low``: the smallest, for the condition),
    the lease end and user of the heir whose lease ends last, and ``mode`` if given."""
    if not heirs:
        raise ValueError("a hand-over needs an heir")
    # The heirs: #n0, #n1..., each holding from now with its entry (:entry0, :entry1...).
    names = {f"#n{i}": heir for i, (heir, _, _) in enumerate(heirs)}
    entries = [entry for _, _, entry in heirs]
    values = lease_values(max(entries, key=lambda entry: entry.expires_ms))
    values |= {":fence": max(e.fence for e in entries), ":low": min(e.fence for e in entries)}
    values[":sqout"] = queue_out
    values[":nqout"] = max(ticket for _, ticket, _ in heirs)
    values |= {f":entry{i}": holder_value(entry) for i, entry in enumerate(entries)}
    sets = [f"#h.#n{i} = :entry{i}" for i in range(len(heirs))]
    sets += ["#qout = :nqout", "#fence = :fence", LEASE]
    if mode is not None:
        # Both indexes project the mode: a change costs a write in each, so only when it changes.
        sets.append("#mode = :mode")
        values[":mode"] = mode
    return names, values, sets


def take_ticket(
    resource: str, queue_id: int, *, idle_ms: int = 0, if_busy_ms: int | None = None
) -> dict[str, Any]:
    """Draw the next ticket of the resource's queue (``ADD qin 1``: never refused by another
    waiter's draw, unlike a ticket chosen by the waiter). ``qbase``: the queue's name if the
    row has none yet: a fresh one (from the clock), never the name of the row as the waiter
    saw it, which may have been reaped since; the entries of its queue are left (served ones
    with their leases live: TTL only) and must not be read as the new queue's. Its answer
    (the row, ALL_NEW) holds our ticket, ``qin``.

    ``idle_ms``: the lease end (``expMs``, its ``expires`` bucket, its ``shard``) of a row
    the draw makes anew (reaped, or deleted by TTL, since the waiter saw it busy): without
    them such a row is in no index and has no TTL, and a waiter interrupted or killed before
    its take leaves it forever. A row that is there keeps its own (the same values: no index
    write, no extra unit).

    ``if_busy_ms``: only if it is held (a lease ending at or after this) or others wait;
    otherwise the refusal's old row is the state to take it from."""
    update = "ADD #qin :one SET #qout = if_not_exists(#qout, :zero), "
    update += "#qbase = if_not_exists(#qbase, :base), #expMs = if_not_exists(#expMs, :expMs), "
    update += "#exp = if_not_exists(#exp, :exp), #shard = if_not_exists(#shard, :shard)"
    values: dict[str, Any] = {":one": 1, ":zero": 0, ":base": queue_id, ":expMs": idle_ms}
    values |= {":exp": bucket_of(idle_ms), ":shard": records.shard_of(resource)}
    condition = ""
    if if_busy_ms is not None:
        condition = "((size(#h) > :zero AND #expMs >= :busy) OR #qin > #qout)"
        values[":busy"] = if_busy_ms
    return update_action(resource, LOCK_SK, update, condition, {}, values)


def renew_waiter(
    resource: str, queue_id: int, ticket: int, expires_ms: int, address: str | None = None
) -> dict[str, Any]:
    """Push a queue entry's lease end (and its TTL); conditional on the entry being there,
    and not marked dead (:func:`mark_left`): a renewal still on its way when its waiter left
    (an async caller cancelled: the request goes on in its thread; a throttled attempt sent
    again) would make the entry live again for a whole lease, and be handed the lock.
    ``address``: where hand-overs are pushed from now on (its waiter listens only now)."""
    values: dict[str, Any] = {":e": expires_ms, ":exp": records.ttl_of(expires_ms), ":gone": 0}
    update, condition = "SET #e = :e, #exp = :exp", "attribute_exists(#e) AND #e > :gone"
    if address is not None:
        update, values[":n"] = f"{update}, #n = :n", address
    sk = records.entry_sk(queue_id, ticket)
    return update_action(resource, sk, update, condition, {}, values)


def mark_left(resource: str, queue_id: int, ticket: int, now_ms: int) -> dict[str, Any]:
    """A waiter leaves the queue: its entry's lease end becomes 0 (dead to every reader, and
    passed without a wait, unlike a missing entry). An entry not put yet (the waiter told the
    holder instead, queue.ENTRY_DEFER) is put dead, with a TTL a bucket from now."""
    update = "SET #e = :gone, #t = :t, #exp = if_not_exists(#exp, :exp)"
    values = {":gone": 0, ":t": ticket, ":exp": records.ttl_of(now_ms)}
    return update_action(resource, records.entry_sk(queue_id, ticket), update, "", {}, values)


def force_release(resource: str, token: str, fence: int | None = None) -> dict[str, Any]:
    """An operator breaks one hold (admin, CLI): conditional on that token still holding,
    under ``fence`` if given (the hold the operator saw: a waiter's token can be taken over
    and handed to it again under a later fence, a hold the operator never saw).

    Unlike :func:`give_back` it leaves ``lastToken`` alone and records ``brokenToken``: the
    broken holder's own release must not mistake the break for its release."""
    update, condition = "REMOVE #h.#t SET #brokenToken = :tok", "attribute_exists(#h.#t)"
    values: dict[str, Any] = {":tok": token}
    if fence is not None:
        condition += " AND #h.#t.#f = :f"
        values[":f"] = fence
    return update_action(resource, LOCK_SK, update, condition, {"#t": token}, values)
