"""Settings read from flags and environment variables, and the URL rules.

Every command takes its connection settings from the same few variables, so
one `eval "$(outbox dev up)"` configures the relay, the sink, the demo and the
tests alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import quote, unquote, urlencode

from outbox.core import secrets
from outbox.core.errors import error

DATABASE_URL = "DATABASE_URL"
KAFKA_BOOTSTRAP_SERVERS = "KAFKA_BOOTSTRAP_SERVERS"
OUTBOX_SCHEMA = "OUTBOX_SCHEMA"
OUTBOX_DEV_DIR = "OUTBOX_DEV_DIR"

DEFAULT_SCHEMA = "public"

# Set on every connection the framework opens (DatabaseUrl.libpq).
SESSION = {"client_encoding": "UTF8", "options": "-c TimeZone=UTC"}
_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}
_HOST_PORT = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.%-]+)(:\d{1,5})?$")


@dataclass(frozen=True)
class DatabaseUrl:
    """A validated PostgreSQL URL that never prints its password."""

    raw: str

    @classmethod
    def parse(cls, value: str | None, *, source: str = DATABASE_URL) -> DatabaseUrl:
        if not value or not value.strip():
            raise error("CONFIG_DATABASE_URL_MISSING", source=source)
        value = value.strip()
        uri = _split(value)
        if uri.scheme not in _SCHEMES:
            raise error(
                "CONFIG_DATABASE_URL_SCHEME",
                source=source,
                scheme=uri.scheme or "no scheme",
                url=_refused(value),
            )
        hosts = uri.hosts.split(",")
        problem: dict[str, object] = {}
        if "@" in uri.hosts + uri.path:
            code = ""  # no host or database name holds an '@': a password does
        elif hosts == [""]:
            code = "CONFIG_DATABASE_URL_NO_HOST"
        elif (bad := next((host for host in hosts if not _HOST.match(host)), None)) is not None:
            # libpq takes several hosts (host1:5432,host2:5432), as HA setups use with
            # target_session_attrs=read-write: each one a host with an optional port.
            code, problem = "CONFIG_DATABASE_URL_HOST_INVALID", {"host": bad}
        elif not uri.path.strip("/"):
            code = "CONFIG_DATABASE_URL_NO_DATABASE"
        elif any("=" not in item for item in uri.query.split("&") if item):
            code = ""  # a raw '&' in a value (a password's): no part of it is named
        elif (key := _unknown_parameter(uri.query)) is not None:
            code, problem = "CONFIG_DATABASE_URL_PARAMETER_UNKNOWN", {"key": key}
            if _after_secret(uri.query, key):  # perhaps a password's tail, after a raw '&'
                code, problem = "", {}
        elif _libpq_reads(value):
            return cls(value)
        else:
            code = ""  # a raw '%' that starts no escape, or '=' in a setting; libpq's words show the password
        if not code or "@" in uri.query:
            # An '@' libpq did not read as the end of the user info (the password holds a raw '@'
            # or '/'), or a URL libpq's own parser refuses.
            code, problem = "CONFIG_DATABASE_URL_UNENCODED", {}
        raise error(code, source=source, url=_refused(value), **problem)

    @property
    def parameters(self) -> set[str]:
        """The libpq settings the URL's query gives (its own win over any default of ours)."""
        return {key for key, _ in _pairs(_split(self.raw).query)}

    @property
    def libpq(self) -> str:
        """The URL as libpq and psycopg take it, with the session settings every connection of
        the framework needs (SESSION): UTF-8 is what it sends, UTC what its times without a
        zone mean, whatever the database's encoding and time zone."""
        uri = _split(self.raw)  # not at the first '?': a password may hold one, as libpq reads it
        base = f"postgresql://{'' if uri.userinfo is None else uri.userinfo + '@'}{uri.hosts}{uri.path}"
        # The URL's own settings as written (a value may decode to bytes UTF-8 has no text for),
        # then ours; its options go before ours.
        written = [item for item in uri.query.split("&") if item]
        kept = [item for item in written if unquote(item.partition("=")[0]) not in SESSION]
        given = dict(_pairs(uri.query)).get("options", "")
        ours = [
            ("client_encoding", SESSION["client_encoding"]),
            ("options", f"{given} {SESSION['options']}".strip()),
        ]
        return f"{base}?{'&'.join([*kept, urlencode(ours, quote_via=quote)])}"

    @property
    def sqlalchemy(self) -> str:
        """The URL with the psycopg 3 driver named, as SQLAlchemy needs it (session settings included)."""
        return "postgresql+psycopg" + self.libpq[len("postgresql") :]

    @property
    def _written_password(self) -> str:
        userinfo = _split(self.raw).userinfo or ""
        return userinfo.partition(":")[2]

    @property
    def password(self) -> str | None:
        return unquote(self._written_password) or None

    @property
    def secrets(self) -> set[str]:
        """Every secret the URL carries, as written and decoded: its password, ?password=, ?sslpassword=."""
        found = {self._written_password, self.password or ""}
        query = _split(self.raw).query
        for key, value in _pairs(query):
            if key.lower() in SECRET_PARAMETERS:
                found |= {value, *re.findall(rf"(?i)(?:^|&){key}=([^&]*)", query)}
        return {secret for secret in found if secret}

    @property
    def safe(self) -> str:
        """The URL with its password masked, for messages and logs."""
        return redact_url(self.raw)

    def scrub(self, text: str) -> str:
        """Remove this URL's password from text (e.g. a driver's error message).

        The URL's public parts (user, hosts, ports, database), which `safe` shows, stay whole:
        masked inside them, a password told itself ("5" made 10.0.0.5 into 10.0.0.***). Read left
        to right, the longest part or secret that starts at each place wins: a password that holds
        the user name is still masked; one that is a part's substring, or the part, is not there.
        """
        text = text.replace(self.raw, self.safe)
        secrets = self.secrets
        if not secrets:
            return text
        public = self._public_parts() - secrets
        tokens = sorted(secrets | public, key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, tokens)))
        return pattern.sub(lambda m: "***" if m.group() in secrets else m.group(), text)

    def _public_parts(self) -> set[str]:
        uri = _split(self.raw)
        user = (uri.userinfo or "").partition(":")[0]
        hosts = []
        for entry in uri.hosts.split(","):  # host, host:port, [v6]:port
            host, _, port = entry.rpartition(":") if not entry.endswith("]") else (entry, "", "")
            hosts += [host or entry, port] if host else [entry]
        return {p for p in (user, unquote(user), *hosts, uri.path.lstrip("/")) if p}

    def __str__(self) -> str:
        return self.safe

    def __repr__(self) -> str:
        return f"DatabaseUrl({self.safe!r})"


