"""The demo's data: each project's issues, purged and rebuilt as a whole."""

from __future__ import annotations

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
