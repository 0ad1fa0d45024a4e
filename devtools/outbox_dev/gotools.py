"""Go programs the tests run, built once with `go install` from the Go module proxy into the user's
cache (beside the Maven jars) and reused by every later run and clone: Toxiproxy, helm, and the
tests' own Kubernetes manifest checker (outbox_dev/go/kubecheck)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from outbox_dev.errors import error
from outbox_dev.jvm.maven import cache_root

BUILD_TIMEOUT = 900  # s: helm, the largest, takes some minutes on two cores


def built(
    name: str,
    target: str,
    command: str,
    *,
    needed_by: str,
    source: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """The program `command` that `go install target` makes (a module path@version, or `./...` of
    `source`, a module folder of ours), under the cache folder `name`; built the first time."""
    folder = cache_root(environ).parent / "bin" / name
    program = folder / command
    if program.exists():
        return program
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")  # Go's own tarball's place
    if go is None:
        raise error("DEV_GO_MISSING", needed_by=needed_by)
    partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"outbox: building {name} with Go, once, into {folder}", file=sys.stderr, flush=True)
    env = {**os.environ, "GOBIN": str(partial), "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    try:
        result = subprocess.run(
            [go, "install", target],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            env=env,
            cwd=source,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        raise error("DEV_GO_BUILD_TIMEOUT", name=name, minutes=BUILD_TIMEOUT // 60) from None
    if result.returncode != 0 or not (partial / command).exists():
        shutil.rmtree(partial, ignore_errors=True)
        lines = (result.stderr or result.stdout or "no output").strip().splitlines()
        raise error("DEV_GO_BUILD_FAILED", name=name, reason=lines[-1][:300])
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # another process may have finished first: theirs is as good
        partial.rename(folder)
    shutil.rmtree(partial, ignore_errors=True)
    return program


HELM = ("helm.sh/helm/v4/cmd/helm", "v4.3.2")
KUBECHECK = Path(__file__).parent / "go" / "kubecheck"


def helm(environ: Mapping[str, str] | None = None) -> Path:
    """Helm, for the chart's lint and render (deploy/helm)."""
    module, version = HELM
    return built(
        f"helm-{version}", f"{module}@{version}", "helm", needed_by="the chart's tests", environ=environ
    )


def kubecheck(environ: Mapping[str, str] | None = None) -> Path:
    """The tests' own manifest checker, built from its folder; cached under its sources' digest, so
    an edit builds it anew."""
    import hashlib

    digest = hashlib.sha256(b"".join((KUBECHECK / f).read_bytes() for f in ("go.mod", "go.sum", "main.go")))
    name = f"kubecheck-{digest.hexdigest()[:12]}"
    return built(name, ".", "kubecheck", needed_by="the chart's tests", source=KUBECHECK, environ=environ)
