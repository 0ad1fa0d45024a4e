"""The dev tools' class-data archives: made by one JVM at a time, kept only if it succeeded."""

from __future__ import annotations

from pathlib import Path

from outbox_dev.jvm import cds


def made_by(jvm: cds.Making) -> Path:
    """The file the JVM would write at its exit, from its option."""
    (option,) = [o for o in jvm.options if o.startswith("-XX:ArchiveClassesAtExit=")]
    return Path(option.partition("=")[2])


def test_the_first_jvm_makes_the_archive_and_later_ones_map_it(tmp_path: Path) -> None:
    path = tmp_path / "x.jsa"
    with cds.making(path) as jvm:
        assert jvm.makes
        made_by(jvm).write_bytes(b"archive")
        jvm.succeeded = True
    assert path.read_bytes() == b"archive"
    with cds.making(path) as later:
        assert not later.makes
        assert later.options == [f"-XX:SharedArchiveFile={path}", *cds.QUIET]


def test_an_archive_of_a_jvm_that_failed_is_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.jsa"
    with cds.making(path) as jvm:
        made_by(jvm).write_bytes(b"half")
    assert not path.exists() and not made_by(jvm).exists()
    assert cds.mapped(path) == []


def test_while_one_jvm_makes_it_another_runs_without(tmp_path: Path) -> None:
    path = tmp_path / "x.jsa"
    with cds.making(path) as first, cds.making(path) as second:
        assert first.makes and not second.makes
        assert second.options == []


def test_an_archive_is_named_for_its_java_and_class_path(tmp_path: Path) -> None:
    java = tmp_path / "java"
    java.write_text("")
    one = cds.archive("tools", java, "a.jar:b.jar")
    assert one == cds.archive("tools", java, "a.jar:b.jar")
    assert one != cds.archive("tools", java, "a.jar:c.jar")
    assert one != cds.archive("broker", java, "a.jar:b.jar")
