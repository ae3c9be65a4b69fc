"""Every install line of the README and the docs, run in a fresh venv of its own, then used
as a project would (tests/support/install_smoke.py, from an empty folder: nothing of the
checkout is importable). ``dynasem`` in a line is this checkout's wheel, built once; a line
from a checkout (``-e .``) installs the checkout. Each extra is used: ``celery`` runs a Celery
worker on a Redis of its own with a unique task (plain ``celery`` could not: kombu's Redis
transport imports ``packaging``, which only ``celery[redis]`` brings), ``testing`` takes a
lock on the embedded engine, ``otel`` with opentelemetry imported; every line takes a lock
on DynamoDB Local.

The lines are installed with uv (the dev group's, in .venv), which resolves the same
metadata as pip in seconds where pip takes a minute per venv (scripts/wheel_check.sh)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import servers

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".venv" / "bin" / "uv"
SMOKE = REPO / "tests" / "support" / "install_smoke.py"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# `pip install` and its arguments, up to the end of a shell line, a comment or a code span.
INSTALL = re.compile(r"""pip install((?:[ \t]+(?:"[^"\n]*"|'[^'\n]*'|[^\s`#)"']+))+)""")
DYNASEM = re.compile(r"dynasem(\[[a-z,]+\])?")


def documented_lines() -> dict[str, str]:
    """Every distinct install line, with the first page and line that gives it."""
    found: dict[str, str] = {}
    for page in PAGES:
        for number, text in enumerate(page.read_text().splitlines(), 1):
            for match in INSTALL.finditer(text):
                line = "pip install" + match.group(1).rstrip()
                found.setdefault(line, f"{page.relative_to(REPO)}:{number}")
    return found


LINES = documented_lines()


def extras_of(args: list[str]) -> set[str]:
    extras: set[str] = set()
    for arg in args:
        name = arg.split("/")[-1].removeprefix(".")
        matched = DYNASEM.fullmatch(name) or re.fullmatch(r"(\[[a-z,]+\])?", name)
        if matched and matched.group(1):
            extras |= set(matched.group(1).strip("[]").split(","))
    return extras


def translated(args: list[str], wheel: Path) -> list[str]:
    """The line's arguments for ``uv pip install``: ``dynasem[...]`` is the built wheel."""
    out = []
    for arg in args:
        named = DYNASEM.fullmatch(arg)
        out.append(f"{wheel}{named.group(1) or ''}" if named else arg)
    return out


@pytest.fixture(scope="session")  # per xdist worker: the lines spread over the workers
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not UV.exists():
        pytest.skip("no uv in .venv (the dev group's): make venv")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [UV, "build", "--wheel", "--quiet", "--out-dir", out, REPO], check=True, cwd=REPO
    )
    (built,) = out.glob("dynasem-*.whl")
    return built


def test_the_docs_give_the_install_lines_a_project_needs() -> None:
    """The lines found are the ones the pages mean (a change to the pattern that finds none
    would make the test below vacuous)."""
    assert 'pip install "dynasem[celery]"' in LINES
    assert 'pip install "dynasem[testing]"' in LINES
    assert "pip install dynasem" in LINES
    assert all(not line.endswith("install") for line in LINES)


def run(argv: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{shlex.join(map(str, argv))}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("line", sorted(LINES), ids=lambda line: line.removeprefix("pip install "))
def test_a_documented_install_line_works_in_a_fresh_venv(
    line: str, wheel: Path, lock_table: str, dynamodb_local: str, tmp_path: Path
) -> None:
    args = shlex.split(line)[2:]
    venv, folder = tmp_path / "venv", tmp_path / "project"
    folder.mkdir()
    shutil.copy(SMOKE, folder / SMOKE.name)
    run([UV, "venv", "--quiet", "--python", sys.executable, venv], REPO, dict(os.environ))
    # From the checkout for a line that installs it (`-e .`, `--group`), else from nowhere.
    run([UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python",
         *translated(args, wheel)], REPO, dict(os.environ))  # fmt: skip
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "AWS_ACCESS_KEY_ID": "dummy",
        "AWS_SECRET_ACCESS_KEY": "dummy",
        "SMOKE_ENDPOINT": dynamodb_local,
        "SMOKE_TABLE": lock_table,
    }
    python = str(venv / "bin" / "python")
    assert json.loads(run([python, SMOKE.name, "lock"], folder, env))["fence"] > 0
    extras = extras_of(args)
    if "testing" in extras or "demo" in extras:
        assert json.loads(run([python, SMOKE.name, "testing"], folder, env))["fence"] > 0
    if "otel" in extras:
        assert json.loads(run([python, SMOKE.name, "otel"], folder, env))["otel"]
    if "celery" in extras:
        with celery_worker(folder, env, tmp_path) as worker_env:
            seen = json.loads(run([python, SMOKE.name, "enqueue"], folder, worker_env))
        (first, first_sent), (again, again_sent) = seen["first"], seen["again"]
        assert first_sent is True and again_sent is False and again == first
        assert seen["ran"] == [first]


@contextlib.contextmanager
def celery_worker(folder: Path, env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """A Redis of its own and one Celery worker (solo pool) of the venv running the smoke
    module's app; yields the environment its producer needs."""
    try:
        servers.redis_server_bin()
    except servers.ServerUnavailable as exc:
        pytest.skip(f"no Redis here: {exc}")
    log_path = tmp_path / "worker.log"
    with servers.redis(tmp_path) as broker, log_path.open("wb") as log:
        env = {**env, "SMOKE_BROKER": broker, "SMOKE_LOG": str(tmp_path / "runs")}
        celery = Path(env["PATH"].split(":")[0]) / "celery"
        worker = subprocess.Popen(
            [celery, "-A", "install_smoke", "worker", "--pool", "solo", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while b"ready." not in log_path.read_bytes():
                started = worker.poll() is None and time.monotonic() < deadline
                assert started, f"the Celery worker did not start:\n{log_path.read_text()[-4000:]}"
                time.sleep(0.1)
            yield env
        finally:
            servers.stop(worker)
