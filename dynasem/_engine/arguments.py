"""Argument checks and holder identity: everything is refused before any request is sent."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable
from numbers import Real
from typing import Any

from .._storage import dynamodb, permit_items, records
from ..conf import settings

MAX_RESOURCE_BYTES = 1024
# The resources of leaderships (dynasem.leadership): a view's key template may name one in its
# own text, never through a formatted field (dynasem._engine.decorators). Here, below both.
LEADER_PREFIX = "leader:"
MAX_LEASE = float(records.MAX_LEASE_S)
# The largest ``limit`` (holders of more than 8 permits are in permit items of their own,
# one each, so the table bounds a limit, not an item); 10**9 keeps every limit that can be
# reached, and refuses by name, before any request, what DynamoDB cannot store (numbers of
# at most 38 significant digits: limit=10**40 failed in boto3's serializer,
# decimal.Rounded). It also fits a signed 32-bit integer, for other readers of the table.
MAX_LIMIT = 10**9


def _shown(number: Any) -> str:
    """``number`` for a message: past 64 bits an int is described, not printed (it may have
    more digits than ``str()`` converts, and no float holds it)."""
    if isinstance(number, int) and number.bit_length() > 64:
        digits = int(number.bit_length() * math.log10(2)) + 1
        return f"a {'negative ' if number < 0 else ''}number of about {digits} digits"
    return repr(number)


def utf8_size(value: str, name: str) -> int:
    """``value``'s length in UTF-8 bytes; a ValueError naming ``name`` if it has none.

    A lone surrogate (what a non-UTF-8 byte in ``sys.argv`` or the environment decodes to)
    has no UTF-8 form: no request could carry it, so it is refused here, by name, rather than
    as the codec's own error (or a request's)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # Shown escaped (repr): the message must itself be printable and loggable.
        raise ValueError(
            f"{name} is not valid UTF-8: it contains a lone surrogate "
            f"{value[exc.start]!r} at index {exc.start}: {value[:40]!r}"
        ) from None


def check_printable(text: str, name: str) -> str:
    """``text``, or a ValueError naming ``name`` if it has a control character (C0, DEL,
    C1: Unicode category Cc).

    A name is shown to operators as written (``dynasem_locks``, the admin), where ESC or CR
    rewrites the terminal's line; a NUL cannot be stored by PostgreSQL (``fence_db``). So such
    a name is refused before any request, rather than stored and shown."""
    for index, char in enumerate(text):
        if unicodedata.category(char) == "Cc":
            # Shown escaped (repr): the message must itself be printable and loggable.
            shown = repr(text) if len(text) <= 80 else f"{text[:80]!r}..."
            raise ValueError(
                f"{name} {shown} contains the control character {char!r} at index "
                f"{index}: names must be printable; escape the value (e.g. "
                "dynasem.resource_key) or drop the character"
            )
    return text


def check_resource(resource: Any, name: str = "resource", prefix: str = "") -> str:
    """``prefix + resource``, or a TypeError or ValueError naming ``name`` (what the caller
    wrote, not the key dynasem makes of it with ``prefix``) if it cannot be one."""
    if not isinstance(resource, str):
        raise TypeError(f"{name} must be a str, not {type(resource).__name__}: {resource!r}")
    if not resource:
        raise ValueError(f"{name} must be a non-empty str")
    size, most = utf8_size(resource, name), MAX_RESOURCE_BYTES - len(prefix)
    if size > most:
        made = f" (recorded as {prefix!r} + it)" if prefix else ""
        raise ValueError(
            f"{name} is {size} UTF-8 bytes; at most {most} are allowed{made}: {resource[:40]!r}..."
        )
    return prefix + check_printable(resource, name)


def check_resources(resource: Any) -> list[str]:
    if isinstance(resource, list | tuple):
        if not resource:
            raise ValueError("resource must not be an empty list")
        names = [check_resource(r, f"resource[{i}]") for i, r in enumerate(resource)]
        if len(set(names)) != len(names):
            raise ValueError(f"resource lists a resource twice: {names!r}")
        if len(names) > records.MAX_TRANSACTION:
            raise ValueError(
                f"resource lists {len(names)} resources; at most {records.MAX_TRANSACTION} "
                "can be taken atomically (one DynamoDB transaction)"
            )
        return names
    return [check_resource(resource)]


def check_flag(value: Any, name: str) -> bool:
    """``value`` if it is True or False; a TypeError naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


def check_seconds(
    value: Any, name: str, *, allow_zero: bool = False, allow_inf: bool = False, week: bool = False
) -> float:
    """``value`` in seconds, a float; a TypeError or ValueError naming ``name`` unless it is a
    number, not NaN, > 0 (>= 0 if ``allow_zero``), finite (unless ``allow_inf``) and, if
    ``week``, at most MAX_LEASE."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a number of seconds, not {type(value).__name__}: {value!r}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int (or Fraction) past any float: 10**400
        shown = _shown(math.trunc(value))
        raise ValueError(
            f"{name} must be a number of seconds a float can hold, not {shown}"
        ) from None
    if math.isnan(seconds):
        raise ValueError(f"{name} must be a number of seconds, not NaN")
    if math.isinf(seconds) and not allow_inf:
        raise ValueError(f"{name} must be finite, not {seconds}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, not {seconds}")
    if week and seconds > MAX_LEASE:
        raise ValueError(f"{name} must be at most {MAX_LEASE:g} seconds (7 days), not {seconds:g}")
    return seconds


