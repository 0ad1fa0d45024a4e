"""The partition cases' proxies: a Toxiproxy per module, Kafka and PostgreSQL behind links."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outbox.core.config import DatabaseUrl
from outbox_dev.kafka import Broker, Cluster
from outbox_dev.toxiproxy import Link, Toxiproxy
from tests.faults.partitions.links import Proxied, server_url_port


@pytest.fixture(scope="module")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    proxy = Toxiproxy(tmp_path_factory.mktemp("toxiproxy"))
    yield proxy
    proxy.close()


@pytest.fixture(scope="module", params=["broker"])
def kafka(
    request: pytest.FixtureRequest, toxiproxy: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxied]:
    """One broker, or (parametrized "cluster") three, each node behind a link of its own."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "cluster":
        cluster = Cluster(root, size=3, proxied=True)
        direct, listeners, close = cluster.bootstrap, cluster.proxied, cluster.close
    else:
        broker = Broker(root, proxied=True)
        direct, listeners, close = broker.bootstrap, {1: broker.proxied}, broker.stop
    links = tuple(
        toxiproxy.link(f"kafka-{request.param}-{node}", f"127.0.0.1:{listener.port}", listener.advertised)
        for node, listener in listeners.items()
        if listener is not None
    )
    yield Proxied(direct, ",".join(f"127.0.0.1:{p.advertised}" for p in listeners.values() if p), links)
    for link in links:
        link.close()
    close()


@pytest.fixture(scope="module")
def postgres_link(toxiproxy: Toxiproxy, server_url: DatabaseUrl) -> Link:
    return toxiproxy.link("postgres", f"127.0.0.1:{server_url_port(server_url)}")


@pytest.fixture
def db(outbox_db: DatabaseUrl, postgres_link: Link, kafka: Proxied) -> Iterator[Proxied]:
    """The test's outbox database, direct and through the proxy; every link healed after the test."""
    port = server_url_port(outbox_db)
    through = outbox_db.raw.replace(f":{port}/", f":{postgres_link.port}/", 1)
    yield Proxied(outbox_db.raw, through, (postgres_link,))
    postgres_link.heal()
    kafka.heal()
