"""What operators do to holds (list, break, reap), shared by the CLI and the admin."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import core, table
from .conf import settings
from .signals import lock_released


@dataclass(frozen=True)
class HoldInfo:
    """One holder of one resource, as stored."""

    resource: str
    token: str
    user_id: str
    fence: int
    mode: str
    limit: int
    acquired_ms: int
    expires_ms: int
    queue_depth: int = 0

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self.expires_ms / 1000, tz=UTC)

    @property
    def acquired(self) -> datetime:
        return datetime.fromtimestamp(self.acquired_ms / 1000, tz=UTC)

    @property
    def kind(self) -> str:
        if self.mode == core.MODE_SHARED:
            return "shared"
        if self.mode == core.MODE_COUNTING:
            return f"slot of {self.limit}"
        return "exclusive"

    def as_dict(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "user_id": self.user_id,
            "kind": self.kind,
            "fence": self.fence,
            "token": self.token,
            "acquired": self.acquired.isoformat(),
            "expires": self.expires.isoformat(),
            "queue_depth": self.queue_depth,
        }


def holds_of(item: dict[str, Any], *, min_expires_ms: int | None) -> list[HoldInfo]:
    out = []
    now = core.now_ms()
    waiting = sum(1 for w in (item.get("queue") or {}).values() if int(w.get("e", 0)) >= now)
    for token, h in sorted((item.get("holders") or {}).items()):
        if min_expires_ms is not None and int(h.get("e", 0)) < min_expires_ms:
            continue
        out.append(
            HoldInfo(
                resource=item["pk"],
                token=token,
                user_id=str(h.get("u", "")),
                fence=int(h.get("f", 0)),
                mode=str(item.get("mode", core.MODE_EXCLUSIVE)),
                limit=int(item.get("limit", 1)),
                acquired_ms=int(h.get("a", 0)),
                expires_ms=int(h.get("e", 0)),
                queue_depth=waiting,
            )
        )
    return out


def _rows(user_id: str | None, since_s: int) -> Iterator[dict[str, Any]]:
    if user_id is not None:
        # The userId index names one holder per row: every exclusive holder, but only the
        # latest of a counting or shared resource's holders, so those rows are read as well.
        seen = set()
        for item in table.query_user(user_id, since_s):
            seen.add(item["pk"])
            yield item
        for shard in range(table.SHARDS):
            for item in table.iter_expiring(shard, since=since_s, shared_only=True):
                if item["pk"] not in seen:
                    yield item
        return
    for shard in range(table.SHARDS):
        yield from table.iter_expiring(shard, since=since_s)


def active_holds(
    *, user_id: str | None = None, prefix: str | None = None, include_expired: bool = False
) -> list[HoldInfo]:
    """The live holds (or, with ``include_expired``, also ones whose lease ran out but whose
    rows are still there), read through the indexes: idle rows cost nothing."""
    now = core.now_ms()
    if include_expired:
        rows: Iterator[dict[str, Any]] = _rows(user_id, 0)
        floor = None
    else:
        rows = _rows(user_id, now // 1000)
        floor = now
    holds = []
    for item in rows:
        if prefix and not item["pk"].startswith(prefix):
            continue
        for hold in holds_of(item, min_expires_ms=floor):
            if user_id is None or hold.user_id == user_id:
                holds.append(hold)
    holds.sort(key=lambda h: (h.resource, h.acquired_ms))
    return holds


def holds_on(resource: str) -> list[HoldInfo]:
    """Every holder of one resource, live or not (one consistent read)."""
    item = table.get(core.check_resource(resource))
    return holds_of(item, min_expires_ms=None) if item else []


def queue_depth(resource: str) -> int:
    """How many live waiters are queued for ``resource`` (one consistent read)."""
    item = table.get(core.check_resource(resource)) or {}
    now = core.now_ms()
    return sum(1 for w in (item.get("queue") or {}).values() if int(w.get("e", 0)) >= now)


def break_hold(resource: str, token: str, *, sender: Any = None) -> bool:
    """Break one hold, only if that very token still holds (a hold taken meanwhile survives).
    Sends ``lock_released``; False if the token no longer held the resource."""
    try:
        table.update(table.force_release(resource, token))
    except table.Refused:
        return False
    lock_released.send(
        sender=sender or core.Semaphore,
        resource=resource,
        user_id=None,
        token=token,
        fence=None,
        broken=True,
    )
    return True


def break_holds(resource: str, token: str | None = None) -> list[HoldInfo]:
    """Break every hold on ``resource`` (or the one with ``token``); returns the broken."""
    broken = []
    for hold in holds_on(resource):
        if token is not None and hold.token != token:
            continue
        if break_hold(resource, hold.token):
            broken.append(hold)
    return broken


@dataclass
class ReapResult:
    found: int = 0
    deleted: int = 0
    survived: int = 0


def reap(
    *,
    dry_run: bool = False,
    workers: int = 16,
    progress: Callable[[ReapResult], None] | None = None,
) -> ReapResult:
    """Delete rows whose lease ended more than CLOCK_SKEW ago, found through the expires
    index (never a Scan) and deleted each on condition it is still expired, in parallel."""
    cutoff_ms = core.now_ms() - int(core.check_skew(settings.CLOCK_SKEW) * 1000)
    before_s = cutoff_ms // 1000
    result = ReapResult()

    def candidates() -> Iterator[dict[str, Any]]:
        for shard in range(table.SHARDS):
            yield from table.iter_expiring(shard, before=before_s)

    if dry_run:
        for _ in candidates():
            result.found += 1
        return result
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dynasem-reap") as pool:
        futures = []
        for row in candidates():
            result.found += 1
            futures.append(pool.submit(table.delete_expired, row["pk"], row["sk"], cutoff_ms))
        for i, future in enumerate(futures, 1):
            if future.result():
                result.deleted += 1
            else:
                result.survived += 1
            if progress is not None and (i % 500 == 0 or i == len(futures)):
                progress(result)
    return result
