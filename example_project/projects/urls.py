"""URLs of the demo app; the first three rebuild URLs guard the same resource in three ways."""

from __future__ import annotations

from django.urls import path

from . import metrics, views

app_name = "projects"

urlpatterns = [
    path("", views.index, name="index"),
    # dynasem's OpenTelemetry metrics for Prometheus (projects/metrics.py).
    path("metrics", metrics.metrics_view, name="metrics"),
    path("projects/<int:project_id>/rebuild/", views.purge_and_rebuild, name="rebuild"),
    path(
        "projects/<int:project_id>/rebuild-cbv/",
        views.PurgeAndRebuildView.as_view(),
        name="rebuild-cbv",
    ),
    path(
        "projects/<int:project_id>/rebuild-with-fence/",
        views.purge_and_rebuild_with_fence,
        name="rebuild-with-fence",
    ),
    path(
        "projects/<int:project_id>/rebuild-coalesced/",
        views.purge_and_rebuild_coalesced,
        name="rebuild-coalesced",
    ),
    path(
        "projects/<int:project_id>/rebuild-in-background/",
        views.rebuild_in_background,
        name="rebuild-in-background",
    ),
    # Served only with DEMO_LOAD_VARIANTS=true (scripts/load_rebuild.py).
    path(
        "projects/<int:project_id>/rebuild-unlocked/",
        views.purge_and_rebuild_unlocked,
        name="rebuild-unlocked",
    ),
    path(
        "projects/<int:project_id>/rebuild-released-before-commit/",
        views.purge_and_rebuild_released_before_commit,
        name="rebuild-released-before-commit",
    ),
]
