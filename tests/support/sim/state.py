"""dynasem's module-level state, and which of it is a simulated process's own.

Real processes each have their own module globals; simulated ones share one interpreter, so
the scheduler swaps every per-process global (:data:`PER_PROCESS`) whenever another process's
thread runs: each process gets fresh values when it starts (made in its own context), and
whatever its code rebinds is saved when it stops running. A global that should be here and
is not would let processes share memory (a hand-over remembered by the wrong process, one
heartbeat thread for everyone), which hides bugs or makes false ones.
``tests/simulation/test_simulator.py`` lists every mutable module global of dynasem and fails
when one is neither here, nor replaced by the runtime (:data:`REPLACED`), nor shared on
purpose (:data:`SHARED`, with the reason).
"""

from __future__ import annotations

import ast
import contextvars
import importlib
import logging
import math
import os
import pkgutil
import re
import types
import typing
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dynasem

Key = tuple[str, str]  # (module, attribute)


def _heartbeat_scheduler(proc: Any) -> Any:
    from dynasem._engine import heartbeat

    return heartbeat._Scheduler()  # its Condition is the simulation's (shims)


def _host_id(proc: Any) -> str:
    return str(proc.host.push_id)


def _lock(proc: Any) -> Any:
    return proc.world.threading.Lock()


def _empty(proc: Any) -> dict[Any, Any]:
    return {}


# Each process's own value of these, made by the factory when the process starts.
PER_PROCESS: dict[Key, Callable[[Any], Any]] = {
    ("dynasem._engine.queue", "queued_recently"): _empty,
    ("dynasem._engine.queue", "busy_recently"): _empty,
    ("dynasem._engine.queue", "pushed_recently"): _empty,
    ("dynasem._engine.queue", "turn_seconds"): _empty,
    ("dynasem._engine.permit_hold", "rows"): _empty,
    ("dynasem._engine.reader_hold", "rows"): _empty,
    ("dynasem._engine.readers", "_watched"): _empty,
    ("dynasem._engine.readers", "_since"): _empty,
    ("dynasem._engine.heartbeat", "_current"): _heartbeat_scheduler,
    # Blocks entered and not left yet (semaphore, run_once, leadership), found by their frames.
    ("dynasem._engine.reentry", "_open_blocks"): _empty,
    # Holds whose release an interrupt cut short, given back at the process's exit.
    ("dynasem._engine.hold", "_left"): lambda proc: set(),
    ("dynasem._engine.push", "_listener"): lambda proc: None,
    ("dynasem._engine.push", "_failed_bind"): lambda proc: None,
    ("dynasem._engine.push", "_short_until"): lambda proc: -math.inf,
    ("dynasem._engine.push", "_lock"): _lock,
    ("dynasem._engine.push", "_mac_failures"): lambda proc: 0,
    ("dynasem._engine.push", "_mac_warned_at"): lambda proc: -math.inf,
    # Which machine we are, for loopback pushes: a host's, not the interpreter's.
    ("dynasem._engine.push", "HOST_ID"): _host_id,
    ("dynasem._engine.processes", "_told"): lambda proc: None,
    ("dynasem._engine.steps", "_io"): lambda proc: None,
    ("dynasem._engine.steps", "_io_lock"): _lock,
    ("dynasem._engine.steps", "_io_pid"): lambda proc: os.getpid(),
    ("dynasem._engine.push", "_pid"): lambda proc: os.getpid(),
    ("dynasem._storage.dynamodb", "_client_pid"): lambda proc: os.getpid(),
    ("dynasem._storage.dynamodb", "_clients"): _empty,
    ("dynasem._storage.queue_entries", "_missing"): _empty,
    ("dynasem._storage.dynamodb", "_client_lock"): _lock,
    ("dynasem._transactions.commit", "_pending"): lambda proc: weakref.WeakKeyDictionary(),
    # The holds a waiter of the same process tells it is next (hold.queued_behind).
    ("dynasem._engine.push", "holds"): lambda proc: weakref.WeakValueDictionary(),
    ("dynasem._engine.push", "_early"): _empty,
    ("dynasem._engine.push", "_late"): _empty,
    ("dynasem._engine.push", "_words_lock"): _lock,
    ("dynasem._engine.push", "handed_to"): _empty,
    ("dynasem._engine.push", "passed_on"): _empty,
    ("dynasem._observability.telemetry", "_complained"): lambda proc: False,
}

# Replaced by the runtime for the whole run (its seams); per process through them.
REPLACED: dict[Key, str] = {
    ("dynasem._clock", "wall_clock"): "the current process's host clock",
    ("dynasem._clock", "monotonic"): "the current process's monotonic clock",
    ("dynasem._engine.processes", "_probe"): "the current process's identity (cached per "
    "process for real: functools.cache)",
    ("dynasem._engine.processes", "_stat"): "the simulated /proc of the current host",
    ("dynasem._storage.dynamodb", "get_client"): "the current process's simulated client",
    ("dynasem._storage.dynamodb", "process_identity"): "host:pid of the current process "
    "(os.getpid() is the interpreter's, the same for every simulated process)",
    ("dynasem._observability.telemetry", "ON"): "off: telemetry decides nothing",
}

