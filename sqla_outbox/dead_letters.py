"""Dead letters: the messages a relay gave up on, and what an operator does with them.

A relay charges every failed publish to the row that failed (:mod:`sqla_outbox.retries`). After
``max_publish_attempts`` failures the row becomes a **dead letter** (``dead_at`` set): no relay
claims it again, and it keeps holding back the later messages of its transaction and of its
``ordering_key``, because publishing them first would break the order they were promised. They
wait, parked, until an operator decides:

* :func:`dead_letters` lists them, in claim order, each as a :class:`DeadLetter` (the message as
  a publisher would receive it, plus ``attempts``, ``last_error`` and ``dead_at``).
* :func:`retry_dead` makes them claimable now with ``attempts`` reset: each keeps its place in
  claim order, so it is published *before* what it held back, which follows once it is.
* :func:`discard_dead` deletes them: they are never published, and what they held back flows.
  Rows parked behind them are unparked in the same transaction as the delete, because once a
  holder is gone nothing names the rows it parked (a relay's periodic sweep would free them
  anyway, seconds later).

Each takes a ``bind`` (an ``Engine``, or a URL for which it opens and disposes an engine of its
own) and checks the table first, so a missing table, a missing privilege or an older schema is
one sentence with the fix, as for a relay. ``ids`` are the messages' ids, as ``UUID`` objects or
text; a bad one is refused before anything runs. Ids that are not dead letters (published,
retried or discarded meanwhile, or never staged) are skipped: the count returned says how many
were acted on.

The ``*_dead_letters(conn, ...)`` functions do the same on a ``Connection`` inside the caller's
transaction and return the ids they changed; ``sqla-outbox dead`` uses them to name the ids it
could not find. On MySQL and MariaDB, whose UPDATE cannot return the rows it changed, they first
read the dead letters' ids ``FOR UPDATE`` and then change exactly those, in the same transaction.

The trap: the package exports a *function* named ``dead_letters``, which hides this module's name
on the package. Import from the module with ``from sqla_outbox.dead_letters import ...``;
``import sqla_outbox.dead_letters as m`` gives the function.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from sqla_outbox import queries
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.notify import wake_local
from sqla_outbox.preflight import checked_transaction
from sqla_outbox.stores.operating import operations_for

__all__ = [
    "DISCARD_PRIVILEGES",
    "LIST_PRIVILEGES",
    "RETRY_PRIVILEGES",
    "DeadLetter",
    "dead_letters",
    "discard_dead",
    "discard_dead_letters",
    "message_id",
    "message_ids",
    "read_dead_letters",
    "retry_dead",
    "retry_dead_letters",
]

# What each operation runs on the outbox table (PostgreSQL privileges, checked first).
LIST_PRIVILEGES = ("SELECT",)
RETRY_PRIVILEGES = ("SELECT", "UPDATE")
DISCARD_PRIVILEGES = ("SELECT", "UPDATE", "DELETE")

_FIELDS = len(queries.MESSAGE_FIELDS)
_ID_EXAMPLE = "0190b1f4-7c1e-7a3b-9d2e-5f6a7b8c9d0e"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the relays gave up on, with why and when.

    ``message`` is the :class:`OutboxMessage` exactly as a publisher would receive it (aware UTC
    timestamps); ``attempts`` is how many publishes failed, ``last_error`` the last failure as
    the relay recorded it (``Type: message``), ``dead_at`` when it was given up on (aware UTC).
    """

    message: OutboxMessage
    attempts: int
    last_error: str | None
    dead_at: dt.datetime

    @property
    def id(self) -> uuid.UUID:
        """The message's id: what :func:`retry_dead` and :func:`discard_dead` take."""
        return self.message.id

    @property
    def job(self) -> str:
        return self.message.job

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def ordering_key(self) -> str | None:
        return self.message.ordering_key

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: the message's (:meth:`OutboxMessage.to_dict`), then ``attempts``,
        ``last_error`` and ``dead_at`` (ISO 8601 text)."""
        return {
            **self.message.to_dict(),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "dead_at": self.dead_at.isoformat(),
        }


# --- ids ---------------------------------------------------------------------------------------


def message_id(value: object) -> uuid.UUID:
    """``value`` (a ``UUID`` or its text) as a ``UUID``, or one sentence naming it."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            pass
        raise ConfigurationError(
            f"{value!r} is not a message id: ids are UUIDs such as {_ID_EXAMPLE!r}; copy them "
            "from dead_letters() or `sqla-outbox dead list`."
        )
    raise ArgumentTypeError(
        f"{value!r} is not a message id: pass a uuid.UUID or its text (a "
        f"{type(value).__name__} was given), as dead_letters() or `sqla-outbox dead list` "
        "show them."
    )


