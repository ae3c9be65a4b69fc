from __future__ import annotations

from json import dumps
from typing import Any

from django.core.management.base import CommandError

from ..._engine import arguments
from ..._observability.logs import shown_token
from ..._operators import audit, locks
from ...exceptions import SemaphoreUnavailable
from ._output import OperatorCommand, add_change_arguments, ask, hold_row, printable, recorder

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
            "--json",
            action="store_true",
            help="print a JSON line per hold, with broken and outcome (broken, or "
            "changed_since_listed: it went between the read and the break)",
        )
        add_change_arguments(parser, "each break")

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
            arguments.check_resource(resource)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        who, unrecorded = recorder(log_as)
        if token == "":
            raise CommandError("--token must be the first characters of a token, not empty")
        try:
            holds = self._named(resource, token, fence, as_json=json)
            ask(
                yes,
                f"Break {len(holds)} hold(s) on {resource!r}?",
                "break these holds",
                "Nothing broken.",
                NOTHING_BROKEN,
            )
            broken = [
                locks.break_hold(resource, h.token, user_id=h.user_id, fence=h.fence) for h in holds
            ]
        except SemaphoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        for h, done in zip(holds, broken, strict=True):
            if done:
                audit.broke(who, h, h.user_id, " with manage.py dynasem_release")
            if json:
                outcome = "broken" if done else CHANGED
                self.stdout.write(dumps({**hold_row(h), "broken": bool(done), "outcome": outcome}))
        if who is None and any(broken):
            self.stderr.write(f"Not recorded in the admin's history: {unrecorded}.")
        self._outcome(resource, len(holds), sum(map(bool, broken)), as_json=json)

    def _named(
        self, resource: str, token: str | None, fence: int | None, *, as_json: bool
    ) -> list[locks.HoldInfo]:
        """The holds on ``resource`` that ``--token`` and ``--fence`` name (one consistent
        read), shown unless ``as_json``."""
        holds = locks.matching(locks.holds_on(resource), token, fence)
        if not holds:
            which = (f" with token {token}" if token else "") + (
                f" with fence {fence}" if fence is not None else ""
            )
            raise CommandError(
                f"No hold on {resource!r}{which}: nothing broken.", returncode=NOTHING_BROKEN
            )
        _one_per_token(token, holds, resource)
        for h in [] if as_json else holds:
            self.stdout.write(
                f"  {printable(h.resource)}  user={printable(h.user_id)}  "
                f"fence={h.fence}  {h.kind}  token={shown_token(h.token)}"
            )
        return holds

    def _outcome(self, resource: str, shown: int, count: int, *, as_json: bool) -> None:
        """Says how many of the holds shown were broken; exit status 3 unless all were."""
        if count < shown:
            changed = shown - count
            raise CommandError(
                f"Broke {count} of {shown} hold(s) on {resource!r}: {changed} changed since "
                "listed (given back, or taken over, after it was read) and "
                f"{'was' if changed == 1 else 'were'} left alone: each break is conditional on "
                "the token read.",
                returncode=NOTHING_BROKEN,
            )
        if not as_json:
            self.stdout.write(f"Broke {count} hold(s) on {resource!r}.")


def _one_per_token(token: str | None, holds: list[locks.HoldInfo], resource: str) -> None:
    """Refuse a ``--token`` that names several holds: it means one (holders of a counting or
    shared resource whose tokens begin alike: rare, with 8 hex characters)."""
    if token is not None and len(holds) > 1:
        fences = ", ".join(str(h.fence) for h in holds)
        raise CommandError(
            f"--token {token!r} matches {len(holds)} holds on {resource!r} (fences {fences}): "
            "give more of the token, or name one with --fence"
        )
