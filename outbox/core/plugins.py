"""What the dev tools (the `outbox-eos-dev` distribution) add to the runtime, found by entry point.

The runtime never imports the tools: it names what it may use, and says how
to get it when it is not installed. Two groups:

- `outbox.commands`: CLI commands (`outbox dev`), each a `register(subparsers)`;
- `outbox.tools`: functions a runtime command runs when asked (Kafka's own
  `kafka-transactions`, which needs Java and Kafka's jars).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from outbox.core.errors import error

COMMANDS = "outbox.commands"
TOOLS = "outbox.tools"
DIST = "outbox-eos-dev"
INSTALL = f"install {DIST} (`make install` does, or `pip install ./devtools`)"

# The commands the dev tools bring, and what each is for: `outbox NAME` says how to get them.
KNOWN_COMMANDS = {"dev": "throwaway local PostgreSQL, Kafka and Spark Connect for development"}


def commands() -> dict[str, Callable[[Any], None]]:
    """name -> register(subparsers), of the commands installed."""
    return {ep.name: ep.load() for ep in entry_points(group=COMMANDS)}


def tool(name: str, needed_by: str) -> Callable[..., Any]:
    """The tool `name`, or a ConfigError that says which distribution brings it."""
    found = [ep for ep in entry_points(group=TOOLS) if ep.name == name]
    if not found:
        raise error("PLUGIN_TOOL_MISSING", needed_by=needed_by, name=name, install=INSTALL)
    loaded: Callable[..., Any] = found[0].load()
    return loaded
