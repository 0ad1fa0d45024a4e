"""The flags every bench takes, and how each ends: its figures as one JSON line, and kept.

`--json` ends the output with one JSON object; `--save` also writes it, with
the run's command, commit and machine, as dated JSON under bench/results/, so
figures quoted in the docs can be traced to a run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def parser(doc: str, *, events: int, size_help: str, spark: bool = False) -> argparse.ArgumentParser:
    """spark: the benches that read with Spark also take --partitions and --batches."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--events", type=int, default=events)
    parser.add_argument("--size", type=int, default=200, help=size_help)
    if spark:
        parser.add_argument("--partitions", type=int, default=2)
        parser.add_argument("--batches", type=int, default=5, help="micro-batches the run is split into")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument(
        "--save", action="store_true", help="also write it as bench/results/DATE-BENCH.json, with the machine"
    )
    return parser


def finish(bench: str, result: dict[str, Any], args: argparse.Namespace) -> None:
    """The run's last line (--json) and its kept copy (--save)."""
    if args.json:
        print(json.dumps(result))
    if args.save:
        now = datetime.now(UTC)
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{now:%Y-%m-%dT%H%M%SZ}-{bench}.json"
        run = {"bench": bench, "at": now.isoformat(timespec="seconds"), **_where()}
        path.write_text(json.dumps({"run": run, "result": result}, indent=1) + "\n")
        print(f"saved in {path.relative_to(RESULTS.parent.parent)}", file=sys.stderr)


def _where() -> dict[str, Any]:
    """The command, the commit and the machine a run's figures belong to."""
    root = str(RESULTS.parent.parent)  # pathspecs are relative to -C's folder: the repository's root
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", root, "status", "--porcelain", "--", "outbox", "sinks", "bench"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "command": " ".join(["python", *sys.argv]),
        "commit": f"{commit}{'+changes' if dirty else ''}" or None,
        "machine": {
            "cores": os.cpu_count(),
            "memory_gib": round(memory / 2**30, 1),
            "cpu": _cpu_model(),
            "system": platform.platform(),
            "python": platform.python_version(),
        },
    }


def _cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
