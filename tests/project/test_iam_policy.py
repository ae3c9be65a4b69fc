"""The IAM policy of docs/reference/iam.md against the DynamoDB requests dynasem makes: read
from the source (each statement allows what its role's code can send, and nothing else) and
recorded while the test session ran (every request dynasem sent was allowed)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore import xform_name

import dynasem
from tests.support.helpers import DYNASEM_REQUESTS, runs_last

PACKAGE = Path(dynasem.__file__).parent
DOC = PACKAGE.parent / "docs" / "reference" / "iam.md"
TABLE_ARN = "arn:aws:dynamodb:REGION:ACCOUNT:table/dynasem-locks"
INDEX_ARN = f"{TABLE_ARN}/index/*"
if not DOC.is_file():  # an unpacked sdist carries tests/, not docs/
    pytest.skip(
        "docs/ is not here (an sdist): the policy is checked in a checkout", allow_module_level=True
    )

# Whose code each module is. Every other module (dynasem/_storage/ aside: it is what they all
# call; dynasem/testing/ aside: no deployment's) runs in the application's processes.
OPERATORS = {
    "dynasem.admin",
    "dynasem._operators.admin_pages",
    "dynasem._operators.locks",
    "dynasem._operators.reaper",
    "dynasem._operators.listing",
    "dynasem._operators.jobs",
    "dynasem.management.commands._output",
    "dynasem.management.commands.dynasem_jobs",
    "dynasem.management.commands.dynasem_locks",
    "dynasem.management.commands.dynasem_reap",
    "dynasem.management.commands.dynasem_release",
}
TABLE_MANAGEMENT = {"dynasem.management.commands.dynasem_createtable"}
COMMANDS = "dynasem.management.commands."
LOCK_COMMANDS = {f"{COMMANDS}dynasem_lead"}  # it holds a lock as the app does
# The system checks run before every manage.py command, whoever runs it: every statement
# allows what they send.
CHECKS = {"dynasem.checks"}
SIDS = ("DynasemLocks", "DynasemOperators", "DynasemTableManagement")
# Sent by code of dynasem's that only dynasem.testing calls (a test table's end).
TEST_ONLY = {"DeleteTable"}

_botocore = botocore.session.get_session()
# DynamoDB's operations by the name of their boto3 client method: "update_item": "UpdateItem".
OPERATIONS = {xform_name(n): n for n in _botocore.get_service_model("dynamodb").operation_names}
_waiters = _botocore.get_waiter_model("dynamodb")
WAITERS = {xform_name(n): _waiters.get_waiter(n).operation for n in _waiters.waiter_names}


# -- reading the source ------------------------------------------------------------------------


@dataclass
class Def:
    """A top-level function or class of a module (or the module's own statements, "<module>"),
    what it sends itself and which others it uses."""

    module: str
    name: str
    nodes: list[ast.AST]
    sends: set[str] = field(default_factory=set)
    queries_index: bool = False
    uses: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class Source:
    defs: dict[tuple[str, str], Def]
    # Each DynamoDB operation named in the source: where (file:line), for messages.
    sent_at: dict[str, list[str]]


@cache
def source() -> Source:
    trees: dict[str, tuple[ast.Module, bool, str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[:2] == ("dynasem", "testing"):
            continue
        package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if package else parts)
        trees[name] = (ast.parse(path.read_text(), str(path)), package, str(path))
    imports = {m: _imports(m, tree, package, trees) for m, (tree, package, _) in trees.items()}
    defs: dict[tuple[str, str], Def] = {}
    for module, (tree, _, _) in trees.items():
        rest: list[ast.AST] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defs[module, stmt.name] = Def(module, stmt.name, [stmt])
            elif not (
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
            ):
                rest.append(stmt)  # __all__ names functions, some after operations
        defs[module, "<module>"] = Def(module, "<module>", rest)

    def resolve(module: str, name: str) -> tuple[str, str] | None:
        if (module, name) in defs:
            return module, name
        target = imports[module].get(name)
        return resolve(*target) if target and target[1] else None

    # Functions that send the operation one of their parameters names: send_request, and whatever
    # passes its parameter on to one (nexts._if_ours), to a fixed point.
    senders = {"send_request": 0}
    while True:
        before = dict(senders)
        for d in defs.values():
            for stmt in d.nodes:
                if not isinstance(stmt, ast.FunctionDef):
                    continue
                params = [a.arg for a in stmt.args.args]
                for call in _calls(stmt):
                    arg = _sent_arg(call, senders)
                    if isinstance(arg, ast.Name) and arg.id in params:
                        senders[stmt.name] = params.index(arg.id)
        if senders == before:
            break

    sent_at: dict[str, list[str]] = {}
    for d in defs.values():
        path = trees[d.module][2].removeprefix(f"{PACKAGE.parent}/")
        for stmt in d.nodes:
            params = {a.arg for a in ast.walk(stmt) if isinstance(a, ast.arg)}
            for call in _calls(stmt):
                arg = _sent_arg(call, senders)
                # An operation this test cannot read (computed, or from a variable) would go
                # unchecked: the source must name it, or pass on a parameter that does.
                assert (
                    arg is None
                    or isinstance(arg, ast.Constant)
                    or (isinstance(arg, ast.Name) and arg.id in params)
                ), f"{path}:{call.lineno}: cannot tell which operation {ast.unparse(call)} sends"
                op = _operation(call, senders, f"{path}:{call.lineno}")
                if op is not None:
                    d.sends.add(op)
                    sent_at.setdefault(op, []).append(f"{path}:{call.lineno}")
            texts = {n.value for n in ast.walk(stmt) if isinstance(n, ast.Constant)}
            d.queries_index |= "IndexName" in texts
            d.uses |= _uses(d.module, stmt, imports[d.module], resolve, defs)
        d.queries_index &= bool(d.sends & {"Query", "Scan"})
    return Source(defs, sent_at)


def _imports(
    module: str, tree: ast.Module, package: bool, trees: dict[str, Any]
) -> dict[str, tuple[str, str | None]]:
    """Names bound by ``from ... import`` anywhere in the module (functions import lazily
    too): a module (name, None) or a name of one (module, name)."""
    here = module if package else module.rpartition(".")[0]
    found: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            up = here.split(".")[: len(here.split(".")) - node.level + 1]
            base = ".".join(up + ([node.module] if node.module else []))
        if not base.startswith("dynasem"):
            continue
        for alias in node.names:
            full = f"{base}.{alias.name}"
            bound = alias.asname or alias.name
            found[bound] = (full, None) if full in trees else (base, alias.name)
    return found


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _sent_arg(call: ast.Call, senders: dict[str, int]) -> ast.expr | None:
    index = senders.get(_callee(call) or "")
    return call.args[index] if index is not None and len(call.args) > index else None


def _operation(call: ast.Call, senders: dict[str, int], where: str) -> str | None:
    """The DynamoDB operation ``call`` sends: through a sender, a client's own method or one
    of its waiters (which polls DescribeTable)."""
    arg = _sent_arg(call, senders)
    if isinstance(arg, ast.Constant):
        assert arg.value in OPERATIONS, f"{where}: {arg.value!r} is no DynamoDB operation"
        return OPERATIONS[arg.value]
    callee = _callee(call)
    on_client = isinstance(call.func, ast.Attribute) and "client" in ast.unparse(call.func.value)
    if on_client and callee in OPERATIONS:
        return OPERATIONS[callee]
    if on_client and callee == "get_waiter" and isinstance(call.args[0], ast.Constant):
        return WAITERS[call.args[0].value]
    return None


def _uses(
    module: str, stmt: ast.AST, imports: dict[str, Any], resolve: Any, defs: dict[Any, Def]
) -> set[Any]:
    """The package's functions and classes ``stmt`` uses: a function wherever it is named (it
    may be passed on and called later); a class only where it is called, or a method of it
    (naming a class runs none of its code), and the bases of a class."""
    called = {id(c.func) for c in _calls(stmt)}
    called |= {
        id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Attribute) and id(n) in called
    }
    if isinstance(stmt, ast.ClassDef):
        called |= {id(b) for b in stmt.bases}
    found = set()
    for node in ast.walk(stmt):
        target = None
        if isinstance(node, ast.Name):
            target = resolve(module, node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            bound = imports.get(node.value.id)
            if bound and bound[1] is None:
                target = resolve(bound[0], node.attr)
        if target is None:
            continue
        if not isinstance(defs[target].nodes[0], ast.ClassDef) or id(node) in called:
            found.add(target)
    return found


def reach(modules: set[str]) -> list[Def]:
    """Every definition the code of ``modules`` may run."""
    defs = source().defs
    todo = [key for key in defs if key[0] in modules]
    seen: set[tuple[str, str]] = set()
    while todo:
        key = todo.pop()
        if key not in seen:
            seen.add(key)
            todo += [*defs[key].uses, (key[0], "<module>")]
    return [defs[key] for key in sorted(seen)]


def groups() -> dict[str, set[str]]:
    """The modules of each statement's role."""
    modules = {module for module, _ in source().defs}
    unassigned = {m for m in modules if m.startswith(COMMANDS)} - OPERATORS - TABLE_MANAGEMENT
    assert unassigned <= LOCK_COMMANDS, f"{sorted(unassigned - LOCK_COMMANDS)}: whose command?"
    locks = {
        m
        for m in modules - OPERATORS - TABLE_MANAGEMENT - CHECKS
        if m != "dynasem._storage" and not m.startswith("dynasem._storage.")
    }
    return {
        "DynasemLocks": locks | CHECKS,
        "DynasemOperators": OPERATORS | CHECKS,
        "DynasemTableManagement": TABLE_MANAGEMENT | CHECKS,
    }


