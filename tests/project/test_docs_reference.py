"""The generated reference against the code: every setting, system check ID, signal argument,
management command and public name is documented, and a marker that means nothing fails.

The reference pages (docs/reference/) are made from the code by scripts/docs_hooks.py and by
mkdocstrings; these tests need neither MkDocs nor a DynamoDB engine."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import dynasem
from dynasem import checks, conf, exceptions, signals

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PACKAGE = ROOT / "dynasem"
CHECK_ID = re.compile(r"^dynasem\.[EWI]\d{3}$")


def _load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


def directives(page: str) -> list[str]:
    """The identifiers of the page's mkdocstrings blocks (``::: dynasem.x``)."""
    text = (REFERENCE / page).read_text(encoding="utf-8")
    return re.findall(r"^:::\s+(\S+)\s*$", text, flags=re.MULTILINE)


def resolve(path: str) -> Any:
    """The object at ``path`` as mkdocstrings finds it: the longest prefix that is a module,
    then attributes (so ``dynasem.run_once`` is the module, as for mkdocstrings, although
    the package's attribute of that name is the function)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise LookupError(path)


def markers(page: str) -> list[tuple[str, str | None]]:
    text = (REFERENCE / page).read_text(encoding="utf-8")
    found = [hooks.MARKER.fullmatch(line.strip()) for line in text.splitlines()]
    return [(m["name"], m["arg"]) for m in found if m]


# -- settings ----------------------------------------------------------------------------------


def test_every_setting_has_a_description():
    assert list(conf.HELP) == list(conf.DEFAULTS)
    assert all(text.strip() for text in conf.HELP.values())


def test_the_settings_table_has_a_row_per_key_with_its_default():
    table = hooks.render("settings")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(conf.DEFAULTS)
    for key, default in conf.DEFAULTS.items():
        shown = f'"{default}"' if isinstance(default, str) else repr(default)
        assert f"| `{key}` | `{shown}` |" in table
    assert markers("settings.md") == [("settings", None)]


# -- system checks -----------------------------------------------------------------------------


def _check_ids_used() -> dict[str, set[str]]:
    """Every check ID written in checks.py outside the CHECK_IDS registry, with the message
    classes (Error, Warning) it is given to where that is written out."""
    tree = ast.parse((PACKAGE / "checks.py").read_text(encoding="utf-8"))
    used: dict[str, set[str]] = {}
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else []
        targets += node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "CHECK_IDS" for t in targets):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                if CHECK_ID.match(sub.value):
                    used.setdefault(sub.value, set())
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                for keyword in sub.keywords:
                    if keyword.arg == "id" and isinstance(keyword.value, ast.Constant):
                        used.setdefault(keyword.value.value, set()).add(sub.func.id)
    return used


def test_every_check_id_used_is_documented_and_every_documented_one_used():
    used = _check_ids_used()
    assert len(used) >= 16  # E001-E014, W001, I001: the scan finds them
    assert set(used) == set(checks.CHECK_IDS)
    assert all(CHECK_ID.match(check_id) for check_id in checks.CHECK_IDS)


LEVELS = {"E": "Error", "W": "Warning", "I": "Info"}


def test_a_check_ids_letter_is_its_level():
    for check_id, kinds in _check_ids_used().items():
        letter = check_id.removeprefix("dynasem.")[0]
        assert kinds <= {LEVELS[letter]}, check_id
    table = hooks.render("checks")
    for check_id in checks.CHECK_IDS:
        level = LEVELS[check_id.removeprefix("dynasem.")[0]]
        assert f"| `{check_id}` | {level} |" in table
    assert markers("checks.md") == [("checks", None)]


# -- signals -----------------------------------------------------------------------------------


# Not a signal's arguments: who sends it, and what gives back a hold whose announcement failed.
_NOT_ARGUMENTS = {"sender", "undo"}


def _held_send_keywords() -> set[str]:
    """The keyword arguments ``Held._send(signal, **more)`` and ``Held._announce(signal,
    **more)`` send every signal of a hold with (the one ``announce(`` of ``_announce``, the
    acquire loop's step), besides ``more``."""
    tree = ast.parse((PACKAGE / "_engine" / "hold.py").read_text(encoding="utf-8"))
    (method,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_announce"
    ]
    (call,) = [
        n
        for n in ast.walk(method)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "announce"
    ]
    return {str(k.arg) for k in call.keywords if k.arg not in (None, *_NOT_ARGUMENTS)}


def _signal_named(node: ast.Call) -> str | None:
    """The signal ``node`` sends by name as its first argument (``announce(lock_busy, ...)``,
    ``held._send(lock_released, ...)``), if any."""
    first = node.args[0] if node.args else None
    if isinstance(first, ast.Name) and first.id in signals.SIGNALS:
        return first.id
    return None


def _sent(node: ast.Call) -> str | None:
    """The signal ``node`` sends itself (``lock_busy.send(...)``, ``send_robust``), or
    announces (``announce(lock_busy, ...)``), if any."""
    func = node.func
    if isinstance(func, ast.Name) and func.id == "announce":
        return _signal_named(node)
    if (
        isinstance(func, ast.Attribute)
        and func.attr in ("send", "send_robust")
        and isinstance(func.value, ast.Name)
        and func.value.id in signals.SIGNALS
    ):
        return func.value.id
    return None


def _sends() -> dict[str, set[str]]:
    """For each signal, the keyword arguments of every ``.send(`` of it in dynasem, of every
    ``announce(signal, ...)`` (a step of the acquire loop, sent by its driver), and of every
    ``Held._send(signal, ...)`` and ``Held._announce(signal, ...)``."""
    sent: dict[str, set[str]] = {}
    held_keywords = _held_send_keywords()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg for k in node.keywords}
            func = node.func
            if named := _sent(node):
                assert None not in keywords, f"{path}: a **kwargs send cannot be checked"
                assert "sender" in keywords, f"{path}: a send without sender="
                name = named
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in ("_send", "_announce")
                and (named := _signal_named(node))
            ):
                assert None not in keywords, f"{path}: a **kwargs send cannot be checked"
                keywords |= held_keywords
                name = named
            else:
                continue
            sent.setdefault(name, set()).update(str(k) for k in keywords - _NOT_ARGUMENTS)
    return sent


