"""System checks: the DYNASEM settings (no network calls), and the stored format version the
table names (one quick GetItem when the checks run, never at import)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import InvalidRegionError
from botocore.utils import (
    is_valid_endpoint_url,
    is_valid_ipv6_endpoint_url,
    validate_region_name,
)
from django.core.checks import Error, Info, Warning, register

from ._engine import arguments, processes, push
from .conf import DEFAULTS, TABLE_NAME_RE, settings

HINT = "See Settings in dynasem's reference (docs/reference/settings.md)."
# The checks' tags: `manage.py check --tag dynasem_settings` runs the settings' alone, as
# dynasem_createtable does (it writes the format version the table check asks for).
SETTINGS_TAG, TABLE_TAG = "dynasem_settings", "dynasem_table"

# Every check ID reported here, with what it checks: the checks reference
# (docs/reference/checks.md) is generated from this, and tests/project/test_docs_reference.py keeps
# it equal to the IDs used below. E is an Error (manage.py check fails), W a Warning.
CHECK_IDS: dict[str, str] = {
    "dynasem.E001": "`DYNASEM` is a dict.",
    "dynasem.E002": "`DYNASEM` has no key dynasem does not know (a misspelt key would be "
    "ignored); the hint lists the known keys.",
    "dynasem.E003": "`TABLE_NAME` is a str of 3 to 255 characters, each a letter, a digit, "
    "`_`, `-` or `.` (what DynamoDB accepts as a table name).",
    "dynasem.E004": "`ENDPOINT_URL` is `None` or an http(s) URL that botocore accepts (checked "
    "without connecting).",
    "dynasem.E005": "`REGION_NAME` is `None` or a str botocore accepts as a region name.",
    "dynasem.E006": "`LEASE` is a number of seconds (not a bool), more than 0 and at most 7 days.",
    "dynasem.E007": "`WAIT` is `None` or a number of seconds (not a bool), 0 or more "
    "(`math.inf` waits forever).",
    "dynasem.E008": "`CLOCK_SKEW` is a number of seconds (not a bool), 0 or more and at most "
    "7 days.",
    "dynasem.E009": "`LEASE` is longer than `CLOCK_SKEW`: a holder trusts its lease only until "
    "`LEASE - CLOCK_SKEW` has passed.",
    "dynasem.E010": '`PUSH` is `None` or `""` (no pushes) or an IPv4 literal to listen on: '
    "not a name, not `0.0.0.0`, no broadcast or multicast address.",
    "dynasem.E011": '`FAIR` is `True` or `False` (a str such as `"false"` from an environment '
    "variable would read as true).",
    "dynasem.E012": "`TELEMETRY` and `TELEMETRY_RESOURCE_NAMES` are `True` or `False`.",
    "dynasem.E013": "`SAME_HOST_TAKEOVER` is `None`, `True` or `False`.",
    "dynasem.E014": "The table names the stored format version this dynasem reads and writes "
    "(one GetItem of its format item, 1 s to connect, 2 s to answer; asked only when the "
    "settings have no error, and silent when the table cannot be asked: no table, no "
    "credentials, no answer). A table of another version, or naming none, is refused: the "
    "message says what the table has, what this dynasem needs, and what to do. "
    "`manage.py dynasem_createtable --check` asks the same and exits non-zero.",
    "dynasem.E015": "This host's wall clock is within `CLOCK_SKEW` of DynamoDB's, by the `Date` "
    "of the answer to E014's GetItem (whole seconds: only an offset surely past `CLOCK_SKEW` "
    "is reported; silent when the table cannot be asked). A host further off ends every lease "
    "early or late by the other hosts' clocks: it takes over holds still trusted elsewhere, "
    "and fences drawn on either side cross.",
    "dynasem.I001": "Same-host takeover of dead holders is off (`SAME_HOST_TAKEOVER = False`, or "
    "left at `None` on AWS Lambda or in a runtime restored from a snapshot): holders of this "
    "host are taken over when their lease ends, as on another host. Says which rule is in force.",
    "dynasem.W001": "`LEASE` is at least 3 × `CLOCK_SKEW`; a shorter lease makes holders renew "
    "very often.",
    "dynasem.W002": "`dynasem.E015`'s test, against an engine other than AWS's (`ENDPOINT_URL` "
    "set: DynamoDB Local, a proxy): the engine's clock is no trusted reference there (a "
    "container's clock drifts after a laptop sleeps), so a host further from it than "
    "`CLOCK_SKEW` is a Warning, not an Error.",
}


def _valid_endpoint(url: object) -> bool:
    """What botocore would accept as an endpoint, checked without any network call."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return False
    if not parts.hostname:
        return False
    return bool(is_valid_endpoint_url(url) or is_valid_ipv6_endpoint_url(url))


