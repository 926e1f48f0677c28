# Two commands on a fresh machine: `make serve` (the Serve app on the laptop default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SGLANG_STAMP := $(VENV)/.sglang-installed

.PHONY: serve test test-fast typecheck test-sglang-cpu lint prometheus sim-reproduce sim-frontier sim-overload bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# The sglang plugin's CPU test environment: torch from this machine's local disk, sglang without its
# CUDA dependencies, and exactly the pure-Python packages its scheduler modules import.
# Then what it needs to serve on CPU (tests start real sglang with a tiny model: harness/, tests/sglang_cpu/).
$(SGLANG_STAMP): $(STAMP) requirements/sglang-cpu.txt requirements/sglang-serve-cpu.txt
	$(BIN)/python -m pip install -q torch==2.14.1
	$(BIN)/python -m pip install -q --no-deps sglang==0.5.23
	$(BIN)/python -m pip install -q -r requirements/sglang-cpu.txt
	$(BIN)/python -m pip install -q -r requirements/sglang-serve-cpu.txt
	$(BIN)/python -m pip install -q --no-deps xgrammar==0.2.7
	touch $@

serve: $(STAMP)
	$(BIN)/serve run config.yaml

test: $(SGLANG_STAMP) prometheus
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

# Debian's `prometheus` package (prometheus and promtool) for the observability tests (tests/test_alert_rules.py,
# tests/serve/test_prometheus.py), installed where this can (as root on Debian); elsewhere those tests are
# skipped and say how to install it.
prometheus:
	@command -v promtool >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || { \
		apt-get update -q >/dev/null 2>&1 && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }; }; } \
		|| echo "prometheus is not installed: its tests will be skipped (apt-get install prometheus)"

# The quick loop for policy, simulator, plugin and routing changes: no servers, no Ray, no sglang processes.
# Policy core and simulator (tests/test_*.py), the plugin on sglang's classes (tests/sglang), routing.
FAST_TESTS := tests/test_*.py tests/sglang tests/serve/test_routing.py tests/serve/test_placement.py tests/serve/test_lane_router.py
test-fast: $(SGLANG_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow and not gpu" --hypothesis-profile=fast $(FAST_TESTS)

# mypy as pyproject's [tool.mypy] sets it: strict on scheduler/ and serve_app/, the sglang plugin checked against
# sglang's own classes (installed by the sglang stamp). A first run reads sglang's source: minutes; then cached.
typecheck: $(SGLANG_STAMP)
	$(BIN)/mypy

# Only the tests that run real sglang on CPU (server and in-process engine with the tiny model).
test-sglang-cpu: $(SGLANG_STAMP)
	$(BIN)/python -m pytest -q -m sglang_cpu

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

sim-reproduce: $(STAMP)
	$(BIN)/python -m scheduler.sim reproduce

# Plots go to out/ (ignored), never the repository root.
sim-frontier: $(STAMP)
	mkdir -p out
	$(BIN)/python -m scheduler.sim frontier --plot out/frontier.png

sim-overload: $(STAMP)
	mkdir -p out
	$(BIN)/python -m benchmarks.overload --plot out/overload.png

bench: $(SGLANG_STAMP)
	$(BIN)/python -m benchmarks.policy_decision_time

clean:
	rm -rf $(VENV)
