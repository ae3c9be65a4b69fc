from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError

from ..._operators import reaper as reaping
from ..._storage import records
from ...exceptions import SemaphoreUnavailable
from ._output import OperatorCommand, printable

# The exit status when a delete or break failed (DynamoDB unreachable, throttled still after
# the tries, an answer lost): the reap went on with the rest and names the failed on stderr.
# 1: the expires index could not be listed to its end (the error says what was deleted before).
SOME_FAILED = 3
# Failures named in the error message; --json has a line for each.
NAMED = 5


class Command(OperatorCommand):
    help = (
        "Delete lock rows whose lease ended more than CLOCK_SKEW ago (found through the expires "
        "index). Each delete is conditional on the row being expired, so a row taken again or "
        "renewed since the index listed it (the index is updated asynchronously) is kept and "
        "counted as changed since listed; run_once DONE/FAILED rows are never touched. A "
        "delete that fails is left for the next reap and the reap goes on: exit status 3 then."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="list the rows it would delete (resource, lease bucket end), each read "
            "consistently: one the index still lists but that changed since is counted as kept; "
            "delete nothing",
        )
        parser.add_argument("--workers", type=int, default=16, help="parallel deletes (16)")
        parser.add_argument(
            "--json",
            action="store_true",
            help="print a JSON line per row found (with --dry-run) and one with the totals",
        )

    def handle(self, *args: Any, dry_run: bool, workers: int, **options: Any) -> None:
        if workers < 1:
            raise CommandError(f"--workers must be >= 1, not {workers}")
        verbosity = options.get("verbosity", 1)
        as_json = options.get("json", False)

        def progress(result: reaping.ReapResult) -> None:
            if verbosity >= 2 and not as_json:
                failed = f", {len(result.failed)} failed" if result.failed else ""
                self.stdout.write(
                    f"  {result.deleted} deleted, {result.survived} survived{failed}..."
                )

        def found(row: records.IndexEntry) -> None:
            if dry_run and as_json:
                ended = datetime.fromtimestamp(row.listed_s, tz=UTC).isoformat()
                self.stdout.write(json.dumps({"resource": row.resource, "ended_by": ended}))
            elif dry_run and verbosity >= 1:
                ended = datetime.fromtimestamp(row.listed_s, tz=UTC).strftime("%Y-%m-%d %H:%M")
                self.stdout.write(f"  {printable(row.resource)}  (lease ended by {ended} UTC)")

        result = reaping.ReapResult()
        try:
            reaping.reap(
                dry_run=dry_run, workers=workers, progress=progress, found=found, result=result
            )
        except SemaphoreUnavailable as exc:
            listing: SemaphoreUnavailable | None = exc
        else:
            listing = None
        if as_json:
            self._json(result, dry_run=dry_run)
        else:
            self._report(result, dry_run=dry_run, verbosity=verbosity)
        if listing is not None:
            raise CommandError(_listing_text(listing, result, dry_run=dry_run)) from listing
        if result.failed:
            raise CommandError(_failed_text(result.failed), returncode=SOME_FAILED)

    def _json(self, result: reaping.ReapResult, *, dry_run: bool) -> None:
        for failure in result.failed:
            self.stdout.write(json.dumps(dataclasses.asdict(failure)))
        totals = {"dry_run": dry_run, "found": result.found, "deleted": result.deleted}
        totals["permits_freed"] = result.permits
        # "kept" is the name scripts read before "changed_since_listed" said why.
        changed = {"changed_since_listed": result.survived, "kept": result.survived}
        failed = {"permits_kept": result.permits_kept, "failed": len(result.failed)}
        self.stdout.write(json.dumps({**totals, **changed, **failed}))

    def _report(self, result: reaping.ReapResult, *, dry_run: bool, verbosity: int) -> None:
        kept = result.survived
        if dry_run:
            self.stdout.write(f"Would delete {result.found - kept} expired rows.")
            if kept:
                self.stdout.write(
                    f"{_changed(kept)}: {'it' if kept == 1 else 'they'} would be kept."
                )
            if result.permits:
                self.stdout.write(
                    f"Would free {result.permits} permits and reader holds of dead holders."
                )
            return
        self.stdout.write(f"Deleted {result.deleted} expired rows.")
        if result.permits:
            self.stdout.write(f"Freed {result.permits} permits and reader holds of dead holders.")
        if kept and verbosity >= 1:
            self.stdout.write(
                f"{_changed(kept)} and {'was' if kept == 1 else 'were'} kept (taken again, "
                "renewed or released since: each delete is conditional on the row's expiry)."
            )
        if result.permits_kept and verbosity >= 1:
            self.stdout.write(
                f"{result.permits_kept} permits and reader holds read dead changed since listed "
                "(renewed or given back) and were kept."
            )


def _changed(rows: int) -> str:
    """Rows whose conditional delete was refused: the index, updated asynchronously, listed
    them as they were before a take, a renewal or a late release."""
    if rows == 1:
        return "1 row changed since the index listed it"
    return f"{rows} rows changed since the index listed them"


def _listing_text(error: SemaphoreUnavailable, result: reaping.ReapResult, *, dry_run: bool) -> str:
    """A listing of the expires index that failed, and what the reap did before it."""
    done = "nothing deleted (--dry-run)" if dry_run else f"{result.deleted} expired rows deleted"
    failed = f"; {_failed_text(result.failed)}" if result.failed else ""
    return (
        f"the expires index could not be listed to its end: {error}. Before that: {done}, "
        f"the rows not listed yet left for the next reap{failed}"
    )


def _failed_text(failed: list[reaping.ReapFailure]) -> str:
    """What failed, how many of each kind, and the first few by name with why."""
    counts = {kind: sum(f.item == kind for f in failed) for kind in ("row", "permit", "reader")}
    parts = []
    if counts["row"]:
        parts.append(f"{counts['row']} row{'s' if counts['row'] > 1 else ''} could not be deleted")
    if freed := counts["permit"] + counts["reader"]:
        parts.append(f"{freed} permit or reader hold{'s' if freed > 1 else ''} could not be freed")
    if listings := len(failed) - sum(counts.values()):
        parts.append(f"{listings} listing{'s' if listings > 1 else ''} of permits failed")
    text = "; ".join(parts) + (
        ": each is left for the next reap (every delete and break is conditional, so running "
        "it again is safe)."
    )
    maybe = sum(f.maybe_applied for f in failed)
    if maybe:
        text += f" {maybe} may have been applied all the same (DynamoDB's answer was lost)."
    named = [f"{printable(f.resource)!r} ({f.item}): {f.error}" for f in failed[:NAMED]]
    more = f"; and {len(failed) - NAMED} more" if len(failed) > NAMED else ""
    return f"{text} Failed: {'; '.join(named)}{more}"
