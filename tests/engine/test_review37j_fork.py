"""Review (thirty-seventh session, j): a child forked while a thread of its parent was inside
the lock of one of dynasem's signals (Django's ``Signal`` keeps one per signal, taken by every
send that has receivers), with or without Python's at-fork hooks."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from dynasem.signals import lock_acquired, lock_released
from tests.observability.test_review37h_fork import _holds_in_a_child

needs_libc_fork = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="ctypes fork of libc"
)


def _heard(**kwargs: Any) -> None:
    pass


@pytest.mark.parametrize(
    "hooks", [True, pytest.param(False, marks=needs_libc_fork)], ids=["fork", "no hooks"]
)
@pytest.mark.parametrize("signal", [lock_acquired, lock_released], ids=["acquired", "released"])
def test_a_child_forked_while_a_thread_sent_a_signal_can_still_lock(
    lock_table: str, hooks: bool, signal: Any
) -> None:
    """A thread of the parent was sending a signal with receivers (a hold taken or given
    back: Django's ``Signal`` reads them under its lock) as the process forked (a pre-forking
    master, multiprocessing): the child's copy of that lock stayed held for good (Django
    makes no at-fork hook), and the child's first hold waited on it for ever as it sent
    ``lock_acquired``, or as its block's end sent ``lock_released``."""
    signal.connect(_heard, dispatch_uid="r37j-fork")
    try:
        assert _holds_in_a_child(signal.lock, hooks) == "ok"
    finally:
        signal.disconnect(dispatch_uid="r37j-fork")
