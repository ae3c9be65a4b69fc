"""Typed, live access to the ``DYNASEM`` settings dict.

Every property reads ``django.conf.settings`` on each access, so ``override_settings`` and
``setting_changed`` just work; nothing is copied into a module global at import time.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from django.conf import settings as django_settings

DEFAULTS: dict[str, Any] = {
    "TABLE_NAME": "dynasem-locks",
    "ENDPOINT_URL": None,
    "REGION_NAME": None,
    "LEASE": 60,
    "WAIT": 0,
    "CLOCK_SKEW": 5,
    "FAIR": False,
    "PUSH": "127.0.0.1",
    "SAME_HOST_TAKEOVER": None,
    # OpenTelemetry (dynasem[otel]): record metrics and spans; name locks by their raw keys.
    "TELEMETRY": True,
    "TELEMETRY_RESOURCE_NAMES": False,
}

FALLBACK_REGION = "us-east-1"

# What each key means: the settings reference (docs/reference/settings.md) is generated from
# DEFAULTS and this, and tests/test_docs_reference.py keeps their keys the same.
HELP: dict[str, str] = {
    "TABLE_NAME": "the DynamoDB table",
    "ENDPOINT_URL": '`None` = AWS; `"http://127.0.0.1:8000"` = a local engine',
    "REGION_NAME": f"`None` = boto3's chain, then `{FALLBACK_REGION}`",
    "LEASE": "seconds a holder keeps a lock without renewing it",
    "WAIT": "seconds `acquire` keeps trying before it gives up (`None` = forever)",
    "CLOCK_SKEW": "seconds by which host clocks may disagree; expiry decisions allow for it",
    "FAIR": "`True` = waiters queue first come, first served (a semaphore's `fair=` overrides "
    "it; an acquire of several resources never queues)",
    "PUSH": "IPv4 address (a literal naming this host) a waiting process listens on (UDP, a "
    "free port) for hand-over pushes; `None` = no pushes",
    "SAME_HOST_TAKEOVER": "take a holder of this host over as soon as `/proc` proves its process "
    "ended, before its lease ends (`None` = yes, except on AWS Lambda and where a runtime "
    "restored from a snapshot is detected; `False` = never: machines cloned from one memory "
    "snapshot share a boot id, and one clone cannot see the other's processes)",
    "TELEMETRY": "record OpenTelemetry metrics and spans when `opentelemetry-api` is installed "
    "(`dynasem[otel]`); `False` = record nothing",
    "TELEMETRY_RESOURCE_NAMES": "name locks in metrics and spans by their raw resource keys "
    "(unbounded cardinality: opt in knowingly)",
}


class Settings:
    """The ``DYNASEM`` dict, key by key, with the documented defaults."""

    @property
    def raw(self) -> dict[str, Any]:
        value = getattr(django_settings, "DYNASEM", None)
        return value if isinstance(value, dict) else {}

    def _get(self, key: str) -> Any:
        return self.raw.get(key, DEFAULTS[key])

    # Each property refuses a value of another type (a TypeError naming the key and the value,
    # as the timing checks in validation.py name a bad LEASE): ``"false"`` from an environment
    # variable must never read as a true FAIR. The system checks (checks.py, dynasem.E001-E012)
    # report the same before the first request does.

    def _typed(self, key: str, kinds: tuple[type, ...], expected: str) -> Any:
        value = self._get(key)
        # bool is an int (a Real): True is no number of seconds, and 1 is no bool.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise TypeError(
                f"DYNASEM[{key!r}] must be {expected}, not {type(value).__name__}: {value!r}"
            )
        return value

    @property
    def TABLE_NAME(self) -> str:  # noqa: N802 - mirrors the settings key
        value: str = self._typed("TABLE_NAME", (str,), "a str")
        return value

    @property
    def ENDPOINT_URL(self) -> str | None:  # noqa: N802
        value: str | None = self._typed("ENDPOINT_URL", (str, type(None)), "None or a URL str")
        return value

    @property
    def REGION_NAME(self) -> str | None:  # noqa: N802
        value: str | None = self._typed("REGION_NAME", (str, type(None)), "None or a str")
        return value

    @property
    def LEASE(self) -> float:  # noqa: N802
        value: float = self._typed("LEASE", (Real,), "a number of seconds")
        return value

    @property
    def WAIT(self) -> float:  # noqa: N802
        value: float | None = self._typed("WAIT", (Real, type(None)), "a number of seconds or None")
        return math.inf if value is None else value

    @property
    def CLOCK_SKEW(self) -> float:  # noqa: N802
        value: float = self._typed("CLOCK_SKEW", (Real,), "a number of seconds")
        return value

    @property
    def FAIR(self) -> bool:  # noqa: N802
        value: bool = self._typed("FAIR", (bool,), "True or False")
        return value

    @property
    def PUSH(self) -> str | None:  # noqa: N802
        value = self._typed("PUSH", (str, type(None)), "None or an IPv4 address str")
        return value or None

    @property
    def SAME_HOST_TAKEOVER(self) -> bool | None:  # noqa: N802
        value: bool | None = self._typed(
            "SAME_HOST_TAKEOVER", (bool, type(None)), "None, True or False"
        )
        return value

    @property
    def TELEMETRY(self) -> bool:  # noqa: N802
        value: bool = self._typed("TELEMETRY", (bool,), "True or False")
        return value

    @property
    def TELEMETRY_RESOURCE_NAMES(self) -> bool:  # noqa: N802
        value: bool = self._typed("TELEMETRY_RESOURCE_NAMES", (bool,), "True or False")
        return value

    def check_types(self) -> None:
        """Raise the TypeError of the first key of a wrong type: called before a first
        request, so that no request goes out under a broken configuration."""
        for key in DEFAULTS:
            getattr(self, key)

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.raw) - set(DEFAULTS))


settings = Settings()
