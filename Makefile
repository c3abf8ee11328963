# promptsched — everything a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Two installs: what the service needs (`make run`), then the development tools on top
# (`make test`, `make lint`). compat mode: a plain .pth editable install, without the
# BuildBackendWarning box the default mode prints for this layout.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
PIP_FLAGS := --quiet --progress-bar off --disable-pip-version-check \
             --config-settings editable_mode=compat
# The console's browser tests drive Debian's chromium + chromedriver (tests/browser_support.py).
CHROMIUM     ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
SUDO         := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# `make test` installs them first where apt-get exists; elsewhere those tests fail saying what
# to install (or leave them out with PYTEST_ARGS='-m "not browser"').
BROWSER_DEPS := $(if $(shell command -v apt-get 2>/dev/null),browser-deps)
# The connection-pooler tests run a real PgBouncer in transaction mode (tests/test_pgbouncer.py);
# `make test` installs Debian's where apt-get exists, elsewhere set PROMPTSCHED_PGBOUNCER.
PGBOUNCER      ?= /usr/sbin/pgbouncer
PGBOUNCER_DEPS := $(if $(shell command -v apt-get 2>/dev/null),pgbouncer-deps)
# The alert rules' unit tests run promtool, and one test scrapes real replicas with a real
# Prometheus (tests/test_alerts.py, tests/test_prometheus.py): `make test` installs Debian's
# prometheus package where apt-get exists, elsewhere set PROMPTSCHED_PROMTOOL and
# PROMPTSCHED_PROMETHEUS.
PROMETHEUS      ?= /usr/bin/prometheus
PROMETHEUS_DEPS := $(if $(shell command -v apt-get 2>/dev/null),prometheus-deps)
# The provider-weather tests run a real LiteLLM proxy (tests/litellm_support.py), pinned, in a
# virtual environment of its own next to .venv: its dependencies never meet ours.
LITELLM_VENV    ?= .venv-litellm
LITELLM_VERSION ?= 1.80.0
LITELLM_STAMP   := $(LITELLM_VENV)/.installed-$(LITELLM_VERSION)
# Test processes (pytest-xdist): most tests wait on real services, leases and signals rather
# than on the CPU, so three share two cores well. PYTEST_WORKERS=0 runs in one process. Work
# stealing: a process that ran out of tests takes some of another's, so the minute-long tests
# (a proxy's per-minute window, a real Prometheus) do not leave the other two idle at the end.
PYTEST_WORKERS ?= 3
PYTEST_DIST    ?= $(if $(filter 0,$(PYTEST_WORKERS)),no,worksteal)

.PHONY: lock image litellm install install-run run measure-first-run test test-fast lint bench chaos clean browser-deps pgbouncer-deps prometheus-deps

install: $(DEV_STAMP)

install-run: $(RUN_STAMP)

$(BIN)/python:
	@echo "make: creating the virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml requirements.lock | $(BIN)/python
	@echo "make: installing promptsched and what the service needs into $(VENV)" \
	      "(the first time only: from half a minute to two, mostly pip; docs/performance.md)"
	$(BIN)/pip install $(PIP_FLAGS) -c requirements.lock -e .
	@touch $@

$(DEV_STAMP): $(RUN_STAMP)
	@echo "make: installing the development tools (pytest, ruff, mypy, schemathesis, ...)"
	$(BIN)/pip install $(PIP_FLAGS) -c requirements.lock -e '.[dev]'
	@touch $@

run: install-run
	$(BIN)/promptsched run $(ARGS)

$(LITELLM_STAMP):
	@echo "make: installing the LiteLLM proxy $(LITELLM_VERSION) into $(LITELLM_VENV) (the first time only)"
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet --progress-bar off --disable-pip-version-check \
	    'litellm[proxy]==$(LITELLM_VERSION)'
	@touch $@

litellm: $(LITELLM_STAMP)

test: install litellm $(BROWSER_DEPS) $(PGBOUNCER_DEPS) $(PROMETHEUS_DEPS)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) $(PYTEST_ARGS)

browser-deps:
	@if [ -x $(CHROMIUM) ] && [ -x $(CHROMEDRIVER) ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "browser-deps: no apt-get here: install Chromium and chromedriver and set" \
	       "PROMPTSCHED_CHROMIUM / PROMPTSCHED_CHROMEDRIVER (docs/console.md)" >&2; exit 1; \
	fi; \
	echo "installing chromium and chromium-driver for the console's browser tests"; \
	$(SUDO) apt-get update -q && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

pgbouncer-deps:
	@if [ -x $(PGBOUNCER) ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "pgbouncer-deps: no apt-get here: install PgBouncer and set PROMPTSCHED_PGBOUNCER" \
	       "(docs/deploying.md)" >&2; exit 1; \
	fi; \
	echo "installing pgbouncer for the connection-pooler tests"; \
	$(SUDO) apt-get update -q && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer

prometheus-deps:
	@if [ -x $(PROMETHEUS) ] && [ -x /usr/bin/promtool ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "prometheus-deps: no apt-get here: install Prometheus and promtool and set" \
	       "PROMPTSCHED_PROMETHEUS / PROMPTSCHED_PROMTOOL (docs/observability.md)" >&2; exit 1; \
	fi; \
	echo "installing prometheus (and promtool) for the alert and scrape tests"; \
	$(SUDO) apt-get update -q && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	  prometheus

test-fast: install
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check promptsched tests bench
	$(BIN)/ruff format --check promptsched tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

bench: install
	$(BIN)/python -m bench $(ARGS)

# Fresh clone -> `make run` listening -> first succeeded run, with a warm and a cold pip cache.
measure-first-run:
	bench/first_run.sh $(ARGS)

# A few minutes of faults against three replicas, then the invariant table (tests/chaos).
# Size with CHAOS_SECONDS, CHAOS_SCHEDULES, CHAOS_PROCESSES; replay a failure with CHAOS_SEED.
chaos: install
	$(BIN)/python -m tests.chaos

# requirements.lock: the exact versions of what the service needs, from a fresh install of
# pyproject.toml's dependencies in a throwaway virtualenv (docs/deploying.md, "Reproducible builds").
lock:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/pip" install --quiet --progress-bar off --disable-pip-version-check . && \
	{ sed -n '/^#/p' requirements.lock; "$$tmp/venv/bin/pip" freeze --exclude promptsched; } \
	  > "$$tmp/requirements.lock" && mv "$$tmp/requirements.lock" requirements.lock
	@echo "make: requirements.lock written; review 'git diff requirements.lock' and commit it"

# The container image (deploy/Dockerfile) with podman or docker, whichever is installed;
# IMAGE_BUILD_FLAGS passes more to the build (e.g. --network host). podman builds in docker
# format: the OCI format has no HEALTHCHECK.
IMAGE ?= promptsched:$(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])" 2>/dev/null || echo latest)
CONTAINER_RUNTIME ?= $(firstword $(foreach c,podman docker,$(if $(shell command -v $(c) 2>/dev/null),$(c))))
image:
	@if [ -z "$(CONTAINER_RUNTIME)" ]; then \
	  echo "make image: neither podman nor docker is installed (set CONTAINER_RUNTIME)" >&2; exit 1; fi
	$(CONTAINER_RUNTIME) build $(if $(findstring podman,$(CONTAINER_RUNTIME)),--format docker) \
	  $(IMAGE_BUILD_FLAGS) -f deploy/Dockerfile \
	  --build-arg PROMPTSCHED_COMMIT=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) \
	  -t $(IMAGE) .

clean:
	rm -rf $(VENV) $(LITELLM_VENV) .promptsched .pytest_cache .mypy_cache .ruff_cache
