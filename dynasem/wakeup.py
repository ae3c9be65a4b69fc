"""Hand-over pushes: a releasing holder tells the waiter it handed the lock to, at once.

DynamoDB cannot tell a waiter that its turn came; without help a queued waiter learns it only
by reading the item, and so either reads often (requests) or late (idle lock). A waiter that
has a push address (one UDP socket per process, opened on its first wait) records it in its
queue entry; the holder that hands the lock over in its release write sends the item that
write produced, signed, to that address. The waiter then holds the lock as if it had read the
item itself: no request, no idle gap beyond the release write's round trip.

A push is only ever a shortcut. It carries what DynamoDB answered to the hand-over write,
signed with an HMAC of the project's ``SECRET_KEY`` (so a datagram from anything else is
dropped), addressed to one waiter's token (so a replay is for a wait that is over). A lost
or unsendable push costs the waiter one of its paced reads, nothing else.

``DYNASEM["PUSH"]``: the address to listen on and advertise. The default, ``"127.0.0.1"``,
reaches processes on the same host (a releaser elsewhere sees the loopback address and does
not send); set the host's private address to push across hosts, or ``None`` for no pushes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import threading
from typing import Any

from django.conf import settings as django_settings

from .conf import settings

logger = logging.getLogger("dynasem")

MAX_DATAGRAM = 60_000  # bytes: a queue too long to push is read instead
_SALT = b"dynasem.hand-over-push"

_lock = threading.Lock()
_listener: _Listener | None = None
_failed_bind: str | None = None  # the address we could not listen on (not tried again)


def _host_id() -> str:
    """Which machine (network namespace, roughly) we are: loopback pushes stay on it."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return hashlib.sha256(f"{socket.gethostname()}|{boot}".encode()).hexdigest()[:12]


HOST_ID = _host_id()


def _key() -> bytes | None:
    secret = getattr(django_settings, "SECRET_KEY", "") or ""
    if not secret:
        return None
    return hashlib.sha256(_SALT + str(secret).encode()).digest()


def _sign(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


class _Slot:
    __slots__ = ("event", "item", "resource")

    def __init__(self, resource: str):
        self.resource = resource
        self.event = threading.Event()
        self.item: dict[str, Any] | None = None


class _Listener:
    """One UDP socket and one daemon thread per process; waiters register by token."""

    def __init__(self, bind: str, key: bytes):
        self.key = key
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((bind, 0))
        host, port = self.sock.getsockname()
        self.address = f"{HOST_ID}@{host}:{port}"
        self.bind = bind
        self.slots: dict[str, _Slot] = {}
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._run, name="dynasem-push", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                data, _ = self.sock.recvfrom(65536)
            except OSError:
                return  # closed
            try:
                self._deliver(data)
            except Exception:  # a malformed datagram must not end the listener
                logger.debug("dynasem: dropped an unreadable push", exc_info=True)

    def _deliver(self, data: bytes) -> None:
        mac, body = data[:32], data[32:]
        if not hmac.compare_digest(mac, _sign(self.key, body)):
            return
        message = json.loads(body)
        slot = self.slots.get(message["k"])
        if slot is None or slot.resource != message["r"] or not isinstance(message["i"], dict):
            return
        slot.item = message["i"]
        slot.event.set()


def _get_listener() -> _Listener | None:
    """This process's listener, opened on first use; None when pushes are off or impossible."""
    global _listener, _failed_bind
    bind = settings.PUSH
    current = _listener
    if current is not None and current.pid == os.getpid() and current.bind == bind:
        return current
    if not bind:
        return None
    key = _key()
    if key is None:
        return None
    with _lock:
        if _listener is not None and _listener.pid == os.getpid() and _listener.bind == bind:
            return _listener
        if _failed_bind == bind:
            return None
        try:
            _listener = _Listener(bind, key)
        except OSError as exc:
            _failed_bind = bind
            logger.warning("dynasem: cannot listen for hand-over pushes on %s: %s", bind, exc)
            return None
        return _listener


def available() -> bool:
    """Can this process take pushes (listening, or able to start)?"""
    return _get_listener() is not None


def expect(resource: str, token: str) -> str | None:
    """Register a waiter; returns the address to record in its queue entry (or None)."""
    listener = _get_listener()
    if listener is None:
        return None
    listener.slots[token] = _Slot(resource)
    return listener.address


def wait(token: str, seconds: float) -> dict[str, Any] | None:
    """Sleep up to ``seconds`` or until a push for ``token`` arrives; the pushed item, or None."""
    listener = _listener
    slot = listener.slots.get(token) if listener is not None else None
    if slot is None:
        threading.Event().wait(seconds)
        return None
    if slot.event.wait(seconds):
        slot.event.clear()
        item, slot.item = slot.item, None
        return item
    return None


def forget(token: str) -> None:
    listener = _listener
    if listener is not None:
        listener.slots.pop(token, None)


def reachable(address: Any) -> tuple[str, int] | None:
    """Where to send a push for a waiter that recorded ``address``; None if we cannot reach it."""
    if not isinstance(address, str) or "@" not in address:
        return None
    host_id, _, hostport = address.partition("@")
    host, _, port = hostport.rpartition(":")
    if not port.isdigit():
        return None
    if host.startswith("127.") and host_id != HOST_ID:
        return None  # another machine's loopback
    return host, int(port)


def push(address: Any, resource: str, token: str, item: dict[str, Any]) -> bool:
    """Send ``item`` (what the hand-over write produced) to the waiter ``token``. Best effort."""
    target = reachable(address)
    key = _key()
    if target is None or key is None:
        return False
    body = json.dumps({"r": resource, "k": token, "i": item}, separators=(",", ":")).encode()
    if len(body) + 32 > MAX_DATAGRAM:
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(_sign(key, body) + body, target)
        return True
    except OSError:
        return False


def _after_fork() -> None:
    global _listener, _failed_bind
    if _listener is not None:
        _listener.sock.close()  # the child's copy only; the thread reading it stayed behind
    _listener, _failed_bind = None, None


os.register_at_fork(after_in_child=_after_fork)
