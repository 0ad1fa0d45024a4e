"""The relay's config file: its settings in TOML, under the flags and the environment.

    name = "orders-relay"
    bootstrap-servers = "kafka-0.kafka:9093,kafka-1.kafka:9093"
    on-poison = "halt"
    stop-timeout = 25

    [kafka]                      # librdkafka's settings, as -X gives them
    "security.protocol" = "SASL_SSL"
    "sasl.mechanism" = "SCRAM-SHA-512"
    "sasl.username" = "relay"

Keys are the flags' names without `--` (`batch_size` as well as `batch-size`), and `url`,
`bootstrap-servers` and `schema`. Secrets belong in files of their own (outbox/core/secrets.py).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox.errors import error

# What the file may set beside the declared settings, and the variables that win over each.
CONNECTIONS = {
    "url": "DATABASE_URL",
    "bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "schema": "OUTBOX_SCHEMA",
}


@dataclass(frozen=True)
class ConfigFile:
    values: dict[str, str]  # by setting key, as text a flag would give
    kafka: dict[str, str]  # librdkafka's settings


def read(path: Path, known: set[str]) -> ConfigFile:
    """The file's settings as flag text, or one line naming what is wrong (no value: it may be secret)."""
    try:
        with path.open("rb") as opened:
            data = tomllib.load(opened)
    except OSError as exc:
        raise error("RELAY_CONFIG_UNREADABLE", file=path, reason=exc.strerror) from None
    except tomllib.TOMLDecodeError as exc:
        raise error("RELAY_CONFIG_UNREADABLE", file=path, reason=f"not TOML: {exc}") from None
    values: dict[str, str] = {}
    kafka: dict[str, str] = {}
    for written, value in data.items():
        if written == "kafka" and isinstance(value, dict):
            for key, setting in value.items():
                kafka[key] = _text(path, f"kafka.{key}", setting)
            continue
        key = written.replace("-", "_")
        if key not in known | CONNECTIONS.keys():
            raise error("RELAY_CONFIG_KEY_UNKNOWN", file=path, key=written)
        values[key] = _text(path, written, value)
    return ConfigFile(values, kafka)


def _text(path: Path, key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise error("RELAY_CONFIG_VALUE_INVALID", file=path, key=key, reason="a string, number or boolean")
