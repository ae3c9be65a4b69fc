# Developer entry points; CI (.ci/run) runs
# `make lint test test-embedded test-permits docs dist wheel-check sdist-check matrix`.
# Every test target runs pytest through scripts/pytest.sh: PYTEST_WORKERS pytest-xdist workers
# (default 4), then the tests marked `serial` alone; PYTEST_WORKERS=0 runs one process.
#   make test PYTEST_ARGS="-k fence -x"
#   make test PYTEST_WORKERS=0 PYTEST_ARGS="tests/engine/test_core.py"
#   make test-embedded PYTEST_ARGS="-x"
#   make matrix NOX_ARGS="-R"             # reuse the sessions' venvs
.PHONY: venv test test-embedded test-permits test-unkind test-unkind-ci simulate demo lead-demo lint docs docs-serve matrix dist wheel-check sdist-check clean distclean

PYTHON_VENV := .venv/bin/python
PYTEST := bash scripts/pytest.sh $(PYTHON_VENV)
PYTEST_ARGS ?=
# Branch coverage of dynasem/ in `make test` (printed at its end; `make test COVERAGE=0`: none).
COVERAGE ?= 1
NOX_ARGS ?=

venv:
	bash scripts/venv.sh

# The full suite on the newest (Python, Django) pair, in .venv, with branch coverage.
test: venv
	DYNASEM_TEST_COVERAGE=$(COVERAGE) $(PYTEST) --durations=25 $(PYTEST_ARGS)

# The behaviour tests again, on dynasem.testing's embedded engine (moto, one request at a
# time) instead of DynamoDB Local: the engine users' own test suites get must answer as
# DynamoDB does wherever dynasem depends on it. About 4 minutes on 2 busy cores. Left out:
# the 16-process counter race (800 holds in turn through the one engine thread: about 2
# minutes there, 30 s on DynamoDB Local; the other races run).
EMBEDDED_TESTS := tests/engine/test_core.py tests/background/test_run_once.py tests/engine/test_decorators.py \
	tests/transactions/test_transactions.py tests/engine/test_fair.py tests/engine/test_races.py tests/system/test_faults.py \
	tests/operators/test_commands.py tests/operators/test_admin.py tests/engine/test_permits.py tests/engine/test_reentry.py \
	tests/transactions/test_fenced.py \
	--deselect tests/engine/test_races.py::test_sixteen_processes_count_to_800_without_overlap
test-embedded: venv
	DYNASEM_TEST_ENGINE=embedded $(PYTEST) $(EMBEDDED_TESTS) $(PYTEST_ARGS)

# The race, crash, fault, fairness and /proc tests again with every counting semaphore of
# limit >= 2 in permit items (dynasem._engine.permits; normally above 8 only) and every reader after
# a row's first in a reader item (dynasem._engine.readers; normally after the first two), so that
# their races, crashes and faults run on those layouts too. About 3 minutes.
PERMITS_TESTS := tests/engine/test_races.py tests/system/test_crashes.py tests/system/test_faults.py \
	tests/engine/test_processes.py tests/engine/test_fair.py tests/engine/test_readers.py
test-permits: venv
	DYNASEM_TEST_PERMITS_FROM=1 DYNASEM_TEST_READERS_FROM=0 \
		$(PYTEST) $(PERMITS_TESTS) $(PYTEST_ARGS)

# The whole suite on tests/support/unkind.py's engine in front of DynamoDB Local: reads without
# ConsistentRead answered from lagging replicas, indexes that miss and keep items, throttling
# per partition key and at random, transaction conflicts, answers lost after the write, latency
# tails, as AWS does (DYNASEM_UNKIND_SEED, DYNASEM_UNKIND_PROFILE choose; the seed is printed).
test-unkind: venv
	DYNASEM_TEST_ENGINE=unkind $(PYTEST) $(PYTEST_ARGS)

