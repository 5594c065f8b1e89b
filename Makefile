# Two commands set up everything on a fresh machine: `make run` and `make test`.
# Each creates .venv if missing, installs mocolab (editable) and makes Fashion-MNIST available; `make test`
# adds the test tools, the cluster extra, PostgreSQL and Chromium, which `make run` does not use. On a
# set-up machine that costs seconds.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mocolab-installed
TEST_STAMP := $(VENV)/.mocolab-test-installed
MOCOLAB_DATA ?= $(HOME)/.cache/mocolab
FMNIST_SYSTEM := /usr/share/datasets/fashion-mnist
PYTEST_ARGS ?=
# apt-get one at a time (dpkg and apt's lists take a lock each, and a second apt-get fails on it): the
# set-up's steps run side by side (SETUP, below)
APT_GET := $(if $(shell command -v flock),flock /tmp/.mocolab-apt.lock )apt-get

.PHONY: setup setup-test data postgres chromium peers run repro lint test test-fast test-avx2 test-durations test-cluster test-deploy train mutate screenshots clean

# What `make run` needs: mocolab and its dependencies, Fashion-MNIST.
setup: $(STAMP) data

# What the tests need besides: the test tools and the cluster extra (psycopg2, MLflow's auth), PostgreSQL.
setup-test: setup $(TEST_STAMP) postgres

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	@touch $@

$(TEST_STAMP): $(STAMP) pyproject.toml examples/plugins/mocolab-byol/pyproject.toml
	$(PY) -m pip install -q -e '.[dev,cluster]'
	$(PY) -m pip install -q -e examples/plugins/mocolab-byol  # a method plugin: tests/method/test_plugins.py
	@touch $@

# Fashion-MNIST: the Debian package where apt-get works and we are root,
# else torchvision's download into $(MOCOLAB_DATA).
data: $(STAMP)
	@if [ -f $(FMNIST_SYSTEM)/train-images-idx3-ubyte.gz ] || \
	    [ -f $(MOCOLAB_DATA)/train-images-idx3-ubyte.gz ] || \
	    [ -f $(MOCOLAB_DATA)/FashionMNIST/raw/train-images-idx3-ubyte ]; then \
	  echo "Fashion-MNIST: present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "Fashion-MNIST: apt-get install dataset-fashion-mnist"; \
	  ($(APT_GET) install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	   ($(APT_GET) update -qq && $(APT_GET) install -y -qq dataset-fashion-mnist)) ; \
	else \
	  echo "Fashion-MNIST: downloading into $(MOCOLAB_DATA)"; \
	  $(PY) -c "import torchvision; torchvision.datasets.FashionMNIST('$(MOCOLAB_DATA)', download=True)"; \
	fi

# PostgreSQL server binaries for `mocolab cluster` (MLflow's store) and its tests: Debian's package
# where apt-get works and we are root; else the cluster falls back to sqlite and those tests skip.
postgres:
	@if ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null 2>&1; then \
	  echo "PostgreSQL: present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "PostgreSQL: apt-get install postgresql"; \
	  ($(APT_GET) install -y -qq postgresql >/dev/null 2>&1 || \
	   ($(APT_GET) update -qq && $(APT_GET) install -y -qq postgresql >/dev/null) || \
	   echo "PostgreSQL: apt-get failed (mocolab cluster uses sqlite; its PostgreSQL tests skip)"); \
	else \
	  echo "PostgreSQL: not installed (mocolab cluster uses sqlite; its PostgreSQL tests skip)"; \
	fi

# Chromium for the browser tests (tests/tracking/test_mlflow_ui.py drives it headless with Playwright; the report
# test renders with it): Debian's package where apt-get works and we are root; else those tests skip.
# `make test` needs it, `make run` does not.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
	  echo "Chromium: present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "Chromium: apt-get install chromium"; \
	  ($(APT_GET) install -y -qq chromium >/dev/null 2>&1 || \
	   ($(APT_GET) update -qq && $(APT_GET) install -y -qq chromium >/dev/null) || \
	   echo "Chromium: apt-get failed (the MLflow UI test skips)"); \
	else \
	  echo "Chromium: not installed (the MLflow UI test skips)"; \
	fi

