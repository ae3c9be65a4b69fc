from __future__ import annotations

import sys
from json import dumps
from typing import Any

from django.core.management.base import CommandError

from dynasem import audit, operations, validation
from dynasem.exceptions import SemaphoreUnavailable
from dynasem.models import Lock

from ._output import OperatorCommand, recorder

# The exit status when nothing (or not everything shown) was broken: the hold had gone, or
# there was none, or the operator said no. 0: every hold shown was broken.
NOTHING_BROKEN = 3


class Command(OperatorCommand):
    help = (
        "Break every hold on RESOURCE (or only the one with --token T or --fence F). Each break "
        "is conditional on that hold's token, so a hold taken meanwhile survives. Asks first "
        "unless --yes (or --noinput). Exit status 0 when every hold shown was broken, 3 when "
        "nothing (or not all of it) was."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("resource")
        parser.add_argument("--token", help="break only the hold with this token")
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
            "--json", action="store_true", help="print a JSON line per hold, with broken"
        )
        parser.add_argument(
            "--log-as",
            metavar="USERNAME",
            help="record each break in the admin's history as this Django user (default: the "
            "user named as this OS login, if any)",
        )

    def handle(
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
        try:
            holds = [
                h
                for h in operations.holds_on(resource)
                if (token is None or h.token == token) and (fence is None or h.fence == fence)
            ]
            if not holds:
                raise CommandError(
                    f"No hold on {resource!r}{which}: nothing broken.", returncode=NOTHING_BROKEN
                )
            if not json:
                for h in holds:
                    self.stdout.write(
                        f"  {h.resource}  user={h.user_id}  fence={h.fence}  {h.kind}"
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
                self.stdout.write(dumps({**h.as_dict(), "broken": bool(done)}))
        count = sum(map(bool, broken))
        if count < len(holds):
            raise CommandError(
                f"Broke {count} of {len(holds)} hold(s) on {resource!r}: the others had gone.",
                returncode=NOTHING_BROKEN,
            )
        if not json:
            self.stdout.write(f"Broke {count} hold(s) on {resource!r}.")
