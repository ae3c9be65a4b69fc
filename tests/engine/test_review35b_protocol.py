"""Review 35b (today's mends: take_join's expMs, the skew's floor, the reaper's bucket, run_once,
unique tasks, dynasem_lead's watcher). Each test fails on the code it was written against."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._operators import reaper
from dynasem._storage import index_queries, lock_rows, records

pytestmark = pytest.mark.django_db(transaction=False)

SKEW = 0.5  # tests/conftest.py's CLOCK_SKEW


# -- the reaper's dry run and its delete ---------------------------------------------------------


def test_a_dry_run_reaps_only_what_the_delete_would(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c617ba6 made the delete also ask ``#exp < :before`` (the row's own bucket passed), for
    a row an index lagging behind it still lists under an old bucket. ``_would_reap`` still
    reads only ``expMs`` ("as delete_expired's condition reads it"), and ``get_many`` gives
    each row the index entry's bucket, not its own: the dry run lists as reaped a row that
    the reap itself keeps (the very row the mend keeps)."""
    resource = "r35b:reap"
    semaphore(resource, lease=2).acquire().release()  # idle from now; its bucket is ahead
    row = lock_rows.get(resource)
    assert row is not None and row.listed_s is not None
    time.sleep(2 * SKEW + 0.3)  # its expMs (our fence's time: now + SKEW) is CLOCK_SKEW old
    lagging = records.IndexEntry(resource, row.listed_s - records.BUCKET_S, records.Mode.EXCLUSIVE)
    shard = records.shard_of(resource)
    original = index_queries.query_expiring

    def listed(s: int, **kwargs: Any) -> Any:
        if kwargs.get("before") is not None:  # the rows' listing: the lagging entry alone
            return ([lagging] if s == shard else []), None
        return original(s, **kwargs)

    monkeypatch.setattr(index_queries, "query_expiring", listed)
    would: list[str] = []
    dry = reaper.reap(dry_run=True, found=lambda entry: would.append(entry.resource))
    real = reaper.reap()
    assert real.deleted == 0 and lock_rows.get(resource) is not None, "the delete took it"
    assert dry.found - dry.survived == real.deleted and not would, (
        f"the dry run would reap {would}, the reap deleted {real.deleted}"
    )


# -- the skew's floor (2a6d4ce) and the system checks ----------------------------------------------


def test_the_checks_refuse_a_lease_every_acquire_refuses() -> None:
    """Every acquire now counts CLOCK_SKEW as at least 2 ms (``arguments.skew_setting``) and
    refuses a lease no longer than that (resolve_timing: ValueError); ``checks._timings``
    still compares LEASE with the raw CLOCK_SKEW, so CLOCK_SKEW = 0 with LEASE = 0.002 passes
    the system checks (E009 says nothing) and fails every acquire at run time."""
    from django.test import override_settings

    from dynasem._engine import arguments
    from dynasem.checks import check_settings

    valid = {
        "TABLE_NAME": "locks",
        "ENDPOINT_URL": "http://127.0.0.1:1",
        "REGION_NAME": "eu-west-1",
    }
    with override_settings(DYNASEM={**valid, "LEASE": 0.002, "WAIT": 0, "CLOCK_SKEW": 0}):
        with pytest.raises(ValueError, match="longer than"):
            arguments.resolve_timing(None, None)
        assert "dynasem.E009" in [m.id for m in check_settings()], "the checks let it pass"


# -- run_once: a confirmation answered late too (df8350d) ------------------------------------------


def test_a_run_once_claim_confirmed_late_is_not_trusted_with_less_than_its_margin(
    lock_table: str,
) -> None:
    """df8350d confirms a claim answered with under a third of its trust left, once: the
    confirming renewal's answer can come late too (the same network, a second pause), and the
    body then begins with what is left of it, unchecked. An acquire (core.Acquire.confirmed)
    and a unique task's adoption (unique._renewed) check the trust again after each
    confirmation, confirm again or give up (too_slow). Here the claim and its confirmation
    each answer NEARLY a trusted window late: the body began with about 0.3 s of trust."""
    from dynasem import run_once

    from .test_review35_time import LEASE, MARGIN, NEARLY, LateJobAnswers, job_claim, job_renewal

    with LateJobAnswers(job_claim, NEARLY) as late_claim:
        with LateJobAnswers(job_renewal, NEARLY) as late_confirm:
            try:
                with run_once("file:late2.txt", lease=LEASE) as job:
                    left = job.seconds_left()
            except Exception as refused:  # given up as too slow: the body never began
                left, why = float("inf"), refused
            else:
                why = None
    assert late_claim.fired == 1 and late_confirm.fired == 1, "the late answers were missed"
    assert left >= MARGIN, (
        f"the body began with {left:.3f}s of trust, less than {MARGIN:.3f}s ({why})"
    )


