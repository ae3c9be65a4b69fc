"""Page cursors of the operators' listings: opaque to the user, refused when not ours."""

from __future__ import annotations

import base64
import json
from typing import Any

# Longest page cursor accepted: a real one holds at most 9 positions of a <= 1 KB resource
# each (under 13 KB in base64); anything longer is forged.
MAX_CURSOR = 16_384


class BadCursor(ValueError):
    """A page cursor this module did not write (forged, garbled, or for another filter)."""


def encode_cursor(state: Any) -> str:
    raw = json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def load_cursor(cursor: str) -> Any:
    """What :func:`encode_cursor` wrote; ValueError for anything unreadable or too long."""
    if len(cursor) > MAX_CURSOR:
        raise BadCursor(f"not a page cursor: {cursor[:40]!r}...")
    try:
        return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadCursor(f"not a page cursor: {cursor[:40]!r}") from exc


def decode_cursor(cursor: str, names: set[str]) -> dict[str, Any]:
    """The state of a lock listing's cursor; ValueError for anything else."""
    state = load_cursor(cursor)
    if not isinstance(state, dict) or not isinstance(state.get("t"), int):
        raise BadCursor(f"not a page cursor: {cursor[:40]!r}")
    positions = state.get("p")
    if not isinstance(positions, dict) or set(positions) != names:
        raise BadCursor("the page cursor belongs to another filter: start from the first page")
    for value in positions.values():
        ok = value in (None, "done") or (
            isinstance(value, list)
            and len(value) == 2
            and isinstance(value[0], int)
            and value[0] >= state["t"]
            and isinstance(value[1], str)
            and value[1]
        )
        if not ok:
            raise BadCursor(f"not a page cursor: {cursor[:40]!r}")
    return state
