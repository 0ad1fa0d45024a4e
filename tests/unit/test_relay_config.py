"""The relay's config file and the secrets read from files: precedence, adversarial secrets, and
one line for each thing that is wrong, naming no secret."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox.cli import main
from outbox.cli.relay import kafka_settings
from outbox.core import secrets
from outbox.core.config import database_url
from outbox.core.errors import ConfigError
from outbox.relay import config_file
from outbox.relay.settings import SETTINGS

KNOWN = {s.key for s in SETTINGS}
_PASSWORDS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1
).filter(
    lambda p: (
        p.removesuffix("\n").removesuffix("\r") == p
    )  # a trailing newline is the file's, not the secret's
)


def test_a_config_file_gives_settings_as_flag_text_and_a_kafka_table(tmp_path: Path) -> None:
    path = tmp_path / "relay.toml"
    path.write_text(
        'name = "r"\nbatch-size = 100\npoll_interval = 0.5\nno-cleanup = true\nurl = "postgresql://u@h/d"\n'
        '[kafka]\n"security.protocol" = "SASL_SSL"\n"linger.ms" = 5\n'
    )
    found = config_file.read(path, KNOWN)
    assert found.values == {
        "name": "r",
        "batch_size": "100",
        "poll_interval": "0.5",
        "no_cleanup": "true",
        "url": "postgresql://u@h/d",
    }
    assert found.kafka == {"security.protocol": "SASL_SSL", "linger.ms": "5"}


@pytest.mark.parametrize(
    ("text", "code", "said"),
    [
        ("batch-sise = 5\n", "RELAY_CONFIG_KEY_UNKNOWN", "no setting 'batch-sise'"),
        ('name = "r\n', "RELAY_CONFIG_UNREADABLE", "not TOML"),
        ("name = [1, 2]\n", "RELAY_CONFIG_VALUE_INVALID", "name: a string, number or boolean"),
        ("[kafka]\nsasl = { password = 'hunter2' }\n", "RELAY_CONFIG_VALUE_INVALID", "kafka.sasl"),
    ],
)
def test_a_config_file_that_is_wrong_is_one_line_naming_the_key(
    tmp_path: Path, text: str, code: str, said: str
) -> None:
    path = tmp_path / "relay.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        config_file.read(path, KNOWN)
    assert caught.value.code == code and said in caught.value.message, caught.value
    assert "hunter2" not in str(caught.value) and "\n" not in str(caught.value)


def test_flags_and_variables_win_over_the_config_file_and_its_bad_value_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "relay.toml"
    path.write_text('name = "from-file"\nbatch-size = -1\nurl = "nonsense"\n')
    monkeypatch.setenv("OUTBOX_RELAY_CONFIG", str(path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("OUTBOX_RELAY_BATCH_SIZE", raising=False)
    assert main(["relay", "--metrics-address", "off"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "[RELAY_CONFIG_VALUE_INVALID]" in line and "batch_size" in line and "positive" in line, line
    # The variable wins over the file's bad size; then the file's URL is the one refused.
    monkeypatch.setenv("OUTBOX_RELAY_BATCH_SIZE", "10")
    assert main(["relay", "--metrics-address", "off"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "[CONFIG_DATABASE_URL_SCHEME]" in line, line
    # And a flag over both: argparse's own refusal.
    with pytest.raises(SystemExit) as refused:
        main(["relay", "--metrics-address", "off", "--batch-size", "-5"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and "--batch-size must be positive, got -5" in line, line


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=_PASSWORDS, newline=st.sampled_from(["", "\n", "\r\n"]))
def test_a_password_from_its_file_reaches_libpq_whatever_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, password: str, newline: str
) -> None:
    secret = tmp_path / "password"
    secret.write_text(password + newline, encoding="utf-8", newline="")
    monkeypatch.setenv(secrets.DATABASE_PASSWORD_FILE, str(secret))
    monkeypatch.setenv("DATABASE_URL", "postgresql://relay@db.example:5432/app?sslmode=require")
    url = database_url()
    assert psycopg.conninfo.conninfo_to_dict(url.libpq)["password"] == password
    assert url.safe == "postgresql://relay@db.example:5432/app?sslmode=require&password=***"


def test_a_url_from_its_file_and_a_password_twice_or_unreadable_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "url").write_text("postgresql://relay:inl1ne-secret@db:5432/app\n")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv(secrets.DATABASE_URL_FILE, str(tmp_path / "url"))
    assert database_url().password == "inl1ne-secret"
    (tmp_path / "password").write_text("0ther-secret\n")
    monkeypatch.setenv(secrets.DATABASE_PASSWORD_FILE, str(tmp_path / "password"))
    with pytest.raises(ConfigError) as twice:
        database_url()
    assert twice.value.code == "CONFIG_DATABASE_PASSWORD_TWICE"
    assert "inl1ne-secret" not in str(twice.value) and "0ther-secret" not in str(twice.value)
    monkeypatch.setenv(secrets.DATABASE_PASSWORD_FILE, str(tmp_path / "missing"))
    with pytest.raises(ConfigError) as unreadable:
        database_url()
    assert unreadable.value.code == "CONFIG_SECRET_FILE_UNREADABLE" and "DATABASE_PASSWORD_FILE" in str(
        unreadable.value
    )
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv(secrets.DATABASE_PASSWORD_FILE, str(tmp_path / "empty"))
    with pytest.raises(ConfigError) as empty:
        database_url()
    assert empty.value.code == "CONFIG_SECRET_FILE_EMPTY"


def test_kafka_secrets_from_files_sit_under_the_kafka_config_file_and_x(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sasl").write_text("s3cret\n")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD_FILE", str(tmp_path / "sasl"))
    base = {"sasl.username": "from-toml", **secrets.kafka_secrets()}
    assert kafka_settings([], None, base) == {"sasl.username": "from-toml", "sasl.password": "s3cret"}
    (tmp_path / "client.properties").write_text("sasl.password=from-properties\n")
    got = kafka_settings(["sasl.username=from-x"], tmp_path / "client.properties", base)
    assert got == {"sasl.username": "from-x", "sasl.password": "from-properties"}


def test_the_environments_registry_gets_its_user_info_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.formats import registry_of

    (tmp_path / "info").write_text("user:pa:ss\n")
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "http://registry:8081")
    monkeypatch.setenv(secrets.SCHEMA_REGISTRY_USER_INFO_FILE, str(tmp_path / "info"))
    registry = registry_of(None)
    assert registry.settings == {"url": "http://registry:8081", "basic.auth.user.info": "user:pa:ss"}
    assert "pa:ss" not in registry.where
    assert registry_of("http://other:8081").settings == {"url": "http://other:8081"}  # no credentials sent


def test_the_production_file_in_the_docs_reads(tmp_path: Path) -> None:
    from tests.helpers import REPO

    text = (REPO / "docs" / "operations.md").read_text()
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "relay.toml").write_text(block)
    found = config_file.read(tmp_path / "relay.toml", KNOWN)
    assert found.values["name"] == "orders-relay" and found.kafka["sasl.mechanism"] == "SCRAM-SHA-512"
