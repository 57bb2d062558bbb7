# The README's two commands: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test venv lint typecheck unit e2e tools criu bench clean

$(BIN)/qos-extender: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/qos-extender

lint: venv
	$(BIN)/ruff check extender tests bench e2e
	$(BIN)/ruff format --check extender tests bench e2e

typecheck: venv
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest tests

test: lint typecheck unit

demo: venv
	$(BIN)/qos-extender demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
