"""routing.Lanes.split, alone: each row in one lane, in order, with its lane's columns."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sinks.postgres.routing import LANE_TAIL, Lanes, Routing, Table

VALUES = ("A", "B", "C")
WIDTHS = (1, 2, 0)  # data columns per lane; the split must not care how many

rows = st.lists(
    st.tuples(
        st.sampled_from([*VALUES, "X", None, "", "a"]),  # the route: known, unknown, null, empty, case
        st.none() | st.sampled_from(["bad json", "cut"]),  # the parse error
    ),
    max_size=40,
)


def batch(drawn: list[tuple[str | None, str | None]]) -> pa.RecordBatch:
    n = len(drawn)
    columns: dict[str, pa.Array] = {}
    for i, width in enumerate(WIDTHS):
        for j in range(width):
            columns[f"l{i}_c{j}"] = pa.array([f"{i}.{j}.{k}" for k in range(n)], pa.string())
        columns[f"l{i}_delete"] = pa.array([k % 2 == 0 for k in range(n)])
    columns |= {
        "_topic": pa.array(["t"] * n, pa.string()),
        "_partition": pa.array([0] * n, pa.int32()),
        "_offset": pa.array(range(n), pa.int64()),
        "_raw_key": pa.array([None] * n, pa.binary()),
        "_raw_value": pa.array([b"v"] * n, pa.binary()),
        "_parse_error": pa.array([e for _, e in drawn], pa.string()),
        "_route": pa.array([r for r, _ in drawn], pa.string()),
    }
    return pa.RecordBatch.from_pydict(columns)


@pytest.mark.parametrize("unrouted", ["dead_letter", "ignore"])
@given(drawn=rows)
def test_each_row_goes_to_its_tables_lane_or_as_a_dead_letter_to_the_first(unrouted, drawn) -> None:  # type: ignore[no-untyped-def]
    lanes = Lanes(VALUES, WIDTHS, unrouted, "type").split(batch(drawn))
    assert len(lanes) == len(VALUES)
    placed: dict[int, tuple[int, str | None]] = {}
    for i, lane in enumerate(lanes):
        assert lane.schema.names == [*(f"c{j}" for j in range(WIDTHS[i])), *LANE_TAIL]
        offsets = lane.column("_offset").to_pylist()
        assert offsets == sorted(offsets)  # in the batch's order
        for k, offset in enumerate(offsets):
            assert offset not in placed, "a row in two lanes"
            placed[offset] = (i, lane.column("_parse_error")[k].as_py())
            for j in range(WIDTHS[i]):
                assert lane.column(f"c{j}")[k].as_py() == f"{i}.{j}.{offset}"  # its own lane's columns
            assert lane.column("_delete")[k].as_py() == (offset % 2 == 0)
    for offset, (route, parse_error) in enumerate(drawn):
        if parse_error is not None:
            assert placed[offset] == (0, parse_error)
        elif route in VALUES:
            assert placed[offset] == (VALUES.index(route), None)
        elif unrouted == "ignore":
            assert offset not in placed
        else:
            lane, why = placed[offset]
            assert (
                lane == 0
                and why == f"routed by type: no table takes {route if route is not None else 'null'}"
            )


def test_a_long_route_value_is_cut_in_the_dead_letters_line() -> None:
    long = "Z" * 5000
    (first, *_) = Lanes(VALUES, WIDTHS, "dead_letter", "type").split(batch([(long, None)]))
    why = first.column("_parse_error")[0].as_py()
    assert why == "routed by type: no table takes " + "Z" * 200


def test_create_or_evolve_on_a_routed_table_needs_its_columns() -> None:
    from outbox.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"needs columns=\[\.\.\.\]") as refused:
        Routing("type", {"A": Table("a", create=True)})
    assert refused.value.code == "SINK_ROUTE_NEEDS_COLUMNS"
    Routing("type", {"A": Table("a", create=True, columns=["event_id"])})  # named: accepted
