"""Review (thirty-seventh session, e): a worker forked without Python's at-fork hooks (uWSGI,
unless ``py-call-osafterfork``) while a thread of its master was inside a module lock of
dynasem's hand-over pushes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ctypes fork of libc")
@pytest.mark.parametrize("held", ["_lock", "_words_lock"])
def test_a_child_forked_without_hooks_while_a_push_lock_was_held_hands_over(
    dynamodb_local: str, lock_table: str, held: str
) -> None:
    """The child inherited the lock held, with no thread to give it back (replaced only by an
    at-fork hook): its first wait (``_lock``: the push listener opened) or its first hold
    (``_words_lock``: registered for words) waited on it for ever. Mend: a module lock of
    ``push`` made in another process is replaced before use, as ``steps.io_executor`` and
    ``dynamodb.get_client`` do."""
    code = (
        "from tests.support.workers import hand_over_in_a_child_forked_without_hooks as run\n"
        f"run({dynamodb_local!r}, {lock_table!r}, 'r37e-fork{held}', {held!r})\n"
    )
    master = subprocess.run(
        [sys.executable, "-c", code],
        cwd=WT,
        env={**os.environ, "PYTHONPATH": WT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert master.returncode == 0, master.stderr
    assert master.stdout.strip() == "ok"