def sends(sid: str) -> dict[str, list[str]]:
    """Each operation the code of ``sid``'s role may send: which functions send it."""
    found: dict[str, list[str]] = {}
    for d in reach(groups()[sid]):
        for op in d.sends:
            found.setdefault(op, []).append(f"{d.module}.{d.name}")
    return found


def queries_index(sid: str) -> bool:
    return any(d.queries_index for d in reach(groups()[sid]))


# -- reading the policy ------------------------------------------------------------------------


@cache
def policy() -> dict[str, Any]:
    blocks = re.findall(r"^```json\n(.*?)^```$", DOC.read_text(), re.DOTALL | re.MULTILINE)
    assert len(blocks) == 1, f"{DOC}: {len(blocks)} ```json blocks; the policy is the one"
    try:
        document: dict[str, Any] = json.loads(blocks[0])
    except json.JSONDecodeError as exc:
        pytest.fail(f"{DOC}: the policy is not valid JSON: {exc}")
    return document


def statements() -> dict[str, dict[str, Any]]:
    return {s.get("Sid"): s for s in policy()["Statement"]}


def actions(sid: str) -> set[str]:
    return {a.removeprefix("dynamodb:") for a in statements()[sid]["Action"]}


def allowed() -> set[str]:
    return set().union(*(actions(sid) for sid in SIDS))


