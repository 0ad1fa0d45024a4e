"""Log lines as JSON objects (one per line) or as text, for daemons whose logs are machine-read."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from outbox.core.kafka import CLIENT_LOG

# Attributes every LogRecord has; anything else came in through `extra=` and is a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        return f"{super().format(record)} {fields}".rstrip()


def configure(fmt: str, level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The Kafka client's own log lines only with debug logging (--verbose): the CLI is the
    # application here, so it may set the level the library leaves alone (outbox.core.kafka).
    if level <= logging.DEBUG:
        logging.getLogger(CLIENT_LOG).setLevel(logging.DEBUG)
