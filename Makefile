# opsloop — the two commands: `make run` (the whole pipeline here) and `make test`.
# Both do all the set-up a fresh Debian 12 machine needs (as root): `make setup` is idempotent.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PYTEST_ARGS ?=
# Test files run on this many parallel workers (pytest-xdist; a file and its fixtures stay on one worker;
# most tests wait on real components, so two workers on two cores nearly halve the suite; files in
# collection order, the longest first: tests/conftest.py). 0: one process.
PYTEST_JOBS ?= 2
PYTEST_PAR  := $(if $(filter 0,$(PYTEST_JOBS)),,-n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder)

.PHONY: setup setup-python run stop test test-unit bench clean help

help:
	@echo "make setup   install everything (Debian packages, venv, Kafka jars, simulators, Keystone, Telegraf)"
	@echo "make run     the whole pipeline on this machine, supervised (a dead service is restarted; Ctrl-C or 'make stop' to stop)"
	@echo "make stop    stop a pipeline started by 'make run' (its services, the stack and 'make run' itself)"
	@echo "make test    unit and integration tests against real components"
	@echo "make test-unit  the tests that need no external component (only the venv is set up)"
	@echo "make bench   benchmarks, printed as a table with same-run baselines"

setup:
	@set -e; for s in setup.d/*.sh; do echo "== $$s"; bash "$$s"; done

# The venv alone: unit tests need no Debian package, broker or simulator (none runs as root).
setup-python:
	@bash setup.d/20-python.sh

run: setup
	$(VENV)/bin/opsloop run

stop:
	$(VENV)/bin/opsloop run --stop

test: setup
	$(PY) -m pytest $(PYTEST_PAR) $(PYTEST_ARGS)

test-unit: setup-python
	$(PY) -m pytest -m "not integration" $(PYTEST_PAR) $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf .run .pytest_cache .hypothesis
