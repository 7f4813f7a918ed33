# spark-reconciler developer entry points. On a fresh Debian machine use ./make.sh TARGET,
# which installs make and python3-venv first.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPEC := specs/deployment.yaml

.PHONY: setup demo test lint typecheck unit schema clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The main job at this stage: validate the reference spec, then plan a full two-Spark
# bring-up offline from fixture facts, then show that a converged snapshot plans nothing.
demo: setup
	$(BIN)/reconciler validate --spec $(SPEC)
	@echo
	@echo "== plan for two fresh Sparks (tests/fixtures/facts/empty.json)"
	$(BIN)/reconciler plan --spec $(SPEC) --facts tests/fixtures/facts/empty.json
	@echo "== plan for a converged pair (tests/fixtures/facts/converged.json)"
	$(BIN)/reconciler plan --spec $(SPEC) --facts tests/fixtures/facts/converged.json --detailed-exitcode

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

schema: setup
	$(BIN)/reconciler schema

unit: setup
	$(BIN)/pytest

# The README's test command; .ci/run calls exactly this.
test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
