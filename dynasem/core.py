"""The lock logic: take, renew and give back holds; fences; waiting.

Speaks in lock terms only; every request is built and sent by :mod:`dynasem.table`.

Safety rules kept here:

* a holder trusts its lease until ``sent + lease - CLOCK_SKEW`` on its own monotonic clock
  (``sent`` = when the write that set the lease left), others take it over only once the
  stored end is ``CLOCK_SKEW`` in the past on theirs;
* a hold we only heard of (a read, a push, a refused write's old item showing our token) is
  worth no more than its stored lease end minus ``CLOCK_SKEW`` (a push: nor more than its
  arrival plus our lease): when that is near, we confirm it with a renewal of our own before
  returning it, and no hold is returned whose deadline, read from the clock at the return,
  has passed: the process may have been paused anywhere on the way;
* fences are microseconds of wall time plus ``CLOCK_SKEW``, written only if larger than the
  stored fence (else the stored fence + 1): strictly increasing per resource, and still so
  after the row was reaped, as long as clocks agree within ``CLOCK_SKEW``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from numbers import Real
from typing import Any

from . import table, wakeup
from .conf import settings
from .exceptions import LockLost, SemaphoreBusy, SemaphoreUnavailable
from .signals import lock_acquired, lock_busy, lock_lost, lock_released

logger = logging.getLogger("dynasem")

# The clocks, as module attributes so tests can shift one process's wall clock.
wall_clock: Callable[[], float] = time.time
monotonic: Callable[[], float] = time.monotonic

MAX_RESOURCE_BYTES = 1024
MAX_LEASE = 7 * 24 * 3600.0
MODE_EXCLUSIVE, MODE_COUNTING, MODE_SHARED = "x", "n", "s"

# Backoff of a waiting acquire: first sleep, cap (seconds); full jitter in between.
BACKOFF_FIRST = 0.02
BACKOFF_CAP = 0.5
# Immediate re-tries when a refusal shows room we had not seen (not a busy wait).
MAX_REPLANS = 25
# How long after joining a resource's queue our next acquire of it joins the queue first.
GUESS_BUSY_FOR = 10.0
# Resources this process recently queued for (monotonic time), for that guess.
_queued_recently: dict[str, float] = {}
# Resources whose hand-overs recently reached us by push (monotonic time): while they do, a
# queued waiter reads only as a fallback, after PUSH_PATIENCE seconds without one.
_pushed_recently: dict[str, float] = {}
PUSH_PATIENCE = 0.5
# A plain release of a hold older than this (seconds) asks for the item back, to push the
# first of any waiters that queued after we last saw the queue.
WAKE_AFTER = 0.05
MAX_REMEMBERED = 4096
# Re-tries of a write that failed in transit, however short the wait.
MIN_TRANSIENT_RETRIES = 2
# A hold we only heard of is confirmed by a renewal of our own when less than this share of
# its trusted window (lease - CLOCK_SKEW) is left: the heartbeat would renew that soon anyway.
CONFIRM_SHARE = 1 / 3


def now_ms() -> int:
    return int(wall_clock() * 1000)


def _new_fence(skew: float) -> int:
    return int((wall_clock() + skew) * 1_000_000)


# ---------------------------------------------------------------------------------------------
# Argument checking: everything is refused before any request is sent
# ---------------------------------------------------------------------------------------------


def check_resource(resource: Any, name: str = "resource") -> str:
    if not isinstance(resource, str):
        raise TypeError(f"{name} must be a str, not {type(resource).__name__}: {resource!r}")
    if not resource:
        raise ValueError(f"{name} must be a non-empty str")
    size = len(resource.encode("utf-8"))
    if size > MAX_RESOURCE_BYTES:
        raise ValueError(
            f"{name} is {size} UTF-8 bytes; at most {MAX_RESOURCE_BYTES} are allowed: "
            f"{resource[:40]!r}..."
        )
    return resource


def check_resources(resource: Any) -> list[str]:
    if isinstance(resource, list | tuple):
        if not resource:
            raise ValueError("resource must not be an empty list")
        names = [check_resource(r, f"resource[{i}]") for i, r in enumerate(resource)]
        if len(set(names)) != len(names):
            raise ValueError(f"resource lists a resource twice: {names!r}")
        if len(names) > table.MAX_TRANSACTION:
            raise ValueError(
                f"resource lists {len(names)} resources; at most {table.MAX_TRANSACTION} "
                "can be taken atomically (one DynamoDB transaction)"
            )
        return names
    return [check_resource(resource)]


def _check_seconds(value: Any, name: str, *, allow_zero: bool, allow_inf: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a number of seconds, not {type(value).__name__}: {value!r}"
        )
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be a number of seconds, not NaN")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{name} must be finite, not {value}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, not {value}")
    return value


def check_lease(value: Any, name: str = "lease") -> float:
    lease = _check_seconds(value, name, allow_zero=False, allow_inf=False)
    if lease > MAX_LEASE:
        raise ValueError(f"{name} must be at most {MAX_LEASE:g} seconds (7 days), not {lease:g}")
    return lease


def check_wait(value: Any, name: str = "wait") -> float:
    return _check_seconds(value, name, allow_zero=True, allow_inf=True)


def check_skew(value: Any, name: str = "CLOCK_SKEW") -> float:
    return _check_seconds(value, name, allow_zero=True, allow_inf=False)


def check_limit(limit: Any, shared: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int >= 1, not {type(limit).__name__}: {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be True or False, not {shared!r}")
    if shared and limit > 1:
        raise ValueError(f"shared=True cannot be combined with limit={limit}: use one or the other")
    return limit


def user_id_of(user: Any) -> str:
    """What is recorded as the holder: a user's primary key, a given str, or this process."""
    if user is None:
        return table.process_identity()
    if isinstance(user, str):
        if not user:
            raise ValueError("user must be a non-empty str, a Django user or None")
        if len(user.encode()) > MAX_RESOURCE_BYTES:
            raise ValueError(f"user is longer than {MAX_RESOURCE_BYTES} UTF-8 bytes")
        return user
    authenticated = getattr(user, "is_authenticated", None)
    if authenticated is None:
        raise TypeError(f"user must be a Django user, a str or None, not {type(user).__name__}")
    if not authenticated or getattr(user, "pk", None) is None:
        return table.process_identity()
    return str(user.pk)


