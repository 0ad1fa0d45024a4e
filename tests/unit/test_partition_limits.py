"""The limits that let a partition be noticed, derived from the relay's and the sink's timeouts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError, OutboxError
from outbox.core.postgres import keepalive, server_limits, working_for
from outbox.core.settings import Setting
from outbox.relay.settings import SETTINGS, RelaySettings
from sinks.postgres.spec import SinkSpec

seconds = st.floats(min_value=0.001, max_value=86_400, allow_nan=False)


@given(seconds)
def test_the_client_gives_up_on_a_silent_server_in_about_the_timeout(timeout: float) -> None:
    k = keepalive(timeout)
    probing = k["keepalives_idle"] + k["keepalives_interval"] * k["keepalives_count"]
    wanted = max(3, timeout)
    assert k["keepalives"] == 1
    assert wanted / 2 <= probing <= wanted + 4
    assert wanted * 1000 <= k["tcp_user_timeout"] <= (wanted + 1) * 1000


@given(seconds, seconds)
def test_the_server_ends_a_silent_session_no_sooner_than_asked(timeout: float, silence: float) -> None:
    limits = server_limits(timeout, silence)
    for name in ("idle_session_timeout", "idle_in_transaction_session_timeout"):
        assert limits[name].endswith("s") and int(limits[name][:-1]) >= silence
    assert int(limits["statement_timeout"][:-1]) >= min(timeout, 3)
    assert all(isinstance(value, str) and value for value in limits.values())


@given(st.sampled_from(["idle", "idle in transaction", "idle in transaction (aborted)"]), seconds, seconds)
def test_a_watched_session_is_waited_on_while_active_or_lately_quiet(
    state: str, quiet: float, timeout: float
) -> None:
    assert working_for("active", quiet, timeout)
    assert not working_for(None, quiet, timeout)  # the server ended it
    assert working_for(state, quiet, timeout) == (quiet < timeout)


@given(seconds)
def test_a_sink_derives_its_silence_and_retries_from_its_timeout(timeout: float) -> None:
    spec = SinkSpec(url=DatabaseUrl.parse("postgresql://u@h/d"), table="t", database_timeout=timeout)
    # The server ends a lost task's session after its healthy gaps and before the task gives up.
    assert timeout < spec.silence < spec.retry_for


@pytest.mark.parametrize(
    ("value", "code"),
    [(0, "SETTING_NOT_POSITIVE"), (-1, "SETTING_NOT_POSITIVE"), (float("nan"), "SETTING_NOT_FINITE")],
)
def test_a_sinks_timeout_that_is_not_positive_is_one_line(value: float, code: str) -> None:
    with pytest.raises(OutboxError) as caught:
        SinkSpec(url=DatabaseUrl.parse("postgresql://u@h/d"), table="t", database_timeout=value)
    assert caught.value.code == code


@given(seconds, seconds, st.floats(min_value=0.01, max_value=3600))
def test_the_server_waits_out_a_relays_longest_healthy_silence(
    database: float, kafka: float, poll: float
) -> None:
    """Between two queries a healthy active relay spends at most: a producer's start (a list of
    topics, init_transactions asked again for 2x the Kafka timeout, the position read) or a
    batch's Kafka calls (a commit asked again for 2x), or one poll interval."""
    settings = RelaySettings(
        url=DatabaseUrl.parse("postgresql://u@h/d"),
        bootstrap="h:9092",
        name="r",
        database_timeout=database,
        kafka_timeout=kafka,
        poll_interval=poll,
    )
    longest = max(min(kafka, 10) + 3 * kafka + kafka, 3 * kafka, poll)
    assert settings.silence > longest
    # A relay halted on a poison row waits before it tries the row again, its session quiet: the
    # wait was 30 s, past the server's limit with short timeouts (--database-timeout 3
    # --kafka-timeout 3: 19 s); each ended session counted as a failure, and about 11 halts later
    # the relay exited (RELAY_GAVE_UP).
    assert 0 < settings.halt_wait < settings.silence and settings.halt_wait <= 30


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.positive], ids=lambda s: s.name)
@pytest.mark.parametrize(
    ("value", "said"),
    [(0, "positive"), (-1, "positive"), (float("nan"), "a finite number"), (float("inf"), "a finite number")],
)
def test_a_setting_that_must_be_positive_and_is_not_is_one_line(
    setting: Setting[Any], value: float, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        RelaySettings(
            url=DatabaseUrl.parse("postgresql://u@h/d"), bootstrap="h:9092", name="r", **{setting.key: value}
        )
    assert caught.value.code == ("SETTING_NOT_POSITIVE" if said == "positive" else "SETTING_NOT_FINITE")
    assert caught.value.message.startswith(f"{setting.name} must be {said}")  # names the flag


def test_the_urls_own_libpq_settings_are_known_so_they_win() -> None:
    url = DatabaseUrl.parse("postgresql://u:p@h/d?keepalives_idle=99&sslmode=require")
    assert url.parameters == {"keepalives_idle", "sslmode"}
    assert DatabaseUrl.parse("postgresql://u@h/d").parameters == set()


def test_an_unknown_poison_policy_is_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        RelaySettings(
            url=DatabaseUrl.parse("postgresql://u@h/d"), bootstrap="h:9092", name="r", on_poison="skip"
        )
    assert caught.value.code == "SETTING_NOT_A_CHOICE"
    assert caught.value.message == "--on-poison must be one of halt, dead-letter, got 'skip'"