# -- dynasem_lead: a lead that could not be renewed before its command (3586f85) -------------------


def test_dynasem_lead_starts_no_command_for_a_lead_known_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3586f85 renews a lead that comes with little trust before its command starts, and
    swallows LockLost ("Failed, the loop below stops it in time"): the command is started all
    the same, under a lead known lost (``seconds_left()`` 0, its deadline now), while another
    host may hold it and run its own. The command runs until the loop's first look (SIGTERM
    and SIGKILL at once) or the watcher's read of a deadline already past: whatever it does
    in its first moments is done twice at once. It must not start."""
    import threading

    from dynasem.exceptions import LockLost
    from dynasem.management.commands import dynasem_lead

    class LostHeld:
        def renew(self) -> None:
            raise LockLost("lead:r35b", "taken over")

    class LostLead:
        fence = 7
        held = LostHeld()

        def seconds_left(self) -> float:
            return 0.0

    started: list[list[str]] = []

    class Recorded:
        def __init__(self, command: list[str], *args: Any) -> None:
            started.append(command)
            raise RuntimeError("the command was started")

    monkeypatch.setattr(dynasem_lead, "_Command", Recorded)
    cmd = dynasem_lead.Command()
    cmd._own_pids = False
    try:
        status = cmd._lead("r35b", LostLead(), ["true"], 1.0, threading.Event())  # type: ignore[arg-type]
    except RuntimeError:
        status = "started"
    assert not started, f"the command {started[0]} was started under a lost lead ({status})"


# -- dynasem_lead --no-pid-namespace: the watcher (875fb28) --------------------------------------


def _group_members(pgid: int) -> list[int]:
    import os

    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            found.append(int(name))
    return found


def test_the_watcher_leaves_nothing_of_the_group_past_the_lead_s_deadline(tmp_path: Any) -> None:
    """With a pid namespace, the command's exit ends its init, and the kernel kills whatever
    is left in the namespace. Behind the watcher, the command's exit ends the watcher (with
    the command's status), and what the command left in its group (``cmd &``) lives on,
    watched by nobody but dynasem_lead's loop: a dynasem_lead stopped (SIGSTOP, the case the
    watcher exists for) between the command's exit and its next look (50 ms) leaves it
    running past the lead's trusted deadline, beside the command another host starts."""
    import os
    import signal
    import time as clock

    from dynasem.management.commands.dynasem_lead import _Command

    deadline = clock.monotonic() + 1.0
    child = _Command(["sh", "-c", "sleep 30 & exit 0"], dict(os.environ), False, deadline)
    pgid = child.process.pid
    try:
        child.process.wait(10)  # the command exited; dynasem_lead stops now, and looks no more
        clock.sleep(max(0.0, deadline - clock.monotonic()) + 0.5)
        left = _group_members(pgid)
        assert not left, f"past the lead's deadline, the group still runs {left}"
    finally:
        for pid in _group_members(pgid):
            os.kill(pid, signal.SIGKILL)
        child.kill()


def test_the_command_runs_with_the_signals_python_ignores_restored(tmp_path: Any) -> None:
    """The watcher (and the namespace's init) is a Python process, which ignores SIGPIPE and
    SIGXFSZ from its start; an ignored signal stays ignored across exec, so the command ran
    with both ignored (``yes | head -1`` in it writes errors instead of ending quietly; a
    shell cannot even trap them again). subprocess.Popen restores them (restore_signals), but
    for command_init itself, which ignores them again."""
    import os
    import time as clock

    from dynasem.management.commands.dynasem_lead import _Command

    out = tmp_path / "sigign"
    script = f"grep SigIgn /proc/$$/status > {out}"
    child = _Command(["sh", "-c", script], dict(os.environ), False, clock.monotonic() + 5)
    try:
        child.process.wait(10)
    finally:
        child.kill()
    ignored = int(out.read_text().split()[1], 16)
    for number, name in ((13, "SIGPIPE"), (25, "SIGXFSZ")):
        assert not ignored & (1 << (number - 1)), f"the command runs with {name} ignored"
