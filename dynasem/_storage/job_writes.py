"""The run_once writes: each builder returns the keyword arguments of one conditional
``UpdateItem`` of a job row (without ``TableName``);
:func:`dynasem._storage.job_rows.update_job` sends them."""

from __future__ import annotations

from typing import Any

from .lock_writes import update_action
from .records import FAILED, JOB_SK, RUNNING

# A claim's: ours, while it runs.
OURS = "#token = :tok AND #status = :running"


def job_claim(
    key: str, token: str, user_id: str, expires_ms: int, fence: int, now_ms: int, stale_ms: int
) -> dict[str, Any]:
    """NEW or FAILED (or RUNNING under a dead lease) -> RUNNING, in one conditional write."""
    update = (
        "SET #status = :running, #token = :tok, #uid = :uid, #expMs = :expMs, #fence = :fence, "
        "#startedMs = :now, #attempt = if_not_exists(#attempt, :zero) + :one REMOVE #finishedMs"
    )
    condition = (
        "(attribute_not_exists(#status) OR #status = :failed "
        "OR (#status = :running AND #expMs < :stale)) "
        "AND (attribute_not_exists(#fence) OR #fence < :fence)"
    )
    values: dict[str, Any] = {":running": RUNNING, ":failed": FAILED, ":zero": 0, ":one": 1}
    values |= {":tok": token, ":uid": user_id, ":expMs": expires_ms, ":fence": fence}
    values |= {":now": now_ms, ":stale": stale_ms}
    return update_action(key, JOB_SK, update, condition, {}, values)


def job_renew(key: str, token: str, expires_ms: int) -> dict[str, Any]:
    values: dict[str, Any] = {":e": expires_ms, ":tok": token, ":running": RUNNING}
    return update_action(key, JOB_SK, "SET #expMs = :e", OURS, {}, values)


def job_finish(key: str, token: str, status: str, error: str | None, now_ms: int) -> dict[str, Any]:
    """RUNNING -> DONE/FAILED; the row loses its lease and never expires."""
    values: dict[str, Any] = {":st": status, ":tok": token, ":now": now_ms, ":running": RUNNING}
    update = "SET #status = :st, #finishedMs = :now, #lastToken = :tok"
    if error is not None:
        values[":err"] = error[:4000]
        update += ", #error = :err REMOVE #token, #expMs"
    else:
        update += " REMOVE #token, #expMs, #error"
    return update_action(key, JOB_SK, update, OURS, {}, values)


def job_reset(key: str, status_seen: str, finished_ms: int | None, now_ms: int) -> dict[str, Any]:
    """An operator makes a DONE or FAILED job new again (the next run_once runs it), only if it
    still ended as the operator saw it (``status_seen`` at ``finished_ms``). Keeps the fence and
    the attempt count; records when it was reset."""
    values: dict[str, Any] = {":seen": status_seen, ":now": now_ms}
    if finished_ms is None:
        condition = "#status = :seen AND attribute_not_exists(#finishedMs)"
    else:
        condition = "#status = :seen AND #finishedMs = :end"
        values[":end"] = finished_ms
    update = "REMOVE #status, #error, #finishedMs, #token, #expMs SET #resetMs = :now"
    return update_action(key, JOB_SK, update, condition, {}, values)
