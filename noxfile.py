"""The (Python, Django) matrix: one session per supported pair.

    .venv/bin/nox -l                                   # the sessions
    .venv/bin/nox -s "tests(python='3.11', django='4.2')"
    .venv/bin/nox -s "tests(python='3.11', django='4.2')" -- tests/engine/test_decorators.py -x
    make matrix                                        # every pair but the newest

``make test`` is the full suite on the newest pair (.venv); CI (.ci/run) runs it and then the
sessions tagged ``ci``: every other pair, on the Django-facing part of the suite or, where
another pair already runs that part on the same Django, on its smoke part (FULL_PAIRS; the
multi-process races, pushes, faults and heartbeat timing stay in ``make test``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PYCACHE = ROOT / ".nox" / "pycache"  # the sessions' bytecode (see tests())
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")

# (Python, Django) pairs, oldest first. Django 4.2 runs on Python <= 3.12, Django 6.x needs
# Python >= 3.12. Keep the README's "Supported versions" table and the classifiers in
# pyproject.toml in step with this list.
PAIRS = [
    ("3.11", "4.2"),
    ("3.11", "5.2"),
    ("3.12", "4.2"),
    ("3.12", "5.2"),
    ("3.12", "6.0"),
    ("3.12", "6.1"),
    ("3.13", "5.2"),
    ("3.13", "6.0"),
    ("3.13", "6.1"),
]
NEWEST = PAIRS[-1]  # what `make test` runs, in .venv

# Unique django.tasks tasks, in process and on real db_worker processes (the example project's
# under gunicorn too): skipped below Django 6.0. Each Django >= 6.0 runs them (a full pair;
# 6.1 in ``make test`` as well): Django 6.0's Task has fields 6.1 defaults
# (tests/project/test_noxfile.py checks that every test gated on Django 6.0 runs on each).
TASKS = [
    "tests/background/test_unique_tasks.py",
    "tests/background/test_review36_limits.py",
    "tests/background/test_review38f_unique_key.py",
    "tests/background/test_review38l_unique_key.py",
    "tests/system/test_example_http.py::test_background_rebuilds_enqueue_once_while_one_is_queued_or_running",
    "tests/engine/test_review37h_signals.py::test_an_async_unique_tasks_run_sends_lock_released_where_django_closes_it",
    "tests/engine/test_review37h_signals.py::test_an_async_unique_tasks_run_stands_past_a_raising_lock_released_receiver",
    "tests/engine/test_review37j_signals.py::test_an_async_unique_run_cancelled_as_it_started_sends_lock_released_where_django_closes_it",
    "tests/engine/test_review37j_signals.py::test_an_async_enqueue_the_backend_refused_sends_lock_released_where_django_closes_it",
    "tests/background/test_review38g_background.py::test_a_tasks_enqueue_interrupted_as_its_claim_returns_gives_the_key_back",
]

DJANGO_FACING = [
    "tests/engine/test_decorators.py",
    "tests/operators/test_admin.py",
    "tests/operators/test_commands.py",
    "tests/app/test_checks.py",
    "tests/background/test_run_once.py",
    "tests/engine/test_core.py",
    "tests/app/test_conf.py",
    "tests/storage/test_table.py",
    "tests/transactions/test_transactions.py",
    "tests/background/test_tasks.py",  # Django tasks: skipped below Django 6.0
    *TASKS,
    "tests/app/test_testing.py",
    "tests/operators/test_browser.py",  # the admin's layout on this Django, in Chromium
    "tests/observability/test_telemetry.py",  # with the otel group, or without opentelemetry at all
]

# The lock's own logic and its DynamoDB requests depend on the Python version, not on
# Django's: they run on the oldest and the newest Python (3.13 in ``make test``) and the
# Django-facing files on every pair. That keeps CI (.ci/run) under its 45 minutes.
CORE = ["tests/engine/test_core.py", "tests/storage/test_table.py"]
# The oldest Python here, the newest in ``make test`` (3.12 between them: CI's 45 minutes).
CORE_PAIRS = {("3.11", "4.2")}
# dynasem[otel] and the SDK (the `otel` dependency group) on these pairs: test_telemetry.py
# reads its metrics and spans there, and everywhere else it runs without opentelemetry
# installed (the package must import and work without it). Every Django and every Python
# gets both.
OTEL_PAIRS = {("3.11", "4.2"), ("3.12", "5.2"), ("3.12", "6.1"), ("3.13", "6.0")}
# The whole Django-facing part runs once per Django and once per Python (the newest pair,
# 3.13/6.1, in ``make test``); the other pairs run a smoke part: the package imports, its
# checks, settings and decorators work, users' test plugins run, telemetry on or off. What
# differs between two Pythons on one Django is found there; the admin pages, commands and
# transactions depend on the Django, which a full pair covers. It keeps CI under 45 minutes.
# Django 6.1 runs whole in ``make test`` (the newest pair, 3.13) and Python 3.12 in 3.12/5.2:
# 3.12/6.1 is a smoke pair (CI's 25 minutes, issue 41).
FULL_PAIRS = {("3.11", "4.2"), ("3.12", "5.2"), ("3.13", "6.0"), NEWEST}


def _tags(pair: tuple[str, str]) -> list[str]:
    if pair == NEWEST:
        return []
    return ["ci", "full"] if pair in FULL_PAIRS else ["ci"]


SMOKE = [
    "tests/engine/test_decorators.py",
    "tests/app/test_checks.py",
    "tests/app/test_conf.py",
    "tests/app/test_testing.py",
    "tests/observability/test_telemetry.py",
]
# The admin's layout in Chromium, once per Django (6.1: ``make test``): it depends on the
# Django's templates and CSS, not on the Python.
BROWSER_PAIRS = {("3.11", "4.2"), ("3.12", "5.2"), ("3.13", "6.0")}  # 6.1: make test


def _pinned(name: str, requirements: Iterable[str]) -> str:
    """``name``'s requirement as pyproject.toml states it (its version in one place)."""
    return next(r for r in requirements if r.startswith(name))


