"""Deliberate one-line protocol mutations, applied for the duration of a run
(``Options.mutation``): the simulator must find each within a small seed budget, or it
proves nothing about the real code. Each is a change a reviewer could miss:

* ``no_skew_in_trust``: a holder trusts its hold until ``sent + lease``, not
  ``sent + lease - CLOCK_SKEW`` (hold.Held's deadline, at the take and at each renewal);
* ``take_ignores_lease``: a take of a "free" row no longer requires the holders' leases to
  be over (lock_writes.take_free's first condition dropped);
* ``take_ignores_fence``: a take no longer requires its fence to be above the stored one
  (lock_writes.take_free's fence condition dropped);
* ``trust_from_answer``: a take's hold is trusted from when its answer came, not from when
  the write left (core: ``sent_mono`` read after the write);
* ``renewal_ignores_refusal``: a refused renewal (the hold is another's) is taken as done;
* ``renew_without_token``: a renewal's condition no longer names our token;
* ``takeover_waits_a_lease``: a dead holder is taken over a whole lease later than it may
  be (liveness, not safety: the lock idles while waiters wait).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import pytest

FREE = "(attribute_not_exists(#h) OR size(#h) = :zero OR #expMs < :stale)"
FENCE = "(attribute_not_exists(#fence) OR #fence < :fence)"
TOKEN = "attribute_exists(#h.#t)"


def drop_condition(action: dict[str, Any], clause: str) -> dict[str, Any]:
    """``action`` without one clause of its condition (and the values only it used)."""
    parts = [p for p in action["ConditionExpression"].split(" AND ") if p != clause]
    assert len(parts) < len(action["ConditionExpression"].split(" AND ")), clause
    if parts:
        action["ConditionExpression"] = " AND ".join(parts)
    else:
        del action["ConditionExpression"]
    used = " ".join(text for key, text in action.items() if key.endswith("Expression"))
    placeholders = set(re.findall(r":\w+", used))
    values = action.get("ExpressionAttributeValues", {})
    action["ExpressionAttributeValues"] = {k: v for k, v in values.items() if k in placeholders}
    names = set(re.findall(r"#\w+", used))
    if "ExpressionAttributeNames" in action:
        kept = {k: v for k, v in action["ExpressionAttributeNames"].items() if k in names}
        action["ExpressionAttributeNames"] = kept
    return action


def _dropping(builder: Callable[..., dict[str, Any]], clause: str) -> Callable[..., Any]:
    @functools.wraps(builder)
    def mutated(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return drop_condition(builder(*args, **kwargs), clause)

    return mutated


def no_skew_in_trust(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import hold

    init, renew_once = hold.Held.__init__, hold.Held._renew_once

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._deadline = min(self._deadline + self.skew, self._max_hold_end)

    def _renew_once(self: Any) -> None:
        before = self._deadline
        renew_once(self)
        if self._deadline != before:
            self._deadline = min(self._deadline + self.skew, self._max_hold_end)

    mp.setattr(hold.Held, "__init__", __init__)
    mp.setattr(hold.Held, "_renew_once", _renew_once)


def take_ignores_lease(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import lock_writes

    mp.setattr(lock_writes, "take_free", _dropping(lock_writes.take_free, FREE))


def take_ignores_fence(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import lock_writes

    mp.setattr(lock_writes, "take_free", _dropping(lock_writes.take_free, FENCE))


def renew_without_token(mp: pytest.MonkeyPatch) -> None:
    from dynasem._storage import lock_writes

    mp.setattr(lock_writes, "renew_hold", _dropping(lock_writes.renew_hold, TOKEN))


def trust_from_answer(mp: pytest.MonkeyPatch) -> None:
    from dynasem import _clock
    from dynasem._engine import take

    trusted = take.held_if_trusted

    def held_if_trusted(*args: Any, sent_mono: float | None, **kwargs: Any) -> Any:
        if sent_mono is not None:
            sent_mono = _clock.monotonic()  # the answer's arrival, not the send
        return trusted(*args, sent_mono=sent_mono, **kwargs)

    mp.setattr(take, "held_if_trusted", held_if_trusted)


def renewal_ignores_refusal(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import hold
    from dynasem.exceptions import LockLost

    renew_to = hold.Held._renew_to

    def _renew_to(self: Any, expires: int) -> None:
        try:
            renew_to(self, expires)
        except LockLost:
            self._lost = None  # refused: "renewed" all the same

    mp.setattr(hold.Held, "_renew_to", _renew_to)


def takeover_waits_a_lease(mp: pytest.MonkeyPatch) -> None:
    from dynasem._engine import lockspec

    def stale_ms(self: Any, now_ms: int) -> int:
        return now_ms - int((self.skew + self.lease) * 1000)

    mp.setattr(lockspec.Attempt, "stale_ms", stale_ms)


MUTATIONS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    f.__name__: f
    for f in (
        no_skew_in_trust,
        take_ignores_lease,
        take_ignores_fence,
        trust_from_answer,
        renewal_ignores_refusal,
        renew_without_token,
        takeover_waits_a_lease,
    )
}
