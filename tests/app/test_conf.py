"""Live settings, defaults, and the cached boto3 client."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.test import override_settings

from dynasem import (
    SemaphoreUnavailable,
    TableMissing,
    conf,
    run_once,
    semaphore,
)
from dynasem._storage import dynamodb
from dynasem.conf import DEFAULTS
from tests.support.helpers import dynasem_settings


def test_settings_are_read_live():
    with override_settings(DYNASEM={"TABLE_NAME": "first", "LEASE": 30, "WAIT": 2}):
        assert conf.settings.TABLE_NAME == "first"
        assert conf.settings.LEASE == 30
        assert conf.settings.WAIT == 2
        with override_settings(DYNASEM={"TABLE_NAME": "second", "WAIT": None}):
            assert conf.settings.TABLE_NAME == "second"
            assert conf.settings.LEASE == 60  # a key the new dict lacks is the default again
            assert conf.settings.WAIT == math.inf
        assert conf.settings.TABLE_NAME == "first"
        assert conf.settings.WAIT == 2


def test_settings_follow_the_pytest_django_settings_fixture(settings, lock_table):
    before = dynamodb.get_client()
    settings.DYNASEM = {"CLOCK_SKEW": 2, "ENDPOINT_URL": "http://127.0.0.1:9"}
    assert conf.settings.CLOCK_SKEW == 2
    assert conf.settings.ENDPOINT_URL == "http://127.0.0.1:9"
    assert conf.settings.TABLE_NAME == "dynasem-locks"
    client = dynamodb.get_client()
    assert client is not before
    assert client.meta.endpoint_url == "http://127.0.0.1:9"


def test_a_key_is_read_from_django_once_per_change(monkeypatch):
    """An acquire reads about sixteen keys: each is looked up in Django's settings and checked
    once, then kept until ``setting_changed`` says DYNASEM changed (before: on every read)."""
    reads: list[str] = []
    current = {"LEASE": 30}

    class Counted:
        @property
        def DYNASEM(self) -> dict[str, Any]:  # noqa: N802 - the setting's name
            reads.append("DYNASEM")
            return current

    monkeypatch.setattr(conf, "django_settings", Counted())
    conf.settings.forget()
    try:
        assert [conf.settings.LEASE for _ in range(5)] == [30] * 5
        assert conf.settings.WAIT == 0
        assert len(reads) == 2  # once for each key
        current = {"LEASE": 40}
        assert conf.settings.LEASE == 30  # no change was said
        setting_changed.send(sender=None, setting="DYNASEM", value=current, enter=True)
        assert conf.settings.LEASE == 40
        setting_changed.send(sender=None, setting="OTHER", value=None, enter=True)
        assert conf.settings.LEASE == 40 and len(reads) == 3
    finally:
        monkeypatch.undo()
        conf.settings.forget()  # nothing of the fake kept


def test_defaults_when_dynasem_is_absent():
    # Deleting a setting sends no setting_changed: what conf kept from an earlier test of
    # this worker is forgotten by hand, here and after.
    try:
        with override_settings():
            del django_settings.DYNASEM
            conf.settings.forget()
            assert conf.settings.TABLE_NAME == "dynasem-locks"
            assert conf.settings.ENDPOINT_URL is None
            assert conf.settings.REGION_NAME is None
            assert conf.settings.LEASE == 60
            assert conf.settings.WAIT == 0
            assert conf.settings.CLOCK_SKEW == 5
            assert conf.settings.unknown_keys() == []
    finally:
        conf.settings.forget()


def test_defaults_for_missing_keys_match_the_contract():
    assert DEFAULTS == {
        "TABLE_NAME": "dynasem-locks",
        "ENDPOINT_URL": None,
        "REGION_NAME": None,
        "LEASE": 60,
        "WAIT": 0,
        "CLOCK_SKEW": 5,
        "FAIR": False,  # beyond API.md: fair (FIFO) waiting by default or not
        "PUSH": "127.0.0.1",  # beyond API.md: where queued waiters take hand-over pushes
        "SAME_HOST_TAKEOVER": None,  # beyond API.md: dead holders of this host seen in /proc
        "TELEMETRY": True,  # beyond API.md: OpenTelemetry metrics and spans, if installed
        "TELEMETRY_RESOURCE_NAMES": False,  # beyond API.md: raw keys as lock names
    }
    with override_settings(DYNASEM={}):
        for key, value in DEFAULTS.items():
            assert getattr(conf.settings, key) == value, key


def test_wait_none_means_forever():
    with override_settings(DYNASEM={"WAIT": None}):
        assert conf.settings.WAIT == math.inf
    with override_settings(DYNASEM={"WAIT": 0}):
        assert conf.settings.WAIT == 0


def test_unknown_keys():
    with override_settings(DYNASEM={"LEASE": 1, "TABEL_NAME": "x", "aws_access_key_id": "k"}):
        assert conf.settings.unknown_keys() == ["TABEL_NAME", "aws_access_key_id"]


def test_a_non_dict_setting_is_refused_when_read():
    # Read as defaults once: every request then went to AWS's default table (review 38f).
    with override_settings(DYNASEM="not a dict"):
        with pytest.raises(TypeError, match=r"^DYNASEM must be a dict .*not str: 'not a dict'"):
            conf.settings.TABLE_NAME  # noqa: B018 - the property raises


def test_the_semaphore_uses_the_live_table_name(lock_table, dynamodb_local):
    with semaphore("live:1"):
        pass
    other = dynasem_settings(dynamodb_local, "no-such-table-here")
    with override_settings(DYNASEM=other):
        with pytest.raises(TableMissing) as raised, semaphore("live:1"):
            pass  # pragma: no cover - never entered
        assert "no-such-table-here" in str(raised.value)
        assert "dynasem_createtable" in str(raised.value)
    with semaphore("live:1"):  # back on the test's own table
        pass


def test_the_semaphore_uses_the_live_lease(lock_table, dynamodb_local):
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, LEASE=123)):
        with semaphore("lease:1") as held:
            assert held.lease == 123
    with semaphore("lease:1") as held:
        assert held.lease == 10  # tests/support/settings.py


# ---------------------------------------------------------------------------------------------
# The boto3 client
# ---------------------------------------------------------------------------------------------


def test_client_is_cached(lock_table):
    assert dynamodb.get_client() is dynamodb.get_client()


def test_client_is_dropped_when_dynasem_changes(lock_table, dynamodb_local):
    before = dynamodb.get_client()
    assert before.meta.endpoint_url == dynamodb_local
    with override_settings(DYNASEM={**dynasem_settings("http://127.0.0.1:9", lock_table)}):
        inside = dynamodb.get_client()
        assert inside is not before
        assert inside.meta.endpoint_url == "http://127.0.0.1:9"
        assert dynamodb.get_client() is inside
    after = dynamodb.get_client()
    assert after is not inside
    assert after.meta.endpoint_url == dynamodb_local


@pytest.mark.parametrize("endpoint", ["http://", "http://host:port"])
def test_an_invalid_endpoint_is_a_semaphore_error_naming_it(lock_table, endpoint):
    with override_settings(DYNASEM={"TABLE_NAME": lock_table, "ENDPOINT_URL": endpoint}):
        with pytest.raises(SemaphoreUnavailable) as raised:
            semaphore("bad-endpoint:1").acquire()
    assert endpoint in str(raised.value)


def test_client_is_kept_when_another_setting_changes(lock_table):
    before = dynamodb.get_client()
    with override_settings(USE_I18N=False):
        assert dynamodb.get_client() is before


def test_client_region(lock_table, dynamodb_local, monkeypatch):
    with override_settings(DYNASEM={**dynasem_settings(dynamodb_local, lock_table)}):
        assert dynamodb.get_client().meta.region_name == "us-east-1"
    settings_ = dynasem_settings(dynamodb_local, lock_table, REGION_NAME="eu-west-3")
    with override_settings(DYNASEM=settings_):
        assert dynamodb.get_client().meta.region_name == "eu-west-3"
    # None: boto3's chain, then us-east-1.
    settings_ = dynasem_settings(dynamodb_local, lock_table, REGION_NAME=None)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    with override_settings(DYNASEM=settings_):
        assert dynamodb.get_client().meta.region_name == "ap-south-1"
    isolate_from_aws_config(monkeypatch)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    with override_settings(DYNASEM=settings_):
        assert dynamodb.get_client().meta.region_name == "us-east-1"


def test_a_client_built_again_reads_the_environment_anew_but_not_the_service_models(
    lock_table, dynamodb_local, monkeypatch
):
    """Each build is a botocore session of its own (credentials, region, AWS config as they
    are now); only the parsed service models are kept, two thirds of a build's CPU."""
    settings_ = dynasem_settings(dynamodb_local, lock_table, REGION_NAME=None)
    clients = []
    for region in ("ap-south-1", "sa-east-1"):
        monkeypatch.setenv("AWS_DEFAULT_REGION", region)
        with override_settings(DYNASEM=settings_):
            clients.append(dynamodb.get_client())
    assert [c.meta.region_name for c in clients] == ["ap-south-1", "sa-east-1"]
    first, second = (c._loader for c in clients)
    assert first is second


