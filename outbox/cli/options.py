"""Options several commands share, declared once."""

from __future__ import annotations

import argparse

from outbox._core.config import OUTBOX_SCHEMA


def database(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--url and --schema: the database and the schema of the framework's tables."""
    p.add_argument("--url", help="PostgreSQL URL (default: env DATABASE_URL)")
    p.add_argument("--schema", help=f"schema of the framework's tables (env {OUTBOX_SCHEMA}, default public)")
    return p
