"""Signals sent by dynasem about its holds; the sender is always ``dynasem.Semaphore``.

``SIGNALS`` says when each is sent and with which keyword arguments: the signals reference
(docs/reference/signals.md) is generated from it, and tests/project/test_docs_reference.py checks it
against every ``.send(`` in dynasem. A nested acquire (a hold re-entered by the thread or task
that has it) and ``run_once`` jobs send none of them.
"""

from __future__ import annotations

import os
import threading

from django.dispatch import Signal


class _Signal(Signal):
    """Django's ``Signal``, its lock (taken by every send that has receivers, to read them)
    this process's: made anew in a forked child, with or without Python's at-fork hooks
    (Django makes none). The copy a thread of the parent held as it forked stayed held for
    good, and the child's first hold waited on it for ever as it was announced."""

    _lock: threading.Lock
    _lock_pid: int  # the process _lock is of

    @property
    def lock(self) -> threading.Lock:
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    @lock.setter
    def lock(self, made: threading.Lock) -> None:  # Signal.__init__'s
        self._lock, self._lock_pid = made, os.getpid()


lock_acquired = _Signal()
lock_released = _Signal()
lock_busy = _Signal()
lock_lost = _Signal()

_HOLD = {
    "resource": "the resource (with several taken together, the first)",
    "user_id": "the holder's recorded user: a Django user's primary key, the `user=` str, or "
    "this process's identity",
    "token": "the hold's token, unique to this acquisition",
    "fence": "the hold's fence on `resource`, larger than every earlier holder's",
}

# name: (when it is sent, {keyword argument: what it is}).
SIGNALS: dict[str, tuple[str, dict[str, str]]] = {
    "lock_acquired": (
        "Sent when a new hold has been taken, before the acquire returns it. A receiver that "
        "raises makes the acquire give the hold back at once and raise that exception.",
        {**_HOLD, "fences": "every resource taken, mapped to its fence (a dict)"},
    ),
    "lock_released": (
        "Sent when a hold has been given back: at the end of its block or by `release()` "
        "(inside `transaction.atomic`, once the transaction has ended). Also when an operator "
        "broke a hold (`dynasem_release`, the admin): a receiver's exception is then logged, "
        "not raised, as the break is made; so it is at the end of a block (or a decorated "
        "call) that raised, whose own exception goes on. Not sent for a hold found lost: that "
        "sends "
        "`lock_lost`.",
        {
            **_HOLD,
            "user_id": _HOLD["user_id"] + " (`None` if an operator broke a hold of an unknown "
            "user)",
            "fence": _HOLD["fence"] + " (`None` if an operator broke a hold of an unknown fence)",
            "broken": "`True`, passed only when an operator broke the hold",
        },
    ),
    "lock_busy": (
        "Sent when an acquire gives up, the lock still busy when its wait ran out: just before "
        "`SemaphoreBusy` is raised (which a decorated view answers with 423). With "
        "`coalesce=True`, sent when the first attempt, which does not wait, finds the lock "
        "busy: the call may still get it as the next run (once per call: not again if that "
        "wait runs out too).",
        {
            "resource": "the resource that was busy (with several, the first in the way)",
            "user_id": "the user recorded for the acquire that gave up",
            "token": "the token that acquire would have held with",
            "fence": "always `None`: nothing was taken",
            "holder_user_id": "as on `SemaphoreBusy`: the holder's recorded user, or `None`",
            "retry_after": "as on `SemaphoreBusy`: whole seconds (>= 1) before a retry has a "
            "chance",
            "queue_position": "as on `SemaphoreBusy`: the acquire's place in the queue (1 = "
            "next), or `None`",
            "estimated_wait": "as on `SemaphoreBusy`: seconds (a float) until its turn would "
            "likely have come",
        },
    ),
    "lock_lost": (
        "Sent when a hold is found not to be ours any more: a renewal or release was refused "
        "(another holder took it over, or an operator broke it), its lease ran out before it "
        "could be renewed, or `max_hold` passed. Sent once per hold, possibly from the "
        "heartbeat's thread; found lost by async code on its event loop's thread (`held.lost` "
        "read past the deadline), from a thread of dynasem's executor, a receiver's exception "
        "logged.",
        {
            **_HOLD,
            "reason": "why, in words (the `reason` of the `LockLost` raised)",
            "pending_commit": "`True` when its block had ended but its transaction had not: "
            "that transaction's work may still commit after another holder took over",
        },
    ),
}
