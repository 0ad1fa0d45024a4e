import stat
from pathlib import Path

import pytest

from outbox.core.errors import ConfigError
from outbox.core.java import find_java, parse_major


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_parse_major(output: str, major: int | None) -> None:
    assert parse_major(output) == major


def test_missing_java_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        find_java({"PATH": str(tmp_path)})
    assert caught.value.code == "JAVA_MISSING"
    assert "install Java 17" in caught.value.message


def test_old_java_is_refused(tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\"' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(ConfigError) as caught:
        find_java({"JAVA_HOME": str(tmp_path), "PATH": ""})
    assert caught.value.code == "JAVA_TOO_OLD"
    assert "is 11: install Java 17" in caught.value.message  # the version found, and what to do


def test_a_java_is_asked_its_version_once_until_it_changes(tmp_path: Path) -> None:
    asked = tmp_path / "asked"
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho x >> {asked}\necho 'openjdk version \"17.0.1\"' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    env = {"JAVA_HOME": str(tmp_path), "PATH": ""}
    assert find_java(env).major == find_java(env).major == 17
    assert asked.read_text().count("x") == 1
    java.write_text(java.read_text().replace("17.0.1", "21.0.10"))  # upgraded in place: a new size
    assert find_java(env).major == 21
    assert asked.read_text().count("x") == 2


def test_java_on_this_machine_is_found() -> None:
    assert find_java().major >= 17
