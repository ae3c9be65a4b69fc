"""OpenTelemetry: the metrics and spans dynasem records, read back from the SDK's in-memory
reader and exporter, on DynamoDB Local; and dynasem without opentelemetry installed."""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from dynasem import LockLost, SemaphoreBusy, SemaphoreUnavailable, semaphore
from dynasem._observability import telemetry
from dynasem._observability.metrics import (
    CAPACITY_KIND,
    FENCE,
    MODE,
    NAME,
    NAME_MAX,
    OUTCOME,
    QUEUED,
    REASON,
    RESOURCE,
    Deferred,
)
from dynasem._operators import locks as operations
from dynasem._storage import reader_items as reader_items
from tests.support.helpers import dynasem_settings

try:  # the otel dependency group; the matrix runs some pairs without it
    from opentelemetry import metrics, trace
    from opentelemetry.sdk import metrics as sdk_metrics
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:
    sdk_metrics = None

ROOT = Path(__file__).resolve().parents[2]
_providers: dict[str, Any] = {}


@pytest.fixture
def otel(lock_table: str) -> Any:
    """The process's global providers (set once: OpenTelemetry refuses a second), their
    in-memory reader and exporter; the exporter emptied for each test."""
    if sdk_metrics is None:
        pytest.skip("the OpenTelemetry SDK is not installed (dynasem[otel] + the otel group)")
    assert telemetry.ON
    if not _providers:
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(sdk_metrics.MeterProvider(metric_readers=[reader]))
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _providers.update(reader=reader, exporter=exporter)
    _providers["exporter"].clear()
    return _providers


