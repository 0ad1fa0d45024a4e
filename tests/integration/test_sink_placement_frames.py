"""Where the sink applies, decided from the logical plans of real frames (Spark Connect: test_connect)."""

from __future__ import annotations

from tests.placement_frames import expected, routes


def test_real_frames(spark) -> None:  # type: ignore[no-untyped-def]
    """The glue reads Spark's own plans: sources, options, repartitions, unions, joins."""
    assert routes(spark) == expected(spark)
