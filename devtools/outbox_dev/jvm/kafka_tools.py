"""Apache Kafka's own command-line tools, run from their published jars (`poms/kafka-tools.xml`).

The console consumer is the reader this project did not write: the fault
tests check with it, read_committed, what `outbox verify` checks. Its output
is one line per record, `Partition:P<TAB>Offset:O<TAB>headers<TAB>key<TAB>value`.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from outbox.core.java import find_java
from outbox_dev.errors import error
from outbox_dev.jvm import JVM_FLAGS, cds, log4j2, maven

WHAT = "Apache Kafka's command-line tools"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


@dataclass(frozen=True)
class ConsoleRecord:
    partition: int
    offset: int
    headers: dict[str, str]
    key: str | None
    value: str | None


def run(main_class: str, args: Sequence[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """One of Kafka's tools; its own logging goes to a file that is deleted after, not to stdout."""
    java = find_java(needed_by=WHAT)
    classpath = maven.classpath(maven.jars("kafka-tools", what=WHAT))
    archive = cds.archive("kafka-tools", java.path, classpath)
    with cds.making(archive) as jvm, tempfile.TemporaryDirectory(prefix="kafka-tools-") as scratch:
        config = Path(scratch) / "log4j2.properties"
        config.write_text(log4j2.file_config(Path(scratch) / "tool.log", {"org.apache.kafka": "warn"}))
        log = f"-Dlog4j2.configurationFile={config}"
        argv = [str(java.path), *JVM_FLAGS, *jvm.options, log, "-cp", classpath, main_class, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        jvm.succeeded = done.returncode == 0
        return done


def console_consume(
    bootstrap: str, topic: str, *, idle_ms: int = 5_000, expected: bool = False, values: bool = True
) -> list[ConsoleRecord]:
    """Every committed record of `topic`, read_committed from the beginning, until none came for idle_ms.

    The wait counts from the consumer's first poll, its start included (metadata, its group's join,
    the first offsets): on a loaded machine that took longer than idle_ms, and the consumer ended
    having read nothing (its group assigned 0.25 s before it left). Where records are `expected`, a
    run that read none is read again once, with a longer wait; a topic that is empty still reads as
    empty, and the check of its records then fails. values=False: no value is printed (binary ones,
    Avro or Protobuf, would break the lines); each record's value reads None.
    """
    records = _console_consume(bootstrap, topic, idle_ms, values)
    if expected and not records:
        records = _console_consume(bootstrap, topic, max(idle_ms, 30_000), values)
    return records


def _console_consume(bootstrap: str, topic: str, idle_ms: int, values: bool) -> list[ConsoleRecord]:
    printed = [f"print.{what}=true" for what in ("partition", "offset", "headers", "key")]
    printed += [] if values else ["print.value=false"]
    args = [
        *("--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning"),
        *("--isolation-level", "read_committed", "--timeout-ms", str(idle_ms)),
        *(arg for prop in [*printed, "key.separator=\t"] for arg in ("--property", prop)),
    ]
    done = run(CONSOLE_CONSUMER, args)
    if "Processed a total of" not in done.stderr:
        raise error("DEV_CONSOLE_CONSUMER_FAILED", topic=topic, output=done.stderr.strip()[:500])
    return [parse(line) for line in done.stdout.splitlines() if line.startswith("Partition:")]


def parse(line: str) -> ConsoleRecord:
    partition, offset, headers, key, *rest = line.split("\t", 4)
    value = rest[0] if rest else "null"
    pairs = [] if headers == "NO_HEADERS" else [h.split(":", 1) for h in headers.split(",")]
    return ConsoleRecord(
        int(partition.removeprefix("Partition:")),
        int(offset.removeprefix("Offset:")),
        {k: v for k, v in pairs},
        None if key == "null" else key,
        None if value == "null" else value,
    )


def transactions(bootstrap: str, *args: str) -> list[dict[str, str]]:
    """`kafka-transactions` (TransactionsCommand) with `args`; its table, one dict per row."""
    done = run(TRANSACTIONS, ["--bootstrap-server", bootstrap, *args], timeout=120)
    if done.returncode != 0:
        raise error("DEV_KAFKA_TRANSACTIONS_FAILED", args=" ".join(args), output=done.stderr.strip()[:500])
    return table(done.stdout)


def reassign(bootstrap: str, topic: str, replicas: dict[int, list[int]], timeout: float = 120) -> None:
    """`kafka-reassign-partitions`: `topic`'s partitions moved onto `replicas` (partition -> node
    ids), returned once Kafka says every move is completed."""
    reassign_partitions(bootstrap, {(topic, p): nodes for p, nodes in replicas.items()}, timeout)


def reassign_partitions(
    bootstrap: str, replicas: dict[tuple[str, int], list[int]], timeout: float = 120
) -> None:
    """`kafka-reassign-partitions` for partitions of any topics, (topic, partition) -> node ids, in
    one plan; returned once Kafka says every move is completed."""
    moves = [{"topic": t, "partition": p, "replicas": nodes} for (t, p), nodes in sorted(replicas.items())]
    topic = ", ".join(sorted({t for t, _ in replicas}))
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="kafka-reassign-") as scratch:
        plan = Path(scratch) / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": moves}))
        common = ["--bootstrap-server", bootstrap, "--reassignment-json-file", str(plan)]
        done = run(REASSIGN, [*common, "--execute"], timeout=timeout)
        while done.returncode == 0 and time.monotonic() < deadline:
            done = run(REASSIGN, [*common, "--verify"], timeout=timeout)
            if "in progress" not in done.stdout:
                break
            time.sleep(1)
    if done.returncode != 0 or "is completed" not in done.stdout:
        said = (done.stdout + done.stderr).strip()
        raise error("DEV_KAFKA_REASSIGN_FAILED", topic=topic, output=said[:500])


def table(text: str) -> list[dict[str, str]]:
    """The tools' tables: a header line, then rows, columns separated by tabs (or runs of spaces)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    split = (lambda line: line.split("\t")) if "\t" in lines[0] else str.split
    header = [h.strip() for h in split(lines[0])]
    rows = [dict(zip(header, (c.strip() for c in split(line)), strict=False)) for line in lines[1:]]
    return [{k: v for k, v in row.items() if k} for row in rows]  # a trailing tab is no column
