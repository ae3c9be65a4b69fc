"""The facts of a log record, for machines: every record dynasem logs passes
``extra=facts(...)``, so a JSON formatter (or any handler) finds them as attributes of the
record, prefixed ``dynasem_`` (``record.dynasem_resource``, ``record.dynasem_fence``, ...);
the message text stays as it is, for people."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The prefix keeps the names clear of LogRecord's own attributes and of other libraries'.
PREFIX = "dynasem_"
# A whole token is a hold's secret: with it, anyone with access to the table can break or
# release that hold. Logs and the commands' output (text and JSON) show this many of its
# first characters, enough to tell holds apart and to name one to ``dynasem_release --token``.
TOKEN_PREFIX = 8


def shown_token(token: str) -> str:
    """What dynasem shows or logs of a token outside its holder: its first characters."""
    return token[:TOKEN_PREFIX]


def facts(
    resource: str | Iterable[str] | None = None,
    *,
    token: str | None = None,
    fence: int | None = None,
    outcome: str | None = None,
    wait: float | None = None,
    reason: object = None,
    **more: Any,
) -> dict[str, Any]:
    """``extra`` for a log call: the given facts, None ones left out."""
    if resource is not None and not isinstance(resource, str):
        resource = ",".join(resource)
    token = shown_token(token) if token else None
    reason = None if reason is None else str(reason)
    found = dict(resource=resource, token=token, fence=fence, outcome=outcome, wait=wait)
    found.update(reason=reason, **more)
    return {PREFIX + k: v for k, v in found.items() if v is not None}
