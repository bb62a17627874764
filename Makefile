# Tandem — developer entry points. Every target runs from the project root and, after `setup`,
# sources .tandem/env.sh (written by scripts/setup.sh).
#
#   make setup    venv + dependencies (uv when it can be had), Java 17 check, PostgreSQL, Airflow home, .tandem/env.sh,
#                 dist/tandem.zip; prints which database Tandem uses (TANDEM_DATABASE_URL picks another)
#   make up       setup + dist + start the local Airflow stack (UI http://127.0.0.1:8080)
#   make down     stop the local Airflow stack
#   make status   show the stack's processes and health
#   make dist     build dist/tandem.zip when missing or stale (the tandem package, for spark-submit --py-files)
#   make test     setup + test-tools + dist + docs-check + pytest (two xdist workers by default; PYTEST_ARGS overrides)
#   make test-tools  Debian packages the tests drive: chromium, iproute2, util-linux, prometheus, alertmanager (apt-get)
#   make docs     serve the documentation site at http://127.0.0.1:8000 (mkdocs serve; docs/, mkdocs.yml)
#   make docs-check  build the site with `mkdocs build --strict` into a temporary folder (links, generated reference)
#   make demo     setup + `tandem demo`: the bundled plans side by side; trades is left running under supervision
#   make demo-stop   stop what the demo left running (`tandem demo --stop`)
#   make clean    remove .tandem/data and dist (keeps .venv, PostgreSQL and Airflow state)
#   make lint     syntax checks of the shell scripts and Python sources
#   make bench-flink  the benchmarks' peer: Apache Flink in its own venv, .tandem/flink-venv (bench/requirements-flink.txt)
#   make spark-cluster       a Spark standalone master + 2 workers from the pyspark wheel (spark://127.0.0.1:7077)
#   make spark-cluster-down  stop it (logs and work folders stay in .tandem/spark-cluster)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.PHONY: help setup test-tools bench-flink docs-tools docs docs-check up down status dist test demo demo-stop clean lint \
	pg-stop spark-cluster spark-cluster-down

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
ENV := cd "$(ROOT)" && . .tandem/env.sh
PYTEST_ARGS ?= -x -q -n 2 --dist loadfile --no-loadscope-reorder tests

help:
	@sed -n '1,21s/^# \{0,1\}//p' "$(ROOT)/Makefile"

setup:
	@bash "$(ROOT)/scripts/setup.sh"

up: setup dist
	@$(ENV) && bash scripts/airflow_stack.sh up

down:
	@if [ -f "$(ROOT)/.tandem/env.sh" ]; then $(ENV) && bash scripts/airflow_stack.sh down; \
	 else echo "nothing to stop (.tandem/env.sh missing)"; fi

status:
	@test -f "$(ROOT)/.tandem/env.sh" || { echo "not set up: run 'make setup'"; exit 1; }
	@$(ENV) && bash scripts/airflow_stack.sh status

# dist/tandem.zip holds include/tandem as the top-level package `tandem` (tandem/__init__.py at the
# root of the archive, plus package data such as SQL migrations), each module with its bytecode (Python caches
# none for a zip; tandem.packaging). It is rebuilt
# when it is missing or older than any file of the package (every launch of a node submits it);
# `make setup` builds it too (scripts/setup.sh, step 8).
DIST := $(ROOT)/dist/tandem.zip
PACKAGE_FILES := $(shell find "$(ROOT)/include/tandem" -type f \
	\( -name '*.py' -o -name '*.sql' -o -name '*.html' \) 2>/dev/null)

dist: setup $(DIST)

$(DIST): $(PACKAGE_FILES) | setup
	@$(ENV) && python -m tandem.packaging "$(ROOT)"

test-tools:
	@bash "$(ROOT)/scripts/install_test_tools.sh"

test: setup test-tools dist docs-check
	@$(ENV) && python -m pytest $(PYTEST_ARGS)

# Flink pins its own pyarrow, numpy and py4j: it gets a venv of its own and is never a dependency of Tandem.
FLINK_VENV := $(ROOT)/.tandem/flink-venv

bench-flink:
	@test -x "$(FLINK_VENV)/bin/python" || python3 -m venv "$(FLINK_VENV)"
	@"$(FLINK_VENV)/bin/pip" install -q -r "$(ROOT)/bench/requirements-flink.txt" && \
	 "$(FLINK_VENV)/bin/python" -c "import pyflink.version as v; print('flink', v.__version__, 'in $(FLINK_VENV)')"

# The documentation site (mkdocs-material, requirements-docs.txt). The check builds into a temporary folder, so no
# site/ is left in the tree; --strict turns every warning (a broken link or anchor, a page outside the nav, a
# reference page that cannot be generated from the code) into a failure. Not --quiet: it hides the warnings from
# the count, and the strict build then passes whatever they say.
docs-tools: setup
	@bash "$(ROOT)/scripts/install_docs_tools.sh"

docs-check: docs-tools
	@$(ENV) && site="$$(mktemp -d)" && trap 'rm -rf "$$site"' EXIT && \
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$$site"

docs: docs-tools
	@$(ENV) && NO_MKDOCS_2_WARNING=1 mkdocs serve --dev-addr 127.0.0.1:8000

# TANDEM_DEMO_STARTED_NS: when make started (read as make reads this file), so that the demo's closing table counts
# the set-up's time too (.tandem/setup-times.tsv, when written after it)
demo: export TANDEM_DEMO_STARTED_NS := $(shell date +%s%N)
# the Spark class-data archive is recorded after set-up, at a low priority: the demo does not wait for it
demo: export TANDEM_SPARK_CDS := background
demo: setup dist
	@$(ENV) && tandem demo

demo-stop:
	@test -f "$(ROOT)/.tandem/env.sh" || { echo "nothing to stop (.tandem/env.sh missing)"; exit 0; }
	@$(ENV) && tandem demo --stop

clean:
	rm -rf "$(ROOT)/.tandem/data" "$(ROOT)/dist"

lint:
	@cd "$(ROOT)" && for f in scripts/*.sh .ci/run; do bash -n "$$f"; done && \
	python3 -m compileall -q include dags plugins jobs tests >/dev/null && echo "lint ok"

# stop the private PostgreSQL cluster (only exists when no server answered on 127.0.0.1:5432)
pg-stop:
	@bash "$(ROOT)/scripts/provision_postgres.sh" stop

spark-cluster: setup
	@$(ENV) && python -m tandem.spark_cluster up --dir .tandem/spark-cluster

spark-cluster-down:
	@if [ -f "$(ROOT)/.tandem/env.sh" ]; then $(ENV) && python -m tandem.spark_cluster down --dir .tandem/spark-cluster; \
	 else echo "nothing to stop (.tandem/env.sh missing)"; fi