# lightly beside the venv (not in it: it is a peer measured against, not a dependency), for README's peer
# benchmark and its test; PyPI is needed once.
LIGHTLY := /tmp/lightly-pkgs
peers: $(STAMP)
	@if [ -d $(LIGHTLY)/lightly ]; then echo "lightly: present"; else \
	  echo "lightly: pip install --target $(LIGHTLY)"; \
	  $(PY) -m pip install -q --no-deps --target $(LIGHTLY) lightly lightning-utilities >/dev/null 2>&1 || \
	  echo "lightly: pip install failed (the peer benchmark's test skips)"; \
	fi

# The main job: the momentum ablation on the cpu-quick preset, local Ray, local MLflow store.
RUN_ARGS ?=
run: setup
	$(PY) experiments/momentum_ablation.py --preset cpu-quick --momenta 0,0.9,0.99,0.999 $(RUN_ARGS)

# The reproduction (docs/REPRODUCTION.md): runs or resumes every study of mocolab/repro/plan.py (hours on two
# cores; stop it any time, the same command continues), exports results/*.csv and regenerates the document.
REPRO_ARGS ?=
repro: setup
	$(VENV)/bin/mocolab repro $(REPRO_ARGS)

# The suite runs on one pytest-xdist worker per core and one more (TEST_WORKERS=1: one process): its long
# tests wait in part (servers coming up, a killed worker's restart), and the extra worker fills those waits
# (on two cores: 94-95 % busy against 87-88 %, 21m14s-21m56s of tests against 22m58s-23m51s on fresh clones:
# benchmarks/RESULTS.md).
# make test-fast stays at one per core: its short tests do not wait, and a third worker's imports cost
# more than it fills (50.8 s against 43.7 s).
# The Ray clusters of several nodes (tests marked cluster) are make test-cluster's, which make test-deploy runs
# first: each holds several GiB and runs alone, on Ray's default ports where README's blocks use them.
CORES := $(shell nproc 2>/dev/null || echo 1)
TEST_WORKERS ?= $(shell echo $$(( $(CORES) + 1 )))
FAST_WORKERS ?= $(CORES)
XDIST = -n $(TEST_WORKERS) --dist loadgroup
XDIST_FAST = -n $(FAST_WORKERS) --dist loadgroup

# What the suite needs, its independent steps side by side: on a fresh machine apt-get installs Chromium (and
# PostgreSQL, Fashion-MNIST where missing) while pip installs mocolab, which alone keeps one core busy.
# ($(MAKE) written out in each recipe: make -n runs such a line, so a dry run shows the set-up's commands too)
SETUP = --no-print-directory -j2 --output-sync=target

# The linter ([tool.ruff] in pyproject.toml: unused imports, undefined names, lines <= 120), first in make test
# and make test-fast: a second, not a minute into the suite.
lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check

test:
	@$(MAKE) $(SETUP) setup-test chromium peers
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest $(XDIST) -m "not cluster" $(PYTEST_ARGS)

# The deployment's clusters run for real (tests/cluster): `mocolab cluster up` with PostgreSQL under `mlflow
# server` and README's block as written, a node lost mid-run, `ray start` nodes whose Python has no mocolab
# and docs' cluster quickstart. One test at a time (each holds several GiB); the blocks that use Ray's default
# ports run in a network namespace of their own where one can be made. About 6 min on two cores.
test-cluster:
	@$(MAKE) $(SETUP) setup-test
	$(PY) -m pytest -n 0 -m cluster $(PYTEST_ARGS)

# The contributors' inner loop: everything but the tests marked slow (minutes of training, sweeps, servers).
# It keeps pytest's rewritten test modules (gitignored __pycache__) even where PYTHONDONTWRITEBYTECODE is set:
# rewriting every test module's asserts again costs each worker 2 to 3 s of every run (58 s against 63 s).
test-fast:
	@$(MAKE) $(SETUP) setup-test chromium
	@$(MAKE) --no-print-directory lint
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest $(XDIST_FAST) -m "not slow" $(PYTEST_ARGS)

# The suite as an AVX2-only machine runs it: torch's, oneDNN's and MKL's vector code capped at AVX2 (no
# AVX-512, no BF16), so run.precision=auto resolves to fp32 there too. It imitates the instruction set, not
# the slower cores of such a machine: the suite is bound by interpreter starts, which the cap leaves alone.
test-avx2:
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 $(MAKE) test

