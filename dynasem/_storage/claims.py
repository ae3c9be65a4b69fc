"""The writes of unique tasks (:mod:`dynasem._background.unique`) on an exclusive lock row.

A claim is an ordinary exclusive hold, taken at enqueue. The worker's run does not renew it:
it *adopts* it, replacing the claim's holder entry with its own under a fresh token, in one
write conditional on the claim's token. A second adoption of the same claim (a message
delivered twice, a retry started early) finds the claim's token gone. A run that enqueues
its retry *announces* the retry's token in its entry (``n``) and, when it ends, is adopted
by that token (with no process, for the queue lease); the retry's run adopts that in turn.
"""

from __future__ import annotations

from typing import Any

from .lock_writes import lease_values, update_action
from .records import LOCK_SK, Holder, holder_value


def adopt_hold(
    resource: str,
    claimed: str,
    token: str,
    entry: Holder,
    *,
    announced: str | None = None,
    stale_ms: int = 0,
    as_announced: bool = False,
) -> dict[str, Any]:
    """``token`` (with ``entry``) replaces the holder ``claimed``, conditional on it being
    there; its lease end becomes the row's (an exclusive row: the only holder's; the queue
    lease's may be later than a run lease). ``announced``: only if ``claimed`` announced it as
    its next and its lease ended before ``stale_ms`` (a run that died after enqueueing its
    retry: the retry, whose claim ``announced`` is, takes over, with the larger fence of its
    ``entry``). ``as_announced``: only if ``claimed`` announced ``token`` as its next still (a
    run's hold becoming its retry's claim: a retry withdrawn meanwhile is not claimed)."""
    values = {":entry": holder_value(entry), **lease_values(entry)}
    update = "REMOVE #h.#c SET #h.#t = :entry, #expMs = :expMs, #exp = :exp, #uid = :uid"
    condition = "attribute_exists(#h.#c)"
    if as_announced:
        condition += " AND #h.#c.#n = :tok"
        values[":tok"] = token
    if announced is not None:
        # A take-over: the run may only be stalled, so its successor gets a larger fence, as
        # any take-over does (the entry carries it).
        update += ", #fence = :fence"
        condition += " AND #h.#c.#n = :next AND #h.#c.#e < :stale AND #fence < :fence"
        values |= {":next": announced, ":stale": stale_ms, ":fence": entry.fence}
    names = {"#c": claimed, "#t": token}
    return update_action(resource, LOCK_SK, update, condition, names, values)


def announce_next(resource: str, token: str, next_token: str) -> dict[str, Any]:
    """The run ``token`` enqueued its retry, whose message carries ``next_token``."""
    update, condition = "SET #h.#t.#n = :n", "attribute_exists(#h.#t)"
    return update_action(resource, LOCK_SK, update, condition, {"#t": token}, {":n": next_token})


def withdraw_next(resource: str, token: str, next_token: str) -> dict[str, Any]:
    """The run ``token``'s retry ``next_token`` is withdrawn (revoked before it ran): the run
    gives its hold back at its end instead of making it that retry's claim."""
    update, condition = "REMOVE #h.#t.#n", "#h.#t.#n = :n"
    return update_action(resource, LOCK_SK, update, condition, {"#t": token}, {":n": next_token})
