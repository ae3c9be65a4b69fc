"""Typed, live access to the ``DYNASEM`` settings dict.

Every property reads ``django.conf.settings`` on each access, so ``override_settings`` and
``setting_changed`` just work; nothing is copied into a module global at import time.
"""

from __future__ import annotations

import math
from typing import Any, cast

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
}

FALLBACK_REGION = "us-east-1"


class Settings:
    """The ``DYNASEM`` dict, key by key, with the documented defaults."""

    @property
    def raw(self) -> dict[str, Any]:
        value = getattr(django_settings, "DYNASEM", None)
        return value if isinstance(value, dict) else {}

    def _get(self, key: str) -> Any:
        return self.raw.get(key, DEFAULTS[key])

    # The properties trust the types they declare: a value of another type is reported by the
    # system checks (checks.py, dynasem.E001-E010), not refused here on every read.

    @property
    def TABLE_NAME(self) -> str:  # noqa: N802 - mirrors the settings key
        return cast(str, self._get("TABLE_NAME"))

    @property
    def ENDPOINT_URL(self) -> str | None:  # noqa: N802
        return cast("str | None", self._get("ENDPOINT_URL"))

    @property
    def REGION_NAME(self) -> str | None:  # noqa: N802
        return cast("str | None", self._get("REGION_NAME"))

    @property
    def LEASE(self) -> float:  # noqa: N802
        return cast(float, self._get("LEASE"))

    @property
    def WAIT(self) -> float:  # noqa: N802
        value = self._get("WAIT")
        return math.inf if value is None else cast(float, value)

    @property
    def CLOCK_SKEW(self) -> float:  # noqa: N802
        return cast(float, self._get("CLOCK_SKEW"))

    @property
    def FAIR(self) -> bool:  # noqa: N802
        return bool(self._get("FAIR"))

    @property
    def PUSH(self) -> str | None:  # noqa: N802
        return self._get("PUSH") or None

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.raw) - set(DEFAULTS))


settings = Settings()
