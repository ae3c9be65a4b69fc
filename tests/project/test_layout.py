"""The package's layout: no import cycle between its modules, each module importable alone."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dynasem"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_in(source: str, package: str, *, type_checking: bool = False) -> set[str]:
    """The package modules ``source`` (a module of ``package``) imports when it runs (at
    import time or in a function body); with ``type_checking``, also those it imports only
    for type checking (under ``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def target(base: str, alias: str) -> str:
        sub = f"{base}.{alias}"
        return sub if sub in MODULES else base

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base in MODULES:
                for alias in node.names:
                    found.add(target(base, alias.name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def imports(name: str, *, type_checking: bool = False) -> set[str]:
    """The package modules the module ``name`` imports (see :func:`imports_in`)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = imports_in(path.read_text(encoding="utf-8"), package, type_checking=type_checking)
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as the list of modules on it), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := walk(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)) is not None:
            return cycle
    return None


def test_find_cycle_sees_a_cycle_and_its_absence() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_count_function_level_and_type_checking_only_when_asked() -> None:
    # core imports the decorator at module level.
    assert "dynasem._engine.decorators" in imports("dynasem._engine.core")
    # apps.ready() imports the checks inside a function: that counts.
    assert "dynasem.checks" in imports("dynasem.apps")
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ._engine.core import Semaphore\n"
        "else:\n"
        "    from . import conf\n"
    )
    assert imports_in(source, "dynasem") == {"dynasem.conf"}
    assert imports_in(source, "dynasem", type_checking=True) == {
        "dynasem._engine.core",
        "dynasem.conf",
    }


def test_the_package_has_no_import_cycle() -> None:
    graph = {name: imports(name) for name in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_package_has_no_import_cycle_even_through_type_hints() -> None:
    """A module that needs another's object for a type hint takes a small protocol of what
    it uses (``spec.LockSpec``, ``decorators.Decoratable``), not the whole class: an import
    under ``TYPE_CHECKING`` that closes a circle still ties the two modules together."""
    graph = {name: imports(name, type_checking=True) for name in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_lock_logic_never_imports_the_admin_or_commands() -> None:
    graph = {name: imports(name) for name in MODULES}
    seen: set[str] = set()
    todo = ["dynasem._engine.core"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    assert not {n for n in seen if n.startswith(("dynasem.admin", "dynasem.management"))}


# The layers, top to bottom (docs/ARCHITECTURE.md): a module imports its own layer's modules
# and those of the layers below it, never one above (type-only imports included). The two
# layers on one line are peers that do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("admin", "apps", "checks", "celery", "django_tasks", "management", "testing", "__init__"),
    ("_operators", "_background"),
    ("_engine",),
    ("_transactions",),
    ("_storage",),
    ("_observability",),
    ("_clock", "conf", "exceptions", "signals", "models"),
]


def layer_of(module: str) -> tuple[int, str]:
    """The layer of a module of the package (its index in LAYERS) and its part's name."""
    part = module.split(".")[1] if "." in module else "__init__"
    for depth, parts in enumerate(LAYERS):
        if part in parts:
            return depth, part
    raise AssertionError(f"{module}: in no layer of LAYERS")


def test_layer_of_places_every_module() -> None:
    assert layer_of("dynasem") == (0, "__init__")
    assert layer_of("dynasem._engine.core") == (2, "_engine")
    assert layer_of("dynasem.management.commands.dynasem_lead") == (0, "management")
    with pytest.raises(AssertionError):
        layer_of("dynasem.nowhere")


def test_imports_only_go_down_the_layers() -> None:
    upward = []
    for name in MODULES:
        depth, part = layer_of(name)
        for target in imports(name, type_checking=True):
            to_depth, to_part = layer_of(target)
            if to_depth < depth or (to_depth == depth and to_part != part and depth > 0):
                upward.append(f"{name} -> {target}")
    assert not upward, upward


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.endswith("__main__")))
def test_every_module_imports(name: str) -> None:
    assert importlib.import_module(name).__name__ == name


# A function fits on a screen: its body (the docstring left out) in at most this many lines.
SCREEN = 60


def function_lengths() -> dict[str, int]:
    """Every function of the package by qualified name: the lines of its body, docstring
    left out."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = child.body
                first = body[0]
                docstring = isinstance(first, ast.Expr) and isinstance(
                    getattr(first, "value", None), ast.Constant
                )
                start = (
                    (body[1].lineno if len(body) > 1 else child.end_lineno)
                    if docstring
                    else first.lineno
                )
                found[f"{prefix}.{child.name}"] = (child.end_lineno or start) - (start or 0) + 1
                visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")

    for name, path in MODULES.items():
        visit(ast.parse(path.read_text(encoding="utf-8")), name)
    return found


def test_every_function_fits_on_a_screen() -> None:
    """Size is judged per function, not per file (STYLE.md): a function fits on a screen
    (60 lines of logic, the docstring left out); ruff's complexity rules say the rest."""
    lengths = function_lengths()
    too_long = {name: n for name, n in lengths.items() if n > SCREEN}
    assert not too_long, f"split these where their phases are: {too_long}"
