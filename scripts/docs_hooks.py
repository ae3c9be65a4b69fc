"""MkDocs hooks (mkdocs.yml ``hooks:``): the reference pages' tables, generated from the code.

A line that is only a marker is replaced by Markdown made from dynasem itself, so the
reference cannot drift from the code:

- ``<!-- dynasem:settings -->``: the settings table (``dynasem.conf.DEFAULTS`` and ``HELP``);
- ``<!-- dynasem:checks -->``: the system check IDs (``dynasem.checks.CHECK_IDS``);
- ``<!-- dynasem:signals -->``: the signals and their arguments (``dynasem.signals.SIGNALS``);
- ``<!-- dynasem:command NAME -->``: a ``## NAME`` heading, the command's ``help`` and its
  full ``--help`` (tests/project/test_docs_reference.py requires one for every ``dynasem_*``
  command on the commands page).

An unknown marker (a typo) fails the build. Markers inside fenced code blocks, or on a line
with other text, are left alone, so a page can show one. Importable without MkDocs
(tests/project/test_docs_reference.py renders every marker).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMANDS_DIR = ROOT / "dynasem" / "management" / "commands"
# The --help output is wrapped at this many columns, whatever the terminal that builds.
HELP_COLUMNS = 80

MARKER = re.compile(r"<!--\s*dynasem:(?P<name>[\w-]+)(?:\s+(?P<arg>[^\s>]+))?\s*-->")
FENCE = re.compile(r"^\s*(?P<fence>`{3,}|~{3,})")


class MarkerError(ValueError):
    """A marker this hook does not know, or one whose argument is wrong."""


def _setup_django() -> None:
    """Django configured (with dynasem's test settings unless others are set), as the
    management commands need it to build their parsers."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _value(value: Any) -> str:
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    return f"`{shown}`"


def settings_table() -> str:
    from dynasem.conf import DEFAULTS, HELP

    rows = ["| Key | Default | Meaning |", "|---|---|---|"]
    for key, default in DEFAULTS.items():
        rows.append(f"| `{key}` | {_value(default)} | {_cell(HELP[key])} |")
    return "\n".join(rows)


def checks_table() -> str:
    from dynasem.checks import CHECK_IDS

    levels = {"E": "Error", "W": "Warning", "I": "Info"}
    rows = ["| ID | Level | What it checks |", "|---|---|---|"]
    for check_id, meaning in CHECK_IDS.items():
        level = levels[check_id.removeprefix("dynasem.")[0]]
        rows.append(f"| `{check_id}` | {level} | {_cell(meaning)} |")
    return "\n".join(rows)


def signals_section() -> str:
    from dynasem.signals import SIGNALS

    parts = []
    for name, (when, arguments) in SIGNALS.items():
        rows = [
            "| Keyword argument | What it is |",
            "|---|---|",
            "| `sender` | `dynasem.Semaphore` |",
        ]
        rows += [f"| `{key}` | {_cell(meaning)} |" for key, meaning in arguments.items()]
        parts.append(f"## `{name}`\n\n{when}\n\n" + "\n".join(rows))
    return "\n\n".join(parts)


def command_names() -> list[str]:
    """dynasem's management commands, by name."""
    return sorted(path.stem for path in COMMANDS_DIR.glob("dynasem_*.py"))


def command_help(name: str) -> tuple[str, str]:
    """The command's ``help`` and its ``manage.py NAME --help`` output."""
    if name not in command_names():
        raise MarkerError(f"no management command {name!r}; dynasem has {command_names()}")
    _setup_django()
    from django.core.management import load_command_class

    command = load_command_class("dynasem", name)
    parser = command.create_parser("manage.py", name)
    # argparse takes its width from the terminal (COLUMNS): fix it, so every build is alike.
    parser.formatter_class = functools.partial(parser.formatter_class, width=HELP_COLUMNS)
    if hasattr(parser, "color"):  # Python 3.14: no colour codes in the page
        parser.color = False
    return str(command.help), parser.format_help().rstrip()


def command_section(name: str) -> str:
    summary, full = command_help(name)
    indented = "\n".join(f"    {line}" if line else "" for line in full.splitlines())
    return (
        f"## {name}\n\n{summary}\n\n"
        f'??? note "`manage.py {name} --help`"\n\n'
        f"    ```text\n{indented}\n    ```"
    )


RENDERERS: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "checks": checks_table,
    "signals": signals_section,
}


def render(name: str, arg: str | None = None) -> str:
    """The Markdown for the marker ``<!-- dynasem:NAME [ARG] -->``."""
    if name == "command":
        if arg is None:
            raise MarkerError("<!-- dynasem:command NAME --> needs a command's name")
        return command_section(arg)
    if name not in RENDERERS:
        known = sorted([*RENDERERS, "command NAME"])
        raise MarkerError(f"unknown marker <!-- dynasem:{name} -->; known: {', '.join(known)}")
    if arg is not None:
        raise MarkerError(f"<!-- dynasem:{name} --> takes no argument, not {arg!r}")
    return RENDERERS[name]()


def replace_markers(markdown: str) -> str:
    """``markdown`` with every marker line replaced by what it stands for."""
    lines = markdown.split("\n")
    fence: str | None = None
    for i, line in enumerate(lines):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening["fence"][0] == fence[0] and len(opening["fence"]) >= len(fence):
                if not line.strip().strip(fence[0]):
                    fence = None
            continue
        if opening:
            fence = opening["fence"]
            continue
        marker = MARKER.fullmatch(line.strip())
        if marker:
            lines[i] = render(marker["name"], marker["arg"])
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    try:
        return replace_markers(markdown)
    except MarkerError as exc:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: {exc}") from exc
