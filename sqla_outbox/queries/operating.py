"""The operators' statements: what ``status``, the dead-letter operations, the metrics scrape
and retention run.

None of them is fenced: they run outside any claim, and a dead letter is never claimed, so no
relay holds the rows they change. Each restricts itself to the rows one partial index covers,
so its cost follows the backlog (or the published history, for a purge), never the whole table.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Delete,
    Select,
    String,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import Label

from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.model import UTCDateTime
from sqla_outbox.queries.terms import (
    MESSAGE_COLUMNS,
    charged,
    ids_param,
    later_of,
    now,
    outbox_table,
    unpublished,
)

__all__ = [
    "backlog_stmt",
    "claims_stmt",
    "dead_letters_stmt",
    "delete_dead_stmt",
    "holding_stmt",
    "notify_stmt",
    "pending_stmt",
    "purge_stmt",
    "retry_dead_stmt",
    "status_stmt",
]


def pending_stmt() -> Select[int]:
    """How many committed rows are not yet published (dead letters included)."""
    return select(func.count()).select_from(outbox_table).where(unpublished())


def _oldest_due(table: Any, at: ColumnElement[dt.datetime]) -> Label[dt.datetime]:
    """``oldest_due_at``: when the longest-waiting unpublished row came due, the later of its
    ``staged_at`` and ``run_at``, among the rows due by ``at`` (dead letters and rows in a
    retry backoff included: they are late too); NULL when none is.

    What an age alert measures. From ``staged_at`` alone, a message scheduled an hour ahead would
    be "older" than ``status --max-age`` the moment it is staged, and a probe would page for it
    until it is due and published.
    """
    came_due = later_of(table.c.run_at, table.c.staged_at)
    return func.min(case((table.c.run_at <= at, came_due))).label("oldest_due_at")


def status_stmt(dialect: str) -> Select[int, int, Any, int, int, int, int]:
    """The backlog in one query: ``pending``, ``due``, ``oldest_due_at`` (:func:`_oldest_due`),
    ``failing`` (rows with failed attempts), ``dead``, ``backing_off`` (waiting out a retry
    backoff) and ``parked`` (held back behind a failed or dead row; not the rows parked until
    they are due, which are scheduled or backing off).

    Every figure is about unpublished rows, so that is the WHERE clause, which the partial index
    ``ix_outbox_unpublished`` covers: the cost follows the backlog, not the published history.
    The counts are ``count(CASE WHEN ... THEN 1 END)``: MySQL and MariaDB have no
    ``FILTER (WHERE ...)``, and over the unpublished rows alone this one spelling is cheap on
    PostgreSQL too.
    """
    t = outbox_table
    at = now(dialect)
    alive = t.c.dead_at.is_(None)

    def rows(*conditions: ColumnElement[bool]) -> ColumnElement[int]:
        return func.count(case((and_(*conditions), literal_column("1"))))

    due = rows(
        alive, t.c.run_at <= at, ~t.c.parked, or_(t.c.retry_at.is_(None), t.c.retry_at <= at)
    )
    return (
        select(
            func.count().label("pending"),
            due.label("due"),
            _oldest_due(t, at),
            rows(charged(t)).label("failing"),
            rows(t.c.dead_at.is_not(None)).label("dead"),
            rows(alive, t.c.retry_at > at).label("backing_off"),
            rows(alive, t.c.parked, t.c.wake_at.is_(None)).label("parked"),
        )
        .select_from(t)
        .where(unpublished())
    )


def claims_stmt() -> Select[Any]:
    """Claims holding unpublished rows, per fence token: token, rows ``held``, ``claimed_at``."""
    return (
        select(
            outbox_table.c.claimed_by,
            func.count().label("held"),
            func.min(outbox_table.c.claimed_at).label("claimed_at"),
        )
        .where(unpublished(), outbox_table.c.claimed_by.is_not(None))
        .group_by(outbox_table.c.claimed_by)
        .order_by(outbox_table.c.claimed_by)
    )


_FAILURE_COLUMNS = (
    outbox_table.c.attempts,
    outbox_table.c.last_error,
    outbox_table.c.retry_at,
    outbox_table.c.dead_at,
)


def holding_stmt() -> Select[Any]:
    """The failed rows holding others back, in claim order, up to ``:limit``: each message's
    columns, then ``attempts``, ``last_error``, ``retry_at`` and ``dead_at``."""
    t = outbox_table
    return (
        select(*MESSAGE_COLUMNS, *_FAILURE_COLUMNS)
        .where(unpublished(), charged(t))
        .order_by(t.c.staged_at, t.c.id)
        .limit(bindparam("limit"))
    )


def _dead(ids: bool, dialect: str) -> list[ColumnElement[bool]]:
    conditions = [unpublished(), outbox_table.c.dead_at.is_not(None)]
    if ids:
        conditions.append(ids_param(dialect))
    return conditions


def dead_letters_stmt(
    dialect: str = "postgresql", *, ids: bool = False, lock: bool = False
) -> Select[Any]:
    """Every dead letter in claim order (with ``ids``, those among ``:ids``): the message's
    columns, then ``attempts``, ``last_error``, ``retry_at`` (NULL) and ``dead_at``.

    ``lock=True``: only their ``id``, locked ``FOR UPDATE``. MySQL's UPDATE and DELETE cannot
    return the rows they change (MariaDB's UPDATE neither), so there the dead-letter operations
    read the ids this way first and run :func:`retry_dead_stmt` or :func:`delete_dead_stmt` on
    them, in the same transaction: locked, the rows read are exactly the rows changed, whatever
    another operator does meanwhile.
    """
    t = outbox_table
    if lock:
        return (
            select(t.c.id)
            .where(*_dead(ids, dialect))
            .order_by(t.c.staged_at, t.c.id)
            .with_for_update()
        )
    return (
        select(*MESSAGE_COLUMNS, *_FAILURE_COLUMNS)
        .where(*_dead(ids, dialect))
        .order_by(t.c.staged_at, t.c.id)
    )


def retry_dead_stmt(dialect: str, *, ids: bool) -> Update:
    """Make dead letters claimable again (all, or ``:ids``), attempts reset to 0; returns the
    ``id`` of each row it changed, except on MySQL and MariaDB (no ``UPDATE ... RETURNING``:
    run it on the ids :func:`dead_letters_stmt` locked).

    They keep their place in claim order, so a retried dead letter is published before what it
    held back (which stays parked until it is). ``last_error`` is kept: it says why the row died
    until a new failure replaces it.
    """
    statement = (
        update(outbox_table)
        .where(*_dead(ids, dialect))
        .values(dead_at=null(), retry_at=null(), attempts=0, claimed_by=null(), claimed_at=null())
    )
    if dialect in MYSQL_DIALECTS:
        return statement
    return statement.returning(outbox_table.c.id)


def delete_dead_stmt(dialect: str, *, ids: bool) -> Delete:
    """Delete dead letters (all, or ``:ids``): never published; returns the ``id`` of each row
    it deleted, except on MySQL and MariaDB (as :func:`retry_dead_stmt`). Run after
    :func:`~sqla_outbox.queries.parking.unpark_behind_stmt` for the same rows, in the same
    transaction: once a holder is gone, nothing names the rows it parked."""
    statement = delete(outbox_table).where(*_dead(ids, dialect))
    if dialect in MYSQL_DIALECTS:
        return statement
    # SQLAlchemy 2.1 declares its typing-only ReturningDelete a subclass of Update (a slip
    # upstream); the statement is a Delete.
    return statement.returning(outbox_table.c.id)  # type: ignore[return-value]


def backlog_stmt(dialect: str) -> Select[int, int, Any, Any]:
    """The backlog gauges in one query: ``pending`` (unpublished, dead letters included), ``dead``,
    ``oldest_due_at`` (:func:`_oldest_due`) and ``now`` (the database's clock on PostgreSQL, the
    ``:now`` parameter elsewhere) to measure its age against.

    The numbers of :func:`status_stmt`, for a metrics scrape: restricted to unpublished rows in
    its WHERE clause, which the partial index ``ix_outbox_unpublished`` covers, so its cost
    follows the backlog and not the history of published rows still in the table. ``dead`` is
    ``count(CASE ...)`` as there; ``now`` is cast on MySQL and MariaDB as in
    :func:`~sqla_outbox.queries.parking.idle_stmt`.
    """
    t = outbox_table
    at = now(dialect)
    return (
        select(
            func.count().label("pending"),
            func.count(case((t.c.dead_at.is_not(None), literal_column("1")))).label("dead"),
            _oldest_due(t, at),
            (cast(at, UTCDateTime()) if dialect in MYSQL_DIALECTS else at).label("now"),
        )
        .select_from(t)
        .where(unpublished())
    )


def purge_stmt(dialect: str) -> Delete:
    """Delete up to ``:limit`` published rows whose ``published_at`` is before ``:cutoff``, oldest
    first; ``rowcount`` says how many (:mod:`sqla_outbox.retention` runs it, batch by batch).

    Only published rows can match (``published_at < :cutoff`` is never true of NULL), so an
    unpublished row, a claimed one, one backing off or a dead letter is never deleted.
    ``ix_outbox_published`` (schema version 3) hands the rows over in ``published_at`` order, so
    a batch reads what it deletes and nothing else. On PostgreSQL they are locked ``FOR UPDATE
    SKIP LOCKED``: relays lock only unpublished rows, so the lock is for another purge running
    at the same time (a second relay's, an operator's), which then deletes other rows instead of
    waiting for these; and ``= ANY(ARRAY(...))`` keeps the delete on the primary key, as in the
    claim. SQLite has one writer at a time: a plain ``IN (...)``.

    MySQL and MariaDB take neither ``LIMIT`` in an ``IN (...)`` subquery nor a subquery on the
    table a DELETE deletes from: there the batch is a derived table (materialized first, for its
    ``LIMIT``) joined to the table, ``DELETE FROM outbox USING outbox, (SELECT ...) AS oldest``,
    which deletes through the primary key as PostgreSQL's does. Run it at ``READ COMMITTED``
    there (:func:`sqla_outbox.retention.purge_batches` does), or InnoDB's next-key locks over
    the range read would make inserts of new rows wait for the batch.
    """
    t = outbox_table
    oldest = (
        select(t.c.id)
        .where(t.c.published_at < bindparam("cutoff", type_=UTCDateTime()))
        .order_by(t.c.published_at)
        .limit(bindparam("limit"))
    )
    chosen: ColumnElement[bool]
    if dialect == "postgresql":
        locked = oldest.with_for_update(skip_locked=True).scalar_subquery()
        chosen = t.c.id == any_(func.array(locked))
    elif dialect in MYSQL_DIALECTS:
        batch = oldest.subquery("oldest")
        chosen = t.c.id == batch.c.id
    else:
        chosen = t.c.id.in_(oldest)
    return delete(t).where(chosen)


def notify_stmt() -> Select[Any]:
    """PostgreSQL: ``pg_notify(:channel, '')``, the wake-up a commit of new rows sends
    (:mod:`sqla_outbox.notify`), for operations that free rows without inserting any."""
    return select(func.pg_notify(bindparam("channel", type_=String()), ""))
