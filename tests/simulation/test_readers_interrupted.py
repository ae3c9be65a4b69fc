"""Found by review (thirty-first session) in that session's own mend 77f7d2a, fixed by the
undo's tombstone that bars the item's write on the wire (reader_items.bar_reader): the
simulator's seed 110 of ``breaks`` under ``interrupts`` (every reader in
an item, the counting pair in permits, 30 % of acquisitions interrupted). A long reader's
admission is interrupted while its item's write is in flight: the driver gives back the item's
Write (its undo finds no item and counts the reader down on the row's mark), the item's write
lands, and the driver gives back the admission's row Write too (its undo, new in 77f7d2a,
deletes the item and counts the reader down again). The count goes one below the readers
holding, and the writer enters ``rw`` beside a trusted item reader at t=0.52. Passed on
39fdb73 (seeds 1-200 of these options: none fails); on 77f7d2a, seed 110 of 5-200 failed.
tests/engine/test_readers_ghost.py reproduces the same on DynamoDB Local."""

from __future__ import annotations

import pytest

from tests.support.sim.runtime import Options, run


@pytest.mark.reentry  # dynasem's own rule, as in ``python -m tests.support.sim``
def test_seed_110_of_breaks_under_interrupts_keeps_writers_apart_from_readers() -> None:
    options = Options(
        seed=110,
        mix="breaks",
        faults="interrupts",
        readers_from=0,
        permits_from=1,
        interrupts=0.3,
    )
    result = run(options)
    result.raise_if_violated()


@pytest.mark.reentry
@pytest.mark.parametrize("seed", [10, 14, 27, 134])
def test_long_readers_under_interrupts_keep_writers_apart_from_readers(seed: int) -> None:
    """No operator: readers (every one in an item) and writers, 30 % of acquisitions
    interrupted. Seeds 10, 14, 27 and 134 of 1-300 failed on 77f7d2a (seed 14: p104's admission
    interrupted after the row's answer, its item's delete refused, the item's write lands,
    the row Write's undo deletes it: counted down twice), none of them on 39fdb73."""
    options = Options(
        seed=seed, mix="long_readers", faults="interrupts", readers_from=0, interrupts=0.3
    )
    run(options).raise_if_violated()
