from __future__ import annotations

from json import dumps
from typing import Any

from django.core.management.base import CommandError

from ..._engine import arguments
from ..._observability.logs import shown_token
from ..._operators import audit, locks
from ...exceptions import SemaphoreUnavailable
from . import _output as out

# The exit status when nothing (or not everything shown) was broken: the hold had gone, or
# there was none, or the operator said no. 0: every hold shown was broken.
NOTHING_BROKEN = 3
# A hold shown whose break was refused: its token no longer held the resource when the break
# came (given back, expired and taken over, broken by another operator).
CHANGED = "changed_since_listed"


class Command(out.OperatorCommand):
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
        out.add_change_arguments(parser, "each break")

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
        with out.refused(""):
            arguments.check_resource(resource)
        who, unrecorded = out.recorder(log_as)
        if token == "":
            raise CommandError("--token must be the first characters of a token, not empty")
        holds = self._named(resource, token, fence, as_json=json)
        question = f"Break {len(holds)} hold(s) on {resource!r}?"
        out.ask(yes, question, "break these holds", "Nothing broken.", NOTHING_BROKEN)
        broken: list[bool] = []
        for h in holds:
            # Each break recorded (and said) as it is made: one that fails after others
            # were made stops the command, which must not leave them unrecorded.
            try:
                done = locks.break_hold(resource, h.token, user_id=h.user_id, fence=h.fence)
            except SemaphoreUnavailable as exc:
                raise CommandError(_stopped(resource, holds, broken, h, exc)) from exc
            broken.append(done)
            if done:
                audit.broke(who, h, h.user_id, " with manage.py dynasem_release")
            if json:
                outcome = "broken" if done else CHANGED
                self.stdout.write(
                    dumps({**out.hold_row(h), "broken": bool(done), "outcome": outcome})
                )
        if who is None and any(broken):
            self.stderr.write(f"Not recorded in the admin's history: {unrecorded}.")
        count, changed = sum(broken), len(holds) - sum(broken)
        if changed:
            raise CommandError(
                f"Broke {count} of {len(holds)} hold(s) on {resource!r}: {changed} changed since "
                "listed (given back, or taken over, after it was read) and "
                f"{'was' if changed == 1 else 'were'} left alone: each break is conditional on "
                "the token read.",
                returncode=NOTHING_BROKEN,
            )
        if not json:
            self.stdout.write(f"Broke {count} hold(s) on {resource!r}.")

    def _named(
        self, resource: str, token: str | None, fence: int | None, *, as_json: bool
    ) -> list[locks.HoldInfo]:
        """The holds on ``resource`` that ``--token`` and ``--fence`` name (one consistent
        read), shown unless ``as_json``. A ``--token`` that names several is refused: it means
        one (holders of a counting or shared resource whose tokens begin alike: rare, with 8
        hex characters)."""
        holds = locks.matching(locks.holds_on(resource), token, fence)
        if not holds:
            which = (f" with token {token}" if token else "") + (
                f" with fence {fence}" if fence is not None else ""
            )
            raise CommandError(
                f"No hold on {resource!r}{which}: nothing broken.", returncode=NOTHING_BROKEN
            )
        if token is not None and len(holds) > 1:
            fences = ", ".join(str(h.fence) for h in holds)
            raise CommandError(
                f"--token {token!r} matches {len(holds)} holds on {resource!r} (fences {fences}): "
                "give more of the token, or name one with --fence"
            )
        for h in [] if as_json else holds:
            self.stdout.write(
                f"  {out.printable(h.resource)}  user={out.printable(h.user_id)}  "
                f"fence={h.fence}  {h.kind}  token={shown_token(h.token)}"
            )
        return holds


def _stopped(
    resource: str,
    holds: list[locks.HoldInfo],
    broken: list[bool],
    failed: locks.HoldInfo,
    exc: SemaphoreUnavailable,
) -> str:
    """What a release stopped by a failed break says: the error, what was broken before it
    (recorded), whether the failed one may have been applied, and what was not tried."""
    made = [h for h, done in zip(holds, broken, strict=False) if done]
    text = f"{exc}. Stopped at the hold of fence {failed.fence} on {resource!r}"
    if exc.ambiguous:
        text += " (DynamoDB's answer was lost: it may be broken all the same)"
    text += f"; broke {len(made)} of {len(holds)} hold(s) before it"
    if made:
        text += " (fences " + ", ".join(str(h.fence) for h in made) + ")"
    untried = len(holds) - len(broken) - 1
    if untried:
        text += f"; {untried} not tried"
    return text + ": run it again to break what is left."
