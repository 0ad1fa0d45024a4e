"""Network faults without root: Toxiproxy's TCP proxies on loopback, whose links a test cuts and heals.

A kill -9 closes sockets, and the peer hears of it at once; a partition leaves
them open, and a request's answer simply never comes. Toxiproxy (Shopify's, a
Go program) makes the second kind: a `timeout` toxic of 0 drops every byte
without closing anything, on one direction or both. The binary is built once
with `go install` (gotools.py) and reused by every later run and clone.
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from outbox_dev.gotools import built
from outbox_dev.process import free_port, spawn, stop, wait_until

VERSION = "v2.5.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"

HELD = 24 * 3600 * 1000  # ms: a close held back this long is held until the heal

Stream = Literal["upstream", "downstream", "both"]  # upstream: requests; downstream: answers


def binary(environ: Mapping[str, str] | None = None) -> Path:
    """The Toxiproxy server, built with Go the first time."""
    target = f"{MODULE}@{VERSION}"
    return built(
        f"toxiproxy-{VERSION}",
        target,
        "server",
        needed_by="the network fault tests' Toxiproxy",
        environ=environ,
    )


class Toxiproxy:
    """One Toxiproxy server on loopback, dying with the process that started it."""

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.log = work / "toxiproxy.log"
        port = free_port()
        self.api = f"http://127.0.0.1:{port}"
        argv = [str(binary()), "-host", "127.0.0.1", "-port", str(port)]
        self.process = spawn(argv, self.log, die_with_parent=signal.SIGKILL)
        wait_until(self._answers, self.process, what="Toxiproxy", log=self.log, timeout=30)

    def _answers(self) -> bool:
        try:
            self.request("GET", "/version")
        except OSError:
            return False
        return True

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        call = urllib.request.Request(self.api + path, data=data, method=method)
        call.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(call, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text.strip().startswith((b"{", b"[")) else text

    def link(self, name: str, upstream: str, listen_port: int | None = None) -> Link:
        """A proxy from 127.0.0.1:listen_port (a free port if None) to `upstream` (host:port)."""
        listen = f"127.0.0.1:{listen_port or free_port()}"
        self.request("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
        return Link(self, name, listen, upstream)

    def close(self) -> None:
        if self.process.poll() is None:
            stop(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@dataclass(frozen=True)
class Link:
    """One proxied link: clients connect to `listen`, and the proxy passes their bytes on to `upstream`."""

    proxy: Toxiproxy
    name: str
    listen: str
    upstream: str

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def add(self, toxic: str, stream: Stream = "both", *, toxicity: float = 1.0, **attributes: int) -> None:
        """Add `toxic` with its attributes; each connection gets it with probability `toxicity`."""
        for direction in ("upstream", "downstream") if stream == "both" else (stream,):
            name = f"{toxic}_{direction}"
            body = {
                "name": name,
                "type": toxic,
                "stream": direction,
                "toxicity": toxicity,
                "attributes": attributes,
            }
            self.proxy.request("POST", f"/proxies/{self.name}/toxics", body)

    def cut(self, stream: Stream = "both") -> None:
        """Drop every byte, closing nothing: requests sent, answers never come (a partition). Not
        even a close gets through: the far side keeps its end open until the heal, as a server
        keeps the session of a client it can no longer hear."""
        self.add("timeout", stream, timeout=0)
        self.add("slow_close", stream, delay=HELD)

    def close(self) -> None:
        """Remove the link: its port is closed, and so is every connection it held."""
        self.proxy.request("DELETE", f"/proxies/{self.name}")

    def heal(self) -> None:
        """The link carries bytes again, and every connection it held is closed at both ends, as a
        partition that ends in resets does: each side learns at once that what it held is gone.

        Done by deleting the proxy and making it anew on the same port. Removing toxics from live
        connections instead leaves Toxiproxy's chains inconsistent (a held close keeps a
        connection's chain alive; link.go's "TODO: Check if cleanup happen would link.stubs
        recalculated?"), and the next toxic added panics the server (v2.5, and v2.12 still).
        """
        self.close()
        self.open()

    def open(self) -> None:
        """Make the link (anew, after `close`) on its port, without toxics."""
        self.proxy.request(
            "POST", "/proxies", {"name": self.name, "listen": self.listen, "upstream": self.upstream}
        )
