"""The relay's flags: its declared settings drive argparse; docs/relay.md's relay table says the same."""

from __future__ import annotations

import re

import pytest

from outbox.cli import build_parser
from outbox.relay.settings import SETTINGS
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
        row = next((r for r in rows if f"`{setting.name}" in r[0]), None)
        assert row is not None, f"docs/relay.md's relay table has no row for {setting.name}"
        assert row[1] == f"`{setting.env}`", (
            f"{setting.name}: docs/relay.md says {row[1]}, the code {setting.env}"
        )
        if setting.shown is None:
            continue
        assert re.search(rf"(?<![\w.]){re.escape(setting.shown)}(?![\w.])", row[2]), (
            f"{setting.name}: docs/relay.md's default {row[2]!r} is not the code's {setting.shown!r}"
        )


def test_every_docs_row_names_flags_the_relay_has() -> None:
    relay = build_parser()._subparsers._group_actions[0].choices["relay"]  # type: ignore[union-attr]
    known = {option for action in relay._actions for option in action.option_strings}
    for row in docs_relay_table():
        for flag in re.findall(r"`(-{1,2}[\w-]+)", row[0]):
            assert flag in known, (
                f"docs/relay.md's relay table names {flag}, which `outbox relay` does not take"
            )


_GIVEN = {
    "--kafka-config": ("/etc/relay.properties", "/other"),
    "--shard": ("1/4", "3/8"),
    "--no-cleanup": ("true", "false"),
}


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_the_variable_is_the_default_and_the_flag_wins(setting, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    variable, flag = _GIVEN.get(setting.name) or (
        (setting.choices or ("7",))[-1],
        (setting.choices or ("9",))[0],
    )
    monkeypatch.setenv(setting.env, variable)
    parsed = build_parser().parse_args(["relay"])
    assert getattr(parsed, setting.key) == setting.read(variable), "the variable is the default"
    parsed = build_parser().parse_args(["relay", setting.name, flag])
    assert getattr(parsed, setting.key) == setting.read(flag), "the flag wins over the variable"


def test_a_switch_given_alone_is_on_and_takes_no_following_flag(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OUTBOX_RELAY_NO_CLEANUP", "false")
    parsed = build_parser().parse_args(["relay", "--no-cleanup", "--name", "r"])
    assert (parsed.no_cleanup, parsed.name) == (True, "r")
    assert build_parser().parse_args(["relay", "--no-cleanup"]).no_cleanup is True


def test_without_flag_or_variable_the_declared_default_holds(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for setting in SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)
    parsed = build_parser().parse_args(["relay"])
    assert {s.key: getattr(parsed, s.key) for s in SETTINGS} == {s.key: s.default for s in SETTINGS}


@pytest.mark.parametrize(
    ("flag", "value", "code"),
    [
        ("--batch-size", "0", "SETTING_NOT_POSITIVE"),
        ("--batch-size", "many", "SETTING_MALFORMED"),
        ("--kafka-timeout", "-1", "SETTING_NOT_POSITIVE"),
        ("--on-poison", "skip", "SETTING_NOT_A_CHOICE"),
        ("--shard", "4/4", "RELAY_SHARD_OUT_OF_RANGE"),
        # Each crashed the relay at every start once active, or (-1) deleted rows as soon as published.
        ("--retention", "inf", "SETTING_NOT_FINITE"),
        ("--retention", "nan", "SETTING_NOT_FINITE"),
        ("--retention", "-1", "SETTING_OUT_OF_RANGE"),
        ("--retention", "1e12", "SETTING_OUT_OF_RANGE"),
        ("--database-timeout", "inf", "SETTING_NOT_FINITE"),
        ("--max-retries", "-1", "SETTING_OUT_OF_RANGE"),
        ("--kafka-timeout", "Infinity", "SETTING_NOT_FINITE"),
        ("--no-cleanup", "yes", "SETTING_MALFORMED"),
    ],
)
def test_a_bad_flag_or_variable_is_one_usage_line_with_its_code(
    flag, value, code, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    for argv in (["relay", flag, value], ["relay"]):
        [setting] = [s for s in SETTINGS if s.name == flag]
        monkeypatch.setenv(setting.env, value)
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(argv)
        assert exited.value.code == 2
        [line] = [s for s in capsys.readouterr().err.splitlines() if "error:" in s]
        assert f"argument {flag}: [{code}] " in line, line
        # A bad variable is named, as no flag on the command line shows where the value came from.
        assert line.endswith(f" (from the variable {setting.env})") == (argv == ["relay"]), line
