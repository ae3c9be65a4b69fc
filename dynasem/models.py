"""A table-less model that carries the admin permissions for the locks in DynamoDB."""

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
