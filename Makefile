# The README's two commands: `make demo` and `make test`. Both depend on `make install`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/prefixroute demo

test: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy src
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