def resolve_timing(lease: float | None, wait: float | None) -> tuple[float, float, float]:
    """Lease, wait and skew in seconds: explicit arguments, else the live settings."""
    skew = check_skew(settings.CLOCK_SKEW)
    lease_s = check_lease(settings.LEASE, "DYNASEM['LEASE']") if lease is None else lease
    wait_s = check_wait(settings.WAIT, "DYNASEM['WAIT']") if wait is None else wait
    if lease_s <= skew:
        raise ValueError(
            f"lease ({lease_s:g}s) must be longer than DYNASEM['CLOCK_SKEW'] ({skew:g}s): a "
            "holder trusts its lease only until lease - CLOCK_SKEW has passed"
        )
    return lease_s, wait_s, skew


# ---------------------------------------------------------------------------------------------
# Reading the state a refused write returned
# ---------------------------------------------------------------------------------------------


def _live_holders(item: dict[str, Any] | None, stale_ms: int) -> dict[str, dict[str, Any]]:
    holders = (item or {}).get("holders") or {}
    return {t: h for t, h in holders.items() if int(h.get("e", 0)) >= stale_ms}


class _Plan:
    """What to send for one resource next, from what we last saw of it."""

    def __init__(
        self,
        action: dict[str, Any] | None = None,
        *,
        busy: dict[str, dict[str, Any]] | None = None,
        fence: int = 0,
        expires_ms: int = 0,
        queued: bool = False,
    ):
        self.action = action  # None with busy None: the resource is ours already
        self.busy = busy  # the live holders in our way, when we cannot take it now
        self.fence = fence
        self.expires_ms = expires_ms
        self.queued = queued  # we are in the resource's queue


