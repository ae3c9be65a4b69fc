"""The lock list's reads of the indexes: one stream per ``expires`` shard (and the userId
index's, for a user's holds), each fetched a page at a time, merged by lease end. Knows the
index entries only; :mod:`dynasem._operators.locks` reads and shows their rows."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .._storage import index_queries, records
from .._storage.records import Mode

# Items a filtered index read evaluates per request (see filtered_limit).
FILTERED_READ = 1000


Fetch = Callable[
    [dict[str, Any] | None, int | None], tuple[list[records.IndexEntry], dict[str, Any] | None]
]


class Stream:
    """One index range, fetched a page at a time in index order."""

    def __init__(
        self,
        name: str,
        fetch: Fetch,
        start_key: Callable[[int, str], dict[str, Any]],
        keep: Callable[[records.IndexEntry], bool],
        position: Any,
    ):
        self.name, self.fetch, self.start_key, self.keep = name, fetch, start_key, keep
        self.buffer: deque[records.IndexEntry] = deque()
        # The cursor's state: None (from the start), "done", or [expires, pk] of the last row
        # taken from this stream.
        self.position = position
        self.exhausted = position == "done"
        self.next_start = start_key(*position) if isinstance(position, list) else None

    def fetch_once(self, limit: int | None) -> None:
        entries, last = self.fetch(self.next_start, limit)
        self.buffer.extend(entry for entry in entries if self.keep(entry))
        self.next_start, self.exhausted = last, not last

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


def filtered_limit(limit: int | None) -> int | None:
    """The Limit of a read whose rows are mostly filtered out (DynamoDB applies Limit before
    the filter): read on further per request, so a page finds its rows in a few requests."""
    return None if limit is None else max(limit, FILTERED_READ)


def open_streams(user_id: str | None, since: int, positions: dict[str, Any]) -> list[Stream]:
    streams = []
    if user_id is not None:

        def exclusive(row: records.IndexEntry) -> bool:
            # The userId index names one holder per row: all of an exclusive row, only the
            # latest of a counting or shared one. Those rows come from the expires index
            # instead, where all their holders are read, so none is listed twice.
            return row.mode == Mode.EXCLUSIVE

        streams.append(
            Stream(
                "u",
                lambda start, limit: index_queries.query_user_page(
                    user_id, since, filtered_limit(limit), start
                ),
                lambda listed_s, pk: records.user_index_start(pk, user_id, listed_s),
                exclusive,
                positions.get("u"),
            )
        )
    for shard in range(records.SHARDS):

        def fetch(start: Any, limit: int | None, shard: int = shard) -> Any:
            filtered = user_id is not None
            return index_queries.query_expiring(
                shard,
                since=since,
                limit=filtered_limit(limit) if filtered else limit,
                start=start,
                shared_only=filtered,
            )

        def start_key(listed_s: int, pk: str, shard: int = shard) -> dict[str, Any]:
            return records.expires_index_start(pk, shard, listed_s)

        name = f"s{shard}"
        streams.append(Stream(name, fetch, start_key, lambda row: True, positions.get(name)))
    return streams


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
