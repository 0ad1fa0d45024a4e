"""The flags every bench takes: how many events, how large, and `--json` for one JSON line at the end."""

from __future__ import annotations

import argparse


def parser(doc: str, *, events: int, size_help: str, spark: bool = False) -> argparse.ArgumentParser:
    """spark: the benches that read with Spark also take --partitions and --batches."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--events", type=int, default=events)
    parser.add_argument("--size", type=int, default=200, help=size_help)
    if spark:
        parser.add_argument("--partitions", type=int, default=2)
        parser.add_argument("--batches", type=int, default=5, help="micro-batches the run is split into")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    return parser
