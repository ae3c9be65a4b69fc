"""The demo's data: each project's issues, purged and rebuilt as a whole."""

from __future__ import annotations

import time
import uuid

from django.conf import settings
from django.db import models


class Issue(models.Model):
    """One issue of a project, as written by one rebuild (``rebuild`` names which).

    No unique constraint on (project, number), on purpose: the load script
    (``scripts/load_rebuild.py``) counts the duplicates two interleaved rebuilds leave behind.
    A real table would have one, and would then answer the race with IntegrityErrors.
    """

    project = models.PositiveIntegerField(db_index=True)
    number = models.PositiveIntegerField()
    title = models.CharField(max_length=200)
    rebuild = models.CharField(max_length=32, help_text="the rebuild that wrote this row")

    class Meta:
        ordering = ["project", "number"]

    def __str__(self) -> str:
        return f"project {self.project} issue {self.number}"


def purge_and_insert(project_id: int) -> tuple[int, str]:
    """The rebuild's work: fetch the project's issues (a sleep of ``DEMO_REBUILD_SECONDS``),
    delete its rows and insert a fresh set, in the caller's transaction. Returns how many
    rows it deleted and the new rows' ``rebuild`` id."""
    rebuild = uuid.uuid4().hex
    # Fetching the project's issues from wherever they come from takes a while.
    time.sleep(settings.DEMO_REBUILD_SECONDS)
    deleted, _ = Issue.objects.filter(project=project_id).delete()
    Issue.objects.bulk_create(
        Issue(
            project=project_id,
            number=n,
            title=f"Issue {n} of project {project_id}",
            rebuild=rebuild,
        )
        for n in range(1, settings.DEMO_ISSUES_PER_PROJECT + 1)
    )
    return deleted, rebuild
