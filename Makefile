# Developer entry points. `make test` is also what CI runs (.ci/run).
#   make test PYTEST_ARGS="-k fence -x"
.PHONY: venv test demo lint clean distclean

PYTHON_VENV := .venv/bin/python
PYTEST_ARGS ?=

venv:
	bash scripts/venv.sh

test: venv
	$(PYTHON_VENV) -m pytest $(PYTEST_ARGS)

demo: venv
	bash scripts/demo.sh

lint: venv
	$(PYTHON_VENV) -m ruff check .

# Build and test artefacts; keeps .venv and the DynamoDB Local download (see distclean).
clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .coverage htmlcov
	find . \( -path ./.venv -o -path ./.cache -o -path ./.git \) -prune -o \
		-type d -name __pycache__ -exec rm -rf {} +

# Everything clean removes, plus .venv and .cache (DynamoDB Local is reinstalled on next use).
distclean: clean
	rm -rf .venv .cache
