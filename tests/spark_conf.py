"""The Spark settings every Spark JVM of the tests reads, and a class-data archive for their drivers.

The tests start some hundreds of Spark drivers, each for seconds over a few thousand records, on
two shared cores. Two settings cut the CPU each one spends before its first batch:

- C1 only (`-XX:TieredStopAtLevel=1`): C2's compiler threads cost such
  short lives more than C2's code gives back (`test_builtin_source` + `test_connect` 364 -> 292
  CPU-seconds, a kill -9 case of `test_sink_tasks_faults` 141 -> 112, measured).
- A dynamic class-data archive (JDK 13+ AppCDS) of the classes a local driver loads, made once per
  Java, pyspark and checkout by one small workload: a driver then maps Spark's classes instead of
  parsing and verifying them (a local session's start and two queries, 7.3 -> 4.0 CPU-seconds).

A third setting cuts what idle streams cost. Under the default trigger, Spark asks an idle stream's
source for new offsets every 10 ms, and each ask of kafka_rc is a Python call and a metadata and
offsets request to the broker: one idle kafka_rc stream kept its broker, the source's Python runner
and the driver's JVM busy for about half a core; every 100 ms, an eighth of a core. The tests ask
every 250 ms (`test_sink_tasks`, `test_kafka_source` and `test_sink_rewind` 122 -> 109 CPU-seconds
in all from 100 ms, measured; 500 ms gave no more).

A fourth cuts what each Python worker costs. pyspark's daemon forks one per concurrent task, and
each imported what its task needs after the fork: about a CPU-second per worker, four per sink
job. `outbox_dev.spark_daemon` imports those modules once, before it forks, starting no thread
(a sink job's Python processes 9.3 -> 7.7 CPU-seconds; `test_sink_tasks`, `test_kafka_source` and
`test_sink_rewind` 140 -> 122 CPU-seconds in all, measured).

The archive only fits a JVM whose class path starts as the workload's did. Spark's launcher puts
`SPARK_CONF_DIR` ahead of its jars, and the JDK refuses to archive past a non-empty directory, so
the conf puts pyspark's jars on `spark.driver.extraClassPath`, ahead of the conf dir: the classes
come from there, and the same jars later on the path are never read. Those jars are a copy (hard
links where it can) in the dev tools' cache, named for their pyspark, and the archive sits beside
them: each clone's venv has its jars at a path of its own, but every clone's JVMs have the same
class path up to its conf dir, so the archive is made once a machine, not once a clone (a clean
clone's `make test` does not wait 40 s for it). A standalone cluster's executors get the same
options; a JVM whose path differs (a driver with jars of its own on its class path) loads its
classes as before, silently.
The benches and users keep their JVMs' defaults.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
from pyspark.sql import DataFrame

from outbox.core.java import find_java
from outbox_dev.jvm import cds, maven

__all__ = ["prepare"]

C1 = "-XX:TieredStopAtLevel=1"
JARS = Path(pyspark.__file__).parent / "jars"
# How long an idle stream waits before it asks its source again; Spark's default is 10 ms.
POLLING_DELAY = "250ms"


def conf(jars: Path, archive: Path | None) -> str:
    """The text of `spark-defaults.conf`: the archive's option only once it exists."""
    options = f"{C1} {' '.join(cds.mapped(archive))}" if archive else C1
    return (
        "# Written by tests/spark_conf.py, which says why.\n"
        f"spark.driver.defaultJavaOptions {options}\n"
        f"spark.executor.defaultJavaOptions {options}\n"
        f"spark.driver.extraClassPath {jars}/*\n"
        f"spark.executor.extraClassPath {jars}/*\n"
        f"spark.sql.streaming.pollingDelay {POLLING_DELAY}\n"
        "spark.python.daemon.module outbox_dev.spark_daemon\n"
    )


def shared_jars() -> Path:
    """pyspark's jars at a path every clone shares: linked (copied across file systems) into the
    dev tools' cache once per pyspark, under a name its version and its jars give."""
    found = sorted((f.name, f.stat().st_size) for f in JARS.glob("*.jar"))  # what `jars/*` names
    digest = hashlib.sha256(f"{pyspark.__version__}|{found}".encode()).hexdigest()[:12]
    folder = maven.cache_root() / "pyspark-jars" / f"{pyspark.__version__}-{digest}"
    if folder.exists():
        return folder
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, _ in found:
        try:
            os.link(JARS / name, partial / name)
        except OSError:
            shutil.copy2(JARS / name, partial / name)
    try:
        partial.rename(folder)
    except OSError:  # another run linked them first
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def prepare(root: Path) -> Path:
    """Write the conf dir under `root`, and make the machine's archive if missing; return the conf dir.

    Run once before any test JVM starts (by `make spark-archive` beside mypy, and by pytest's
    controller). If another run is making the archive, or the workload fails, the conf goes
    without it: the tests then run as they did, only slower.
    """
    conf_dir = root / "spark-conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    jars = shared_jars()
    archive = cds.archive("spark-driver", find_java(needed_by="The tests' Spark").path, f"{jars}/*")
    with cds.making(archive) as run:
        if run.makes:
            (conf_dir / "spark-defaults.conf").write_text(conf(jars, None))
            done = subprocess.run(
                [sys.executable, "-m", "tests.spark_conf", "--workload", " ".join(run.options)],
                env={**os.environ, "SPARK_CONF_DIR": str(conf_dir)},
                cwd=Path(__file__).parent.parent,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            run.succeeded = done.returncode == 0
            if not run.succeeded:
                print(f"tests/spark_conf.py: no class-data archive ({done.stderr.strip()[-300:]})")
    (conf_dir / "spark-defaults.conf").write_text(conf(jars, archive if archive.exists() else None))
    return conf_dir


def workload(options: str) -> None:
    """What a test's driver does, in small: batch and streaming queries, Arrow, Python rows."""
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Rows(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rows"

        def schema(self) -> str:
            return "id int"

        def reader(self, schema: object) -> DataSourceReader:
            return RowsReader()

    class RowsReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
            yield from ((i,) for i in range(10))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.extraJavaOptions", options)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.dataSource.register(Rows)
    spark.read.format("rows").load().groupBy().sum("id").collect()
    frame = spark.createDataFrame([(1, "a", 1.5)], "k int, v string, d double")
    frame.mapInArrow(lambda batches: batches, frame.schema).collect()
    frame.groupBy("k").count().toPandas()
    stream = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    query = stream.writeStream.foreachBatch(count).trigger(once=True).start()
    query.awaitTermination(120)
    spark.stop()


def count(batch: DataFrame, _: int) -> None:
    batch.count()


if __name__ == "__main__":  # `make spark-archive`: before pytest, beside mypy
    if sys.argv[1:2] == ["--workload"]:
        workload(sys.argv[2])
    else:
        prepare(Path(__file__).resolve().parent.parent / ".tmp")