# What CI runs on that engine: the race, crash (stalled waiters included) and fault tests, and
# a 120 s soak of every kind of hold at AWS's bounds (profile "aws").
UNKIND_CI_TESTS := tests/engine/test_races.py tests/system/test_crashes.py tests/system/test_faults.py
test-unkind-ci: venv
	DYNASEM_TEST_ENGINE=unkind $(PYTEST) $(UNKIND_CI_TESTS) $(PYTEST_ARGS)
	$(PYTHON_VENV) benchmarks/soak.py --seconds 120 --counting 9 --seed 40 --unkind aws

# The deterministic simulation (tests/support/sim, docs/explanation/simulation.md): dynasem's
# own lock code for many processes on simulated hosts, in one thread, on a simulated DynamoDB
# as unkind as AWS; every seed of SEEDS for each workload mix and fault profile. A failing
# seed prints its violation and trace and exits 1; rerun it alone with
# `.venv/bin/python -m tests.support.sim --seeds N --mix M --faults F --trace --shrink`.
#   make simulate SEEDS=1-200 SIM_MIXES=exclusive SIM_ARGS="--hosts 3"
SEEDS ?= 1-4
SIM_MIXES ?= exclusive,counting,readers,pairs,all,renewing,commits,limits,long_readers,shared_pairs,counting_pairs,mixed_pairs,long_pairs,jobs,unique
SIM_FAULTS ?= light,heavy,pauses,crashes,partitions,deaf,reaped
# Then waiters that cannot be pushed (PUSH off): a fair waiter queues while the others poll.
# (With pushes every exclusive waiter queues, so the fair mix ran exclusive's very traces.)
SIM_POLL_MIXES ?= fair
# Then the mixes of counting semaphores again with their holders in permit items (as a limit
# above permit_items.INLINE_MAX keeps them), under the faults that find their bugs.
SIM_PERMIT_MIXES ?= counting,limits,all,counting_pairs
SIM_PERMIT_FAULTS ?= pauses,crashes,reaped
# And with pushes across hosts (each process listening on its host's address, as with PUSH
# set to a private address): hand-overs trusted by an heir whose clock is another host's.
SIM_ACROSS_MIXES ?= exclusive,readers,all,renewing,commits,long_readers,shared_pairs
SIM_ACROSS_FAULTS ?= light,pauses,partitions,reaped
# And a user's Ctrl-C thrown into acquisitions, blocks and releases
# (tests/support/sim/interrupts.py): nothing an interrupted acquisition or block may have
# taken is left to its lease, nor a release's hold kept past it. The mixes that work for leases
# are left out (half the time of all sixteen: 13 s for SEEDS=1-4), and fair (exclusive's
# traces when pushed); `--interrupts 0.2` adds the fault to any profile, `interrupts_heavy`
# puts it beside the network's faults.
SIM_INTERRUPT_MIXES ?= exclusive,counting,readers,pairs,all,commits,limits,shared_pairs,counting_pairs,mixed_pairs,jobs,unique
SIM_INTERRUPT_FAULTS ?= interrupts
# Then the mixes that hold for leases, their answers lost (deaf) and half their acquisitions,
# blocks and releases interrupted: a release interrupted while it waits for a renewal whose
# answer was lost (seed 10 of renewing found the hold renewed and re-entered for nobody; seeds
# 1-4 miss that mutation: tests/simulation/test_interrupts.py replays seed 10).
SIM_LONG_INTERRUPT_MIXES ?= renewing,long_readers,long_pairs
# And coalesced re-runs beside leaders (the coalesce mix, about 0.4 s a seed: twice the other
# mixes' cost) under the faults that find its mutations.
SIM_COALESCE_FAULTS ?= pauses,crashes,heavy
# And an operator's breaks (dynasem_release) beside readers, a writer and a counting pair,
# every reader in an item and the pair in permit items (the breaks mix, about 1 s a seed);
# under heavy too, whose lost answers (a break's, a renewal's, a take's) pauses and crashes lack.
SIM_BREAKS_FAULTS ?= pauses,crashes,heavy
SIM_ARGS ?=
simulate: venv
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix $(SIM_MIXES) --faults $(SIM_FAULTS) \
		--processes 6 --hosts 3 --steps 10 $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix $(SIM_POLL_MIXES) --faults $(SIM_FAULTS) \
		--processes 6 --hosts 3 --steps 10 --no-push $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix $(SIM_PERMIT_MIXES) \
		--faults $(SIM_PERMIT_FAULTS) --processes 6 --hosts 3 --steps 10 --permits-from 1 $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix $(SIM_ACROSS_MIXES) \
		--faults $(SIM_ACROSS_FAULTS) --processes 6 --hosts 3 --steps 10 --push-across $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix $(SIM_INTERRUPT_MIXES) \
		--faults $(SIM_INTERRUPT_FAULTS) --processes 6 --hosts 3 --steps 10 $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix $(SIM_LONG_INTERRUPT_MIXES) \
		--faults deaf --interrupts 0.5 --processes 6 --hosts 3 --steps 10 $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix coalesce \
		--faults $(SIM_COALESCE_FAULTS) --processes 6 --hosts 3 --steps 10 $(SIM_ARGS)
	$(PYTHON_VENV) -m tests.support.sim --seeds $(SEEDS) --mix breaks --faults $(SIM_BREAKS_FAULTS) \
		--processes 6 --hosts 3 --steps 10 --permits-from 1 --readers-from 0 $(SIM_ARGS)