def _libpq_keys() -> set[str]:
    from psycopg import pq

    return {option.keyword.decode() for option in pq.Conninfo.get_defaults()}


def _unknown_parameter(query: str) -> str | None:
    """The first key of a URL query that libpq would refuse (it knows a fixed set), if any."""
    known = _libpq_keys()
    keys = (item.partition("=")[0] for item in query.split("&") if item)
    return next((key for key in keys if key not in known), None)


def _libpq_reads(url: str) -> bool:
    """Whether libpq's own parser takes the URL (else no connection will)."""
    import psycopg
    from psycopg import pq

    try:
        pq.Conninfo.parse(url.encode())
    except psycopg.Error:
        return False
    return True


def _pairs(query: str) -> list[tuple[str, str]]:
    """A URL query's settings as libpq reads them: percent-decoded, and a '+' is a plus (parse_qsl
    makes it a space, and a password with one failed to authenticate)."""
    items = (item.partition("=") for item in query.split("&") if item)
    return [(unquote(key), unquote(value)) for key, _, value in items]


class _Uri(NamedTuple):
    scheme: str
    userinfo: str | None
    hosts: str
    path: str
    query: str


def _split(value: str) -> _Uri:
    """A URL read as libpq reads it: the user info ends at the first '@' met before any '/',
    the hosts at the next '/' or '?'. (Python's urlsplit reads it otherwise when a password
    holds a raw '@', '/', '?' or '#', and libpq is what connects.)"""
    scheme, sep, rest = value.partition("://")
    if not sep:
        return _Uri("", None, "", "", "")
    userinfo = None
    cut = re.search(r"[@/]", rest)
    if cut is not None and cut.group() == "@":
        userinfo, rest = rest[: cut.start()], rest[cut.end() :]
    end = re.search(r"[/?]", rest)
    hosts, tail = (rest[: end.start()], rest[end.start() :]) if end else (rest, "")
    path, _, query = tail.partition("?")
    return _Uri(scheme.lower(), userinfo, hosts, path, query)


