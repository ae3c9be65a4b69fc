"""Table-less models that carry the admin permissions for what dynasem keeps in DynamoDB."""

from __future__ import annotations

from django.db import models


class Lock(models.Model):
    """Not stored in the database: the admin lists DynamoDB's holds through it."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [("release_lock", "Can break (release) a hold on a resource")]
        verbose_name = "lock"
        verbose_name_plural = "locks"

    def __str__(self) -> str:
        return "lock"


class Job(models.Model):
    """Not stored in the database: the admin lists the run_once keys through it.

    Its own permissions (``dynasem.view_job``, ``dynasem.reset_job``), apart from the locks':
    letting a job run again is a different decision from breaking someone's hold."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [("reset_job", "Can reset a run-once job so that it runs again")]
        verbose_name = "run-once job"
        verbose_name_plural = "run-once jobs"

    def __str__(self) -> str:
        return "run-once job"
