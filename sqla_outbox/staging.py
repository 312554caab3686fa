"""Staging: ``enqueue`` a job into the caller's transaction, insert it just before COMMIT.

How it works, and the traps it closes:

* ``enqueue`` validates its arguments, builds an :class:`OutboxMessage` and appends it to a list
  in ``session.info``, tagged with the transaction it was staged in: the innermost open
  SAVEPOINT (``begin_nested()``) or else the root transaction (begun here if the session has
  none yet, exactly as ``session.add`` would autobegin it).
* The list is tied to the session's database connection for the outbox table, and the rows are
  inserted by that connection's ``commit`` event: after the session's last flush, immediately
  before the ``COMMIT`` statement, through the same connection and transaction, in **one**
  ``executemany`` statement. The rows therefore commit with the business rows or not at all.
* Because the write waits for the ``COMMIT`` itself, everything staged before it is written:
  enqueues from ``before_flush``/``after_flush``/``after_flush_postexec`` hooks (the "domain
  events from flush hooks" pattern, including the flushes ``commit()`` runs itself) and from the
  application's own ``before_commit`` listeners, whatever order listeners were registered in.
  A session-level ``before_commit`` listener would not do: ``Session.commit()`` flushes *after*
  firing it, so a flush hook's enqueue would come too late.
* Too late means after that last flush: once the transaction is committing or committed
  (``after_commit`` listeners, a connection-level ``commit`` listener) ``enqueue`` raises
  :class:`~sqla_outbox.errors.StagingError` rather than return and drop the job. In an
  ``after_transaction_end`` listener the session has no transaction any more, so ``enqueue``
  starts the next one, as ``session.add`` would.
* A rolled-back SAVEPOINT drops the messages staged inside it *and* inside any savepoint that
  was released into it, because a message's transaction keeps its parent chain after it ends.
  A released one keeps them: they belong to the enclosing transaction.
* A rollback, a failed commit or ``close()`` of the root transaction drops everything; the
  session can be used again at once.
* After the root commit, relays running in this process are woken at once
  (:mod:`sqla_outbox.notify`); on PostgreSQL a trigger also notifies LISTENing relays elsewhere.
* The listeners are registered on the ``Session`` class when this module is imported, so every
  ``Session``, ``sessionmaker``, ``scoped_session`` and ``AsyncSession`` (whose sync session is a
  ``Session``) is covered without an install step. A session that never enqueues pays one dict
  lookup per transaction event.
* A session joined to an external transaction (``Session(bind=connection)``, the test-suite
  pattern) does not commit that connection; its messages are written when the external
  transaction commits, and vanish with it if it rolls back.

A plain ``Session`` attaches the list to its connection at the first ``enqueue`` (checking the
connection out, as the first flush would). An ``AsyncSession`` cannot do I/O inside the
synchronous ``enqueue`` call, so it attaches in ``before_commit``, which runs inside
``await session.commit()``; enqueues made later in the commit (flush hooks) attach at once.

A Core ``Connection`` has no commit hook to defer to; ``enqueue`` inserts at once on the
connection's current transaction, which is the same guarantee.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from sqla_outbox.errors import ArgumentTypeError, StagingError
from sqla_outbox.input_size import DEFAULT_MAX_INPUT_BYTES, check_input_size, max_input_bytes
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import OutboxRow
from sqla_outbox.notify import wake_local
from sqla_outbox.queries import stage_rows
from sqla_outbox.schema_errors import raise_if_missing_table
from sqla_outbox.stores import insert_staged
from sqla_outbox.validation import MAX_INPUT_DEPTH, build_message, max_input_depth

__all__ = ["enqueue", "staged"]

_INFO_KEY = "sqla_outbox.staging"


@dataclass(slots=True)
class _Entry:
    message: OutboxMessage
    owner: SessionTransaction


@dataclass(slots=True)
class _Staging:
    """What one session has staged in its current root transaction.

    Once attached, the connection's entry in ``_attached`` holds it too: the write happens at
    that connection's COMMIT, which for a session joined to an external transaction is after the
    session itself is done.
    """

    staged_at: dt.datetime
    # How deep input may nest on the outbox table's database (validation.max_input_depth).
    max_depth: int = MAX_INPUT_DEPTH
    # The largest input accepted there, and the dialect it is measured for (input_size).
    max_bytes: int = DEFAULT_MAX_INPUT_BYTES
    dialect: str = ""
    entries: list[_Entry] = field(default_factory=list)
    # The connection whose COMMIT writes the entries; None until attached.
    connection: Connection | None = None
    # The entries were inserted: wake this process's relays once the root commits.
    inserted: bool = False
    # The session's root transaction committed; what is still unwritten waits for the
    # external transaction it joined.
    committed: bool = False

    def attach(self, session: Session) -> None:
        """Have the outbox table's connection of ``session`` write the entries at its COMMIT."""
        if self.connection is not None:
            return
        connection = session.connection(bind_arguments={"mapper": OutboxRow})
        _listen_on(connection.engine)
        _attached.setdefault(connection, []).append(self)
        self.connection = connection

    def write(self, connection: Connection) -> None:
        """Insert every surviving entry on ``connection``, in one statement."""
        if not self.entries:
            return
        _insert(connection, [entry.message for entry in self.entries])
        # From here the rows' fate is the transaction's: if the COMMIT still fails, the rollback
        # takes the rows, and the caller retries the whole unit of work, messages included.
        self.entries.clear()
        self.inserted = True


