"""What dynasem's commands share: columns padded by display width, a quiet end on a closed
pipe (``dynasem_locks --json | head -1``), DynamoDB's and the arguments' errors as
CommandErrors, the ``--yes``/``--log-as`` flow of a command that changes something."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..._observability.logs import shown_token
from ..._operators import audit
from ..._operators.locks import HoldInfo
from ..._storage import dynamodb
from ...exceptions import SemaphoreUnavailable


def width(text: str) -> int:
    """Columns ``text`` takes in a terminal: wide (CJK) and full-width characters two,
    combining marks and zero-width ones none."""
    return sum(
        2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
        for char in text
        if not unicodedata.combining(char) and unicodedata.category(char) not in ("Mn", "Me", "Cf")
    )


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\r``): a name stored
    before dynasem refused them, or by another writer, must not rewrite the operator's
    terminal (ESC [2K, CR) when a command prints it."""
    return "".join(
        c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) == "Cc" else c
        for c in text
    )


def hold_row(hold: HoldInfo) -> dict[str, Any]:
    """A hold as a command's JSON line: its token cut to what logs show (a whole token is a
    hold's secret; ``dynasem_release --token`` takes these first characters)."""
    return {**hold.as_dict(), "token": shown_token(hold.token)}


def pad(text: str, columns: int) -> str:
    """``text`` padded with spaces to ``columns`` display columns (never cut)."""
    return text + " " * max(0, columns - width(text))


@contextlib.contextmanager
def refused(prefix: str | None = None) -> Iterator[None]:
    """DynamoDB's SemaphoreUnavailable as a CommandError (its message); with ``prefix``, an
    argument's TypeError or ValueError too (``prefix`` before its message)."""
    invalid: tuple[type[Exception], ...] = () if prefix is None else (TypeError, ValueError)
    try:
        yield
    except SemaphoreUnavailable as exc:
        raise CommandError(str(exc)) from exc
    except invalid as exc:
        raise CommandError(f"{prefix}{exc}") from exc


class OperatorCommand(BaseCommand):
    """A command an operator waits on: its requests go through the quick client (one attempt,
    short timeouts: ``dynamodb.quick``), DynamoDB unavailable is a CommandError, and a reader
    that went away (``| head``) ends it quietly, as a Unix tool does, instead of a
    BrokenPipeError traceback."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            with dynamodb.quick(), refused():
                result: str | None = super().execute(*args, **options)
                return result
        except BrokenPipeError:
            # Python flushes stdout once more at exit: point it at /dev/null first.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return None


def add_change_arguments(parser: Any, change: str) -> None:
    """``--yes`` (Django's ``--noinput``/``--no-input`` too) and ``--log-as``, of a command that
    changes something (``change``: "each break", "the reset")."""
    parser.add_argument(
        "--yes",
        "--noinput",
        "--no-input",
        action="store_true",
        dest="yes",
        help="do not ask (Django's --noinput/--no-input too)",
    )
    parser.add_argument(
        "--log-as",
        metavar="USERNAME",
        help=f"record {change} in the admin's history as this Django user (default: the user "
        "named as this OS login, if any)",
    )


def ask(yes: bool, question: str, to: str, not_done: str, returncode: int) -> None:
    """Unless ``yes``, ask ``question`` on the terminal (to do ``to``); a CommandError
    (``not_done``, exit status ``returncode``) unless the answer is yes. With no terminal to
    ask on, nothing is done either: the same exit status, not 1."""
    if yes:
        return
    if not sys.stdin or not sys.stdin.isatty():
        raise CommandError(
            f"not a terminal: pass --yes (or --noinput) to {to}. {not_done}", returncode=returncode
        )
    if input(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
        raise CommandError(not_done, returncode=returncode)


def one_only(options: dict[str, Any], flags: Sequence[str], named: str, instead: str) -> None:
    """Refuse the filters ``flags`` (given: neither None nor a switch left off) beside one named
    thing (``named``: "KEY 'x'"), which is read consistently, not listed (``instead``: how to
    list)."""
    for flag in flags:
        if options[flag] not in (None, False):
            raise CommandError(
                f"{named} and --{flag.replace('_', '-')} do not go together: {instead}"
            )


def show(
    command: BaseCommand,
    rows: list[dict[str, Any]],
    table: Callable[[], None],
    *,
    as_json: bool,
    one: str | None,
    nothing: tuple[str, str],
    note: str,
) -> None:
    """A listing as JSON lines or as a ``table``. ``one``: the one thing it shows, read
    consistently (each JSON line says so; ``nothing[0]`` names it when there is none); None: a
    list not read consistently (``nothing[1]`` when empty), which says ``note``, on stderr and
    plain: stdout stays the rows alone for whoever reads them on (awk, grep)."""
    if as_json:
        for row in rows:
            command.stdout.write(json.dumps({**row, "consistent": one is not None}))
        return
    if rows:
        table()
    else:
        command.stdout.write(nothing[1] if one is None else nothing[0].format(printable(one)))
    if one is None:
        command.stderr.write(note, style_func=str)  # no style: nothing failed


def recorder(log_as: str | None) -> tuple[Any, str]:
    """Whom a command records its change as in the admin's history (see ``audit.operator``),
    and why nobody when none: an unknown ``--log-as`` is a CommandError (before anything is
    changed); no auth app or database only means the change goes unrecorded."""
    try:
        return audit.operator(log_as)
    except LookupError as exc:
        raise CommandError(str(exc)) from exc
    except Exception as exc:  # no admin or auth app, no database: the change still works
        if log_as:
            raise CommandError(f"--log-as: {exc}") from exc
        return None, f"the admin's history cannot be written ({exc})"
