"""The model: the outbox's timestamp columns in SQL expressions, on PostgreSQL and SQLite.

``UTCDateTime`` must behave like SQLAlchemy's own ``DateTime(timezone=True)`` wherever a user
writes a query against ``OutboxRow`` (an operator dashboard, a purge job): comparisons with aware
datetimes, and date arithmetic with a ``timedelta``. Where the database itself has no answer
(interval arithmetic on SQLite), the tests pin that the outbox's column does exactly what a plain
``DateTime(timezone=True)`` column does, no worse.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    Integer,
    Interval,
    MetaData,
    Table,
    insert,
    select,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import StatementError
from sqlalchemy.sql.elements import BinaryExpression, ColumnElement
from sqlalchemy.types import NullType

import sqla_outbox as outbox
from sqla_outbox.model import UTCDateTime

STAGED_AT = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
ONE_DAY = dt.timedelta(days=1)

plain_metadata = MetaData()
plain = Table(
    "plain_timestamps",
    plain_metadata,
    Column("id", Integer, primary_key=True),
    Column("staged_at", DateTime(timezone=True)),
)
"""A table of the tests' own with a plain ``DateTime(timezone=True)``: the behaviour to match."""


def insert_row(engine: Engine, staged_at: dt.datetime = STAGED_AT) -> uuid.UUID:
    """One outbox row staged at ``staged_at`` (and the same instant in ``plain``)."""
    row_id = uuid.uuid4()
    plain_metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(outbox.OutboxRow),
            {
                "id": row_id,
                "job": "send_receipt",
                "input": {"order_id": 1},
                "idempotency_key": str(row_id),
                "run_at": staged_at,
                "staged_at": staged_at,
            },
        )
        conn.execute(insert(plain), {"id": 1, "staged_at": staged_at})
    return row_id


def outcome(engine: Engine, expression: ColumnElement[Any]) -> tuple[str, Any]:
    """What selecting ``expression`` does: ``("value", v)`` or ``("error", type, message)``."""
    with engine.connect() as conn:
        try:
            return ("value", conn.execute(select(expression)).scalar_one())
        except Exception as exc:  # the error itself is the outcome being compared
            return ("error", f"{type(exc).__name__}: {exc}")


# --- expression typing, no database ------------------------------------------------------------


def test_subtracting_a_timedelta_types_like_datetime() -> None:
    """``staged_at - timedelta`` binds the timedelta as an Interval (not as a timestamp, which
    used to hand a timedelta to the bind processor) and is itself a UTCDateTime, as
    ``DateTime(timezone=True) - timedelta`` is a DateTime; ``+`` likewise."""
    for expression, reference in [
        (outbox.OutboxRow.staged_at - ONE_DAY, plain.c.staged_at - ONE_DAY),
        (outbox.OutboxRow.staged_at + ONE_DAY, plain.c.staged_at + ONE_DAY),
    ]:
        assert isinstance(expression, BinaryExpression)
        assert isinstance(reference, BinaryExpression)
        assert isinstance(expression.right.type, Interval)
        assert isinstance(reference.right.type, Interval)
        assert isinstance(expression.type, UTCDateTime)
        assert isinstance(reference.type, DateTime)


def test_subtracting_two_timestamps_is_an_interval() -> None:
    """``published_at - staged_at`` is an Interval, as for two DateTime columns."""
    expression = outbox.OutboxRow.published_at - outbox.OutboxRow.staged_at
    assert isinstance(expression.type, Interval)
    assert isinstance((plain.c.staged_at - plain.c.staged_at).type, Interval)


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()], ids=["pg", "sqlite"])
def test_timedelta_expression_compiles_as_datetimes_does(dialect: Any) -> None:
    """On both dialects ``staged_at - timedelta`` compiles to the same SQL as the plain column's
    (no cast of the interval to a timestamp)."""
    ours = str((outbox.OutboxRow.staged_at - ONE_DAY).compile(dialect=dialect))
    theirs = str((plain.c.staged_at - ONE_DAY).compile(dialect=dialect))
    assert ours.replace("outbox.", "plain_timestamps.") == theirs
    assert "TIMESTAMP" not in ours


def test_type_stays_cacheable() -> None:
    """``UTCDateTime`` keeps ``cache_ok = True``: statements using it are cached (and
    SQLAlchemy's "will not produce a cache key" warning, an error under this suite, never
    fires)."""
    assert UTCDateTime.cache_ok is True
    statement = select(outbox.OutboxRow).where(outbox.OutboxRow.staged_at > STAGED_AT - ONE_DAY)
    assert statement._generate_cache_key() is not None


