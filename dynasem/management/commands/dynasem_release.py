from __future__ import annotations

import sys
from json import dumps
from typing import Any

from django.core.management.base import CommandError

from ..._engine import arguments as validation
from ..._observability.logs import shown_token
from ..._operators import audit
from ..._operators import locks as operations
from ...exceptions import SemaphoreUnavailable
from ...models import Lock
from ._output import OperatorCommand, hold_row, printable, recorder

# The exit status when nothing (or not everything shown) was broken: the hold had gone, or
# there was none, or the operator said no. 0: every hold shown was broken.
NOTHING_BROKEN = 3
# A hold shown whose break was refused: its token no longer held the resource when the break
# came (given back, expired and taken over, broken by another operator).
CHANGED = "changed_since_listed"


class Command(OperatorCommand):
    help = (
        "Break every hold on RESOURCE (or only the one with --token T, the first characters of "
        "its token as dynasem_locks shows them, or --fence F). Each break is conditional on "
        "that hold's token, so a hold taken meanwhile survives. Asks first "
        "unless --yes (or --noinput). Exit status 0 when every hold shown was broken, 3 when "
        "nothing (or not all of it) was."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("resource")
        parser.add_argument(
            "--token",
            help="break only the hold whose token starts with this (dynasem_locks shows its "
            "first 8 characters); refused if it names several",
        )
        parser.add_argument("--fence", type=int, help="break only the hold with this fence")
        parser.add_argument(
            "--yes",
            "--noinput",
            "--no-input",
            action="store_true",
            dest="yes",
            help="do not ask (Django's --noinput/--no-input too)",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="print a JSON line per hold, with broken and outcome (broken, or "
            "changed_since_listed: it went between the read and the break)",
        )
        parser.add_argument(
            "--log-as",
            metavar="USERNAME",
            help="record each break in the admin's history as this Django user (default: the "
            "user named as this OS login, if any)",
        )

    def handle(  # noqa: C901, PLR0912  (issue 41: split)
        self,
        *args: Any,
        resource: str,
        token: str | None,
        fence: int | None,
        yes: bool,
        json: bool,
        log_as: str | None,
        **options: Any,
    ) -> None:
        try:
            validation.check_resource(resource)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        who, unrecorded = recorder(log_as)
        which = (f" with token {token}" if token else "") + (
            f" with fence {fence}" if fence is not None else ""
        )
        if token == "":
            raise CommandError("--token must be the first characters of a token, not empty")
        try:
            holds = [
                h
                for h in operations.holds_on(resource)
                if (token is None or h.token.startswith(token))
                and (fence is None or h.fence == fence)
            ]
            if not holds:
                raise CommandError(
                    f"No hold on {resource!r}{which}: nothing broken.", returncode=NOTHING_BROKEN
                )
            _one_per_token(token, holds, resource)
            if not json:
                for h in holds:
                    self.stdout.write(
                        f"  {printable(h.resource)}  user={printable(h.user_id)}  "
                        f"fence={h.fence}  {h.kind}  token={shown_token(h.token)}"
                    )
            if not yes:
                if not sys.stdin or not sys.stdin.isatty():
                    raise CommandError(
                        "not a terminal: pass --yes (or --noinput) to break these holds"
                    )
                answer = input(f"Break {len(holds)} hold(s) on {resource!r}? [y/N] ")
                if answer.strip().lower() not in ("y", "yes"):
                    raise CommandError("Nothing broken.", returncode=NOTHING_BROKEN)
            broken = [
                operations.break_hold(resource, h.token, user_id=h.user_id, fence=h.fence)
                for h in holds
            ]
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        for h, done in zip(holds, broken, strict=True):
            if done and who is not None:
                audit.record(
                    who,
                    Lock,
                    resource,
                    f"Broke the hold of {h.user_id} on {resource} (fence {h.fence}) with "
                    "manage.py dynasem_release.",
                )
        if who is None and any(broken):
            self.stderr.write(f"Not recorded in the admin's history: {unrecorded}.")
        if json:
            for h, done in zip(holds, broken, strict=True):
                outcome = "broken" if done else CHANGED
                self.stdout.write(dumps({**hold_row(h), "broken": bool(done), "outcome": outcome}))
        count = sum(map(bool, broken))
        if count < len(holds):
            changed = len(holds) - count
            raise CommandError(
                f"Broke {count} of {len(holds)} hold(s) on {resource!r}: {changed} changed since "
                "listed (given back, or taken over, after it was read) and "
                f"{'was' if changed == 1 else 'were'} left alone: each break is conditional on "
                "the token read.",
                returncode=NOTHING_BROKEN,
            )
        if not json:
            self.stdout.write(f"Broke {count} hold(s) on {resource!r}.")


def _one_per_token(token: str | None, holds: list[operations.HoldInfo], resource: str) -> None:
    """Refuse a ``--token`` that names several holds: it means one (holders of a counting or
    shared resource whose tokens begin alike: rare, with 8 hex characters)."""
    if token is not None and len(holds) > 1:
        fences = ", ".join(str(h.fence) for h in holds)
        raise CommandError(
            f"--token {token!r} matches {len(holds)} holds on {resource!r} (fences {fences}): "
            "give more of the token, or name one with --fence"
        )
