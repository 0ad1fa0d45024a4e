"""What `pip install .` installs: the wheel built from a copy of the sources (no services)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers import REPO

NOT_SHIPPED = {"tests", "bench", "demos", "docs", "docker"}


def _wheel(tmp_path: Path) -> list[str]:
    """The file names in a wheel built from a copy of the shipped sources: the build writes
    its scratch files beside the sources, and the checkout must not get them."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for path in REPO.iterdir():  # every top-level package, and the migrations
        if path.name not in NOT_SHIPPED and ((path / "__init__.py").exists() or path.name == "migrations"):
            shutil.copytree(path, source / path.name, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (source / "dist").glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_installs_every_package_under_outbox_and_sinks_only(tmp_path: Path) -> None:
    names = _wheel(tmp_path)
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"outbox", "sinks"}, "no generic top-level name may land in site-packages"
    packages = [p.parent.relative_to(REPO) for p in REPO.glob("outbox/**/__init__.py")]
    packages += [p.parent.relative_to(REPO) for p in REPO.glob("sinks/**/__init__.py")]
    packages += [Path("outbox", p.parent.relative_to(REPO)) for p in REPO.glob("migrations/**/__init__.py")]
    missing = sorted(str(p) for p in packages if f"{p.as_posix()}/__init__.py" not in names)
    assert not missing, f"packages the wheel lacks (pyproject.toml's list): {missing}"
    for data in ("outbox/migrations/script.py.mako", "sinks/log4j2.properties"):
        assert data in names, data
