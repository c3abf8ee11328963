# promptsched — everything a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test test-fast lint bench chaos clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/promptsched run $(ARGS)

test: install
	$(BIN)/pytest $(PYTEST_ARGS)

test-fast: install
	$(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check promptsched tests bench
	$(BIN)/ruff format --check promptsched tests bench
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) .promptsched .pytest_cache .mypy_cache .ruff_cache