demo: venv
	bash scripts/demo.sh

# Leader election watched: two dynasem_lead processes, one scheduler at a time, a failover.
lead-demo: venv
	$(PYTHON_VENV) scripts/lead_demo.py

lint: venv
	$(PYTHON_VENV) -m ruff check .
	$(PYTHON_VENV) -m ruff format --check .
	$(PYTHON_VENV) -m mypy --strict dynasem

# The documentation site (mkdocs.yml, docs/) into site/; every warning is an error (a broken
# link or anchor, a page outside the nav, a reference that does not resolve).
# tests/project/test_docs.py runs the pages' examples, tests/project/test_docs_site.py opens the site.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PYTHON_VENV) -m mkdocs build --strict

# The site on http://127.0.0.1:8001, rebuilt as pages change.
docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(PYTHON_VENV) -m mkdocs serve --dev-addr 127.0.0.1:8001

# Every other supported (Python, Django) pair, one nox session each (noxfile.py), two at once
# (scripts/matrix.sh; MATRIX_JOBS=1 for one after another).
matrix: venv
	bash scripts/matrix.sh $(PYTHON_VENV) $(NOX_ARGS)

# The sdist and the wheel, in dist/, checked by twine.
dist: venv
	rm -rf dist build
	$(PYTHON_VENV) -m build
	$(PYTHON_VENV) -m twine check --strict dist/*

# After `make dist`: the wheel installed (not editable) in fresh venvs and used, on the newest
# pair (with the otel extra), Django 6.1 on Python 3.12, and the oldest pair (without).
wheel-check: venv
	bash scripts/wheel_check.sh $(PYTHON_VENV) "django" testing,otel
	bash scripts/wheel_check.sh 3.12 "django==6.1.*"
	bash scripts/wheel_check.sh 3.11 "django==4.2.*"

# After `make dist`: the sdist holds the package and the tests, and part of the suite runs
# from it.
sdist-check: venv
	bash scripts/sdist_check.sh

# Build and test artefacts; keeps .venv, .nox and the DynamoDB Local download (see distclean).
clean:
	rm -rf build dist site *.egg-info .pytest_cache .ruff_cache .mypy_cache .coverage .coverage.* htmlcov
	find . \( -path ./.venv -o -path ./.cache -o -path ./.git -o -path ./.nox \) -prune -o \
		-type d -name __pycache__ -exec rm -rf {} +

# Everything clean removes, plus .venv, .nox and .cache (DynamoDB Local is reinstalled on next
# use).
distclean: clean
	rm -rf .venv .nox .cache
