"""Writer schemas by id, from a Confluent-compatible schema registry.

A record in Confluent's wire format names its writer schema by id; the id
never changes what it names, so each Python worker asks the registry once per
id and keeps the answer. A registry that does not answer is waited for, as
Kafka is (sinks/kafka_source/cluster.py): one line when the wait starts and
one when it answers again, nothing dead-lettered meanwhile. So is one that
answers for a while with a server error or with a 404 that is not its own (a
proxy's or an ingress's, with no registry error code). Only the registry's
own "not found" codes make an id unknown, the record's fault: `UnknownSchema`.
A registry that refuses the client (401, 403, a bad request) fails the
question in one coded line: waiting changes nothing, and neither would a
dead letter.

The client is Confluent's own (confluent-kafka's schema_registry), so its
settings are theirs: `url`, `basic.auth.user.info`, `ssl.*`, and so on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

log = logging.getLogger("outbox.registry")
T = TypeVar("T")
SAY_AFTER = 5.0  # seconds a registry may be silent before a line says the batch waits for it
UNKNOWN_AFTER = 5.0  # seconds an id is asked for again before the registry's "not found" is final
_NOT_FOUND = (40401, 40402, 40403)  # subject, version, schema not found: the registry's own words
_PASSING = (404, 408, 429)  # besides 5xx, answers that pass by themselves: a route, timed out, busy
Settings = tuple[tuple[str, str], ...]
# Unless the settings say otherwise: a request that hangs (a registry stopped, not down) ends, and
# is asked again by `ask`, which says that it waits, rather than by the client, which says nothing.
# The client keeps a subject's newest version for good unless told otherwise: a query started again
# in the same driver would read with the version of the process's first start.
_DEFAULTS = {"timeout": 5, "max.retries": 0, "cache.latest.ttl.sec": 0}


class UnknownSchema(LookupError):
    """The registry answered: it holds no such schema (or subject)."""


@dataclass(frozen=True)
class Registry:
    """Where the registry is and how to reach it: picklable, to reach the executors.

    settings: confluent-kafka's SchemaRegistryClient configuration; a URL alone is `{"url": ...}`.
    """

    settings: Mapping[str, Any]
    patience: float | None = None  # seconds to wait for a silent registry; None: for ever

    @classmethod
    def of(cls, given: str | Mapping[str, Any] | Registry) -> Registry:
        if isinstance(given, Registry):
            return given
        return cls({"url": given} if isinstance(given, str) else dict(given))

    @property
    def key(self) -> Settings:
        """Its settings as a dict key: what per-process caches are kept under."""
        return _key(self.settings)

    @property
    def where(self) -> str:
        """The registry's address as a log line may show it: no user, no password."""
        url = str(self.settings.get("url", "")).split(",")[0]
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"

    def client(self) -> Any:
        """Confluent's SchemaRegistryClient of these settings, shared in the process."""
        return _client(self.settings)

    def schema(self, schema_id: int) -> Any:
        """The registry's Schema of that id (confluent_kafka.schema_registry.Schema), asked once per
        process: a Python worker outlives its tasks, each of which unpickles a Registry anew."""
        key = (self.key, schema_id)
        found = _schemas.get(key)
        if found is None:
            found = _schemas[key] = self._issued(schema_id)
        return found

    def _issued(self, schema_id: int) -> Any:
        """A record names an id some registry issued: one that does not know it may be a follower
        not yet caught up with its leader, so it is asked again for a while before the id is
        taken for unknown."""
        began = time.monotonic()
        while True:
            try:
                return self.ask(lambda c: c.get_schema(schema_id))
            except UnknownSchema:
                if time.monotonic() - began >= UNKNOWN_AFTER:
                    raise
            time.sleep(1.0)

    def latest(self, subject: str) -> Any:
        """The newest registered version of a subject (RegisteredSchema)."""
        return self.ask(lambda c: c.get_latest_version(subject))

    def version(self, subject: str, version: int) -> Any:
        return self.ask(lambda c: c.get_version(subject, version))

    def ask(self, question: Callable[[Any], T]) -> T:
        """The registry's answer; UnknownSchema where it holds none; waits while it does not answer."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        began, said = time.monotonic(), False
        while True:
            try:
                answer = question(_client(self.settings))
            except SchemaRegistryError as exc:
                status = exc.http_status_code
                if exc.error_code in _NOT_FOUND:
                    raise UnknownSchema(exc.error_message) from None
                if status not in _PASSING and not 500 <= status <= 599:
                    raise self._refused(status) from None
                reason = f"HTTP {status}" + ("" if status != 404 else ", not the registry's own 404")
            except transport_error() as exc:  # refused, reset, timed out
                reason = type(exc).__name__
            else:
                if said:
                    log.warning(
                        "schema registry at %s answers again after %.0fs",
                        self.where,
                        time.monotonic() - began,
                    )
                return answer
            waited = time.monotonic() - began
            if self.patience is not None and waited > self.patience:
                raise TimeoutError(
                    f"schema registry at {self.where} did not answer for {waited:.0f}s ({reason})"
                )
            if not said and waited >= SAY_AFTER:
                log.warning("schema registry at %s does not answer (%s); waiting for it", self.where, reason)
                said = True
            time.sleep(min(1.0, 0.1 * 2 ** min(waited, 4)))

    def _refused(self, status: int) -> Exception:
        from outbox.core.errors import error

        if status in (401, 403):
            return error("REGISTRY_REFUSED_CLIENT", registry=self.where, status=status)
        return error("REGISTRY_REFUSED_REQUEST", registry=self.where, status=status)


_clients: dict[Settings, Any] = {}
_schemas: dict[tuple[Settings, int], Any] = {}
_lock = threading.Lock()


def _key(settings: Mapping[str, Any]) -> Settings:
    return tuple(sorted((k, repr(v)) for k, v in settings.items()))


def transport_error() -> type[Exception]:
    """The HTTP library's error for a request that got no answer, as the client imports it."""
    from confluent_kafka.schema_registry._sync import schema_registry_client

    return schema_registry_client.httpx.TransportError


def _client(settings: Mapping[str, Any]) -> Any:
    """One client per settings per process: its connections are kept between questions."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = _key(settings)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = SchemaRegistryClient({**_DEFAULTS, **settings})
        return client