# --- on both databases ---------------------------------------------------------------------------


def test_comparison_with_an_aware_datetime(engine: Engine) -> None:
    """``where(staged_at > aware)`` and ``where(staged_at < now - timedelta)`` select the row on
    both sides of its timestamp correctly, whatever zone the bound is written in."""
    row_id = insert_row(engine)
    later_elsewhere = STAGED_AT.astimezone(dt.timezone(dt.timedelta(hours=-5)))
    with engine.connect() as conn:

        def ids(*criteria: Any) -> list[uuid.UUID]:
            return list(conn.scalars(select(outbox.OutboxRow.id).where(*criteria)))

        assert ids(outbox.OutboxRow.staged_at > STAGED_AT - ONE_DAY) == [row_id]
        assert ids(outbox.OutboxRow.staged_at > STAGED_AT + ONE_DAY) == []
        assert ids(outbox.OutboxRow.staged_at >= later_elsewhere) == [row_id]
        now = STAGED_AT + dt.timedelta(days=3)
        assert ids(outbox.OutboxRow.staged_at < now - dt.timedelta(days=2)) == [row_id]
        assert ids(outbox.OutboxRow.staged_at < now - dt.timedelta(days=4)) == []
        [row] = conn.execute(select(outbox.OutboxRow.staged_at)).scalars()
        assert row == STAGED_AT
        assert row.tzinfo is dt.timezone.utc


def test_comparison_with_a_naive_datetime_is_refused(engine: Engine) -> None:
    """A naive bound is still refused with the clear message (which zone did it mean?) rather
    than guessed, now that other operand types are coerced differently."""
    insert_row(engine)
    naive = dt.datetime(2026, 3, 1, 12, 0)
    with engine.connect() as conn, pytest.raises(StatementError, match="timezone-aware"):
        conn.execute(select(outbox.OutboxRow).where(outbox.OutboxRow.staged_at > naive))


def test_timedelta_expression_on_postgresql(pg_engine: Engine) -> None:
    """On PostgreSQL ``select(staged_at - timedelta(days=1))`` runs and returns the aware UTC
    datetime one day earlier (the plain column gives the same instant), and the expression works
    in a WHERE clause."""
    insert_row(pg_engine)
    expression = outbox.OutboxRow.staged_at - ONE_DAY
    kind, value = outcome(pg_engine, expression)
    assert kind == "value"
    assert value == STAGED_AT - ONE_DAY
    assert value.tzinfo is dt.timezone.utc
    assert outcome(pg_engine, plain.c.staged_at - ONE_DAY) == ("value", STAGED_AT - ONE_DAY)
    assert outcome(pg_engine, outbox.OutboxRow.staged_at + ONE_DAY)[1] == STAGED_AT + ONE_DAY

    with pg_engine.connect() as conn:
        selected = conn.scalars(
            select(outbox.OutboxRow.job).where(expression > STAGED_AT - dt.timedelta(days=2))
        ).all()
    assert selected == ["send_receipt"]


def test_timedelta_expression_on_sqlite_matches_plain_datetime(sqlite_engine: Engine) -> None:
    """SQLite has no interval arithmetic, and SQLAlchemy's DateTime emulation does not add it:
    ``DateTime(timezone=True) - timedelta`` subtracts the interval's epoch-based text from the
    timestamp's text, SQLite's numeric coercion yields a number, and the DateTime result
    processor then fails on it (TypeError from ``fromisoformat``, SQLAlchemy 2.x). The outbox's
    column must do exactly that too, no worse: the same raw value from the database and the same
    outcome (today that same error), for ``-`` and ``+``. Compute bounds in Python instead."""
    insert_row(sqlite_engine)
    for ours, theirs in [
        (outbox.OutboxRow.staged_at - ONE_DAY, plain.c.staged_at - ONE_DAY),
        (outbox.OutboxRow.staged_at + ONE_DAY, plain.c.staged_at + ONE_DAY),
    ]:
        raw_ours = outcome(sqlite_engine, type_coerce(ours, NullType()))
        raw_theirs = outcome(sqlite_engine, type_coerce(theirs, NullType()))
        assert raw_ours == raw_theirs
        assert raw_ours[0] == "value"
        assert outcome(sqlite_engine, ours) == outcome(sqlite_engine, theirs)
