"""What a process still holds when it exits normally is given back, so that nobody waits for
its lease to run out.

``atexit`` runs on a normal exit: the main program's end, ``sys.exit()``, an unhandled
exception, Ctrl-C, and the graceful exits of servers whose own signal handlers end the
process with ``sys.exit()`` (a gunicorn worker on SIGTERM, SIGINT, SIGQUIT or after
``max_requests``). dynasem installs no signal handler of its own: the application's (or its
server's) stay in charge. Without one, SIGTERM ends a Python process as SIGKILL does, and so do
``os._exit()`` (how multiprocessing's and billiard's forked children, Celery's prefork
workers, end) and a crash: such a holder's locks are taken over by a waiter on its host as
soon as the process is gone (:mod:`dynasem._engine.processes`), by others once its lease has run
out.
:func:`release_all` does at any moment what ``atexit`` does (e.g. from Celery's
``worker_process_shutdown`` signal).
"""

from __future__ import annotations

import atexit
import logging
import threading

from .. import _clock as clock
from .._observability.logs import facts
from . import heartbeat
from .hold import Held, give_back_left, give_back_unused, left_holds

logger = logging.getLogger("dynasem")

# Seconds after which an exit gives back no further holds (DynamoDB unreachable: each give-back
# may take the client's whole patience). What is left runs out with its lease.
EXIT_PATIENCE = 5.0


def release_all() -> int:
    """Give back every hold of this process that nobody can be using any more: taken by the
    calling thread (call it when that thread is done with its holds), or by a thread that has
    ended. Holds of threads that still run are left (they end with their lease, or with the
    process). A hold waiting for its transaction's commit is given back now, if that
    transaction is the calling thread's or an ended thread's; another running thread's
    transaction may still commit work done under it, and gives it back itself. A hold whose
    release an interrupt cut short (left to its lease, its block over) is given back too.
    Returns how many were given back.

    It runs by itself at a normal exit (``atexit``); call it where a process ends otherwise,
    e.g. from Celery's ``worker_process_shutdown`` signal."""
    caller = threading.current_thread()
    holds = [hb.held for hb in heartbeat.scheduled() if isinstance(hb.held, Held)]
    given = 0
    stop = clock.monotonic() + EXIT_PATIENCE
    for held in holds:
        # A hold taken by another thread that still runs (a daemon thread, at exit) may be
        # inside its block, or its transaction, right now: giving it back under it would let
        # another holder in while it works.
        user = held.pending_in if held.pending_commit and held.pending_in else held.thread
        if held.released or (user is not caller and user.is_alive()):
            continue
        if clock.monotonic() >= stop:
            logger.warning(
                "dynasem: left %r held at exit: out of time",
                held.resource,
                extra=facts(held.resource, token=held.token, fence=held.fence, outcome="left_held"),
            )
            continue
        held.depth = 1  # re-entered and never left: nobody uses any depth of it now
        give_back_unused(held)
        given += 1
    # Holds whose release an interrupt cut short: their blocks have ended, whichever thread's.
    for held in left_holds():
        if clock.monotonic() >= stop:
            break
        given += give_back_left(held)
    return given


def _at_exit() -> None:
    # Nothing to do (and no cost) for a process that holds nothing.
    if heartbeat.scheduled() or left_holds():
        given = release_all()
        if given:
            logger.info(
                "dynasem: gave back %d hold(s) at exit",
                given,
                extra=facts(outcome="given_back", count=given),
            )


atexit.register(_at_exit)
