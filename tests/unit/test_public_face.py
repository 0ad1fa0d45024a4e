"""What `import outbox` and `import sinks...` give a user: the public names, and nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import outbox
import sinks.kafka_source
import sinks.postgres
from tests.helpers import REPO


def test_every_public_name_is_there() -> None:
    for package in (outbox, sinks.postgres, sinks.kafka_source):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    assert issubclass(outbox.ConfigError, outbox.OutboxError)
    assert outbox.add_event.__module__ == "outbox.writer"
    assert outbox.Relay.__module__ == "outbox.relay.relay"


def test_importing_outbox_loads_no_driver() -> None:
    """The CLI catches stop signals before its heavy imports (outbox/stopping.py): `import outbox`
    must stay as light as its errors."""
    probe = "import sys, outbox; print(sorted({m.split('.')[0] for m in sys.modules} & {HEAVY}))"
    heavy = {"confluent_kafka", "psycopg", "pyspark", "sqlalchemy", "alembic", "pyarrow"}
    said = subprocess.run(
        [sys.executable, "-c", probe.replace("{HEAVY}", repr(heavy))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert said.stdout.strip() == "[]", said.stdout
