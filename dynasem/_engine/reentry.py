"""The blocks entered with ``with``/``async with`` (of a semaphore, a decorated call,
run_once, leadership) and not left: which block an exit leaves, the holds
:func:`current_hold` reads; and re-entry, a nested acquire of a hold this thread or task has."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from types import FrameType
from typing import Any, NoReturn, TypeVar

from asgiref.sync import SyncToAsync

from .._observability.logs import facts
from .._storage.records import Mode
from .._transactions import commit, fencing
from ..exceptions import LockLost
from .hold import Held, running_task, undelivered
from .lockspec import LockSpec

logger = logging.getLogger("dynasem")


@dataclasses.dataclass(eq=False, slots=True)
class Block:
    """A block entered and not left yet (``with``/``async with`` of a semaphore, run_once or
    leadership; a unique task's run): the object entered (``owner``), the frame that entered
    it (None: found by its context only), the task that did (weakly; None: not async), what
    it entered (``value``: a Held, a Job, a Lead) and a ``fence_db`` block's ``atomic``."""

    owner: object
    frame: FrameType | None
    task: weakref.ref[asyncio.Task[Any]] | None = None
    value: Any = None
    atomic: Any = None
    open: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return (id(self.owner), id(self.frame))


# The blocks this thread or task entered, innermost last (those left since, elsewhere, skipped).
_entered: ContextVar[tuple[Block, ...]] = ContextVar("dynasem_entered", default=())
# Every context's open blocks, by (the entered object's id, the entering frame's id; each
# block keeps its frame, whose id no other frame has meanwhile): a block left in another
# context than its enter's (a generator resumed by another thread, an async generator closed
# by another task) or inside another block of the same object finds its own record.
_open_blocks: dict[tuple[int, int], list[Block]] = {}

_T = TypeVar("_T")


def opened(block: Block, value: _T) -> _T:
    """``value`` entered by ``block``: this thread's or task's innermost, found by its frame
    from any context until :func:`left`."""
    block.value, block.open = value, True
    try:
        _entered.set((*_open_here(), block))
        if block.frame is not None:
            _open_blocks.setdefault(block.key, []).append(block)
    except BaseException:  # an interrupt (a signal's exception): not entered after all
        close(block)
        raise
    return value


def left(owner: object, frame: FrameType | None, what: str) -> Block:
    """The block of ``owner`` being left at ``frame``, closed: the one entered at that frame
    (its own, wherever it was entered); else one entered through a helper called from the
    frame that now calls ``frame`` (an ``ExitStack``'s ``enter_context`` and ``__exit__``,
    a wrapper's ``__enter__`` and ``__exit__``: found so in a generator resumed elsewhere,
    too); else this thread's or task's innermost open block of ``owner``. Not found, what it
    entered would be kept (renewed) for nobody."""
    mine = _recorded(owner, frame) or [b for b in _open_here() if b.owner is owner]
    if not mine:
        raise RuntimeError(f"{what} exited without a matching enter")
    return close(mine[-1])


def _recorded(owner: object, frame: FrameType | None) -> list[Block]:
    """``owner``'s open blocks entered at ``frame``; else those entered by a frame that has
    returned to the one calling ``frame`` (a suspended generator's frame has no caller)."""
    if frame is None:
        return []
    mine = _open_blocks.get((id(owner), id(frame)))
    caller = frame.f_back
    if mine or caller is None:
        return list(mine or ())
    # Read whole at once (other threads open and close blocks meanwhile).
    everyone = [b for blocks in list(_open_blocks.values()) for b in list(blocks)]
    return [b for b in everyone if b.owner is owner and _caller(b) is caller]


def _caller(block: Block) -> FrameType | None:
    return None if block.frame is None else block.frame.f_back


def close(block: Block) -> Block:
    """``block`` left: off this context's blocks and the record of open ones (its frame let
    go: another context's blocks may keep it until they are next read)."""
    key, block.open, block.frame = block.key, False, None
    _entered.set(_open_here())
    blocks = _open_blocks.get(key, [])
    with contextlib.suppress(ValueError):  # never recorded (an interrupt), or closed already
        blocks.remove(block)
    if not blocks:
        _open_blocks.pop(key, None)
    return block


def _open_here() -> tuple[Block, ...]:
    return tuple(b for b in _entered.get() if b.open)


def current_hold(resource: str | None = None) -> Held:
    """The innermost hold this thread or task entered (``with``/``async with``, or a decorated
    call) and has not left; the innermost one on ``resource`` if given. A decorated view or
    function reaches its own hold this way: ``current_hold().fence``.
    Raises ``LookupError`` when there is none, ``TypeError`` for a ``resource`` that is no str
    (no hold's, which read as "none entered" inside the very block)."""
    if resource is not None and not isinstance(resource, str):
        raise TypeError(f"resource must be a str, not {type(resource).__name__}: {resource!r}")
    for block in reversed(_open_here()):
        held = block.value
        if isinstance(held, Held) and (resource is None or resource in held.resources):
            return held
    where = f" on {resource!r}" if resource is not None else ""
    raise LookupError(f"no dynasem hold is entered here{where}")


def open_tokens() -> list[str]:
    """The tokens of the holds this thread or task entered (``with``/``async with``, or a
    decorated call) and has not given back, outermost first: what a task's retry sent from
    here succeeds."""
    helds = (block.value for block in _open_here() if isinstance(block.value, Held))
    return list(dict.fromkeys(held.token for held in helds if not held.released))


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
    except Exception as exc:
        if not raised:
            raise
        exit_failed(held, exc)


def exit_failed(held: Held, exc: Exception) -> None:
    """The exit of a block that raised raised too (a lock_released receiver): logged, and
    the block's own exception goes on. Raised, it took the place of the user's."""
    ex = facts(held.resource, token=held.token, fence=held.fence, outcome="exit_failed")
    message = "dynasem: the exit of a block on %r that raised raised too: %r"
    logger.warning(message, held.resource, exc, extra=ex, exc_info=exc)


# -- re-entry ----------------------------------------------------------------------------------

# Every hold acquired in this context and not given back yet, with who acquired it (the asyncio
# task, else the thread): a nested acquire by the same one, of resources a hold covers, gets
# that hold again instead of waiting for it (re-entry). Another thread or task, a child task
# included, is another holder: it waits like anyone.
_acquired: ContextVar[tuple[tuple[Held, object], ...]] = ContextVar("dynasem_acquired", default=())
# True in the context where ``dynasem.testing.held_elsewhere`` acquires, as another process
# would: it takes nothing again that this thread's open transaction still holds.
as_another_process: ContextVar[bool] = ContextVar("dynasem_as_another_process", default=False)


def _owner() -> object:
    task = running_task()
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


@contextlib.contextmanager
def lent(held: Held) -> Iterator[None]:
    """``held`` this thread's or task's too while the ``with`` runs (re-entered by its
    nested acquires): the work of the block that took it, run by another holder (a view's
    template response, rendered by another ``sync_to_async`` call than the view's, under
    ASGI). Without it, code the template runs that takes the view's lock waits on it."""
    entry = (getattr(held, "outer", held), _owner())
    _acquired.set((*_acquired.get(), entry))
    try:
        yield
    finally:
        _acquired.set(tuple(e for e in _acquired.get() if e is not entry))


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
    kept_for_commit(held, sem)
    return named(held, sem)


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


def kept_for_commit(held: Held, sem: LockSpec) -> None:
    """A nested acquire whose work commits in a transaction that ``held``'s own give-back does
    not wait for (another database's, or any if the outer block has ``on_commit=False``):
    the hold is kept one level deeper until that transaction ends too. Else the outer
    block's exit could give it back before the nested block's work commits. Asked of this
    thread's transactions: an async acquire asks it on its sync caller's thread too."""
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
    if as_another_process.get():
        return None
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
            return named(owner, sem)
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


def named(held: Held, sem: LockSpec) -> Held:
    """``held`` as the hold ``sem`` asked for, some or all of its resources: itself, or a
    :class:`Nested` view named by them (its ``resource``, ``fence`` and ``fences``) whose
    ``fence_transaction()`` fences ``sem``'s database, as its ``fence_db`` block does."""
    wanted, had = sem.resources, held.semaphore
    same = wanted[0] == held.resources[0] and len(wanted) == len(held.resources)
    # Another database or on_commit: its release keeps the hold for its own transaction.
    if same and sem.using == had.using and sem.on_commit == had.on_commit:
        return held
    return Nested(held, list(wanted), sem)


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
    """What a nested acquire of some of a hold's resources (or of all, for another database
    or ``on_commit``) gets: the same hold (its token, lease, renewals; released by the
    outermost release only), named by the resources it asked for (``resource``, ``fence``
    and ``fences`` are theirs).

    It has no state of its own but ``outer``, ``resources``, ``asked`` (the nested semaphore)
    and ``using`` (its, which ``fence_transaction()`` fences): every other attribute is the
    outer hold's (``__getattr__``), so :class:`Held`'s read-only members (``lost``,
    ``released``, ``pending_commit``, ``expires``, ``seconds_left``, ``fence``) read the outer
    hold's state as they are; what changes state goes to the outer hold itself."""

    def __init__(self, outer: Held, resources: list[str], asked: LockSpec):  # noqa: D107
        self.outer = outer
        self.resources = resources
        self.asked = asked  # the nested semaphore
        self.using = asked.using  # where fence_transaction() writes

    def fence_transaction(self, using: str | None = None) -> None:
        fencing.fence_transaction(self, using if using is not None else self.using)

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
        # Its work may be in a transaction of its own database begun since its acquire (an
        # ``acquire()`` released in it): the hold outlives that transaction too.
        kept_for_commit(self.outer, self.asked)
        self.outer.release()

    def found_lost(self, reason: str, resource: str | None = None) -> NoReturn:
        self.outer.found_lost(reason, resource or self.resource)

    def __repr__(self) -> str:
        return f"<Held {self.resources!r} fence={self.fence} (nested in {self.outer!r})>"
