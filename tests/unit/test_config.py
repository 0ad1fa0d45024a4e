from urllib.parse import quote

import hypothesis.strategies as st
import pytest
from hypothesis import assume, given
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from outbox.core.config import DatabaseUrl, parse_bootstrap, redact_url, schema_name
from outbox.core.errors import ConfigError


def test_url_forms_convert_between_drivers() -> None:
    url = DatabaseUrl.parse("postgres://u:pw@db:5432/app")
    session = "?client_encoding=UTF8&options=-c%20TimeZone%3DUTC"
    assert url.libpq == "postgresql://u:pw@db:5432/app" + session
    assert url.sqlalchemy == "postgresql+psycopg://u:pw@db:5432/app" + session


def test_every_connection_speaks_utf8_in_utc_whatever_the_url_says() -> None:
    url = DatabaseUrl.parse(
        "postgresql://u@db/app?client_encoding=LATIN1&options=-c%20work_mem%3D1MB&sslmode=disable"
    )
    assert conninfo_to_dict(url.libpq) == {
        "user": "u",
        "host": "db",
        "dbname": "app",
        "sslmode": "disable",
        "client_encoding": "UTF8",
        "options": "-c work_mem=1MB -c TimeZone=UTC",
    }


@pytest.mark.parametrize(
    ("value", "code", "names"),
    [
        (None, "CONFIG_DATABASE_URL_MISSING", "DATABASE_URL"),
        ("", "CONFIG_DATABASE_URL_MISSING", "DATABASE_URL"),
        ("mysql://u:pw@db/app", "CONFIG_DATABASE_URL_SCHEME", "DATABASE_URL"),
        ("postgresql://u:pw@db:notaport/app", "CONFIG_DATABASE_URL_HOST_INVALID", "host 'db:notaport'"),
        ("postgresql:///app", "CONFIG_DATABASE_URL_NO_HOST", "DATABASE_URL"),
        ("postgresql://u:pw@db:5432", "CONFIG_DATABASE_URL_NO_DATABASE", "DATABASE_URL"),
        ("postgresql://u:pw@db1:5432,db2:x/app", "CONFIG_DATABASE_URL_HOST_INVALID", "host 'db2:x'"),
        ("postgresql://u:pw@db1:5432,/app", "CONFIG_DATABASE_URL_HOST_INVALID", "host ''"),
    ],
)
def test_bad_urls_are_rejected_with_the_reason(value: str | None, code: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        DatabaseUrl.parse(value)
    assert info.value.code == code
    assert names in info.value.message  # the variable, or which of several hosts is wrong
    assert "pw" not in str(info.value)


def test_several_hosts_as_ha_setups_give_them() -> None:
    raw = "postgresql://u:pw@db1:5432,db2:5433,[::1]/app?target_session_attrs=read-write"
    url = DatabaseUrl.parse(raw)
    assert url.libpq.startswith(raw) and url.safe == raw.replace(":pw@", ":***@")


def test_password_never_printed() -> None:
    url = DatabaseUrl.parse("postgresql://user:s%40cret@db:5432/app")
    assert "s%40cret" not in str(url) and "s%40cret" not in repr(url)
    assert url.password == "s@cret"
    assert url.scrub("failed for postgresql://user:s%40cret@db:5432/app with s@cret") == (
        "failed for postgresql://user:***@db:5432/app with ***"
    )
    assert redact_url("postgresql://a:b@c/d") == "postgresql://a:***@c/d"


@given(
    password=st.text(alphabet="pgs5o.rt0:", min_size=1, max_size=9),
    user=st.sampled_from(["postgres", "app"]),
    host=st.sampled_from(["10.0.0.5", "db.example", "postgres"]),
)
def test_masking_reveals_nothing_by_what_it_masks(password: str, user: str, host: str) -> None:
    """The password was masked wherever it occurred: a password "5" turned 10.0.0.5 into
    10.0.0.***, one equal to a part of the user name or host showed which part. The public parts
    of the URL (user, hosts, ports, database) now stay whole; the password is masked elsewhere."""
    url = DatabaseUrl.parse(f"postgresql://{user}:{quote(password, safe='')}@{host}:5432/shop")
    message = f'connection to server at "{host}", port 5432 failed: authentication failed for user "{user}"'
    assume(password not in message.replace(host, "").replace(user, "").replace("5432", ""))
    scrubbed = url.scrub(message)
    assert scrubbed == message, scrubbed  # the password only inside public parts: nothing to mask
    leaked = url.scrub(f"{message} ({password})")
    assert leaked == f"{message} (***)", leaked


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://app@db/shop?password=s3cr&tPart",  # a raw '&' in the password
        "postgresql://app@db/shop?password=s3cr&tPart=x",
        "host=db user=app pasword=s3cr&tPart dbname=shop",  # a key/value string, misspelt
        "host=db user=app pasword='s3cr&tPart x' dbname=shop",
    ],
)
def test_a_refused_url_shows_no_part_of_a_password(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        DatabaseUrl.parse(text)
    assert "s3cr" not in caught.value.message and "tPart" not in caught.value.message, caught.value.message


@pytest.mark.parametrize("key", ["pasword", "pass%77ord", "sslpasword", "ssl%70assword"])
def test_a_refused_url_shows_no_query_value(key: str) -> None:
    """A key libpq does not know was refused with the URL printed whole: a misspelt `password`, or
    one percent-encoded (libpq decodes keys), showed the password."""
    with pytest.raises(ConfigError) as caught:
        DatabaseUrl.parse(f"postgresql://u@db/shop?sslmode=disable&{key}=hunter2")
    assert caught.value.code == "CONFIG_DATABASE_URL_PARAMETER_UNKNOWN"
    assert "hunter2" not in caught.value.message and key in caught.value.message, caught.value.message


def test_bootstrap_list_is_validated() -> None:
    assert parse_bootstrap(" a:9092, b:9093 ") == "a:9092,b:9093"
    for bad in ("", "localhost", "host:0", "host:99999", "a:9092,,b"):
        with pytest.raises(ConfigError) as caught:
            parse_bootstrap(bad)
        assert caught.value.code == ("CONFIG_BOOTSTRAP_MISSING" if bad == "" else "CONFIG_BOOTSTRAP_INVALID")
        if bad == "a:9092,,b":
            assert "'b'" in caught.value.message  # the entry that is wrong


def test_schema_defaults_to_public_and_follows_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOX_SCHEMA", raising=False)
    assert schema_name() == "public"
    monkeypatch.setenv("OUTBOX_SCHEMA", "integration")
    assert schema_name() == "integration"
    assert schema_name("flag") == "flag"
    with pytest.raises(ConfigError) as caught:
        schema_name("x" * 64)
    assert caught.value.code == "CONFIG_SCHEMA_INVALID"


secret_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs"), blacklist_characters="&'\\\\/@?#%"),
    min_size=1,
    max_size=20,
).map(lambda s: "Zq9" + s)
# What people paste into a URL unencoded: the characters a URL gives meaning to, and spaces.
raw_secret_text = st.text(alphabet=st.sampled_from("/@?#% :;&=+abcXYZ019"), min_size=1, max_size=20).map(
    lambda s: "Zq9" + s + "Kw7"
)  # marked at both ends: a leaked head or tail shows