# What each connection writes at its COMMIT (or drops at its ROLLBACK): the stagings attached to
# it, oldest first. Weak, so a connection that is closed and dropped takes its entry with it.
# One listener per engine rather than per connection: adding an event listener costs about as
# much as the rest of an enqueue, and a connection is made per transaction.
_attached: weakref.WeakKeyDictionary[Connection, list[_Staging]] = weakref.WeakKeyDictionary()
_listening: weakref.WeakSet[Engine] = weakref.WeakSet()
_listening_lock = threading.Lock()


def _listen_on(engine: Engine) -> None:
    if engine in _listening:
        return
    with _listening_lock:
        if engine not in _listening:
            event.listen(engine, "commit", _write_attached)
            # A two-phase commit sends PREPARE TRANSACTION first and fires no plain "commit".
            event.listen(engine, "prepare_twophase", _write_attached)
            event.listen(engine, "rollback", _drop_attached)
            _listening.add(engine)


def _write_attached(connection: Connection, *_xid: Any) -> None:
    try:
        for staging in _attached.pop(connection, ()):
            staging.write(connection)
    except BaseException:
        # The COMMIT will not be sent, yet SQLAlchemy ends the transaction as if it had been,
        # and so skips the pool's rollback on return: roll back here, or the connection goes
        # back to the pool inside a failed transaction.
        with contextlib.suppress(Exception):
            connection.connection.driver_connection.rollback()  # type: ignore[union-attr]
        raise


def _drop_attached(connection: Connection) -> None:
    for staging in _attached.pop(connection, ()):
        staging.entries.clear()


def _resolve(session: Any) -> tuple[Session | Connection, bool]:
    """The sync ``Session`` (or Core ``Connection``) behind whatever the caller holds, and
    whether it came from an ``AsyncSession`` (which cannot do I/O inside ``enqueue``)."""
    if isinstance(session, (Session, Connection)):
        return session, False
    if isinstance(session, scoped_session):
        resolved: Session = session()
        return resolved, False
    # Only an application that imported SQLAlchemy's asyncio extension can hold an
    # AsyncSession, so plain-sync users never import it (nor greenlet) through us.
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is not None:
        if isinstance(session, asyncio_ext.async_scoped_session):
            session = session()
        if isinstance(session, asyncio_ext.AsyncSession):
            sync: Session = session.sync_session
            return sync, True
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
        if not transaction.is_active:
            raise StagingError(
                "enqueue was called after this session's transaction stopped taking work (it is "
                "committing, committed, or a failed flush left it needing rollback()), so the "
                "message could not be written with it. Enqueue before commit() (before_commit "
                "listeners and flush hooks are in time), or in the next transaction."
            )
        return transaction
    if not session.autobegin:
        raise StagingError(
            "this Session has autobegin=False and no transaction, so there is nothing for the "
            "message to commit with. Call session.begin() before outbox.enqueue()."
        )
    return session.begin()


