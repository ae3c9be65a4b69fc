"""One leader among many processes and hosts: ``with dynasem.leadership("beat") as lead``.

A leadership is an exclusive hold of the resource ``leader:<name>``, waited for as long as it
takes (``wait=math.inf``, queued first come first served), renewed by the heartbeat, given
back when the block ends. What a leader must know is when to stop acting as one:

* ``lead.active``: True while the hold is ours and its trusted deadline (``lease -
  CLOCK_SKEW`` after the last renewal was sent) is ahead. Another process can take over only
  after that deadline, so work checked against ``lead.active`` (or ``lead.seconds_left()``)
  never overlaps another leader's, given clocks within ``CLOCK_SKEW``. It is False from the
  moment the block ends, before the lead is given back: the next contender may take it then.
* ``on_lost(lead)``: called once, from the heartbeat's thread, when the hold is known lost
  (a renewal refused, or the deadline passed without one); ``lead.wait_lost(timeout)``
  blocks until then.

A leader host that dies is replaced within ``lease + CLOCK_SKEW`` plus one look of the next
contender after its last renewal; a leader cut off from DynamoDB stops trusting its lead at
its deadline, before anyone else can take it. ``manage.py dynasem_lead NAME -- command``
runs a command only while this process leads (``dynasem.management.commands.dynasem_lead``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .._engine.arguments import LEADER_PREFIX, check_resource
from .._engine.hold import Held, delivering, exit_cut_short, when_lost
from .._engine.reentry import Block, exit_failed, left, opened
from ..exceptions import LockLost

__all__ = ["Lead", "Leadership", "leadership", "resource_of"]


def resource_of(name: str) -> str:
    """The resource a leadership named ``name`` holds; a TypeError or ValueError naming the
    name (not the resource it makes) if it cannot name one."""
    return check_resource(name, "a leadership's name", LEADER_PREFIX)


class Lead:
    """This process's lead, while the ``leadership`` block runs (``name``, and the ``held``
    hold under it)."""

    def __init__(self, name: str, held: Held, on_lost: Callable[[Lead], Any] | None):
        self.name = name
        self.held = held
        self._on_lost = on_lost
        self._lost = threading.Event()
        self._once = threading.Lock()
        # Set before the hold is given back: from then on another may lead at any moment.
        self._given_back = False
        # Told by the hold itself, not through lock_lost: a project's receiver that raises
        # would keep the signal from reaching us.
        when_lost(held, self._heard_lost)
        if held.lost:  # lost before we listened
            self._lost_now()

    @property
    def fence(self) -> int:
        """Larger than every earlier leader's: hand it to what the leader writes."""
        return self.held.fence

    @property
    def active(self) -> bool:
        """The lead is ours and its trusted deadline is ahead (False once given back, and in
        a child forked inside the block)."""
        if self._given_back:
            return False
        if not self.held.here:
            # A child forked inside the block: its copy is never trusted (hold.FORKED), but
            # the lead is its parent's and not lost: on_lost is no business of the child's.
            return False
        if self._lost.is_set() or self.held.lost:
            self._lost_now()
            return False
        return self.held.seconds_left() > 0

    def seconds_left(self) -> float:
        """How long the lead can be trusted without another renewal (0 once lost)."""
        return 0.0 if not self.active else self.held.seconds_left()

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lead is lost or given back (True) or ``timeout`` passed (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.active:
            # The deadline passes without a signal until the heartbeat notices: look often.
            step = 0.05 if end is None else min(0.05, end - time.monotonic())
            if step <= 0:
                return False
            self._lost.wait(step)
        return True

    def _heard_lost(self) -> None:
        if not self._given_back:  # lost as its block gives it back: no loss to report
            self._lost_now()

    def _lost_now(self) -> None:
        with self._once:
            if self._lost.is_set():
                return
            self._lost.set()
        if self._on_lost is not None:
            self._on_lost(self)

    def _give_up(self) -> None:
        """Inactive from now on, and deaf to a loss: the block is giving the lead back,
        which is no loss to report."""
        self._given_back = True

    def __repr__(self) -> str:
        state = "given back" if self._given_back else "active" if self.active else "lost"
        return f"<Lead {self.name!r} fence={self.fence} {state}>"


@dataclasses.dataclass(eq=False)  # entered leads are found by its identity
class Leadership:
    """``with leadership(name) as lead`` / ``async with``: wait until this process leads."""

    name: str
    semaphore: Any  # the leadership's Semaphore (core imports nothing of this module)
    on_lost: Callable[[Lead], Any] | None

    def __enter__(self) -> Lead:
        block = Block(self, sys._getframe(1))
        # Guarded whole, as a semaphore block's entry: an interrupt as the Lead is made or
        # entered gives the hold back, never leaves it renewed for nobody.
        return delivering(
            lambda: opened(block, Lead(self.name, self.semaphore.acquire(), self.on_lost))
        )

    def __exit__(self, *exc: Any) -> None:
        lead = left(self, sys._getframe(1), "leadership").value
        held = lead.held
        depth = getattr(held, "outer", held).depth  # plain attributes: no signal lands here
        try:
            self._give_back(lead)
        except BaseException as failure:  # an interrupt before the release began: not kept
            exit_cut_short(held, depth, failure)
            if exc[0] is None or not isinstance(failure, Exception):
                raise
            exit_failed(held, failure)  # the block's own exception goes on, as a semaphore's

    async def __aenter__(self) -> Lead:
        block = Block(self, sys._getframe(1))
        return opened(block, Lead(self.name, await self.semaphore.aacquire(), self.on_lost))

    async def __aexit__(self, *exc: Any) -> None:
        from .._engine.steps import announced_after, run_io_to_end

        lead = left(self, sys._getframe(1), "leadership").value
        lead._give_up()  # inactive now, not once the executor gets to the release
        # lock_released sent here, as an async block's is (steps.announced_after).
        raised = exc[0] is not None
        failed = functools.partial(exit_failed, lead.held) if raised else None
        try:
            await announced_after(run_io_to_end(self._give_back, lead), failed)
        except Exception as failure:
            if not raised:
                raise
            exit_failed(lead.held, failure)  # the block's own exception goes on

    @staticmethod
    def _give_back(lead: Lead) -> None:
        lead._give_up()
        # Lost while leading: on_lost was told; losing a lead is no error here.
        with contextlib.suppress(LockLost):
            lead.held.release()


def leadership(
    name: str,
    *,
    lease: float | None = None,
    wait: float = math.inf,
    user: Any = None,
    on_lost: Callable[[Lead], Any] | None = None,
) -> Leadership:
    """Lead ``name`` among every process and host using the same table:
    ``with leadership(name) as lead`` (or ``async with``) waits until this process leads (up
    to ``wait`` seconds, forever by default; ``SemaphoreBusy`` after it) and gives the lead
    back when the block ends.

    Act as the leader only while ``lead.active``: nobody else can take over before this lead's
    trusted deadline, so such work never overlaps another leader's (given clocks within
    ``CLOCK_SKEW``). ``on_lost(lead)`` is called once, from the heartbeat's thread, when the
    lead is known lost. ``lease``: seconds (default: the LEASE setting); a leader that dies is
    replaced about ``lease + CLOCK_SKEW`` after its last renewal. See the how-to guide "One
    leader among many hosts"."""
    from .._engine.core import semaphore  # core imports nothing of this module

    resource = resource_of(name)
    if on_lost is not None and not callable(on_lost):
        raise TypeError(f"on_lost must be callable, not {on_lost!r}")
    # Not tied to a transaction: a lead is given back when its block ends.
    sem = semaphore(
        resource,
        lease=lease,
        wait=wait,
        user=user,
        on_commit=False,
        fair=True,
        metrics_name=resource,  # one per election: a bounded name
    )
    return Leadership(name, sem, on_lost)
