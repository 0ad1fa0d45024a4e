"""A throwaway PgBouncer in front of a PostgreSQL server, for the tests of what a pooler changes.

PgBouncer comes from the system's packages (Debian's `pgbouncer`); it refuses
to run as root, so as root it runs as PostgreSQL's `nobody`, its directory
handed over as the server's is.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import psycopg

from outbox_dev.errors import error
from outbox_dev.postgres import SERVICE_USER, hand_to
from outbox_dev.process import free_port, spawn, wait_until
from outbox_dev.service import Service

MODES = ("session", "transaction")


def binary() -> Path | None:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )
    return Path(found) if found else None


def start(
    data_dir: Path,
    server_port: int,
    mode: str,
    *,
    pool_size: int = 20,
    ignore_options: bool = True,
    die_with_parent: bool = True,
) -> Service:
    """PgBouncer on a free 127.0.0.1 port, pooling every database of the server on server_port
    (`pool_size` server sessions a database and user). ignore_options: as its users set it, for
    libpq's `options` (our URLs' TimeZone), which it refuses by default."""
    exe = binary()
    if exe is None:
        raise error("DEV_PGBOUNCER_MISSING")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    user = SERVICE_USER if os.geteuid() == 0 else None
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    users = data_dir / "users.txt"
    users.write_text('"postgres" ""\n')
    config = data_dir / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={server_port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 200\n"
        f"ignore_startup_parameters = extra_float_digits{',options' if ignore_options else ''}\n"
        f"logfile = {data_dir / 'pgbouncer.log'}\npidfile = {data_dir / 'pgbouncer.pid'}\n"
    )
    if user:
        hand_to(user, data_dir)
        for path in (users, config):
            shutil.chown(path, user)
    log = data_dir / "stdout.log"
    proc = spawn(
        [str(exe), str(config)], log, user=user, die_with_parent=signal.SIGTERM if die_with_parent else None
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    wait_until(lambda: _accepts(url), proc, what="PgBouncer", log=log)  # psycopg's own URL: no options
    return Service("pgbouncer", proc.pid, port, data_dir, log, {"DATABASE_URL": url})


def _accepts(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            conn.execute("SELECT 1")
            return True
    except psycopg.Error:
        return False
