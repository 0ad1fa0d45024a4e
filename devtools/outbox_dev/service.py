"""What a started service leaves behind: enough to reach it and to stop it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Service:
    name: str
    pid: int
    port: int
    data_dir: Path
    log: Path
    env: dict[str, str]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "port": self.port,
            "data_dir": str(self.data_dir),
            "log": str(self.log),
            "env": self.env,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Service:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),  # type: ignore[call-overload]  # read back from our own JSON state file
            port=int(data["port"]),  # type: ignore[call-overload]  # read back from our own JSON state file
            data_dir=Path(str(data["data_dir"])),
            log=Path(str(data["log"])),
            env=dict(data["env"]),  # type: ignore[call-overload]  # read back from our own JSON state file
        )
