"""A production relay from one TOML file and secrets mounted as files, against a PostgreSQL that
asks this role for its password (scram-sha-256): `outbox db upgrade` and the relay publish with
it, a wrong one is refused in one line, and no secret is ever printed."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from outbox.core.config import DatabaseUrl
from outbox.writer import add_event
from tests.cli import outbox
from tests.helpers import spawn, unique, wait_for
from tests.relay_support import published

# Every kind of character a password meets in a URL, a shell or a TOML file.
PASSWORD = "p@ss:w/rd?&=%25 #'\"\\é"


@contextlib.contextmanager
def password_role(database: DatabaseUrl) -> Iterator[str]:
    """A superuser role the server asks for its password on loopback (the test server trusts the
    rest): a line of its own at the top of pg_hba.conf, taken out again."""
    role = unique("relay_pw")
    with psycopg.connect(database.libpq, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(sql.Identifier(role), PASSWORD)
        )
        hba = Path(admin.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]
        before = hba.read_text()
        hba.write_text(f'host all "{role}" 127.0.0.1/32 scram-sha-256\n{before}')
        admin.execute("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(before)
        with psycopg.connect(database.libpq, autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")


def test_a_relay_from_a_config_file_and_secret_files_publishes_and_prints_no_secret(
    tmp_path: Path, database: DatabaseUrl, bootstrap: str, topic: str
) -> None:
    with password_role(database) as role:
        host = database.raw.split("@", 1)[1]  # 127.0.0.1:PORT/DB?...
        secrets = tmp_path / "secrets"
        secrets.mkdir()
        (secrets / "url").write_text(f"postgresql://{role}@{host}\n")
        (secrets / "password").write_text(f"{PASSWORD}\n")
        config = tmp_path / "relay.toml"
        config.write_text(
            f'name = "from-the-file"\nbootstrap-servers = "{bootstrap}"\npoll-interval = 0.2\n'
            'batch-size = 0\nmetrics-address = "off"\nlog-format = "text"\n[kafka]\n"linger.ms" = 1\n'
        )
        env = {
            "DATABASE_URL_FILE": str(secrets / "url"),
            "DATABASE_PASSWORD_FILE": str(secrets / "password"),
            "OUTBOX_RELAY_CONFIG": str(config),
            "OUTBOX_RELAY_BATCH_SIZE": "100",  # over the file's 0, which alone is refused
        }
        wrong = tmp_path / "wrong"
        wrong.write_text("not it\n")
        refused = outbox("db", "upgrade", env={**env, "DATABASE_PASSWORD_FILE": str(wrong)})
        assert refused.code == 2 and "password authentication failed" in refused.err, refused
        assert len(refused.err.strip().splitlines()) == 1, refused.err
        upgraded = outbox("db", "upgrade", env=env)
        assert upgraded.code == 0, upgraded

        with psycopg.connect(database.libpq) as conn:
            add_event(conn, topic, {"n": 1}, key="a")
        base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")}
        log = tmp_path / "relay.log"
        relay = spawn(
            [sys.executable, "-m", "outbox", "relay", "--name", "from-the-flag"],
            log,
            die_with_parent=signal.SIGKILL,
            env={**base, **env},
        )
        try:
            wait_for(lambda: len(published(bootstrap, topic, 1)) == 1, 120, "the event published")
        finally:
            relay.send_signal(signal.SIGTERM)
            code = relay.wait(60)
        said = log.read_text()
        assert code == 0, said
        assert "relay=from-the-flag" in said and "from-the-file" not in said, said  # the flag wins
        assert "linger.ms" in said and "'1'" in said, said  # the file's [kafka] table
        for secret in (PASSWORD, PASSWORD.replace("%", "%25")):
            assert secret not in said + refused.err + upgraded.err