# libpq settings whose values are secrets, in a URL's query or a key=value connection string.
SECRET_PARAMETERS = ("password", "sslpassword")
# Up to the last '@': a password may hold raw '/', '@', '?', '#' or spaces (a malformed URL),
# and masking too much is the safe mistake.
_USERINFO_PASSWORD = re.compile(r"(://[^:/@\s]*:).*@")
_SECRET_SETTING = re.compile(
    r"(?i)((?:^|[?&\s])(?:" + "|".join(SECRET_PARAMETERS) + r")\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)"
)


def _refused(url: str) -> str:
    """A refused URL as its error shows it: its secrets masked, and every value it holds too, since
    a key libpq does not know may be a misspelt or percent-encoded `password` (a key/value string's
    values as well), and an item without '=' a password's tail after a raw '&'."""
    masked = redact_url(url)
    if "://" not in masked:
        return re.sub(r"=\s*('(?:[^'\\]|\\.)*'?|\S*)", "=***", masked)
    head, sep, query = masked.partition("?")
    known = _libpq_keys()
    items = (
        f"{key}=***" if (key := item.partition("=")[0]) in known and "=" in item else "***"
        for item in query.split("&")
    )
    return head + sep + "&".join(items) if sep else masked


def _after_secret(query: str, key: str) -> bool:
    """Whether query item `key` follows a secret setting's: then it may be a password's tail."""
    keys = [unquote(item.partition("=")[0]) for item in query.split("&") if item]
    at = keys.index(key) if key in keys else 0
    return at > 0 and keys[at - 1].lower() in SECRET_PARAMETERS


def redact_url(url: str) -> str:
    """Mask every secret in a URL or libpq connection string (even an invalid one)."""
    return _SECRET_SETTING.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1***@", url))


def parse_bootstrap(value: str | None, *, source: str = KAFKA_BOOTSTRAP_SERVERS) -> str:
    """Validate a comma-separated list of host:port pairs."""
    if not value or not value.strip():
        raise error("CONFIG_BOOTSTRAP_MISSING", source=source)
    servers = [s.strip() for s in value.split(",") if s.strip()]
    for server in servers:
        bare = re.sub(r"^[A-Za-z_]+://", "", server)
        if not _HOST_PORT.match(bare) or not 0 < int(bare.rsplit(":", 1)[1]) < 65536:
            raise error("CONFIG_BOOTSTRAP_INVALID", source=source, server=server)
    return ",".join(servers)


def schema_name(value: str | None = None) -> str:
    """The schema for the framework's tables: flag, else OUTBOX_SCHEMA, else public."""
    name = value or os.environ.get(OUTBOX_SCHEMA) or DEFAULT_SCHEMA
    if "\x00" in name or len(name.encode()) > 63:
        raise error("CONFIG_SCHEMA_INVALID", name=name)
    return name


def database_url(flag: str | None = None) -> DatabaseUrl:
    """The database to use: the --url flag, else DATABASE_URL, else the file DATABASE_URL_FILE
    names; with the password in the file DATABASE_PASSWORD_FILE names, if it is set."""
    if flag:
        url = DatabaseUrl.parse(flag, source="--url")
    elif os.environ.get(DATABASE_URL) or not os.environ.get(secrets.DATABASE_URL_FILE):
        url = DatabaseUrl.parse(os.environ.get(DATABASE_URL))
    else:
        url = DatabaseUrl.parse(
            secrets.from_file(secrets.DATABASE_URL_FILE), source=secrets.DATABASE_URL_FILE
        )
    password = secrets.from_file(secrets.DATABASE_PASSWORD_FILE)
    if password is None:
        return url
    if url.password is not None or "password" in url.parameters:
        raise error("CONFIG_DATABASE_PASSWORD_TWICE", source="--url" if flag else DATABASE_URL)
    joint = "&" if _split(url.raw).query else "?"
    return DatabaseUrl.parse(f"{url.raw}{joint}password={quote(password, safe='')}")


def bootstrap_servers(flag: str | None = None) -> str:
    """The Kafka cluster to use: the --bootstrap-servers flag, else KAFKA_BOOTSTRAP_SERVERS."""
    if flag:
        return parse_bootstrap(flag, source="--bootstrap-servers")
    return parse_bootstrap(os.environ.get(KAFKA_BOOTSTRAP_SERVERS))