def message_ids(ids: Iterable[uuid.UUID | str] | None) -> list[uuid.UUID] | None:
    """``ids`` checked and parsed, without duplicates, in the order given; ``None`` stays
    ``None`` (every dead letter). Raised before anything runs: one sentence naming the bad id."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes, uuid.UUID)):
        raise ArgumentTypeError(
            f"ids must be a list (or other iterable) of message ids, got the single id {ids!r}. "
            f"Pass [{ids!r}], or ids=None for every dead letter."
        )
    try:
        values = list(ids)
    except TypeError:
        raise ArgumentTypeError(
            f"ids must be a list (or other iterable) of message ids, got {ids!r}. Pass e.g. "
            "[letter.id for letter in dead_letters(engine)], or ids=None for every dead letter."
        ) from None
    return list(dict.fromkeys(message_id(value) for value in values))


# --- on a connection, in the caller's transaction ------------------------------------------------


def read_dead_letters(conn: Connection) -> list[DeadLetter]:
    """Every dead letter on ``conn``, in claim order."""
    rows = operations_for(conn.dialect.name).dead_letters(conn)
    # The statement's columns: the message's, then attempts, last_error, retry_at, dead_at.
    # Its timestamp columns are aware UTC on every dialect (UTCDateTime), as the relay's are.
    return [
        DeadLetter(
            message=OutboxMessage._make(row[:_FIELDS]),
            attempts=row.attempts,
            last_error=row.last_error,
            dead_at=row.dead_at,
        )
        for row in rows
    ]


def retry_dead_letters(conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
    """Make the dead letters ``ids`` (``None``: all) claimable now, attempts reset; return the
    ids of the rows retried."""
    if ids is not None and not ids:
        return []
    return operations_for(conn.dialect.name).retry_dead(conn, ids)


def discard_dead_letters(conn: Connection, ids: Sequence[uuid.UUID] | None) -> list[uuid.UUID]:
    """Delete the dead letters ``ids`` (``None``: all), after unparking what they held back;
    return the ids of the rows deleted. Run both in one transaction (``conn``'s)."""
    if ids is not None and not ids:
        return []
    return operations_for(conn.dialect.name).discard_dead(conn, ids)


# --- on a bind ---------------------------------------------------------------------------------


def dead_letters(bind: Engine | str | URL) -> list[DeadLetter]:
    """Every dead letter, in claim order (see the module docs).

    :param bind: an ``Engine`` or a database URL.
    """
    with checked_transaction(bind, LIST_PRIVILEGES, "dead_letters()") as conn:
        return read_dead_letters(conn)


def retry_dead(bind: Engine | str | URL, ids: Iterable[uuid.UUID | str] | None = None) -> int:
    """Make dead letters claimable now, attempts reset; return how many were retried.

    Each keeps its place in claim order: it is published before what it held back, which stays
    parked until it is. If it fails again it is charged and backs off as any message does, and
    dies again after ``max_publish_attempts`` more failures.

    :param bind: an ``Engine`` or a database URL.
    :param ids: the messages' ids (``UUID`` or text); ``None`` (default) retries every one.
        Ids that are not dead letters are skipped.
    """
    parsed = message_ids(ids)
    with checked_transaction(bind, RETRY_PRIVILEGES, "retry_dead()") as conn:
        retried = len(retry_dead_letters(conn, parsed))
    if retried:
        wake_local()  # relays of this process claim them now rather than at their next poll
    return retried


def discard_dead(bind: Engine | str | URL, ids: Iterable[uuid.UUID | str] | None = None) -> int:
    """Delete dead letters, never to be published; return how many were discarded.

    What they held back flows: rows parked behind them are unparked in the same transaction.

    :param bind: an ``Engine`` or a database URL.
    :param ids: the messages' ids (``UUID`` or text); ``None`` (default) discards every one.
        Ids that are not dead letters are skipped (a row that is not dead is never deleted).
    """
    parsed = message_ids(ids)
    with checked_transaction(bind, DISCARD_PRIVILEGES, "discard_dead()") as conn:
        discarded = len(discard_dead_letters(conn, parsed))
    if discarded:
        wake_local()
    return discarded
