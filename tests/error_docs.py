"""docs/errors.md, derived from the error-condition tables: `python -m tests.error_docs` writes it."""

from __future__ import annotations

import sys

from outbox.core.errors import CORE, Condition, Conditions, merged
from outbox.errors import CONDITIONS as OUTBOX
from outbox.relay.poison import Poison
from outbox_dev.errors import CONDITIONS as DEV
from sinks.errors import CONDITIONS as SINKS
from tests.helpers import REPO

HALVES: dict[str, tuple[str, Conditions]] = {
    "Shared (settings, PostgreSQL, Kafka, the framework's tables, Java)": ("outbox/core/errors.py", CORE),
    "The outbox: add_event(s), the relay, the `outbox` commands": ("outbox/errors.py", OUTBOX),
    "The sink: kafka_rc and PostgresSink": ("sinks/errors.py", SINKS),
    "The dev tools (`outbox dev`, local services, Kafka's Java tools)": (
        "devtools/outbox_dev/errors.py",
        DEV,
    ),
}
PATH = REPO / "docs" / "errors.md"


def all_conditions() -> dict[str, Condition]:
    return merged(*(dict(table.items()) for _, table in HALVES.values()))


def render() -> str:
    lines = [
        "# Errors",
        "",
        "Every error the framework raises for a user to act on has a stable code, which leads its",
        "line: `outbox: error: [RELAY_NAME_INVALID] relay name ...`, or, in a Spark job, the",
        "query's exception text. Match on the code: the words may change. `{field}` is filled in",
        "where the error is raised. Written by `python -m tests.error_docs` from the tables named",
        "below; a test checks that it says the same.",
    ]
    for title, (path, table) in HALVES.items():
        lines += [
            "",
            f"## {title}",
            "",
            f"Declared in `{path}`.",
            "",
            "| code | class | message |",
            "|---|---|---|",
        ]
        for code in table:  # a half's own codes, in their declared order
            condition = table[code]
            words = condition.template.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{code}` | {condition.kind.__name__} | {words} |")
        if table is OUTBOX:  # a class of its own, with fields: outbox/relay/poison.py
            lines.append(f"| `{Poison.code}` | Poison | outbox row {{row_id}}: {{reason}} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    sys.exit(0)