class Semaphore:
    """A distributed semaphore on DynamoDB: a context manager, async context manager and view
    decorator. Build it with :func:`semaphore`."""

    def __init__(
        self,
        resource: Any,
        *,
        limit: int = 1,
        shared: bool = False,
        user: Any = None,
        lease: float | None = None,
        wait: float | None = None,
        on_busy: Callable[..., Any] | None = None,
        fair: bool | None = None,
    ):
        self._template = resource if callable(resource) else None
        self.resources: list[str] = [] if callable(resource) else check_resources(resource)
        self.limit = check_limit(limit, shared)
        self.shared = shared
        self.user = user
        if user is not None:
            user_id_of(user)  # type check now, not at the first request
        self.lease = None if lease is None else check_lease(lease)
        self.wait = None if wait is None else check_wait(wait)
        if on_busy is not None and not callable(on_busy):
            raise TypeError(f"on_busy must be callable(request, exc), not {on_busy!r}")
        self.on_busy = on_busy
        self._raw_resource = resource
        if fair is not None and not isinstance(fair, bool):
            raise TypeError(f"fair must be True, False or None (the setting), not {fair!r}")
        if fair and isinstance(resource, list | tuple) and len(resource) > 1:
            raise ValueError(
                "fair=True takes one resource: waiting in several queues at once could deadlock"
            )
        self._fair = fair

    @property
    def fair(self) -> bool:
        if self._fair is not None:
            return self._fair
        if len(self.resources) > 1:
            return False
        return bool(settings.FAIR)

    # -- derived -----------------------------------------------------------------------------

    @property
    def resource(self) -> str:
        return self.resources[0]

    @property
    def mode(self) -> str:
        if self.shared:
            return MODE_SHARED
        return MODE_EXCLUSIVE if self.limit == 1 else MODE_COUNTING

    def _check_usable(self) -> None:
        if self._template is not None:
            raise TypeError(
                "a callable resource only works when the semaphore decorates a view; "
                "pass a str (or a list of str) to use it as a context manager"
            )

    def __repr__(self) -> str:
        return f"<Semaphore {self._raw_resource!r} limit={self.limit} shared={self.shared}>"

    # -- planning ----------------------------------------------------------------------------

    def _plan(
        self,
        resource: str,
        seen: dict[str, Any] | None,
        token: str,
        entry: dict[str, Any],
        stale_ms: int,
        confirm_below_ms: int,
    ) -> _Plan:
        mode, limit = self.mode, self.limit
        holders = (seen or {}).get("holders") or {}
        if token in holders:
            # Ours already: handed to us, or a write of ours was applied but its response was
            # lost. Trusted only until its stored lease end (less the skew): when that is
            # near, or the caller says so, confirm it with a renewal of our own first.
            mine = holders[token]
            ours = _Plan(fence=int(mine["f"]), expires_ms=int(mine["e"]))
            if ours.expires_ms < confirm_below_ms:
                item_ms = int((seen or {}).get("expMs") or 0)
                ours.action = table.renew_hold(
                    resource, token, entry["e"], raise_item=item_ms <= entry["e"]
                )
                ours.expires_ms = entry["e"]
            return ours
        stored_fence = int((seen or {}).get("fence") or 0)
        if stored_fence >= entry["f"]:
            entry = dict(entry, f=stored_fence + 1)  # our clock is behind: count on instead
        done = _Plan(fence=entry["f"], expires_ms=entry["e"])
        # Nobody cuts in line: a taker not in the queue needs it empty (dead waiters aside),
        # a queued one needs every live waiter ahead of it gone.
        queue = (seen or {}).get("queue") or {}
        mine = queue.get(token)
        waiting = {t: w for t, w in queue.items() if t != token}
        dead = {t: int(w["e"]) for t, w in waiting.items() if int(w["e"]) < stale_ms}
        ahead = {
            t: w
            for t, w in waiting.items()
            if t not in dead and (mine is None or int(w["t"]) < int(mine["t"]))
        }
        live = _live_holders(seen, stale_ms)
        if ahead:
            return _Plan(busy=live or ahead, queued=mine is not None)
        terms = table.QueueTerms(
            queued=mine is not None,
            evict=dead,
            size=None if seen is None or "queue" not in seen or mine else len(queue),
        )
        done.queued = mine is not None
        if seen is None and mode != MODE_EXCLUSIVE:
            # Counting and shared holds usually find others holding: try to join at once.
            done.action = table.take_room(resource, token, entry, mode=mode, limit=limit)
            return done
        if not holders or int(seen.get("expMs") or 0) < stale_ms:  # type: ignore[union-attr]
            done.action = table.take_free(
                resource, token, entry, mode=mode, limit=limit, stale_ms=stale_ms, queue=terms
            )
            return done
        if live:
            seen_limit = int(seen.get("limit") or 1)  # type: ignore[union-attr]
            if seen_limit != limit:
                raise ValueError(
                    f"{resource!r} is held with limit={seen_limit}; every holder of one "
                    f"resource must use the same limit, not limit={limit}"
                )
            joinable = mode != MODE_EXCLUSIVE and seen.get("mode") == mode  # type: ignore[union-attr]
            if not (joinable and (mode == MODE_SHARED or len(live) < limit)):
                return _Plan(busy=live, queued=mine is not None)
        done.action = table.take_join(
            resource,
            token,
            entry,
            mode=mode,
            limit=limit,
            seen=seen,  # type: ignore[arg-type]
            evict=[t for t in holders if t not in live],
            replace=not live,
            queue=terms,
        )
        return done

    # -- acquiring ---------------------------------------------------------------------------

    def _acquire_steps(self) -> Generator[Any, Any, Held]:
        """The acquire loop as a generator: it yields a callable to run (a request) or a float
        to sleep, so one loop serves the sync and the async driver."""
        self._check_usable()
        lease, wait, skew = resolve_timing(self.lease, self.wait)
        margin = (lease - skew) * CONFIRM_SHARE
        user_id = user_id_of(self.user)
        token = uuid.uuid4().hex  # one token for every retry: it recognises our own writes
        resources = self.resources
        deadline = monotonic() + wait
        seen: dict[str, dict[str, Any] | None] = {}
        sleeps = replans = failures = 0
        pace = _Pace()  # a queued waiter's timing: request round trip, looks found too early
        confirm = False  # a hold of ours we saw must be renewed before it is returned
        # Busy last time we looked, a short while ago? Then most likely busy now: join the
        # queue in our first write (it is refused if the lock is free, and we take it then).
        guess_busy = (
            len(resources) == 1
            and self.mode == MODE_EXCLUSIVE
            and wait > 0
            and monotonic() - _queued_recently.get(resources[0], -math.inf) < GUESS_BUSY_FOR
        )
        try:
            while True:
                if guess_busy:
                    guess_busy = False
                    seen[resources[0]] = yield from self._wait_in_queue(
                        resources[0],
                        None,
                        token,
                        user_id,
                        lease,
                        skew,
                        False,
                        deadline - monotonic(),
                        pace,
                        if_busy_ms=now_ms() - int(skew * 1000),
                    )
                    continue
                push_cap, pace.push_cap = pace.push_cap, None  # the state came by push
                sent_mono = monotonic()
                now = now_ms()
                stale = now - int(skew * 1000)
                entry = table.holder_entry(
                    user_id, now + int(lease * 1000), _new_fence(skew), now, self.shared
                )
                if confirm or (push_cap is not None and push_cap - sent_mono < margin):
                    confirm_below = 2**63
                else:
                    confirm_below = now + int((skew + margin) * 1000)
                plans = {
                    r: self._plan(r, seen.get(r), token, entry, stale, confirm_below)
                    for r in resources
                }
                blocked = {r: p.busy for r, p in plans.items() if p.busy is not None}
                if not blocked:
                    acting = [r for r in resources if plans[r].action is not None]
                    if not acting:
                        held = self._held_if_trusted(
                            token, user_id, plans, lease, skew, None, seen, push_cap
                        )
                        if held is not None:
                            return held
                        confirm = True  # paused on the way: renew it before it is returned
                        replans += 1
                        if replans <= MAX_REPLANS:
                            continue
                        yield lambda: self._withdraw(token, resources)
                        raise _too_slow(self.resource, lease, skew)
                    actions = [plans[r].action for r in acting]
                    try:
                        if len(actions) == 1:
                            after = yield _Write(
                                lambda a=actions[0]: table.update(a, return_new=True),
                                self,
                                token,
                                acting,
                            )
                        else:  # all or none
                            yield _Write(lambda a=actions: table.transact(a), self, token, acting)
                    except table.Refused as refused:
                        seen[acting[0]] = refused.old or {}
                    except table.Cancelled as cancelled:
                        conflict = True
                        for r, (code, old) in zip(acting, cancelled.reasons, strict=False):
                            if code == "ConditionalCheckFailed":
                                seen[r] = old or {}
                                conflict = False
                        if conflict:
                            # Another transaction was on these items: step aside briefly.
                            yield random.uniform(0.002, 0.02)
                    except SemaphoreUnavailable as exc:
                        failures += 1
                        # An ambiguous failure (5xx, timeout) may hide an applied write: the same
                        # write again (same token) is refused by our own hold, which tells us so.
                        # Give it a few tries even past the wait budget, then withdraw what may be
                        # ours. A throttled or unconnected request was never applied.
                        ambiguous = getattr(exc, "ambiguous", False)
                        out_of_time = monotonic() >= deadline and (
                            not ambiguous or failures > MIN_TRANSIENT_RETRIES
                        )
                        if not getattr(exc, "transient", False) or out_of_time:
                            if ambiguous:
                                yield lambda a=acting: self._withdraw(token, a)
                            raise
                        yield min(_backoff(failures), max(0.05, deadline - monotonic()))
                        continue
                    else:
                        if len(resources) == 1:
                            seen[resources[0]] = after
                            if not pace.enqueued:  # taken at once: free, this time
                                _queued_recently.pop(resources[0], None)
                        held = self._held_if_trusted(
                            token, user_id, plans, lease, skew, sent_mono, seen, None
                        )
                        if held is not None:
                            return held
                        # Our write landed, but its lease can no longer be trusted (we were
                        # paused, or it took that long): renew it before it is returned.
                        confirm = True
                        replans += 1
                        if replans <= MAX_REPLANS:
                            continue
                        yield lambda a=acting: self._withdraw(token, a)
                        raise _too_slow(self.resource, lease, skew)
                    replans += 1
                    if replans <= MAX_REPLANS:
                        continue  # the refusal told us the state: plan again from it at once
                    blocked = {r: {} for r in resources}
                # Busy: wait within the budget (never much past the first lease end), look again.
                remaining = deadline - monotonic()
                queued = (
                    len(resources) == 1
                    and plans.get(resources[0]) is not None
                    and any(p.queued for p in plans.values())
                )
                if remaining <= 0:
                    if queued or pace.enqueued:
                        # Leave the queue; a hand-over that reached us meanwhile is ours to keep.
                        try:
                            yield lambda: table.update(table.dequeue(resources[0], token))
                        except table.Refused as refused:
                            if token in ((refused.old or {}).get("holders") or {}):
                                seen[resources[0]] = refused.old
                                continue
                        except SemaphoreUnavailable:
                            pass  # our entry expires with its lease
                    raise self._busy(blocked, skew, user_id, token)
                if len(resources) == 1 and (queued or self._should_queue(seen.get(resources[0]))):
                    seen[resources[0]] = yield from self._wait_in_queue(
                        resources[0],
                        seen.get(resources[0]),
                        token,
                        user_id,
                        lease,
                        skew,
                        queued,
                        remaining,
                        pace,
                    )
                    replans = 0
                    continue
                sleeps += 1
                until_free = _seconds_until_free(blocked, skew)
                yield max(0.0, min(_backoff(sleeps), until_free + 0.005, remaining))
                replans = 0
                for r in blocked:
                    old = seen.get(r) or {}
                    if (
                        old.get("mode") in (MODE_COUNTING, MODE_SHARED)
                        and len(_live_holders(old, now_ms() - int(skew * 1000))) > 1
                    ):
                        # Some of several holders are surely still there: read which, cheaply.
                        try:
                            seen[r] = yield lambda r=r: table.get(r)
                        except SemaphoreUnavailable:
                            seen[r] = None
                    else:
                        # Guess it free (one write tells us otherwise), keeping the fence we saw.
                        seen[r] = {"fence": old["fence"]} if old.get("fence") else None
        finally:
            wakeup.forget(token)  # a push that comes now is for a wait that is over

    def _should_queue(self, seen: dict[str, Any] | None) -> bool:
        """Queue up (rather than poll with backoff) when fair, when others already do, or as
        a writer behind readers: new readers then queue behind us, so writers never starve."""
        seen = seen or {}
        exclusive = self.mode == MODE_EXCLUSIVE
        writer_behind_readers = exclusive and seen.get("mode") == MODE_SHARED
        if self.fair or bool(seen.get("queue")) or writer_behind_readers:
            return True
        # A waiter that can be pushed the hand-over queues too: the releasing holder then
        # hands it the lock in its release write and tells it at once, which beats polling
        # on both requests and idle time.
        return (
            exclusive and seen.get("mode", MODE_EXCLUSIVE) == MODE_EXCLUSIVE and wakeup.available()
        )

    def _wait_in_queue(
        self,
        resource: str,
        seen: dict[str, Any] | None,
        token: str,
        user_id: str,
        lease: float,
        skew: float,
        queued: bool,
        remaining: float,
        pace: _Pace,
        if_busy_ms: int | None = None,
    ) -> Generator[Any, Any, dict[str, Any] | None]:
        """Join the queue (once), then sleep toward our likely turn and look again: with a
        cheap read, or by renewing our place when its lease is half gone. Returns the state.

        ``if_busy_ms``: join only if someone holds it (a lease ending at or after this) or
        waits; otherwise the refusal's old item is returned, to take it from."""
        now = now_ms()
        if not queued:
            stored = int((seen or {}).get("ticket") or 0)
            waiter = {
                "t": max(_new_fence(0), stored + 1),
                "e": now + int(lease * 1000),
                "u": user_id,
                "s": self.shared,
                "l": int(lease * 1000),
            }
            address = wakeup.expect(resource, token, lease=lease, skew=skew, now_ms=now_ms)
            if address is not None:
                waiter["n"] = address  # where the holder that hands us the lock tells us
            fresh = seen is not None and "queue" not in seen
            pace.enqueued = True  # from now on, giving up means leaving the queue
            for attempt in range(1, 4):
                try:
                    after = yield _InQueue(
                        lambda f=fresh: table.update(
                            table.enqueue(resource, token, waiter, fresh=f, if_busy_ms=if_busy_ms),
                            return_new=True,
                        ),
                        self,
                        token,
                        resource,
                        write=True,
                    )
                    if len(_queued_recently) >= MAX_REMEMBERED:
                        _queued_recently.clear()
                        _pushed_recently.clear()
                    _queued_recently[resource] = monotonic()
                    return after
                except table.Refused as refused:
                    old = refused.old or {}
                    if token in (old.get("queue") or {}):
                        return old  # our own enqueue, its response lost
                    if if_busy_ms is not None:
                        return old  # free, most likely: plan from what it is
                    fresh = "queue" not in old
                    waiter["t"] = max(waiter["t"], int(old.get("ticket") or 0) + 1)
                except SemaphoreUnavailable as exc:
                    # In transit: maybe applied (then the same write is refused by our own
                    # entry, which tells us so), maybe not. The caller looks again.
                    if not getattr(exc, "transient", False):
                        raise
                    yield min(_backoff(attempt), max(0.001, remaining))
            return seen
        mine = ((seen or {}).get("queue") or {}).get(token) or {}
        nap = max(0.001, min(pace.turn_in(seen, token, skew), remaining))
        if mine.get("n"):
            if (
                not self.shared
                and monotonic() - _pushed_recently.get(resource, -math.inf) < GUESS_BUSY_FOR
            ):
                # Hand-overs of this resource reached us by push lately: a read before the
                # next one would most likely find nothing new. Look only as a fallback.
                nap = max(nap, min(PUSH_PATIENCE, pace.until_free, remaining))
            last_fence = int((seen or {}).get("fence") or 0)
            pushed = yield _InQueue(
                lambda: wakeup.wait(token, nap, fence_above=last_fence), self, token, resource
            )
            if pushed is not None:
                _pushed_recently[resource] = monotonic()
                # Handed the lock (or told it is free): the item as written. A hand-over is
                # worth no more than its arrival plus our own lease.
                pace.push_cap = pushed.arrived + lease - skew
                return pushed.item
        else:
            yield nap
        sent = monotonic()
        if int(mine.get("e", 0)) - now_ms() < lease * 500:
            try:
                return (
                    yield lambda: table.update(
                        table.renew_waiter(resource, token, now_ms() + int(lease * 1000)),
                        return_new=True,
                    )
                )
            except table.Refused as refused:
                return refused.old  # no longer queued: handed the lock, or evicted
        item = yield lambda: table.get(resource)
        pace.answered(monotonic() - sent)
        return item

    def _withdraw(self, token: str, resources: list[str]) -> None:
        """Best effort: release whatever an unanswered write of ours may have taken."""
        for resource in resources:
            try:
                table.update(table.give_back(resource, token, now_ms(), sole=False))
            except (table.Refused, SemaphoreUnavailable):
                pass

    def _busy(
        self, blocked: dict[str, dict[str, Any]], skew: float, user_id: str, token: str
    ) -> SemaphoreBusy:
        resource = next(iter(blocked))
        holders = blocked[resource]
        first = min(holders.values(), key=lambda h: int(h.get("e", 0)), default=None)
        retry_after = math.ceil(_seconds_until_free(blocked, skew)) if holders else 1
        exc = SemaphoreBusy(resource, retry_after, first.get("u") if first else None)
        lock_busy.send(
            sender=Semaphore,
            resource=resource,
            user_id=user_id,
            token=token,
            fence=None,
            holder_user_id=exc.holder_user_id,
            retry_after=exc.retry_after,
        )
        return exc

    def _held_if_trusted(
        self,
        token: str,
        user_id: str,
        plans: dict[str, _Plan],
        lease: float,
        skew: float,
        sent_mono: float | None,
        seen: dict[str, dict[str, Any] | None],
        push_cap: float | None,
    ) -> Held | None:
        """The hold, if its trusted deadline (read now) is still ahead; else None.

        ``sent_mono``: when the write that took (or renewed) the resources with an action
        left; the others we only saw to be ours, and trust until their stored lease end less
        the skew (a pushed one: nor past ``push_cap``)."""
        mono, now = monotonic(), now_ms()
        ends = [sent_mono + lease - skew] if sent_mono is not None else []
        for plan in plans.values():
            if sent_mono is None or plan.action is None:
                ends.append(mono + (plan.expires_ms - now) / 1000 - skew)
        if push_cap is not None:
            ends.append(push_cap)
        deadline = min(ends)
        if deadline <= mono:
            return None
        return self._held(token, user_id, plans, lease, skew, deadline, seen)

    def _held(
        self,
        token: str,
        user_id: str,
        plans: dict[str, _Plan],
        lease: float,
        skew: float,
        deadline: float,
        seen: dict[str, dict[str, Any] | None],
    ) -> Held:
        expires_ms = min(p.expires_ms for p in plans.values())
        held = Held(
            self,
            token=token,
            user_id=user_id,
            fences={r: p.fence for r, p in plans.items()},
            lease=lease,
            skew=skew,
            expires_ms=expires_ms,
            sent_mono=deadline - lease + skew,
        )
        if len(self.resources) == 1 and seen:
            held._observe(seen.get(self.resources[0]))
            if self.mode == MODE_SHARED:
                held._wake_next_reader(seen.get(self.resources[0]))
        lock_acquired.send(
            sender=Semaphore,
            resource=held.resource,
            user_id=user_id,
            token=token,
            fence=held.fence,
            fences=held.fences,
        )
        held._start_heartbeat()
        return held

    def acquire(self) -> Held:
        """Take the semaphore (waiting up to ``wait``) and return the :class:`Held` hold."""
        return _run_sync(self._acquire_steps())

    async def aacquire(self) -> Held:
        """``acquire()`` for async code: requests run in a thread, waits are ``asyncio.sleep``."""
        return await _run_async(self._acquire_steps())

    # -- context managers --------------------------------------------------------------------

    def __enter__(self) -> Held:
        held = self.acquire()
        _push(self, held)
        return held

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _exit(_pop(self), exc_type is not None)

    async def __aenter__(self) -> Held:
        held = await self.aacquire()
        _push(self, held)
        return held

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        held = _pop(self)
        await asyncio.to_thread(_exit, held, exc_type is not None)

    # -- decorator ---------------------------------------------------------------------------

    def __call__(self, view: Callable[..., Any]) -> Callable[..., Any]:
        from .decorators import lock_view

        return lock_view(self, view)

    def with_resource(self, resource: str, user: Any) -> Semaphore:
        """A copy for one call of a decorated view: the formatted key and the request's user."""
        return Semaphore(
            resource,
            limit=self.limit,
            shared=self.shared,
            user=user,
            lease=self.lease,
            wait=self.wait,
            on_busy=self.on_busy,
            fair=self._fair,
        )


