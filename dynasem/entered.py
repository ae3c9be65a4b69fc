"""The holds this thread or task entered with ``with``/``async with`` (or a decorated call)
and has not left: the stack :func:`current_hold` reads, and entering and leaving it."""

from __future__ import annotations

import logging
from contextvars import ContextVar

from .exceptions import LockLost
from .held import Held, give_back_unused

logger = logging.getLogger("dynasem")

# The holds entered through ``with``/``async with``, per thread and per task.
_entered: ContextVar[tuple[tuple[int, Held], ...]] = ContextVar("dynasem_entered", default=())


def remember_entered(sem: object, held: Held) -> None:
    _entered.set(_entered.get() + ((id(sem), held),))


def enter(sem: object, held: Held) -> Held:
    """``held`` entered as ``sem``'s block (``with``/``async with``); ``sem`` is kept by
    its identity only."""
    try:
        remember_entered(sem, held)
    except BaseException:  # an interrupt before the block: nobody will use the hold
        give_back_unused(held)
        raise
    return held


def current_hold(resource: str | None = None) -> Held:
    """The innermost hold this thread or task entered (``with``/``async with``, or a decorated
    call) and has not left; the innermost one on ``resource`` if given. A decorated view or
    function reaches its own hold this way: ``current_hold().fence``.
    Raises :class:`LookupError` when there is none."""
    for _sem_id, held in reversed(_entered.get()):
        if resource is None or resource in held.resources:
            return held
    raise LookupError(
        "no dynasem hold is entered here" + (f" on {resource!r}" if resource is not None else "")
    )


def forget_entered(sem: object) -> Held:
    stack = _entered.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] == id(sem):
            _entered.set(stack[:i] + stack[i + 1 :])
            return stack[i][1]
    raise RuntimeError("semaphore exited without a matching enter")


def leave(held: Held, raised: bool) -> None:
    try:
        held.release()
    except LockLost:
        if not raised:
            raise
        # The block's own exception goes on; the loss is logged and was signalled.
        logger.warning("dynasem: hold on %r was lost while its block raised", held.resource)
