"""``/metrics``: dynasem's OpenTelemetry metrics, for Prometheus to scrape.

dynasem records through ``opentelemetry-api`` only (``dynasem[otel]``); what a project does
with the measurements is its SDK's configuration. Here: OpenTelemetry's Prometheus exporter,
a reader that serves the process's measurements at the moment Prometheus scrapes, with no
collector to run, which suits a demo (``make demo``) and a single process. A deployment of
several processes (gunicorn workers, hosts) exports with OTLP to an OpenTelemetry Collector
instead (``opentelemetry-exporter-otlp``; the Collector's ``prometheus`` exporter or any
backend): each worker's own ``/metrics`` would show only that worker's share.

Configured once per process, in ``ProjectsConfig.ready()``, when the SDK and the exporter are
installed (the ``otel`` dependency group) and ``DEMO_METRICS`` is on; otherwise ``/metrics``
answers 404 saying what to install.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

_configured = False

NEEDS = ("opentelemetry.sdk", "opentelemetry.exporter.prometheus", "prometheus_client")


def available() -> bool:
    try:
        return all(importlib.util.find_spec(name) is not None for name in NEEDS)
    except ModuleNotFoundError:  # a parent package missing
        return False


def configure() -> bool:
    """A MeterProvider reading into Prometheus' registry, once; False if not installed."""
    global _configured
    if _configured:
        return True
    if not getattr(settings, "DEMO_METRICS", True) or not available():
        return False
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader()],
        resource=Resource.create({"service.name": "dynasem-example"}),
    )
    metrics.set_meter_provider(provider)
    _configured = True
    return True


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _configured:
        return HttpResponse(
            "Metrics are off: install dynasem[otel], opentelemetry-sdk and "
            "opentelemetry-exporter-prometheus (the otel dependency group), and leave "
            "DEMO_METRICS on.\n",
            status=404,
            content_type="text/plain",
        )
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    body: Any = generate_latest(REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