def _listed(ops: set[str], where: dict[str, list[str]]) -> str:
    return "; ".join(f"dynamodb:{op} (sent by {', '.join(where[op])})" for op in sorted(ops))


# -- the tests ---------------------------------------------------------------------------------


def test_the_policy_is_an_iam_policy_document_of_three_statements():
    document = policy()
    assert document["Version"] == "2012-10-17"
    assert [s.get("Sid") for s in document["Statement"]] == list(SIDS)
    for sid, statement in statements().items():
        assert statement["Effect"] == "Allow", f"{sid}: Effect {statement['Effect']!r}"
        listed = statement["Action"]
        assert listed == sorted(set(listed)), f"{sid}: Action is not sorted, or repeats one"
        unknown = [a for a in listed if a.removeprefix("dynamodb:") not in OPERATIONS.values()]
        assert not unknown, f"{sid}: {unknown} are no DynamoDB actions (dynamodb:Name)"


@pytest.mark.parametrize("sid", SIDS)
def test_each_statement_names_the_table_and_its_indexes_only_where_queried(sid: str):
    resources = statements()[sid]["Resource"]
    wanted = [TABLE_ARN, INDEX_ARN] if queries_index(sid) else [TABLE_ARN]
    assert resources == wanted, (
        f"{sid}: Resource {resources}, wanted {wanted}: its role's code "
        f"{'queries' if queries_index(sid) else 'queries no'} index"
    )


def test_the_policy_allows_every_operation_the_code_sends_and_no_other():
    sent = set(source().sent_at)
    missing = sent - TEST_ONLY - allowed()
    assert not missing, f"{DOC.name} allows none of {_listed(missing, source().sent_at)}"
    unused = allowed() - (sent - TEST_ONLY)
    assert not unused, f"{DOC.name} allows {sorted(unused)}, which no deployment's code sends"
    # What only dynasem.testing sends is in no statement, and no role's code reaches it.
    for sid in SIDS:
        reached = TEST_ONLY & set(sends(sid))
        assert not reached, f"{sid}'s role sends {_listed(reached, sends(sid))}"
    assert TEST_ONLY <= sent, f"{sorted(TEST_ONLY - sent)} no longer sent: drop from TEST_ONLY"


@pytest.mark.parametrize("sid", SIDS)
def test_each_statement_allows_exactly_what_its_roles_code_sends(sid: str):
    sent = sends(sid)
    missing = set(sent) - actions(sid)
    assert not missing, f"{sid} lacks {_listed(missing, sent)}"
    unused = actions(sid) - set(sent)
    assert not unused, f"{sid} allows {sorted(unused)}, which the code of its role never sends"


@runs_last
def test_every_request_dynasem_sent_this_session_was_allowed(lock_table: str):
    from dynasem import semaphore
    from dynasem._storage import dynamodb

    # One lock of its own (and a request of the test's, which is not dynasem's), so that the
    # recorder is seen working even when this test runs alone.
    with semaphore("iam:policy"):
        pass
    dynamodb.get_client().list_tables(Limit=1)
    assert "UpdateItem" in DYNASEM_REQUESTS, f"recorded {sorted(DYNASEM_REQUESTS)}"
    assert "ListTables" not in DYNASEM_REQUESTS, "a test's own request was recorded as dynasem's"
    refused = DYNASEM_REQUESTS - TEST_ONLY - allowed()
    assert not refused, (
        f"dynasem sent {sorted(refused)} in this session, which {DOC.name} allows in no statement"
    )
