#!/usr/bin/env python
"""Django's command-line utility for the dynasem example project."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Is it installed and is the virtualenv active? "
            "`make venv` sets one up in .venv."
        ) from exc
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
