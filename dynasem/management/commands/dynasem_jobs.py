from __future__ import annotations

import json as jsonlib
import sys
from typing import Any

from django.core.management.base import CommandError

from ..._engine import arguments as validation
from ..._operators import audit
from ..._operators import jobs as job_operations
from ..._storage import records
from ...exceptions import SemaphoreUnavailable
from ...models import Job
from ._output import OperatorCommand, pad, printable, recorder, width

# Said under every list (the Scan's reads are eventually consistent; see SCAN_NOTE).
SCAN_NOTE = f"({job_operations.SCAN_NOTE} `dynasem_jobs KEY` reads one key consistently.)"
# The exit status when nothing was reset (no such key, not DONE/FAILED, ran again since it was
# read, or the answer was no), as dynasem_release does when it broke nothing.
NOTHING_RESET = 3


class Command(OperatorCommand):
    help = (
        "List the run_once jobs (key, status, user, attempt, started, finished, last error) "
        "through a Scan, read eventually consistently (a run of the last second may show as it "
        "was); or, with KEY, that one job, read consistently; or with --reset KEY make a DONE "
        "or FAILED key run again (asks first unless --yes). Exit status 3 when --reset reset "
        "nothing."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "key",
            nargs="?",
            metavar="KEY",
            help="only this key, read consistently (not through the Scan): what it shows is "
            "true as of the read",
        )
        parser.add_argument("--status", choices=job_operations_statuses(), help="only this status")
        parser.add_argument("--key-prefix", help="only keys starting with this")
        parser.add_argument("--json", action="store_true", help="print JSON lines")
        parser.add_argument("--reset", metavar="KEY", help="reset this DONE or FAILED key")
        parser.add_argument(
            "--yes", "--noinput", "--no-input", action="store_true", dest="yes", help="do not ask"
        )
        parser.add_argument(
            "--log-as",
            metavar="USERNAME",
            help="record the reset in the admin's history as this Django user (default: the "
            "user named as this OS login, if any)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["reset"] is not None:
                self._reset(options["reset"], options)
            elif options["key"] is not None:
                self._show(self._one(options["key"], options), options, key=options["key"])
            else:
                self._show(self._list(options), options, key=None)
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc

    def _one(self, key: str, options: dict[str, Any]) -> list[job_operations.JobInfo]:
        """The job of ``key`` from one consistent read (none if never run)."""
        for flag in ("status", "key_prefix"):
            if options[flag] is not None:
                raise CommandError(
                    f"KEY {key!r} and --{flag.replace('_', '-')} do not go together: KEY "
                    "shows that one job; leave it out to list them all through a Scan"
                )
        try:
            job = job_operations.job_info(key)
        except (TypeError, ValueError) as exc:
            raise CommandError(f"KEY: {exc}") from exc
        return [job] if job is not None else []

    def _list(self, options: dict[str, Any]) -> list[job_operations.JobInfo]:
        jobs: list[job_operations.JobInfo] = []
        cursor = None
        while True:
            page = job_operations.job_page(
                prefix=options["key_prefix"], status=options["status"], cursor=cursor, size=500
            )
            jobs += page.jobs
            cursor = page.next_cursor
            if not cursor:
                break
        return jobs

    def _show(
        self, jobs: list[job_operations.JobInfo], options: dict[str, Any], *, key: str | None
    ) -> None:
        """The jobs as JSON lines or a table. ``key``: its job, read consistently; None: the
        list from a Scan, which the output says."""
        if options["json"]:
            for job in jobs:
                # False: from the Scan, read eventually consistently (see SCAN_NOTE).
                self.stdout.write(jsonlib.dumps({**_as_dict(job), "consistent": key is not None}))
            return
        if jobs:
            self._table(jobs)
        elif key is not None:
            self.stdout.write(f"No run_once job {printable(key)!r} (read consistently).")
        else:
            self.stdout.write("No run-once jobs.")
        if key is None:
            # On stderr, plain: stdout stays the rows alone, and nothing failed.
            self.stderr.write(SCAN_NOTE, style_func=_plain)

    def _table(self, jobs: list[job_operations.JobInfo]) -> None:
        keys = [printable(j.key) for j in jobs]
        wide = max(30, *(width(k) for k in keys))
        self.stdout.write(
            f"{pad('KEY', wide)} {'STATUS':8} {'ATTEMPT':>7} {'STARTED (UTC)':19}  LAST ERROR"
        )
        for job, key in zip(jobs, keys, strict=True):
            started = job.started.strftime("%Y-%m-%d %H:%M:%S") if job.started else "-"
            error = printable(job.error.splitlines()[0][:60]) if job.error else ""
            self.stdout.write(
                f"{pad(key, wide)} {job.status:8} {job.attempt:>7} {started:19}  {error}"
            )

    def _reset(self, key: str, options: dict[str, Any]) -> None:
        try:
            validation.check_resource(key, "key")
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        who, unrecorded = recorder(options["log_as"])
        job = job_operations.job_info(key)
        if job is None:
            raise CommandError(f"No run_once job {key!r}: nothing reset.", returncode=NOTHING_RESET)
        if not job.resettable:
            raise CommandError(
                f"{key!r} is {job.status}: only a DONE or FAILED job can be reset.",
                returncode=NOTHING_RESET,
            )
        if not options["json"]:
            line = f"  {key}  {job.status}  attempt {job.attempt}  {job.error[:80]}"
            self.stdout.write(printable(line))
        if not options["yes"]:
            if not sys.stdin or not sys.stdin.isatty():
                raise CommandError("not a terminal: pass --yes (or --noinput) to reset it")
            if input(f"Reset {key!r}? [y/N] ").strip().lower() not in ("y", "yes"):
                raise CommandError("Nothing reset.", returncode=NOTHING_RESET)
        done = job_operations.reset_job(key, job.status, job.finished_ms)
        if options["json"]:
            self.stdout.write(jsonlib.dumps({**_as_dict(job), "reset": done}))
        if not done:
            raise CommandError(
                f"{key!r} ran again since it was read: nothing reset.", returncode=NOTHING_RESET
            )
        text = f"Reset {key!r} (was {job.status}) with manage.py dynasem_jobs: it will run again."
        if who is not None:
            audit.record(who, Job, key, text)
        else:
            self.stderr.write(f"Not recorded in the admin's history: {unrecorded}.")
        if not options["json"]:
            self.stdout.write(text)


def job_operations_statuses() -> list[str]:
    return [records.RUNNING, records.FAILED, records.DONE, job_operations.NEW]


def _as_dict(job: job_operations.JobInfo) -> dict[str, Any]:
    return {
        "key": job.key,
        "status": job.status,
        "user_id": job.user_id,
        "attempt": job.attempt,
        "started": job.started.isoformat() if job.started else None,
        "finished": job.finished.isoformat() if job.finished else None,
        "error": job.error,
    }


def _plain(text: str) -> str:
    return text
