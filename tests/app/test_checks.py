"""System checks of the DYNASEM settings: ids, messages, and no network."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.checks import ERROR, WARNING, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from dynasem.checks import check_settings
from dynasem.conf import DEFAULTS

VALID = {
    "TABLE_NAME": "locks",
    "ENDPOINT_URL": "http://127.0.0.1:1",  # a closed port: checks must never connect
    "REGION_NAME": "eu-west-1",
    "LEASE": 60,
    "WAIT": 0,
    "CLOCK_SKEW": 5,
}


def check(**overrides: Any) -> list[Any]:
    with override_settings(DYNASEM={**VALID, **overrides}):
        return check_settings()


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_valid_settings_give_no_messages():
    assert check() == []
    assert check(WAIT=None, ENDPOINT_URL=None, REGION_NAME=None) == []
    assert check(WAIT=math.inf, LEASE=0.5, CLOCK_SKEW=0.1) == []
    assert check(ENDPOINT_URL="https://dynamodb.eu-west-1.amazonaws.com") == []
    with override_settings(DYNASEM={}):
        assert check_settings() == []


def test_absent_dynasem_setting_is_valid():
    with override_settings():
        del django_settings.DYNASEM
        assert check_settings() == []


def test_dynasem_not_a_dict():
    for bad in [None, ["LEASE", 60], "LEASE=60"]:
        with override_settings(DYNASEM=bad):
            messages = check_settings()
        assert ids(messages) == ["dynasem.E001"], bad
        assert messages[0].level == ERROR


def test_unknown_key():
    messages = check(LEAS=30, AWS_SECRET_ACCESS_KEY="x")
    assert ids(messages) == ["dynasem.E002", "dynasem.E002"]
    text = " ".join(m.msg for m in messages)
    assert "'LEAS'" in text
    assert "'AWS_SECRET_ACCESS_KEY'" in text
    assert "LEASE" in messages[0].hint  # the hint lists the known keys


@pytest.mark.parametrize("bad", ["ab", "", 42, None, "x" * 256])
def test_bad_table_name(bad):
    messages = check(TABLE_NAME=bad)
    assert ids(messages) == ["dynasem.E003"]
    assert "TABLE_NAME" in messages[0].msg


@pytest.mark.parametrize("bad", ["127.0.0.1:8000", "localhost", "ftp://host", 8000, ""])
def test_bad_endpoint_url(bad):
    messages = check(ENDPOINT_URL=bad)
    assert ids(messages) == ["dynasem.E004"]
    assert "ENDPOINT_URL" in messages[0].msg
    assert repr(bad) in messages[0].msg


@pytest.mark.parametrize(
    "bad", ["http://", "https://:8000", "http://exa mple.com", "http://host:port", "http://[::1"]
)
def test_endpoint_url_botocore_would_refuse(bad):
    assert ids(check(ENDPOINT_URL=bad)) == ["dynasem.E004"]


@pytest.mark.parametrize(
    "good",
    ["http://localhost:8000", "https://dynamodb.us-east-1.amazonaws.com", "http://[::1]:8000"],
)
def test_good_endpoint_urls(good):
    assert check(ENDPOINT_URL=good) == []


def test_bad_region():
    assert ids(check(REGION_NAME=1)) == ["dynasem.E005"]


@pytest.mark.parametrize("bad", ["us east 1", "eu-west-1.", "-eu-west-1", "eu_west_1"])
def test_a_region_name_botocore_refuses_is_e005(bad):
    """A str that is no region name (a space, a trailing dot) passed the checks; every
    request then failed with botocore's InvalidRegionError."""
    messages = check(REGION_NAME=bad)
    assert ids(messages) == ["dynasem.E005"]
    assert repr(bad) in messages[0].msg


@pytest.mark.parametrize("bad", ["60", None, True, [60], 0, -1, math.nan, math.inf, 8 * 24 * 3600])
def test_bad_lease(bad):
    messages = check(LEASE=bad)
    assert ids(messages) == ["dynasem.E006"]
    assert messages[0].level == ERROR
    assert "LEASE" in messages[0].msg


@pytest.mark.parametrize("bad", ["0", True, -1, -0.5, math.nan, [1]])
def test_bad_wait(bad):
    messages = check(WAIT=bad)
    assert ids(messages) == ["dynasem.E007"]
    assert "WAIT" in messages[0].msg


@pytest.mark.parametrize("bad", ["5", None, False, -1, math.nan, math.inf])
def test_bad_clock_skew(bad):
    messages = check(CLOCK_SKEW=bad)
    assert ids(messages) == ["dynasem.E008"]
    assert "CLOCK_SKEW" in messages[0].msg


@pytest.mark.parametrize(("lease", "skew"), [(5, 5), (1, 2), (0.5, 0.5), (3, 10)])
def test_lease_not_longer_than_clock_skew(lease, skew):
    messages = check(LEASE=lease, CLOCK_SKEW=skew)
    assert ids(messages) == ["dynasem.E009"]
    assert messages[0].level == ERROR
    assert messages[0].hint


