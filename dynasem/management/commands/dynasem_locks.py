from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError

from ... import _clock as clock
from ..._observability.logs import shown_token
from ..._operators import locks, usernames
from ..._storage import records
from ._output import OperatorCommand, hold_row, one_only, pad, printable, refused, show, width

# Said under every list read through the indexes (DynamoDB updates a global secondary index
# after its table, typically within a second, sometimes more): a hold taken, renewed or given
# back in the last seconds may be missing, still shown, or shown as it was.
INDEX_NOTE = (
    f"({locks.INDEX_NOTE} `manage.py dynasem_locks RESOURCE` reads one resource consistently.)"
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
        if options["user"] == "":
            raise CommandError("--user: empty: give a username or a stored user id")
        if options["waiters"] is not None and options["resource"] is None:
            # The filters of a list of holds are refused beside it: it lists one queue.
            named = f"--waiters {options['waiters']!r}"
            instead = "--waiters lists every live waiter of that one resource"
            one_only(options, ("user", "resource_prefix", "all"), named, instead)
            self._waiters(options["waiters"], as_json=options["json"])
            return
        if options["resource"] is not None:
            holds = self._one(options["resource"], options)
        else:
            holds = locks.active_holds(
                user_id=None if options["user"] is None else usernames.user_id_for(options["user"]),
                prefix=options["resource_prefix"],
                include_expired=options["all"],
            )
        names = usernames.usernames(h.user_id for h in holds)
        show(
            self,
            [{**hold_row(h), "username": names.get(h.user_id)} for h in holds],
            lambda: self._table(holds, names),
            as_json=options["json"],
            one=options["resource"],  # else listed through the indexes, updated asynchronously
            nothing=("Nobody holds {!r} (read consistently).", "No active holds."),
            note=INDEX_NOTE,
        )

    def _one(self, resource: str, options: dict[str, Any]) -> list[locks.HoldInfo]:
        """The holds of ``resource`` from one consistent read of its row (and items)."""
        one_only(
            options,
            ("user", "resource_prefix", "waiters"),
            f"RESOURCE {resource!r}",
            "RESOURCE shows that one resource; leave it out to list through the indexes",
        )
        with refused("RESOURCE: "):
            holds = locks.holds_on(resource)
        now = clock.now_ms()
        return [h for h in holds if options["all"] or h.expires_ms >= now]

    def _table(self, holds: list[locks.HoldInfo], names: dict[str, str]) -> None:
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
        with refused("--waiters: "):
            waiters = [_waiter(w) for w in locks.waiters_on(resource)]
        if as_json:
            for place, row in enumerate(waiters, 1):
                self.stdout.write(json.dumps({"resource": resource, "position": place, **row}))
            return
        if not waiters:
            self.stdout.write(f"Nobody is waiting for {resource!r}.")
            return
        self.stdout.write(f"{'#':>4} {'USER':24} {'KIND':9} {'ENTRY EXPIRES (UTC)':20} PUSH  TOKEN")
        for place, row in enumerate(waiters, 1):
            self.stdout.write(
                f"{place:>4} {printable(row['user_id']):24} {row['kind']:9} "
                f"{row['entry_expires'][:19].replace('T', ' '):20} "
                f"{'yes' if row['push'] else 'no':5} {row['token']}"
            )


def _waiter(w: records.Waiter) -> dict[str, Any]:
    return {
        "user_id": w.user_id,
        "kind": "shared" if w.shared else "exclusive",
        "ticket": w.ticket,
        "token": shown_token(w.token),  # a waiter's token becomes its hold's: a secret
        "entry_expires": locks.aware(w.expires_ms).isoformat(),
        "push": bool(w.address),
    }
