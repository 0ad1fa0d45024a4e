"""The relay's flags: one table drives argparse, and the relay table in docs/relay.md says the same."""

from __future__ import annotations

import re

import pytest

from outbox.cli import build_parser
from outbox.cli.relay import SETTINGS
from tests.helpers import REPO


def docs_relay_table() -> list[list[str]]:
    """The rows of the `| flag | variable | default |` table in docs/relay.md's `outbox relay` section."""
    text = (REPO / "docs" / "relay.md").read_text()
    section = text[text.index("\n## Publishing the outbox to Kafka exactly once") + 1 :]
    end = section.find("\n## ")
    section = section[: end if end > 0 else None]
    table = section[section.index("| flag | variable | default |") :].split("\n\n")[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_every_setting_has_its_docs_row_with_its_variable_and_default() -> None:
    rows = docs_relay_table()
    for setting in SETTINGS:
        row = next((r for r in rows if f"`{setting.flag}" in r[0]), None)
        assert row is not None, f"docs/relay.md's relay table has no row for {setting.flag}"
        assert row[1] == f"`{setting.env}`", (
            f"{setting.flag}: docs/relay.md says {row[1]}, the code {setting.env}"
        )
        if setting.default is None:
            continue
        assert re.search(rf"(?<![\w.]){re.escape(setting.default)}(?![\w.])", row[2]), (
            f"{setting.flag}: docs/relay.md's default {row[2]!r} is not the code's {setting.default!r}"
        )


def test_every_docs_row_names_flags_the_relay_has() -> None:
    relay = build_parser()._subparsers._group_actions[0].choices["relay"]  # type: ignore[union-attr]
    known = {option for action in relay._actions for option in action.option_strings}
    for row in docs_relay_table():
        for flag in re.findall(r"`(-{1,2}[\w-]+)", row[0]):
            assert flag in known, (
                f"docs/relay.md's relay table names {flag}, which `outbox relay` does not take"
            )


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.flag)
def test_the_variable_is_the_default_and_the_flag_wins(setting, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    value = {"--kafka-config": "/etc/relay.properties"}.get(setting.flag) or (setting.choices or ("7",))[-1]
    monkeypatch.setenv(setting.env, value)
    dest = setting.flag.lstrip("-").replace("-", "_")
    parsed = build_parser().parse_args(["relay"])
    assert str(getattr(parsed, dest)) == str(setting.type(value)), "the variable is the default"
    flag_value = (setting.choices or ("9",))[0] if setting.flag != "--kafka-config" else "/other"
    parsed = build_parser().parse_args(["relay", setting.flag, flag_value])
    assert str(getattr(parsed, dest)) == str(setting.type(flag_value)), "the flag wins over the variable"
