"""An HTTP proxy of the tests' own in front of the schema registry, on loopback, that answers the
next requests with the faults a test queues: what a registry's proxy, ingress or leader change
gives a client (a 404 page, a server error, a refusal, no answer at all)."""

from __future__ import annotations

import http.client
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

# Each fault: status, content type, body. "hang" holds the request and answers nothing.
FAULTS: dict[str, tuple[int, str, bytes]] = {
    "html-404": (404, "text/html", b"<html><body><h1>404 Not Found</h1>nginx</body></html>"),
    "500": (500, "application/json", b'{"error_code": 50001, "message": "Error in the backend store"}'),
    "503-html": (503, "text/html", b"<html><body>503 Service Temporarily Unavailable</body></html>"),
    "401": (401, "application/json", b'{"error_code": 40101, "message": "Unauthorized"}'),
}
HANG_S = 8.0  # past the registry client's 5 s request timeout


class FaultyProxy:
    """Forwards each GET and POST to the registry at `upstream`, but for the faults queued by
    `fail_next`, each answering one request in its place. `faulted` counts those answered."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._host, self._port, self._path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
        self._faults: deque[str] = deque()
        self._lock = threading.Lock()
        self.faulted = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The registry's URL through the proxy (the same path: Confluent's API under it)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{self._path}"

    def fail_next(self, fault: str, times: int = 1) -> None:
        assert fault in FAULTS or fault == "hang", fault
        with self._lock:
            self._faults.extend([fault] * times)

    def _next_fault(self) -> str | None:
        with self._lock:
            if not self._faults:
                return None
            self.faulted += 1
            return self._faults.popleft()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy._next_fault()
                if fault == "hang":
                    time.sleep(HANG_S)
                    self.close_connection = True
                    return
                if fault is not None:
                    status, kind, answer = FAULTS[fault]
                    self._answer(status, [("Content-Type", kind)], answer)
                    return
                upstream = http.client.HTTPConnection(proxy._host, proxy._port, timeout=30)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                    }
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    kept = {"content-type", "content-encoding"}  # Apicurio's answers are gzip'ed
                    passed = [(k, v) for k, v in response.getheaders() if k.lower() in kept]
                    self._answer(response.status, passed, response.read())
                finally:
                    upstream.close()

            def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
