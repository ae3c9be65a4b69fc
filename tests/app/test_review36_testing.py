"""Review (thirty-sixth session): dynasem.testing's own examples, as a user copies them."""

from __future__ import annotations

import re
import time

import pytest

from dynasem import semaphore
from dynasem.testing import abandon, fresh_table


def _example(doc: str | None) -> str:
    """The ```python block of a docstring, dedented."""
    found = re.search(r"```python\n(.*?)```", doc or "", re.DOTALL)
    assert found, "no example in the docstring"
    lines = found.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


@pytest.mark.reentry  # as in a user's project
def test_abandons_example_runs_under_the_default_settings():
    """``abandon``'s example (in the reference, docs/reference/integrations.md) took a hold
    with ``lease=2`` and slept 2.5 s: under the default ``CLOCK_SKEW`` of 5 s the acquire
    raises ValueError (a lease must be longer than the skew), and with a skew of 1 s the
    sleep is too short for the takeover (lease + skew), so ``wait=0`` raises SemaphoreBusy."""
    code = _example(abandon.__doc__)
    names = {"semaphore": semaphore, "abandon": abandon, "time": time, "fresh_table": fresh_table}
    with fresh_table(CLOCK_SKEW=5):  # dynasem's default, which a user's settings keep
        exec(compile(code, "abandon's example", "exec"), names)