def isolate_from_aws_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS config or credentials from anywhere but what the test sets."""
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
    ]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/dynasem-credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/dynasem-config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


CREDENTIALS_IN_SETTINGS: dict[str, Any] = {
    "AWS_ACCESS_KEY_ID": "from-settings",
    "AWS_SECRET_ACCESS_KEY": "from-settings-secret",
    "aws_access_key_id": "from-settings",
    "aws_secret_access_key": "from-settings-secret",
    "CREDENTIALS": {"aws_access_key_id": "from-settings"},
}


def test_credentials_are_never_taken_from_dynasem(lock_table, dynamodb_local, monkeypatch):
    # No credentials anywhere in boto3's chain; DYNASEM offers some. DynamoDB Local accepts
    # any credentials, so a request would succeed if they were used.
    isolate_from_aws_config(monkeypatch)
    with override_settings(
        DYNASEM=dynasem_settings(dynamodb_local, lock_table, **CREDENTIALS_IN_SETTINGS)
    ):
        with pytest.raises(SemaphoreUnavailable, match="credentials") as raised:
            semaphore("creds:1").acquire()
        assert not isinstance(raised.value, TableMissing)
        assert "from-settings" not in str(raised.value)


def test_requests_are_signed_with_the_default_chains_credentials(
    lock_table, dynamodb_local, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fromenvironment")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dummy")
    signed: list[str] = []

    def record(request: Any, **kwargs: Any) -> None:
        signed.append(request.headers.get("Authorization", b"").decode())

    with override_settings(
        DYNASEM=dynasem_settings(dynamodb_local, lock_table, **CREDENTIALS_IN_SETTINGS)
    ):
        client = dynamodb.get_client()
        client.meta.events.register("before-send.dynamodb", record)
        try:
            with semaphore("creds:2"):
                pass
        finally:
            client.meta.events.unregister("before-send.dynamodb", record)
    assert signed
    for header in signed:
        assert "Credential=fromenvironment/" in header
        assert "from-settings" not in header


# ---------------------------------------------------------------------------------------------
# A setting of the wrong type, read at runtime: refused naming the key, never taken as truthy
# ---------------------------------------------------------------------------------------------

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
def test_a_setting_of_the_wrong_type_is_refused_when_read(key):
    bad = WRONG_TYPES[key]
    with override_settings(DYNASEM={key: bad}):
        with pytest.raises(TypeError) as raised:
            getattr(conf.settings, key)
    assert f"DYNASEM['{key}']" in str(raised.value)
    assert repr(bad) in str(raised.value)


@pytest.mark.parametrize("bad", ["false", "False", "0", 0, 1, None])
def test_fair_from_an_environment_string_is_refused_before_any_request(
    lock_table, dynamodb_local, requests_sent, bad
):
    requests_sent.reset()
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, lock_table, FAIR=bad)):
        sem = semaphore("fair:1")
        with pytest.raises(TypeError, match=r"DYNASEM\['FAIR'\] must be True or False"):
            sem.fair  # noqa: B018 - the property raises
        with pytest.raises(TypeError, match=r"DYNASEM\['FAIR'\]"), sem:
            pass  # pragma: no cover - never entered
    assert requests_sent.total == 0


@pytest.mark.parametrize("key", sorted(WRONG_TYPES))
def test_no_request_goes_out_under_a_setting_of_the_wrong_type(
    lock_table, dynamodb_local, requests_sent, key
):
    requests_sent.reset()
    with override_settings(
        DYNASEM=dynasem_settings(dynamodb_local, lock_table, **{key: WRONG_TYPES[key]})
    ):
        with pytest.raises(TypeError, match=rf"DYNASEM\['{key}'\]"), semaphore("typed:1"):
            pass  # pragma: no cover - never entered
        with pytest.raises(TypeError, match=rf"DYNASEM\['{key}'\]"), run_once("typed:1"):
            pass  # pragma: no cover - never entered
    assert requests_sent.total == 0


def test_fair_given_as_a_bool_is_read_as_given():
    for value in [True, False]:
        with override_settings(DYNASEM={"FAIR": value}):
            assert conf.settings.FAIR is value
            assert semaphore("fair:2").fair is value
