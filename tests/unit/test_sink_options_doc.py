"""PostgresSink's keywords: its signature, its docstring and the docs' options table say the same."""

from __future__ import annotations

import inspect
import re

from sinks.postgres import PostgresSink
from tests.helpers import REPO

KEYWORDS = {
    p.name: p.default
    for p in inspect.signature(PostgresSink.__init__).parameters.values()
    if p.kind is p.KEYWORD_ONLY
}


def test_the_docstring_documents_every_parameter_once() -> None:
    doc = inspect.getdoc(PostgresSink) or ""
    section = doc.split("Parameters\n----------\n", 1)[1].split("\n\nRaises", 1)[0]
    documented = re.findall(r"^(\w+) : ", section, re.M)
    assert documented == ["table", *KEYWORDS], "in the signature's order, each once"


def _shown(default: object) -> set[str]:
    """How the docs' table may show a default."""
    if isinstance(default, str):
        return {f'"{default}"'}
    if isinstance(default, float):
        return {f"{default:g}"}
    return {str(default)}


def test_the_docs_options_table_names_every_keyword_with_its_default() -> None:
    text = (REPO / "docs" / "sink.md").read_text()
    table = text.split("**Options** (`PostgresSink(table, ...)`):", 1)[1].split("\n\n", 2)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    named = {name.strip("` ") for row in rows for name in row[0].split(",")}
    assert named == set(KEYWORDS)
    for row in rows:
        name, default = row[0].strip("`"), row[1].strip("`")
        if "," not in name and KEYWORDS[name] is not None:
            assert default in _shown(KEYWORDS[name]), (name, default, KEYWORDS[name])
