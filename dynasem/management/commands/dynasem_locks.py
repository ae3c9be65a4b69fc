from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError

from dynasem import operations, table, usernames
from dynasem.exceptions import SemaphoreUnavailable
from dynasem.logs import shown_token

from ._output import OperatorCommand, hold_row, pad, printable, width


class Command(OperatorCommand):
    help = (
        "List the active holds: resource, user, kind, expires, queue depth, fence; or, with "
        "--waiters RESOURCE, the waiters queued for one resource, first in line first."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--user",
            help="only holds of this user: a username, or a stored user id (the userId index)",
        )
        parser.add_argument("--resource-prefix", help="only resources starting with this")
        parser.add_argument("--all", action="store_true", help="include expired, unreaped holds")
        parser.add_argument("--json", action="store_true", help="print JSON lines")
        parser.add_argument(
            "--waiters",
            metavar="RESOURCE",
            help="list the live waiters queued for RESOURCE instead (its queue's entries)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["waiters"] is not None:
            self._waiters(options["waiters"], as_json=options["json"])
            return
        try:
            holds = operations.active_holds(
                user_id=usernames.user_id_for(options["user"]) if options["user"] else None,
                prefix=options["resource_prefix"],
                include_expired=options["all"],
            )
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        names = usernames.usernames(h.user_id for h in holds)
        if options["json"]:
            for hold in holds:
                row = hold_row(hold)
                row["username"] = names.get(hold.user_id)
                self.stdout.write(json.dumps(row))
            return
        if not holds:
            self.stdout.write("No active holds.")
            return
        users = [printable(names.get(h.user_id, h.user_id)) for h in holds]
        resources = [printable(h.resource) for h in holds]
        wide = max(40, *(width(r) for r in resources))
        who = max(24, *(width(u) for u in users))
        self.stdout.write(
            f"{pad('RESOURCE', wide)} {pad('USER', who)} {'KIND':12} {'EXPIRES (UTC)':20} "
            f"{'QUEUE':>5} FENCE"
        )
        for h, resource, user in zip(holds, resources, users, strict=True):
            self.stdout.write(
                f"{pad(resource, wide)} {pad(user, who)} {h.kind:12} "
                f"{h.expires.strftime('%Y-%m-%d %H:%M:%S'):20} {h.queue_depth:>5} {h.fence}"
            )

    def _waiters(self, resource: str, *, as_json: bool) -> None:
        try:
            waiters = operations.waiters_on(resource)
        except ValueError as exc:
            raise CommandError(f"--waiters: {exc}") from exc
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        if as_json:
            for place, w in enumerate(waiters, 1):
                self.stdout.write(
                    json.dumps({"resource": resource, "position": place, **_waiter(w)})
                )
            return
        if not waiters:
            self.stdout.write(f"Nobody is waiting for {resource!r}.")
            return
        self.stdout.write(f"{'#':>4} {'USER':24} {'KIND':9} {'ENTRY EXPIRES (UTC)':20} PUSH  TOKEN")
        for place, w in enumerate(waiters, 1):
            row = _waiter(w)
            self.stdout.write(
                f"{place:>4} {printable(row['user_id']):24} {row['kind']:9} "
                f"{row['entry_expires'][:19].replace('T', ' '):20} "
                f"{'yes' if row['push'] else 'no':5} {row['token']}"
            )


def _waiter(w: table.Waiter) -> dict[str, Any]:
    return {
        "user_id": w.user_id,
        "kind": "shared" if w.shared else "exclusive",
        "ticket": w.ticket,
        "token": shown_token(w.token),  # a waiter's token becomes its hold's: a secret
        "entry_expires": datetime.fromtimestamp(w.expires_ms / 1000, tz=UTC).isoformat(),
        "push": bool(w.address),
    }