# What TASKS import on a Django with django.tasks (>= 6.0): django-tasks-db (a dev group
# package: it needs Django >= 5.2 and would upgrade 4.2) and the example project's
# django-environ (the demo extra). Below 6.0 they skip at once, so nothing is installed.
TASKS_NEEDS = [
    _pinned("django-tasks-db", nox.project.dependency_groups(PYPROJECT, "dev")),
    _pinned("django-environ", PYPROJECT["project"]["optional-dependencies"]["demo"]),
]

nox.options.error_on_missing_interpreters = True
# uv makes a session's venv and installs in seconds where pip takes half a minute; pip still
# serves where uv is missing. uv must use the interpreters found here, never download one.
nox.options.default_venv_backend = "uv|virtualenv"
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


def _find_pythons() -> None:
    """Make each ``pythonX.Y`` of the matrix findable on PATH. A pyenv shim for a version that
    is not selected is on PATH but fails, so nox would pick it and break: link what
    scripts/find_python.sh finds (on PATH or in pyenv's versions folder) into .nox/pythons
    and put that first. A version found nowhere fails its sessions (not skipped)."""
    links = ROOT / ".nox" / "pythons"
    for version in sorted({python for python, _ in PAIRS}):
        found = subprocess.run(
            ["bash", str(ROOT / "scripts" / "find_python.sh"), version],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not found or found == f"python{version}":
            continue
        links.mkdir(parents=True, exist_ok=True)
        link = links / f"python{version}"
        # Two nox processes (scripts/matrix.sh) import this at once: link under a name of
        # this process's own, then rename over the old link (atomic), never unlink first.
        fresh = links / f".python{version}.{os.getpid()}"
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(found)
        os.replace(fresh, link)
    if links.is_dir():
        os.environ["PATH"] = f"{links}{os.pathsep}{os.environ.get('PATH', '')}"


_find_pythons()


@nox.session
@nox.parametrize(
    ("python", "django"),
    [
        # "full": the long sessions, which scripts/matrix.sh spreads over its groups first.
        nox.param(python, django, tags=_tags((python, django)))
        for python, django in PAIRS
    ],
)
def tests(session: nox.Session, django: str) -> None:
    """The Django-facing tests (or the tests named after ``--``) on one (Python, Django)."""
    pair = (session.python, django)
    files = files_for(pair)
    otel = nox.project.dependency_groups(PYPROJECT, "otel") if pair in OTEL_PAIRS else ()
    tasks = TASKS_NEEDS if _version(django) >= (6, 0) and set(TASKS) & set(files) else ()
    session.install(
        "-e",
        ".",
        f"django=={django}.*",
        *nox.project.dependency_groups(PYPROJECT, "test"),
        *otel,
        *tasks,
        "playwright>=1.40",  # tests/operators/test_browser.py drives Debian's Chromium
    )
    session.run("python", "-m", "django", "--version")
    # As scripts/pytest.sh runs them: pytest-xdist's workers (PYTEST_WORKERS, default 4; two
    # sessions run at once in scripts/matrix.sh), then the tests marked serial alone (none in
    # these files today: "no test collected" is no failure there). A smoke pair's files take
    # 2 workers: as fast as 4 on an idle machine, 6 s less CPU (31 -> 25 s; 2026-12-05), and
    # the matrix is short of CPU, not of workers. A full pair's need 4 (66 s; 2 took 90 s).
    selected = ["-p", "no:cacheprovider", *(session.posargs or files)]
    workers = os.environ.get("PYTEST_WORKERS", "4" if pair in FULL_PAIRS else "2")
    # uv installs no bytecode, and where PYTHONDONTWRITEBYTECODE is set (these machines) every
    # process then compiled Django, boto3, moto... from source as it imported them: a third
    # of a full pair's CPU (3.13/6.0's files: 168 s of CPU, 110 s with this). Each module is
    # compiled once instead, into .nox/pycache (none in the checkout).
    session.env.update(PYTHONDONTWRITEBYTECODE="", PYTHONPYCACHEPREFIX=str(PYCACHE))
    if workers == "0":
        session.run("python", "-m", "pytest", *selected)
        return
    parallel = ["-n", workers, "--dist", "loadgroup", "-m", "not serial"]
    session.run(
        "python",
        "-m",
        "pytest",
        *parallel,
        *selected,
        success_codes=[0, 5] if session.posargs else [0],
    )
    session.run("python", "-m", "pytest", "-m", "serial", *selected, success_codes=[0, 5])


def files_for(pair: tuple[str, str]) -> list[str]:
    """The tests a pair's session runs (when no others are named after ``--``)."""
    files = DJANGO_FACING if pair in FULL_PAIRS else SMOKE
    if pair not in CORE_PAIRS:
        files = [f for f in files if f not in CORE]
    if pair not in BROWSER_PAIRS:
        files = [f for f in files if f != "tests/operators/test_browser.py"]
    if _version(pair[1]) < (6, 0):
        # Skipped there (no django.tasks); a test named by node id that its module skips is
        # "found no collectors", an error.
        files = [f for f in files if f not in TASKS]
    return files


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
