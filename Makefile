# `make demo` and `make test` do all set-up on a machine with Python 3.11+ and Java 17+.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo demo-smoke test test-fast soak types spark-archive lint clean

# --no-compile: a module is compiled when first imported, and most of pyspark never is (a third
# less time to install).
$(STAMP): pyproject.toml devtools/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (set PYTHON=python3.11)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[dev]' -e ./devtools
	@touch $(STAMP)

install: $(STAMP)

# BROKERS=3: the loop on a three-node Kafka cluster (RF 3, min.insync 2), its nodes killed in turn.
BROKERS ?= 1

# CONNECT=1: the Spark job as a Spark Connect client of a server of the demo's own.
CONNECT ?= 0

# FORMAT=avro: the input's values as Avro under a schema registry of the demo's own (Apicurio).
FORMAT ?= json

demo: $(STAMP)
	$(PY) -m demos.loop --brokers $(BROKERS) --format $(FORMAT) $(if $(filter 1,$(CONNECT)),--connect) $(DEMO_FLAGS)

demo-smoke: $(STAMP)
	$(PY) -m demos.smoke

# Three files at a time (each worker has its own PostgreSQL, broker and Spark): the suite waits on
# services for a quarter of a two-worker run, which a third worker fills.
TEST_WORKERS ?= 3

# mypy and the tests' Spark archive side by side: each keeps one core busy.
test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 types spark-archive
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --basetemp=.tmp/pytest -m "not soak"

# The long runs under load (the `soak` marker), apart from `make test`.
soak: $(STAMP)
	$(PY) -m pytest --basetemp=.tmp/pytest-soak -m soak

# The unit level alone: pure logic, no services, seconds.
test-fast: $(STAMP)
	$(PY) -m pytest --basetemp=.tmp/pytest-fast tests/unit

# The class-data archive of the tests' Spark drivers (tests/spark_conf.py), made once per machine.
spark-archive: $(STAMP)
	$(PY) -m tests.spark_conf

# Types: the library strict (pyproject.toml); bench/, scripts whose figures are JSON dicts, under a
# looser profile: bare generics, Any returned from them, and calls into untyped helpers allowed.
types: $(STAMP)
	$(PY) -m mypy
	$(PY) -m mypy bench --allow-any-generics --no-warn-return-any --allow-untyped-calls

lint: $(STAMP) types
	$(PY) -m ruff check .

clean:
	rm -rf .tmp .outbox-dev $(VENV)
