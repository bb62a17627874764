# Tandem — developer entry points. Every target runs from the project root and, after `setup`,
# sources .tandem/env.sh (written by scripts/setup.sh).
#
#   make setup    venv + dependencies, Java 17 check, PostgreSQL, Airflow home, .tandem/env.sh
#   make up       setup + start the local Airflow stack (UI http://127.0.0.1:8080, admin/admin)
#   make down     stop the local Airflow stack
#   make status   show the stack's processes and health
#   make dist     build dist/tandem.zip (the tandem package, for spark-submit --py-files)
#   make test     setup + dist + pytest          (PYTEST_ARGS="-x -q tests" by default)
#   make demo     setup + dist + `tandem demo`
#   make clean    remove .tandem/data and dist (keeps .venv, PostgreSQL and Airflow state)
#   make lint     syntax checks of the shell scripts and Python sources

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.PHONY: help setup up down status dist test demo clean lint pg-stop

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
ENV := cd "$(ROOT)" && . .tandem/env.sh
PYTEST_ARGS ?= -x -q tests

help:
	@sed -n '1,13s/^# \{0,1\}//p' "$(ROOT)/Makefile"

setup:
	@bash "$(ROOT)/scripts/setup.sh"

up: setup
	@$(ENV) && bash scripts/airflow_stack.sh up

down:
	@if [ -f "$(ROOT)/.tandem/env.sh" ]; then $(ENV) && bash scripts/airflow_stack.sh down; \
	 else echo "nothing to stop (.tandem/env.sh missing)"; fi

status:
	@test -f "$(ROOT)/.tandem/env.sh" || { echo "not set up: run 'make setup'"; exit 1; }
	@$(ENV) && bash scripts/airflow_stack.sh status

# dist/tandem.zip holds include/tandem as the top-level package `tandem` (tandem/__init__.py at the
# root of the archive, plus package data such as SQL migrations), without __pycache__. Built with
# the standard library, so no `zip` binary is needed.
define DIST_PY
import os, sys, zipfile
tmp = "dist/tandem.zip.tmp"
os.makedirs("dist", exist_ok=True)
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
    for d, dirs, files in os.walk("include/tandem"):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if not f.endswith((".pyc", ".pyo")):
                path = os.path.join(d, f)
                z.write(path, os.path.relpath(path, "include"))
    names = z.namelist()
if "tandem/__init__.py" not in names:
    os.remove(tmp)
    sys.exit("dist: include/tandem/__init__.py is missing")
os.replace(tmp, "dist/tandem.zip")
print(f"built dist/tandem.zip ({len(names)} files)")
endef
export DIST_PY

dist:
	@cd "$(ROOT)" && python3 -c "$$DIST_PY"

test: setup dist
	@$(ENV) && python -m pytest $(PYTEST_ARGS)

demo: setup dist
	@$(ENV) && tandem demo

clean:
	rm -rf "$(ROOT)/.tandem/data" "$(ROOT)/dist"

lint:
	@cd "$(ROOT)" && for f in scripts/*.sh .ci/run; do bash -n "$$f"; done && \
	python3 -m compileall -q include dags plugins jobs tests >/dev/null && echo "lint ok"

# stop the private PostgreSQL cluster (only exists when no server answered on 127.0.0.1:5432)
pg-stop:
	@bash "$(ROOT)/scripts/provision_postgres.sh" stop
