"""Settings for dynasem's own tests. The DynamoDB endpoint and table come from the environment
(set by conftest.py, inherited by the worker processes of the race tests)."""

from __future__ import annotations

import os
import tempfile

SECRET_KEY = "dynasem-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Serves the admin's CSS to the browser test's live server (test_browser.py).
    "django.contrib.staticfiles",
    "dynasem",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.support.urls"
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    # A second database, for holds that follow another database's transaction (using=).
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    # A database in a file: Django ignores close() on an in-memory SQLite database, so what a
    # closed connection does to a transaction is tested here (test_transactions.py).
    "file": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(tempfile.gettempdir(), f"dynasem-tests-{os.getpid()}.sqlite3"),
        "TEST": {
            "NAME": os.path.join(tempfile.gettempdir(), f"dynasem-tests-{os.getpid()}.sqlite3")
        },
    },
}
# tests/transactions/test_fenced_postgres.py: its worker processes' default database is PostgreSQL.
if os.environ.get("DYNASEM_TEST_DATABASE_URL"):
    from urllib.parse import urlsplit

    _url = urlsplit(os.environ["DYNASEM_TEST_DATABASE_URL"])
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _url.path.lstrip("/"),
            "USER": _url.username,
            "HOST": _url.hostname,
            "PORT": _url.port,
        }
    }
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

DYNASEM = {
    "TABLE_NAME": os.environ.get("DYNASEM_TEST_TABLE", "dynasem-test"),
    "ENDPOINT_URL": os.environ.get("DYNASEM_TEST_ENDPOINT", "http://127.0.0.1:1"),
    "REGION_NAME": "us-east-1",
    "LEASE": 10,
    "WAIT": 0,
    # Worker processes of short-lease tests may ask for less (tests/support/fence_worker.py).
    "CLOCK_SKEW": float(os.environ.get("DYNASEM_TEST_CLOCK_SKEW", "0.5")),
}

# Processes on the multi-host tests' hosts (tests/system/test_hosts.py, benchmarks/soak_hosts.py)
# listen for hand-over pushes on their own host's address.
if os.environ.get("DYNASEM_TEST_PUSH"):
    DYNASEM["PUSH"] = os.environ["DYNASEM_TEST_PUSH"]
