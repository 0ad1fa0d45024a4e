"""kafka_rc's options: docs/source.md's table is the declarations' (sinks/kafka_source/options.py)."""

from __future__ import annotations

from sinks.kafka_source.options import OPTIONS
from tests.helpers import REPO


def options_table() -> str:
    rows = ["| option | default | what it does |", "|---|---|---|"]
    for option in OPTIONS:
        default = f"`{option.shown}`" if option.shown is not None else "-"
        rows.append(f"| `{option.name}` | {default} | {option.doc} |")
    return "\n".join(rows)


def test_docs_source_md_holds_the_options_table_the_declarations_make() -> None:
    text = (REPO / "docs" / "source.md").read_text()
    assert options_table() in text, f"docs/source.md's options table should read:\n\n{options_table()}\n"
