from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dynasem import operations
from dynasem.exceptions import SemaphoreUnavailable


class Command(BaseCommand):
    help = "List the active holds: resource, user, kind, expires, queue depth, fence."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--user", help="only holds of this user id (through the userId index)")
        parser.add_argument("--resource-prefix", help="only resources starting with this")
        parser.add_argument("--all", action="store_true", help="include expired, unreaped holds")
        parser.add_argument("--json", action="store_true", help="print JSON lines")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            holds = operations.active_holds(
                user_id=options["user"],
                prefix=options["resource_prefix"],
                include_expired=options["all"],
            )
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            for hold in holds:
                self.stdout.write(json.dumps(hold.as_dict()))
            return
        if not holds:
            self.stdout.write("No active holds.")
            return
        self.stdout.write(
            f"{'RESOURCE':40} {'USER':24} {'KIND':12} {'EXPIRES (UTC)':20} {'QUEUE':>5} FENCE"
        )
        for h in holds:
            self.stdout.write(
                f"{h.resource:40} {h.user_id:24} {h.kind:12} "
                f"{h.expires.strftime('%Y-%m-%d %H:%M:%S'):20} {h.queue_depth:>5} {h.fence}"
            )
