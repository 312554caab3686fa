"""``python -m sqla_outbox`` is the ``sqla-outbox`` command."""

from sqla_outbox.cli import main

raise SystemExit(main())