class _Pace:
    """When a queued waiter looks again. A turn comes every hold time plus the hand-over's own
    requests (the release write, then our read that sees it), so the waiter sleeps toward the
    time the holder ahead should be done. A look that finds nothing moved (same holders, same
    waiters ahead) doubles the next pause: a late holder, or a dead waiter ahead of us
    blocking a free lock until its entry expires, costs a few reads, not a read every hold
    time."""

    def __init__(self) -> None:
        self.rtt = 0.005  # seconds; an average of our own reads' round trips
        self.early = 0  # looks in a row that found nothing moved
        self.state: Any = None
        self.until_free = 1.0  # seconds until the first holder (or waiter) ahead lapses
        self.enqueued = False  # an enqueue of ours was sent (it may have been applied)
        # The last state came by push: a hold it hands us is trusted no later than this.
        self.push_cap: float | None = None

    def answered(self, seconds: float) -> None:
        self.rtt = (3 * self.rtt + min(seconds, 0.5)) / 4

    def turn_in(self, seen: dict[str, Any] | None, token: str, skew: float) -> float:
        seen = seen or {}
        now = now_ms()
        queue = seen.get("queue") or {}
        mine = queue.get(token)
        stale = now - int(skew * 1000)
        ahead = {
            t: w
            for t, w in queue.items()
            if t != token and int(w["e"]) >= stale and (mine is None or w["t"] < mine["t"])
        }
        live = _live_holders(seen, stale)
        state = (tuple(sorted(live)), tuple(sorted(ahead)))
        if state != self.state:
            self.state, self.early = state, 0
        else:
            self.early += 1
        rtt_ms = self.rtt * 1000
        hold = max(2.0, float(seen.get("holdMs") or 20))
        start = max((int(h.get("a", now)) for h in live.values()), default=now)
        # The holder's release lands about one round trip after its hold; every waiter ahead
        # of us then takes a hold plus two round trips (that release, its own read).
        turn = (start + hold + rtt_ms + (hold + 2 * rtt_ms) * len(ahead) - now) / 1000
        step = max(0.002, self.rtt)
        if live:
            # Until the first holder could be taken over (its lease end + skew). Overdue:
            # back off from a round trip, doubling while nothing moves, at most 64 round
            # trips (a hand-over after a long hold is still seen within a fraction of it).
            first_end = min(int(h["e"]) for h in live.values())
            if turn <= 0:
                turn = step * 2 ** min(self.early, 6)
        else:
            # Nobody holds, yet a waiter ahead has not taken its turn: if nothing moved since
            # our last look it is most likely dead; look again ever later, up to a second,
            # until its entry can be evicted.
            first = min(ahead.values(), key=lambda w: int(w["t"]), default=None)
            first_end = int(first["e"]) if first else now
            if self.early:
                turn = max(turn, step * 2 ** min(self.early, 10))
        until_free = (first_end + skew * 1000 - now) / 1000 + 0.001
        self.until_free = max(0.001, until_free)
        return max(0.001, min(turn, until_free, 1.0))


