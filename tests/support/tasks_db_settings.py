"""tests.support.settings for test_unique_tasks.py's ``db_worker`` processes and enqueuer:
django.tasks on django-tasks-db's DatabaseBackend over a SQLite file (``DYNASEM_TEST_TASKS_DB``)."""

from __future__ import annotations

import os

from tests.support.settings import *  # noqa: F403
from tests.support.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
DATABASES = {
    **DATABASES,
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["DYNASEM_TEST_TASKS_DB"],
        "OPTIONS": {"timeout": 30},
    },
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
