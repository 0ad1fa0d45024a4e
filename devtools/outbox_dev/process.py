"""Child processes that never outlive their purpose, and the ports they use.

Services started for a test run or the demo die with the process that started
them (Linux parent-death signal), so even a `kill -9` of pytest leaves nothing
running. Services started by `outbox dev up` are detached instead and tracked
by pid, with the command line checked before any pid is signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from outbox_dev.errors import error

_PR_SET_PDEATHSIG = 1
_STACK_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more)")


def _die_with_parent(sig: int) -> Callable[[], None]:
    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec


def spawn(
    argv: Sequence[str],
    log: Path,
    *,
    user: str | None = None,
    die_with_parent: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv in its own session, output appended to log.

    die_with_parent: the signal the child gets when this process dies (None
    for a detached service that must outlive it). Linux sends it when the
    *thread* that spawned the child ends: spawn such children from a thread
    that lives as long as they should (the main thread).
    """
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **run_as(user),
            preexec_fn=_die_with_parent(die_with_parent) if die_with_parent else None,
            env=env,
        )


def run_as(user: str | None) -> dict[str, Any]:
    """subprocess arguments that run a child as user, with that user's group only."""
    if user is None:
        return {}
    import pwd

    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """Every live process below pid: children, their children, ..."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The parent pid is the 2nd field after the parenthesised command name.
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def cmdline_contains(pid: int, needle: str) -> bool:
    """Whether pid's command line mentions needle: guards against recycled pids."""
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def stop(pid: int, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal pid (and its process group), wait, then SIGKILL if it lingers."""
    for s, wait in ((sig, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, s)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return
            time.sleep(0.05)


# A service binds its port seconds after the port is chosen: a JVM starting, initdb first, a
# fault proxy that binds a broker's advertised port only when a test links it. Meanwhile the
# kernel gives ports of its ephemeral range to any process's outgoing connections, and the bind
# then fails ("address already in use", seen with three test workers). Below that range only
# another listener can take a port: one of ours, which this process never chooses twice, and
# another test worker's, which chooses from a share of its own (PORT_SHARE).
_LINUX_EPHEMERAL = (32768, 60999)
_QUIET_FROM = 20000  # above the registered ports most services use
PORT_SHARE = "OUTBOX_DEV_PORT_SHARE"  # "i/n": choose from the i-th of n equal parts (i from 0)
_choice = random.Random()  # its own: Hypothesis seeds the global one alike in every worker
_chosen: set[int] = set()


def ephemeral_ports(setting: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The range the kernel takes local ports of outgoing connections from."""
    try:
        low, high = (int(v) for v in setting.read_text().split())
    except (OSError, ValueError):
        return _LINUX_EPHEMERAL
    return low, high


def quiet_ports(ephemeral_low: int, share: str = "") -> range | None:
    """Where to choose a port that waits to be bound: below the ephemeral range, in this process's
    `share` of it ("i/n") where that leaves room; None if the range has none."""
    quiet = range(_QUIET_FROM, ephemeral_low)
    if len(quiet) < 1000:
        return None
    index, _, count = share.partition("/")
    if index.isdigit() and count.isdigit() and int(index) < int(count):
        part = quiet[int(index) :: int(count)]
        return part if len(part) >= 1000 else quiet
    return quiet


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now that no outgoing connection, nor another service we start, is given before
    its service binds it."""
    ports = quiet_ports(ephemeral_ports()[0], os.environ.get(PORT_SHARE, "")) or range(0)
    for port in _choice.sample(ports, min(100, len(ports))):
        if port not in _chosen and not port_in_use(port, host):
            _chosen.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def choose_port(requested: int | None, flag: str, host: str = "127.0.0.1") -> int:
    """The requested port if it is free (clear error if not), else any free port."""
    if not requested:
        return free_port(host)
    if not 0 < requested < 65536:
        raise error("DEV_PORT_INVALID", flag=flag, port=requested)
    if port_in_use(requested, host):
        raise error("DEV_PORT_IN_USE", port=requested, host=host, flag=flag)
    return requested


def wait_until(
    ready: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    *,
    what: str,
    log: Path,
    timeout: float = 60.0,
) -> None:
    """Poll ready() until true; fail fast, with the log's tail, if proc exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error("DEV_SERVICE_EXITED", what=what, code=proc.returncode, log=tail(log))
        if ready():
            return
        time.sleep(0.1)
    raise error("DEV_SERVICE_NOT_STARTED", what=what, timeout=timeout, log=tail(log))


def tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {log})"
    # A JVM's stack frames say where, not what: its exception's own line is the one to show.
    interesting = [line for line in text if "GLIBC" not in line and not _STACK_FRAME.match(line)]
    return " | ".join(interesting[-lines:]) + f" (full log: {log})"
