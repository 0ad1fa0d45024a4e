"""A stager's attempt ids: rows a lost try committed must never pass for another try's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sinks.postgres.stage import attempt_id


@given(token=st.integers(0, (1 << 31) - 1), tries=st.sets(st.integers(0, 10_000), min_size=2, max_size=6))
def test_each_try_of_a_stager_stages_under_an_id_of_its_own_that_postgres_can_hold(
    token: int, tries: set[int]
) -> None:
    ids = [attempt_id(token, n) for n in tries]
    assert len(set(ids)) == len(ids)
    assert all(0 <= i < 1 << 63 for i in ids)  # a bigint
    assert attempt_id(token) == attempt_id(token, 0)
