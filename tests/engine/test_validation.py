"""dynasem._engine.arguments: arguments refused with a message naming them, before any request."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.test import override_settings

from dynasem._engine import arguments as validation
from dynasem._storage import dynamodb, records


@pytest.mark.parametrize(
    "value, error, words",
    [
        (42, TypeError, "resource must be a str, not int"),
        ("", ValueError, "non-empty"),
        ("é" * 513, ValueError, "1026 UTF-8 bytes; at most 1024"),
    ],
)
def test_check_resource_names_the_problem(value: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        validation.check_resource(value)
    assert validation.check_resource("é" * 512) == "é" * 512  # 1,024 bytes: the limit


def test_check_resources_takes_one_or_a_list() -> None:
    assert validation.check_resources("a") == ["a"]
    assert validation.check_resources(("a", "b")) == ["a", "b"]
    with pytest.raises(ValueError, match="empty list"):
        validation.check_resources([])
    with pytest.raises(ValueError, match="twice"):
        validation.check_resources(["a", "a"])
    with pytest.raises(TypeError, match=r"resource\[1\]"):
        validation.check_resources(["a", 2])
    with pytest.raises(ValueError, match="atomically"):
        validation.check_resources([f"r{i}" for i in range(records.MAX_TRANSACTION + 1)])


@pytest.mark.parametrize("value", [True, "5", None, math.nan, math.inf, 0, -1, 8 * 24 * 3600])
def test_check_lease_refuses(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="lease"):
        validation.check_lease(value)


def test_check_wait_allows_zero_and_forever_but_not_negative() -> None:
    assert validation.check_wait(0) == 0.0
    assert validation.check_wait(math.inf) == math.inf
    with pytest.raises(ValueError, match="wait must be >= 0"):
        validation.check_wait(-0.5)


def test_check_limit_and_shared() -> None:
    assert validation.check_limit(3, False) == 3
    with pytest.raises(TypeError, match="limit"):
        validation.check_limit(True, False)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        validation.check_limit(0, False)
    with pytest.raises(TypeError, match="shared"):
        validation.check_limit(1, "yes")
    with pytest.raises(ValueError, match="shared=True cannot be combined with limit=2"):
        validation.check_limit(2, True)


def test_user_id_of() -> None:
    class User:
        is_authenticated = True
        pk = 7

    class Anonymous:
        is_authenticated = False
        pk = None

    assert validation.user_id_of(User()) == "7"
    assert validation.user_id_of("alice") == "alice"
    assert validation.user_id_of(None) == dynamodb.process_identity()
    assert validation.user_id_of(Anonymous()) == dynamodb.process_identity()
    with pytest.raises(ValueError, match="non-empty"):
        validation.user_id_of("")
    with pytest.raises(TypeError, match="Django user, a str or None"):
        validation.user_id_of(42)


def test_resolve_timing_reads_the_live_settings() -> None:
    with override_settings(DYNASEM={"LEASE": 30, "WAIT": 2, "CLOCK_SKEW": 1}):
        assert validation.resolve_timing(None, None) == (30.0, 2.0, 1.0)
        assert validation.resolve_timing(10.0, 0.0) == (10.0, 0.0, 1.0)
        with pytest.raises(ValueError, match="must be longer than DYNASEM\\['CLOCK_SKEW'\\]"):
            validation.resolve_timing(1.0, None)


# ---------------------------------------------------------------------------------------------
# Bad input from outside: lone surrogates, numbers too large
# ---------------------------------------------------------------------------------------------

LONE = "acc-\ud800-x"  # what a non-UTF-8 byte in argv or an environment variable decodes to


class _User:
    is_authenticated = True

    def __init__(self, pk: Any) -> None:
        self.pk = pk


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: validation.check_resource(LONE), "resource"),
        (lambda: validation.check_resource(LONE * 300), "resource"),  # also past 1024 bytes
        (lambda: validation.check_resources(["ok", LONE]), r"resource\[1\]"),
        (lambda: validation.check_resource(LONE, "key"), "key"),
        (lambda: validation.user_id_of(LONE), "user"),
        (lambda: validation.user_id_of(LONE * 300), "user"),
        (lambda: validation.user_id_of(_User(LONE)), "user"),
    ],
    ids=["resource", "long-resource", "resource-list", "key", "user", "long-user", "user-pk"],
)
def test_a_lone_surrogate_is_refused_naming_the_argument(call: Any, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} .*lone surrogate") as raised:
        call()
    assert not isinstance(raised.value, UnicodeError)  # not the codec's own error
    assert "\\ud800" in str(raised.value)  # shown escaped: the message itself prints


def test_a_lone_surrogate_is_refused_before_any_request(requests_sent: Any) -> None:
    from dynasem import run_once, semaphore

    requests_sent.reset()
    for make, name in [
        (lambda: semaphore(LONE), "resource"),
        (lambda: semaphore(["ok", LONE]), r"resource\[1\]"),
        (lambda: semaphore("ok", user=LONE), "user"),
        (lambda: semaphore("ok", user=_User(LONE)), "user"),
        (lambda: run_once(LONE), "key"),
        (lambda: run_once("ok", user=LONE), "user"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name} .*lone surrogate"):
            with make():
                pass  # pragma: no cover - never entered
    assert requests_sent.total == 0


def test_limit_has_an_upper_bound() -> None:
    assert validation.check_limit(validation.MAX_LIMIT, False) == validation.MAX_LIMIT
    for limit in [validation.MAX_LIMIT + 1, 10**40, 10**400]:
        with pytest.raises(ValueError, match=r"^limit must be at most 1000000000"):
            validation.check_limit(limit, False)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: validation.check_lease(10**400), "lease"),
        (lambda: validation.check_wait(10**400), "wait"),
        (lambda: validation.check_skew(10**400), r"DYNASEM\['CLOCK_SKEW'\]"),
        (lambda: validation.check_skew(1e300), r"DYNASEM\['CLOCK_SKEW'\]"),
        (lambda: validation.check_lease(1e300), "lease"),
    ],
    ids=["lease-int", "wait-int", "skew-int", "skew-float", "lease-float"],
)
def test_seconds_too_large_are_refused_naming_the_argument(call: Any, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        call()


def test_huge_numbers_are_refused_before_any_request(requests_sent: Any) -> None:
    from dynasem import run_once, semaphore

    requests_sent.reset()
    for make, name in [
        (lambda: semaphore("ok", limit=10**40), "limit"),
        (lambda: semaphore("ok", lease=1e300), "lease"),
        (lambda: semaphore("ok", lease=10**400), "lease"),
        (lambda: semaphore("ok", wait=10**400), "wait"),
        (lambda: semaphore("ok", max_hold=10**400), "max_hold"),
        (lambda: semaphore("ok", max_hold=math.inf), "max_hold"),
        (lambda: run_once("ok", lease=10**400), "lease"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            with make():
                pass  # pragma: no cover - never entered
    assert requests_sent.total == 0


def test_huge_but_allowed_numbers_work(lock_table: str) -> None:
    from dynasem import semaphore

    # A wait of 1e300 s is as good as forever; max_hold of 1e300 s as good as none.
    with semaphore("big", limit=validation.MAX_LIMIT, wait=1e300, max_hold=1e300) as held:
        assert held.fence > 0


# A terminal rewrites its line on these (ESC [2K, CR); PostgreSQL cannot store a NUL; a C1
# control (U+009B) is a CSI to some terminals too.
CONTROLS = ["\x00", "\x1b", "\r", "\n", "\t", "\x7f", "\x9b"]


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_a_control_character_in_a_resource_is_refused_naming_it(char: str) -> None:
    resource = f"tbl_issues:1{char}[2Kbilling:7"
    with pytest.raises(ValueError) as raised:
        validation.check_resource(resource)
    message = str(raised.value)
    assert message.startswith(f"resource {resource!r} contains the control character {char!r}")
    assert char not in message  # shown escaped: the message itself prints
    with pytest.raises(ValueError, match=r"^resource\[1\] "):
        validation.check_resources(["ok", resource])
    with pytest.raises(ValueError, match="^key "):
        validation.check_resource(resource, "key")


def test_printable_resources_are_still_taken() -> None:
    for resource in ["tbl_issues:1", "a b", "é/日本", "👨\u200d👩\u200d👧", "%1B"]:
        assert validation.check_resource(resource) == resource


def test_a_control_character_is_refused_by_every_entry_point_before_any_request(
    requests_sent: Any,
) -> None:
    from dynasem import leadership, run_once, semaphore
    from dynasem._background import unique

    bad = "tbl_issues:1\x1b[2K\rbilling:7"
    requests_sent.reset()
    for make, name in [
        (lambda: semaphore(bad), "resource"),
        (lambda: semaphore(["ok", bad]), r"resource\[1\]"),
        (lambda: semaphore(bad, fence_db=True), "resource"),
        (lambda: run_once(bad), "key"),
        (lambda: leadership("beat\x00"), "a leadership's name"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name} .*control character"):
            with make():
                pass  # pragma: no cover - never entered
    with pytest.raises(ValueError, match="control character"):
        unique.claim(bad, "task-1", 10)
    assert requests_sent.total == 0
