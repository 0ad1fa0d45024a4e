"""Plain values for json.dumps: what the commands' --json prints is their reports, made plain once here."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any


def plain(value: Any) -> Any:
    """Datetimes as ISO 8601, uuids as text, containers walked; everything else as it is."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
