"""`outbox db`: upgrade, downgrade and current, beside an application's own Alembic history."""

import os
import subprocess
import sys

import hypothesis.strategies as st
import psycopg
from hypothesis import HealthCheck, given, settings
from psycopg import sql

from outbox import migrate
from outbox.core.config import DatabaseUrl, schema_name
from tests.cli import assert_one_line_error, outbox
from tests.helpers import REPO

TABLES = {
    "outbox_events",
    "sink_progress",
    "sink_dead_letters",
    "relay_dead_letters",
    "relay_positions",
    "outbox_identity",
    "sink_batches",
    "sink_topics",
    "sink_traces",
    "outbox_alembic_version",
}


def tables(pg: psycopg.Connection, schema: str) -> set[str]:
    rows = pg.execute("select table_name from information_schema.tables where table_schema = %s", [schema])
    return {r[0] for r in rows}


def test_upgrade_downgrade_upgrade(database: DatabaseUrl, pg: psycopg.Connection) -> None:
    env = {"DATABASE_URL": database.raw}
    current = outbox("db", "current", env=env)
    assert current.code == 1 and current.out.startswith("base")

    assert outbox("db", "upgrade", env=env).code == 0
    assert tables(pg, "public") == TABLES
    assert outbox("db", "current", env=env).out.strip() == "0015 (head)"
    assert outbox("db", "upgrade", env=env).code == 0  # already at head: a no-op

    down = outbox("db", "downgrade", "base", env=env)
    assert down.code == 0, down
    assert tables(pg, "public") == {"outbox_alembic_version"}

    assert outbox("db", "upgrade", env=env).code == 0
    assert tables(pg, "public") == TABLES


def test_our_history_lives_beside_the_applications(database: DatabaseUrl, pg: psycopg.Connection) -> None:
    pg.execute("create table alembic_version (version_num varchar(32) primary key)")
    pg.execute("insert into alembic_version values ('app_rev_42')")
    assert outbox("db", "upgrade", env={"DATABASE_URL": database.raw}).code == 0
    assert pg.execute("select version_num from alembic_version").fetchall() == [("app_rev_42",)]
    assert pg.execute("select version_num from outbox_alembic_version").fetchall() == [("0015",)]


def test_schema_names_are_quoted_not_injected(database: DatabaseUrl, pg: psycopg.Connection) -> None:
    schema = 'we"ird; DROP TABLE victim; --'
    pg.execute("create table victim (id int)")
    result = outbox("db", "upgrade", "--url", database.raw, "--schema", schema)
    assert result.code == 0, result
    assert tables(pg, schema) == TABLES
    assert tables(pg, "public") == {"victim"}
    pg.execute(
        sql.SQL("insert into {}.outbox_events (event_id, topic) values (gen_random_uuid(), 't')").format(
            sql.Identifier(schema)
        )
    )
    txid = pg.execute(sql.SQL("select txid from {}.outbox_events").format(sql.Identifier(schema))).fetchone()
    assert txid is not None and int(str(txid[0])) > 0
    down = outbox("db", "downgrade", "base", "--url", database.raw, "--schema", schema, "--force")
    assert down.code == 0, down
    assert tables(pg, schema) == {"outbox_alembic_version"}


def test_offline_sql_for_review(database: DatabaseUrl, pg: psycopg.Connection) -> None:
    result = outbox("db", "upgrade", "--sql", "--url", database.raw)
    assert result.code == 0
    assert 'CREATE TABLE "public".outbox_events' in result.out
    assert "pg_current_xact_id()" in result.out
    assert tables(pg, "public") == set(), "--sql must not touch the database"


def test_a_downgrade_that_would_drop_rows_is_refused_unless_forced(
    database: DatabaseUrl, pg: psycopg.Connection
) -> None:
    """`downgrade base` dropped the outbox with its unpublished events, the ledger and the dead
    letters (their only copy) without a word."""
    env = {"DATABASE_URL": database.raw}
    assert outbox("db", "upgrade", env=env).code == 0
    pg.execute("insert into outbox_events (event_id, topic) values (gen_random_uuid(), 't')")
    refused = outbox("db", "downgrade", "base", env=env)
    assert_one_line_error(refused, "public.outbox_events", "--force")
    assert tables(pg, "public") == TABLES  # nothing dropped: the whole downgrade is one transaction
    assert outbox("db", "current", env=env).out.strip() == "0015 (head)"
    assert outbox("db", "downgrade", "0008", env=env).code == 0  # sink_traces is empty: dropped
    forced = outbox("db", "downgrade", "base", "--force", env=env)
    assert forced.code == 0, forced
    assert tables(pg, "public") == {"outbox_alembic_version"}


