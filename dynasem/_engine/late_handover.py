"""A hand-over that reached a waiter after it had left the queue (see
:func:`dynasem._engine.push.depart`): its process hands the lock on as soon as it learns of it (a
push, or its late look at the row) instead of leaving it held by nobody until its lease runs
out."""

from __future__ import annotations

import functools
import logging

from .. import _clock as clock
from .._observability import telemetry
from .._observability.logs import facts
from .._storage import queue_entries, records
from ..exceptions import SemaphoreUnavailable
from . import push
from .hold import Held
from .lockspec import LockSpec
from .queue import Pace
from .steps import Request, Steps

logger = logging.getLogger("dynasem")


def give_back_stray(
    semaphore: LockSpec, token: str, item: records.LockItem, *, lease: float, skew: float
) -> None:
    """A hand-over ``item`` made ``token`` a holder after its waiter had left the queue (see
    :func:`dynasem._engine.push.depart`): nobody will use that hold, so hand it on to the next
    waiter now (or release it) rather than leave the lock idle for a whole lease."""
    resource = semaphore.resources[0]
    holder = item.holders.get(token)
    if holder is None:
        return
    held = Held(
        semaphore,
        token=token,
        user_id=holder.user_id,
        fences={resource: holder.fence},
        lease=lease,
        skew=skew,
        expires_ms=holder.expires_ms,
        sent_mono=clock.monotonic(),
    )
    logger.info(
        "dynasem: giving back %r, handed to a waiter that had left",
        resource,
        extra=facts(resource, token=token, fence=holder.fence, outcome="stray_given_back"),
    )
    try:
        with telemetry.naming(telemetry.lock_name(semaphore) if telemetry.ON else None):
            held.hand_on(item)
    except Exception as exc:
        logger.warning(
            "dynasem: could not give back %r: %s; it expires",
            resource,
            exc,
            extra=facts(
                resource, token=token, fence=holder.fence, outcome="give_back_failed", reason=exc
            ),
        )


def leave_queue(
    semaphore: LockSpec, pace: Pace, token: str, *, lease: float, skew: float
) -> Steps[records.LockItem | None]:
    """A queued waiter whose wait ran out leaves the queue. Returns the row if a hand-over
    reached us meanwhile (ours to keep); else None, and a hand-over still on its way is
    handed on (:func:`give_back_stray`) when its push comes or, pushed or not, when this
    process looks at the row once more a little later (:func:`dynasem._engine.push.depart`).
    ``pace.ticket`` stays our place when we left, for the busy estimate."""
    resource = semaphore.resources[0]
    ticket, pace.ticket = pace.ticket, None
    if ticket is None:
        return None
    try:
        gone: records.LockItem | None = yield Request(
            functools.partial(
                queue_entries.leave_queue, resource, pace.queue_id, ticket, token=token
            )
        )
        if gone is not None and token in gone.holders:
            return gone
        handed = queue_entries.may_be_handed(gone, pace.queue_id, ticket, token)
    except SemaphoreUnavailable:
        handed = True  # our entry may be there still (it expires with its lease)
    push.depart(
        token,
        functools.partial(give_back_stray, semaphore, token, lease=lease, skew=skew),
        seconds=lease + skew,
        resource=resource if handed else None,
    )
    pace.ticket = ticket
    return None
