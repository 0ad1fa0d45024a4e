import sys

from outbox.cli import main

sys.exit(main())
