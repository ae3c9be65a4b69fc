"""Django's transaction as part of a hold's life: give back after the commit.

Work done under a lock becomes visible to others when its transaction commits. A hold given
back inside ``transaction.atomic`` (a ``with semaphore(...)`` block left there, a decorated
view under ``ATOMIC_REQUESTS``, ``@transaction.atomic`` stacked over the decorator) must stay
ours until then, or a second holder works on data the first has not committed: the
interleaving the lock exists to prevent. So the give-back waits for the outermost transaction
of that database: after its commit (``on_commit``), or at once when it rolls back.

Django has commit hooks but no rollback hook. A rollback drops the transaction's
``on_commit`` callbacks (``connection.rollback()`` empties the list, a savepoint rollback
filters it, ``connection.close()`` inside ``atomic`` empties it too); a finalizer on our
callback notices the drop (CPython frees it at once), and:

* no transaction left: the work was rolled back, give back now;
* a savepoint rolled back inside a transaction that goes on: the work done under the lock
  before the savepoint may still commit, so a hold waits for that transaction instead (a
  run_once job's whole body was inside that savepoint: its work is gone, it is FAILED now);
* dropped by a close of the connection inside the transaction (Django's ``close()`` running,
  or every savepoint it was registered under still open; not one of them ended, which may
  have been released before the close): the transaction can never commit now: give back now.

Our callback runs first among the transaction's commit hooks (it is moved to the front of
Django's list): a hook of another app that raises after the commit makes Django skip the
hooks after it, and that must neither keep a hold (while the caller handles that exception)
nor leave a committed run_once job un-DONE. Not in a ``TestCase``, whose transaction never
commits: there ``captureOnCommitCallbacks(execute=True)`` runs the hooks added since it began,
found by their place in Django's list, and one moved to the front would be missed.

Django's ``TestCase`` (and pytest-django's ``db``) wraps each test in atomic blocks that never
commit; those do not count as a transaction here, so a test sees what production does.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from django.conf import settings as django_settings
from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from .._observability.logs import facts

logger = logging.getLogger("dynasem")

__all__ = ["after_transaction", "check_using", "database", "open_transaction", "pending_owners"]


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


def database(using: str | None) -> str:
    """The database whose transaction a hold follows and fences: ``using``, or else where the
    project's ``DATABASE_ROUTERS`` send writes of dynasem's ``Fence`` model (``default``
    without routers). One answer for the fence row, the ``fence_db`` block's transaction and
    the give-back after the commit, so that all three are the same transaction; asked at each
    use, as routers may change (``override_settings``)."""
    if using is not None:
        return using
    from ..models import Fence  # not at import: the app registry is ready by the first hold

    return str(router.db_for_write(Fence))


def _in_transaction(connection: Any) -> bool:
    if not connection.in_atomic_block:
        return False
    # Only a TestCase's own blocks open: they never commit, so they are not a transaction.
    # (atomic_blocks: every supported Django has it, since 3.2.)
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def _under_testcase(connection: Any) -> bool:
    """Whether this transaction is inside a TestCase's blocks, which never commit: its hooks
    run only through ``captureOnCommitCallbacks(execute=True)``, which runs those added since
    it began, found by their place in the list. Moved to the front, ours would be missed
    (kept till the test ends) and a hook from before the capture run in its stead."""
    blocks = connection.atomic_blocks
    return bool(blocks) and getattr(blocks[0], "_from_testcase", False) is True


def open_transaction(using: str | None) -> Any:
    """The connection of ``using`` (if None: ``database(None)``, the routers' choice) when
    this thread is inside a transaction of it that will commit or roll back; None otherwise
    (autocommit, a manual transaction without ``atomic``, or only a TestCase's blocks). Never
    connects."""
    connection = connections[database(using)]
    return connection if _in_transaction(connection) else None


@dataclasses.dataclass(eq=False)  # found in a list by identity
class _Pending:
    """One give-back waiting for a transaction's end."""

    connection: Any
    finish: Callable[[bool], None]  # finish(committed)
    name: str
    owner: Any  # what gives back (a Held, a Job): found again by pending_owners()
    savepoint_ends_it: bool
    done: bool = False
    _sids: set[Any] = dataclasses.field(default_factory=set)
    # The process that registered it: a child forked meanwhile has a copy of the hook, which
    # its own close of the inherited connection drops; the parent's transaction decides.
    _pid: int = dataclasses.field(default_factory=os.getpid)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def register(self) -> None:
        def callback() -> None:
            self._end(True)

        # Django names a failing robust callback by its __qualname__ in the log.
        callback.__qualname__ = f"dynasem give-back of {self.name!r}"
        # Only the connection's on_commit list refers to the callback: when Django drops it
        # (rollback), it is freed and the finalizer tells us. atexit=False: a process that
        # exits with an open transaction lets the lease lapse, no requests at shutdown.
        weakref.finalize(callback, self._dropped).atexit = False
        self._sids = set(self.connection.savepoint_ids)
        self.connection.on_commit(callback, robust=True)
        if not _under_testcase(self.connection):
            # Run first among the commit hooks: move ours, just appended (we are inside
            # atomic, so on_commit queued it), to the front.
            hooks = self.connection.run_on_commit
            hooks.insert(0, hooks.pop())
        waiting = _pending.setdefault(self.connection, [])
        if self not in waiting:  # registered again after a savepoint rollback
            waiting.append(self)

    def _dropped(self) -> None:
        with self._lock:
            if self.done:
                return  # ran on commit, then freed
        if (
            not _in_transaction(self.connection)
            # The connection closed inside the transaction, which can never commit: told by
            # Django's close() running (a savepoint we were registered under may have been
            # released before it), or by none of those savepoints having ended.
            or _closing(self.connection)
            or self._sids <= set(self.connection.savepoint_ids)
            or self.savepoint_ends_it
        ):
            self._end(False)
        else:
            # A savepoint around the release rolled back, the transaction goes on: what was
            # done under the lock before it may still commit. Wait for the transaction.
            self.register()

    def _end(self, committed: bool) -> None:
        if os.getpid() != self._pid:
            return  # a forked child's copy of the hook
        with self._lock:
            if self.done:
                return
            self.done = True
        waiting = _pending.get(self.connection)
        if waiting is not None and self in waiting:
            waiting.remove(self)
        try:
            self.finish(committed)
        except Exception:  # never break the caller's commit or rollback
            token = getattr(self.owner, "token", None)
            logger.exception(
                "dynasem: giving back %r after the transaction failed",
                self.name,
                extra=facts(
                    self.name, token=token, outcome="give_back_failed", committed=committed
                ),
            )


# Django's close of a connection, which drops its commit hooks first.
_CLOSE = inspect.unwrap(BaseDatabaseWrapper.close).__code__


def _closing(connection: Any) -> bool:
    """Whether ``connection`` was closed inside its transaction, or is being closed: a hook it
    drops is freed inside Django's ``close()``, at once, before that marks
    ``closed_in_transaction``; off CPython, maybe later, at a garbage collection."""
    if getattr(connection, "closed_in_transaction", False):
        return True
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CLOSE:
            return True
        frame = frame.f_back
    return False


# The give-backs waiting on each connection (a connection belongs to one thread or task).
_pending: weakref.WeakKeyDictionary[Any, list[_Pending]] = weakref.WeakKeyDictionary()


def after_transaction(
    using: str | None,
    finish: Callable[[bool], None],
    name: str,
    *,
    owner: Any = None,
    savepoint_ends_it: bool = False,
) -> bool:
    """Call ``finish(True)`` after the outermost transaction of ``using`` commits, or
    ``finish(False)`` as soon as it rolls back (or can no longer commit). False, and nothing
    registered, when this thread is not inside such a transaction: the caller then gives back
    at once. ``savepoint_ends_it``: a rolled-back savepoint around the call ends it too
    (``finish(False)`` at once) instead of waiting for the transaction."""
    connection = open_transaction(using)
    if connection is None:
        return False
    pending = _Pending(connection, finish, name, owner, savepoint_ends_it)
    if getattr(connection, "closed_in_transaction", False):
        # Closed inside the transaction (close_old_connections() in a long task): it can
        # never commit, and Django drops its hooks only at the next connect, maybe never.
        # Ended now (True: handled, ``finish`` has run).
        pending._end(False)
        return True
    pending.register()
    return True


def give_backs() -> list[_Pending]:
    """The give-backs still waiting for a transaction's end, of every thread: what
    :func:`end_now` ends (``dynasem.testing``, as a test's table ends)."""
    return [p for waiting in list(_pending.values()) for p in list(waiting) if not p.done]


def end_now(entries: Iterable[_Pending]) -> None:
    """End ``entries`` now, as if their transactions had rolled back (``finish(False)``): a
    test's table ends before Django's ``TestCase`` rolls the test's transaction back, and a
    give-back that rollback set off would go to whatever ``DYNASEM`` names by then."""
    for entry in entries:
        entry._end(False)


def pending_owners() -> list[Any]:
    """The owners of the give-backs waiting on this thread's open transactions, of every
    database (newest last); empty outside a transaction. Never connects."""
    if not _pending:
        # No give-back ever waited on a connection still open (of any thread): none waits on
        # this thread's, whose list every acquire would read (about 5 % of the lock's own CPU
        # in an uncontended cycle, with three databases).
        return []
    owners: list[Any] = []
    for connection in connections.all(initialized_only=True):
        if connection in _pending and _in_transaction(connection):
            owners += [p.owner for p in _pending[connection] if not p.done and p.owner is not None]
    return owners
