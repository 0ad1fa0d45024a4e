"""Connecting to PostgreSQL, and a driver failure as one line without the password.

Every command and the sink's driver connect through `connect`, so an
unreachable server reads the same everywhere and no error message carries
a secret from the URL.
"""

from __future__ import annotations

from typing import Any

import psycopg

from core.config import DatabaseUrl
from core.errors import ServiceUnavailable

CONNECT_TIMEOUT = 10  # seconds


def first_line(exc: BaseException) -> str:
    """The first line of an error's text, or its type's name when it has none."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def reason(exc: BaseException, url: DatabaseUrl) -> str:
    """The error's first line with every secret of `url` masked."""
    return url.scrub(first_line(exc))


def connect(
    url: DatabaseUrl,
    *,
    autocommit: bool = False,
    application_name: str | None = None,
    timeout: float = CONNECT_TIMEOUT,
) -> psycopg.Connection[Any]:
    """A connection, or ServiceUnavailable saying where and why, with the usual remedy."""
    extra = {"application_name": application_name} if application_name else {}
    try:
        return psycopg.connect(
            url.libpq, autocommit=autocommit, connect_timeout=max(1, int(timeout)), **extra
        )
    except psycopg.Error as exc:
        raise ServiceUnavailable(
            f"cannot reach PostgreSQL at {url.safe}: {reason(exc, url)}."
            " Check DATABASE_URL, or start a local server with `outbox dev up`."
        ) from None
