from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError

from ... import _clock as clock
from ..._observability.logs import shown_token
from ..._operators import locks as operations
from ..._operators import usernames
from ..._storage import records
from ...exceptions import SemaphoreUnavailable
from ._output import OperatorCommand, hold_row, pad, printable, width

# Said under every list read through the indexes (DynamoDB updates a global secondary index
# after its table, typically within a second, sometimes more): a hold taken, renewed or given
# back in the last seconds may be missing, still shown, or shown as it was.
INDEX_NOTE = (
    f"({operations.INDEX_NOTE} `manage.py dynasem_locks RESOURCE` reads one resource consistently.)"
)


class Command(OperatorCommand):
    help = (
        "List the active holds: resource, user, kind, expires, queue depth, fence, from "
        "DynamoDB's indexes (updated asynchronously: a change of the last seconds may not show "
        "yet); or, with RESOURCE, the holds of that one resource, read consistently; or, with "
        "--waiters RESOURCE, the waiters queued for one resource, first in line first."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "resource",
            nargs="?",
            metavar="RESOURCE",
            help="only this resource, read consistently from the table (not through the "
            "indexes): what it shows of this lock is true as of the read",
        )
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
        if options["waiters"] is not None and options["resource"] is None:
            self._waiters(options["waiters"], as_json=options["json"])
            return
        try:
            if options["resource"] is not None:
                holds = self._one(options["resource"], options)
            else:
                holds = operations.active_holds(
                    user_id=usernames.user_id_for(options["user"]) if options["user"] else None,
                    prefix=options["resource_prefix"],
                    include_expired=options["all"],
                )
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        self._show(holds, options["resource"], as_json=options["json"])

    def _one(self, resource: str, options: dict[str, Any]) -> list[operations.HoldInfo]:
        """The holds of ``resource`` from one consistent read of its row (and items)."""
        for flag in ("user", "resource_prefix", "waiters"):
            if options[flag] is not None:
                raise CommandError(
                    f"RESOURCE {resource!r} and --{flag.replace('_', '-')} do not go together: "
                    "RESOURCE shows that one resource; leave it out to list through the indexes"
                )
        try:
            holds = operations.holds_on(resource)
        except (TypeError, ValueError) as exc:
            raise CommandError(f"RESOURCE: {exc}") from exc
        now = clock.now_ms()
        return [h for h in holds if options["all"] or h.expires_ms >= now]

    def _show(
        self, holds: list[operations.HoldInfo], resource: str | None, *, as_json: bool
    ) -> None:
        """The holds as JSON lines or a table. ``resource``: they are that resource's, read
        consistently; None: listed through the indexes, which the output says."""
        names = usernames.usernames(h.user_id for h in holds)
        if as_json:
            for hold in holds:
                row = hold_row(hold)
                row["username"] = names.get(hold.user_id)
                # False: listed through an index, updated asynchronously (see INDEX_NOTE).
                row["consistent"] = resource is not None
                self.stdout.write(json.dumps(row))
            return
        if holds:
            self._table(holds, names)
        elif resource is not None:
            self.stdout.write(f"Nobody holds {printable(resource)!r} (read consistently).")
        else:
            self.stdout.write("No active holds.")
        if resource is None:
            # On stderr, as a note: stdout stays the rows alone for whoever reads them on (awk,
            # grep); and plain, not in the error style (nothing failed).
            self.stderr.write(INDEX_NOTE, style_func=_plain)

    def _table(self, holds: list[operations.HoldInfo], names: dict[str, str]) -> None:
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


def _plain(text: str) -> str:
    return text


def _waiter(w: records.Waiter) -> dict[str, Any]:
    return {
        "user_id": w.user_id,
        "kind": "shared" if w.shared else "exclusive",
        "ticket": w.ticket,
        "token": shown_token(w.token),  # a waiter's token becomes its hold's: a secret
        "entry_expires": datetime.fromtimestamp(w.expires_ms / 1000, tz=UTC).isoformat(),
        "push": bool(w.address),
    }
