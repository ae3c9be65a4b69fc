"""Record the branch coverage of dynasem/ that the last ``make test`` measured.

    make test && .venv/bin/python benchmarks/record_coverage.py
    .venv/bin/python benchmarks/record_coverage.py --data /tmp/ci/.coverage \
        --command "make test, .ci/run on a clean clone of COMMIT"

Reads ``.coverage`` (what ``make test`` keeps) and records ``benchmarks/results/coverage.json``
(benchmarks/results.py), which docs/development.md quotes. Run it after a whole ``make
test`` only: a narrowed run (``PYTEST_ARGS``) measures less of the library.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import coverage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import results  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=results.REPO / ".coverage")
    parser.add_argument("--command", default="make test", help="what measured it")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"record_coverage.py: no {args.data}: run `make test` first", file=sys.stderr)
        return 2
    cov = coverage.Coverage(data_file=str(args.data))
    cov.load()
    total = cov.report(file=io.StringIO(), precision=1)
    figures = {"branch": f"{total:.1f}%"}
    results.record("coverage", figures, machine=common.machine(), command=args.command)
    print(f"branch coverage of dynasem/: {figures['branch']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
