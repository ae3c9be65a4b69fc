"""A simulated table: its items (each with the versions a lagging read may still see), its
global secondary indexes, and the orders DynamoDB reads them in.

Orders follow DynamoDB Local (the reference the simulator is checked against): a Query reads
a partition in sort key order (strings and binaries by their bytes, numbers by value); a Scan
reads partitions by a hash of their key (SHA-1, salted as DynamoDB Local salts it), each in
sort key order; an index sorts entries of one index key by a hash of their table key.
"""

from __future__ import annotations

import bisect
import datetime
import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .values import Invalid, Item, Value, item_size, kind_of

# DynamoDB Local's salt for the hashes its partitions and index entries are ordered by.
_SALT = b"LocalDdb"

Plain = str | Decimal | bytes
Key = tuple[Plain, Plain | None]


def plain(value: Value) -> Plain:
    """A key value as Python orders it the way DynamoDB does."""
    ((kind, raw),) = value.items()
    if kind == "N":
        return Decimal(raw)
    return raw  # type: ignore[no-any-return]


def _hash(*parts: bytes) -> bytes:
    return hashlib.sha1(_SALT + b"".join(parts)).digest()


def _bytes_of(value: Plain | None) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    return str(value).encode()


@dataclass
class IndexDef:
    name: str
    hash_name: str
    range_name: str | None
    projection: str  # ALL, KEYS_ONLY, INCLUDE
    include: tuple[str, ...]
    definition: dict[str, Any]  # as CreateTable gave it (DescribeTable returns it)

    def keys(self) -> tuple[str, ...]:
        return (self.hash_name,) if self.range_name is None else (self.hash_name, self.range_name)


class Record:
    """One item's slot: its current image (None: deleted), the versions a lagging read may
    still see (None: the table keeps no history), and what orders it."""

    __slots__ = ("key", "item", "size", "versions", "order", "tx_until", "tx_seen", "ttl_delay")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.item: Item | None = None
        self.size = 0  # the current image's (item_size)
        # (written, image, its size), oldest first
        self.versions: list[tuple[float, Item | None, int]] | None = None
        self.order = _hash(_hash(_bytes_of(key[0])), _hash(_bytes_of(key[1])))
        self.tx_until = -1.0  # a transaction holds it until then (simulated time)
        self.tx_seen = False  # ever written by a transaction
        self.ttl_delay: float | None = None  # TTL's delay for the current image, once drawn

    def sized_at(self, when: float | None) -> tuple[Item | None, int]:
        """The image a read as of ``when`` sees (None: now), and its size (0: none)."""
        if when is None or self.versions is None:
            return self.item, self.size
        for written, image, size in reversed(self.versions):
            if written <= when:
                return image, size
        return None, 0


class Partition:
    __slots__ = ("records", "sorted", "order")

    def __init__(self, hash_value: Plain) -> None:
        self.records: dict[Plain | None, Record] = {}
        self.sorted: list[Any] = []  # the sort keys present, in order
        self.order = _hash(_bytes_of(hash_value))


