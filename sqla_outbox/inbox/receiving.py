"""``receive``: record a message's key in the consumer's own transaction, and say whether this
is the first time.

The consumer's work and the record of its key commit together or not at all, so a message is
processed effectively once however often the broker delivers it::

    with Session(engine) as session, session.begin():
        if inbox.receive(session, key, consumer="billing"):
            charge_card(session, ...)

The record is an ``INSERT`` that ignores a duplicate key (``ON CONFLICT DO NOTHING`` on
PostgreSQL and SQLite, ``INSERT IGNORE`` on MySQL and MariaDB), in the caller's transaction.
Two deliveries of one key at once: the second ``INSERT`` meets the first's uncommitted row and
waits for its transaction (PostgreSQL and InnoDB wait on the unique key; SQLite admits one
writer at a time); if the first commits, the second inserts nothing and ``receive`` returns
``False``; if it rolls back, the second inserts and returns ``True``, and does the work. So
"check, then work, then record" in separate transactions, the race this module exists to
remove, never happens.

Keys and consumer names are checked before anything runs: ``None``, ``''``, more than
:data:`~sqla_outbox.inbox.model.KEY_LENGTH` characters, a NUL or a lone surrogate raise
``ValueError`` naming the value and the fix, and the session is left as it was.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from sqlalchemy import Connection, Insert, func, insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from sqla_outbox.clock import server_clock
from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.inbox.counting import count_duplicate
from sqla_outbox.inbox.model import KEY_LENGTH, InboxRow, inbox_table
from sqla_outbox.validation import checked_text

__all__ = ["DEFAULT_CONSUMER", "receive", "record_stmt"]

DEFAULT_CONSUMER = "default"


def receive(session: Session | Connection, key: str, *, consumer: str = DEFAULT_CONSUMER) -> bool:
    """Record ``key`` for ``consumer`` in ``session``'s transaction: ``True`` the first time,
    ``False`` when a committed transaction already recorded it (see the module docs).

    :param session: the ``Session`` (or Core ``Connection``) whose transaction does the work.
        With an ``AsyncSession``: ``await session.run_sync(inbox.receive, key)``.
    :param key: the message's idempotency key (:func:`sqla_outbox.inbox.key_of` reads it from
        each bundled broker's message).
    :param consumer: who processes it: each consumer of one message records it on its own.
    """
    checked_consumer = _checked("consumer", consumer)
    checked_key = _checked("key", key)
    if isinstance(session, Session):
        dialect = session.get_bind(mapper=InboxRow).dialect.name
    elif isinstance(session, Connection):
        dialect = session.dialect.name
    else:
        raise ArgumentTypeError(
            f"receive needs a Session or a Connection, got {session!r}. With an AsyncSession: "
            "await session.run_sync(inbox.receive, key)."
        )
    params: dict[str, Any] = {"consumer": checked_consumer, "key": checked_key}
    if not server_clock(dialect):
        params["received_at"] = dt.datetime.now(dt.timezone.utc)
    result = session.execute(record_stmt(dialect), params)
    # MySQL has no INSERT ... RETURNING; PyMySQL's rowcount of INSERT IGNORE is reliable.
    mysql = dialect in MYSQL_DIALECTS
    first = result.rowcount == 1 if mysql else result.first() is not None  # type: ignore[attr-defined]
    if not first:
        count_duplicate(checked_consumer)
    return first


@functools.cache
def record_stmt(dialect: str) -> Insert:
    """The ``INSERT`` of one ``(consumer, key)`` that does nothing for a key already there;
    ``received_at`` is the database's clock where it rules (:mod:`sqla_outbox.clock`). Built
    once per dialect: building the statement costs more than SQLAlchemy's cached compile of it."""
    table = inbox_table
    # RETURNING says whether the row went in (rowcount is not reliable across drivers for an
    # INSERT that may do nothing); MySQL has no INSERT ... RETURNING, and PyMySQL's rowcount is.
    if dialect == "postgresql":
        inserted = postgresql.insert(table).values(received_at=func.now())
        return inserted.on_conflict_do_nothing().returning(table.c.key)
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing().returning(table.c.key)
    if dialect in MYSQL_DIALECTS:
        # IGNORE also turns other errors into warnings: every value is checked before it runs.
        return insert(table).prefix_with("IGNORE")
    raise ConfigurationError(
        f"the inbox runs on PostgreSQL, SQLite, MySQL and MariaDB, not {dialect!r}."
    )


def _checked(name: str, value: object) -> str:
    fix = f" Pass the message's idempotency key as a str of 1 to {KEY_LENGTH} characters."
    if name == "consumer":
        fix = f" Pass a consumer name of 1 to {KEY_LENGTH} characters, e.g. consumer='billing'."
    if value is None or value == "":  # no key at all is a bad value here, not a bad type
        raise ConfigurationError(f"{name} must be a non-empty str, got {value!r}.{fix}")
    return checked_text(name, value, fix, optional=False)