def test_lease_default_against_clock_skew():
    # Only CLOCK_SKEW given: it is compared with the default LEASE (60).
    with override_settings(DYNASEM={"CLOCK_SKEW": 60}):
        assert ids(check_settings()) == ["dynasem.E009"]
    with override_settings(DYNASEM={"CLOCK_SKEW": 30}):
        assert ids(check_settings()) == ["dynasem.W001"]


@pytest.mark.parametrize(("lease", "skew"), [(10, 5), (14.9, 5), (1, 0.5)])
def test_short_lease_warns(lease, skew):
    messages = check(LEASE=lease, CLOCK_SKEW=skew)
    assert ids(messages) == ["dynasem.W001"]
    assert messages[0].level == WARNING


@pytest.mark.parametrize(("lease", "skew"), [(15, 5), (60, 5), (1, 0)])
def test_long_enough_lease_is_quiet(lease, skew):
    assert check(LEASE=lease, CLOCK_SKEW=skew) == []


def test_several_problems_are_all_reported():
    messages = check(TABLE_NAME="x", ENDPOINT_URL="nope", LEASE="1", WAIT=-1, CLOCK_SKEW="s")
    assert sorted(ids(messages)) == [
        "dynasem.E003",
        "dynasem.E004",
        "dynasem.E006",
        "dynasem.E007",
        "dynasem.E008",
    ]


def test_checks_are_registered_with_django():
    with override_settings(DYNASEM={**VALID, "LEASE": -1}):
        assert "dynasem.E006" in ids(run_checks())
        with pytest.raises(SystemCheckError, match="dynasem.E006"):
            call_command("check")
    with override_settings(DYNASEM=VALID):
        assert not [i for i in ids(run_checks()) if i.startswith("dynasem.")]


def test_checks_send_no_requests(lock_table, requests_sent):
    requests_sent.reset()
    assert check_settings() == []
    with override_settings(DYNASEM={**VALID, "LEASE": 1, "CLOCK_SKEW": 2}):
        assert ids(check_settings()) == ["dynasem.E009"]
    run_checks()
    assert requests_sent.total == 0


def test_checks_do_not_wait_for_an_unreachable_endpoint():
    # A closed port and an address that would hang: a network call would fail or stall.
    for endpoint in ["http://127.0.0.1:1", "http://10.255.255.1:8000"]:
        started = time.monotonic()
        assert check(ENDPOINT_URL=endpoint) == []
        assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("bad", ["false", "False", "true", "0", 0, 1, None, [True]])
def test_bad_fair(bad):
    # "false" from an environment variable would otherwise mean True.
    messages = check(FAIR=bad)
    assert ids(messages) == ["dynasem.E011"]
    assert messages[0].level == ERROR
    assert "FAIR" in messages[0].msg
    assert repr(bad) in messages[0].msg


@pytest.mark.parametrize("good", [True, False])
def test_good_fair(good):
    assert check(FAIR=good) == []


# One value of a wrong type per key, as a setting read from the environment would give it.
WRONG_TYPES = {
    "TABLE_NAME": 12345,
    "ENDPOINT_URL": 8000,
    "REGION_NAME": ["eu-west-1"],
    "LEASE": "60",
    "WAIT": "0",
    "CLOCK_SKEW": "5",
    "FAIR": "false",
    "PUSH": 127,
    "SAME_HOST_TAKEOVER": "false",
    "TELEMETRY": "false",
    "TELEMETRY_RESOURCE_NAMES": 1,
}


def test_every_key_has_a_wrong_type_case():
    assert set(WRONG_TYPES) == set(DEFAULTS)


@pytest.mark.parametrize("key", sorted(WRONG_TYPES))
def test_every_setting_of_the_wrong_type_is_an_error(key):
    messages = check(**{key: WRONG_TYPES[key]})
    assert [m.level for m in messages] == [ERROR], messages
    assert messages[0].id.startswith("dynasem.E")
    assert f"DYNASEM['{key}']" in messages[0].msg
    assert repr(WRONG_TYPES[key]) in messages[0].msg


@pytest.mark.parametrize(
    ("key", "bad", "check_id"),
    [
        ("LEASE", 10**400, "dynasem.E006"),
        ("WAIT", 10**400, "dynasem.E007"),
        ("CLOCK_SKEW", 10**400, "dynasem.E008"),
        ("CLOCK_SKEW", 1e300, "dynasem.E008"),
    ],
    ids=["LEASE-10**400", "WAIT-10**400", "CLOCK_SKEW-10**400", "CLOCK_SKEW-1e300"],
)
def test_numbers_too_large(key, bad, check_id):
    messages = check(**{key: bad})
    assert ids(messages) == [check_id]
    assert key in messages[0].msg
