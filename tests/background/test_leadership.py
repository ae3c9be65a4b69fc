"""``dynasem.leadership``'s ``Lead`` in one process: what a lead says about itself once its
block has given it back (tests/background/test_lead.py has elections across processes and hosts)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from dynasem import Lead, leadership
from tests.support.helpers import wait_for

LEASE = 5.0  # CLOCK_SKEW is the test settings' 0.5 s: a lead trusted for 4.5 s


def assert_given_back(lead: Lead) -> None:
    assert not lead.active
    assert lead.seconds_left() == 0.0
    assert lead.wait_lost(0.01)  # over: nothing to wait for
    assert "given back" in repr(lead)


def test_a_lead_given_back_is_inactive_at_once_while_the_next_leads(lock_table: str) -> None:
    lost: list[Lead] = []
    seconds: list[Lead] = []
    leading = threading.Event()
    done = threading.Event()

    def second() -> None:
        with leadership("jobs", lease=LEASE) as lead:
            seconds.append(lead)
            leading.set()
            done.wait(10)

    thread = threading.Thread(target=second)
    with leadership("jobs", lease=LEASE, on_lost=lost.append) as first:
        thread.start()
        assert first.active and first.seconds_left() > 0
    try:
        # Given back, not lost: well inside the old trusted deadline, while the other leads.
        assert leading.wait(10), "the second contender never led"
        assert seconds[0].active
        assert_given_back(first)
        assert lost == []  # on_lost is for a lead lost while leading, not one given back
    finally:
        done.set()
        thread.join(10)


def test_an_async_lead_given_back_is_inactive_at_once(lock_table: str) -> None:
    async def main() -> tuple[Lead, bool]:
        async with leadership("jobs", lease=LEASE) as first:
            assert first.active
        async with leadership("jobs", lease=LEASE, wait=0) as second:
            return first, second.active

    first, second_active = asyncio.run(main())
    assert second_active
    assert_given_back(first)


@pytest.mark.reentry
def test_a_nested_lead_given_back_leaves_the_outer_one_active(lock_table: str) -> None:
    """A nested ``with leadership(name)`` re-enters the outer hold: its end gives back
    nothing, so only its own Lead is over."""
    with leadership("jobs", lease=LEASE) as outer:
        with leadership("jobs", lease=LEASE) as inner:
            assert inner.active and inner.fence == outer.fence
        assert_given_back(inner)
        assert outer.active and outer.seconds_left() > 0
    assert_given_back(outer)


def test_a_lead_lost_and_then_given_back_told_on_lost_once(lock_table: str) -> None:
    from dynasem._operators.locks import break_hold, holds_on

    lost: list[Any] = []
    with leadership("jobs", lease=LEASE, on_lost=lost.append) as lead:
        (hold,) = holds_on("leader:jobs")
        break_hold("leader:jobs", hold.token)
        wait_for(lambda: lead.wait_lost(0.05), 10, "the broken lead never read as lost")
        assert not lead.active
    assert lost == [lead]
    assert not lead.active and lead.seconds_left() == 0.0
