"""Page cursors of the operators' listings: signed, so that a page goes on only from a cursor
this site wrote for that listing and filter, and bounded, so that nothing one carries can
overflow a request built from it.

A cursor is the base64 of its state's JSON, then Django's signature (``SECRET_KEY``, and
``SECRET_KEY_FALLBACKS`` while a key is rotated), salted per purpose: a listing and its filter
(:func:`purpose`). The state is readable, not secret: it holds index positions (resource
names, lease ends) that the page showing the link shows too.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from django.core import signing

from .. import _clock as clock
from .._engine import arguments as validation

# Longest page cursor accepted: a real one holds at most 9 positions of a <= 1 KB resource
# each (under 13 KB in base64) and a signature; anything longer is refused unread.
MAX_CURSOR = 16_384
# The latest time a cursor may carry (epoch seconds): the end of year 9999, past which no
# datetime exists and long before a DynamoDB number (38 digits) would have to round.
MAX_EPOCH_S = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
# DynamoDB's limits on a key's attributes (UTF-8 bytes): a position past them is no key.
MAX_PK_BYTES = 2048
MAX_SK_BYTES = 1024
_SALT = "dynasem._operators.cursors"
START_OVER = "start from the first page"


class BadCursor(ValueError):
    """A page cursor this site did not write for this listing (forged, garbled, signed with
    another ``SECRET_KEY``, or for another filter)."""


def purpose(listing: str, *filters: Any) -> str:
    """The salt of one listing's cursors under one filter: a cursor of another is refused."""
    return json.dumps([listing, *filters], separators=(",", ":"), ensure_ascii=False)


def encode_cursor(state: Any, purpose: str) -> str:
    """``state`` (JSON) as a page cursor, signed for ``purpose`` (see :func:`purpose`)."""
    raw = json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()
    text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return signing.Signer(salt=f"{_SALT}:{purpose}").sign(text)


def _refused(cursor: str, why: str = "not a page link this site wrote") -> BadCursor:
    return BadCursor(f"page cursor {cursor[:40]!r}: {why}: {START_OVER}")


def load_cursor(cursor: str, purpose: str) -> Any:
    """The state :func:`encode_cursor` signed for ``purpose``; :class:`BadCursor` (a
    ValueError) for anything else: unsigned, signed for another listing or filter, or with
    another ``SECRET_KEY``, garbled, too long."""
    if len(cursor) > MAX_CURSOR:
        raise _refused(cursor, f"longer than {MAX_CURSOR} characters")
    try:
        text = signing.Signer(salt=f"{_SALT}:{purpose}").unsign(cursor)
    except signing.BadSignature:
        raise _refused(cursor, "not signed by this site for this list and filter") from None
    try:
        return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, TypeError, RecursionError) as exc:
        raise _refused(cursor) from exc


def _epoch_s(value: Any, low: int, high: int) -> bool:
    # bool is an int to Python, and JSON has no int/float split: only a plain int in range.
    return type(value) is int and low <= value <= high


def _key_part(value: Any, most_bytes: int) -> bool:
    """Whether ``value`` can be a key attribute of a DynamoDB request (a str of 1 to
    ``most_bytes`` UTF-8 bytes)."""
    if not isinstance(value, str) or not value:
        return False
    try:
        return validation.utf8_size(value, "key") <= most_bytes
    except ValueError:  # a lone surrogate: no request could carry it
        return False


def decode_cursor(cursor: str, names: set[str], purpose: str) -> dict[str, Any]:
    """The state of a lock listing's cursor: ``t``, the first page's lower bound (epoch
    seconds, no later than this host's clock allows another's to be), and ``p``, a position
    per stream name in ``names``: None, ``"done"`` or ``[lease end >= t, resource]``."""
    state = load_cursor(cursor, purpose)
    # t was a web host's clock reading (or 0); hosts disagree by at most CLOCK_SKEW, itself
    # at most MAX_LEASE.
    latest = clock.now_ms() // 1000 + int(validation.MAX_LEASE)
    if not isinstance(state, dict) or not _epoch_s(state.get("t"), 0, latest):
        raise _refused(cursor)
    positions = state.get("p")
    if not isinstance(positions, dict) or set(positions) != names:
        raise _refused(cursor)
    for value in positions.values():
        ok = value in (None, "done") or (
            isinstance(value, list)
            and len(value) == 2
            and _epoch_s(value[0], state["t"], MAX_EPOCH_S)
            and _key_part(value[1], MAX_PK_BYTES)
        )
        if not ok:
            raise _refused(cursor)
    return state


def decode_scan_cursor(cursor: str, purpose: str) -> tuple[str, str]:
    """The ``[pk, sk]`` of an item a Scan listing's cursor goes on after."""
    key = load_cursor(cursor, purpose)
    if not (
        isinstance(key, list)
        and len(key) == 2
        and _key_part(key[0], MAX_PK_BYTES)
        and _key_part(key[1], MAX_SK_BYTES)
    ):
        raise _refused(cursor)
    return key[0], key[1]


def decode_sort_key_cursor(cursor: str, purpose: str) -> str:
    """The sort key of the item a page of one item collection's listing goes on after."""
    sort_key = load_cursor(cursor, purpose)
    if not _key_part(sort_key, MAX_SK_BYTES):
        raise _refused(cursor)
    return str(sort_key)