def _limits(session: Session) -> tuple[int, int, str]:
    """How deep and how large input may be on the database ``session`` writes the outbox
    table to, and that database's dialect name.

    ``get_bind`` names the engine (or connection) without connecting, so this works inside an
    ``AsyncSession``'s synchronous ``enqueue`` too; the size cap is one of its execution options
    (:mod:`sqla_outbox.input_size`). A session with no bind fails when it attaches, as it always
    has; until then the general limits apply.
    """
    try:
        bind = session.get_bind(mapper=OutboxRow)
    except UnboundExecutionError:
        return MAX_INPUT_DEPTH, DEFAULT_MAX_INPUT_BYTES, ""
    dialect = bind.dialect.name
    return (
        max_input_depth(dialect),
        max_input_bytes(bind.get_execution_options(), dialect),
        dialect,
    )


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
    ordering_key: str | None = None,
) -> OutboxMessage:
    """Stage ``job`` in ``session``'s transaction; it is written when that transaction commits.

    Returns the staged message (its ``id`` and ``idempotency_key`` are final). Every argument is
    checked here, so a bad call raises at this line and stages nothing: ``TypeError`` for input
    that is not JSON or arguments of the wrong type, ``ValueError`` for values the table or the
    database would refuse. ``input`` is copied here, so changing the caller's object afterwards
    changes nothing that is written. Calling it from flush hooks and ``before_commit`` listeners
    is fine; from ``after_commit`` it raises :class:`StagingError`. ``ordering_key``: messages
    sharing it are published in staging order across transactions and relays (a held-back one
    holds back only its own key and transaction). See the module documentation for savepoints
    and rollbacks.

    ``max_attempts`` is for the **consumer**: it travels with the message (a Celery task's
    retries, a header elsewhere) and says how often the job may be run. It is not how often the
    relay tries to *publish* the message: that is the relay's ``max_publish_attempts``, after
    which the message becomes a dead letter.
    """
    target, is_async = _resolve(session)
    options: dict[str, Any] = {
        "queue": queue,
        "run_at": run_at,
        "idempotency_key": idempotency_key,
        "tenant_id": tenant_id,
        "enqueued_by": enqueued_by,
        "traceparent": traceparent,
        "max_attempts": max_attempts,
        "ordering_key": ordering_key,
    }
    if isinstance(target, Connection):
        now = dt.datetime.now(dt.timezone.utc)
        dialect = target.dialect.name
        depth = max_input_depth(dialect)
        message = build_message(job, input, staged_at=now, max_depth=depth, **options)
        cap = max_input_bytes(target.get_execution_options(), dialect)
        check_input_size(message.job, message.input, cap, dialect)
        _insert(target, [message])
        return message

    staging: _Staging | None = target.info.get(_INFO_KEY)
    # Every message of a transaction shares the staged_at of its first one, so claim order
    # (staged_at, id) keeps enqueue order inside the transaction; see sqla_outbox.ids.
    staged_at = staging.staged_at if staging else dt.datetime.now(dt.timezone.utc)
    depth, cap, dialect = (
        (staging.max_depth, staging.max_bytes, staging.dialect) if staging else _limits(target)
    )
    message = build_message(job, input, staged_at=staged_at, max_depth=depth, **options)
    check_input_size(message.job, message.input, cap, dialect)
    # Begun only once the call is known to be good, so a refused call leaves the session as is.
    root = _root_transaction(target)
    if staging is None:
        staging = _Staging(staged_at, depth, cap, dialect)
    if not is_async:
        staging.attach(target)  # before staging: a failed checkout stages nothing
    target.info[_INFO_KEY] = staging
    staging.entries.append(_Entry(message, target.get_nested_transaction() or root))
    return message


def staged(session: Any) -> tuple[OutboxMessage, ...]:
    """The messages ``session`` has staged and not yet written, in enqueue order.

    Empty after a commit, a rollback or a ``close()``; a rolled-back savepoint removes its own.
    """
    target, _ = _resolve(session)
    if isinstance(target, Connection):
        return ()
    staging: _Staging | None = target.info.get(_INFO_KEY)
    return tuple(entry.message for entry in staging.entries) if staging else ()


def _insert(connection: Connection, messages: list[OutboxMessage]) -> None:
    """INSERT ``messages`` on ``connection`` in one statement, the way its store does it
    (:func:`sqla_outbox.stores.insert_staged`)."""
    with raise_if_missing_table(connection):
        insert_staged(connection, stage_rows(messages))


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    # An AsyncSession's enqueues are attached here, inside the awaited commit, where I/O works.
    staging: _Staging | None = session.info.get(_INFO_KEY)
    if staging is not None and staging.entries:
        staging.attach(session)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    staging: _Staging | None = session.info.get(_INFO_KEY)
    # after_commit also fires when a savepoint is released; only the root's commit counts.
    if staging is None or session.get_nested_transaction() is not None:
        return
    # If the entries are still unwritten, the session joined a transaction it does not own:
    # they wait for that transaction's COMMIT, and go if it rolls back.
    staging.committed = True
    if staging.inserted:
        wake_local()


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return
    staging: _Staging | None = session.info.pop(_INFO_KEY, None)
    if staging is not None and not staging.committed:
        # Rolled back, closed or failed: the attached connection must not write these later
        # (it may outlive the session when the session joined an external transaction).
        staging.entries.clear()


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
    staging.entries[:] = [e for e in staging.entries if not _inside(e.owner, boundary)]


def _inside(transaction: SessionTransaction, ancestor: SessionTransaction) -> bool:
    node: SessionTransaction | None = transaction
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False
