from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dynasem import operations, table, validation
from dynasem.exceptions import SemaphoreUnavailable


class Command(BaseCommand):
    help = (
        "Break every hold on RESOURCE (or only --token T). Each break is conditional on that "
        "hold's token, so a hold taken meanwhile survives. Asks first unless --yes."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("resource")
        parser.add_argument("--token", help="break only the hold with this token")
        parser.add_argument("--yes", action="store_true", help="do not ask")

    def execute(self, *args: Any, **options: Any) -> str | None:
        # An operator waits: one attempt, short timeouts (table.quick), not the locks' own.
        with table.quick():
            return super().execute(*args, **options)

    def handle(
        self, *args: Any, resource: str, token: str | None, yes: bool, **options: Any
    ) -> None:
        try:
            validation.check_resource(resource)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        try:
            holds = [h for h in operations.holds_on(resource) if token is None or h.token == token]
            if not holds:
                self.stdout.write(
                    f"No hold on {resource!r}" + (f" with token {token}." if token else ".")
                )
                return
            for h in holds:
                self.stdout.write(f"  {h.resource}  user={h.user_id}  fence={h.fence}  {h.kind}")
            if not yes:
                if not sys.stdin or not sys.stdin.isatty():
                    raise CommandError("not a terminal: pass --yes to break these holds")
                answer = input(f"Break {len(holds)} hold(s) on {resource!r}? [y/N] ")
                if answer.strip().lower() not in ("y", "yes"):
                    self.stdout.write("Nothing broken.")
                    return
            broken = sum(
                operations.break_hold(resource, h.token, user_id=h.user_id, fence=h.fence)
                for h in holds
            )
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Broke {broken} hold(s) on {resource!r}.")
