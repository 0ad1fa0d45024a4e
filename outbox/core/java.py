"""Find a Java runtime for Spark and the embedded Kafka broker, or say how to get one.

Without this, a missing or old Java surfaces as a gateway error from deep in
PySpark, or a broker that never answers, long after the job started.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from outbox.core.errors import error

MIN_MAJOR = 17  # the errors' words say how to install it (outbox/core/errors.py)


@dataclass(frozen=True)
class Java:
    path: Path
    major: int


def parse_major(version_output: str) -> int | None:
    """The major version from `java -version` output ("17.0.15", "1.8.0_392" -> 8)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java(
    environ: dict[str, str] | None = None, *, needed_by: str = "Spark", minimum: int = MIN_MAJOR
) -> Java:
    env = dict(os.environ if environ is None else environ)
    home = env.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is None or not candidate.exists():
        found = shutil.which("java", path=env.get("PATH"))
        if candidate is not None and found is None:
            raise error("JAVA_HOME_INVALID", home=home)
        candidate = Path(found) if found else None
    if candidate is None:
        raise error("JAVA_MISSING", needed_by=needed_by, minimum=minimum)
    try:
        stat = candidate.stat()
    except OSError as exc:
        raise error("JAVA_VERSION_FAILED", java=candidate, reason=exc) from None
    major = _major(str(candidate.resolve()), stat.st_mtime_ns, stat.st_size)
    if major is None or major < minimum:
        found_version = major if major is not None else "an unknown version"
        raise error("JAVA_TOO_OLD", needed_by=needed_by, minimum=minimum, java=candidate, found=found_version)
    return Java(candidate, major)


@cache
def _major(java: str, mtime_ns: int, size: int) -> int | None:
    """Run `java -version` once per binary and process: a JVM's start costs a third of a CPU-second,
    and the dev tools ask before every broker, Spark session and console consumer they start. The
    binary's time and size are in the key, so a Java replaced in place is asked again."""
    try:
        # -XX:-UsePerfData: no /tmp/hsperfdata_<user> left behind.
        out = subprocess.run(
            [java, "-XX:-UsePerfData", "-version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise error("JAVA_VERSION_FAILED", java=java, reason=exc) from None
    return parse_major(out.stderr + out.stdout)
