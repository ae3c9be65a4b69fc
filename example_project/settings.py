"""Settings for the dynasem example project, read from environment variables.

An optional ``.env`` at the repository root is read first; variables already set in the
environment win over it. ``.env.example`` documents every variable.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent
REPO_ROOT = BASE_DIR.parent

env = environ.Env()
if (REPO_ROOT / ".env").is_file():
    # read_env() also puts the file's AWS_* variables into os.environ, which is where boto3's
    # default credential chain looks: dynasem never takes credentials from settings.
    env.read_env(REPO_ROOT / ".env")

# --- Django ------------------------------------------------------------------------------

# The default key is for local demos only; set DJANGO_SECRET_KEY anywhere else.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="django-insecure-dynasem-example-only")
# On by default so that `runserver` serves the admin's static files in the demo.
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "dynasem",
    "example_project.projects",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "example_project.projects.middleware.LoadUserFirst",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The lock table lives in DynamoDB; this database holds users, sessions and the projects'
# issues that a rebuild purges and re-inserts. scripts/load_rebuild.py points it at PostgreSQL.
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
# Every view in a transaction, as many Django projects run: dynasem gives a view's lock back
# after that transaction commits, not when the view returns.
DATABASES["default"]["ATOMIC_REQUESTS"] = env.bool("DJANGO_ATOMIC_REQUESTS", default=True)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Two projects rebuilt at once both write: wait for SQLite's one writer, not fail.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("timeout", 20)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "projects:index"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# --- dynasem -----------------------------------------------------------------------------

DYNASEM = {
    "TABLE_NAME": env("DYNASEM_TABLE_NAME", default="dynasem-locks"),
    # Unset or empty means AWS itself (None); a URL such as http://127.0.0.1:8001 means a
    # local engine (DynamoDB Local, or `python -m dynasem.testing`).
    "ENDPOINT_URL": env("DYNASEM_ENDPOINT_URL", default="") or None,
    # None lets boto3 find the region (AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config);
    # dynasem falls back to us-east-1.
    "REGION_NAME": env("DYNASEM_REGION_NAME", default="") or None,
    "LEASE": env.float("DYNASEM_LEASE", default=60),
    "WAIT": env.float("DYNASEM_WAIT", default=0),
    "CLOCK_SKEW": env.float("DYNASEM_CLOCK_SKEW", default=5),
}

# --- the demo ----------------------------------------------------------------------------

# How long "Purge and rebuild" takes to fetch a project's issues before it purges and
# re-inserts them, so that a second click lands while the first still holds the lock.
DEMO_REBUILD_SECONDS = env.float("DEMO_REBUILD_SECONDS", default=5)
# How many issues a rebuild writes per project.
DEMO_ISSUES_PER_PROJECT = env.int("DEMO_ISSUES_PER_PROJECT", default=50)
# How long a rebuild waits for the project's lock (0: one attempt, then 423 Locked).
DEMO_REBUILD_WAIT = env.float("DEMO_REBUILD_WAIT", default=0)
# Also serve the two variants the load script compares against (scripts/load_rebuild.py):
# a rebuild without any lock, and one whose lock is given back before its commit.
# How long the coalesced rebuild's next run waits for the one going (it must wait: a request
# answered 202 counts on it).
DEMO_COALESCED_WAIT = env.float("DEMO_COALESCED_WAIT", default=300)
DEMO_LOAD_VARIANTS = env.bool("DEMO_LOAD_VARIANTS", default=False)
# /metrics: dynasem's OpenTelemetry metrics through Prometheus' exporter, when the SDK and the
# exporter are installed (the otel dependency group; projects/metrics.py).
DEMO_METRICS = env.bool("DEMO_METRICS", default=True)

# The background rebuild (projects/tasks.py) is a django.tasks task (Django >= 6.0). With
# django-tasks-db installed (the dev dependency group) the tasks are stored in the database
# and `manage.py db_worker` runs them (make demo starts one); without it Django's
# ImmediateBackend runs them in the request that enqueues them.
DEMO_TASKS_WORKER = env.bool(
    "DEMO_TASKS_WORKER",
    default=django.VERSION >= (6, 0) and importlib.util.find_spec("django_tasks_db") is not None,
)
if DEMO_TASKS_WORKER:
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
else:
    TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        # Shows the lock signals the demo app logs (see projects/apps.py).
        "example_project": {
            "handlers": ["console"],
            "level": env("DEMO_LOG_LEVEL", default="INFO"),
        },
        "dynasem": {"handlers": ["console"], "level": env("DYNASEM_LOG_LEVEL", default="INFO")},
    },
}