def _valid_region(name: str) -> bool:
    """What botocore accepts as a region name when it makes a client (no network call)."""
    try:
        validate_region_name(name)
    except InvalidRegionError:
        return False
    return True


@register(SETTINGS_TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The ``DYNASEM`` dict's keys, values and timings, checked without a network call."""
    from django.conf import settings as django_settings

    raw = getattr(django_settings, "DYNASEM", {})
    if not isinstance(raw, dict):
        return [Error("DYNASEM must be a dict.", hint=HINT, id="dynasem.E001")]
    known = f"Known keys: {', '.join(sorted(DEFAULTS))}."
    unknown = [
        Error(f"DYNASEM has an unknown key {key!r}.", hint=known, id="dynasem.E002")
        for key in settings.unknown_keys()
    ]
    return unknown + _values(raw) + _takeover_rule() + _timings(raw)


def _error(key: str, expected: str, value: object, check_id: str) -> Any:
    return Error(f"DYNASEM[{key!r}] must be {expected}, not {value!r}.", hint=HINT, id=check_id)


_FAIR_HINT = (
    "A str such as 'false' (from an environment variable) would read as true: convert it, "
    "e.g. os.environ.get('DYNASEM_FAIR') == 'true'."
)


def _type_error(key: str, check_id: str, hint: str | None = HINT) -> list[Any]:
    """A value of the wrong type, as the settings' property refuses it (a TypeError naming
    the key and the value)."""
    try:
        getattr(settings, key)
    except TypeError as exc:
        return [Error(f"{exc}.", hint=hint, id=check_id)]
    return []


def _values(raw: dict[str, Any]) -> list[Any]:
    """The values as written (E003-E005, E010-E012)."""
    problems: list[Any] = []
    table_name, endpoint, address = (
        raw.get(key, DEFAULTS[key]) for key in ("TABLE_NAME", "ENDPOINT_URL", "PUSH")
    )
    if not isinstance(table_name, str) or not TABLE_NAME_RE.fullmatch(table_name):
        expected = "a str of 3 to 255 characters, each a-z, A-Z, 0-9, '_', '-' or '.'"
        problems.append(_error("TABLE_NAME", expected, table_name, "dynasem.E003"))
    if endpoint is not None and not _valid_endpoint(endpoint):
        expected = "None (AWS) or an http(s) URL"
        problems.append(_error("ENDPOINT_URL", expected, endpoint, "dynasem.E004"))
    region = raw.get("REGION_NAME")
    if isinstance(region, str) and not _valid_region(region):
        expected = "None (boto3's chain) or a region name botocore accepts, such as 'eu-west-1'"
        problems.append(_error("REGION_NAME", expected, region, "dynasem.E005"))
    problems += _type_error("REGION_NAME", "dynasem.E005", None)
    # "" is off, as None is: the runtime reads it so (conf.settings.PUSH).
    address_problem = None if address in (None, "") else push.push_address_problem(address)
    if address_problem is not None:
        expected = "None or '' (no hand-over pushes) or this host's IPv4 address to listen on, "
        expected += f"such as '127.0.0.1', not {address!r}: {address_problem}"
        problems.append(Error(f"DYNASEM['PUSH'] must be {expected}.", hint=HINT, id="dynasem.E010"))
    problems += _type_error("FAIR", "dynasem.E011", _FAIR_HINT)
    problems += _type_error("TELEMETRY", "dynasem.E012")
    problems += _type_error("TELEMETRY_RESOURCE_NAMES", "dynasem.E012")
    return problems


def _timings(raw: dict[str, Any]) -> list[Any]:
    """Each number of seconds (E006-E008), then the lease against the clock skew (E009,
    W001)."""
    problems: list[Any] = []
    for key, check, check_id in (
        ("LEASE", arguments.check_lease, "dynasem.E006"),
        ("WAIT", arguments.check_wait, "dynasem.E007"),
        ("CLOCK_SKEW", arguments.check_skew, "dynasem.E008"),
    ):
        value = raw.get(key, DEFAULTS[key])
        try:
            if value is not None or key != "WAIT":  # a WAIT of None waits forever
                check(value, f"DYNASEM[{key!r}]")
        except (TypeError, ValueError) as exc:
            problems.append(Error(str(exc), hint=HINT, id=check_id))
    if problems:
        return problems
    # The skew every acquire uses (arguments.skew_setting: at least MIN_SKEW).
    lease, skew = float(settings.LEASE), max(float(settings.CLOCK_SKEW), arguments.MIN_SKEW)
    if lease <= skew:
        return [
            Error(
                f"DYNASEM['LEASE'] ({lease:g}) must be longer than DYNASEM['CLOCK_SKEW'] "
                f"({skew:g}).",
                hint="A holder trusts its lease only until lease - CLOCK_SKEW has passed.",
                id="dynasem.E009",
            )
        ]
    if lease < 3 * skew:
        return [
            Warning(
                f"DYNASEM['LEASE'] ({lease:g}) is less than 3 x CLOCK_SKEW ({skew:g}): "
                "holders will renew very often.",
                hint="Use a lease of at least a few times the clock skew.",
                id="dynasem.W001",
            )
        ]
    return []


def _takeover_rule() -> list[Any]:
    if problems := _type_error("SAME_HOST_TAKEOVER", "dynasem.E013"):
        return problems
    on, why = processes.takeover_rule()
    if on:
        return []
    return [
        Info(
            f"Same-host takeover of dead holders is off: {why}. Holders of this host are "
            "taken over when their lease ends, as on another host.",
            hint="Machines cloned from one memory snapshot share a boot id: one clone cannot "
            "see the other's processes, so /proc cannot prove them dead (see 'Dead holders').",
            id="dynasem.I001",
        )
    ]


@register(TABLE_TAG)
def check_table_format(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """A table of another stored format (or naming none) is refused: its rows are not what
    this dynasem reads; so is a host whose clock is further than CLOCK_SKEW from DynamoDB's
    (by the same answer). No request on the lock path: the check runs at start-up only."""
    from ._storage import schema

    if any(isinstance(p, Error) for p in check_settings(app_configs)):
        return []  # the settings' own errors first
    problem, offset = schema.format_check()
    errors: list[Any] = []
    if problem is not None:
        errors.append(
            Error(
                f"dynasem's {problem}.",
                hint="See 'Stored format and upgrades' in dynasem's docs "
                "(docs/explanation/stored-format.md).",
                id="dynasem.E014",
            )
        )
    skew = arguments.skew_setting()
    if offset is not None and abs(offset) > skew:
        errors.append(_clock_off(offset, skew))
    return errors


def _clock_off(offset: float, skew: float) -> Any:
    """E015: this host's clock is ``offset`` s from AWS's DynamoDB (ahead: positive), more
    than the skew allowed. Against another engine (W002) its clock is no trusted reference:
    a Warning, so that a drifting container never stops ``migrate`` for nothing."""
    side = "ahead of" if offset > 0 else "behind"
    aws = settings.ENDPOINT_URL is None
    return (Error if aws else Warning)(
        f"This host's clock is at least {abs(offset):.1f} s {side} DynamoDB's, more than "
        f"DYNASEM['CLOCK_SKEW'] ({skew:g} s): its leases end early or late by the other "
        "hosts' clocks, and a lock can have two holders"
        + (
            "." if aws else f" (unless the engine's own clock, at {settings.ENDPOINT_URL}, is off)."
        ),
        hint="Keep the host's clock synchronised (chrony, NTP; on AWS the Amazon Time Sync "
        "Service); raise CLOCK_SKEW only to what your hosts really allow.",
        id="dynasem.E015" if aws else "dynasem.W002",
    )
