"""dynasem_lead and leadership at their edges (forty-first session, review a). Each test says
in its docstring what it shows and whether it failed before a mend."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dynasem._background import command_init


def test_the_init_starts_no_command_once_the_deadline_it_was_told_has_passed(
    tmp_path: Path,
) -> None:
    """``_Command`` writes the lead's trusted deadline on the control pipe before it starts
    the keeper, so that the init never runs the command untold. But the init forked and
    exec'd the command first and read the pipe only afterwards (``command_init._watch``):
    a dynasem_lead stopped (SIGSTOP, a frozen VM) between ``_lead``'s last look and the
    Popen, or a keeper slow to start (a loaded host), has its command started after the
    lead's trusted deadline, when another host may already run its own; only a race between
    the init's first look and the command's first instructions cuts it short, and a pause of
    the init there none. Here the init runs without a namespace (nothing kills what it
    started when it exits), told a deadline a second past: the command ran. Failed before
    the mend (the marker was written); now the init starts nothing."""
    marker = tmp_path / "ran"
    control_r, control_w = os.pipe()
    past = command_init._now() - 1.0
    os.write(control_w, f"{past:.6f}\n".encode())
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import command_init as c; "
        "sys.exit(c.init(int(sys.argv[2]), sys.argv[3:]))"
    )
    where = str(Path(command_init.__file__).parent)
    try:
        init = subprocess.run(
            [sys.executable, "-I", "-c", script, where, str(control_r), "touch", str(marker)],
            pass_fds=(control_r,),
            timeout=10,
            start_new_session=True,
        )
    finally:
        os.close(control_r)
        os.close(control_w)
    end = time.monotonic() + 1.0
    while not marker.exists() and time.monotonic() < end:
        time.sleep(0.02)
    assert not marker.exists(), (
        "the init started the command although the lead's deadline it had been told was "
        "already past"
    )
    assert init.returncode == command_init.FAILED