def _too_slow(resource: str, lease: float, skew: float) -> SemaphoreUnavailable:
    err = SemaphoreUnavailable(
        f"could not take {resource!r}: every hold we got had run out of its lease "
        f"({lease:g}s, less CLOCK_SKEW {skew:g}s) by the time it could be returned; this "
        "process is paused or starved for longer than the lease"
    )
    err.transient = True  # type: ignore[attr-defined]
    return err


def _backoff(attempt: int) -> float:
    cap = min(BACKOFF_CAP, BACKOFF_FIRST * (2 ** min(attempt - 1, 16)))
    return random.uniform(cap / 2, cap)


def _seconds_until_free(blocked: dict[str, dict[str, Any]], skew: float) -> float:
    """Until the first holder in the way could be taken over (its lease end + skew)."""
    ends = [int(h.get("e", 0)) for holders in blocked.values() for h in holders.values()]
    if not ends:
        return BACKOFF_CAP
    return max(0.0, (min(ends) + skew * 1000 - now_ms()) / 1000)


def _run_sync(steps: Generator[Any, Any, Any]) -> Any:
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value
        result, error = None, None
        if callable(step):
            try:
                result = step()
            except Exception as exc:  # handed back to the loop, which decides
                error = exc
        elif step:
            time.sleep(step)


