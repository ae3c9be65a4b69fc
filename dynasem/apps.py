from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class DynasemConfig(AppConfig):
    name = "dynasem"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import celery, checks  # noqa: F401  (checks registers the system checks)
        from ._engine import decorators

        # A Celery task's retry waits out the holds of the run it was sent from (no Celery
        # is imported for it: dynasem.celery imports it once a task runs).
        if celery.succeeded_holds not in decorators.succession:
            decorators.succession.append(celery.succeeded_holds)

        setting_changed.connect(_drop_client, dispatch_uid="dynasem-drop-client")


def _drop_client(setting: str, **kwargs: Any) -> None:
    # The client is built from DYNASEM (endpoint, region): a new dict needs a new client.
    if setting == "DYNASEM":
        from ._storage.dynamodb import reset_client

        reset_client()
