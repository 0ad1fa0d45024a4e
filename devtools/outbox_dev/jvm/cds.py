"""Class-data archives (AppCDS) for the JVMs the dev tools start: made once, then mapped.

A JVM that lives seconds spends much of its CPU reading, parsing and verifying classes. A
dynamic archive of the classes one run loaded lets the next runs map them instead. Measured on
two cores: a broker's start 2.3 -> 1.5 CPU-seconds, Kafka's console consumer 1.15 -> 0.7.

An archive fits one Java and one class path, so it is named for both and kept in the jar cache,
which clones share. A JVM it does not fit (another Java, a changed path) loads its classes as
before and says nothing. The archive is made by a JVM that exits on its own (JDK 17 writes it at
exit, `-XX:ArchiveClassesAtExit`), one process at a time, and kept only if that JVM succeeded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from outbox_dev.jvm import maven

__all__ = ["Making", "archive", "making", "mapped"]

QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive(name: str, java: Path, classpath: str) -> Path:
    """Where the archive of `name`'s JVMs of this Java and class path is, made or not."""
    real = java.resolve()
    digest = hashlib.sha256(f"{real}|{real.stat().st_mtime_ns}|{classpath}".encode()).hexdigest()[:16]
    return maven.cache_root() / "cds" / f"{name}-{digest}.jsa"


def mapped(path: Path) -> list[str]:
    """The options that map the archive, if it is made."""
    return [f"-XX:SharedArchiveFile={path}", *QUIET] if path.exists() else []


@dataclass
class Making:
    """The options of a JVM run under `making`; set `succeeded` once it exited as it should."""

    options: list[str]
    makes: bool = False  # whether this JVM writes the archive
    succeeded: bool = field(default=False)


@contextlib.contextmanager
def making(path: Path) -> Iterator[Making]:
    """Options for one JVM: to map the archive if it is made; to make it at the JVM's exit if it
    is not and no other process is making it; else none (that JVM loads its classes as before)."""
    if path.exists():
        yield Making(mapped(path))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield Making([])
            return
        if path.exists():  # made meanwhile
            yield Making(mapped(path))
            return
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        run = Making([f"-XX:ArchiveClassesAtExit={partial}", *QUIET], makes=True)
        try:
            yield run
        finally:
            if run.succeeded and partial.exists():
                partial.rename(path)
            else:
                partial.unlink(missing_ok=True)
