"""A ninth review: the words between processes and hosts (UDP pushes, wake-ups, hand-overs
passed on), and what they cost a process.

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
import types
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import push


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
    wait tries to listen again (the limit may have passed), unlike a bind that failed."""
    monkeypatch.setattr(push, "_listener", None)
    monkeypatch.setattr(push, "_failed_bind", None)
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "dynasem-push":
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
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert push.available()  # the limit passed: it listens now
    push._listener.sock.close()  # its thread ends; the test's own listener comes back


@pytest.mark.parametrize("errno_", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS])
def test_a_process_out_of_sockets_for_a_moment_listens_again_later(lock_table, monkeypatch, errno_):
    """A process at its open-files limit for a moment (a burst of connections: "Too many
    open files") cannot open the push socket at a wait. Before the mend that was remembered
    as an address it cannot listen on (``_failed_bind``), as a bind to an address not of
    this host is: pushes stayed off in that process until it restarted, and every later
    hand-over to its waiters cost them their paced reads. A socket that could not be opened
    is tried again at the next wait; a bind that failed still is not."""
    monkeypatch.setattr(push, "_listener", None)
    monkeypatch.setattr(push, "_failed_bind", None)
    failing = [True]

    def socket_(*args: Any, **kwargs: Any) -> socket.socket:
        if failing[0]:
            raise OSError(errno_, os.strerror(errno_))
        return socket.socket(*args, **kwargs)

    # Only push's sockets: the socket module as push sees it, but for its constructor.
    module = types.SimpleNamespace(**{**vars(socket), "socket": socket_})
    monkeypatch.setattr(push, "socket", module)
    assert not push.available()
    failing[0] = False
    assert push.available()  # the burst passed: it listens
    assert push._listener is not None and push._listener.thread.is_alive()
    push._listener.sock.close()  # its thread ends; the test's own listener comes back
