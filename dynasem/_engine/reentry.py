"""The holds this thread or task entered with ``with``/``async with`` (or a decorated call)
and has not left: the stack :func:`current_hold` reads, and entering and leaving it."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Sequence
from contextvars import ContextVar
from types import FrameType
from typing import Any, NoReturn, TypeVar

from asgiref.sync import SyncToAsync

from .._observability.logs import facts
from .._storage.records import Mode
from .._transactions import commit
from ..exceptions import LockLost
from .hold import Held, give_back_unused, undelivered
from .lockspec import LockSpec

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
    Raises ``LookupError`` when there is none."""
    for _sem_id, held in reversed(_entered.get()):
        if resource is None or resource in held.resources:
            return held
    where = f" on {resource!r}" if resource is not None else ""
    raise LookupError(f"no dynasem hold is entered here{where}")


_T = TypeVar("_T")


def pop_entered(stack: ContextVar[tuple[tuple[int, _T], ...]], owner: object, what: str) -> _T:
    """The innermost entry ``owner`` (kept by its identity) pushed on ``stack`` in this thread
    or task, taken off it: a block's exit finds its own enter even when blocks of the same
    object nest."""
    entries = stack.get()
    for i in range(len(entries) - 1, -1, -1):
        if entries[i][0] == id(owner):
            stack.set(entries[:i] + entries[i + 1 :])
            return entries[i][1]
    raise RuntimeError(f"{what} exited without a matching enter")


# The blocks entered and not left yet, by (the entered object's id, the block's frame id),
# whatever the context: a block left in another context than its enter's (a generator
# suspended inside it and resumed by another thread) finds its own entry there.
_open_blocks: dict[tuple[int, int], list[Any]] = {}


def block_opened(owner: object, block: int, value: _T) -> _T:
    """``value`` entered by ``owner``'s block whose frame is ``block`` (pushed on a context's
    stack too); :func:`block_closed` takes it back."""
    _open_blocks.setdefault((id(owner), block), []).append(value)
    return value


def block_closed(
    stack: ContextVar[tuple[tuple[int, _T], ...]], owner: object, block: int, what: str
) -> _T:
    """What :func:`pop_entered` finds; if this context has no entry of ``owner`` (its block's
    exit runs elsewhere than its enter did), the one its block (frame ``block``) entered.
    Raised, that block's hold or job would be kept, renewed, for nobody."""
    key = (id(owner), block)
    while True:
        try:
            value = pop_entered(stack, owner, what)
        except RuntimeError:
            if not _open_blocks.get(key):
                raise
            value = _open_blocks[key][-1]
            break
        if _recorded(owner, value, key) is not None:
            break
        # Stale: a block of this context left in another one (found there by its frame)
        # keeps its entry here; taken for this block's, this block's would be kept, renewed
        # for nobody.
    # Recorded under its enter's frame, which may not be its exit's (``ExitStack``, a
    # wrapper's ``__enter__``/``__exit__``, ``place.__enter__()`` in dynasem_lead): else
    # left behind, with what it holds, for the life of the process.
    where = _recorded(owner, value, key)
    opened = _open_blocks.get(where, []) if where is not None else []
    for i in range(len(opened) - 1, -1, -1):
        if opened[i] is value:
            del opened[i]
            break
    if where is not None and not opened:
        _open_blocks.pop(where, None)
    return value


def _recorded(owner: object, value: object, key: tuple[int, int]) -> tuple[int, int] | None:
    """Where ``value``, entered by ``owner``, is recorded as open: under ``key`` (its
    exit's frame) first, else under any frame; None if its block was left already."""
    others = [k for k in list(_open_blocks) if k[0] == id(owner) and k != key]
    for where in (key, *others):
        if any(v is value for v in _open_blocks.get(where, ())):
            return where
    return None


def forget_entered(sem: object) -> Held:
    return pop_entered(_entered, sem, "semaphore")


def leave(held: Held, raised: bool) -> None:
    try:
        held.release()
    except LockLost:
        if not raised:
            raise
        # The block's own exception goes on; the loss is logged and was signalled.
        ex = facts(held.resource, token=held.token, fence=held.fence, outcome="lost")
        logger.warning(
            "dynasem: hold on %r was lost while its block raised", held.resource, extra=ex
        )


# -- re-entry ----------------------------------------------------------------------------------

