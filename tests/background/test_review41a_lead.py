"""dynasem_lead and leadership at their edges (forty-first session, review a). Each test says
in its docstring what it shows and whether it failed before a mend."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dynasem._background import command_init


class _Lead:
    """A lead with ``left`` seconds of trust and nothing that renews it (dynasem_lead stopped,
    or DynamoDB unreachable)."""

    fence = 11

    def __init__(self, left: float) -> None:
        self.deadline = time.monotonic() + left
        self.held = self

    def renew(self) -> None:
        pass  # sent, never answered

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


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


def test_a_stop_that_comes_during_the_renewal_before_the_command_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``handle`` starts nothing when SIGTERM came with the lead (``stopping`` checked before
    ``_lead``), but ``_lead`` then renews a lead that came with little trust: a DynamoDB round
    trip, retried for seconds in an outage. SIGTERM then (a process manager stopping the
    service) started the command all the same, and the loop sent it SIGTERM at its first
    look: a command begun after this process was told to stop. Failed before the mend (the
    command was started, then stopped); now nothing starts."""
    from dynasem.management.commands import dynasem_lead

    started: list[Any] = []

    class Child:
        def __init__(self, *args: Any) -> None:
            started.append(self)
            self.process = type("P", (), {"pid": 4141})()
            self.termed = False

        def poll(self) -> int | None:
            return 143 if self.termed else None

        def trust_until(self, deadline: float) -> None:
            pass

        def terminate(self) -> None:
            self.termed = True

        def kill(self) -> None:
            pass

    stopping = threading.Event()

    class StoppedAsRenewed(_Lead):
        def renew(self) -> None:
            stopping.set()  # SIGTERM while the renewal is on its way
            self.deadline = time.monotonic() + 3.0

    monkeypatch.setattr(dynasem_lead, "_Command", Child)
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command._own_pids = True
    lead = StoppedAsRenewed(left=1.0)
    status = command._lead("beat", lead, ["true"], 0.9, stopping)  # type: ignore[arg-type]
    assert status is None
    assert not started, "the command was started after this process was told to stop"


def test_a_command_the_init_s_watchdog_ended_is_not_reported_as_its_own_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dynasem_lead stopped (SIGSTOP, a frozen VM) past its lead's trusted deadline: the init
    ends the namespace by itself and exits FAILED (125), the watcher (--no-pid-namespace)
    SIGKILLs its group (137). Resumed, ``_lead`` found the command ended without having
    stopped it (``termed`` None) and returned that status as the command's own: dynasem_lead
    said "the command exited (125)" and exited 125 instead of competing again, as it does
    whenever the lead's end stopped the command (a process manager without a restart policy
    leaves this host without a candidate for good). Failed before the mend (``_lead`` returned
    125); now an end found after the lead ran out is a stop."""
    from dynasem.management.commands import dynasem_lead

    lead = _Lead(left=1.0)

    class EndedByTheWatchdog:
        def __init__(self, *args: Any) -> None:
            self.process = type("P", (), {"pid": 4242})()
            self.polls = 0

        def poll(self) -> int | None:
            self.polls += 1
            if self.polls == 1:
                return None
            # dynasem_lead was stopped here, past the lead's deadline; the init's watchdog
            # ended the namespace meanwhile.
            time.sleep(max(0.0, lead.deadline + 0.2 - time.monotonic()))
            return command_init.FAILED

        def trust_until(self, deadline: float) -> None:
            pass

        def terminate(self) -> None:
            pass

        def kill(self) -> None:
            pass

    monkeypatch.setattr(dynasem_lead, "_Command", EndedByTheWatchdog)
    command = dynasem_lead.Command(stdout=io.StringIO(), stderr=io.StringIO())
    command._own_pids = True
    status = command._lead("beat", lead, ["true"], 0.3, threading.Event())  # type: ignore[arg-type]
    assert status is None, f"the watchdog's end was reported as the command's exit ({status})"


@pytest.mark.parametrize("own_pids", [True, False], ids=["pid namespace", "watcher"])
def test_a_command_that_cannot_be_run_exits_127_and_says_why(
    own_pids: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    """The command's exec failing (no such program, no permission): the init's child, or the
    watcher's, says so on stderr and exits 127, the shell's status for it, which the init
    (or the watcher) and then dynasem_lead pass on as the command's status. Untested until
    now (a coverage test: it passed before this review)."""
    from dynasem.management.commands import dynasem_lead

    if (
        own_pids
        and subprocess.run(
            [sys.executable, "-I", dynasem_lead.COMMAND_INIT, "--probe"], capture_output=True
        ).returncode
    ):
        pytest.skip("no pid namespace on this machine")
    missing = "/nonexistent/rv41a-no-such-program"
    deadline = command_init._now() + 10.0
    child = dynasem_lead._Command([missing, "x"], dict(os.environ), own_pids, deadline)
    try:
        child.process.wait(10)
        assert child.poll() == 127
    finally:
        child.kill()
    assert f"dynasem_lead: cannot run {missing!r}" in capfd.readouterr().err
