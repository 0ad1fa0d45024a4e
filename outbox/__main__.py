"""`python -m outbox` and the `outbox` script: stop signals are caught before the heavy imports."""

import sys

from outbox.stopping import catch_stop_signals


def entry() -> int:
    catch_stop_signals()
    from outbox.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(entry())
