"""Shrinking a failing run: fewer processes, hosts and steps, gentler faults, as long as the
run still fails. Every candidate is a run of its own (another interleaving: the same seed
with other options is another run), so what is kept is a smaller run that fails, perhaps
for a related reason; its options replay it like any other."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from .runtime import Options, Result, run

# Gentler fault profiles, in order of preference, from each one.
GENTLER = {
    "heavy": ("light", "pauses", "crashes"),
    "light": ("pauses", "crashes", "none"),
    "pauses": ("none",),
    "crashes": ("none",),
}


def smaller(o: Options) -> Iterator[Options]:
    """Candidates one step smaller than ``o``, the boldest first."""
    if o.steps > 1:
        yield dataclasses.replace(o, steps=max(1, o.steps // 2))
    if o.processes > 2:
        yield dataclasses.replace(o, processes=o.processes - 1)
    if o.hosts > 1:
        yield dataclasses.replace(o, hosts=o.hosts - 1)
    for profile in GENTLER.get(o.faults, ()):
        yield dataclasses.replace(o, faults=profile)
    if o.steps > 1:
        yield dataclasses.replace(o, steps=o.steps - 1)


def shrink(
    failing: Result, budget: int = 30, report: Callable[[Result], None] | None = None
) -> Result:
    """The smallest failing run found from ``failing`` within ``budget`` runs."""
    best, runs = failing, 0
    progress = True
    while progress and runs < budget:
        progress = False
        for candidate in smaller(best.options):
            runs += 1
            result = run(candidate)
            if not result.ok:
                best, progress = result, True
                if report is not None:
                    report(result)
                break
            if runs >= budget:
                break
    return best
