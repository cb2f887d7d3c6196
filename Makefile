# vitlab: two commands on a fresh machine
#   make demo   installs if needed, trains the main job on the embedded digits set, prints where the results are
#   make test   installs if needed, runs the test suite (`make test PYTEST_ARGS="-m 'not slow'"` for the fast part)
#   make lint   ruff (check and format) and the import-linter contracts of the layering (pyproject.toml)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to the builds these project machines keep on local disk; elsewhere pip fetches the usual
# wheels. Override with e.g. `make install TORCH_SPEC="torch torchvision"`.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
DEMO_CONFIG ?= vitcae/digits

.PHONY: install demo test lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev]"
	# The AttnLRP reference of tests/explain/test_reference.py (lxt 2.1): its rules file only, without its heavy
	# dependencies (transformers, bitsandbytes, open_clip), so not in the dev extra; the test skips where it is missing
	$(BIN)/python -m pip install -q --no-deps "lxt==2.1" || echo "warning: could not install lxt; the AttnLRP cross-check will be skipped"
	touch $(STAMP)

demo: install
	$(BIN)/vitlab fit --config $(DEMO_CONFIG)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
