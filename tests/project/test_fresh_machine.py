"""``make test`` on a fresh machine (the README's command): a test that needs a server binary
(here Debian's redis-server, the Celery broker) installs it as .ci/run does (``apt-get
install``, as root or through sudo) and is skipped, saying why, only where that is impossible;
never an error. The machine is made fresh by a PATH without redis-server, where ``apt-get``
is a stand-in that records what it was asked and fails as an offline machine's does, or
installs the real binary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import servers

ROOT = Path(__file__).resolve().parents[2]
REDIS_SERVER = shutil.which("redis-server")
# What tests.support.netns.apt_install needs to run apt-get: root, or sudo without a password.
CAN_INSTALL = os.geteuid() == 0 or (
    shutil.which("sudo") is not None
    and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0
)


def fresh_path(tmp_path: Path, apt_get: str) -> tuple[str, Path]:
    """A PATH of every command this one has but redis-server and apt-get, with ``apt_get``
    (a shell script's body) as apt-get; and the file where it records its arguments."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt-get.log"
    bin_dir.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            link = bin_dir / name
            if name not in ("redis-server", "apt-get") and not os.path.lexists(link):
                link.symlink_to(Path(folder) / name)
    script = bin_dir / "apt-get"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\n{apt_get}\n')
    script.chmod(0o755)
    return str(bin_dir), log


def test_without_redis_and_no_way_to_install_it_the_broker_tests_skip(tmp_path: Path) -> None:
    offline = 'test "$1" = update && exit 0\necho "E: Unable to locate package $4" >&2\nexit 100'
    path, log = fresh_path(tmp_path, offline)  # no package lists: nothing to install
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]
        + ["tests/background/test_unique_celery.py", "tests/background/test_celery_broker.py"],
        cwd=ROOT,
        env={**os.environ, "PATH": path, "DYNASEM_TEST_ENGINE": "embedded"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 skipped" in summary and "error" not in summary, summary
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("redis-server" in line for line in skips), skips
    if CAN_INSTALL:  # it tried to install it, as .ci/run does, and says why it could not
        assert log.read_text().count("install -y -qq redis-server") == 1  # once a run
        assert all("Unable to locate package redis-server" in line for line in skips), skips


@pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server here to stand in for Debian's")
@pytest.mark.skipif(not CAN_INSTALL, reason="installing a package needs root or sudo -n")
def test_without_redis_it_is_installed_and_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = pytest.importorskip("redis", reason="the redis client: celery[redis], test group")
    installs = f'test "$1" = update && exit 0\nln -s {REDIS_SERVER} "$(dirname "$0")/redis-server"'
    path, log = fresh_path(tmp_path, installs)
    monkeypatch.setenv("PATH", path)
    assert shutil.which("redis-server") is None  # a fresh machine
    found = servers.redis_server_bin()
    assert found == str(Path(path) / "redis-server")
    assert "install -y -qq redis-server" in log.read_text()
    with servers.redis(tmp_path) as url:
        assert redis.Redis.from_url(url, socket_connect_timeout=2).ping() is True
