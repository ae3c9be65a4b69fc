"""Review 38m: the liveness bound starts once the fault window's faults have played out,
a request of the window whose answer was lost included (its caller waits its read timeout,
10 s, past the window's end)."""

from __future__ import annotations

from tests.support.sim.runtime import Options, run


def test_a_lost_answer_of_the_window_delays_the_idle_clock() -> None:
    """Seed 8806 of shared_pairs (reader items), interrupts_heavy: interrupted releases left
    ``rw`` counting readers that are gone (one count-down never sent, one item left to its
    lease), so its queued writer may sweep them only once the row's last admission is a
    lease and the skew old. A reader's admission applied at 58.8 s, its answer lost: its
    caller's read timeout ran to 68.8 s, past the window's end (60 s), and its confirming
    write then stamped the row again: the writer swept at 80.1 s and the pairs waiting for
    ``rw`` and ``s`` took both at 80.5 s, ``s`` idle 20 s after the window, 11.7 s after the
    lost answer's timeout (the bound: 15 s). The protocol as documented; the monitor started
    its clock at the window's end."""
    options = Options(
        seed=8806, mix="shared_pairs", faults="interrupts_heavy", permits_from=1, readers_from=0
    )
    result = run(options)
    result.raise_if_violated()
    assert result.stats["lost"] > 0
