"""The `outbox` command: local services, schema migrations, the relay daemon.

Every failure a user can fix is an OutboxError and is printed as one line on
stderr, never as a traceback.

  db.py      `outbox db upgrade|downgrade|current`
  check.py   `outbox check`: can this host reach and use everything?
  relay.py   `outbox relay`: its settings table, then the daemon
  relays.py  `outbox relays list|rebase|forget`: the relays an outbox's database records
  verify.py  `outbox verify`: a topic against what was committed
  transactions.py `outbox transactions`: open and hanging transactions on a topic
  status.py  `outbox status`: relays, sink ledgers and dead letters on one screen
  trace.py   `outbox trace EVENT_ID`: one event's path through every system
  options.py options several commands share

`outbox dev` (local services) comes with the dev tools, found by entry point
(outbox.core.plugins); without them it says how to install them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from outbox.cli import check, db, relay, relays, sinks, status, trace, transactions, verify
from outbox.core import plugins
from outbox.core.errors import OutboxError
from outbox.errors import error
from outbox.stopping import release_stop_signals

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox",
        description="Exactly-once integration between Kafka, Spark and PostgreSQL.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    installed = plugins.commands()
    for register in installed.values():
        register(commands)
    for name, what in plugins.KNOWN_COMMANDS.items():
        if name not in installed:
            missing = commands.add_parser(name, help=f"{what} (needs the dev tools)", add_help=False)
            missing.add_argument("rest", nargs=argparse.REMAINDER)
            missing.set_defaults(handler=_not_installed(name, what))
    db.register(commands)
    check.register(commands)
    relay.register(commands)
    relays.register(commands)
    sinks.register(commands)
    verify.register(commands)
    status.register(commands)
    trace.register(commands)
    transactions.register(commands)
    return parser


def _not_installed(name: str, what: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        raise error("PLUGIN_COMMAND_MISSING", name=name, what=what, install=plugins.INSTALL)

    return handler


def main(argv: Sequence[str] | None = None, **injected: object) -> int:
    """injected: objects for the command that no flag can carry (a fault test's pause points)."""
    args = build_parser().parse_args(argv)
    vars(args).update(injected)
    if args.command != "relay":  # only the daemon keeps a stop request for itself (outbox.stopping)
        release_stop_signals()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args) or 0)
    except OutboxError as exc:
        print(f"outbox: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: cut short, so no verdict
        sys.stderr.close()
        return 128 + signal.SIGPIPE  # the shell's status for a tool the closed pipe killed
