"""What `import outbox` and `import sinks...` give a user: the public names, and nothing heavy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import outbox
import sinks.kafka_source
import sinks.postgres
from tests.helpers import REPO


def test_every_public_name_is_there() -> None:
    for package in (outbox, sinks.postgres, sinks.kafka_source):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    assert issubclass(outbox.ConfigError, outbox.OutboxError)
    assert outbox.add_event.__module__ == "outbox.writer"
    assert outbox.Relay.__module__ == "outbox.relay.relay"


def test_importing_outbox_loads_no_driver() -> None:
    """The CLI catches stop signals before its heavy imports (outbox/stopping.py): `import outbox`
    must stay as light as its errors."""
    probe = "import sys, outbox; print(sorted({m.split('.')[0] for m in sys.modules} & {HEAVY}))"
    heavy = {"confluent_kafka", "psycopg", "pyspark", "sqlalchemy", "alembic", "pyarrow"}
    said = subprocess.run(
        [sys.executable, "-c", probe.replace("{HEAVY}", repr(heavy))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert said.stdout.strip() == "[]", said.stdout


def private_imports(path: Path) -> list[str]:
    """Each name the module imports from `outbox` that is private: a module or a name with a leading
    underscore anywhere in its dotted path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "outbox":
            dotted = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names if alias.name.split(".")[0] == "outbox"]
        else:
            continue
        found += [f"{path.relative_to(REPO)}:{node.lineno}: {d}" for d in dotted if private(d)]
    return found


def private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_nothing_outside_outbox_imports_its_private_names() -> None:
    """`sinks`, the benches, the demos, the dev tools and the tests stand on `outbox`'s public face
    (its base is `outbox.core`): a private name of it is free to change without them."""
    outside = [p for p in REPO.rglob("*.py") if p.relative_to(REPO).parts[0] in OUTSIDE]
    assert len(outside) > 100, len(outside)
    found = [line for path in sorted(outside) for line in private_imports(path)]
    assert not found, "\n".join(found)


def test_a_private_import_is_found() -> None:
    assert private("outbox._core.config") and private("outbox.relay.kafka._enqueue")
    assert not private("outbox.core.config") and not private("outbox.__version__")


OUTSIDE = ("sinks", "bench", "demos", "devtools", "tests", "migrations")
