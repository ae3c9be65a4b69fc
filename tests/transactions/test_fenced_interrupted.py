"""Found by review (thirty-first session), failing before its mend: an interrupt
(KeyboardInterrupt from a signal handler, raising at any line) in fence_db's bookkeeping
(dynasem/_transactions/fencing.py begin()/end())."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from dynasem import semaphore
from dynasem._engine import core, reentry
from dynasem._operators import locks as operations
from dynasem._operators.locks import holds_on

pytestmark = pytest.mark.django_db(transaction=True)


class _InterruptedOnAtomic(reentry.Block):
    """A block's record, where a signal's KeyboardInterrupt lands as its atomic block is kept."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "atomic" and value is not None:
            raise KeyboardInterrupt
        super().__setattr__(name, value)


def test_an_interrupt_as_a_fenced_block_begins_closes_its_transaction_and_gives_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """begin(): the atomic block entered and the fence written, an interrupt at the line
    that records the block (``_opened.set``, outside begin's try; now the block's record's
    ``atomic``, inside it) left __enter__ without
    the block being entered: __exit__ never runs, so the transaction is never closed (the
    connection stays in_atomic_block: this thread's later work lands in a transaction that
    never commits) and the hold, entered, is never given back (renewed by its heartbeat until
    the process ends). Every other failure in begin() closes the block and gives back."""
    monkeypatch.setattr(core, "Block", _InterruptedOnAtomic)
    sem = semaphore("tbl:interrupted-begin", fence_db=True)
    with pytest.raises(KeyboardInterrupt):
        with sem:
            pytest.fail("the block must not run")
    _check_and_clean_up("tbl:interrupted-begin")


def test_an_interrupt_as_a_fenced_block_ends_closes_its_transaction_and_gives_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """end(): an interrupt at ``_opened.set`` (before end's try) skipped the block's exit
    and the undo: the transaction was left open and the hold never given back (__exit__'s
    leave() is not reached either). end() has no such line now (its atomic block is its
    record's): an interrupt at its first step, as the hold is checked, is handled
    (undo())."""

    def interrupted() -> None:
        raise KeyboardInterrupt

    sem = semaphore("tbl:interrupted-end", fence_db=True)
    with pytest.raises(KeyboardInterrupt):
        with sem as held:
            monkeypatch.setattr(held, "raise_if_lost", interrupted)
    _check_and_clean_up("tbl:interrupted-end")


def _check_and_clean_up(resource: str) -> None:
    """Assert the transaction closed and the hold given back; first undo what was left, so
    that a failure here does not leak into the next test of this worker."""
    connection = connections["default"]
    left_open = connection.in_atomic_block
    if left_open:
        connection.atomic_blocks.clear()
        connection.savepoint_ids.clear()
        connection.in_atomic_block = False
        connection.needs_rollback = False
        connection.rollback()
        connection.set_autocommit(True)
    held = holds_on(resource)
    for hold in held:
        operations.break_hold(resource, hold.token)
    assert (left_open, len(held)) == (False, 0), (
        f"transaction left open: {left_open}; holds left: {held}"
    )


@pytest.mark.reentry
@pytest.mark.parametrize("nested", [False, True])
def test_an_interrupt_as_a_fenced_blocks_end_begins_closes_its_transaction(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, nested: bool
) -> None:
    """end() at its first line: Ctrl-C (or a signal handler's exception) handled as the
    block's exit calls it, before its try (the interrupt stands in here for the signal at
    that call). The block was left, its exit does not run again: its transaction was left
    open (the connection in_atomic_block, its fence row locked: this thread's later work
    lands in a transaction that never commits, the next holder's fenced transaction waits
    on the row) while the exit left the hold to its lease. Mended: the transaction rolls
    back, its work lands nowhere; the hold is given back or left to its lease, never
    renewed for nobody."""
    from dynasem import release_all
    from dynasem._transactions import fencing
    from tests.engine.test_heartbeat import heartbeats_of

    resource = f"tbl:interrupted-end-begins-{nested}"
    sem = semaphore(resource, fence_db=True)
    real = fencing.end

    def end(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(fencing, "end", real)
        raise KeyboardInterrupt  # the signal, at end()'s first line

    def block() -> None:
        with pytest.raises(KeyboardInterrupt), sem:
            monkeypatch.setattr(fencing, "end", end)

    connection = connections["default"]
    try:
        if nested:
            with sem:
                block()
                assert connection.atomic_blocks[-1:] == [connection.atomic_blocks[0]], (
                    "the inner transaction is open"
                )
        else:
            block()
        assert heartbeats_of(resource) == [], "the hold is renewed on, for nobody"
    finally:
        release_all()
        _check_and_clean_up(resource)
