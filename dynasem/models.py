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


class Fence(models.Model):
    """The newest fence written for a resource by a fenced transaction
    (dynasem._transactions.fencing).

    One row per resource, written first in each fenced transaction of a hold and kept locked
    until it ends: the database refuses a holder whose fence is older than the stored one."""

    # A digest of the resource (fenced.row_key): a resource of up to 1 KB does not fit every
    # database's primary key index.
    digest = models.CharField(max_length=64, primary_key=True)
    resource = models.TextField()
    fence = models.BigIntegerField()
    # How many fenced writes the row has had (an equal fence, the same hold's next transaction,
    # changes it too): on MySQL/MariaDB under REPEATABLE READ, a transaction whose snapshot
    # shows another count than the locked row read before a commit that landed since, and is
    # refused. NULL: a row written before migration 0004 (or by code older than it, which does
    # not name the column: no default needed while a deploy rolls).
    writes = models.BigIntegerField(null=True)

    class Meta:
        db_table = "dynasem_fence"
        default_permissions = ()
        verbose_name = "fence"
        verbose_name_plural = "fences"

    def __str__(self) -> str:
        return f"{self.resource} fence {self.fence}"
