"""What operators do to run_once jobs (list, inspect, reset), for the admin."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import _clock as clock
from .._engine import arguments
from .._storage import dynamodb, job_rows, job_writes, records
from ..exceptions import SemaphoreUnavailable
from . import cursors
from .locks import PAGE_ROUNDS, aware

NEW = "NEW"  # a key never run, or reset by an operator: run_once runs it
# What every list of jobs says of itself (the admin's jobs page, ``dynasem_jobs``): job rows
# are in no index, so the list is a Scan, read eventually consistently (half the read units of
# a Scan that also reads every lock row). A job shown alone, and every reset, is read
# consistently first.
SCAN_NOTE = (
    "Listed by a Scan, which DynamoDB answers eventually consistently: a run that started, "
    "ended or was reset in the last second may show as it was."
)
RESETTABLE = frozenset({records.DONE, records.FAILED})
# Every status a job is listed under, the admin's and ``dynasem_jobs``' filter.
STATUSES = (records.RUNNING, records.FAILED, records.DONE, NEW)


def _ms_time(ms: int | None) -> datetime | None:
    return None if ms is None else aware(ms)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


@dataclass(frozen=True)
class JobInfo:
    """One run_once key, as stored."""

    key: str
    status: str
    user_id: str
    attempt: int
    error: str
    started_ms: int | None
    finished_ms: int | None
    lease_ms: int | None
    reset_ms: int | None

    @classmethod
    def of(cls, row: records.JobRow) -> JobInfo:
        return cls(
            key=row.key or "",
            status=row.status or NEW,
            user_id=row.user_id or "",
            attempt=row.attempt or 0,
            error=row.error or "",
            started_ms=row.started_ms,
            finished_ms=row.finished_ms,
            lease_ms=row.expires_ms,
            reset_ms=row.reset_ms,
        )

    @property
    def started(self) -> datetime | None:
        return _ms_time(self.started_ms)

    @property
    def finished(self) -> datetime | None:
        return _ms_time(self.finished_ms)

    @property
    def lease_ends(self) -> datetime | None:
        return _ms_time(self.lease_ms)

    @property
    def reset_at(self) -> datetime | None:
        return _ms_time(self.reset_ms)

    def as_dict(self) -> dict[str, Any]:
        """The job as a command's JSON line."""
        shown = ("key", "status", "user_id", "attempt", "started", "finished", "error")
        out = {name: getattr(self, name) for name in shown}
        return {**out, "started": _iso(self.started), "finished": _iso(self.finished)}

    @property
    def resettable(self) -> bool:
        return self.status in RESETTABLE

    @property
    def stale(self) -> bool:
        """RUNNING under a lease that ran out (its process died): run_once claims it again."""
        return self.status == records.RUNNING and (self.lease_ms or 0) < clock.now_ms()


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobInfo]
    next_cursor: str | None


def job_page(
    *,
    prefix: str | None = None,
    status: str | None = None,
    cursor: str | None = None,
    size: int = 100,
) -> JobPage:
    """One page of run_once keys (by key within the page), Scan page by Scan page; ``cursor``
    is a previous page's ``next_cursor`` under the same filters (:class:`cursors.BadCursor`, a
    ValueError, for any other). At most :data:`PAGE_ROUNDS` Scan requests a page."""
    signed_for = cursors.purpose("jobs", prefix, status)
    start = None
    if cursor:
        start = records.scan_start(*cursors.decode_scan_cursor(cursor, signed_for))
    jobs: list[JobInfo] = []
    for _ in range(PAGE_ROUNDS):
        items, last = job_rows.scan_jobs(prefix, status, start)
        for row in items:
            jobs.append(JobInfo.of(row))
            if len(jobs) == size:
                # Cut inside DynamoDB's page: go on after the last key shown (any item's key
                # is a valid ExclusiveStartKey for a Scan).
                last = records.job_start_key(row.key or "")
                break
        start = last
        if not start or len(jobs) == size:
            break
    jobs.sort(key=lambda j: j.key)
    next_cursor = None
    if start:
        # The last key read, which may be a lock row's: a Scan goes on from any item's key.
        next_cursor = cursors.encode_cursor(records.scan_position(start), signed_for)
    return JobPage(jobs, next_cursor)


def job_info(key: str) -> JobInfo | None:
    """One run_once key as stored (one consistent read), or None if never run."""
    row = job_rows.get_job(arguments.check_resource(key, "key"))
    return JobInfo.of(row) if row else None


def reset_job(key: str, status: str, finished_ms: int | None) -> bool:
    """Make a FAILED or DONE key new again, so the next ``run_once(key)`` runs it; only if it
    still ended as the operator saw (``status`` at ``finished_ms``): a run that ended since is
    not reset unseen. Keeps the fence and the attempt count. False if the row had changed.
    A reset applied whose answer was lost is known by its ``resetMs``: True."""
    if status not in RESETTABLE:
        raise ValueError(f"only a DONE or FAILED job can be reset, not {status!r}")
    key, now_ms = arguments.check_resource(key, "key"), clock.now_ms()
    try:
        job_rows.update_job(job_writes.job_reset(key, status, finished_ms, now_ms))
    except dynamodb.Refused as refused:
        # botocore's re-send of our own reset, applied, its answer lost: refused by it.
        return refused.retried and refused.job.reset_ms == now_ms
    except SemaphoreUnavailable as unanswered:
        if not _reset_landed(key, now_ms, unanswered):
            raise
    return True


def _reset_landed(key: str, now_ms: int, unanswered: SemaphoreUnavailable) -> bool:
    """Whether a reset that went ``unanswered`` was applied all the same (the quick client
    sends once): the row, read consistently, carries its ``resetMs``. (Another reset of the
    same outcome in the same millisecond would read as ours: the reset asked for, made.)
    Reported as failed, it would be missing from the admin's history, and the operator,
    running it again, could reset unseen a run that failed since."""
    if not unanswered.ambiguous:
        return False
    try:
        row = job_rows.get_job(key)
    except SemaphoreUnavailable:
        return False
    return row is not None and row.reset_ms == now_ms
