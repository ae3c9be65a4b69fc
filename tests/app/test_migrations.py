"""The app's models and its migrations agree: a model changed without its migration would
reach a project's database only as an error at the first query."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_every_change_of_the_models_has_its_migration() -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "dynasem", "--check", "--dry-run", stdout=out)
    except SystemExit as exit:
        pytest.fail(f"models changed without a migration ({exit.code}):\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()
