"""The services a bench runs against (shared by the scripts beside it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox_dev.stack import running


@contextlib.contextmanager
def services(root: Path) -> Iterator[tuple[DatabaseUrl, str]]:
    """PostgreSQL (the outbox's tables made in `public`) and Kafka: DATABASE_URL and
    KAFKA_BOOTSTRAP_SERVERS where set, else embedded ones under `root` for the with-block."""
    with running(root) as started:
        env = {
            **started,
            **{k: v for k in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS") if (v := os.environ.get(k))},
        }
        url = DatabaseUrl.parse(env["DATABASE_URL"])
        migrate.upgrade(url, "public")
        yield url, env["KAFKA_BOOTSTRAP_SERVERS"]