class _InQueue:
    """A step of a queued wait: if its caller is cancelled, the queue entry must go (or a
    releasing holder would hand the lock to a waiter nobody is left to use)."""

    def __init__(
        self,
        fn: Callable[[], Any],
        sem: Semaphore,
        token: str,
        resource: str,
        *,
        write: bool = False,
    ):
        self.fn, self.sem, self.token, self.resource = fn, sem, token, resource
        self.write = write  # the enqueue itself (a wait for a push is not)

    def __call__(self) -> Any:
        return self.fn()

    def abandon(self) -> None:
        try:
            table.update(table.dequeue(self.resource, self.token))
        except table.Refused as refused:
            if self.token in ((refused.old or {}).get("holders") or {}):
                self.sem._withdraw(self.token, [self.resource])  # handed to us meanwhile
        except SemaphoreUnavailable:
            pass  # the entry expires with its lease


class _Write:
    """An acquire write, with what to withdraw if its caller is cancelled meanwhile."""

    def __init__(self, send: Callable[[], Any], sem: Semaphore, token: str, resources: list):
        self.send, self.sem, self.token, self.resources = send, sem, token, resources

    def __call__(self) -> Any:
        return self.send()


async def _run_async(steps: Generator[Any, Any, Any]) -> Any:
    result: Any = None
    error: BaseException | None = None
    queued: _InQueue | None = None  # we may be in a resource's queue
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value
        result, error = None, None
        if isinstance(step, _InQueue):
            queued = step
        try:
            if callable(step):
                request = asyncio.ensure_future(asyncio.to_thread(step))
                try:
                    result = await asyncio.shield(request)
                except asyncio.CancelledError:
                    if isinstance(step, _Write) or getattr(step, "write", False):
                        await asyncio.wait([request])  # it goes on in its thread: let it end
                    if isinstance(step, _Write):
                        # The write may have landed: give back whatever it took, or the
                        # hold would sit there for a whole lease.
                        await asyncio.to_thread(step.sem._withdraw, step.token, step.resources)
                    raise
                except Exception as exc:
                    error = exc
            elif step:
                await asyncio.sleep(step)
        except asyncio.CancelledError:
            if queued is not None:
                await asyncio.to_thread(queued.abandon)
            raise


# The holds entered through ``with``/``async with``, per thread and per task.
_entered: ContextVar[tuple[tuple[int, Held], ...]] = ContextVar("dynasem_entered", default=())


def _push(sem: Semaphore, held: Held) -> None:
    _entered.set(_entered.get() + ((id(sem), held),))


def _pop(sem: Semaphore) -> Held:
    stack = _entered.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] == id(sem):
            _entered.set(stack[:i] + stack[i + 1 :])
            return stack[i][1]
    raise RuntimeError("semaphore exited without a matching enter")


def _exit(held: Held, raised: bool) -> None:
    try:
        held.release()
    except LockLost:
        if not raised:
            raise
        # The block's own exception goes on; the loss is logged and was signalled.
        logger.warning("dynasem: hold on %r was lost while its block raised", held.resource)


