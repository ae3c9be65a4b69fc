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
    found: dict[str, Any] = {}
    if resource is not None:
        found["resource"] = resource if isinstance(resource, str) else ",".join(resource)
    if token:
        found["token"] = shown_token(token)
    if fence is not None:
        found["fence"] = fence
    if outcome is not None:
        found["outcome"] = outcome
    if wait is not None:
        found["wait"] = wait
    if reason is not None:
        found["reason"] = str(reason)
    found.update((k, v) for k, v in more.items() if v is not None)
    return {PREFIX + k: v for k, v in found.items()}