def test_every_signal_is_documented():
    defined = {
        name
        for name, value in vars(signals).items()
        if isinstance(value, signals.Signal) and not name.startswith("_")
    }
    assert defined == set(signals.SIGNALS)


def test_the_documented_arguments_are_those_sent():
    sent = _sends()
    assert set(sent) == set(signals.SIGNALS)  # every signal is sent somewhere
    for name, (_when, arguments) in signals.SIGNALS.items():
        assert set(arguments) == sent[name], name
    section = hooks.render("signals")
    for name, (_when, arguments) in signals.SIGNALS.items():
        assert f"## `{name}`" in section
        for keyword in arguments:
            assert f"| `{keyword}` |" in section
    assert markers("signals.md") == [("signals", None)]


# -- management commands -----------------------------------------------------------------------


def test_every_command_has_its_marker_on_the_commands_page():
    names = sorted(p.stem for p in (PACKAGE / "management" / "commands").glob("dynasem_*.py"))
    assert names == hooks.command_names()
    assert len(names) >= 6
    on_page = [arg for name, arg in markers("commands.md") if name == "command"]
    assert sorted(on_page) == names
    assert len(on_page) == len(set(on_page))


@pytest.mark.parametrize("name", hooks.command_names())
def test_a_command_renders_with_its_help_whatever_the_terminal(name, monkeypatch):
    section = hooks.render("command", name)
    assert section.startswith(f"## {name}\n")
    assert f"usage: manage.py {name}" in section
    assert "--help" in section
    lines = section.split("```text\n", 1)[1].split("\n    ```", 1)[0].splitlines()
    assert max(len(line) for line in lines) <= hooks.HELP_COLUMNS + 4  # the indent
    monkeypatch.setenv("COLUMNS", "200")
    assert hooks.render("command", name) == section


# -- the hook ----------------------------------------------------------------------------------


def test_every_marker_renders_to_markdown():
    for name in hooks.RENDERERS:
        assert hooks.render(name).strip(), name
    page = "# Settings\n\n<!-- dynasem:settings -->\n\nAfter.\n"
    out = hooks.replace_markers(page)
    assert "<!--" not in out and "| `LEASE` |" in out and out.endswith("After.\n")


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- dynasem:setings -->",
        "<!-- dynasem:command -->",
        "<!-- dynasem:command dynasem_nothing -->",
        "<!-- dynasem:settings LEASE -->",
    ],
)
def test_a_wrong_marker_fails(marker):
    with pytest.raises(hooks.MarkerError):
        hooks.replace_markers(f"text\n\n{marker}\n")


def test_a_marker_shown_in_code_or_in_a_sentence_is_left_alone():
    page = (
        "Write `<!-- dynasem:setings -->` on a line.\n\n"
        "```markdown\n<!-- dynasem:setings -->\n```\n\n"
        "~~~~\n```\n<!-- dynasem:settings -->\n~~~~\n"
    )
    assert hooks.replace_markers(page) == page


def test_the_build_fails_on_a_wrong_marker():
    exceptions_module = pytest.importorskip("mkdocs.exceptions")

    class Page:
        class file:  # noqa: N801 - as MkDocs' Page.file
            src_uri = "reference/x.md"

    with pytest.raises(exceptions_module.PluginError, match="reference/x.md"):
        hooks.on_page_markdown("<!-- dynasem:nothing -->", Page(), None, None)


# -- the Python API ----------------------------------------------------------------------------


def test_every_public_name_has_its_block():
    pages = ("api.md", "exceptions.md", "integrations.md")
    documented = [resolve(path) for page in pages for path in directives(page)]
    for name in dynasem.__all__:
        if name == "__version__":
            continue
        obj = getattr(dynasem, name)
        assert any(obj is d for d in documented), f"dynasem.{name} has no ::: block"


def test_every_exception_is_public_and_on_the_exceptions_page():
    on_page = [resolve(path) for path in directives("exceptions.md")]
    for _name, cls in inspect.getmembers(exceptions, inspect.isclass):
        if issubclass(cls, exceptions.SemaphoreError) and cls.__module__ == exceptions.__name__:
            assert getattr(dynasem, cls.__name__, None) is cls, cls
            assert cls.__name__ in dynasem.__all__, cls
            assert cls in on_page, cls


@pytest.mark.parametrize("page", ["api.md", "exceptions.md", "integrations.md"])
def test_every_block_names_something_with_a_docstring(page):
    paths = directives(page)
    assert paths
    for path in paths:
        obj = resolve(path)
        if not isinstance(obj, ModuleType) and not callable(obj):
            continue  # a module attribute (celery.retry_later): its docstring is in the source
        assert inspect.getdoc(obj), path
        assert ":class:`" not in inspect.getdoc(obj), path  # Sphinx roles show as typed
        assert ":func:`" not in inspect.getdoc(obj), path