def points(reader: Any, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    found = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def total(reader: Any, name: str, **attrs: Any) -> float:
    """A counter's value summed over the points whose attributes include ``attrs``."""
    return sum(
        p.value
        for p in points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


def histogram(reader: Any, name: str, **attrs: Any) -> list[Any]:
    return [
        p for p in points(reader, name) if all(p.attributes.get(k) == v for k, v in attrs.items())
    ]


def named() -> str:
    return f"lock-{uuid.uuid4().hex[:8]}"


def spans(otel: Any, name: str) -> list[Any]:
    return [s for s in otel["exporter"].get_finished_spans() if s.name == name]


def test_an_acquire_and_its_release_are_measured_and_traced(otel: Any) -> None:
    name = named()
    with semaphore(f"tel:{uuid.uuid4().hex}", metrics_name=name) as held:
        fence = held.fence
    reader = otel["reader"]
    (acq,) = histogram(
        reader,
        "dynasem.lock.acquire.duration",
        **{NAME: name, OUTCOME: "acquired", MODE: "exclusive"},
    )
    assert acq.count == 1 and 0 < acq.sum < 5
    assert acq.attributes[QUEUED] is False
    (hold,) = histogram(reader, "dynasem.lock.hold.duration", **{NAME: name})
    assert hold.count == 1 and hold.attributes[OUTCOME] == "released"
    (span,) = [s for s in spans(otel, "dynasem.acquire") if s.attributes[NAME] == name]
    assert span.attributes[FENCE] == fence
    assert span.attributes[OUTCOME] == "acquired"
    assert RESOURCE not in span.attributes  # raw keys only if the setting says so
    (release,) = [s for s in spans(otel, "dynasem.release") if s.attributes[NAME] == name]
    assert release.attributes[OUTCOME] == "released"
    assert [link.context.span_id for link in release.links] == [span.context.span_id]


def test_a_busy_acquire_records_outcome_busy_and_its_wait(otel: Any, holds: list[Any]) -> None:
    name, resource = named(), f"tel:{uuid.uuid4().hex}"
    holds.append(semaphore(resource).acquire())
    started = time.monotonic()
    # Budget enough to reach the wait: the matrix once spent 0.4 s on the first look and try
    # (loaded), and gave up before waiting, with no wait event to assert.
    budget = 1.5
    with pytest.raises(SemaphoreBusy):
        semaphore(resource, wait=budget, metrics_name=name, fair=True).acquire()
    waited = time.monotonic() - started
    (point,) = histogram(
        otel["reader"],
        "dynasem.lock.acquire.duration",
        **{NAME: name, OUTCOME: "busy"},
    )
    assert point.count == 1
    assert budget <= point.sum <= waited
    (span,) = [s for s in spans(otel, "dynasem.acquire") if s.attributes[NAME] == name]
    assert span.attributes[OUTCOME] == "busy"
    assert span.status.is_unset  # busy is an answer, not an error
    (wait,) = [e for e in span.events if e.name == "dynasem.wait"]
    assert span.start_time <= wait.timestamp <= span.end_time
    # fair: queued behind the holder, counted with the waiters ahead (none) when it joined.
    assert span.attributes[QUEUED] is True
    assert point.attributes[QUEUED] is True
    (ahead,) = histogram(otel["reader"], "dynasem.lock.queue.ahead", **{NAME: name})
    assert ahead.count == 1 and ahead.sum == 0


def test_an_unreachable_table_is_outcome_unavailable_with_the_error(
    otel: Any, lock_table: str
) -> None:
    name = named()
    broken = dynasem_settings("http://127.0.0.1:9", lock_table)
    from dynasem._storage import dynamodb

    dynamodb.reset_client()
    try:
        with override_settings(DYNASEM=broken), pytest.raises(SemaphoreUnavailable):
            semaphore(f"tel:{uuid.uuid4().hex}", metrics_name=name).acquire()
    finally:
        dynamodb.reset_client()
    (point,) = histogram(otel["reader"], "dynasem.lock.acquire.duration", **{NAME: name})
    assert point.attributes[OUTCOME] == "unavailable"
    (span,) = [s for s in spans(otel, "dynasem.acquire") if s.attributes[NAME] == name]
    assert not span.status.is_ok and not span.status.is_unset
    assert any(e.name == "exception" for e in span.events)


@pytest.mark.parametrize("how", ["broken", "max_hold"])
def test_a_lost_hold_counts_in_holds_lost_with_its_reason(
    otel: Any, holds: list[Any], how: str
) -> None:
    name, resource = named(), f"tel:{uuid.uuid4().hex}"
    if how == "broken":
        held = semaphore(resource, metrics_name=name).acquire()
        holds.append(held)
        operations.break_hold(resource, held.token)
        with pytest.raises(LockLost):
            held.renew()
        reason = "taken_over"
    else:
        held = semaphore(resource, metrics_name=name, max_hold=0.3).acquire()
        holds.append(held)
        time.sleep(0.4)
        assert held.lost
        reason = "max_hold"
    assert total(otel["reader"], "dynasem.lock.lost", **{NAME: name}) == 1
    assert total(otel["reader"], "dynasem.lock.lost", **{NAME: name, REASON: reason}) == 1
    if how == "broken":
        (renew,) = [s for s in spans(otel, "dynasem.renew") if s.attributes[NAME] == name]
        assert renew.attributes[OUTCOME] == "lost"
        assert any(e.name == "dynasem.lost" for e in renew.events)
        outcomes = {
            p.attributes[OUTCOME]: p.value
            for p in points(otel["reader"], "dynasem.lock.renewals")
            if p.attributes[NAME] == name
        }
        assert outcomes == {"lost": 1}


# Enough readers on one resource that the last ones hold reader items (dynasem._engine.readers).
READERS = 4


def _capacity_by_kind(reader: Any) -> Counter[str]:
    found: Counter[str] = Counter()
    for p in points(reader, "dynasem.dynamodb.consumed_capacity"):
        found[p.attributes[CAPACITY_KIND]] += p.value
    return found


def test_capacity_units_recorded_equal_what_dynamodb_reports(
    otel: Any, holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every answer's ConsumedCapacity, read by a botocore hook of our own, against the
    counter: an uncontended cycle, a busy try that queues, a hand-over, a counting hold."""
    from dynasem._storage import dynamodb

    reported: Counter[str] = Counter()

    reads = {"GetItem", "Query", "Scan", "BatchGetItem"}

    def after_call(http_response: Any, parsed: dict[str, Any], model: Any, **kwargs: Any) -> None:
        consumed = parsed.get("ConsumedCapacity") or []
        for one in [consumed] if isinstance(consumed, dict) else consumed:
            reported["read" if model.name in reads else "write"] += one["CapacityUnits"]

    clients = [dynamodb.get_client(), dynamodb.get_client(quick=True)]  # a count-down goes quick
    for client in clients:
        client.meta.events.register("after-call.dynamodb", after_call)
    before = _capacity_by_kind(otel["reader"])
    try:
        resource = f"tel:{uuid.uuid4().hex}"
        with semaphore(resource):
            pass
        first = semaphore(resource).acquire()
        waiter: dict[str, Any] = {}
        thread = threading.Thread(
            target=lambda: waiter.update(held=semaphore(resource, wait=5).acquire())
        )
        thread.start()
        time.sleep(0.5)
        first.release()
        thread.join(10)
        waiter["held"].release()
        with semaphore(f"tel:{uuid.uuid4().hex}", limit=20):
            pass
        with semaphore([f"tel:{uuid.uuid4().hex}", f"tel:{uuid.uuid4().hex}"]):
            pass  # one transaction each way: its answer's units are a list
        shared = f"tel:{uuid.uuid4().hex}"
        readers = [semaphore(shared, shared=True).acquire() for _ in range(READERS)]
        seen_items = reader_items.readers(shared)
        for held in reversed(readers):  # reader items, then the count-down (quick client)
            held.release()
        operations.holds_on(resource)
    finally:
        for client in clients:
            client.meta.events.unregister("after-call.dynamodb", after_call)
    after = _capacity_by_kind(otel["reader"])
    recorded = {k: after[k] - before[k] for k in ("read", "write")}
    assert reported["write"] >= 6  # the cycles above wrote; the hook saw their units
    assert seen_items  # the readers past the row's inline ones held items
    assert recorded == {"read": reported["read"], "write": reported["write"]}


def test_no_extra_request_is_sent_with_telemetry_on(otel: Any, requests_sent: Any) -> None:
    def scenario() -> None:
        resource = f"tel:{uuid.uuid4().hex}"
        # A lease no heartbeat renews within the scenario, however slow a loaded machine
        # makes it (CI with 8 workers: one side counted a renewal more).
        with semaphore(resource, lease=300) as held:
            with pytest.raises(SemaphoreBusy):
                semaphore(resource).acquire()
            held.renew()

    counts = []
    for on in (True, False):
        with override_settings(DYNASEM=dynasem_settings(*_endpoint(), TELEMETRY=on)):
            requests_sent.reset()
            scenario()
            counts.append(dict(requests_sent.calls))
    assert counts[0] == counts[1]
    assert sum(counts[0].values()) >= 4


def test_settings_read_as_they_change_are_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's hook reads ``TELEMETRY`` from another thread (a heartbeat's renewal) just
    as an override ends: it read the override's value, the change then dropped what was
    kept, and the read was kept after it, for every test after (ci102: a coalesced run's
    requests counted nowhere). Failed before the mend (``(False, False)`` was kept)."""

    class Changing:
        """Settings that change (setting_changed sent) as ``TELEMETRY`` is read."""

        lock = staticmethod(telemetry.settings.lock)
        TELEMETRY_RESOURCE_NAMES = False

        @property
        def TELEMETRY(self) -> bool:  # noqa: N802 - the setting's name
            telemetry._forget_settings("DYNASEM")
            return False  # the value read before the change

    monkeypatch.setattr(telemetry, "settings", Changing())
    monkeypatch.setattr(telemetry, "_settings", None)
    assert telemetry._config() == (False, False)  # what was read is answered,
    assert telemetry._settings is None  # not kept: the next hook reads the settings again


def _endpoint() -> tuple[str, str]:
    from django.conf import settings

    return settings.DYNASEM["ENDPOINT_URL"], settings.DYNASEM["TABLE_NAME"]


def test_the_acquire_span_nests_under_the_callers_span(otel: Any) -> None:
    tracer = trace.get_tracer("tests")
    name = named()

    async def in_task() -> None:
        async with semaphore(f"tel:{uuid.uuid4().hex}", metrics_name=name):
            pass

    with tracer.start_as_current_span("caller") as caller:
        with semaphore(f"tel:{uuid.uuid4().hex}", metrics_name=name):
            pass
        asyncio.run(in_task())
    acquires = [s for s in spans(otel, "dynasem.acquire") if s.attributes[NAME] == name]
    assert len(acquires) == 2
    for span in acquires:
        assert span.parent is not None
        assert span.parent.span_id == caller.get_span_context().span_id
        assert span.context.trace_id == caller.get_span_context().trace_id


def test_a_views_acquire_nests_under_its_request_span_named_by_its_template(otel: Any) -> None:
    """opentelemetry-instrumentation-django's request span is the parent; the lock's name is
    the decorator's key template, never the project's id."""
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.django")
    from django.test import Client

    instrumentor = instrumentation.DjangoInstrumentor()
    instrumentor.instrument()
    try:
        response = Client().post("/rebuild/7341/")
    finally:
        instrumentor.uninstrument()
    assert response.status_code == 200
    finished = otel["exporter"].get_finished_spans()
    (acquire,) = [
        s for s in finished if s.name == "dynasem.acquire" and "7341" not in str(s.attributes)
    ][-1:]
    assert acquire.attributes[NAME] == "tbl_issues:{project_id}"
    request = next(s for s in finished if s.context.span_id == acquire.parent.span_id)
    assert request.kind == trace.SpanKind.SERVER
    assert all("7341" not in str(s.attributes) for s in finished if s.name.startswith("dynasem"))


def test_a_celery_tasks_acquire_nests_under_the_tasks_span(otel: Any) -> None:
    celery = pytest.importorskip("celery")
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.celery")
    app = celery.Celery("dynasem-telemetry", broker="memory://")
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True

    @app.task
    @semaphore("reindex:{file_id}")
    def reindex(file_id: int) -> int:
        return file_id

    instrumentor = instrumentation.CeleryInstrumentor()
    instrumentor.instrument()
    try:
        assert reindex.delay(7).get() == 7
    finally:
        instrumentor.uninstrument()
    finished = otel["exporter"].get_finished_spans()
    (acquire,) = [
        s
        for s in finished
        if s.name == "dynasem.acquire" and s.attributes[NAME] == "reindex:{file_id}"
    ]
    task_span = next(s for s in finished if s.context.span_id == acquire.parent.span_id)
    assert task_span.name.startswith("run/")


def test_raw_resource_names_only_when_the_setting_opts_in(otel: Any) -> None:
    resource = f"tel:{uuid.uuid4().hex}"
    with semaphore(resource):
        pass
    with (
        override_settings(DYNASEM=dynasem_settings(*_endpoint(), TELEMETRY_RESOURCE_NAMES=True)),
        semaphore(resource + ":raw"),
    ):
        pass
    names = {s.attributes[NAME] for s in spans(otel, "dynasem.acquire")}
    assert names == {"other", resource + ":raw"}


def test_metrics_name_is_checked_like_a_resource() -> None:
    with pytest.raises(TypeError):
        semaphore("x", metrics_name=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        semaphore("x", metrics_name="")


def test_dynasem_works_without_opentelemetry(lock_table: str) -> None:
    """opentelemetry made unimportable: nothing recorded, no ReturnConsumedCapacity asked,
    a lock taken and given back."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # absent (an ImportError), installed or not
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["dynasem"],
            DYNASEM={dynasem_settings(*_endpoint())!r},
        )
        django.setup()
        from dynasem import semaphore
        from dynasem._observability import telemetry
        from dynasem._storage import dynamodb
        assert telemetry.ON is False
        asked = []
        dynamodb.get_client().meta.events.register(
            "provide-client-params.dynamodb",
            lambda params, **kw: asked.append("ReturnConsumedCapacity" in params),
        )
        with semaphore("tel:absent") as held:
            assert held.fence > 0
        with telemetry.naming("a coalesced run's name"):  # its renewals and withdrawal
            pass
        assert asked and not any(asked), asked
        print("ok", len(asked))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


def test_every_log_record_of_dynasem_carries_its_facts_as_extra_fields() -> None:
    """Every logger call in the package passes ``extra=`` (a machine reads its facts; the
    message stays as it was for people)."""
    missing = []
    for path in sorted((ROOT / "dynasem").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"debug", "info", "warning", "error", "exception"}
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "logger"
                and not any(k.arg == "extra" for k in node.keywords)
            ):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


def test_a_lost_holds_log_record_carries_resource_token_fence_and_reason(
    otel: Any, holds: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    resource = f"tel:{uuid.uuid4().hex}"
    held = semaphore(resource).acquire()
    holds.append(held)
    operations.break_hold(resource, held.token)
    with caplog.at_level(logging.WARNING, logger="dynasem"), pytest.raises(LockLost):
        held.renew()
    (record,) = [r for r in caplog.records if "lost the hold" in r.getMessage()]
    assert record.dynasem_resource == resource
    assert record.dynasem_token == held.token[:8]
    assert record.dynasem_fence == held.fence
    assert record.dynasem_outcome == "lost"
    assert "took it over" in record.dynasem_reason


def test_a_hand_over_is_a_child_span_of_the_release_and_its_idle_time_is_measured(
    otel: Any,
) -> None:
    name, resource = named(), f"tel:{uuid.uuid4().hex}"
    first = semaphore(resource, metrics_name=name).acquire()
    waiter: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: waiter.update(
            held=semaphore(resource, wait=5, metrics_name=name + "-w").acquire()
        )
    )
    thread.start()
    time.sleep(0.5)  # queued behind the holder
    first.release()
    thread.join(10)
    waiter["held"].release()
    (release,) = [s for s in spans(otel, "dynasem.release") if s.attributes[NAME] == name]
    assert release.attributes[OUTCOME] == "handed_over"
    (handover,) = spans(otel, "dynasem.handover")
    assert handover.parent.span_id == release.context.span_id
    assert handover.attributes["dynasem.lock.heirs"] == 1
    assert handover.attributes[FENCE] == waiter["held"].fence
    (idle,) = histogram(otel["reader"], "dynasem.lock.handover.idle", **{NAME: name + "-w"})
    assert idle.count == 1 and 0 <= idle.sum < 2
    (acquire,) = [s for s in spans(otel, "dynasem.acquire") if s.attributes[NAME] == name + "-w"]
    assert acquire.attributes[QUEUED] is True
    assert [e.name for e in acquire.events][:1] == ["dynasem.wait"]
    assert any(e.name == "dynasem.handed_over" for e in acquire.events)


def test_without_a_tracer_provider_records_go_in_batches_and_a_collection_takes_them_all(
    otel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No span made (as in a project without a TracerProvider): the histograms' records wait
    in a batch, and a reader's collection flushes it first, so it counts every cycle."""
    monkeypatch.setattr(telemetry, "_tracer", lambda: None)
    telemetry._get().deferred.flush()  # nothing of earlier tests waiting
    name = named()
    # 2 records a cycle: two full batches flush by themselves, 10 records still wait
    cycles = Deferred.BATCH + 5
    for _ in range(cycles):
        with semaphore(f"tel:{uuid.uuid4().hex}", metrics_name=name):
            pass
    (acquired,) = histogram(otel["reader"], "dynasem.lock.acquire.duration", **{NAME: name})
    (held,) = histogram(otel["reader"], "dynasem.lock.hold.duration", **{NAME: name})
    assert acquired.count == held.count == cycles
    assert not [s for s in spans(otel, "dynasem.acquire") if s.attributes[NAME] == name]


def test_a_failing_telemetry_never_fails_the_lock(
    otel: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("exporter on fire")

    monkeypatch.setattr(telemetry._get().deferred, "record", broken)
    monkeypatch.setattr(telemetry, "_complained", False)
    resource = f"tel:{uuid.uuid4().hex}"
    with caplog.at_level(logging.WARNING, logger="dynasem"):
        for _ in range(3):
            with semaphore(resource) as held:
                assert held.fence > 0
    assert operations.holds_on(resource) == []  # given back every time
    complaints = [r for r in caplog.records if "recording telemetry failed" in r.getMessage()]
    assert len(complaints) == 1  # once per process
    assert complaints[0].dynasem_outcome == "telemetry_failed"


def test_a_decorators_name_is_its_template_cut_short_never_a_refusal(otel: Any) -> None:
    """A list of templates longer than a resource may be is still a working decorator: its
    name is cut, not checked as a key."""
    templates = [f"a-rather-long-template-{i:03d}:{{n}}" for i in range(40)]
    assert len(",".join(templates)) > 1024

    @semaphore(templates)
    def work(n: int) -> int:
        return n

    assert work(7) == 7
    (span,) = [s for s in spans(otel, "dynasem.acquire") if "a-rather" in s.attributes[NAME]]
    assert span.attributes[NAME] == ",".join(templates)[:NAME_MAX]


def test_a_reader_in_an_item_is_measured_like_any_hold_and_its_loss_counted(
    otel: Any, holds: list[Any]
) -> None:
    """Readers past the row's inline ones hold items of their own (another acquire, release
    and renewal path): measured as shared holds, and a broken reader item counts as taken
    over."""
    name, resource = named(), f"tel:{uuid.uuid4().hex}"
    readers = [
        semaphore(resource, shared=True, metrics_name=name).acquire() for _ in range(READERS)
    ]
    holds.extend(readers)
    last = readers[-1]
    assert last.token in {r.token for r in reader_items.readers(resource)}
    operations.break_hold(resource, last.token)
    with pytest.raises(LockLost):
        last.renew()
    for held in readers[:-1]:
        held.release()
    reader = otel["reader"]
    (acquired,) = histogram(reader, "dynasem.lock.acquire.duration", **{NAME: name})
    assert acquired.count == READERS
    assert acquired.attributes[MODE] == "shared"
    assert acquired.attributes[OUTCOME] == "acquired"
    released = histogram(
        reader,
        "dynasem.lock.hold.duration",
        **{NAME: name, OUTCOME: "released"},
    )
    assert sum(p.count for p in released) == READERS - 1
    assert total(reader, "dynasem.lock.lost", **{NAME: name, REASON: "taken_over"}) == 1


def test_capacity_is_asked_only_once_a_meter_provider_is_set(lock_table: str) -> None:
    """opentelemetry installed, no MeterProvider yet: the API's instruments record nowhere, so
    no request asks DynamoDB for its capacity units (DynamoDB Local answers later for it);
    once the project sets one, every request asks and the units are recorded (a subprocess:
    the test session's providers are set already)."""
    if sdk_metrics is None:
        pytest.skip("the OpenTelemetry SDK is not installed (dynasem[otel] + the otel group)")
    code = textwrap.dedent(
        f"""
        import django
        from django.conf import settings
        settings.configure(INSTALLED_APPS=["dynasem"], DYNASEM={dynasem_settings(*_endpoint())!r})
        django.setup()
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from dynasem import semaphore
        from dynasem._observability import telemetry
        from dynasem._storage import dynamodb
        assert telemetry.ON
        asked = []
        dynamodb.get_client().meta.events.register(
            "provide-client-params.dynamodb",
            lambda params, **kw: asked.append("ReturnConsumedCapacity" in params),
        )
        with semaphore("tel:unmetered:{uuid.uuid4().hex}"):
            pass
        before = list(asked)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        asked.clear()
        with semaphore("tel:metered:{uuid.uuid4().hex}"):
            pass
        units = [
            p.value
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "dynasem.dynamodb.consumed_capacity"
            for p in m.data.data_points
        ]
        print(before, asked, sum(units))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[False, False] [True, True] "), done.stdout
    assert float(done.stdout.split()[-1]) >= 2, done.stdout  # a write unit each, at least


def test_the_documented_promql_names_are_what_prometheus_scrapes(lock_table: str) -> None:
    """Every ``dynasem_*`` metric and label name in the observability guide's queries is in a
    scrape of OpenTelemetry's Prometheus exporter after an acquire, a busy try and a lost hold
    (a subprocess: the test session's MeterProvider is the in-memory one)."""
    pytest.importorskip("opentelemetry.exporter.prometheus", reason="the otel dependency group")
    page = (ROOT / "docs" / "how-to" / "observability.md").read_text()
    queries = "\n".join(re.findall(r"```promql\n(.*?)```", page, re.S))
    queries += "\n".join(re.findall(r"`([^`\n]*dynasem_[^`\n]*)`", page.split("```promql")[-1]))
    documented = set(re.findall(r"\bdynasem_[a-z_]+\b", queries))
    assert {"dynasem_lock_acquire_duration_seconds_bucket", "dynasem_lock_lost_total"} <= documented
    code = textwrap.dedent(
        f"""
        import time
        import django
        from django.conf import settings
        settings.configure(INSTALLED_APPS=["dynasem"], DYNASEM={dynasem_settings(*_endpoint())!r})
        django.setup()
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import REGISTRY, generate_latest
        import threading
        from dynasem import SemaphoreBusy, semaphore
        from dynasem.signals import lock_lost
        # lock_lost is sent after the loss is counted, by whichever thread marked it (the
        # heartbeat's, maybe): the scrape waits for it.
        told = threading.Event()
        lock_lost.connect(lambda **kwargs: told.set(), weak=False)
        metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
        with semaphore("tel:promql:{uuid.uuid4().hex}") as held:
            try:
                semaphore(held.resource, wait=0).acquire()
            except SemaphoreBusy:
                pass
        lost = semaphore("tel:promql:{uuid.uuid4().hex}", max_hold=0.2).acquire()
        time.sleep(0.3)
        assert lost.lost and told.wait(10)
        print(generate_latest(REGISTRY).decode())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    scraped = set(re.findall(r"\bdynasem_[a-z_]+\b", done.stdout))
    assert documented <= scraped, sorted(documented - scraped)
