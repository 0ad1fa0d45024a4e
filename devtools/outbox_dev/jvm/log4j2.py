"""Log4j2 settings for a Java program we run (the broker, Kafka Connect): INFO and up into one file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def file_config(log: Path, levels: Mapping[str, str] | None = None) -> str:
    """A log4j2.properties text; levels: logger name -> level, for the chatty ones."""
    lines = [
        "rootLogger.level = info",
        "rootLogger.appenderRef.file.ref = file",
        "appender.file.type = File",
        "appender.file.name = file",
        f"appender.file.fileName = {log}",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n",
    ]
    for i, (name, level) in enumerate((levels or {}).items()):
        lines += [f"logger.l{i}.name = {name}", f"logger.l{i}.level = {level}"]
    return "\n".join(lines) + "\n"
