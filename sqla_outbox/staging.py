"""Staging: ``enqueue`` a job into the caller's transaction, insert it when that commits.

How it works, and the traps it closes:

* ``enqueue`` validates its arguments, builds an :class:`OutboxMessage` and appends it to a list
  in ``session.info``, tagged with the transaction it was staged in: the innermost open
  SAVEPOINT (``begin_nested()``) or else the root transaction (begun here if the session has
  none yet, exactly as ``session.add`` would autobegin it). Nothing touches the database yet.
* When the **root** transaction commits, ``before_commit`` inserts every surviving message
  through the session's own connection, inside the committing transaction, in **one**
  ``executemany`` statement. The rows therefore commit with the business rows or not at all.
* ``before_commit`` also fires when a SAVEPOINT is released. A release inserts nothing: its
  messages simply stay staged and now belong to whatever encloses the savepoint.
* A rolled-back SAVEPOINT drops the messages staged inside it *and* inside any savepoint that
  was released into it, because a message's transaction keeps its parent chain after it ends.
* A rollback, a failed commit or ``close()`` of the root transaction drops everything; the
  session can be used again at once.
* After the root commit, relays running in this process are woken at once
  (:mod:`sqla_outbox.notify`); on PostgreSQL a trigger also notifies LISTENing relays elsewhere.
* The listeners are registered on the ``Session`` class when this module is imported, so every
  ``Session``, ``sessionmaker``, ``scoped_session`` and ``AsyncSession`` (whose sync session is a
  ``Session``) is covered without an install step. A session that never enqueues pays one dict
  lookup per transaction event.

A Core ``Connection`` has no commit hook to defer to; ``enqueue`` inserts at once on the
connection's current transaction, which is the same guarantee.
"""

from __future__ import annotations

import datetime as dt
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Dialect, event
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from sqla_outbox import driver_sql
from sqla_outbox.errors import ArgumentTypeError, StagingError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import OutboxRow
from sqla_outbox.notify import wake_local
from sqla_outbox.queries import stage_rows, stage_stmt
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.validation import build_message

__all__ = ["enqueue", "staged"]

_INFO_KEY = "sqla_outbox.staging"


@dataclass(slots=True)
class _Entry:
    message: OutboxMessage
    owner: SessionTransaction


@dataclass(slots=True)
class _Staging:
    """What one session has staged in its current root transaction."""

    staged_at: dt.datetime
    entries: list[_Entry] = field(default_factory=list)
    # The savepoint that was innermost at the last before_commit; see _before_commit.
    pending_release: SessionTransaction | None = None
    # Rows were inserted in this transaction: wake this process's relays once it commits.
    inserted: bool = False


def _resolve(session: Any) -> Session | Connection:
    """The sync ``Session`` (or Core ``Connection``) behind whatever the caller holds."""
    if isinstance(session, (Session, Connection)):
        return session
    if isinstance(session, scoped_session):
        resolved: Session = session()
        return resolved
    # Only an application that imported SQLAlchemy's asyncio extension can hold an
    # AsyncSession, so plain-sync users never import it (nor greenlet) through us.
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is not None:
        if isinstance(session, asyncio_ext.async_scoped_session):
            session = session()
        if isinstance(session, asyncio_ext.AsyncSession):
            sync: Session = session.sync_session
            return sync
        if isinstance(session, asyncio_ext.AsyncConnection):
            raise ArgumentTypeError(
                "enqueue cannot insert through an AsyncConnection without awaiting. Use an "
                "AsyncSession, or call it inside await conn.run_sync(outbox.enqueue, job, input)."
            )
    raise ArgumentTypeError(
        f"enqueue needs a Session, AsyncSession, scoped_session or Connection, got {session!r}."
    )


def _root_transaction(session: Session) -> SessionTransaction:
    transaction = session.get_transaction()
    if transaction is not None:
        return transaction
    if not session.autobegin:
        raise StagingError(
            "this Session has autobegin=False and no transaction, so there is nothing for the "
            "message to commit with. Call session.begin() before outbox.enqueue()."
        )
    return session.begin()


