# schedlock — the documented entry points.  `make help` lists them.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing schedlock with its dev dependencies (first time: about a minute)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' --config-settings editable_mode=strict \
		>$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@rm -f $(VENV)/.installed-* && touch $@

.PHONY: venv
venv: $(STAMP) ## create .venv with schedlock (editable) and the dev tools
	@# strict editable installs link files one by one: relink so new modules are importable
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . \
		--config-settings editable_mode=strict >$(VENV)/relink.log 2>&1 || { cat $(VENV)/relink.log; exit 1; }

.PHONY: demo
demo: venv ## the main job: embedded PostgreSQL, an app, 3 sidecars, a kill and a hand-over, a summary
	@$(PY) -m hack.demo

.PHONY: bench
bench: venv ## benchmark vs River, procrastinate, the seed's tick and a Kubernetes Lease elector, and in a cluster: bench/results/, docs/performance.md
	@bash hack/tools.sh ensure kube-apiserver etcd kubectl helm node images river-bench
	@$(PY) -m bench run

.PHONY: bench-quick
bench-quick: venv ## the same scenarios with fewer trials: bench/results/
	@bash hack/tools.sh ensure kube-apiserver etcd kubectl helm node images river-bench
	@$(PY) -m bench run --quick

SOAK_DURATION ?= 3600
SOAK_ARGS ?=

.PHONY: soak
soak: venv ## soak: PostgreSQL, 3 sidecars, the operator (if built), kills, for SOAK_DURATION s (default 3600); plot and figures in bench/results/soak/
	@$(PY) -m bench.soak --duration $(SOAK_DURATION) $(SOAK_ARGS)

CHAOS_DURATION ?= 600
CHAOS_SEED ?=

.PHONY: chaos
chaos: venv tools ## chaos run (CHAOS_DURATION s, default 600; CHAOS_SEED=N replays); verdict in chaos-verdict.json
	@$(PY) -m chaos --duration $(CHAOS_DURATION) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED),)

.PHONY: tools
tools: ## build/install the pinned Kubernetes binaries, etcd, helm, CoreDNS, containerd, buildah… (cached)
	@echo "==> ensuring pinned test tools (first time builds Kubernetes, etcd, helm, CoreDNS from Go modules)"
	@bash hack/tools.sh ensure

.PHONY: lint
lint: venv ## ruff, mypy --strict, import contracts, yamllint, hadolint, helm lint, generated chart schema/docs, promtool
	@echo "==> ruff"
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@echo "==> mypy --strict"
	@$(VENV)/bin/mypy -p schedlock
	@$(VENV)/bin/mypy --strict --explicit-package-bases bench monitoring chaos
	@$(VENV)/bin/mypy --strict --explicit-package-bases tests testbed
	@echo "==> import-linter"
	@$(VENV)/bin/lint-imports --no-cache
	@echo "==> yamllint"
	@$(VENV)/bin/yamllint -s .
	@echo "==> hadolint"
	@$(VENV)/bin/hadolint Dockerfile
	@echo "==> helm lint"
	@bash hack/tools.sh ensure helm
	@"$$(bash hack/tools.sh bindir helm)/helm" lint --strict charts/schedlock
	@echo "==> helm lint of every charts/schedlock/ci/*.yaml"
	@for f in charts/schedlock/ci/*.yaml; do "$$(bash hack/tools.sh bindir helm)/helm" lint --strict charts/schedlock -f "$$f" >/dev/null || { echo "helm lint failed with $$f"; exit 1; }; done
	@echo "==> values.schema.json and the values table of docs/install.md are generated from values.yaml"
	@bash hack/gen-chart-docs.sh --check
	@echo "==> generated manifests and monitoring are current (CRD, RBAC rules, alerts, dashboard)"
	@$(PY) hack/gen-manifests.py --check >/dev/null
	@$(PY) -m monitoring.generate --check >/dev/null
	@echo "==> the Grafana dashboard and alert rules fit Grafana's typed models (grafana-foundation-sdk)"
	@$(PY) -m monitoring.grafana_schema
	@echo "==> checkov on the rendered chart (skip-list: charts/schedlock/.checkov.yaml)"
	@bash hack/tools.sh ensure checkov
	@out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && \
		for f in charts/schedlock/ci/*.yaml; do "$$(bash hack/tools.sh bindir helm)/helm" template schedlock charts/schedlock -n schedlock-system -f "$$f" >"$$out/$$(basename "$$f")"; done && \
		"$$(bash hack/tools.sh bindir checkov)/checkov" --quiet --compact --config-file charts/schedlock/.checkov.yaml -d "$$out" >"$$out/checkov.txt" || { cat "$$out/checkov.txt"; exit 1; }
	@echo "==> promtool check metrics (live /metrics of a throwaway sidecar)"
	@bash hack/tools.sh ensure promtool
	@VENV=$(VENV) bash hack/check-metrics.sh

.PHONY: generate
generate: venv ## regenerate what is generated from sources: CRD, RBAC rules, alerts, dashboard, values schema and table
	@$(PY) hack/gen-manifests.py
	@$(PY) -m monitoring.generate
	@bash hack/gen-chart-docs.sh

.PHONY: fmt
fmt: venv ## format and autofix
	@$(VENV)/bin/ruff format .
	@$(VENV)/bin/ruff check --fix .

# The unit tier's per-test limit: its slowest test takes about 4 s on a loaded machine (the
# hypothesis ones); a test that hangs fails here in seconds instead of at the suite's 300 s.
UNIT_TIMEOUT ?= 10
UNIT_TESTS := $(VENV)/bin/pytest -m unit -q --timeout=$(UNIT_TIMEOUT)

.PHONY: test-unit
test-unit: venv ## fast pure-logic tests, nothing running (UNIT_TIMEOUT s per test, default 10)
	@$(UNIT_TESTS) $(PYTEST_ARGS)

.PHONY: test
test: venv ## lint and the unit tier first (minutes, stops at the first failure), then tools and the rest of the suite
	@# Fail fast: lint, then the unit tier stopping at its first failure, before the tools and
	@# the slow tiers; the last stage deselects `unit`, so no test runs twice.
	@$(MAKE) --no-print-directory lint
	@echo "==> pytest, stage 1 of 2: the unit tier (stops at the first failure, $(UNIT_TIMEOUT) s per test)"
	@$(UNIT_TESTS) -x $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory tools
	@echo "==> pytest, stage 2 of 2: integration, e2e and cluster against real PostgreSQL, PgBouncer, kube-apiserver, a node, helm, Prometheus"
	@CHECKOV="$$(bash hack/tools.sh bindir checkov)/checkov" $(VENV)/bin/pytest -q -m 'not unit' $(PYTEST_ARGS)

.PHONY: images
images: tools ## build the images (schedlock from the Dockerfile, the demo app) into the cache
	@bash hack/images.sh ensure

.PHONY: dev-up
dev-up: venv tools ## a one-node cluster with the chart installed and a demo app, in the background
	@$(PY) -m testbed.devstack up

.PHONY: dev-down
dev-down: ## stop the local stack
	@test -x $(PY) && $(PY) -m testbed.devstack down || true

.PHONY: clean
clean: ## remove build outputs and caches (keeps .venv and the tool cache)
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
