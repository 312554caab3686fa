"""``python -m sqla_outbox.cli``: the console script."""

import sys

from sqla_outbox.cli import main

sys.exit(main())