def test_upgrades_started_at_once_all_succeed(database: DatabaseUrl, pg: psycopg.Connection) -> None:
    """Every replica of an app may run `outbox db upgrade` as it deploys: the ones that lost the race
    failed (a duplicate type, "already exists") and the pods crash-looped."""
    env = {**os.environ, "DATABASE_URL": database.raw, "PYTHONPATH": str(REPO)}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "outbox", "db", "upgrade"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [(run.wait(120), *run.communicate()) for run in runs]
    assert all(code == 0 for code, _, _ in results), results
    assert tables(pg, "public") == TABLES


def test_an_upgrade_blocked_by_a_transaction_gives_up_in_seconds_and_changes_nothing(
    database: DatabaseUrl, pg: psycopg.Connection
) -> None:
    """0012 alters outbox_events, which waits for every transaction that has read the table; each
    insert into the outbox then queues behind the waiting ALTER. A deploy's upgrade beside one long
    transaction stopped the application's writes for as long as that transaction lasted."""
    env = {"DATABASE_URL": database.raw}
    assert outbox("db", "upgrade", "0011", env=env).code == 0
    with psycopg.connect(database.libpq) as holder:
        holder.execute("SELECT count(*) FROM outbox_events")  # open, as a long report's would be
        blocked = outbox("db", "upgrade", "--lock-timeout", "1", env=env)
        assert_one_line_error(blocked, "DB_LOCK_TIMEOUT", "1s", "--lock-timeout", "nothing was changed")
        assert outbox("db", "current", env=env).out.startswith("0011"), "the run was one transaction"
    assert outbox("db", "upgrade", env=env).code == 0
    assert outbox("db", "current", env=env).out.strip() == "0015 (head)"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.one_of(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20),
        st.sampled_from(["team :ops", "50%", "a%%s", ":x", "Upper Case", "ünï", ".", "a.b"]),
    ).filter(lambda n: len(n.encode()) <= 63)
)
def test_any_schema_name_is_a_name(database: DatabaseUrl, pg: psycopg.Connection, name: str) -> None:
    """The docs say any name works: a ':' after a non-word character became a bind parameter, a '%'
    was escaped twice, and Alembic split a name at each '.' ('.' and 'a.b' failed at 0007). Each was
    in the migrations, which run here in this process, as `outbox db upgrade --schema` runs them
    (test_schema_names_are_quoted_not_injected goes through the command): a command's start is
    about two CPU-seconds, twelve examples' worth of them a minute and a half."""
    migrate.upgrade(database, schema_name(name))
    assert tables(pg, name) == TABLES
    migrate.downgrade(database, schema_name(name), "base")
    assert tables(pg, name) == {"outbox_alembic_version"}
    pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_rows_from_before_0012_with_an_id_at_or_below_0_do_not_stop_a_rebase(
    database: DatabaseUrl, pg: psycopg.Connection
) -> None:
    """0012's check is NOT VALID, so rows already there stay; an UPDATE checks the row it writes,
    and `outbox relays rebase`, which stamps every row anew, failed on such a row."""
    env = {"DATABASE_URL": database.raw}
    assert outbox("db", "upgrade", "0011", env=env).code == 0
    pg.execute(
        "INSERT INTO outbox_events (id, event_id, topic, value) OVERRIDING SYSTEM VALUE"
        " VALUES (0, gen_random_uuid(), 't', 'v'), (1, gen_random_uuid(), 't', 'v')"
    )
    assert outbox("db", "upgrade", env=env).code == 0
    rebased = outbox("relays", "rebase", env=env)
    assert rebased.code == 0, rebased


def test_check_says_when_the_txid_stamp_would_not_fire_on_a_logical_replica(
    database: DatabaseUrl, pg: psycopg.Connection, bootstrap: str
) -> None:
    """0013 makes the stamp fire on a logical replica's apply. ENABLE TRIGGER ALL, which pg_restore
    --disable-triggers runs after a data-only load, sets it back to origin only, with nothing else to
    show it: a relay on a subscriber would again never publish what replication brings."""
    # A broker that answers: an unreachable one costs each check its 10 s Kafka timeout.
    env = {"DATABASE_URL": database.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    assert outbox("db", "upgrade", env=env).code == 0

    def said() -> str:
        [line] = [
            line for line in outbox("check", "--no-java", env=env).out.splitlines() if "txid stamp" in line
        ]
        return line

    assert said() == "ok   txid stamp: outbox_events_txid fires on every insert into public.outbox_events"
    pg.execute("ALTER TABLE outbox_events ENABLE TRIGGER ALL")
    assert said().startswith("WARN txid stamp: outbox_events_txid does not fire on a logical replica's apply")
    assert "ENABLE ALWAYS TRIGGER outbox_events_txid" in said()
    pg.execute("ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_txid")
    assert said().startswith("FAIL txid stamp: [DB_TXID_TRIGGER_DISABLED] ")
    pg.execute("ALTER TABLE outbox_events ENABLE ALWAYS TRIGGER outbox_events_txid")
    assert said().startswith("ok   txid stamp: ")
