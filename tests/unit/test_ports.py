"""The ports the dev tools choose for services: free, and out of the kernel's way until bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox_dev.process import ephemeral_ports, free_port, port_in_use, quiet_ports, tail

pytestmark = pytest.mark.unit


def test_a_chosen_port_is_free_and_below_the_range_the_kernel_gives_outgoing_connections() -> None:
    """A port of that range can be taken by any connection before its service binds it (a
    fault proxy's bind failed so, with three test workers)."""
    low, high = ephemeral_ports()
    chosen = [free_port() for _ in range(50)]
    assert all(not port_in_use(p) for p in chosen)
    assert all(not low <= p <= high for p in chosen), [p for p in chosen if low <= p <= high]
    assert len(set(chosen)) > 40  # spread, so that two workers rarely choose alike


def test_the_ephemeral_range_is_read_from_the_kernel_and_linux_default_otherwise(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    assert ephemeral_ports(setting) == (40000, 50000)
    assert ephemeral_ports(tmp_path / "absent") == (32768, 60999)
    setting.write_text("garbage")
    assert ephemeral_ports(setting) == (32768, 60999)


def test_without_room_below_the_ephemeral_range_the_kernel_chooses() -> None:
    assert quiet_ports(32768) == range(20000, 32768)
    assert quiet_ports(1024) is None
    assert quiet_ports(20500) is None


def test_each_test_worker_chooses_from_a_share_no_other_worker_chooses_from() -> None:
    """Another worker's service binding a port ours had chosen, before our JVM did, stopped a Spark
    Connect server at its start ("Failed to bind")."""
    shares = [quiet_ports(32768, f"{i}/3") for i in range(3)]
    assert all(share is not None and len(share) >= 1000 for share in shares)
    assert set().union(*map(set, shares)) == set(range(20000, 32768))  # type: ignore[arg-type]
    assert sum(len(share) for share in shares if share) == len(range(20000, 32768))
    assert quiet_ports(32768, "0/64") == range(20000, 32768)  # too small a share: all of it
    assert quiet_ports(32768, "junk") == quiet_ports(32768, "3/3") == range(20000, 32768)


def test_a_process_never_chooses_the_same_port_twice() -> None:
    """Two services of one test (a broker's two listeners) chose before either binds."""
    chosen = [free_port() for _ in range(500)]
    assert len(set(chosen)) == len(chosen)


def test_a_service_that_exited_is_said_by_its_exceptions_line_not_its_stack_frames(tmp_path: Path) -> None:
    """A Spark Connect server that failed to bind was said by three `at SparkSubmit...` lines."""
    log = tmp_path / "server.log"
    log.write_text(
        "WARNING: Using incubator modules\n"
        "ERROR SparkConnectServer: Error starting Spark Connect server\n"
        "java.net.BindException: Failed to bind to address /127.0.0.1:50773\n"
        "\tat org.apache.spark.util.Utils$.startServiceOnPort(Utils.scala:2270)\n"
        "\t... 12 more\n"
        "\tat org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)\n"
    )
    said = tail(log, lines=2)
    shown = "ERROR SparkConnectServer: Error starting Spark Connect server | java.net.BindException"
    assert said.startswith(shown)
    assert "SparkSubmit" not in said and "more" not in said.split("(full log")[0]