# Shared by every simulated process, and why that is what real processes would see too.
SHARED: dict[Key, str] = {
    ("dynasem._engine.processes", "_probe_of"): "never called: _probe, its only caller, is "
    "replaced by the runtime",
    ("dynasem._storage.records", "_codecs"): "codecs per record class, derived from code",
    ("dynasem._storage.records", "_serializer"): "boto3's TypeSerializer: no state",
    ("dynasem._storage.records", "_deserializer"): "boto3's TypeDeserializer: no state",
    ("dynasem._engine.decorators", "_parsed"): "parsed key templates, derived from code",
    ("dynasem._engine.decorators", "succession"): "what names a task's retry's holds to wait "
    "out, added at ready(): the same code in every process",
    ("dynasem._observability.telemetry", "_instruments"): "telemetry is off in a simulation",
    ("dynasem._observability.telemetry", "_instruments_lock"): "telemetry is off",
    ("dynasem._observability.telemetry", "_pid"): "telemetry is off",
    ("dynasem._observability.telemetry", "_tracing"): "telemetry is off",
    ("dynasem._observability.telemetry", "_metered"): "telemetry is off",
    ("dynasem._observability.telemetry", "_METER_FROM_ENV"): "telemetry is off",
    ("dynasem._observability.telemetry", "_PROVIDER_FROM_ENVIRONMENT"): "telemetry is off",
    ("dynasem._observability.telemetry", "_settings"): "the same settings everywhere",
    ("dynasem._observability.telemetry", "_changes"): "the same settings everywhere",
    ("dynasem._transactions.fencing", "_fenced_connections"): "a hint: a superset of the "
    "connections with a kept fence, whose own attribute is read",
    ("dynasem._engine.arguments", "_derived"): "the timing derived from the settings, the "
    "same everywhere",
    ("dynasem._background.command_init", "_libc"): "a handle on libc: no state of ours",
    ("dynasem._storage.dynamodb", "_models"): "botocore's parsed service models: its data "
    "files, the same for every process",
}

# Packages whose module globals are checked (the operators' pages and commands run in no
# simulated process).
CHECKED = ("_engine", "_storage", "_background", "_transactions", "_observability")

_IMMUTABLE = (
    int,
    float,
    str,
    bytes,
    bool,
    type(None),
    frozenset,
    tuple,
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    contextvars.ContextVar,
    logging.Logger,
    re.Pattern,
    types.GenericAlias,
    types.UnionType,
    typing.TypeVar,
)


def _mutable(value: Any) -> bool:
    if isinstance(value, _IMMUTABLE):
        return False
    # typing's aliases (Callable[...], Generator[...]) are descriptions, not state.
    return type(value).__module__ not in ("typing", "collections.abc")


def module_globals() -> dict[Key, str]:
    """Every module global of :data:`CHECKED` that holds state: rebound by a ``global``
    statement, or of a mutable type (dicts, locks, caches, objects); with why it counts."""
    found: dict[Key, str] = {}
    root = Path(dynasem.__file__).parent
    for package in CHECKED:
        for info in pkgutil.iter_modules([str(root / package)]):
            name = f"dynasem.{package}.{info.name}"
            tree = ast.parse((root / package / f"{info.name}.py").read_text())
            module = importlib.import_module(name)
            for attr in _top_level_names(tree):
                value = getattr(module, attr, None)
                if attr in _rebound(tree):
                    found[(name, attr)] = "rebound by a global statement"
                elif _mutable(value) and not attr.isupper():  # UPPER: a constant
                    found[(name, attr)] = f"a {type(value).__name__}"
    return found


def _top_level_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.FunctionDef) and any(
            "cache" in ast.unparse(d) for d in node.decorator_list
        ):
            names.append(node.name)  # functools.cache: state of its own
        for target in targets:
            names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return [n for n in names if n not in ("__all__", "logger")]


def _rebound(tree: ast.Module) -> set[str]:
    return {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}


class ModuleState:
    """Swaps the per-process globals: :meth:`enter` makes ``proc``'s current (saving the
    previous process's), so each process sees only its own."""

    def __init__(self) -> None:
        self.slots = [
            (importlib.import_module(module), attr, factory)
            for (module, attr), factory in PER_PROCESS.items()
        ]
        self.loaded: Any = None
        self._original = [(m, a, getattr(m, a)) for m, a, _ in self.slots]
        # The modules' own namespaces: a swap reads and writes them directly (what getattr
        # and setattr on a module come to, without their cost at every switch).
        self._places = [(vars(m), a) for m, a, _ in self.slots]

    def fresh(self, proc: Any) -> list[Any]:
        """A new process's values (made in its own context: locks are the simulation's)."""
        return [factory(proc) for _, _, factory in self.slots]

    def enter(self, proc: Any) -> None:
        if proc is self.loaded:
            return
        self.save()
        for (namespace, attr), value in zip(self._places, proc.globals, strict=True):
            namespace[attr] = value
        self.loaded = proc

    def save(self) -> None:
        if self.loaded is not None:
            self.loaded.globals = [namespace[attr] for namespace, attr in self._places]

    def restore(self) -> None:
        """Back to the interpreter's own values (the run is over)."""
        self.save()
        self.loaded = None
        for module, attr, value in self._original:
            setattr(module, attr, value)
