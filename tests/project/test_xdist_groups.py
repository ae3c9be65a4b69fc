"""The suite's own xdist grouping (tests/support/xdist_groups.py): under ``--dist loadgroup``
a module with a module-scoped fixture runs whole on one worker, which sets it up once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import pytest
from tests.support import xdist_groups

def pytest_configure(config):
    xdist_groups.configure_controller(config)

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    xdist_groups.configure_node(node)

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.make_scheduler(config, log)

def pytest_collection_modifyitems(config, items):
    xdist_groups.write_groups(config, items)
"""

# A module whose tests share a module-scoped fixture (each logs its worker and the fixture's
# set-ups), and a module without one, whose tests may go anywhere.
SERVER_MODULE = """
import os, time
import pytest

@pytest.fixture(scope="module")
def server():
    with open("setups.log", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    return "up"

@pytest.mark.parametrize("i", range(12))
def test_uses_server(server, i):
    time.sleep(0.05)
    with open("runs.log", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

PLAIN_MODULE = """
import os, time
import pytest

@pytest.mark.parametrize("i", range(24))
def test_plain(i):
    time.sleep(0.05)
    with open("plain.log", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_a_module_with_a_module_scoped_fixture_runs_on_one_worker(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_server=SERVER_MODULE, test_plain=PLAIN_MODULE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:django", "-n", "3", "--dist", "loadgroup",
        timeout=120,
    )  # fmt: skip
    result.assert_outcomes(passed=36)
    setups = pytester.path.joinpath("setups.log").read_text().split()
    runs = pytester.path.joinpath("runs.log").read_text().split()
    plain = pytester.path.joinpath("plain.log").read_text().split()
    assert len(setups) == 1 and set(runs) == set(setups), (setups, runs)
    assert len(set(plain)) > 1, plain  # the others are spread over the workers


def test_groups_are_the_modules_of_module_scoped_fixtures(tmp_path: Path):
    from tests.support import xdist_groups

    (tmp_path / "gw1.json").write_text(json.dumps({"tests/a.py::t[1]": "tests/a.py"}))
    assert xdist_groups.read_groups(str(tmp_path)) == {"tests/a.py::t[1]": "tests/a.py"}
    with pytest.raises(RuntimeError, match="no worker wrote"):
        xdist_groups.read_groups(str(tmp_path / "empty"))