@given(secret=secret_text, form=st.sampled_from(["userinfo", "query", "sslpassword", "conninfo"]))
def test_no_secret_survives_masking_in_any_form(secret: str, form: str) -> None:
    """Wherever a URL or connection string carries a password, masking removes it."""
    quoted = quote(secret, safe="")
    text = {
        "userinfo": f"postgresql://app:{quoted}@db:5432/shop",
        "query": f"postgresql://app@db:5432/shop?sslmode=disable&password={quoted}",
        "sslpassword": f"postgresql://app@db:5432/shop?sslpassword={quoted}",
        "conninfo": f"host=db user=app password={secret} dbname=shop",
    }[form]
    assert secret not in redact_url(text) and quoted not in redact_url(text)
    if form != "conninfo":
        url = DatabaseUrl.parse(text)
        message = f"connection to {text} failed: password {secret!r} ({quoted}) refused"
        for shown in (url.safe, str(url), repr(url), url.scrub(message)):
            assert secret not in shown and quoted not in shown, shown


@given(secret=raw_secret_text)
def test_a_raw_password_is_refused_or_masked_never_shown(secret: str) -> None:
    """A password pasted unencoded ('/', '@', '?', '#', spaces): one line naming the remedy, or a URL
    that masks it; in no case the password, whole or in part, in what is printed."""
    text = f"postgresql://app:{secret}@db:5432/shop"
    assert secret not in redact_url(text)
    try:
        url = DatabaseUrl.parse(text)
    except ConfigError as refused:
        shown = [str(refused)]
        assert refused.code in (
            "CONFIG_DATABASE_URL_UNENCODED",  # the remedy: percent-encode it
            "CONFIG_DATABASE_URL_HOST_INVALID",
            "CONFIG_DATABASE_URL_PARAMETER_UNKNOWN",
        )
    else:
        # a driver's error can only echo the password libpq was given
        shown = [url.safe, str(url), repr(url), url.scrub(f"connection to {text} failed for {url.password}")]
    for line in shown:
        assert "Zq9" not in line and "Kw7" not in line, line


SESSION_KEYS = ("client_encoding", "options")  # set on every connection (config.SESSION)


@given(
    secret=raw_secret_text,
    where=st.sampled_from(["userinfo", "query"]),
    hosts=st.sampled_from(["db:5432", "db1:5432,db2:5433", "[::1]:5432"]),
)
def test_the_url_libpq_is_given_means_what_the_url_says(secret: str, where: str, hosts: str) -> None:
    """libpq's own parser is the oracle: the URL rewritten with the session settings must connect
    where, as whom and with what password the URL given does. A raw '?' in a password cut the
    rewrite there (the password's tail went into an error line), and a '+' became a space."""
    raw = {
        "userinfo": f"postgresql://app:{secret}@{hosts}/shop",
        "query": f"postgresql://app@{hosts}/shop?sslmode=disable&password={secret}",
    }[where]
    try:
        url = DatabaseUrl.parse(raw)
    except ConfigError:
        return  # refused in one line (the test above)
    meant, rewritten = libpq_reads(raw), libpq_reads(url.libpq)
    assert {k: v for k, v in rewritten.items() if k not in SESSION_KEYS} == meant
    assert rewritten["client_encoding"] == b"UTF8"


def libpq_reads(url: str) -> dict[str, bytes]:
    """libpq's own reading of a URL, in bytes (a password may decode to bytes UTF-8 has no text for)."""
    return {o.keyword.decode(): o.val for o in pq.Conninfo.parse(url.encode()) if o.val is not None}
