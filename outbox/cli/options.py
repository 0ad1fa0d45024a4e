"""Options several commands share, declared once."""

from __future__ import annotations

import argparse
import math

from outbox.core.config import OUTBOX_SCHEMA


def database(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--url and --schema: the database and the schema of the framework's tables."""
    p.add_argument("--url", help="PostgreSQL URL (default: env DATABASE_URL)")
    p.add_argument("--schema", help=f"schema of the framework's tables (env {OUTBOX_SCHEMA}, default public)")
    return p


def seconds(text: str) -> float:
    """A wait in seconds: a negative or NaN one waited forever for a broker that is down."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value
