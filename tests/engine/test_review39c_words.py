"""A ninth review: the words between processes and hosts (UDP pushes, wake-ups, hand-overs
passed on), and what they cost a process.

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import errno
import math
import os
import socket
import threading
import time
import types
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import push
from tests.support.helpers import queue_of, wait_for


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_listener_thread_that_cannot_start_leaves_waiters_reading(lock_table, monkeypatch):
    """At a container's pids limit the push listener's thread cannot start. Before the mend
    ``push._get_listener`` caught only ``OSError`` (a bind that failed): the thread's
    ``RuntimeError`` ("can't start new thread") went up through ``push.expect`` and every
    acquire that found its lock busy raised it to its caller, instead of waiting in line and
    reading, as a process without pushes does; and each try left its bound socket open until
    the garbage collector found it. Now the socket is closed and the waiter reads; a later
    wait tries to listen again (the limit may have passed: LISTEN_RETRY later), unlike a bind
    that failed."""
    monkeypatch.setattr(push, "_listener", None)
    monkeypatch.setattr(push, "_failed_bind", None)
    monkeypatch.setattr(push, "_short_until", -math.inf)
    real_start = threading.Thread.start
    tries: list[str] = []

    def start(self: threading.Thread) -> None:
        if self.name == "dynasem-push":
            tries.append(self.name)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    resource = "review39c:no-listener-thread"
    holder = semaphore(resource, lease=10).acquire()
    before = _open_fds()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            with semaphore(resource, wait=10, lease=10):
                out["acquired"] = time.monotonic()
        except Exception as exc:  # reported to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    assert _open_fds() == before  # no socket left open by the listener that could not run
    holder.release()
    thread.join(10)
    assert "error" not in out and "acquired" in out
    assert push._listener is None and push._failed_bind is None
    assert len(tries) == 1  # not a socket and a warning at every step: LISTEN_RETRY later
    monkeypatch.setattr(threading.Thread, "start", real_start)
    monkeypatch.setattr(push, "_short_until", -math.inf)  # LISTEN_RETRY went by
    assert push.available()  # the limit passed: it listens now
    push._listener.sock.close()  # its thread ends; the test's own listener comes back


@pytest.mark.parametrize("errno_", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS])
def test_a_process_out_of_sockets_for_a_moment_listens_again_later(lock_table, monkeypatch, errno_):
    """A process at its open-files limit for a moment (a burst of connections: "Too many
    open files") cannot open the push socket at a wait. Before the mend that was remembered
    as an address it cannot listen on (``_failed_bind``), as a bind to an address not of
    this host is: pushes stayed off in that process until it restarted, and every later
    hand-over to its waiters cost them their paced reads. A socket that could not be opened
    is tried again at a later wait (LISTEN_RETRY on); a bind that failed still is not."""
    monkeypatch.setattr(push, "_listener", None)
    monkeypatch.setattr(push, "_failed_bind", None)
    monkeypatch.setattr(push, "_short_until", -math.inf)
    failing = [True]
    tries: list[int] = []

    def socket_(*args: Any, **kwargs: Any) -> socket.socket:
        tries.append(errno_)
        if failing[0]:
            raise OSError(errno_, os.strerror(errno_))
        return socket.socket(*args, **kwargs)

    # Only push's sockets: the socket module as push sees it, but for its constructor.
    module = types.SimpleNamespace(**{**vars(socket), "socket": socket_})
    monkeypatch.setattr(push, "socket", module)
    assert not push.available() and not push.available()
    assert len(tries) == 1  # tried again LISTEN_RETRY later, not at every step
    failing[0] = False
    monkeypatch.setattr(push, "_short_until", -math.inf)  # LISTEN_RETRY went by
    assert push.available()  # the burst passed: it listens
    assert push._listener is not None and push._listener.thread.is_alive()
    push._listener.sock.close()  # its thread ends; the test's own listener comes back


def test_a_reader_that_cannot_start_the_next_readers_wake_up_still_holds(lock_table, monkeypatch):
    """Readers handed a shared lock together let the next reader in line join them: the
    first of them pushes it the row, from a thread of its own when the line must be read
    first. At a container's pids limit that thread cannot start. Before the mend its
    ``RuntimeError`` ended ``hold.acquired``, which gave the hold back and raised it to the
    reader's caller: readers whose turn had come failed for a push that is only a hint. Now
    the push is skipped (the next reader reads the row at its own next look) and the
    readers hold."""
    real_start = threading.Thread.start
    refused: list[str] = []

    def start(self: threading.Thread) -> None:
        if self.name == "dynasem-let-in":
            refused.append(self.name)
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    resource = "review39c:readers-let-in"
    writer = semaphore(resource, lease=30).acquire()
    out: dict[str, Any] = {}
    threads = []
    for i in range(3):

        def run(name: str = f"r{i}") -> None:
            try:
                with semaphore(resource, shared=True, fair=True, wait=20, lease=30):
                    out[name] = "held"
            except Exception as exc:  # reported to the test
                out[name] = exc

        threads.append(threading.Thread(target=run))
        threads[-1].start()
        wait_for(lambda n=i + 1: len(queue_of(resource)) >= n, 10, "a reader never queued")
    writer.renew()  # its answer shows the writer the queue: it hands over on release
    writer.release()
    for thread in threads:
        thread.join(30)
    assert refused, "no reader let the next one in from a thread"
    assert out == {"r0": "held", "r1": "held", "r2": "held"}