# Every hold acquired in this context and not given back yet, with who acquired it (the asyncio
# task, else the thread): a nested acquire by the same one, of resources a hold covers, gets
# that hold again instead of waiting for it (re-entry). Another thread or task, a child task
# included, is another holder: it waits like anyone.
_acquired: ContextVar[tuple[tuple[Held, object], ...]] = ContextVar("dynasem_acquired", default=())


def _owner() -> object:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop here
        task = None
    if task is not None:
        return task
    # Sync code that asgiref's sync_to_async runs for a task (Django's default,
    # thread_sensitive: every task's sync calls on one thread) is owned by its call, not by
    # that thread: a child task's call would otherwise re-enter its parent's hold.
    # (A thread that never ran such a call has no task_context: no stack to walk.)
    ran_one = getattr(SyncToAsync.threadlocal, "task_context", None) is not None
    call = _sync_call() if ran_one else None
    return call if call is not None else threading.current_thread()


def _sync_call() -> object | None:
    """The sync_to_async call this code runs in (its ``task_context``), the innermost one on
    this thread's stack; None outside any. Not asgiref's thread-local ``task_context``: a call
    leaves it set when it ends, and a thread that ran one (through ``async_to_sync``, on its
    own thread) would be taken for that finished call ever after, and wait on its own holds."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _THREAD_HANDLER:
            return frame.f_locals.get("task_context")
        frame = frame.f_back
    return None


_THREAD_HANDLER = SyncToAsync.thread_handler.__code__


def remember_acquired(held: Held) -> None:
    """``held`` was just acquired here (the holds given back since are forgotten)."""
    if held.depth > 1:
        return  # re-entered: known already
    kept = tuple((h, o) for h, o in _acquired.get() if not h.released and h is not held)
    _acquired.set((*kept, (held, _owner())))


def forget_acquired() -> None:
    """Forget every hold acquired here: a test's on its own table (dynasem.testing), so that
    a hold a test left behind is not re-entered by the next one, on another table."""
    _acquired.set(())


def reentered(sem: LockSpec) -> Held | None:
    """The hold this thread or task already has that covers what ``sem`` asks for, acquired
    once more (its depth counted: only the outermost release gives it back); None when it
    holds none of ``sem``'s resources. A request it can only partly meet raises ValueError at
    once, before any request is sent: waiting would wait on ourselves."""
    held = held_here(sem)
    if held is None:
        return None
    held.depth += 1
    undelivered(held)  # an interrupt before the caller has it takes the depth back
    _kept_for_commit(held, sem)
    return named(held, sem.resources)


def held_here(sem: LockSpec) -> Held | None:
    """The hold of this thread or task that :func:`reentered` would take again for ``sem``
    (nothing counted); the same ValueError for a request it can only partly meet."""
    me = _owner()
    for held, owner in reversed(_acquired.get()):
        if owner is not me or not held.here or held.released or held.pending_commit or held.lost:
            continue
        if held.left_to_lease:  # its release interrupted: nobody's any more
            continue
        if _holds_some(held, sem):
            return held
    return None


def _kept_for_commit(held: Held, sem: LockSpec) -> None:
    """A nested acquire whose work commits in a transaction that ``held``'s own give-back does
    not wait for (another database's, or any if the outer block has ``on_commit=False``):
    the hold is kept one level deeper until that transaction ends too. Else the outer
    block's exit could give it back before the nested block's work commits."""
    ours = commit.open_transaction(sem.using) if sem.on_commit else None
    outer = held.semaphore
    if ours is None or (outer.on_commit and commit.open_transaction(outer.using) is ours):
        return
    held.depth += 1

    def ended(committed: bool) -> None:
        try:
            held.release()  # that level (the outermost, if the outer block has ended)
        except LockLost:
            pass  # lost meanwhile: signalled and logged when it was found

    if not commit.after_transaction(sem.using, ended, held.resource):
        held.depth -= 1


def pending_hold(sem: LockSpec) -> Held | None:
    """A hold this thread gave back inside a transaction that has not ended yet, holding some
    of what ``sem`` asks for: it belongs to this transaction, so taking it again must not wait
    on it. The same hold is returned (named by what was asked for), its depth counted; its
    give-back stays tied to the commit, unless it is still held then (``acquire()`` kept past
    it): then its release gives it back. Raises ValueError as :func:`reentered` does, and also
    when ``sem``'s work commits in another database's transaction: given back at this one's
    commit, the hold could end before that work is committed."""
    for owner in reversed(commit.pending_owners()):
        if not isinstance(owner, Held) or not owner.here or owner.lost or owner.released:
            continue
        if _holds_some(owner, sem):
            ours = commit.open_transaction(sem.using) if sem.on_commit else None
            if ours not in (None, commit.open_transaction(owner.semaphore.using)):
                raise ValueError(
                    f"{owner.resource!r} is held here until the commit of database "
                    f"{commit.database(owner.semaphore.using)!r}'s transaction; a semaphore "
                    f"whose work commits in {commit.database(sem.using)!r}'s cannot take it "
                    "again before then (its work could commit after the give-back): give "
                    "both the same using="
                )
            # Counted as a nested acquire is: taken by ``acquire()`` (or an ExitStack) and
            # kept past the commit, the hold is given back by its release, not by the commit.
            owner.depth += 1
            undelivered(owner)  # an interrupt before the caller has it takes the depth back
            return named(owner, sem.resources)
    return None


def _holds_some(held: Held, sem: LockSpec) -> bool:
    """Whether ``held`` holds any of what ``sem`` asks for; ValueError if it holds some but
    not all of it, or not in a mode that covers the request: the acquire would wait on
    ourselves."""
    wanted = sem.resources
    overlap = [r for r in wanted if r in held.resources]
    if not overlap:
        return False
    if len(overlap) < len(wanted):
        missing = [r for r in wanted if r not in held.resources]
        who = "task" if isinstance(_owner(), asyncio.Task) else "thread"
        raise ValueError(
            f"this {who} already holds {overlap!r} (taken with {held.resources!r}) "
            f"and asks for them again together with {missing!r}: taking those while "
            "holding the others could wait on ourselves and deadlock with another "
            "holder taking them in the other order; take them all in the outer semaphore"
        )
    _check_covers(held, sem, overlap[0])
    return True


def named(held: Held, wanted: Sequence[str]) -> Held:
    """``held`` as the hold of ``wanted``, some or all of its resources: itself, or a
    :class:`Nested` view named by them (its ``resource``, ``fence`` and ``fences``)."""
    if wanted[0] == held.resources[0] and len(wanted) == len(held.resources):
        return held
    return Nested(held, list(wanted))


def _check_covers(held: Held, sem: LockSpec, resource: str) -> None:
    had = held.semaphore
    if had.mode == Mode.EXCLUSIVE:
        return  # an exclusive hold covers any request of its resources
    if sem.mode == Mode.EXCLUSIVE:
        kind = "shared" if had.mode == Mode.SHARED else f"counting (limit={had.limit})"
        raise ValueError(
            f"an exclusive acquire of {resource!r} inside a {kind} hold of it would wait for "
            "itself (an upgrade: two holders upgrading at once deadlock); take it exclusive "
            "from the start"
        )
    if had.mode != sem.mode or had.limit != sem.limit:
        raise ValueError(
            f"{resource!r} is held here with limit={had.limit}, shared={had.mode == Mode.SHARED};"
            f" a nested acquire of it must ask for the same (or be made inside an exclusive "
            f"hold), not limit={sem.limit}, shared={sem.mode == Mode.SHARED}"
        )


class Nested(Held):
    """What a nested acquire of some of a hold's resources gets: the same hold (its token,
    lease, renewals; released by the outermost release only), named by the resources it asked
    for (``resource``, ``fence`` and ``fences`` are theirs).

    It has no state of its own but ``outer`` and ``resources``: every other attribute is the
    outer hold's (``__getattr__``), so :class:`Held`'s read-only members (``lost``,
    ``released``, ``pending_commit``, ``expires``, ``seconds_left``, ``fence``) read the outer
    hold's state as they are; what changes state goes to the outer hold itself."""

    def __init__(self, outer: Held, resources: list[str]):  # noqa: D107 - no Held.__init__
        self.outer = outer
        self.resources = resources

    def __getattr__(self, name: str) -> Any:
        return getattr(self.outer, name)

    @property
    def fences(self) -> dict[str, int]:  # type: ignore[override]
        return {r: self.outer.fences[r] for r in self.resources}

    def check_deadline(self) -> None:
        self.outer.check_deadline()

    def renew(self) -> None:
        self.outer.renew()

    def release(self) -> None:
        self.outer.release()

    def found_lost(self, reason: str, resource: str | None = None) -> NoReturn:
        self.outer.found_lost(reason, resource or self.resource)

    def __repr__(self) -> str:
        return f"<Held {self.resources!r} fence={self.fence} (nested in {self.outer!r})>"
