"""The test suite, by level: `make test` runs all, `make test-fast` the unit level.

unit/         pure logic, no services: seconds
integration/  real PostgreSQL, Kafka and Spark (services started once per run, in conftest.py)
faults/       kill -9, restarts and injected failures, checked record by record
jobs/         the child processes fault tests kill: relay, sink and source jobs
helpers.py    topics, transactional producers, committed reads, Job, wait_for, OwnPostgres
relay_support.py, sink_support.py, source_support.py   each half's writers, streams and checks
cli.py        run `outbox` as a user would; containers.py: the Docker path
"""
