"""A local SparkSession for the demo, tests and development.

Sets what makes a local session work on the first try: the driver's own
Python for workers (else they "fail to connect back"), the loopback address,
and every scratch directory inside one folder the caller owns, so a killed
run leaves nothing in /tmp.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from outbox.jvm import maven
from outbox.jvm.java import find_java


def local_session(
    work_dir: Path,
    *,
    app_name: str = "outbox",
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    jars: Sequence[Path] = (),
) -> SparkSession:
    """jars: local jar files for the session (Spark's `--packages` may not reach Maven here)."""
    java = find_java()
    os.environ.setdefault("JAVA_HOME", str(java.path.resolve().parent.parent))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's launcher JVM, like the driver, must not leave /tmp/hsperfdata_<user> behind.
    if "-XX:-UsePerfData" not in os.environ.get("SPARK_LAUNCHER_OPTS", ""):
        os.environ["SPARK_LAUNCHER_OPTS"] = (
            os.environ.get("SPARK_LAUNCHER_OPTS", "") + " -XX:-UsePerfData"
        ).strip()
    work_dir = work_dir.resolve()
    scratch = work_dir / "spark-local"
    scratch.mkdir(parents=True, exist_ok=True)
    log_config = Path(__file__).with_name("log4j2.properties")
    java_tmp = f"-Djava.io.tmpdir={scratch} -Dlog4j2.configurationFile={log_config} -XX:-UsePerfData"
    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.local.dir": str(scratch),
        "spark.driver.extraJavaOptions": java_tmp,
        "spark.executor.extraJavaOptions": java_tmp,
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        **({"spark.jars": ",".join(str(j) for j in jars)} if jars else {}),
        **(conf or {}),
    }
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def kafka_connector_jars() -> list[Path]:
    """Spark's own Kafka source (`format("kafka")`) and what it needs beyond pyspark's jars."""
    return maven.jars(
        "spark-kafka",
        what="Spark's Kafka connector jars",
        instead="or use the kafka_rc source, which needs no jars",
    )


def stop_session(spark: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session and wait for its JVM to exit, so nothing outlives the caller."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
    if proc is not None:
        if proc.stdin:
            proc.stdin.close()  # the JVM exits on EOF of its stdin
        try:
            proc.wait(timeout)
        except Exception:
            proc.kill()
            proc.wait(timeout)
