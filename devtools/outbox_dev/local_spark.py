"""A local SparkSession for the demo, tests and development (or a Spark Connect one: SPARK_REMOTE).

Sets what makes a local session work on the first try: the driver's own
Python for workers, as `outbox-spark-python`, which connects back to Spark
before its imports (else they "fail to connect back"), the loopback address,
and every scratch directory inside one folder the caller owns, so a killed
run leaves nothing in /tmp.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from outbox.core.java import find_java
from outbox_dev.jvm import maven
from sinks.spark_python import worker_python


def local_session(
    work_dir: Path,
    *,
    app_name: str = "outbox",
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    jars: Sequence[Path] = (),
) -> SparkSession:
    """jars: local jar files for the session (Spark's `--packages` may not reach Maven here).

    With SPARK_REMOTE set (`sc://host:port`, as pyspark itself reads it), a Spark
    Connect session to that server instead: `master` and `jars` are the
    server's then, and of `conf` only the runtime SQL settings apply.
    """
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        session = SparkSession.builder.remote(remote).getOrCreate()
        for key, value in {**RUNTIME, **(conf or {})}.items():
            if key.startswith("spark.sql."):
                session.conf.set(key, value)
        return session
    prepare_environment()
    builder = SparkSession.builder
    for key, value in session_settings(
        work_dir, app_name=app_name, master=master, conf=conf, jars=jars
    ).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def prepare_environment(env: MutableMapping[str, str] = os.environ) -> MutableMapping[str, str]:
    """What a Spark JVM (and the Python workers it starts) needs in its environment to work on the
    first try: Java, this Python for workers (sinks.spark_python: else they "fail to connect
    back"), the loopback address, and no /tmp/hsperfdata_<user> left behind by the launcher."""
    java = find_java()
    env.setdefault("JAVA_HOME", str(java.path.resolve().parent.parent))
    env["PYSPARK_PYTHON"] = worker_python()
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if "-XX:-UsePerfData" not in env.get("SPARK_LAUNCHER_OPTS", ""):
        env["SPARK_LAUNCHER_OPTS"] = (env.get("SPARK_LAUNCHER_OPTS", "") + " -XX:-UsePerfData").strip()
    return env


# Settings a client may change in a running session, Spark Connect's too.
RUNTIME = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def session_settings(
    work_dir: Path,
    *,
    app_name: str = "outbox",
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    jars: Sequence[Path] = (),
) -> dict[str, str]:
    """A local driver's settings: loopback, quiet, every scratch directory inside `work_dir`."""
    work_dir = work_dir.resolve()
    scratch = work_dir / "spark-local"
    scratch.mkdir(parents=True, exist_ok=True)
    log_config = Path(__file__).with_name("log4j2.properties")
    java_tmp = f"-Djava.io.tmpdir={scratch} -Dlog4j2.configurationFile={log_config} -XX:-UsePerfData"
    return {
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
        "spark.python.worker.reuse": "true",
        **RUNTIME,
        **({"spark.jars": ",".join(str(j) for j in jars)} if jars else {}),
        **(conf or {}),
    }


def kafka_connector_jars() -> list[Path]:
    """Spark's own Kafka source (`format("kafka")`) and what it needs beyond pyspark's jars."""
    return maven.jars(
        "spark-kafka",
        what="Spark's Kafka connector jars",
        instead="or use the kafka_rc source, which needs no jars",
    )


def stop_session(spark: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session and wait for its JVM to exit, so nothing outlives the caller (a Spark Connect
    session: release it on the server, which lives on)."""
    if os.environ.get("SPARK_REMOTE"):
        spark.stop()
        return
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
