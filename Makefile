# The README's two commands: `make demo` and `make test`. Both depend on `make install`.
# `make test-vllm` runs the gateway against real vLLM replicas on the CPU (docs/vllm.md): it
# sets up vLLM in its own venv and builds a tiny model, both cached under .cache/.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .cache/vllm-venv
TINY_MODEL := .cache/tiny-llama

.PHONY: install demo test test-vllm vllm-setup lint typecheck bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/prefixroute demo

test: install
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy src
	$(BIN)/python -m pytest -q

vllm-setup:
	VLLM_VENV=$(VLLM_VENV) scripts/setup_vllm.sh
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py $(TINY_MODEL)

test-vllm: install vllm-setup
	PREFIXROUTE_VLLM_REQUIRED=1 $(BIN)/python -m pytest -q -m vllm tests/vllm -s

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
