"""A DynamoDB-compatible server that needs nothing but pip: moto's server, one request at a time.

    python -m dynasem.testing --port 8001
    # then DYNASEM_ENDPOINT_URL=http://127.0.0.1:8001

Good enough for the demo and for trying dynasem out; use DynamoDB Local or AWS for anything
else. Everything lives in memory and is gone when the process stops.

Why not ``moto_server`` or ``moto.server.ThreadedMotoServer``? Both serve every request on its
own thread, and moto's backend does not make a conditional write atomic: under contention two
``attribute_not_exists`` puts on the same key were both seen to succeed. A lock is only as good
as that condition, so this server handles requests strictly one after another, which makes
every request atomic with respect to every other one.

It also answers ``size()`` as DynamoDB does, where moto does not (see
:func:`_answer_size_as_dynamodb`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

try:
    # moto >= 5.1: keeps header spellings that werkzeug would drop; harmless for DynamoDB.
    from moto.moto_server.werkzeug_app import MotoRequestHandler as _BaseHandler
except ImportError:  # pragma: no cover - older moto 5.0.x
    _BaseHandler = WSGIRequestHandler  # type: ignore[misc,assignment]  # same interface

from moto.dynamodb import comparisons
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8001

__all__ = ["EmbeddedDynamoDB", "main", "make_dynamodb_server"]


# Set on the thread that serves a request of ours, for as long as moto handles it.
_serving = threading.local()


class _NoSize:
    """What DynamoDB's ``size()`` is of a missing item or attribute, or of one with no size
    (a number, a boolean, null): no value. Every comparison with it is false but ``<>``, which
    is true; ``NOT`` turns those over (as DynamoDB Local answers)."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return False  # and != is true: Python's default, the opposite of ==

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self) -> str:
        return "<no size>"


_NO_SIZE = _NoSize()
# The types DynamoDB's size() measures: strings, binaries, sets, lists and maps.
_SIZED = frozenset({"S", "B", "SS", "NS", "BS", "L", "M"})


class _SizeAsDynamoDB(comparisons.FuncSize):
    def expr(self, item: Any) -> Any:
        if getattr(_serving, "active", False) and self.attr.get_type(item) not in _SIZED:
            return _NO_SIZE
        return super().expr(item)


def _answer_size_as_dynamodb() -> None:
    """Make ``size()`` of nothing a false comparison, not an error, in our server.

    moto raises ``ValueError`` for ``size(#h)`` when the item or the attribute is missing (or
    is a number): a 500 for an UpdateItem, which botocore retries and dynasem then reports as
    DynamoDB being unavailable, and a cancellation reason ``ValueError`` in a transaction.
    DynamoDB refuses the write instead (ConditionalCheckFailed, with the old item when asked),
    and dynasem's conditions count on that: ``size(#h) = :size`` on a row reaped since it was
    read must be refused so that the lock is taken as free. moto's parser builds functions
    from ``FUNC_CLASS`` as it parses each request, so a subclass put there answers for every
    condition and filter; it keeps moto's own answer outside this server's thread (a test
    suite's ``mock_aws`` is left as it was). Idempotent."""
    func_class = getattr(comparisons, "FUNC_CLASS", None)
    if isinstance(func_class, dict) and func_class.get("size") is comparisons.FuncSize:
        func_class["size"] = _SizeAsDynamoDB


def _as_dynamodb(app: Any) -> Any:
    """The WSGI app, with :func:`_answer_size_as_dynamodb`'s answers while it handles a
    request (moto builds the whole response inside the call)."""

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        _serving.active = True
        try:
            return app(environ, start_response)
        finally:
            _serving.active = False

    return serve


class _OneAtATimeHandler(_BaseHandler):
    # HTTP/1.0 closes the connection after each response. With a single-threaded server that
    # matters: botocore keeps connections alive, and one idle kept-alive client would otherwise
    # hold the only worker and starve every other client. Setting it here (not inheriting) also
    # stops werkzeug from switching a shared handler class to HTTP/1.1 for a threaded server.
    protocol_version = "HTTP/1.0"


class _QuietHandler(_OneAtATimeHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # One line per DynamoDB request drowns the Django runserver log; errors still show.
        pass


def make_dynamodb_server(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, quiet: bool = False
) -> BaseWSGIServer:
    """Bind (``port=0`` picks a free port) and return an unstarted, single-threaded server.

    Call ``serve_forever()`` on it; ``server.server_port`` is the bound port.
    """
    _answer_size_as_dynamodb()
    app = _as_dynamodb(DomainDispatcherApplication(create_backend_app))
    handler = _QuietHandler if quiet else _OneAtATimeHandler
    # threaded=False, processes=1: werkzeug's BaseWSGIServer, requests served in turn.
    return make_server(host, port, app, threaded=False, processes=1, request_handler=handler)


class EmbeddedDynamoDB:
    """The server on a daemon thread of this process; also a context manager.

    ``with EmbeddedDynamoDB() as db: ... db.endpoint_url ...``
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = 0, *, quiet: bool = True):
        self.host, self.port, self.quiet = host, port, quiet
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` — the value for ``DYNASEM["ENDPOINT_URL"]``."""
        if self._server is None:
            raise RuntimeError("EmbeddedDynamoDB is not started; call start() first")
        return f"http://{self.host}:{self._server.server_port}"

    def start(self) -> EmbeddedDynamoDB:
        """Bind now (so the port is known and errors surface here), then serve on a thread."""
        if self._server is not None:
            return self
        self._server = make_dynamodb_server(self.host, self.port, quiet=self.quiet)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="embedded-dynamodb", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; the in-memory tables are dropped."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return  # not started
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> EmbeddedDynamoDB:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _write_atomically(path: Path, text: str) -> None:
    # A watcher polling for the file must never read it half-written.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m dynasem.testing",
        description="An in-memory DynamoDB-compatible server (moto) serving one request at a time.",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to bind (%(default)s)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port, 0 for a free one (%(default)s)"
    )
    parser.add_argument(
        "--port-file",
        type=Path,
        help="once listening, write the bound port here (lets a script use --port 0 race-free)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log every request")
    args = parser.parse_args(argv)

    server = make_dynamodb_server(args.host, args.port, quiet=args.quiet)

    # SIGTERM raises KeyboardInterrupt, as SIGINT does: serve_forever() is interrupted by
    # raising out of it; shutdown() would deadlock here because it waits for the very loop
    # the handler runs on.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    url = f"http://{args.host}:{server.server_port}"
    if args.port_file is not None:
        _write_atomically(args.port_file, f"{server.server_port}\n")
    print(f"Embedded DynamoDB (moto, one request at a time) listening on {url}", flush=True)
    with server, contextlib.suppress(KeyboardInterrupt):  # the socket closed on the way out
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
