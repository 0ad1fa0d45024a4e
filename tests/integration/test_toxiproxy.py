"""The fault proxy itself: a cut link keeps its connections open and drops their bytes, one way or both;
a healed one carries them again; and a killed test run leaves no proxy, process or port behind."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from outbox.core.config import DatabaseUrl
from outbox_dev.process import pid_alive
from outbox_dev.toxiproxy import Link, Toxiproxy
from tests.helpers import Job, wait_for

# PostgreSQL answers this 8-byte SSLRequest with one byte, 'S' or 'N', before any login.
SSL_REQUEST = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")


def upstream(url: DatabaseUrl) -> str:
    """The server's host:port, as the proxy dials it."""
    info = conninfo_to_dict(url.libpq)
    return f"{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}"


@pytest.fixture
def link(tmp_path: Path, server_url: DatabaseUrl) -> Iterator[Link]:
    proxy = Toxiproxy(tmp_path / "toxiproxy")
    yield proxy.link("postgres", upstream(server_url))
    proxy.close()


def answer(conn: socket.socket) -> bytes | None:
    """PostgreSQL's answer to an SSLRequest on `conn`; None if none came within 2 s."""
    conn.sendall(SSL_REQUEST)
    try:
        return conn.recv(1)
    except TimeoutError:
        return None


def connect(link: Link) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", link.port), timeout=2)
    conn.settimeout(2)
    return conn


@pytest.mark.parametrize("stream", ["both", "upstream", "downstream"])
def test_a_cut_link_drops_bytes_without_closing_and_a_healed_one_carries_them(
    link: Link, stream: str
) -> None:
    with connect(link) as before:
        assert answer(before) in (b"S", b"N")
    link.cut(stream)  # type: ignore[arg-type]
    with connect(link) as during:  # the proxy still accepts: nothing tells the client
        assert answer(during) is None
        during.settimeout(0.5)
        with pytest.raises(TimeoutError):  # open, not closed (a closed socket reads b"")
            during.recv(1)
    link.heal()
    with connect(link) as after:
        assert answer(after) in (b"S", b"N")


def test_a_close_does_not_cross_a_cut_link(link: Link, server_url: DatabaseUrl) -> None:
    """A client that gives up on a cut link closes its end; the server, cut off, must not hear of it
    (a partition drops the FIN too), so its session lives on: only the server's own limits end it."""
    port = int(upstream(server_url).rsplit(":", 1)[1])
    through = DatabaseUrl.parse(server_url.raw.replace(f":{port}/", f":{link.port}/", 1))
    client = psycopg.connect(through.libpq, autocommit=True)
    pid = client.info.backend_pid

    def session_alive() -> bool:
        with psycopg.connect(server_url.libpq, autocommit=True) as conn:
            return bool(
                conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]
            )  # type: ignore[index]

    assert session_alive()
    link.cut()
    client.pgconn.finish()  # the client's end closed, its Terminate and FIN sent into the cut
    time.sleep(2)
    assert session_alive()
    with psycopg.connect(server_url.libpq, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_killed_run_leaves_no_proxy_process_or_port(tmp_path: Path, server_url: DatabaseUrl) -> None:
    """kill -9 of the test process in mid-partition: its Toxiproxy dies with it, and frees its ports."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from outbox_dev.toxiproxy import Toxiproxy\n"
        "proxy = Toxiproxy(Path(sys.argv[1]))\n"
        "link = proxy.link('postgres', sys.argv[2])\n"
        "link.cut()\n"
        "print('ready', proxy.process.pid, proxy.api.rsplit(':', 1)[1], link.port, flush=True)\n"
        "time.sleep(3600)\n"
    )
    argv = ["-c", script, str(tmp_path / "toxiproxy"), upstream(server_url)]
    run = Job(argv, tmp_path / "run.log", {})
    wait_for(lambda: "ready " in run.output(), 600, "the proxy's pid and ports")  # a first run builds it
    ready = next(line for line in run.output().splitlines() if line.startswith("ready "))
    pid, api, listen = (int(x) for x in ready.split()[1:])
    assert pid_alive(pid) and listening(api) and listening(listen)
    run.kill9()
    # A Go program's main thread shows as a zombie while its other threads still close its sockets.
    gone = lambda: not pid_alive(pid) and not listening(api) and not listening(listen)  # noqa: E731
    wait_for(gone, 30, f"the proxy's death (pid {pid}) and its ports ({api}, {listen}) closed")


def listening(port: int) -> bool:
    """Whether anything accepts connections on the port (a closed one may sit in TIME_WAIT: not this)."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
