"""A give-back that failed for a passing cause, sent again after a pause: a hold's release
(:class:`dynasem._engine.hold.Held`) and the undo of an interrupted take (a withdrawn row, a
permit's or a reader's item: :mod:`dynasem._engine.steps`, ``permit_hold``, ``reader_hold``).
Given up, what it gives back stays held by nobody until its lease runs out, and every waiter
waits that long for it: worth a few seconds of the caller's time."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable

from .. import _clock as clock
from .._observability.logs import facts
from .._storage import dynamodb
from ..exceptions import LimitExceeded, SemaphoreUnavailable

logger = logging.getLogger("dynasem")

# A give-back DynamoDB throttled still after botocore's retries is sent again for up to this
# many seconds (never past the hold's own deadline), after pauses that double from
# RELEASE_PAUSE up to a second. Throttling passes within a second or so (DynamoDB measures a
# partition's throughput per second), and so does another request's transaction on the item;
# an outage or a 5xx may not, and a caller leaving its block is not kept waiting on one.
RELEASE_PATIENCE = 5.0
RELEASE_PAUSE = 0.05


def passing(exc: SemaphoreUnavailable) -> bool:
    """Whether a give-back that failed so is worth sending again after a pause: throttled,
    or another request's transaction on the item (nothing was applied; both pass)."""
    throttled = isinstance(exc, LimitExceeded) and exc.limit == "throughput"
    return throttled or isinstance(exc, dynamodb.WriteConflict)


def paused(
    passing: bool,
    failures: int,
    started: float,
    until: float = math.inf,
    patience: float | None = None,
) -> bool:
    """Paused before sending again a give-back that failed (for the ``failures``-th time) for
    a passing cause; False: not worth it (another cause, or ``patience`` seconds after
    ``started`` (None: RELEASE_PATIENCE as it is at the call), or ``until``, the hold's
    deadline, reached by then)."""
    if not passing:
        return False
    cap = min(1.0, RELEASE_PAUSE * 2 ** (failures - 1))
    pause = random.uniform(cap / 2, cap)  # spread: the waiters' are throttled too
    if patience is None:
        patience = RELEASE_PATIENCE
    if clock.monotonic() + pause >= min(started + patience, until):
        return False
    time.sleep(pause)
    return True


def patiently(
    send: Callable[[], object],
    until: float = math.inf,
    gave_up: Callable[[SemaphoreUnavailable], None] | None = None,
    *,
    transient: bool = False,
    patience: float | None = None,
) -> bool:
    """``send`` a give-back of one item, sent again after a pause while it fails for a
    passing cause (``transient``: for any transient one, a 5xx or a dropped connection too,
    where giving up costs more than the caller's wait), for up to ``patience`` seconds and
    never past ``until``. False: given up (``gave_up`` told why: the last failure,
    ``ambiguous`` if any attempt's was, as an earlier one may have landed before a last one
    that never connected). Raises Refused, ``retried`` set if an attempt before may have
    been applied."""
    failures, started, ambiguous = 0, clock.monotonic(), False
    while True:
        try:
            send()
            return True
        except dynamodb.Refused as refused:
            refused.retried = refused.retried or ambiguous
            raise
        except SemaphoreUnavailable as exc:
            ambiguous |= exc.ambiguous
            failures += 1
            worth = passing(exc) or (transient and exc.transient)
            if not paused(worth, failures, started, until, patience):
                exc.ambiguous = ambiguous
                if gave_up is not None:
                    gave_up(exc)
                return False


def undone(
    send: Callable[[], object],
    resource: str,
    token: str,
    refused: Callable[[dynamodb.Refused], bool] | None = None,
) -> bool:
    """Best effort: ``send`` the undo of what an interrupted (or unanswered) take of
    ``resource`` may have written, patiently. False: refused (nothing of ours there, unless
    ``refused`` says an attempt of ours took it: then True), or given up (said so: it holds
    until its lease runs out)."""

    def gave_up(why: SemaphoreUnavailable) -> None:
        ex = facts(resource, token=token, outcome="give_back_failed", reason=why)
        message = (
            "dynasem: could not give back what an interrupted acquire took of %r (%s); it expires"
        )
        logger.warning(message, resource, why, extra=ex)

    try:
        return patiently(send, gave_up=gave_up)
    except dynamodb.Refused as exc:
        return refused is not None and refused(exc)
