"""Hand-over pushes: a releasing holder tells the waiter it handed the lock to, at once.

DynamoDB cannot tell a waiter that its turn came; without help a queued waiter learns it only
by reading the item, and so either reads often (requests) or late (idle lock). A waiter that
has a push address (one UDP socket per process, opened on its first wait) records it in its
queue entry; the holder that hands the lock over in its release write sends the item that
write produced, signed, to that address. The waiter then holds the lock as if it had read the
item itself: no request, no idle gap beyond the release write's round trip.

A push is only ever a shortcut. It carries what DynamoDB answered to the hand-over write,
the table's name and the send time, signed with an HMAC of the project's ``SECRET_KEY`` (any
of ``SECRET_KEY_FALLBACKS`` is accepted too, so a key rotation does not silently turn pushes
into reads), addressed to one waiter's token (so a replay is for a wait that is over). A lost
or unsendable push costs the waiter one of its paced reads, nothing else.

A push is never trusted further than it can be: a hand-over it claims is worth at most the
lease end in the item and the send time plus the waiter's own lease, its fence must be above
the last one the waiter saw, and a push that can no longer grant anything (the waiter was
paused past it) is dropped on arrival and again when the waiter takes it. The waiter's own
lock logic then checks the deadline once more before a block runs (see ``core``).

``DYNASEM["PUSH"]``: the IPv4 address to listen on and advertise. The default,
``"127.0.0.1"``, reaches processes on the same host (a releaser elsewhere sees the loopback
address and does not send); set the host's private address to push across hosts, or ``None``
for no pushes. A releaser sends only to IPv4 literals that are neither unspecified nor
broadcast/multicast, and never resolves a name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from django.conf import settings as django_settings

from .. import _clock as clock
from .._observability.logs import facts
from .._storage import lock_rows, records
from ..conf import settings
from . import heartbeat

logger = logging.getLogger("dynasem")

MAX_DATAGRAM = 60_000  # bytes: a queue too long to push is read instead
# A synchronous waiter reads the push socket itself while it waits (see _Listener); tests
# turn it off to have the listener thread deliver. CLAIM_WAIT: how long (s) it waits for the
# listener thread to step aside before it lets it deliver instead.
READ_OWN = True
CLAIM_WAIT = 0.05
# A waiter of this process is handed its push directly, not by datagram (see push; tests of
# the datagram path turn it off to send datagrams to themselves).
IN_PROCESS = True
# The words of waiters queued behind a hold (hold.queued_behind -> Held.heard_of) and where
# they go: this process's live holds that hand over (exclusive, one resource: hold.Held), by
# token (ended ones too, while they live); the last heir this process handed each resource
# to, and its push address; the heir each hold of ours handed over to (a word that comes late
# follows it); words for heirs of ours not holding yet (woken by a push, still waking up),
# heard as they register; and words for holds that ended before their hand-over was done.
holds: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
handed_to: dict[str, tuple[str, str]] = {}
passed_on: dict[str, str] = {}
_early: dict[str, list[tuple[str, records.LockItem, records.Waiter, float]]] = {}
_late: dict[str, list[tuple[str, records.LockItem, records.Waiter, float]]] = {}
_words_lock = threading.Lock()
MAX_WORDS = 4096
WORD_HOPS = 3  # hand-overs a word follows (here, or by datagram) before it is dropped
_SALT = b"dynasem.hand-over-push"

_lock = threading.Lock()
_listener: _Listener | None = None
_failed_bind: str | None = None  # the address we could not listen on (not tried again)
# Why a socket cannot be had for a moment (open-files limits, kernel memory): tried again,
# as a thread that could not start (a pids limit) is, LISTEN_RETRY (s) later (monotonic).
_SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
LISTEN_RETRY = 5.0
_short_until = -float("inf")
_pid = os.getpid()  # the process _lock and _words_lock are of


def _here() -> None:
    """Replace what this process's parent left in a child forked by C code that runs none
    of Python's at-fork hooks (a uWSGI worker, unless ``py-call-osafterfork``): its module
    locks, which a thread of the parent may have held as it forked (that thread did not come
    along: the child's first wait, its listener opened, or first hold, registered for words,
    waited on it for ever), and its listener."""
    if _pid != os.getpid():
        _after_fork()


def _words() -> threading.Lock:
    """``_words_lock``, this process's (:func:`_here`)."""
    _here()
    return _words_lock


def _host_id() -> str:
    """Which machine (network namespace, roughly) we are: loopback pushes stay on it."""
    boot = ""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return hashlib.sha256(f"{socket.gethostname()}|{boot}".encode()).hexdigest()[:12]


HOST_ID = _host_id()


def _derive(secret: Any) -> bytes:
    return hashlib.sha256(_SALT + str(secret).encode()).digest()


def _keys(*, fallbacks: bool = False) -> list[bytes]:
    """The keys a push may be signed with: ``SECRET_KEY``, then ``SECRET_KEY_FALLBACKS`` (a
    process that has not yet seen a rotation still signs with the old key); without
    ``fallbacks``, the key pushes are signed with, if any."""
    secrets = [getattr(django_settings, "SECRET_KEY", "") or ""]
    if fallbacks:
        secrets += list(getattr(django_settings, "SECRET_KEY_FALLBACKS", None) or ())
    return [_derive(s) for s in secrets if s]


