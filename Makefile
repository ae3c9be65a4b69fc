# Developer entry points. `make test` is also what CI runs (.ci/run).
#   make test PYTEST_ARGS="-k fence -x"
#   make matrix NOX_ARGS="-R"             # reuse the sessions' venvs
.PHONY: venv test demo lint matrix clean distclean

PYTHON_VENV := .venv/bin/python
PYTEST_ARGS ?=
NOX_ARGS ?=

venv:
	bash scripts/venv.sh

# The full suite on the newest (Python, Django) pair, in .venv.
test: venv
	$(PYTHON_VENV) -m pytest $(PYTEST_ARGS)

demo: venv
	bash scripts/demo.sh

lint: venv
	$(PYTHON_VENV) -m ruff check .
	$(PYTHON_VENV) -m ruff format --check .
	$(PYTHON_VENV) -m mypy --strict dynasem

# Every other supported (Python, Django) pair, one nox session each (noxfile.py).
matrix: venv
	$(PYTHON_VENV) -m nox -t ci $(NOX_ARGS)

# Build and test artefacts; keeps .venv, .nox and the DynamoDB Local download (see distclean).
clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .coverage htmlcov
	find . \( -path ./.venv -o -path ./.cache -o -path ./.git -o -path ./.nox \) -prune -o \
		-type d -name __pycache__ -exec rm -rf {} +

# Everything clean removes, plus .venv, .nox and .cache (DynamoDB Local is reinstalled on next
# use).
distclean: clean
	rm -rf .venv .nox .cache
