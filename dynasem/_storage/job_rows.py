"""Reading and writing run_once rows (``sk = job``)."""

from __future__ import annotations

from typing import Any

from . import dynamodb, lock_rows
from .records import JOB_SK, JobRow, job_row


def update_job(action: dict[str, Any], *, return_new: bool = False) -> JobRow | None:
    """Send one conditional run_once write. Raises :class:`Refused` with the old row."""
    row = lock_rows.update_item(action, return_new)
    return None if row is None else job_row(row)


def scan_jobs(
    prefix: str | None, status: str | None, start: dict[str, Any] | None
) -> tuple[list[JobRow], dict[str, Any] | None]:
    """One Scan page of run_once rows.

    A Scan, because job rows are in no index (they carry no ``expires``); it reads the lock
    rows too, 1 MB a request, which is acceptable for an admin page read by hand. ``status``
    "NEW" means never run or reset (no status stored)."""
    values: dict[str, Any] = {":job": JOB_SK}
    conditions = ["#sk = :job"]
    if prefix:
        values[":p"] = prefix
        conditions.append("begins_with(#pk, :p)")
    if status == "NEW":
        conditions.append("attribute_not_exists(#status)")
    elif status:
        values[":st"] = status
        conditions.append("#status = :st")
    request = {"FilterExpression": " AND ".join(conditions)}
    items, last = dynamodb.page("scan", None, start, values=values, **request)
    return [job_row(item) for item in items], last


def get_job(pk: str) -> JobRow | None:
    """The run_once row of ``pk`` (one consistent read), or None if never run."""
    item = lock_rows.get_item(pk, JOB_SK)
    return job_row(item) if item else None
