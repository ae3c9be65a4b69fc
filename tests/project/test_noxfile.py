"""The (Python, Django) matrix (noxfile.py) runs what it says: every django.tasks test (a test
module gated on Django 6.0) runs, with what it imports installed, on every Django >= 6.0 the
matrix has. Each session is called with a stand-in that records what it would install and
run, in a process of its own (importing the noxfile links the matrix's Pythons)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("nox", reason="nox is in the dev dependency group (.venv)")

ROOT = Path(__file__).resolve().parents[2]

SESSIONS = """
import json, noxfile

class Recorder:
    def __init__(self, python):
        self.python, self.posargs, self.installed, self.ran = python, [], [], []
        self.env = {}
    def install(self, *args, **kwargs):
        self.installed += args
    def run(self, *args, **kwargs):
        self.ran.append(args)

sessions = []
for python, django in noxfile.PAIRS:
    session = Recorder(python)
    noxfile.tests(session, django=django)
    pytest_args = [a for run in session.ran if "pytest" in run for a in run]
    sessions.append({"python": python, "django": django, "installed": session.installed,
                     "tests": pytest_args, "env": session.env})
print(json.dumps(sessions))
"""

# A test module gated on Django 6.0 (``django.VERSION < (6, 0)``, ``>= (6, 0)``): django.tasks.
GATED = re.compile(r"django\.VERSION\s*[<>]=?\s*\(6, 0\)")
# What a module skips without (``importorskip``, ``find_spec`` at its top level), by import name.
NEEDS = re.compile(r"""^\S.*?(?:importorskip|find_spec)\(\s*["']([\w.]+)["']""", re.MULTILINE)
DISTRIBUTION = {"environ": "django-environ", "django_tasks_db": "django-tasks-db"}


def matrix() -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", SESSIONS], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    sessions: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return sessions


def django_tasks_modules() -> dict[str, set[str]]:
    """``tests/*/test_*.py`` of django.tasks, each with the modules it skips without."""
    found = {}
    for path in sorted((ROOT / "tests").glob("*/test_*.py")):
        source = path.read_text()
        if GATED.search(source) and path.name != Path(__file__).name:  # not this one's regex
            found[path.relative_to(ROOT).as_posix()] = set(NEEDS.findall(source))
    return found


def installed_by(requirements: list[str]) -> set[str]:
    """The distribution names of ``session.install()``'s arguments (``-e .`` is dynasem)."""
    return {re.split(r"[\[<>=~!; ]", r)[0].lower() for r in requirements if r not in ("-e", ".")}


def provided(module: str, installed: set[str]) -> bool:
    """An import name (``celery.signals``) is provided if it or a parent is installed."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if DISTRIBUTION.get(name, name.replace(".", "-").replace("_", "-")) in installed:
            return True
    return False


def test_every_django_tasks_test_runs_on_every_django_6_of_the_matrix() -> None:
    modules = django_tasks_modules()
    assert "tests/background/test_unique_tasks.py" in modules
    assert "tests/background/test_tasks.py" in modules
    sessions = matrix()
    djangos = {s["django"] for s in sessions if tuple(map(int, s["django"].split("."))) >= (6, 0)}
    assert djangos >= {"6.0", "6.1"}
    missing = []
    for django in sorted(djangos):
        for module, needs in modules.items():
            runs = [
                s
                for s in sessions
                if s["django"] == django and any(a.split("::")[0] == module for a in s["tests"])
            ]
            if not runs:
                missing.append(f"Django {django}: {module} runs in no session")
            for run in runs:
                installed = installed_by(run["installed"])
                lacking = sorted(n for n in needs if not provided(n, installed))
                if lacking:
                    missing.append(f"{run['python']}/{django}: {module} skips without {lacking}")
    assert not missing, "\n".join(missing)


def test_no_session_names_a_test_its_module_skips_whole() -> None:
    # pytest answers a node id (file::test) whose module skips at import with "found no
    # collectors", exit 4: the 4.2 and 5.2 sessions failed so on the example project's
    # django.tasks test, whose module needs django-environ and Django 6.
    modules = django_tasks_modules()
    wrong = [
        f"{s['python']}/{s['django']}: {arg}"
        for s in matrix()
        for arg in s["tests"]
        if "::" in arg
        and tuple(map(int, s["django"].split("."))) < (6, 0)
        and (arg.split("::")[0] in modules or "test_example_http" in arg)
    ]
    assert not wrong, wrong


def test_every_session_compiles_each_module_once_outside_the_checkout() -> None:
    """uv installs no bytecode: a session's processes write what they compile to one cache
    (read by the next process), whatever PYTHONDONTWRITEBYTECODE the machine sets."""
    for session in matrix():
        env = session["env"]
        assert env["PYTHONDONTWRITEBYTECODE"] == "", session["python"]
        assert Path(env["PYTHONPYCACHEPREFIX"]).is_relative_to(ROOT / ".nox"), env
