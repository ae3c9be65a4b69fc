"""The demo app's config: logs dynasem's lock signals so the runserver console tells the story."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.apps import AppConfig

logger = logging.getLogger("example_project.locks")


def _log_event(event: str) -> Callable[..., None]:
    def receiver(
        sender: Any, resource: str, user_id: str | None = None, fence: Any = None, **kwargs: Any
    ) -> None:
        logger.info("lock %s: %s (user %s, fence %s)", event, resource, user_id, fence)

    return receiver


class ProjectsConfig(AppConfig):
    name = "example_project.projects"
    verbose_name = "dynasem demo"

    def ready(self) -> None:
        from dynasem import signals

        from . import metrics

        metrics.configure()  # /metrics, if OpenTelemetry's SDK and exporter are installed

        for event, signal in [
            ("acquired", signals.lock_acquired),
            ("busy", signals.lock_busy),
            ("released", signals.lock_released),
            ("lost", signals.lock_lost),
        ]:
            # weak=False: the receivers are closures that nothing else keeps alive.
            signal.connect(_log_event(event), weak=False, dispatch_uid=f"demo-log-{event}")
