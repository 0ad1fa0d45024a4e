"""Secrets from files, as Kubernetes mounts a Secret: each `*_FILE` variable names a file whose
text is the secret (one trailing newline dropped), so that none sits in the environment, argv or
a config file.

    DATABASE_URL_FILE               the whole URL, where DATABASE_URL is not set
    DATABASE_PASSWORD_FILE          the password of the URL's user (a URL that holds none)
    KAFKA_SASL_PASSWORD_FILE        librdkafka's sasl.password (the relay's)
    KAFKA_SSL_KEY_PASSWORD_FILE     librdkafka's ssl.key.password (the relay's)
    SCHEMA_REGISTRY_USER_INFO_FILE  USER:PASSWORD for the registry of SCHEMA_REGISTRY_URL
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from outbox.core.errors import error

DATABASE_URL_FILE = "DATABASE_URL_FILE"
DATABASE_PASSWORD_FILE = "DATABASE_PASSWORD_FILE"
SCHEMA_REGISTRY_USER_INFO_FILE = "SCHEMA_REGISTRY_USER_INFO_FILE"
KAFKA_FILES = {
    "KAFKA_SASL_PASSWORD_FILE": "sasl.password",
    "KAFKA_SSL_KEY_PASSWORD_FILE": "ssl.key.password",
}


def from_file(variable: str) -> str | None:
    """The secret in the file the variable names (None: the variable is not set), or one line."""
    path = os.environ.get(variable)
    if not path:
        return None
    try:
        text = Path(path).read_bytes().decode("utf-8")  # as written: a secret may hold a '\r'
    except OSError as exc:
        raise error(
            "CONFIG_SECRET_FILE_UNREADABLE", variable=variable, file=path, reason=exc.strerror
        ) from None
    except UnicodeDecodeError:
        raise error(
            "CONFIG_SECRET_FILE_UNREADABLE", variable=variable, file=path, reason="not UTF-8"
        ) from None
    secret = text.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise error("CONFIG_SECRET_FILE_EMPTY", variable=variable, file=path)
    return secret


def kafka_secrets() -> dict[str, str]:
    """librdkafka settings from their files, by setting."""
    return {
        key: secret for variable, key in KAFKA_FILES.items() if (secret := from_file(variable)) is not None
    }


def environment_registry(url: str) -> str | dict[str, Any]:
    """The registry of SCHEMA_REGISTRY_URL, with the user info in its file if one is named (only
    for that registry: a URL given in code or a flag never gets these credentials)."""
    user_info = from_file(SCHEMA_REGISTRY_USER_INFO_FILE)
    return url if user_info is None else {"url": url, "basic.auth.user.info": user_info}
