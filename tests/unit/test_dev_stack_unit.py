"""Which local services `outbox dev up` starts: the decisions alone, no process."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from outbox_dev.stack import DEFAULT_SERVICES, PROVIDES, Stack

NAMES = sorted(PROVIDES)


def test_the_registry_starts_only_when_asked_for() -> None:
    assert "registry" not in Stack(Path("/nowhere"), environ={}).wanted()
    asked = (*DEFAULT_SERVICES, "registry")
    assert "registry" in Stack(Path("/nowhere"), environ={}, services=asked).wanted()


@given(st.sets(st.sampled_from(NAMES)), st.sets(st.sampled_from(NAMES)))
def test_a_service_starts_when_asked_for_and_not_given_and_is_named_given_only_when_asked_for(
    asked: set[str], set_in_env: set[str]
) -> None:
    environ = {PROVIDES[name]: "somewhere" for name in set_in_env}
    stack = Stack(Path("/nowhere"), environ=environ, services=[n for n in NAMES if n in asked])
    assert set(stack.wanted()) == asked - set_in_env
    assert stack.given() == {name: PROVIDES[name] for name in asked & set_in_env}
