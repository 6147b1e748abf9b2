# Every target does its own setup; re-running is quick when nothing changed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp
export CDK_DISABLE_VERSION_CHECK := true
export CDK_DISABLE_CLI_TELEMETRY := true
# The Node that package.json pins (the npm package `node`, installed by `npm ci`) runs the CDK CLI
# and jsii for every target: the machine's own node only runs npm.
export PATH := $(CURDIR)/node_modules/.bin:$(PATH)
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/torchinductor
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions

.PHONY: setup demo demo-compare test test-services test-fast test-stress lint bench synth clean localstack

setup: $(STAMP) $(NODE_STAMP)

$(STAMP): requirements.txt lambda_writer/requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: setup
	$(BIN)/ckpt-pipeline demo

demo-compare: setup
	$(BIN)/ckpt-pipeline demo --compare

# The services the suite needs beyond the venv: PgBouncer (RDS Proxy's stand-in) and LocalStack's
# SQS. Off CI a missing one is said once and its tests skip; in CI (CI=true) it fails the run.
test-services:
	bash .ci/setup-pgbouncer.sh
	bash .ci/setup-faults.sh
	bash .ci/setup-localstack.sh || { [ -z "$$CI" ] && echo "make test: LocalStack's SQS unavailable; its tests will skip"; }
	bash .ci/setup-arm64.sh || { [ -z "$$CI" ] && echo "make test: no Debian arm64 root (qemu); tests/infra/test_arm64_bundle.py will skip"; }
	ROOT_ARCH=amd64 bash .ci/setup-arm64.sh || { [ -z "$$CI" ] && echo "make test: no native python3.14 root; tests/bench/test_cold_start.py will skip"; }

# The suite on parallel workers (pytest-xdist): most tests wait on processes, sockets and
# PostgreSQL, so 3 workers overlap that waiting on 2 cores. Tests that must not overlap run in
# xdist groups (tests/conftest.py); LocalStack is one per run (tests/run_wide.py).
# PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadgroup

test: setup test-services
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

test-fast: setup
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow"

# The tests that start processes (torch ranks over gloo, SIGKILLed children, moto's and
# LocalStack's servers, whole local pipelines) with stress-ng keeping both cores, the disk and
# memory busy (.ci/stress.sh): a race that only a loaded CI machine exposes fails here. Run it
# until it is green several times in a row after changing a wait; STRESS_TESTS narrows it.
STRESS_TESTS ?= tests/integrations tests/e2e tests/trainer_client tests/ckpt_pipeline/demo \
	tests/ckpt_pipeline/local tests/ckpt_pipeline/test_spool_send.py \
	tests/ckpt_pipeline/test_poll_breaker.py tests/ckpt_pipeline/test_status_outage.py \
	tests/lambda_writer/test_concurrency.py tests/lambda_writer/test_interleavings.py \
	tests/packaging
test-stress: setup test-services
	bash .ci/stress.sh $(BIN)/python -m pytest $(PYTEST_PARALLEL) $(STRESS_TESTS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m bench

# LocalStack's SQS in its own Python 3.13 venv under /var/cache/ckpt-pipeline (idempotent).
localstack:
	bash .ci/setup-localstack.sh

synth: setup
	npx cdk synth --no-notices -q

clean:
	rm -rf $(VENV) node_modules cdk.out .cache .pytest_cache .mypy_cache .ruff_cache
