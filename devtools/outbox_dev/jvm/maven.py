"""Jars from Maven Central, resolved once into a cache that later runs and clones reuse.

Each jar set is a small POM under `poms/` with its versions pinned. `mvn
dependency:copy-dependencies` copies its runtime classpath into a folder of
the cache named for the POM's text and properties, so a changed pin gets a new
folder and an unchanged one is never resolved again (nor is `mvn` needed then).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from outbox.core.java import find_java
from outbox_dev.errors import error

OUTBOX_JAR_CACHE = "OUTBOX_JAR_CACHE"
POMS = Path(__file__).with_name("poms")
_DONE = ".complete"


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """OUTBOX_JAR_CACHE, else the user's cache directory: outside any work tree, shared by clones."""
    env = os.environ if environ is None else environ
    if env.get(OUTBOX_JAR_CACHE):
        return Path(env[OUTBOX_JAR_CACHE]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "outbox-eos" / "jars"


def folder_name(pom: str, pom_text: str, properties: Mapping[str, str]) -> str:
    """The cache folder of one resolution: same POM and properties, same folder."""
    digest = hashlib.sha256(pom_text.encode())
    for key, value in sorted(properties.items()):
        digest.update(f"\0{key}={value}".encode())
    return f"{pom}-{digest.hexdigest()[:12]}"


def jars(
    pom: str,
    *,
    what: str,
    instead: str = "",
    properties: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    files: str = "*.jar",
) -> list[Path]:
    """The jar files of `poms/<pom>.xml`, resolving them with Maven the first time.

    what names the set in messages ("Apache Kafka's jars"); instead is the way
    around Maven, appended to the error when it is missing; files: the pattern of
    the artifacts wanted, for a set that is not jars (an application's archive).
    """
    properties = dict(properties or {})
    pom_file = POMS / f"{pom}.xml"
    root = cache_root(environ)
    folder = root / folder_name(pom, pom_file.read_text(), properties)
    if not (folder / _DONE).exists():
        root.mkdir(parents=True, exist_ok=True)
        with locked(root / f".{pom}.lock"):
            if not (folder / _DONE).exists():
                _resolve(pom_file, folder, what, instead, properties, files)
    return sorted(folder.glob(files))


def classpath(jar_files: list[Path]) -> str:
    return os.pathsep.join(str(j) for j in jar_files)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One resolution (or unpacking) at a time per jar set, across processes (parallel test runs)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _resolve(
    pom: Path, folder: Path, what: str, instead: str, properties: dict[str, str], files: str
) -> None:
    mvn = shutil.which("mvn")
    suffix = f", {instead}" if instead else ""
    if mvn is None:
        raise error("DEV_MAVEN_MISSING", what=what, instead=suffix)
    java = find_java(needed_by="Maven")
    partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"outbox: fetching {what} with Maven, once, into {folder}", file=sys.stderr, flush=True)
    argv = [
        mvn,
        "-q",
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
        *(f"-D{key}={value}" for key, value in properties.items()),
    ]
    # -XX:-UsePerfData: Maven's JVM leaves no /tmp/hsperfdata_<user> behind.
    opts = f"{os.environ.get('MAVEN_OPTS', '')} -XX:-UsePerfData".strip()
    env = {**os.environ, "JAVA_HOME": str(java.path.resolve().parent.parent), "MAVEN_OPTS": opts}
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        raise error("DEV_MAVEN_TIMEOUT", what=what, instead=suffix) from None
    if result.returncode != 0 or not any(partial.glob(files)):
        shutil.rmtree(partial, ignore_errors=True)
        raise error(
            "DEV_MAVEN_FAILED", what=what, reason=_first_error(result.stdout + result.stderr), instead=suffix
        )
    (partial / _DONE).touch()
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def _first_error(output: str) -> str:
    errors = [line.removeprefix("[ERROR]").strip() for line in output.splitlines() if "[ERROR]" in line]
    lines = errors or [line.strip() for line in output.splitlines() if line.strip()] or ["no output"]
    return lines[0][:300]
