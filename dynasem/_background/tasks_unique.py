"""Unique ``django.tasks`` tasks (Django >= 6.0; reach them as
``dynasem.django_tasks.unique_task``)::

    from dynasem.django_tasks import unique_task

    @unique_task(unique_key="reindex:{project_id}", queue_lease=600)
    def reindex(project_id): ...

    reindex.enqueue(42)   # a TaskResult; a second reindex.enqueue(42) while that task is
                          # queued or running enqueues nothing and returns None

``unique_task`` takes ``@task``'s arguments too (priority, queue_name, backend,
takes_context) and makes a :class:`UniqueTask`, a ``django.tasks.Task``. The key is taken at
enqueue for ``queue_lease`` seconds and travels with the task in a keyword argument
(``dynasem_claim``, seen in the stored arguments, never by the function); the worker that
starts the task holds it for the run (``run_lease``, the LEASE setting by default), renewed
by the heartbeat, and gives it back when the task returns or raises. A task enqueued again
from its own run with the same key (a retry, e.g. ``dynasem.django_tasks.retry_later``)
keeps the key: it goes on with the new task, for ``queue_lease`` again. A task that never
starts frees the key when the queue lease ends; a worker killed mid-task, when the run lease
ends.

A refused enqueue returns None (and logs the claim that holds the key): django.tasks gives a
task its id when the backend stores it, after the key is taken, and recording it would cost
every enqueue a second write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import string
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.tasks import Task  # type: ignore[import-not-found, unused-ignore]
from django.tasks import task as django_task  # type: ignore[import-not-found, unused-ignore]

from .._engine.decorators import KeyMaker
from .._engine.hold import Held
from .._engine.steps import announced_after, ended, run_io_taking, run_io_to_end
from . import unique
from .unique import Claim

CLAIM_ARG = "dynasem_claim"

if TYPE_CHECKING:
    _Task = Task[Any, Any]
else:
    _Task = Task  # not generic at run time


@dataclass(frozen=True, slots=True, kw_only=True)
class UniqueTask(_Task):
    """A ``django.tasks`` task whose key (``unique_key``, a template over its arguments as
    the decorator's, or a callable of them) is held from enqueue to the end of its run. Made
    by ``unique_task``."""

    unique_key: Any = None
    queue_lease: float = 600.0
    run_lease: float | None = None  # the LEASE setting

    def __post_init__(self) -> None:
        Task.__post_init__(self)  # the backend's checks (a slotted dataclass: no super())
        if self.unique_key is None:
            raise TypeError(
                f"{self.name}: a unique task needs unique_key=, e.g. "
                '@unique_task(unique_key="reindex:{project_id}")'
            )
        # A bad template is refused here, not at enqueue; so are several (a decorator's
        # resources): a task has one key, and each enqueue would be refused for it.
        if isinstance(self.unique_key, list | tuple):
            raise TypeError(
                f"{self.name}: unique_key must be one str template or a callable (a task has "
                f"one key), not {type(self.unique_key).__name__}: {self.unique_key!r}"
            )
        KeyMaker(self.unique_key, self.func, f"{self.name}: unique_key")
        # Its fields must name the function's parameters (unless it takes ``**``).
        params = inspect.signature(self.func).parameters
        if isinstance(self.unique_key, str) and all(
            p.kind is not inspect.Parameter.VAR_KEYWORD for p in params.values()
        ):
            for _, field, _, _ in string.Formatter().parse(self.unique_key):
                head = (field or "").split(".", 1)[0].split("[", 1)[0]
                if head and not head.isdigit() and head not in params:
                    raise TypeError(
                        f"{self.name}: unique_key {self.unique_key!r} names {head!r}, which is "
                        f"not a parameter of {self.name}{inspect.signature(self.func)}"
                    )
        # Refused now, not by the worker's adoption once the key is claimed (see check_leases);
        # CLOCK_SKEW, a setting that may change, is asked at each enqueue.
        unique.check_leases(self.name, self.queue_lease, self.run_lease, against_skew=False)

    def unique_resource(self, args: Any, kwargs: Any) -> str:
        if self.takes_context:
            args = (None, *args)  # the context the worker passes first
        return unique.key_for(self.name, KeyMaker(self.unique_key, self.func), args, kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        # The claim in our guard before _claim returns: an interrupt as it returns (a
        # signal handler's: a web worker's timeout) withdraws it too, never leaves the key
        # held for a task never enqueued, for the queue lease.
        made: list[Claim] = []
        try:
            claimed, _ = self._claim(args, kwargs, made)
            if claimed is None:
                return None
            return self._backend().enqueue(self, args, {**kwargs, CLAIM_ARG: claimed.header()})
        except BaseException:
            unique.withdraw_made(made)  # not enqueued
            raise

    async def aenqueue(self, *args: Any, **kwargs: Any) -> Any:
        claiming = functools.partial(self._claim, args, kwargs)
        claimed, run = await run_io_taking(claiming, self._unclaim)
        if claimed is None:
            return None
        claim = {**kwargs, CLAIM_ARG: claimed.header()}
        sending = asyncio.ensure_future(self._backend().aenqueue(self, args, claim))
        try:
            return await asyncio.shield(sending)
        except BaseException:
            # Cancelled, the backend may store the task all the same (sync_to_async's thread
            # goes on): then its claim stays, or a worker would refuse to run it. Withdrawn
            # only if the task was not stored (or we cannot know: its enqueue cancelled).
            await ended(sending)
            if sending.cancelled() or sending.exception() is not None:
                # A claim given back: lock_released sent here, as an async release's is;
                # a receiver's exception logged, the enqueue's own goes on.
                withdrawn = run_io_to_end(unique.withdraw, claimed, run)
                await announced_after(withdrawn, ending=True)
            raise

    def _claim(
        self, args: Any, kwargs: Any, made: list[Claim] | None = None
    ) -> tuple[Claim | None, tuple[Claim, Held] | None]:
        """The claim the task's arguments carry (None: not to be enqueued), and the run of
        this task going on here with its key, if any (enqueued from it: the key goes on).
        ``made``: as :func:`unique.claim_for`'s."""
        kwargs.pop(CLAIM_ARG, None)  # a result's kwargs enqueued again: not that claim
        unique.check_leases(self.name, self.queue_lease, self.run_lease)
        resource = self.unique_resource(args, kwargs)
        run = unique.current_run(self.module_path, resource)
        task_id = uuid.uuid4().hex
        try:
            claimed = unique.claim_for(
                self.module_path, resource, task_id, self.queue_lease, run, made
            )
            return claimed, run
        except unique.Taken:
            return None, None

    @staticmethod
    def _unclaim(taken: tuple[Claim | None, tuple[Claim, Held] | None]) -> None:
        """What :meth:`_claim` took, given back: the enqueue it was for was cancelled."""
        claimed, run = taken
        if claimed is not None:
            unique.withdraw(claimed, run)

    def _backend(self) -> Any:
        # Any: BaseTaskBackend.enqueue is annotated with a list of args; Task.enqueue passes
        # its tuple, as we do.
        return self.get_backend()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        # Without a claim (called directly, enqueued by another Task class), or a retry run
        # at once inside the run that enqueued it (ImmediateBackend): run as it is.
        carried = Claim.from_header(kwargs.pop(CLAIM_ARG, None))
        call = functools.partial(Task.call, self, *args, **kwargs)
        return unique.run(self.module_path, self, carried, call)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        carried = Claim.from_header(kwargs.pop(CLAIM_ARG, None))
        if carried is None or unique.inline_retry(carried) is not None:
            return await Task.acall(self, *args, **kwargs)
        start = functools.partial(
            unique.start_run, self.module_path, carried, self.run_lease, wait=False
        )
        nap = unique.FIRST_NAP
        while True:
            try:
                held = await run_io_taking(start, functools.partial(self._unstart, carried))
                break
            except unique.RunNotEnded:
                # The run that enqueued this retry goes on: wait for it here, on the loop (a
                # cancel is honoured at once), not in a thread of dynasem's executor.
                await asyncio.sleep(nap)
                nap = min(nap * 2, unique.LAST_NAP)
        if held is None:
            return None
        try:
            with unique.running(held, self.module_path, carried):
                return await Task.acall(self, *args, **kwargs)
        finally:
            # lock_released sent here, as an async block's is (steps.announced_after).
            finish = run_io_to_end(
                unique.finish_run, self.module_path, carried, held, self.queue_lease
            )
            failed = functools.partial(unique.finish_failed, self.module_path, carried)
            await announced_after(finish, failed)

    def _unstart(self, carried: Claim, held: Held | None) -> None:
        """The run's hold (if it was adopted), given back: the run was cancelled before its
        task began."""
        if held is not None:
            unique.finish_run(self.module_path, carried, held, self.queue_lease)


def unique_task(
    function: Any = None,
    *,
    unique_key: Any,
    queue_lease: float = 600.0,
    run_lease: float | None = None,
    **task_options: Any,
) -> Any:
    """``@task`` (with its options: priority, queue_name, backend, takes_context) making a
    ``UniqueTask`` keyed by ``unique_key``: a second ``enqueue()`` while one is queued or
    running enqueues nothing and returns ``None``.

    ``unique_key``: a template over the task's arguments as the decorator's
    (``"reindex:{project_id}"``), or a callable of them; ``queue_lease``: seconds the key is
    held for a task waiting in the queue; ``run_lease``: the lease while it runs (default: the
    LEASE setting), renewed by the heartbeat. A task enqueued again from its own run (a retry)
    keeps the key; a task that never starts frees it when the queue lease ends."""

    def wrap(func: Any) -> UniqueTask:
        made = django_task(func, **task_options)  # validates the options as @task does
        # Every field @task filled in, whichever they are: Django 6.0's Task requires
        # run_after (6.1 gave it a default), and a later Django may add more.
        fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(made) if f.init}
        return UniqueTask(
            unique_key=unique_key, queue_lease=queue_lease, run_lease=run_lease, **fields
        )

    return wrap(function) if function is not None else wrap
