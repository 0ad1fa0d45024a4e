"""The README's figures are the kept runs' figures.

Every row of the README's Performance table cites the kept result file it
comes from (`bench/results/*.json`), and that file must be the newest kept
run of its bench. Every number in the row's figures must be a value of that
file, as printed: 1.44 is a value that rounds to 1.44, 117,763 one that rounds
to 117,763, 6.1% a value of 0.061, 146k one of 146,000 to the thousand; a
target ("target 1.2") is the issue's, not the run's, and is not looked for. A
figure quoted from an older run, or from no run, fails here. Outside that
table the README quotes no rate or ratio, so that each figure stands once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
CITED = re.compile(r"bench/results/([\w-]+\.json)")
# A figure: a number, with a thousands comma or decimals, perhaps ending in % or k; not a version
# (3.6.1) nor part of a word.
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?!\.\d)(%|k\b)?")
# A target the row measures against: not a figure of the run.
TARGET = re.compile(r"\btarget \d+(?:\.\d+)?")
# A rate or a ratio, where only the Performance table may have one.
FIGURE = re.compile(r"\d(?:\.\d+)?x\b|\d[\d,.]*k?(?: events)?/s\b")


def performance_rows(readme: str) -> list[list[str]]:
    """The cells of each body row of the table under `## Performance`."""
    section = readme.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def leaves(value: object) -> Iterator[float]:
    """Every number in a JSON value, its keys that are numbers included."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if re.fullmatch(r"\d+(\.\d+)?", key):
                yield float(key)
            yield from leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item)


def quoted(text: str) -> list[tuple[str, float, float]]:
    """Each figure in `text`: as written, its value, and the step it was rounded to."""
    found = []
    for match in NUMBER.finditer(text):
        digits, unit = match.group(1), match.group(2)
        plain = digits.replace(",", "")
        decimals = len(plain.split(".")[1]) if "." in plain else 0
        value, step = float(plain), 10.0**-decimals
        if unit == "%":
            value, step = value / 100, step / 100
        elif unit == "k":
            value, step = value * 1000, step * 1000
        found.append((match.group(0), value, step))
    return found


def matches(value: float, step: float, candidates: list[float]) -> bool:
    """Whether some candidate, rounded to `step`, is `value` (halves either way)."""
    return any(abs(c - value) <= step / 2 + 1e-12 * max(1.0, abs(c)) for c in candidates)


def bench_of(name: str) -> str:
    return name.rsplit("-", 1)[1].removesuffix(".json")


@given(st.floats(0, 1e7, allow_nan=False), st.integers(0, 3))
def test_a_value_printed_at_any_precision_is_found_in_its_file(value: float, decimals: int) -> None:
    printed = f"{value:,.{decimals}f}"
    ((_, figure, step),) = quoted(printed)
    assert matches(figure, step, [value])
    assert not matches(figure, step, [value + 2 * step])


def test_units_are_read_as_written() -> None:
    assert [(v, s) for _, v, s in quoted("6.1% and 146k and 117,763 from Debezium 3.6.1")] == [
        (pytest.approx(0.061), pytest.approx(0.001)),
        (146000.0, 1000.0),
        (117763.0, 1.0),
    ]


def test_each_performance_figure_is_in_the_newest_kept_run_it_cites() -> None:
    rows = performance_rows((ROOT / "README.md").read_text())
    assert rows, "the README has no Performance table"
    kept = sorted(p.name for p in RESULTS.glob("*.json"))
    for what, figures, source in rows:
        cited = CITED.findall(source)
        assert cited, f"{what!r}: its row cites no kept run (bench/results/...json)"
        for name in cited:
            newest = max(k for k in kept if bench_of(k) == bench_of(name))
            assert name == newest, f"{what!r} cites {name}; the newest kept {bench_of(name)} run is {newest}"
        values = [v for name in cited for v in leaves(json.loads((RESULTS / name).read_text()))]
        for written, value, step in quoted(TARGET.sub("target", figures)):
            assert matches(value, step, values), f"{what!r}: {written} is in none of {cited}"


def test_no_rate_or_ratio_stands_outside_the_performance_table() -> None:
    readme = (ROOT / "README.md").read_text()
    head, rest = readme.split("\n## Performance\n", 1)
    outside = re.sub(r"```.*?```", "", head + "\n## " + rest.split("\n## ", 1)[1], flags=re.S)
    stray = [line for line in outside.splitlines() if FIGURE.search(line)]
    assert not stray, stray
