"""pytest-xdist's ``--dist loadgroup`` made to group again (scripts/pytest.sh, noxfile.py).

The tests of a module with a module-scoped fixture (a PostgreSQL or MariaDB server, gunicorn,
the built docs site, the hosts' network) must run on one worker, which sets the fixture up
once: otherwise each worker sets it up itself (a run on 8 workers here, 2026-12-02: the docs
site built 8 times, 47-76 s each, the example's servers twice). pytest-xdist 3.8 groups by
appending ``@group`` to each marked test's id in the worker, which pytest 9.2 no longer takes
(pytest-dev/pytest-xdist#1386): every test was its own unit, as under ``--dist load``.

So the groups go to the controller beside the ids: each worker writes the group of every
grouped test (``{nodeid: group}``, JSON) to a file of its own in a folder the controller
names (``workerinput``), before it reports its collection; the controller's scheduler reads
one of them when it splits the collection into units (after every worker reported). Tests
not grouped stay units of one test each, handed out as workers run short, the largest units
first (``loadscopereorder``). Only pytest-xdist's hooks and its LoadScopeScheduling are used;
the ids are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

KEY = "dynasem_xdist_groups"  # workerinput: the folder of the workers' group files


def groups_of(items: list[pytest.Item]) -> dict[str, str]:
    """The group of each test of a module that uses a module-scoped fixture: its module."""
    groups = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope == "module" for d in defs):
            groups[item.nodeid] = item.nodeid.split("::")[0]
    return groups


def configure_controller(config: pytest.Config) -> None:
    """On the controller of a ``--dist loadgroup`` run: the folder the workers write to."""
    if getattr(config.option, "dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    folder = tempfile.mkdtemp(prefix="dynasem-xdist-groups-")
    config.stash[_FOLDER] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def configure_node(node: Any) -> None:
    """pytest_configure_node (controller): tell a worker where to write its groups."""
    folder = node.config.stash.get(_FOLDER, None)
    if folder is not None:
        node.workerinput[KEY] = folder


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: its groups, written whole (renamed into place) before it reports."""
    folder = getattr(config, "workerinput", {}).get(KEY)
    if folder is None:
        return
    worker = config.workerinput["workerid"]
    path = Path(folder, f"{worker}.json")
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(groups_of(items)))
    os.replace(partial, path)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest_xdist_make_scheduler (controller): the grouping scheduler under loadgroup."""
    folder = config.stash.get(_FOLDER, None)
    if folder is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupedByFile(LoadScopeScheduling):
        """A unit per group the workers wrote, a unit per test for the rest."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = read_groups(folder)
            return self.groups.get(nodeid, nodeid)

    return GroupedByFile(config, log)


def read_groups(folder: str) -> dict[str, str]:
    """The groups one worker wrote (every worker collected the same tests: xdist checks)."""
    written = sorted(Path(folder).glob("*.json"))
    if not written:
        raise RuntimeError(f"tests/support/xdist_groups.py: no worker wrote its groups to {folder}")
    groups: dict[str, str] = json.loads(written[0].read_text())
    return groups


_FOLDER = pytest.StashKey[str]()