def check_lease(value: Any, name: str = "lease") -> float:
    return check_seconds(value, name, week=True)


def check_wait(value: Any, name: str = "wait") -> float:
    return check_seconds(value, name, allow_zero=True, allow_inf=True)


def check_skew(value: Any, name: str = "DYNASEM['CLOCK_SKEW']") -> float:
    # Leases must be longer than the skew and are at most MAX_LEASE: a larger skew can never
    # work, and would push fences and reap cut-offs past what DynamoDB stores.
    return check_seconds(value, name, allow_zero=True, week=True)


def check_several(resources: list[str], limit: int, shared: bool) -> None:
    """A ValueError for more resources than one transaction can take in items of their own
    (two actions each): readers of several, any of which may keep its readers in items by
    the time of an acquire, and permits of several. Refused now, not by the state of a row
    at some acquire."""
    items = shared or permit_items.uses_permits(records.Mode.COUNTING, limit)
    most = records.MAX_TRANSACTION // 2
    if len(resources) > 1 and items and len(resources) > most:
        kind = "shared" if shared else f"limit={limit}"
        raise ValueError(
            f"resource lists {len(resources)} resources; a {kind} semaphore takes at most "
            f"{most} at once (each may need two actions of one DynamoDB transaction)"
        )


def check_limit(limit: Any, shared: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int >= 1, not {type(limit).__name__}: {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {_shown(limit)}")
    if limit > MAX_LIMIT:
        raise ValueError(
            f"limit must be at most {MAX_LIMIT} (far more holders than one DynamoDB item can "
            f"list), not {_shown(limit)}"
        )
    if check_flag(shared, "shared") and limit > 1:
        raise ValueError(f"shared=True cannot be combined with limit={limit}: use one or the other")
    return limit


def user_id_of(user: Any) -> str:
    """What is recorded as the holder: a user's primary key, a given str, or this process."""
    if user is None:
        return dynamodb.process_identity()
    if isinstance(user, str):
        if not user:
            raise ValueError("user must be a non-empty str, a Django user or None")
        if utf8_size(user, "user") > MAX_RESOURCE_BYTES:
            raise ValueError(f"user is longer than {MAX_RESOURCE_BYTES} UTF-8 bytes")
        # Shown to operators as written, as a resource is (dynasem_locks, the admin).
        return check_printable(user, "user")
    authenticated = getattr(user, "is_authenticated", None)
    if authenticated is None:
        raise TypeError(f"user must be a Django user, a str or None, not {type(user).__name__}")
    if not authenticated or getattr(user, "pk", None) is None:
        return dynamodb.process_identity()
    # The pk's text is written (and indexed) as userId, and shown as a str user is: the same
    # checks (DynamoDB refuses an empty index key, and one past its size limit, naming
    # neither the user nor the setting).
    user_id, name = str(user.pk), "user (its primary key)"
    if not user_id:
        raise ValueError(f"{name} must be a non-empty str, not {user.pk!r}")
    if utf8_size(user_id, name) > MAX_RESOURCE_BYTES:
        raise ValueError(f"{name} is longer than {MAX_RESOURCE_BYTES} UTF-8 bytes")
    return check_printable(user_id, name)


# Stored times are whole milliseconds, truncated (a lease end up to 2 ms early, counting the
# wall clock's own truncation): a skew below this could not absorb it, and a taker on the same
# clock could take a lock within the last 2 ms its holder trusts (CLOCK_SKEW = 0 is allowed).
MIN_SKEW = 0.002


def skew_setting() -> float:
    """``DYNASEM['CLOCK_SKEW']`` (seconds, checked), at least :data:`MIN_SKEW`."""
    return max(check_skew(settings.CLOCK_SKEW), MIN_SKEW)


# What resolve_timing derived from the settings (each checked), by the settings' version it
# was read under: an acquire finds it in one lookup, not in the sixteen key reads and the
# checks behind it (about 5 % of the lock's own CPU in an uncontended cycle).
_derived: tuple[int, dict[str, float]] = (-1, {})


def _kept(name: str, derive: Callable[[], float]) -> float:
    """``derive()``, which reads and checks settings, kept until ``DYNASEM`` changes; what it
    raises is raised again at each call (nothing is kept)."""
    global _derived
    version, values = _derived
    if version == settings.version and name in values:
        return values[name]
    version = settings.version  # before the read: a change meanwhile makes it stale
    value = derive()
    kept = _derived
    if kept[0] == version:
        kept[1][name] = value
    else:
        _derived = (version, {name: value})
    return value


def _checked_skew() -> float:
    settings.check_types()
    return skew_setting()


def resolve_timing(lease: float | None, wait: float | None) -> tuple[float, float, float]:
    """Lease, wait and skew in seconds: explicit arguments, else the live settings.

    Called before an acquisition's first request: it also refuses a setting of a wrong type
    under any key (a TypeError naming it), used by this acquisition or not."""
    skew = _kept("skew", _checked_skew)  # every key's type first
    if lease is None:
        lease = _kept("lease", lambda: check_lease(settings.LEASE, "DYNASEM['LEASE']"))
    if wait is None:
        wait = _kept("wait", lambda: check_wait(settings.WAIT, "DYNASEM['WAIT']"))
    lease_s, wait_s = lease, wait
    if lease_s <= skew:
        raise ValueError(
            f"lease ({lease_s:g}s) must be longer than DYNASEM['CLOCK_SKEW'] ({skew:g}s): a "
            "holder trusts its lease only until lease - CLOCK_SKEW has passed"
        )
    return lease_s, wait_s, skew
