# One-command set-up and runs. `make run` = set up + the main job end to end; `make test` = set up + tests.
SHELL := /bin/bash
PYTHON_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum requirements.txt | cut -c1-12)

export AIRFLOW_HOME ?= $(CURDIR)/var/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION := False
export AIRFLOW__CORE__PARALLELISM ?= 4
export AIRFLOW__COSMOS__ENABLE_TELEMETRY := False
export OMP_NUM_THREADS ?= 1
export PYTHONPATH := $(CURDIR)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup run test test-all bench-exact airflow-ui ingest transform lint clean

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: $(STAMP)
	@mkdir -p var/airflow
	@$(VENV)/bin/airflow db migrate > var/airflow/db-migrate.log 2>&1 || { cat var/airflow/db-migrate.log; exit 1; }
	@$(VENV)/bin/airflow pools set warehouse 1 "DuckDB single writer" >> var/airflow/db-migrate.log 2>&1 || { cat var/airflow/db-migrate.log; exit 1; }
	@$(PY) -m transforms.runner manifest > var/airflow/dbt-manifest.log 2>&1 || { cat var/airflow/dbt-manifest.log; exit 1; }
	@echo "set-up done: venv $(VENV), AIRFLOW_HOME=$(AIRFLOW_HOME)"

## The main job, end to end on the embedded defaults.
run: setup
	$(PY) -m pipeline run

ingest: setup
	$(PY) -m warehouse ingest --all

## Lint: style (ruff), formatting (ruff format) and the import contracts (import-linter, in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

## The test suite (what CI runs): lint first, then the tests. Long training tests are marked `slow` and skipped.
test: setup lint
	@bash deploy/install-services.sh postgresql slurm chromium prometheus
	$(PY) -m pytest -q -m "not slow" tests

test-all: setup lint
	@bash deploy/install-services.sh postgresql redis-server slurm chromium prometheus
	$(PY) -m pytest -q tests

## The twelve small instances against the node-aware optimum (docs/results/planner/exact.md; about 40 min on 2 cores):
## the ensemble's backtest forecasts for both periods, then every policy, the ablations and the exact MILP.
bench-exact: setup
	OMP_NUM_THREADS=1 $(PY) -m forecasting backtest --model ensemble --start 2021-07-01 --end 2021-07-06 --horizon 96 --store --no-plot
	OMP_NUM_THREADS=1 $(PY) -m forecasting backtest --model ensemble --start 2021-12-01 --end 2021-12-06 --train-end 2021-07-01 --horizon 96 --store --no-plot
	OMP_NUM_THREADS=1 $(PY) -m scheduling evaluate --jobs 80 --days 2 --start 2021-07-01 2021-12-01 --load 0.5 0.8 --seed 0 1 2 \
	    --exact --exact-time-limit 120 --ablations --no-progress --report-md docs/results/planner/exact.md \
	    --exact-json docs/results/planner/exact_shares.json

## The Airflow UI on http://localhost:8080 (log-in: see README).
airflow-ui: setup
	AIRFLOW__API__PORT=8080 $(VENV)/bin/airflow standalone

clean:
	rm -rf var
