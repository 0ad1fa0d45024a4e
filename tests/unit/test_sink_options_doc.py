"""PostgresSink's keywords: each declared once (sinks/postgres/settings.py); its signature, its
docstring and docs/sink.md's options table say what the declarations say."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from outbox.core.errors import ConfigError
from sinks.postgres import PostgresSink
from sinks.postgres.settings import MODE, SETTINGS
from tests.helpers import REPO

KEYWORDS = {
    p.name: p.default
    for p in inspect.signature(PostgresSink.__init__).parameters.values()
    if p.kind is p.KEYWORD_ONLY
}


def test_every_keyword_is_declared_once_and_takes_its_default_from_there() -> None:
    assert sorted(s.name for s in SETTINGS) == sorted(KEYWORDS)
    for setting in SETTINGS:
        assert KEYWORDS[setting.name] == setting.default, setting.name


def test_the_docstring_documents_every_parameter_once() -> None:
    doc = inspect.getdoc(PostgresSink) or ""
    section = doc.split("Parameters\n----------\n", 1)[1].split("\n\nRaises", 1)[0]
    documented = re.findall(r"^(\w+) : ", section, re.M)
    assert documented == ["table", *KEYWORDS], "in the signature's order, each once"


def python(value: Any) -> str:
    """A default as Python writes it."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def options_table() -> str:
    rows = ["| keyword | default | what it does |", "|---|---|---|"]
    for setting in SETTINGS:
        default = "-" if setting.default is None else f"`{python(setting.default)}`"
        rows.append(f"| `{setting.name}` | {default} | {setting.doc} |")
    return "\n".join(rows)


def test_docs_sink_md_holds_the_table_the_declarations_make() -> None:
    text = (REPO / "docs" / "sink.md").read_text()
    assert options_table() in text, f"docs/sink.md's options table should read:\n\n{options_table()}\n"


def test_the_docstring_gives_each_declared_default() -> None:
    doc = PostgresSink.__doc__ or ""
    for setting in SETTINGS:
        said = f"{setting.name} : "
        assert said in doc, f"the docstring does not describe {setting.name}"
        line = doc[doc.index(said) :].splitlines()[0]
        if setting.default is None:
            assert "optional" in line, line
        else:
            assert f"default {python(setting.default)}" in line, line


def test_a_bad_keyword_is_one_line_naming_the_sink_and_the_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        PostgresSink("orders", url="postgresql://u@h/d", mode="merge")  # type: ignore[arg-type]  # the mistake under test
    assert caught.value.code == "SETTING_NOT_A_CHOICE"
    choices = ", ".join(MODE.choices or ())
    said = f"[SETTING_NOT_A_CHOICE] PostgresSink's mode must be one of {choices}, got 'merge'"
    assert str(caught.value) == said
