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
from .steps import Request, Steps, run_sync

logger = logging.getLogger("dynasem")


def give_back_stray(
    semaphore: LockSpec, token: str, item: records.LockItem, *, lease: float, skew: float
) -> bool:
    """A hand-over ``item`` made ``token`` a holder after its waiter had left the queue (see
    :func:`dynasem._engine.push.depart`): nobody will use that hold, so hand it on to the next
    waiter now (or release it) rather than leave the lock idle for a whole lease. False if
    that failed (the late look then tries again)."""
    resource = semaphore.resources[0]
    holder = item.holders.get(token)
    if holder is None:
        return True
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
        return False
    return not held.unreleased  # its release gave up (logged): still ours, maybe


def leave_queue(
    semaphore: LockSpec, token: str, entry: tuple[int, int], *, lease: float, skew: float
) -> Steps[records.LockItem | None]:
    """A queued waiter (``entry``: its queue's qbase and its ticket) leaves the queue. Returns
    the row if a hand-over reached us meanwhile; else None, and a hand-over still on its way
    is handed on (:func:`give_back_stray`) when its push comes or, pushed or not, when this
    process looks at the row once more a little later (:func:`dynasem._engine.push.depart`)."""
    resource = semaphore.resources[0]
    drop = None
    try:
        gone: records.LockItem | None = yield Request(
            functools.partial(queue_entries.leave_queue, resource, *entry, token=token)
        )
        if gone is not None and token in gone.holders:
            return gone
        handed = queue_entries.may_be_handed(gone, *entry, token)
    except SemaphoreUnavailable:
        # Our entry may be live still (throttled, say), for the rest of its lease: any
        # release meanwhile hands the lock to it. The late look marks it dead (idempotent:
        # again if the mark did land) and watches for such a hand-over until it is.
        handed = True
        drop = functools.partial(queue_entries.drop_entry, resource, *entry)
    push.depart(
        token,
        functools.partial(give_back_stray, semaphore, token, lease=lease, skew=skew),
        seconds=lease + skew,
        resource=resource if handed else None,
        drop=drop,
    )
    return None


def abandon(
    semaphore: LockSpec, token: str, entry: tuple[int, int], *, lease: float, skew: float
) -> None:
    """A queued waiter interrupted (Ctrl-C, a cancelled task) leaves the queue as one whose
    wait ran out does (:func:`leave_queue`), but nobody is left to use a hand-over that
    reached it meanwhile either: that one is handed on too."""
    kept = run_sync(leave_queue(semaphore, token, entry, lease=lease, skew=skew))
    if kept is not None:
        give_back_stray(semaphore, token, kept, lease=lease, skew=skew)