@dataclass
class Table:
    name: str
    hash_name: str
    hash_type: str
    range_name: str | None
    range_type: str | None
    definitions: list[dict[str, str]]
    indexes: dict[str, IndexDef]
    created: datetime.datetime
    billing: dict[str, Any]
    ttl_attribute: str | None = None
    ttl_enabled: bool = False
    partitions: dict[Plain, Partition] = field(default_factory=dict)
    records: dict[Key, Record] = field(default_factory=dict)
    # index -> index hash value -> the records that had it in a version still visible.
    members: dict[str, dict[Plain, set[Key]]] = field(default_factory=dict)

    def key_names(self) -> tuple[str, ...]:
        return self.keys

    @functools.cached_property
    def keys(self) -> tuple[str, ...]:
        return (self.hash_name,) if self.range_name is None else (self.hash_name, self.range_name)

    def attribute_type(self, name: str) -> str | None:
        return self.types.get(name)

    @functools.cached_property
    def types(self) -> dict[str, str]:
        return {d["AttributeName"]: d["AttributeType"] for d in self.definitions}

    # -- keys ----------------------------------------------------------------------------------

    def key_of(self, item: Item, *, exact: bool) -> Key:
        """The table key of a Key (``exact``: nothing else) or of an Item."""
        hash_value = item.get(self.hash_name)
        range_value = None if self.range_name is None else item.get(self.range_name)
        fine = (
            hash_value is not None
            and (self.range_name is None or range_value is not None)
            and (not exact or len(item) == len(self.key_names()))
        )
        if fine:
            assert hash_value is not None
            raw = hash_value.get(self.hash_type)
            fine = raw is not None and raw != ""
            if fine and range_value is not None:
                raw = range_value.get(self.range_type)  # type: ignore[arg-type]
                fine = raw is not None and raw != ""
        if not fine:
            self._bad_key(item, exact)
        assert hash_value is not None
        return plain(hash_value), None if range_value is None else plain(range_value)

    def _bad_key(self, item: Item, exact: bool) -> None:
        """Raise what DynamoDB (Local) says of a key that does not fit the schema."""
        names = self.key_names()
        if exact and len(item) != len(names):
            raise Invalid("The number of conditions on the keys is invalid")
        if any(n not in item for n in names):
            if exact:
                raise Invalid("The provided key element does not match the schema")
            raise Invalid("One of the required keys was not given a value")
        for name in names:
            if kind_of(item[name]) != self.attribute_type(name):
                if exact:
                    raise Invalid("The provided key element does not match the schema")
                raise Invalid("One or more parameter values were invalid: Type mismatch for key")
            raise Invalid(
                "One or more parameter values are not valid. The AttributeValue for a key "
                f"attribute cannot contain an empty string value. Key: {name}"
            )

    def key_item(self, item: Item) -> Item:
        return {n: item[n] for n in self.key_names()}

    def check_index_keys(
        self, item: Item, *, update: bool, touched: set[str] | None = None
    ) -> None:
        """An item whose index key attributes have another type than the table declares, or
        an empty string, is refused (DynamoDB Local's messages). ``touched``: only these
        attributes changed (an update's)."""
        if touched is not None and not touched & self.index_key_names:
            return
        for index in self.indexes.values():
            for name in index.keys():
                value = item.get(name)
                if value is None:
                    continue
                if kind_of(value) != self.attribute_type(name):
                    raise Invalid(
                        "One or more parameter values were invalid: Type mismatch for Index Key"
                    )
                if kind_of(value) in ("S", "B") and not next(iter(value.values())):
                    raise Invalid(_empty_index_key(index.name, name, update))

    # -- reading -------------------------------------------------------------------------------

    def get(self, key: Key, when: float | None = None) -> Item | None:
        return self.sized(key, when)[0]

    def sized(self, key: Key, when: float | None = None) -> tuple[Item | None, int]:
        """The item at ``key`` as of ``when`` (None: now) and its size (0: none): sizes are
        measured once, as an image is written."""
        record = self.records.get(key)
        return (None, 0) if record is None else record.sized_at(when)

    def partition_keys(self, hash_value: Plain, low: Any, high: Any) -> list[Any]:
        """The sort keys of one partition between ``low`` and ``high`` (None: open), in order."""
        partition = self.partitions.get(hash_value)
        if partition is None:
            return []
        keys = partition.sorted
        start = 0 if low is None else bisect.bisect_left(keys, low)
        end = len(keys) if high is None else bisect.bisect_right(keys, high)
        return keys[start:end]

    def scan_order(self) -> Iterator[Record]:
        for partition in sorted(self.partitions.values(), key=lambda p: p.order):
            for sort_key in list(partition.sorted):
                yield partition.records[sort_key]

    def index_entries(
        self, index: IndexDef, hash_value: Plain, when: float | None
    ) -> list[tuple[Any, bytes, Item, Item, int]]:
        """The entries of ``index`` under ``hash_value`` as of ``when``: (range key, order,
        the entry, the table item, its size), sorted as DynamoDB Local sorts them."""
        found = []
        keys = self.members.get(index.name, {}).get(hash_value, set())
        for key in list(keys):
            record = self.records.get(key)
            image, size = (None, 0) if record is None else record.sized_at(when)
            entry = None if image is None else self.entry(index, image)
            if entry is None or plain(entry[index.hash_name]) != hash_value:
                if record is None or (record.versions is None and entry is None):
                    keys.discard(key)
                continue
            assert record is not None and image is not None
            ranged = None if index.range_name is None else plain(entry[index.range_name])
            found.append((ranged, record.order, entry, image, size))
        found.sort(key=lambda e: (e[0], e[1]) if e[0] is not None else (0, e[1]))
        return found

    def entry(self, index: IndexDef, item: Item) -> Item | None:
        """``item``'s entry in ``index`` (its projection), or None: not in the index."""
        for name in index.keys():
            value = item.get(name)
            if value is None or kind_of(value) != self.attribute_type(name):
                return None
        if index.projection == "ALL":
            return item
        wanted = set(self.key_names()) | set(index.keys())
        if index.projection == "INCLUDE":
            wanted |= set(index.include)
        return {n: v for n, v in item.items() if n in wanted}

    # -- writing -------------------------------------------------------------------------------

    def write(
        self, key: Key, image: Item | None, now: float, horizon: float, size: int | None = None
    ) -> Record:
        """``image`` (None: deleted) is the item ``key`` from ``now`` on (``size``: its size,
        if known); ``horizon``: how long (seconds) older versions must stay readable (0: no
        history)."""
        record = self.records.get(key)
        if record is None:
            if image is None:
                return Record(key)
            record = self.records[key] = Record(key)
            self._place(record)
        old, old_size = record.item, record.size
        if size is None:
            size = 0 if image is None else item_size(image)
        record.item, record.size = image, size
        record.ttl_delay = None
        if horizon > 0:
            if record.versions is None:
                record.versions = [] if old is None else [(float("-inf"), old, old_size)]
            record.versions.append((now, image, size))
            _prune(record.versions, now - horizon)
        self._index(record, old, image, horizon > 0)
        if image is None and horizon <= 0:
            self._drop(record)
        return record

    def _place(self, record: Record) -> None:
        hash_value, range_value = record.key
        partition = self.partitions.get(hash_value)
        if partition is None:
            partition = self.partitions[hash_value] = Partition(hash_value)
        partition.records[range_value] = record
        if range_value is not None:
            bisect.insort(partition.sorted, range_value)
        else:
            partition.sorted.append(None)

    def _drop(self, record: Record) -> None:
        hash_value, range_value = record.key
        self.records.pop(record.key, None)
        partition = self.partitions.get(hash_value)
        if partition is None:
            return
        partition.records.pop(range_value, None)
        if range_value is None:
            partition.sorted.clear()
        else:
            at = bisect.bisect_left(partition.sorted, range_value)
            if at < len(partition.sorted) and partition.sorted[at] == range_value:
                del partition.sorted[at]
        if not partition.records:
            del self.partitions[hash_value]

    def forget(self, record: Record, now: float, horizon: float) -> bool:
        """Drop a deleted item whose versions no read can see any more; True if dropped."""
        versions = record.versions
        if record.item is not None or self.records.get(record.key) is not record:
            return False
        if versions and versions[-1][0] > now - horizon:
            return False
        self._drop(record)
        return True

    def index_hash(self, index: IndexDef, item: Item | None) -> Plain | None:
        """The value ``item`` is listed under in ``index`` (None: not in it)."""
        if item is None:
            return None
        value = item.get(index.hash_name)
        if value is None or kind_of(value) != self.attribute_type(index.hash_name):
            return None
        if index.range_name is not None:
            ranged = item.get(index.range_name)
            if ranged is None or kind_of(ranged) != self.attribute_type(index.range_name):
                return None
        return plain(value)

    @functools.cached_property
    def index_key_names(self) -> frozenset[str]:
        return frozenset(n for index in self.indexes.values() for n in index.keys())

    def _index(self, record: Record, old: Item | None, new: Item | None, history: bool) -> None:
        if old is not None and new is not None:
            if all(old.get(n) is new.get(n) for n in self.index_key_names):
                return  # no index key changed (an update shares what it leaves alone)
        for index in self.indexes.values():
            members = self.members.setdefault(index.name, {})
            new_hash = self.index_hash(index, new)
            if new_hash is not None:
                members.setdefault(new_hash, set()).add(record.key)
            if history or old is None:
                continue
            old_hash = self.index_hash(index, old)
            if old_hash is not None and old_hash != new_hash:
                group = members.get(old_hash)
                if group is not None:
                    group.discard(record.key)
                    if not group:
                        del members[old_hash]


def _prune(versions: list[tuple[float, Item | None, int]], cutoff: float) -> None:
    """Keep the versions written after ``cutoff`` and the last one before it."""
    drop = 0
    while drop + 1 < len(versions) and versions[drop + 1][0] <= cutoff:
        drop += 1
    if drop:
        del versions[:drop]


def _empty_index_key(index: str, name: str, update: bool) -> str:
    if update:
        return (
            "One or more parameter values are not valid. The update expression attempted to "
            "update a secondary index key to a value that is not supported. The AttributeValue "
            "for a key attribute cannot contain an empty string value."
        )
    return (
        "One or more parameter values are not valid. A value specified for a secondary index "
        "key is not supported. The AttributeValue for a key attribute cannot contain an empty "
        f"string value. IndexName: {index}, IndexKey: {name}"
    )