class Held:
    """One acquisition: what was recorded, its fence(s), and ways to renew or release it."""

    def __init__(
        self,
        semaphore: Semaphore,
        *,
        token: str,
        user_id: str,
        fences: dict[str, int],
        lease: float,
        skew: float,
        expires_ms: int,
        sent_mono: float,
    ):
        self.semaphore = semaphore
        self.resources = list(semaphore.resources)
        self.token = token
        self.user_id = user_id
        self.fences = fences
        self.lease = lease
        self.skew = skew
        self._expires_ms = expires_ms
        self._deadline = sent_mono + lease - skew
        self._lock = threading.RLock()  # serialises renew/release requests
        self._state_lock = threading.Lock()  # guards _lost only: never held across a request
        self._lost: str | None = None
        self._released = False
        self._heartbeat: Any = None
        self._taken_mono = monotonic()
        self._queue: dict[str, Any] = {}  # the waiters we last saw: the hand-over's heirs
        self._hold_avg: int | None = None

    def _observe(self, item: dict[str, Any] | None) -> None:
        if item:
            self._queue = dict(item.get("queue") or {})
            if item.get("holdMs") is not None:
                self._hold_avg = int(item["holdMs"])

    def _hold_ms(self) -> int:
        mine = int((monotonic() - self._taken_mono) * 1000)
        return mine if self._hold_avg is None else (3 * self._hold_avg + mine) // 4

    def _heir(self) -> tuple[str, dict[str, Any]] | None:
        """The first live waiter we know of, if the hold is exclusive."""
        if self.semaphore.mode != MODE_EXCLUSIVE or len(self.resources) != 1:
            return None
        now = now_ms()
        live = [(int(w["t"]), t, w) for t, w in self._queue.items() if int(w.get("e", 0)) > now]
        if not live:
            return None
        _, heir, waiter = min(live)
        return heir, waiter

    # -- what users read ---------------------------------------------------------------------

    @property
    def resource(self) -> str:
        return self.resources[0]

    @property
    def fence(self) -> int:
        return self.fences[self.resource]

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self._expires_ms / 1000, tz=UTC)

    @property
    def lost(self) -> bool:
        """True once the hold is known not to be ours any more (or its lease ran out)."""
        self._check_deadline()
        return self._lost is not None

    @property
    def released(self) -> bool:
        return self._released

    def seconds_left(self) -> float:
        """How long we may still trust the hold without renewing (our clock, skew allowed)."""
        return max(0.0, self._deadline - monotonic())

    def __repr__(self) -> str:
        return f"<Held {self.resources!r} fence={self.fence} user={self.user_id!r}>"

    # -- renewing ----------------------------------------------------------------------------

    def _check_deadline(self) -> None:
        if self._lost is None and not self._released and monotonic() >= self._deadline:
            self._mark_lost("its lease ran out before it could be renewed")

    def _mark_lost(self, reason: str) -> None:
        with self._state_lock:
            if self._lost is not None:
                return
            self._lost = reason
        self._stop_heartbeat()
        logger.warning("dynasem: lost the hold on %r: %s", self.resource, reason)
        lock_lost.send(
            sender=Semaphore,
            resource=self.resource,
            user_id=self.user_id,
            token=self.token,
            fence=self.fence,
            reason=reason,
        )

    def _raise_lost(self) -> None:
        raise LockLost(self.resource, self._lost or "unknown")

    def renew(self) -> None:
        """Extend the lease now (the heartbeat does this by itself while the hold lives)."""
        # A renewal of the heartbeat's may hang on an unreachable endpoint, holding the lock,
        # for as long as botocore's timeouts allow: wait for it only while the hold can be
        # trusted. Past the deadline the hold is lost, whatever that renewal answers later.
        while not self._lock.acquire(timeout=self.seconds_left()):
            self._check_deadline()
            if self._released:
                raise LockLost(self.resource, "it was released")
            if self._lost is not None:
                self._raise_lost()
        try:
            self._check_deadline()
            if self._released:
                raise LockLost(self.resource, "it was released")
            if self._lost is not None:
                self._raise_lost()
            self._renew_once()
        finally:
            self._lock.release()

    async def arenew(self) -> None:
        await asyncio.to_thread(self.renew)

    def _renew_once(self) -> None:
        sent_mono = monotonic()
        expires = now_ms() + int(self.lease * 1000)
        raise_item = {r: True for r in self.resources}
        for _ in range(4):
            actions = [
                table.renew_hold(r, self.token, expires, raise_item=raise_item[r])
                for r in self.resources
            ]
            try:
                if len(actions) == 1:
                    self._observe(table.update(actions[0], return_new=True))
                else:
                    table.transact(actions)
            except table.Refused as refused:
                if not self._still_ours(self.resources[0], refused.old, raise_item):
                    break
            except table.Cancelled as cancelled:
                reasons = zip(self.resources, cancelled.reasons, strict=False)
                if any(
                    code == "ConditionalCheckFailed" and not self._still_ours(r, old, raise_item)
                    for r, (code, old) in reasons
                ):
                    break
            else:
                self._expires_ms = expires
                self._deadline = max(self._deadline, sent_mono + self.lease - self.skew)
                return
        else:
            err = SemaphoreUnavailable(f"could not renew {self.resource!r}: conflicting writes")
            err.transient = True  # type: ignore[attr-defined]
            raise err
        self._mark_lost("another holder took it over, or it was broken by an operator")
        self._raise_lost()

    def _still_ours(self, resource: str, old: dict[str, Any] | None, raise_item: dict) -> bool:
        if self.token in ((old or {}).get("holders") or {}):
            # Ours still; another holder's later lease end stands as the item's expiry.
            raise_item[resource] = False
            return True
        return False

    # -- releasing ---------------------------------------------------------------------------

    def release(self) -> None:
        """Give back this acquisition's hold only. Raises :class:`LockLost` if it was not ours
        any more (after cleaning up whatever is still ours)."""
        with self._lock:
            if self._released:
                return
            self._released = True
            self._stop_heartbeat()
            lost_before = self._lost is not None or monotonic() >= self._deadline
            ok = self._give_back()
            if not ok and self._lost is None:
                self._mark_lost("another holder took it over, or it was broken by an operator")
            if lost_before and self._lost is None:
                self._mark_lost("its lease ran out before it could be renewed")
            if self._lost is not None:
                self._raise_lost()
        lock_released.send(
            sender=Semaphore,
            resource=self.resource,
            user_id=self.user_id,
            token=self.token,
            fence=self.fence,
        )

    async def arelease(self) -> None:
        await asyncio.to_thread(self.release)

    def _hand_over(self) -> bool | None:
        """Release straight to the first waiter (one write). None: no heir, or it left."""
        heir = self._heir()
        if heir is None or self._lost is not None:
            return None
        token, waiter = heir
        now = now_ms()
        fence = max(_new_fence(self.skew), self.fence + 1)
        entry = table.holder_entry(
            str(waiter.get("u", "")),
            now + int(waiter.get("l", self.lease * 1000)),
            fence,
            now,
            bool(waiter.get("s", False)),
        )
        try:
            item = table.update(
                table.hand_over(
                    self.resource,
                    self.token,
                    token,
                    int(waiter["t"]),
                    entry,
                    hold_ms=self._hold_ms(),
                ),
                return_new=True,
            )
        except table.Refused as refused:
            old = refused.old or {}
            if self.token in (old.get("holders") or {}):
                self._observe(old)  # the heir left (or our fence was behind): plain release
                return None
            return self._released_by(old, refused.retried)
        except SemaphoreUnavailable:
            return None
        if waiter.get("n") and item:
            wakeup.push(waiter["n"], self.resource, token, item, sent_ms=now_ms())
        return True

    def _give_back(self) -> bool:
        """Send the release; True if every resource was ours until now."""
        handed = self._hand_over()
        if handed is not None:
            return handed
        sole = self.semaphore.mode == MODE_EXCLUSIVE
        pending = list(self.resources)
        ok = True
        hold_ms = self._hold_ms() if len(pending) == 1 else None
        for _ in range(3):
            now = now_ms()
            # A released row may be reaped once its expMs is CLOCK_SKEW old: never before
            # every in-tolerance clock reads past our fence's time, or a fresh fence made after
            # the reap could be smaller than ours.
            actions = [
                table.give_back(
                    r, self.token, max(now, self.fences[r] // 1000), sole=sole, hold_ms=hold_ms
                )
                for r in pending
            ]
            try:
                if len(actions) == 1:
                    # Only a hold long enough for waiters to have come unseen asks for the
                    # item back (its decoding costs the uncontended path ~10 % of its CPU).
                    look = bool(self._queue) or monotonic() - self._taken_mono > WAKE_AFTER
                    self._wake_first(table.update(actions[0], return_new=look))
                else:
                    table.transact(actions)
                return ok
            except table.Refused as refused:
                return ok and self._released_by(refused.old, refused.retried)
            except table.Cancelled as cancelled:
                # Nothing was applied: drop the ones not ours any more and send the rest again.
                still = []
                for r, (code, old) in zip(pending, cancelled.reasons, strict=False):
                    if code != "ConditionalCheckFailed":
                        still.append(r)
                    elif not self._released_by(old, cancelled.retried):
                        ok = False
                pending = still
                if not pending:
                    return ok
            except SemaphoreUnavailable as exc:
                # The work is done and the lease will lapse by itself: never fail the caller
                # for a release DynamoDB could not take.
                logger.warning("dynasem: could not release %r (%s); it expires", pending, exc)
                return ok
        return ok

    def _wake_first(self, item: dict[str, Any] | None) -> None:
        """After a plain release: if waiters are queued (ones we did not know of when we
        could have handed over), push the first one the item, so it takes the lock now
        instead of at its next paced read."""
        queue = (item or {}).get("queue") or {}
        if not queue or (item or {}).get("holders"):
            return
        now = now_ms()
        live = [(int(w["t"]), t, w) for t, w in queue.items() if int(w.get("e", 0)) > now]
        if live:
            _, first, waiter = min(live)
            if waiter.get("n"):
                wakeup.push(waiter["n"], self.resource, first, item, sent_ms=now_ms())

    def _wake_next_reader(self, item: dict[str, Any] | None) -> None:
        """A shared hold just taken: if the first waiter in line is a reader too, it can join
        us now; push it the item (it then pushes the next one when it has joined)."""
        queue = (item or {}).get("queue") or {}
        now = now_ms()
        live = [(int(w["t"]), t, w) for t, w in queue.items() if int(w.get("e", 0)) > now]
        if live:
            _, first, waiter = min(live)
            if waiter.get("s") and waiter.get("n"):
                wakeup.push(  # type: ignore[arg-type]
                    waiter["n"], self.resource, first, item, sent_ms=now_ms()
                )

    def _released_by(self, old: dict[str, Any] | None, retried: bool) -> bool:
        """Was a refused release ours after all (applied, its response lost)?"""
        old = old or {}
        if self.token in (old.get("holders") or {}):
            return False
        if old.get("lastToken") == self.token:
            return True
        # Someone may have taken and released it between botocore's attempts, overwriting
        # lastToken. Without a retry nothing of ours was applied; with one, the token is gone
        # by our own release unless an operator broke it or our lease can have run out.
        return retried and old.get("brokenToken") != self.token and monotonic() < self._deadline

    # -- heartbeat ---------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        from .heartbeat import Heartbeat

        self._heartbeat = Heartbeat(self)
        self._heartbeat.start()

    def _stop_heartbeat(self) -> None:
        hb, self._heartbeat = self._heartbeat, None
        if hb is not None:
            hb.stop()


def semaphore(
    resource: str | Sequence[str] | Callable[..., str],
    *,
    limit: int = 1,
    shared: bool = False,
    user: Any = None,
    lease: float | None = None,
    wait: float | None = None,
    on_busy: Callable[..., Any] | None = None,
    fair: bool | None = None,
) -> Semaphore:
    """A distributed semaphore on ``resource``: ``with``, ``async with``, ``.acquire()``, or
    ``@semaphore("key:{arg}")`` on a view. See API.md for every argument."""
    return Semaphore(
        resource,
        limit=limit,
        shared=shared,
        user=user,
        lease=lease,
        wait=wait,
        on_busy=on_busy,
        fair=fair,
    )
