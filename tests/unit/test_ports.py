"""The ports the dev tools choose for services: free, and out of the kernel's way until bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox_dev.process import ephemeral_ports, free_port, port_in_use, quiet_ports

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