def _sign(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


# MAC failures are logged at WARNING at most once per this many seconds (with a count).
MAC_WARNING_EVERY = 60.0
_mac_failures = 0
_mac_warned_at = -float("inf")


def _bad_mac() -> None:
    global _mac_failures, _mac_warned_at
    _mac_failures += 1
    now = time.monotonic()
    if now - _mac_warned_at < MAC_WARNING_EVERY:
        return
    count, _mac_failures, _mac_warned_at = _mac_failures, 0, now
    logger.warning(
        "dynasem: dropped %d hand-over push(es) whose signature matches neither SECRET_KEY nor "
        "SECRET_KEY_FALLBACKS. Most likely the processes sharing this table run with different "
        "SECRET_KEY values (a rotation half rolled out: keep the old key in "
        "SECRET_KEY_FALLBACKS), or something else sends datagrams to this port. Waiters fall "
        "back to reading the lock, which costs requests and latency, not correctness.",
        count,
        extra=facts(outcome="push_dropped", reason="bad signature", count=count),
    )


def _dropped(level: int, slot: _Slot, reason: str, message: str, *args: Any, **more: Any) -> None:
    """Log that a push for ``slot``'s waiter was dropped, and why (``reason``)."""
    extra = facts(slot.resource, token=slot.token, outcome="push_dropped", reason=reason, **more)
    logger.log(level, message, *args, extra=extra, stacklevel=2)  # where it was dropped


class Push(NamedTuple):
    """A hand-over (or a "free now") that reached a waiter: the item as written, when it
    arrived on our monotonic clock, and the sender's wall-clock send time (ms)."""

    item: records.LockItem
    arrived: float
    sent_ms: int
    # The waiters after us as the releaser read them, and how old that read was when it sent
    # this (seconds, its own clock): see handover.heirs_of.
    line: tuple[records.Waiter, ...] = ()
    line_age: float = 0.0


def _state(item: records.LockItem) -> tuple[int, int]:
    """How far on a row is: its fence (every take draws a larger one), then its queue."""
    return item.fence, item.queue_out


@dataclasses.dataclass(slots=True, eq=False)
class _Slot:
    """One waiter's mailbox: what it may be told, and what it was. Once its waiter left the
    queue without the lock (:func:`depart`), a hand-over that still reaches it, until
    ``until`` (monotonic: later, a hold handed to it has run out by itself), is given back,
    once, by whichever finds it first: its push, or the late look (:meth:`beat`, run by the
    heartbeat's scheduler)."""

    resource: str
    token: str
    table: str
    # What a push is judged by (see expect): unset for a waiter that never listened.
    lease_ms: int = 0
    skew_ms: int = 0
    now_ms: Callable[[], int] = int
    # The event and the guard come from the module's ``threading`` when a slot is made, not
    # from the class bound at import: the simulation (tests/support/sim) replaces it.
    event: threading.Event = dataclasses.field(default_factory=lambda: threading.Event())
    push: Push | None = None
    # A coroutine awaiting the push (resolves the future it awaits, on its loop), or a thread
    # reading the socket for it (nudges it: see _Listener.read_for).
    waker: Callable[[], object] | None = None
    # All of the slot changes together, under it.
    guard: threading.Lock = dataclasses.field(default_factory=lambda: threading.Lock())
    left: bool = False  # its waiter left the queue (see depart)
    give_back: Callable[[records.LockItem], object] | None = None
    until: float = 0.0
    stopped: bool = False  # given back already: the late look has nothing to do
    # Marks the waiter's entry dead, when its leave could not (throttled, say): the late look
    # sends it again until it is applied (a live entry is handed the lock at any release).
    drop: Callable[[], None] | None = None
    drops_failed: int = 0  # in a row: each look comes twice as late (up to DROP_PAUSE_CAP)
    looks_failed: int = 0  # reads of the row that failed, in a row: the same
    name: str = "dynasem-late-look"

    @property
    def held(self) -> _Slot:
        """What the scheduler's records about the late look name: its resource and token."""
        return self

    def __repr__(self) -> str:  # what the scheduler's logs name it by
        return f"<late look at {self.resource!r} for {self.token[:8]}>"

    def deliver(self, push: Push) -> bool:
        """Hand ``push`` to the waiter; False if it has left (see :func:`depart`). Of two
        pushes not yet taken, the waiter gets the later state of the row (a larger fence, or
        the queue further on), whichever arrived last: two holders releasing at once push
        the same waiter, and the older state, arriving second, must not hide the newer."""
        with self.guard:
            if self.left:
                return False
            if self.push is None or _state(push.item) >= _state(self.push.item):
                self.push = push
            self.event.set()
            waker, self.waker = self.waker, None
        if waker is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
                waker()
        return True

    def taken(self, fence_above: int) -> Push | None:
        """The push that woke the waiter, if it may still be taken: a hand-over only if its
        fence is above ``fence_above`` (the last fence the waiter saw)."""
        with self.guard:
            self.event.clear()
            pushed, self.push = self.push, None
        if pushed is None:
            return None
        holder = pushed.item.holders.get(self.token)
        if holder is not None and holder.fence <= fence_above:
            _dropped(
                logging.WARNING,
                self,
                "stale fence",
                "dynasem: dropped a push for %r: its fence %s is not above the last one we saw "
                "(%s)",
                self.resource,
                holder.fence,
                fence_above,
                fence=holder.fence,
                fence_seen=fence_above,
            )
            return None
        if self.refused(pushed.item, pushed.sent_ms, "when taken"):
            return None
        return pushed

    def refused(self, item: records.LockItem, sent_ms: Any, when: str) -> bool:
        """Whether this waiter must not take ``item``, sent at ``sent_ms``, now; if so, the log
        says why (a warning for a wrong claim; information for a push we were too slow for)."""
        now = self.now_ms()
        holder = item.holders.get(self.token)
        if not isinstance(sent_ms, int) or sent_ms > now + self.skew_ms + 1000:
            reason = f"its send time {sent_ms!r} is ahead of our clock by more than CLOCK_SKEW"
            loud = True
        elif holder is None:
            # Only news that the lock is free (or readers may join): taking it is a
            # conditional write of our own. Old news is dropped, not trusted.
            if now - sent_ms <= self.lease_ms + self.skew_ms:
                return False
            reason, loud = "it is older than a lease", False
        elif holder.expires_ms > sent_ms + self.lease_ms + self.skew_ms:
            reason = (
                f"it claims a lease to {holder.expires_ms}, longer than our own lease from its "
                f"send time {sent_ms}"
            )
            loud = True
        elif min(holder.expires_ms, sent_ms + self.lease_ms) - self.skew_ms > now:
            return False
        else:
            reason, loud = "the hold it hands us has run out (we were paused or slow)", False
        level = logging.WARNING if loud else logging.INFO
        message = "dynasem: dropped a push for %r %s: %s"
        _dropped(level, self, reason, message, self.resource, when, reason)
        return True

    def stray(self, item: records.LockItem) -> None:
        """A hand-over ``item`` for a waiter that left: if it made it a holder, give it back
        (on a thread of its own: the listener never waits on a request). Best effort: this
        runs inside the releaser's push when the waiter is of its own process, and a thread
        that cannot start (a pids limit) must not fail that release; the late look (when the
        row said a hand-over may land) or the lease hands it on then."""
        if clock.monotonic() <= self.until and self.token in item.holders:
            try:
                threading.Thread(
                    target=self.hand_back, args=(item,), name="dynasem-stray", daemon=True
                ).start()
            except RuntimeError as exc:  # "can't start new thread"
                message = "dynasem: could not give back %r, handed to a waiter that had left: %s"
                self._failed(message, "give_back_failed", exc)

    def _failed(self, message: str, outcome: str, exc: Exception) -> None:
        """Log a failure (``exc``) of what this departed waiter's hand-overs need, as
        ``outcome``: ``message`` names the resource, then the error."""
        extra = facts(self.resource, token=self.token, outcome=outcome, reason=exc)
        logger.warning(message, self.resource, exc, extra=extra, stacklevel=2)  # where it failed

    def hand_back(self, item: records.LockItem) -> bool:
        """Give back the hold ``item`` shows ours, once; False if that failed (throttled past
        the release's patience, say): the late look, if it is still to come, tries again."""
        with self.guard:
            if self.stopped or self.give_back is None:
                return True
            self.stopped = True
        if self.give_back(item) is not False:
            return True
        with self.guard:
            self.stopped = False
        return False

    def beat(self) -> float | None:
        """The late look: read the departed waiter's row and hand back a hold of its token
        found there. Given back already (a push came), or another table (settings changed
        since): nothing to read. Its entry not marked dead yet (``drop``): marked first, and
        looked at again LATE_LOOK later (a releaser may have read the entry live before it
        went), or, the mark failed still, again while a hand-over to it may land: twice as
        late after each failure (an outage, not throttling, which passes within seconds), up
        to DROP_PAUSE_CAP. A look whose read failed (throttled: a key with a line is hot), or
        whose give-back of a hold it found failed, is sent again on the same terms: a hold
        handed to us that it missed would sit with nobody for our lease."""
        if self.stopped or settings.TABLE_NAME != self.table:
            return None
        again = None
        if self.drop is not None:
            try:
                self.drop()
                self.drop = None
                again = LATE_LOOK
            except Exception as exc:
                message = "dynasem: could not mark a left waiter's entry for %r dead: %s"
                self._failed(message, "leave_failed", exc)
                self.drops_failed += 1
                again = self._pause(self.drops_failed)
        if self._look():
            self.looks_failed = 0
        else:
            self.looks_failed += 1
            again = self._pause(self.looks_failed) if again is None else again
        return None if self.stopped else again

    def _pause(self, failures: int) -> float | None:
        """The pause before the next late look after ``failures`` in a row; None once a
        hand-over to us can no longer stand then (``until``)."""
        pause = min(DROP_PAUSE_CAP, LATE_LOOK * 2.0 ** (failures - 1))
        return pause if clock.monotonic() + pause < self.until else None

    def _look(self) -> bool:
        """Read the row, and hand back a hold of ours found there; False if the read, or the
        give-back, failed."""
        try:
            row = lock_rows.get(self.resource)
        except Exception as exc:  # logged here: the scheduler's records speak of renewals
            message = (
                "dynasem: could not look whether %r was handed to a waiter that had left: %s; "
                "it is looked at again while a hand-over to it may stand"
            )
            self._failed(message, "late_look_failed", exc)
            return False
        if row is not None and self.token in row.holders:
            return self.hand_back(row)
        return True


class _Listener:
    """One UDP socket and one daemon thread per process; waiters register by token (and stay
    registered a while after they left the queue: see :func:`depart`).

    A synchronous waiter reads the socket itself while it waits (:meth:`claim`,
    :meth:`read_for`): its push then wakes the very thread that takes the hold, not the
    listener thread that would wake it in turn (a thread hop measured at ~0.3 ms on average
    per hand-over, docs/BENCHMARKS.md). Whoever reads delivers every datagram that comes,
    to whichever waiter or hold it is for; the listener thread steps aside meanwhile."""

    def __init__(self, bind: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((bind, 0))
        except OSError:
            self.sock.close()
            raise
        host, port = self.sock.getsockname()
        self.address = f"{HOST_ID}@{host}:{port}"
        self.bind = bind
        self.slots: dict[str, _Slot] = {}
        self.pid = os.getpid()
        # Who reads the socket: the listener thread (``reading`` while it is in recvfrom),
        # or the waiting thread that claimed it (``claimed``), never both.
        self.turn = threading.Condition()
        self.claimed: threading.Thread | None = None
        self.reading = False
        self.thread = threading.Thread(target=self._run, name="dynasem-push", daemon=True)
        try:
            self.thread.start()
        except RuntimeError:  # "can't start new thread" (a container's pids limit)
            self.sock.close()
            raise

    def _run(self) -> None:
        while True:
            with self.turn:
                while self.claimed is not None:
                    self.turn.wait()
                self.reading = True
            try:
                data, _ = self.sock.recvfrom(65536)
            except TimeoutError:  # a reader's timeout left on the socket: block again
                data = b""
                with contextlib.suppress(OSError):
                    self.sock.settimeout(None)
            except OSError:
                return  # closed
            finally:
                with self.turn:
                    self.reading = False
                    self.turn.notify_all()
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        if not data:
            return  # a claim's nudge (see claim)
        try:
            self._deliver(data)
        except Exception:  # a malformed datagram must not end the listener
            logger.debug(
                "dynasem: dropped an unreadable push",
                exc_info=True,
                extra=facts(outcome="push_dropped", reason="unreadable"),
            )

    def claim(self) -> bool:
        """Take the socket over from the listener thread for this waiting thread; False if
        another thread has it, or the listener did not step aside within :data:`CLAIM_WAIT`
        (its nudge was lost): the waiter is woken as before. Interrupted (a signal's
        exception), it gives the socket back: a claim left behind would keep the listener
        away from it for good, and every push to this process unread."""
        me = threading.current_thread()
        try:
            with self.turn:
                if self.claimed not in (None, me):  # ours: left by an interrupted wait
                    return False
                self.claimed = me
                if self.reading:
                    self.nudge()
                    if not self.turn.wait_for(lambda: not self.reading, CLAIM_WAIT):
                        self.claimed = None
                        return False
        except BaseException:
            self.unclaim()
            raise
        return True

    def unclaim(self) -> None:
        """Give the socket back to the listener thread, if this thread has it."""
        with self.turn:
            if self.claimed is threading.current_thread():
                self.claimed = None
                self.turn.notify_all()

    def nudge(self) -> None:
        """Wake whoever reads the socket: an empty datagram to itself."""
        with contextlib.suppress(OSError):
            self.sock.sendto(b"", self.sock.getsockname())

    def read_for(self, slot: _Slot, seconds: float) -> None:
        """Read and deliver datagrams (claimed) until ``slot``'s push came, or ``seconds``.
        A push handed to it by another thread of this process (:func:`push`) nudges it."""
        me = threading.current_thread()

        def woken() -> None:
            if threading.current_thread() is not me:
                self.nudge()

        deadline = clock.monotonic() + seconds
        with slot.guard:
            slot.waker = woken
        try:
            while not slot.event.is_set():
                left = deadline - clock.monotonic()
                if left <= 0:
                    return
                self.sock.settimeout(left)
                try:
                    data, _ = self.sock.recvfrom(65536)
                except OSError:  # TimeoutError is one
                    return
                self._dispatch(data)
        finally:
            with slot.guard:
                if slot.waker is woken:
                    slot.waker = None
            with contextlib.suppress(OSError):
                self.sock.settimeout(None)  # before the listener reads again

    def _deliver(self, data: bytes) -> None:
        arrived = clock.monotonic()
        mac, body = data[:32], data[32:]
        if not any(hmac.compare_digest(mac, _sign(key, body)) for key in _keys(fallbacks=True)):
            _bad_mac()
            return
        message = json.loads(body)
        if not isinstance(message["i"], dict):
            return
        if "h" in message:
            self._heard(message, arrived)
            return
        line = tuple(records.from_item(records.Waiter, w) for w in message.get("q", ()))
        # The line's age when it was sent, and its time on the way since (by the wall
        # clocks, as a word's: see _heard): a late datagram brings an old line.
        age = max(0, message.get("qa", 0)) / 1000
        if line and isinstance(message["ts"], int):
            age += max(0.0, (clock.now_ms() - message["ts"]) / 1000)
        item = records.lock_item(message["i"])
        pushed = Push(item, arrived, message["ts"], line, age)
        self.take(message["k"], message["r"], message.get("tb"), pushed)

    def _heard(self, message: dict[str, Any], arrived: float) -> None:
        """A waiter of another process queued behind a hold of ours (see :func:`tell`): the
        hold hears of it as from a waiter of its own process, as of when it was sent (by the
        wall clocks; never later than it arrived)."""
        if message["tb"] != settings.TABLE_NAME:
            return
        row = records.lock_item(message["i"])
        waiter = records.from_item(records.Waiter, message["w"])
        age = max(0.0, (clock.now_ms() - message["ts"]) / 1000)
        hops = message.get("hp", WORD_HOPS)
        tell_holder(message["r"], message["h"], row, waiter, arrived - age, local=True, hops=hops)

    def take(self, token: str, resource: str, table: Any, pushed: Push) -> None:
        """A push for the waiter ``token`` that arrived (or was handed over in this process):
        to the waiter, if it may take it; else given back or dropped."""
        slot = self.slots.get(token)
        if pushed.line:
            _line_to_hold(token, resource, pushed)
        if slot is None or slot.resource != resource:
            return
        item = pushed.item
        if slot.left:
            if table == slot.table:
                slot.stray(item)
        elif table != slot.table:
            _dropped(
                logging.WARNING,
                slot,
                "another table",
                "dynasem: dropped a push for table %r on a wait on table %r (two projects "
                "share a SECRET_KEY and push addresses?)",
                table,
                slot.table,
                table=slot.table,
                push_table=table,
            )
        elif not slot.refused(item, pushed.sent_ms, "on arrival"):
            if not slot.deliver(pushed):
                slot.stray(item)


def _line_to_hold(token: str, resource: str, pushed: Push, held: Any = None) -> None:
    """A hand-over's push that came after its heir took the hold on a look of its own: the
    line it carries goes to that hold as words (waiters that told the releaser put their
    entries only later: without it, the hold's release would wait for them)."""
    if held is None:
        with _words():
            held = holds.get(token)
    if held is not None and held.resource == resource:
        sent = pushed.arrived - pushed.line_age
        for waiter in pushed.line:
            held.heard_of(pushed.item, waiter, sent=sent)


def depart(
    token: str,
    give_back: Callable[[records.LockItem], object],
    *,
    seconds: float,
    resource: str | None = None,
    drop: Callable[[], None] | None = None,
) -> None:
    """The waiter ``token`` left its queue without the lock. A hand-over to it may still come
    (its releaser read the queue before it left, or read it eventually consistently and
    still saw its entry): for ``seconds`` (the lease such a hand-over grants), one that comes
    is passed to ``give_back`` (with the item it carries) instead of making a hold that
    nobody uses sit there until its lease runs out. A push that came just before is too.

    ``resource``: the row, read after it left, says such a hand-over may still land
    (:func:`dynasem._storage.queue_entries.may_be_handed`). No push may tell us of it (pushes
    off; a releaser on another host, which cannot reach a loopback address; a datagram lost),
    so the row is
    read once more :data:`LATE_LOOK` seconds on, and a hold found ours is given back too:
    by whichever of the two finds it first. ``drop``: what marks our entry dead, which the
    leave could not send (the late look sends it, again while it fails)."""
    listener = _listener
    slot = listener.slots.get(token) if listener is not None else None
    if slot is None and resource is None:
        return  # no push reaches us, and the row says no hand-over can land
    now = clock.monotonic()
    if listener is not None:
        for old, gone in list(listener.slots.items()):
            if gone.left and gone.until < now:
                listener.slots.pop(old, None)
    made = slot is None  # it did not listen, or stopped (an interrupt that ended its loop)
    if slot is None:
        slot = _Slot(resource or "", token, settings.TABLE_NAME)
    # The slot stays registered, left: whatever the listener thread is doing, a push finds
    # it not left yet (and is taken below) or left (and is handed back).
    with slot.guard:
        slot.left = True
        slot.give_back = give_back
        slot.until = now + seconds
        slot.drop = drop
        pushed, slot.push = slot.push, None
    if made and listener is not None:
        listener.slots[token] = slot  # left already: a push that comes is handed back
    if resource is not None:
        heartbeat.later(slot, LATE_LOOK)
    if pushed is not None:
        slot.stray(pushed.item)


# How long after a waiter left, while a hand-over to it may still land, its process reads the
# row once more (seconds). A releaser reads the line eventually consistently, which on AWS can
# show an entry for about a second after it was deleted, and its hand-over write lands a round
# trip after that read (a throttled one after botocore's pauses, 50 + 100 + 200 ms). A later
# landing (a releaser paused between its read and its write) idles the lock as before: for
# the leaver's lease plus the skew.
LATE_LOOK = 2.0
# The longest pause between two late looks of a waiter whose entry could not be marked dead.
DROP_PAUSE_CAP = 60.0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake(loop: asyncio.AbstractEventLoop, future: weakref.ref[asyncio.Future[None]]) -> None:
    """Resolve the future a coroutine awaits a push with, on its loop. Held weakly: the slot
    (in the listener's table, for good) must not keep alive a task destroyed with its loop
    (closed without cancelling it), or the garbage collector never closes its coroutine,
    whose cleanup leaves the line, and a hand-over to it is held for nobody for its lease."""
    waiting = future()
    if waiting is not None:
        loop.call_soon_threadsafe(_resolve, waiting)


def _get_listener() -> _Listener | None:
    """This process's listener, opened on first use; None when pushes are off or impossible."""
    global _listener, _failed_bind, _short_until
    bind = settings.PUSH
    _here()
    with _lock:
        if _listener is not None and _listener.pid == os.getpid() and _listener.bind == bind:
            return _listener  # ours (not a forked parent's), on this address
        # Off; or it failed; or the system check dynasem.E010 says why; or nothing to sign with.
        if not bind or _failed_bind == bind or push_address_problem(bind) or not _keys():
            return None
        if clock.monotonic() < _short_until:
            return None  # short of sockets or threads a moment ago
        try:
            _listener = _Listener(bind)
        except (OSError, RuntimeError) as exc:
            # A bind that failed is not tried again; a socket or a thread this process could
            # not have for a moment (its open-files or pids limit) is, at a later wait.
            # Meanwhile waiters read, as without pushes.
            if isinstance(exc, OSError) and exc.errno not in _SHORT_OF:
                _failed_bind = bind
            else:
                _short_until = clock.monotonic() + LISTEN_RETRY
            logger.warning(
                "dynasem: cannot listen for hand-over pushes on %s: %s",
                bind,
                exc,
                extra=facts(outcome="listen_failed", reason=exc, address=bind),
            )
            return None
        return _listener


def available() -> bool:
    """Can this process take pushes (listening, or able to start)?"""
    return _get_listener() is not None


def loopback_only() -> bool:
    """Whether our pushes come only from this host (we listen on a loopback address)."""
    return str(settings.PUSH).startswith("127.")


def expect(
    resource: str, token: str, *, lease: float, skew: float, now_ms: Callable[[], int]
) -> str | None:
    """Register a waiter; returns the address to record in its queue entry (or None).

    ``lease``: the waiter's own lease (a hand-over grants it at most that); ``skew``: the
    CLOCK_SKEW it allows for; ``now_ms``: its wall clock, in milliseconds."""
    listener = _get_listener()
    if listener is None:
        return None
    listener.slots[token] = _Slot(
        resource, token, settings.TABLE_NAME, int(lease * 1000), int(skew * 1000), now_ms
    )
    return listener.address


def _slot(token: str) -> _Slot | None:
    """The mailbox of the waiter ``token``, while it waits (not once it left the queue)."""
    listener = _listener
    slot = listener.slots.get(token) if listener is not None else None
    return None if slot is None or slot.left else slot


def is_ours(address: Any) -> bool:
    """Whether ``address`` is where this very process listens."""
    listener = _listener
    return listener is not None and address == listener.address and listener.pid == os.getpid()


def listening(token: str) -> bool:
    """Whether a push for ``token`` would reach this process (see :func:`expect`)."""
    return _slot(token) is not None


def wait(token: str, seconds: float, *, fence_above: int = 0) -> Push | None:
    """Sleep up to ``seconds`` or until a push for ``token`` arrives; the push, or None.

    A hand-over is taken only if its fence is above ``fence_above`` (the last fence the waiter
    saw) and it can still grant something now; anything else is dropped (and the waiter reads
    instead)."""
    slot = _slot(token)
    if slot is None:
        threading.Event().wait(seconds)
        return None
    listener = _listener if READ_OWN else None
    own = False
    if listener is not None:
        try:  # claimed inside: an interrupt anywhere in the claim gives it back
            own = listener.claim()
            if own:
                listener.read_for(slot, seconds)
        finally:
            listener.unclaim()
    if own:
        if not slot.event.is_set():
            return None
    elif not slot.event.wait(seconds):
        return None
    return slot.taken(fence_above)


async def await_push(token: str, seconds: float, *, fence_above: int = 0) -> Push | None:
    """:func:`wait` for a coroutine: it waits on its event loop, holding no thread (the
    listener thread resolves a future of that loop when the push comes; a future left behind
    by a wait that timed out is resolved to no effect, or replaced by the next wait's)."""
    slot = _slot(token)
    if slot is None:
        await asyncio.sleep(seconds)
        return None
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    with slot.guard:
        if slot.event.is_set():
            future.set_result(None)  # it came already
        else:
            slot.waker = functools.partial(_wake, loop, weakref.ref(future))
    try:
        await asyncio.wait_for(future, seconds)
    except TimeoutError:
        return None
    return slot.taken(fence_above)


def forget(token: str) -> None:
    """The wait of ``token`` is over: a push for it is dropped (unless it left the queue, see
    :func:`depart`: then the push is given back)."""
    listener = _listener
    if listener is not None and _slot(token) is not None:
        listener.slots.pop(token, None)


def push_address_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a push address (listened on, recorded, sent to), or None."""
    if not isinstance(value, str):
        return f"it is a {type(value).__name__}, not a str"
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        return "it is not an IPv4 literal (names are never resolved)"
    if address.is_unspecified:
        return "0.0.0.0 is no address a releaser can send to"
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        return "it is a broadcast or multicast address"
    return None


def reachable(address: Any) -> tuple[str, int] | None:
    """Where to send a push for a waiter that recorded ``address``; None if we cannot reach it
    (or will not: only IPv4 literals that are no broadcast, multicast or unspecified address;
    names are never resolved)."""
    if not isinstance(address, str) or "@" not in address:
        return None
    host_id, _, hostport = address.partition("@")
    host, _, port = hostport.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536 or push_address_problem(host):
        return None
    if host.startswith("127.") and host_id != HOST_ID:
        return None  # another machine's loopback
    return host, int(port)


def push(
    address: Any,
    resource: str,
    token: str,
    item: records.LockItem,
    *,
    sent_ms: int,
    line: tuple[tuple[records.Waiter, ...], float] = ((), 0.0),
) -> bool:
    """Send ``item`` (what the hand-over write produced) to the waiter ``token``, with the
    table's name and ``sent_ms`` (our wall clock) signed along, and the ``line`` after it
    (the waiters as read, and that read's age in seconds) if any. Best effort.

    A waiter of this very process (another thread or coroutine) is handed the push at once,
    as it would read it from the datagram: no signing, sending, receiving and checking, and
    no wait for the listener thread to be scheduled."""
    listener = _listener
    if IN_PROCESS and listener and address == listener.address and listener.pid == os.getpid():
        # A copy, as the datagram would bring: the record read back from what was stored.
        pushed = Push(records.lock_item(item.stored), clock.monotonic(), sent_ms, *line)
        listener.take(token, resource, settings.TABLE_NAME, pushed)
        # Let the heir's thread run now: it waits for the GIL, which this thread would
        # otherwise keep until its next request (~0.8 ms of botocore on this machine),
        # while the lock it was handed stands idle.
        time.sleep(0)
        return True
    where = _where(address)
    if where is None:
        return False
    message = _message(resource, item, sent_ms, k=token)
    if line[0]:
        message["q"] = [records.to_item(waiter) for waiter in line[0]]
        message["qa"] = int(line[1] * 1000)
    body = _encoded(message)
    if len(body) + 32 > MAX_DATAGRAM and "q" in message:
        del message["q"], message["qa"]  # the hand-over without the line: the heir reads it
        body = _encoded(message)
    if not _send(body, *where):
        return False
    # Let the heir's process run now: the datagram woke its listener thread, which the
    # kernel tends to queue on this very CPU, behind whatever this thread does next (on a
    # busy machine ~1 ms before the heir learns it holds, while the lock stands idle).
    _yield_cpu()
    return True


def handed(resource: str, releaser: str, heir: str, address: str | None) -> None:
    """The hold ``releaser`` of ours handed ``resource`` to ``heir`` (listening at
    ``address``): words for either go to ``heir`` from now on."""
    with _words():
        if len(passed_on) >= MAX_WORDS or len(handed_to) >= MAX_WORDS:
            passed_on.clear()
            handed_to.clear()
        passed_on[releaser] = heir
        if address:
            handed_to[resource] = (heir, address)
        late = _late.pop(releaser, [])
    for word in late:
        tell_holder(word[0], heir, *word[1:])


def after_release(
    token: str, resource: str, row: records.LockItem, waiter: records.Waiter, sent: float
) -> None:
    """A word for our hold ``token`` that has ended: for its heir, now or as soon as the
    hand-over is done (:func:`handed`); dropped if it was given back to nobody."""
    with _words():
        heir = passed_on.get(token)
        if heir is None:
            if len(_late) >= MAX_WORDS:
                _late.clear()
            _late.setdefault(token, []).append((resource, row, waiter, sent))
            return
    tell_holder(resource, heir, row, waiter, sent)


def words_after(token: str) -> list[records.Waiter]:
    """The waiters whose words came for our hold ``token`` after it began to end, not yet
    passed on (:func:`after_release`): its hand-over may still be choosing its heirs."""
    with _words():
        return [waiter for _, _, waiter, _ in _late.get(token, ())]


def tell_holder(
    resource: str,
    holder: str,
    row: records.LockItem,
    waiter: records.Waiter,
    sent: float | None = None,
    *,
    local: bool | None = None,
    hops: int = 0,
) -> bool:
    """Tell the hold ``holder`` of ``resource`` that ``waiter`` queued behind it (``row``: as
    its ticket left it), as of ``sent`` (monotonic; None: now, by a waiter of this very
    process). Heard here if the hold is ours (``local``: a hold of ours may hear it without
    a datagram, by default unless tests turn :data:`IN_PROCESS` off) or about to be (a waiter
    of ours, waking up from its push); passed on to its heir if it handed over here; sent by
    datagram if this process handed it the lock (:func:`tell`). Else dropped: its release
    reads the queue. False if dropped here (or the datagram could not be sent)."""
    local = IN_PROCESS if local is None else local
    when = clock.monotonic() if sent is None else sent
    for _ in range(WORD_HOPS):
        with _words():
            held = holds.get(holder) if local else None
            if held is not None and not held.here:
                held = None  # a forked child's copy of its parent's hold: not ours to tell
            heir = passed_on.get(holder)
            to, address = handed_to.get(resource, ("", ""))
            waking = listening(holder) or (to == holder and is_ours(address))
            if held is None and heir is None and local and waking:
                if len(_early) >= MAX_WORDS:
                    _early.clear()
                _early.setdefault(holder, []).append((resource, row, waiter, when))
                return True
        if held is not None:
            return held.resource == resource and bool(held.heard_of(row, waiter, sent=sent))
        if heir is None or heir == holder:
            if to == holder and hops < WORD_HOPS:
                return tell(address, resource, holder, row, waiter, sent=when, hops=hops + 1)
            return False
        holder, sent = heir, when
    return False


def holding(held: Any) -> None:
    """Register ``held`` (a ``hold.Held`` that hands over) and let it hear the words that came
    before it was one."""
    with _words():
        holds[held.token] = held
        words = _early.pop(held.token, ())
    for resource, row, waiter, sent in words:
        if held.resource == resource:
            held.heard_of(row, waiter, sent=sent)
    # A push that came while our own look made us the holder: its line is ours too.
    listener = _listener
    slot = listener.slots.get(held.token) if listener is not None else None
    pushed = slot.push if slot is not None else None
    if pushed is not None and pushed.line:
        _line_to_hold(held.token, held.resource, pushed, held)


def tell(
    address: Any,
    resource: str,
    holder: str,
    row: records.LockItem,
    waiter: records.Waiter,
    *,
    sent: float,
    hops: int = 1,
) -> bool:
    """Tell the holder ``holder`` of ``resource``, in the process listening at ``address``,
    that ``waiter`` queued behind it (``row``: the row its ticket left), as a waiter of
    its own process would (:func:`dynasem._engine.hold.queued_behind`), as of ``sent``
    (monotonic: a word passed on keeps its age), ``hops`` hand-overs after the holder it was
    first for. Best effort: a holder not told reads the queue when it releases. (A listener
    of an older version drops the message: it names no waiter to hand to.)"""
    where = _where(address)
    if where is None:
        return False
    sent_ms = clock.now_ms() - int(max(0.0, clock.monotonic() - sent) * 1000)
    message = _message(resource, row, sent_ms, h=holder, w=records.to_item(waiter), hp=hops)
    return _send(_encoded(message), *where)


def _message(resource: str, row: records.LockItem, sent_ms: int, **fields: Any) -> dict[str, Any]:
    """A datagram's message about ``resource``: ``fields``, with the ``row`` it carries, our
    table's name and ``sent_ms`` (our wall clock), which every receiver checks."""
    return {
        "r": resource,
        **fields,
        "i": lock_rows.wire(row),
        "tb": settings.TABLE_NAME,
        "ts": sent_ms,
    }


def _encoded(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _where(address: Any) -> tuple[tuple[str, int], bytes] | None:
    """Where a datagram for ``address`` goes, and the key it is signed with; None if it
    cannot be sent (see :func:`reachable`; no ``SECRET_KEY``)."""
    target = reachable(address)
    keys = _keys()
    return None if target is None or not keys else (target, keys[0])


_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))


def _send(body: bytes, target: tuple[str, int], key: bytes) -> bool:
    if len(body) + 32 > MAX_DATAGRAM:
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(_sign(key, body) + body, target)
        return True
    except OSError:
        return False


def _after_fork() -> None:
    # The parent's late looks stay behind with its scheduler (see heartbeat).
    global _listener, _failed_bind, _short_until, _lock, _words_lock, _pid
    if _pid == os.getpid():
        # Done already: two threads of a child forked without hooks both found _pid another
        # process's (_here), and the one that came second closed the listener the first had
        # opened since, with a waiter's slot in it: pushes to it were lost, the waiter read.
        return
    if _listener is not None and _listener.pid != os.getpid():
        _listener.sock.close()  # the child's copy only; the thread reading it stayed behind
        _listener = None
    _failed_bind, _short_until = None, -float("inf")
    # Another thread of the parent may have held them.
    _lock, _words_lock = threading.Lock(), threading.Lock()
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)
