"""Typed, live access to the ``DYNASEM`` settings dict.

A key is read from ``django.conf.settings`` and checked on its first use, then kept until
``setting_changed`` says ``DYNASEM`` changed (``override_settings``, pytest-django's
``settings`` fixture: Django's own ways to change a setting at run time), so every later read
is one dict lookup (an acquire reads about sixteen). Nothing is copied at import time.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable
from numbers import Real
from typing import Any, Generic, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed

FALLBACK_REGION = "us-east-1"
# DynamoDB's table names: 3 to 255 of these characters.
TABLE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{3,255}")

# What each key means: the settings reference (docs/reference/settings.md) is generated from
# DEFAULTS (below) and this, and tests/project/test_docs_reference.py keeps their keys the same.
HELP: dict[str, str] = {
    "TABLE_NAME": "the DynamoDB table",
    "ENDPOINT_URL": '`None` = AWS; `"http://127.0.0.1:8000"` = a local engine',
    "REGION_NAME": f"`None` = boto3's chain, then `{FALLBACK_REGION}`",
    "LEASE": "seconds a holder keeps a lock without renewing it",
    "WAIT": "seconds `acquire` keeps trying before it gives up (`None` = forever)",
    "CLOCK_SKEW": (
        "seconds by which host clocks may disagree; expiry decisions allow for it (at least "
        "2 ms: stored times are whole milliseconds)"
    ),
    "FAIR": "`True` = waiters queue first come, first served (a semaphore's `fair=` overrides "
    "it; an acquire of several resources never queues)",
    "PUSH": "IPv4 address (a literal naming this host) a waiting process listens on (UDP, a "
    'free port) for hand-over pushes; `None` or `""` = no pushes',
    "SAME_HOST_TAKEOVER": "take a holder of this host over as soon as `/proc` proves its process "
    "ended, before its lease ends (`None` = yes, except on AWS Lambda and where a runtime "
    "restored from a snapshot is detected; `False` = never: machines cloned from one memory "
    "snapshot share a boot id, and one clone cannot see the other's processes)",
    "TELEMETRY": "record OpenTelemetry metrics and spans when `opentelemetry-api` is installed "
    "(`dynasem[otel]`); `False` = record nothing",
    "TELEMETRY_RESOURCE_NAMES": "name locks in metrics and spans by their raw resource keys "
    "(unbounded cardinality: opt in knowingly)",
}


_V = TypeVar("_V")


def _same(value: Any) -> Any:
    return value


def _forever_if_none(value: float | None) -> float:
    return math.inf if value is None else value


def _table_name(value: str) -> str:
    """A name DynamoDB accepts for a table (3 to 255 of a-z, A-Z, 0-9, ``_``, ``-``, ``.``),
    refused naming the setting: otherwise the first request fails with DynamoDB's own
    ValidationException, read as a table without the index dynasem needs."""
    if not TABLE_NAME_RE.fullmatch(value):
        raise ValueError(
            "DYNASEM['TABLE_NAME'] must be 3 to 255 characters, each a-z, A-Z, 0-9, '_', '-' "
            f"or '.' (DynamoDB's table names), not {value!r}"
        )
    return value


def _none_if_empty(value: str | None) -> str | None:
    return value or None


class _Key(Generic[_V]):
    """A key of the dict, read and checked on its first use after each change, with its
    documented default; a value of another type is a TypeError naming the key and the value
    (as the timing checks in arguments.py name a bad LEASE): ``"false"`` from an environment
    variable must never read as a true FAIR. The system checks (checks.py) report the same
    before the first request."""

    def __init__(
        self,
        default: Any,
        kinds: tuple[type, ...],
        expected: str,
        then: Callable[[Any], _V] = _same,
    ):
        self.default, self.kinds, self.expected, self.then = default, kinds, expected, then

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    def __get__(self, instance: Settings, owner: type | None = None) -> _V:
        kept = instance._kept
        if self.key in kept:
            return kept[self.key]  # type: ignore[no-any-return]
        version = instance._version
        value = instance.raw.get(self.key, self.default)
        # bool is an int (a Real): True is no number of seconds, and 1 is no bool.
        if not isinstance(value, self.kinds) or (
            isinstance(value, bool) and bool not in self.kinds
        ):
            kind = type(value).__name__
            raise TypeError(f"DYNASEM[{self.key!r}] must be {self.expected}, not {kind}: {value!r}")
        checked = self.then(value)
        with instance.lock():  # kept only if no change came while it was read
            if instance._version == version:
                instance._kept[self.key] = checked
        return checked


class Settings:
    """The ``DYNASEM`` dict, key by key, each with its documented default (the first
    argument), the types it may be, and what to call them in an error."""

    def __init__(self) -> None:
        self._kept: dict[str, Any] = {}  # key -> its checked value, until DYNASEM changes
        self._version = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()  # the process _lock is of

    def lock(self) -> threading.Lock:
        """The lock of what is kept, this process's: made anew in a forked child (with or
        without Python's at-fork hooks), where the copy a thread of the parent held as it
        forked stayed held for good, and the child's first read of a key waited on it."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def forget(self) -> None:
        """``DYNASEM`` changed: read every key again. What was kept goes before the version
        moves on: a reader that sees the new version (``arguments._kept``, which reads it
        unlocked) must find nothing of the old settings kept. In the other order, a thread
        that read it in between read the old keys still kept and kept them (the lease, wait
        and skew an acquire derives) under the new version, for every acquire after."""
        with self.lock():
            self._kept = {}
            self._version += 1

    @property
    def version(self) -> int:
        """How many times ``DYNASEM`` has changed: what is derived from the settings (and
        checked) may be kept while this stays the same."""
        return self._version

    @property
    def raw(self) -> dict[str, Any]:
        """The dict as set ({} when there is none); a ``DYNASEM`` that is no dict is a
        TypeError, as a key of a wrong type is: read as no settings, it would send every
        request to AWS's default table (dynasem.E001 reports it where the checks run)."""
        value = getattr(django_settings, "DYNASEM", {})
        if not isinstance(value, dict):
            kind = type(value).__name__
            raise TypeError(f"DYNASEM must be a dict of dynasem's settings, not {kind}: {value!r}")
        return value

    TABLE_NAME = _Key[str]("dynasem-locks", (str,), "a str", _table_name)
    ENDPOINT_URL = _Key[str | None](None, (str, type(None)), "None or a URL str")
    REGION_NAME = _Key[str | None](None, (str, type(None)), "None or a str")
    LEASE = _Key[float](60, (Real,), "a number of seconds")
    WAIT = _Key[float](0, (Real, type(None)), "a number of seconds or None", _forever_if_none)
    CLOCK_SKEW = _Key[float](5, (Real,), "a number of seconds")
    FAIR = _Key[bool](False, (bool,), "True or False")
    PUSH = _Key[str | None](
        "127.0.0.1", (str, type(None)), "None or an IPv4 address str", _none_if_empty
    )
    SAME_HOST_TAKEOVER = _Key[bool | None](None, (bool, type(None)), "None, True or False")
    # OpenTelemetry (dynasem[otel]): record metrics and spans; name locks by their raw keys.
    TELEMETRY = _Key[bool](True, (bool,), "True or False")
    TELEMETRY_RESOURCE_NAMES = _Key[bool](False, (bool,), "True or False")

    def check_types(self) -> None:
        """Raise the TypeError of the first key of a wrong type: called before a first
        request, so that no request goes out under a broken configuration."""
        for key in DEFAULTS:
            getattr(self, key)

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.raw) - set(DEFAULTS))


settings = Settings()


def _forget(setting: str, **kwargs: Any) -> None:
    if setting == "DYNASEM":
        settings.forget()


setting_changed.connect(_forget, dispatch_uid="dynasem-settings")
# Every key and its default, in the order of the reference.
DEFAULTS: dict[str, Any] = {k: v.default for k, v in vars(Settings).items() if isinstance(v, _Key)}
