"""How long a Python process Spark starts takes to connect back, idle and on busy cores, against Spark's 10 s.

Spark starts kafka_rc's source runner (classic mode) and a Connect server's foreachBatch process
with `PYTHON -m MODULE` and waits 10 s (a constant) for it to connect back and authenticate.
Each case starts the module under a listening socket that speaks Spark's side of that exchange
and times the start until the process has sent its id: started by this Python (pyspark's own
path: the module's imports first) and by `outbox-spark-python` (the connection first), with the
cores idle and then each shared with LOAD spinning processes.

    python bench/connect_back.py [--starts 3] [--load 3] [--json] [--save]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time

import flags  # bench/flags.py

from sinks.spark_python import worker_python

SPARK_WAITS_S = 10.0
MODULES = {
    "source_runner": "pyspark.sql.streaming.python_streaming_source_runner",
    "foreach_batch": "pyspark.sql.connect.streaming.worker.foreach_batch_worker",
}


def connect_back_s(python: str, module: str) -> float:
    """Seconds from the start of `python -m module` to its process id received, as Spark's wait."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(120)
        secret = "bench"
        env = {
            **os.environ,
            "PYTHON_WORKER_FACTORY_PORT": str(server.getsockname()[1]),
            "PYTHON_WORKER_FACTORY_SECRET": secret,
        }
        began = time.perf_counter()
        process = subprocess.Popen([python, "-m", module], env=env, stderr=subprocess.DEVNULL)
        try:
            conn, _ = server.accept()
            with conn, conn.makefile("rwb") as stream:
                (length,) = struct.unpack("!i", stream.read(4))
                assert stream.read(length).decode() == secret
                stream.write(struct.pack("!i", 2) + b"ok")
                stream.flush()
                assert struct.unpack("!i", stream.read(4)) == (process.pid,)
                return time.perf_counter() - began
        finally:
            process.kill()
            process.wait()


def spinners(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="starts timed per case (the median is kept)")
    parser.add_argument("--load", type=int, default=3, help="spinning processes per core in the busy cases")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument("--save", action="store_true", help="also write it under bench/results/")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    pythons = {"python": sys.executable, "outbox_spark_python": worker_python()}
    if pythons["outbox_spark_python"] == sys.executable:
        sys.exit("bench/connect_back.py: no outbox-spark-python beside this Python (make install)")
    result: dict[str, object] = {"cores": cores, "load_per_core": args.load, "spark_waits_s": SPARK_WAITS_S}
    print(f"connect back, median of {args.starts} starts (Spark waits {SPARK_WAITS_S:.0f} s):")
    for load in ("idle", "busy"):
        running = spinners(cores * args.load) if load == "busy" else []
        try:
            for case, module in MODULES.items():
                for who, python in pythons.items():
                    median = statistics.median(connect_back_s(python, module) for _ in range(args.starts))
                    result[f"{load}_{case}_{who}_s"] = round(median, 3)
                    share = median / SPARK_WAITS_S
                    print(f"  {load:4} {case:13} {who:19} {median:6.2f} s  {share:6.1%} of Spark's wait")
        finally:
            for spinner in running:
                spinner.send_signal(signal.SIGKILL)
                spinner.wait()
    flags.finish("connect_back", result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