# Refresh tests/durations.json, which orders the suite longest first (commit it with the tests it times).
# One worker per core, as make test-fast runs: a test measured over 1.5 s there is slow (tests/conftest.py).
test-durations:
	@$(MAKE) $(SETUP) setup-test chromium peers
	$(PY) -m pytest $(XDIST_FAST) --write-durations tests/durations.json $(PYTEST_ARGS)

# The deployment run for real: the clusters first (make test-cluster, all of it: PYTEST_ARGS are the container
# test's), then the container path (tests/deploy/deploy_stack.py, docker/README.md): podman, runc and debootstrap
# from Debian where apt-get works and we are root (podman-compose comes with the dev extra); a stand-in for
# the Ray image built once from Debian's packages (no image registry needed); docker/Dockerfile built on it;
# docker/compose.yaml up with a study submitted, the worker holding its trial killed, `down` and `up` again.
# 6 to 12 min on two cores the first time (docker/README.md), less after (the stand-in base is cached in podman).
# DEPLOY_NICE: it yields the CPU and the disk to anything else running (empty: full speed).
DEPLOY_NICE ?= nice -n 19 ionice -c3
test-deploy: setup-test
	@$(MAKE) --no-print-directory test-cluster PYTEST_ARGS=
	@if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then \
	  echo "podman, runc, debootstrap: present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "podman, runc, debootstrap: apt-get install"; \
	  ($(DEPLOY_NICE) apt-get install -y -qq podman runc debootstrap >/dev/null 2>&1 || \
	   ($(DEPLOY_NICE) apt-get update -qq && $(DEPLOY_NICE) apt-get install -y -qq podman runc debootstrap >/dev/null) || \
	   echo "podman: apt-get failed (the deploy test fails under CI, skips elsewhere)"); \
	else \
	  echo "podman: not installed (the deploy test fails under CI, skips elsewhere)"; \
	fi
	CONTAINERS_CONF=$(CURDIR)/docker/standin/containers.conf $(DEPLOY_NICE) \
	  $(PY) -m pytest -n 0 -s tests/deploy/deploy_stack.py $(PYTEST_ARGS)

# Mutation testing (tests/mutate.py, docs/contributing.md): mutmut over the verdict rules, the code fingerprint, the
# named backbones and method/, each against its own area's fast tests, in scratch copies (never these files).
# Not part of make test: minutes to an hour a target on two cores (benchmarks/RESULTS.md). MUTATE_TARGETS: some of
# verdicts code_fingerprint named method (method: its four targets, method-moco method-queue method-bn
# method-plugins);
# MUTATE_ARGS: more of tests/mutate.py's flags (-k EXPR: a subset of the targets' tests).
# MUTATE_CACHE: where each target's copy and mutmut's results stay between runs (gitignored): a later make mutate
# re-tests only the functions changed since, the tests added, and the earlier survivors (empty: a fresh copy each run).
MUTATE_TARGETS ?=
MUTATE_ARGS ?=
MUTATE_NICE ?=
MUTATE_CACHE ?= .mutate
mutate: $(TEST_STAMP)
	$(MUTATE_NICE) $(PY) tests/mutate.py $(if $(MUTATE_CACHE),--cache $(MUTATE_CACHE)) $(MUTATE_TARGETS) $(MUTATE_ARGS)

# The pictures docs/tracking.md opens with, from a tiny momentum study (the MLflow UI test's, minutes): the view a
# study's link opens (tests/artifacts/mlflow-view.png) and the report's feature maps, as PNGs under 300 KB each.
screenshots: $(TEST_STAMP) chromium
	$(PY) -m pytest -p no:randomly -n 0 tests/tracking/test_mlflow_ui.py -k printed_view $(PYTEST_ARGS)
	@mkdir -p docs/images
	$(PY) -c "import sys; from PIL import Image; [Image.open(f'tests/artifacts/{n}').convert('RGB')\
	  .quantize(96).save(f'docs/images/{n}', optimize=True) for n in sys.argv[1:]]" mlflow-view.png feature-maps.png
	@ls -l docs/images/mlflow-view.png docs/images/feature-maps.png

clean:
	rm -rf runs mlruns mlflow.db .pytest_cache