def enqueue(
    session: Any,
    job: Any,
    input: Any = None,
    *,
    queue: str | None = None,
    run_at: dt.datetime | dt.timedelta | None = None,
    idempotency_key: str | None = None,
    tenant_id: str | None = None,
    enqueued_by: str | None = None,
    traceparent: str | None = None,
    max_attempts: int | None = None,
) -> OutboxMessage:
    """Stage ``job`` in ``session``'s transaction; it is written when that transaction commits.

    Returns the staged message (its ``id`` and ``idempotency_key`` are final). Every argument is
    checked here, so a bad call raises at this line and stages nothing: ``TypeError`` for input
    that is not JSON or arguments of the wrong type, ``ValueError`` for bad values (a naive
    ``run_at``, an empty job name). See the module documentation for savepoints and rollbacks.
    """
    target = _resolve(session)
    options: dict[str, Any] = {
        "queue": queue,
        "run_at": run_at,
        "idempotency_key": idempotency_key,
        "tenant_id": tenant_id,
        "enqueued_by": enqueued_by,
        "traceparent": traceparent,
        "max_attempts": max_attempts,
    }
    if isinstance(target, Connection):
        now = dt.datetime.now(dt.timezone.utc)
        message = build_message(job, input, staged_at=now, **options)
        _insert(target, [message])
        return message

    staging: _Staging | None = target.info.get(_INFO_KEY)
    # Every message of a transaction shares the staged_at of its first one, so claim order
    # (staged_at, id) keeps enqueue order inside the transaction; see sqla_outbox.ids.
    staged_at = staging.staged_at if staging else dt.datetime.now(dt.timezone.utc)
    message = build_message(job, input, staged_at=staged_at, **options)
    # Begun only once the call is known to be good, so a refused call leaves the session as is.
    root = _root_transaction(target)
    if staging is None:
        staging = target.info[_INFO_KEY] = _Staging(staged_at)
    staging.entries.append(_Entry(message, target.get_nested_transaction() or root))
    return message


def staged(session: Any) -> tuple[OutboxMessage, ...]:
    """The messages ``session`` has staged and not yet committed, in enqueue order.

    Empty after a commit, a rollback or a ``close()``; a rolled-back savepoint removes its own.
    """
    target = _resolve(session)
    if isinstance(target, Connection):
        return ()
    staging: _Staging | None = target.info.get(_INFO_KEY)
    return tuple(entry.message for entry in staging.entries) if staging else ()


_stage_sql: weakref.WeakKeyDictionary[Dialect, driver_sql.Precompiled]
_stage_sql = weakref.WeakKeyDictionary()


def _insert(connection: Connection, messages: list[OutboxMessage]) -> None:
    """INSERT ``messages`` on ``connection`` in one statement (an executemany for several).

    On psycopg the INSERT is compiled once per engine and sent as driver SQL (see
    :mod:`sqla_outbox.driver_sql`), with the input wrapped in ``Jsonb`` exactly as SQLAlchemy's
    own JSONB type would; ``None`` stays JSON ``null``, as it does there.
    """
    rows = stage_rows(messages)
    dialect = connection.dialect
    with raise_if_missing_table(connection):
        if not driver_sql.applies(dialect, connection.get_execution_options()):
            connection.execute(stage_stmt(), rows)
            return
        from psycopg.types.json import Jsonb  # noqa: PLC0415 - psycopg is this branch's driver

        for row in rows:
            row["input"] = Jsonb(row["input"])
        stage = _stage_sql.get(dialect)
        if stage is None:
            stage = _stage_sql[dialect] = driver_sql.precompile(
                stage_stmt(), dialect, OutboxMessage._fields
            )
        connection.exec_driver_sql(stage.sql, rows)


def _insert_staged(session: Session, staging: _Staging) -> None:
    messages = [entry.message for entry in staging.entries]
    _insert(session.connection(bind_arguments={"mapper": OutboxRow}), messages)
    # From here the rows' fate is the transaction's: if the commit still fails, the rollback
    # takes the rows, and the caller retries the whole unit of work, messages included.
    staging.entries.clear()
    staging.inserted = True


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    staging: _Staging | None = session.info.get(_INFO_KEY)
    # after_commit also fires when a savepoint is released; only the root's commit counts.
    if staging is not None and staging.inserted and session.get_nested_transaction() is None:
        wake_local()


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    staging: _Staging | None = session.info.get(_INFO_KEY)
    if not staging or not staging.entries:
        return
    savepoint = session.get_nested_transaction()
    if savepoint is None:
        _insert_staged(session, staging)
    elif staging.pending_release is savepoint:
        # A second before_commit with the same savepoint innermost and not yet ended: the first
        # one was the ROOT committing while the savepoint was still open (it commits open
        # savepoints after firing its own before_commit). Insert now, inside the savepoint that
        # is about to be released with everything else, or these messages would be lost.
        _insert_staged(session, staging)
    else:
        # Most likely this savepoint's own release; nothing to write until the root commits.
        staging.pending_release = savepoint


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    staging: _Staging | None = session.info.get(_INFO_KEY)
    if staging is None:
        return
    if transaction is staging.pending_release:
        staging.pending_release = None
    if transaction.parent is None:
        del session.info[_INFO_KEY]


@event.listens_for(Session, "after_soft_rollback")
def _after_soft_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    staging: _Staging | None = session.info.get(_INFO_KEY)
    if staging is None:
        return
    # The rollback took effect at the nearest savepoint or root, whatever inner (e.g. flush)
    # transaction it was called on.
    boundary = previous_transaction
    while boundary.parent is not None and not boundary.nested:
        boundary = boundary.parent
    staging.entries = [e for e in staging.entries if not _inside(e.owner, boundary)]


def _inside(transaction: SessionTransaction, ancestor: SessionTransaction) -> bool:
    node: SessionTransaction | None = transaction
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False
