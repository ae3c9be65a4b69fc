"""Django's transaction as part of a hold's life: give back after the commit.

Work done under a lock becomes visible to others when its transaction commits. A hold given
back inside ``transaction.atomic`` (a ``with semaphore(...)`` block left there, a decorated
view under ``ATOMIC_REQUESTS``, ``@transaction.atomic`` stacked over the decorator) must stay
ours until then, or a second holder works on data the first has not committed: the
interleaving the lock exists to prevent. So the give-back waits for the outermost transaction
of that database: after its commit (``on_commit``), or at once when it rolls back.

Django has commit hooks but no rollback hook. A rollback drops the transaction's
``on_commit`` callbacks (``connection.rollback()`` empties the list, a savepoint rollback
filters it); a finalizer on our callback notices the drop (CPython frees it at once), and:

* no transaction left: the work was rolled back, give back now;
* a savepoint rolled back inside a transaction that goes on: the work done under the lock
  before the savepoint may still commit, so the give-back waits for that transaction instead.

Django's ``TestCase`` (and pytest-django's ``db``) wraps each test in atomic blocks that never
commit; those do not count as a transaction here, so a test sees what production does.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS, connections

logger = logging.getLogger("dynasem")

__all__ = ["after_transaction", "check_using", "open_transaction"]


def check_using(using: Any) -> str | None:
    """A database alias (or None: the default database); refused before any request."""
    if using is None:
        return None
    if not isinstance(using, str):
        raise TypeError(f"using must be a database alias (a str) or None, not {using!r}")
    databases = getattr(django_settings, "DATABASES", {}) or {}
    if using not in databases:
        raise ValueError(
            f"using={using!r} is not a database in settings.DATABASES "
            f"(there are: {', '.join(sorted(databases)) or 'none'})"
        )
    return using


def _in_transaction(connection: Any) -> bool:
    if not connection.in_atomic_block:
        return False
    # Only a TestCase's own blocks open: they never commit, so they are not a transaction.
    blocks = getattr(connection, "atomic_blocks", None)
    if blocks is None:  # pragma: no cover - every supported Django has atomic_blocks
        return True
    return any(not getattr(block, "_from_testcase", False) for block in blocks)


def open_transaction(using: str | None) -> Any:
    """The connection of ``using`` (default database if None) when this thread is inside a
    transaction of it that will commit or roll back; None otherwise (autocommit, a manual
    transaction without ``atomic``, or only a TestCase's blocks). Never connects."""
    connection = connections[using or DEFAULT_DB_ALIAS]
    return connection if _in_transaction(connection) else None


class _Pending:
    """One give-back waiting for a transaction's end."""

    def __init__(self, connection: Any, finish: Callable[[bool], None], name: str) -> None:
        self.connection = connection
        self.finish = finish  # finish(committed)
        self.name = name
        self._done = False
        self._lock = threading.Lock()

    def register(self) -> None:
        def callback() -> None:
            self._end(True)

        # Django names a failing robust callback by its __qualname__ in the log.
        callback.__qualname__ = f"dynasem give-back of {self.name!r}"
        # Only the connection's on_commit list refers to the callback: when Django drops it
        # (rollback), it is freed and the finalizer tells us. atexit=False: a process that
        # exits with an open transaction lets the lease lapse, no requests at shutdown.
        weakref.finalize(callback, self._dropped).atexit = False
        if django.VERSION >= (5, 0):
            self.connection.on_commit(callback, robust=True)
        else:  # Django 4.2 has no robust callbacks; ours never raises anyway (see _end)
            self.connection.on_commit(callback)

    def _dropped(self) -> None:
        with self._lock:
            if self._done:
                return  # ran on commit, then freed
        if _in_transaction(self.connection):
            # A savepoint around the release rolled back, the transaction goes on: what was
            # done under the lock before it may still commit. Wait for the transaction.
            self.register()
        else:
            self._end(False)

    def _end(self, committed: bool) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            self.finish(committed)
        except Exception:  # never break the caller's commit or rollback
            logger.exception("dynasem: giving back %r after the transaction failed", self.name)


def after_transaction(using: str | None, finish: Callable[[bool], None], name: str) -> bool:
    """Call ``finish(True)`` after the outermost transaction of ``using`` commits, or
    ``finish(False)`` as soon as it rolls back. False, and nothing registered, when this
    thread is not inside such a transaction: the caller then gives back at once."""
    connection = open_transaction(using)
    if connection is None:
        return False
    _Pending(connection, finish, name).register()
    return True
