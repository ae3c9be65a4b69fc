"""Servers that tests and scripts start for themselves on a free port of 127.0.0.1 and stop
again: a throwaway PostgreSQL cluster of Debian's packages (``initdb`` into a temporary folder,
run as the ``postgres`` user when started as root; ``apt-get install postgresql`` first when
started as root without it), a throwaway MariaDB server alike (``mariadb-install-db``, run as the
``mysql`` user; ``apt-get install mariadb-server``), a Redis of Debian's ``redis-server``
(installed when missing as .ci/run does: apt-get, as root or through sudo), and the helpers to
wait for and stop any server process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ServerUnavailable(RuntimeError):
    """A server could not be installed or started here."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[Any], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise ServerUnavailable(f"{what} did not listen on port {port} within {timeout:g} s")


def stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- PostgreSQL ----------------------------------------------------------------------------------


_not_installed: dict[str, str] = {}  # package -> why apt-get could not: tried once per run


def install(package: str) -> None:
    """Debian's ``package``, installed as .ci/run does (``apt-get update`` once, then ``apt-get
    install``, as root or through ``sudo -n``); ServerUnavailable says why it cannot be. An
    offline apt-get may take minutes to fail: tried once per test run."""
    from tests.support.netns import apt_install

    if package not in _not_installed:
        reason = apt_install(package)
        if reason is None:
            return
        _not_installed[package] = reason
    raise ServerUnavailable(_not_installed[package])


def postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        install("postgresql")
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise ServerUnavailable("PostgreSQL's initdb not found: apt-get install postgresql")
    return found[-1].parent


@contextlib.contextmanager
def postgresql(workdir: Path, database: str = "dynasem_load") -> Iterator[str]:
    """A throwaway cluster on a free port of 127.0.0.1; yields its DATABASE_URL."""
    bindir = postgres_bin()
    data, sockets = workdir / "pgdata", workdir / "pgsock"
    data.mkdir()
    sockets.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        as_user = ["runuser", "-u", "postgres", "--"]
        os.chmod(workdir, 0o755)
        shutil.chown(data, "postgres")
        shutil.chown(sockets, "postgres")
    subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = free_port()
    # Durable commits as in production (fsync on): a commit takes its real time, which is
    # the window a lock given back before the commit leaves open.
    server = [*as_user, str(bindir / "postgres"), "-D", str(data), "-p", str(port)]
    proc = subprocess.Popen(
        [*server, "-k", str(sockets), "-c", "listen_addresses=127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "postgres.log", "w"),  # noqa: SIM115 - closed with the process
    )
    try:
        wait_for_port(port, proc, "postgres", 30)
        for _ in range(50):
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                break
            time.sleep(0.1)
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
             database],
            check=True,
        )  # fmt: skip
        yield f"postgres://postgres@127.0.0.1:{port}/{database}"
    finally:
        stop(proc)


# -- MariaDB -------------------------------------------------------------------------------------


def mariadb_bin() -> Path:
    found = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/libexec")
    if not found:
        install("mariadb-server")
        found = shutil.which("mariadbd", path="/usr/sbin:/usr/libexec")
    if not found or not shutil.which("mariadb-install-db"):
        raise ServerUnavailable("MariaDB's mariadbd not found: apt-get install mariadb-server")
    return Path(found)


@contextlib.contextmanager
def mariadb(workdir: Path, database: str = "dynasem_fenced") -> Iterator[dict[str, Any]]:
    """A throwaway MariaDB server on a free port of 127.0.0.1 (root without a password; run as
    the ``mysql`` user when started as root); yields a Django ``DATABASES`` entry for it."""
    server = mariadb_bin()
    data = workdir / "mariadb"
    data.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # mariadbd refuses to run as root without --user=root
        as_user = ["runuser", "-u", "mysql", "--"]
        os.chmod(workdir, 0o755)
        shutil.chown(data, "mysql")
    subprocess.run(
        [*as_user, "mariadb-install-db", "--no-defaults", f"--datadir={data}",
         "--auth-root-authentication-method=normal", "--skip-test-db"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [*as_user, str(server), "--no-defaults", f"--datadir={data}", f"--port={port}",
         "--bind-address=127.0.0.1", f"--socket={data / 'sock'}", f"--pid-file={data / 'pid'}",
         "--skip-name-resolve", "--innodb-buffer-pool-size=32M"],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "mariadb.log", "w"),  # noqa: SIM115 - closed with the process
    )  # fmt: skip
    try:
        wait_for_port(port, proc, "mariadbd", 60)
        subprocess.run(
            ["mariadb", "-h127.0.0.1", f"-P{port}", "-uroot", "-e",
             f"CREATE DATABASE {database} CHARACTER SET utf8mb4"],
            check=True,
        )  # fmt: skip
        yield {
            "ENGINE": "django.db.backends.mysql",
            "NAME": database,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": port,
        }
    finally:
        stop(proc)


# -- Redis ---------------------------------------------------------------------------------------


def redis_server_bin() -> str:
    """Debian's ``redis-server``: on PATH, else installed as .ci/run does (``apt-get install
    redis-server``, as root or through ``sudo -n``); ServerUnavailable says why it cannot be."""
    found = shutil.which("redis-server")
    if found is None:
        install("redis-server")
        found = shutil.which("redis-server")
        if found is None:
            raise ServerUnavailable("`apt-get install redis-server` left no redis-server on PATH")
    return found


@contextlib.contextmanager
def redis(workdir: Path) -> Iterator[str]:
    """A Redis of its own on a free port of 127.0.0.1, nothing persisted; yields its URL. A
    server that is installed but does not start is an error (its log says why), not a skip."""
    server, port, log = redis_server_bin(), free_port(), workdir / "redis.log"
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        try:
            wait_for_port(port, proc, "redis-server", 10)
        except ServerUnavailable as exc:
            raise RuntimeError(f"{exc}:\n{log.read_text(errors='replace')}") from None
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc)
