"""The lock list's reads of the indexes: one stream per ``expires`` shard (and the userId
index's, for a user's holds), each fetched a page at a time, merged by lease end. Knows the
index entries only; :mod:`dynasem._operators.locks` reads and shows their rows."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from .._storage import index_queries, records
from .._storage.records import Mode

# Items a filtered index read evaluates per request (see Stream.fetch_once).
FILTERED_READ = 1000


class Stream:
    """One index range, fetched a page at a time in index order: the userId index's rows of
    ``user_id`` (``shard`` None), or one ``expires`` shard's (only its counting and shared
    rows when ``user_id`` is given: their holders are all read there)."""

    def __init__(
        self, name: str, shard: int | None, user_id: str | None, since: int, position: Any
    ):
        self.name, self.shard, self.user_id, self.since = name, shard, user_id, since
        self.buffer: deque[records.IndexEntry] = deque()
        # The cursor's state: None (from the start), "done", or [expires, pk] of the last row
        # taken from this stream.
        self.position = position
        self.exhausted = position == "done"
        self.next_start = self._start_key(*position) if isinstance(position, list) else None

    def _start_key(self, listed_s: int, pk: str) -> dict[str, Any]:
        if self.shard is None:
            return records.user_index_start(pk, str(self.user_id), listed_s)
        return records.expires_index_start(pk, self.shard, listed_s)

    def fetch_once(self, limit: int | None) -> None:
        filtered, start = self.user_id is not None, self.next_start
        if filtered and limit is not None:
            # Most of the rows read are filtered out, and DynamoDB applies Limit before the
            # filter: read on further per request, so a page finds its rows in a few requests.
            limit = max(limit, FILTERED_READ)
        if self.shard is None:
            read = index_queries.query_user_page(str(self.user_id), self.since, limit, start)
            # The userId index names one holder per row: all of an exclusive row, only the
            # latest of a counting or shared one. Those rows come from the expires index
            # instead, where all their holders are read, so none is listed twice.
            entries = [row for row in read[0] if row.mode == Mode.EXCLUSIVE]
        else:
            read = index_queries.query_expiring(
                self.shard, since=self.since, limit=limit, start=start, shared_only=filtered
            )
            entries = read[0]
        self.buffer.extend(entries)
        self.next_start, self.exhausted = read[1], not read[1]

    def take(self) -> records.IndexEntry:
        row = self.buffer.popleft()
        self.position = [row.listed_s or 0, row.resource]
        return row

    @property
    def state(self) -> Any:
        if self.buffer:
            return self.position  # rows read but not shown yet: read them again from there
        if self.exhausted:
            return "done"
        if self.next_start:
            # Everything up to DynamoDB's LastEvaluatedKey was read and filtered out: go on
            # from there, or a stretch of filtered rows longer than a page's budget would
            # hand out the same cursor for ever.
            return records.index_position(self.next_start)
        return self.position


def open_streams(user_id: str | None, since: int, positions: dict[str, Any]) -> list[Stream]:
    """The streams of a lock listing, each from its position in ``positions`` (by name)."""
    names: list[tuple[str, int | None]] = [(f"s{shard}", shard) for shard in range(records.SHARDS)]
    if user_id is not None:
        names.insert(0, ("u", None))
    return [Stream(name, shard, user_id, since, positions.get(name)) for name, shard in names]


def merged(
    streams: list[Stream], limit: int | None, budget: int | None
) -> Iterator[records.IndexEntry]:
    """The streams' entries by ``expires`` (ties in stream order). Stops early once ``budget``
    requests are spent; each stream's ``state`` then says where to go on."""
    spent = 0

    def ready(stream: Stream) -> bool:
        nonlocal spent
        while not stream.buffer and not stream.exhausted:
            if budget is not None and spent >= budget:
                return False
            spent += 1
            stream.fetch_once(limit)
        return True

    if not all(ready(s) for s in streams):
        return
    while True:
        heads = [s for s in streams if s.buffer]
        if not heads:
            return
        stream = min(heads, key=lambda s: s.buffer[0].listed_s or 0)
        yield stream.take()
        if not ready(stream):
            return
