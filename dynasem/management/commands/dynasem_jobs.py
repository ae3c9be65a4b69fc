from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError

from ..._engine import arguments
from ..._operators import audit, jobs, usernames
from ...models import Job
from . import _output as out

# Said under every list (the Scan's reads are eventually consistent; see SCAN_NOTE).
SCAN_NOTE = f"({jobs.SCAN_NOTE} `dynasem_jobs KEY` reads one key consistently.)"
# The exit status when nothing was reset (no such key, not DONE/FAILED, ran again since it was
# read, or the answer was no), as dynasem_release does when it broke nothing.
NOTHING_RESET = 3


class Command(out.OperatorCommand):
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
        parser.add_argument("--status", choices=jobs.STATUSES, help="only this status")
        parser.add_argument("--key-prefix", help="only keys starting with this")
        parser.add_argument("--json", action="store_true", help="print JSON lines")
        parser.add_argument("--reset", metavar="KEY", help="reset this DONE or FAILED key")
        out.add_change_arguments(parser, "the reset")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"]
        if options["reset"] is not None:
            self._reset(options["reset"], options)
            return
        found = self._list(options) if key is None else self._one(key, options)
        out.show(
            self,
            [job.as_dict() for job in found],
            lambda: self._table(found),
            as_json=options["json"],
            one=key,  # else from the Scan, read eventually consistently (see SCAN_NOTE)
            nothing=("No run_once job {!r} (read consistently).", "No run-once jobs."),
            note=SCAN_NOTE,
        )

    def _one(self, key: str, options: dict[str, Any]) -> list[jobs.JobInfo]:
        """The job of ``key`` from one consistent read (none if never run)."""
        out.one_only(
            options,
            ("status", "key_prefix"),
            f"KEY {key!r}",
            "KEY shows that one job; leave it out to list them all through a Scan",
        )
        with out.refused("KEY: "):
            job = jobs.job_info(key)
        return [job] if job is not None else []

    def _list(self, options: dict[str, Any]) -> list[jobs.JobInfo]:
        more = functools.partial(
            jobs.job_page, prefix=options["key_prefix"], status=options["status"], size=500
        )
        page = more()
        found = page.jobs
        while page.next_cursor:
            page = more(cursor=page.next_cursor)
            found += page.jobs
        return found

    def _table(self, found: list[jobs.JobInfo]) -> None:
        """The columns the help names: key, status, user (by username where it is a Django
        user's primary key, as dynasem_locks shows holders), attempt, started, finished and
        the last error's first line."""
        keys = [out.printable(j.key) for j in found]
        names = usernames.usernames(j.user_id for j in found)
        users = [out.printable(names.get(j.user_id, j.user_id)) for j in found]
        wide, who = max(30, *(out.width(k) for k in keys)), max(16, *(out.width(u) for u in users))
        self.stdout.write(
            f"{out.pad('KEY', wide)} {'STATUS':8} {out.pad('USER', who)} {'ATTEMPT':>7} "
            f"{'STARTED (UTC)':19}  {'FINISHED (UTC)':19}  LAST ERROR"
        )
        for job, key, user in zip(found, keys, users, strict=True):
            started, finished = _shown(job.started), _shown(job.finished)
            error = out.printable(job.error.splitlines()[0][:60]) if job.error else ""
            self.stdout.write(
                f"{out.pad(key, wide)} {job.status:8} {out.pad(user, who)} {job.attempt:>7} "
                f"{started:19}  {finished:19}  {error}"
            )

    def _reset(self, key: str, options: dict[str, Any]) -> None:
        with out.refused(""):
            arguments.check_resource(key, "key")
        who, unrecorded = out.recorder(options["log_as"])
        job = jobs.job_info(key)
        if job is None:
            raise CommandError(f"No run_once job {key!r}: nothing reset.", returncode=NOTHING_RESET)
        if not job.resettable:
            why = f"{key!r} is {job.status}: only a DONE or FAILED job can be reset."
            raise CommandError(why, returncode=NOTHING_RESET)
        if not options["json"]:
            line = f"  {key}  {job.status}  attempt {job.attempt}  {job.error[:80]}"
            self.stdout.write(out.printable(line))
        out.ask(options["yes"], f"Reset {key!r}?", "reset it", "Nothing reset.", NOTHING_RESET)
        done = jobs.reset_job(key, job.status, job.finished_ms)
        if options["json"]:
            self.stdout.write(json.dumps({**job.as_dict(), "reset": done}))
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


def _shown(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"
