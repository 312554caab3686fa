"""The words every statement is built from: the table, a message's columns, and the predicates
that say what a row is (unpublished, holding, claimable, stuck) in one spelling each.

Whose clock is "now" is decided once, in :mod:`sqla_outbox.clock`; :func:`now`,
:func:`from_now` and :func:`lease_cutoff` are the only places a statement names an instant.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    ARRAY,
    Boolean,
    ColumnElement,
    Integer,
    Interval,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
    tuple_,
    type_coerce,
)
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BindParameter, UnaryExpression

from sqla_outbox.coltypes import InputText
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import OutboxRow, UTCDateTime

__all__ = [
    "CLAIM_FIELDS",
    "JSONB_MESSAGE_COLUMNS",
    "MESSAGE_COLUMNS",
    "MESSAGE_FIELDS",
    "ORDERS",
    "charged",
    "claimable",
    "due_at",
    "fenced",
    "few",
    "from_now",
    "holding",
    "ids_param",
    "inline",
    "later_of",
    "lease_cutoff",
    "not_parked",
    "now",
    "outbox_table",
    "parked_until_due",
    "position",
    "stuck",
    "stuck_for_a_while",
    "unpublished",
]

outbox_table: Table = OutboxRow.__table__  # type: ignore[assignment]

JSONB_MESSAGE_COLUMNS = tuple(outbox_table.c[name] for name in OutboxMessage._fields)
"""A message's columns in :class:`OutboxMessage` field order, as PostgreSQL's claims select
them: ``input`` as ``jsonb``, which the relay's psycopg store decodes (see ``stores.psycopg``
for a value Python cannot decode)."""
MESSAGE_COLUMNS = tuple(
    type_coerce(cast(column, Text), InputText()).label("input")
    if column.name == "input"
    else column
    for column in JSONB_MESSAGE_COLUMNS
)
"""The same as every other claim and the operator's reads select them: ``input`` as its text,
decoded row by row (:class:`~sqla_outbox.coltypes.InputText`), so that a stored value Python
cannot decode is that row's problem, not every read's. (The column, and its DDL, keep their
JSON type.)"""
MESSAGE_FIELDS = tuple(column.name for column in MESSAGE_COLUMNS)
"""The columns a claim returns first, in :class:`OutboxMessage` field order."""

CLAIM_FIELDS = (*MESSAGE_FIELDS, "attempts")
"""Every column a claimed row has: the message, then how many of its publishes failed before."""

ORDERS = ("key", "strict")
"""The relay's ordering modes; see :mod:`sqla_outbox.plan`."""


# --- instants (see the module docs) --------------------------------------------------------------


def now(dialect: str) -> ColumnElement[dt.datetime]:
    """The instant a statement runs at: ``now()`` on PostgreSQL, ``:now`` elsewhere."""
    if dialect == "postgresql":
        return func.now()
    return bindparam("now", type_=UTCDateTime())


def from_now(dialect: str, interval: str, instant: str) -> ColumnElement[dt.datetime]:
    """An instant some time from now: ``now() + :interval`` (a ``timedelta``) on PostgreSQL,
    the relay's ``:instant`` elsewhere."""
    if dialect == "postgresql":
        return func.now() + bindparam(interval, type_=Interval())
    return bindparam(instant, type_=UTCDateTime())


def lease_cutoff(dialect: str) -> ColumnElement[dt.datetime]:
    """A claim taken before this instant has lapsed: ``now() - :lease``, or ``:cutoff``."""
    if dialect == "postgresql":
        return func.now() - bindparam("lease", type_=Interval())
    return bindparam("cutoff", type_=UTCDateTime())


# --- parameters ---------------------------------------------------------------------------------


def ids_param(dialect: str, name: str = "ids", column: Any = None) -> ColumnElement[bool]:
    """``column`` (default ``id``) is one of the ids in parameter ``name`` (a list of UUIDs):
    ``= ANY(:name)`` on PostgreSQL, an expanding ``IN`` elsewhere. Every statement that takes a
    set of rows finds them through an index this way, however they interleave."""
    column = outbox_table.c.id if column is None else column
    if dialect == "postgresql":
        ids: BindParameter[Any] = bindparam(name, type_=ARRAY(outbox_table.c.id.type))
        matches: ColumnElement[bool] = column == any_(ids)
        return matches
    expanding: ColumnElement[bool] = column.in_(bindparam(name, expanding=True))
    return expanding


def few(name: str, item_type: Any = None) -> ColumnElement[Any]:
    """PostgreSQL: array parameter ``name`` (of ids unless ``item_type``), its length hidden from
    the planner.

    A failed pass's write-back names a handful of rows (failed, held back, released). A custom
    plan reads the arrays' lengths and prices those parts far below the generic plan, which
    assumes ten elements each, so PostgreSQL would keep planning the prepared statement afresh. Read
    through a one-row subquery, the arrays have no known length in either plan.
    """
    array = ARRAY(outbox_table.c.id.type if item_type is None else item_type)
    return cast(select(bindparam(name, type_=array)).scalar_subquery(), array)


def inline(name: str) -> BindParameter[int]:
    """A row count rendered into the SQL text, not sent as a parameter.

    A claim's row limits are few distinct values per relay (its batch size and a handful of
    windows), and a plan for a known limit is what PostgreSQL can keep: with ``LIMIT $n`` it
    must assume a tenth of the table and plans the claim afresh on every pass. With the limits
    in the text, a prepared claim settles on one generic plan.
    """
    return bindparam(name, type_=Integer(), literal_execute=True)


# --- what a row is --------------------------------------------------------------------------------


def unpublished(table: Any = outbox_table) -> ColumnElement[bool]:
    """Not published yet (dead letters included)."""
    result: ColumnElement[bool] = table.c.published_at.is_(None)
    return result


def position(table: Any) -> Any:
    """A row's place in claim order: ``(staged_at, id)``."""
    return tuple_(table.c.staged_at, table.c.id)


def not_parked(table: Any, dialect: str) -> ColumnElement[bool]:
    """``NOT parked`` in the words of ``ix_outbox_claimable``'s predicate, where that matters.

    Where booleans are integers SQLAlchemy writes ``~parked`` as ``parked = 0``, and SQLite's
    planner uses a partial index only for a query that repeats each term of its predicate as
    written. PostgreSQL writes ``NOT parked`` either way; MySQL keeps ``parked = 0``, the
    comparison its index (``parked`` as a column, no predicate) can seek on.
    """
    if dialect == "sqlite":
        return UnaryExpression(table.c.parked, operator=operators.inv, type_=Boolean())
    result: ColumnElement[bool] = ~table.c.parked
    return result


def in_claim_index(table: Any, dialect: str) -> list[ColumnElement[bool]]:
    """The rows of ``ix_outbox_claimable``, in the words of its predicate: unpublished, not
    dead, not parked. A query restricted to these reads that index, never the dead letters or
    the parked rows, however many there are."""
    return [unpublished(table), table.c.dead_at.is_(None), not_parked(table, dialect)]


def holding(table: Any, dialect: str, done: ColumnElement[Any] | None = None) -> list[Any]:
    """Rows that hold back the later rows of their transaction and key: due and unpublished.

    A row not yet due (``run_at`` in the future) holds nothing back: a scheduled message joins
    the order when its time comes. With ``done`` (a claim's token), that claim's rows count as
    published (:mod:`sqla_outbox.plan`).
    """
    conditions: list[Any] = [unpublished(table), table.c.run_at <= now(dialect)]
    if done is not None:
        conditions.append(table.c.claimed_by.is_distinct_from(done))
    return conditions


def claimable(table: Any, dialect: str) -> list[ColumnElement[bool]]:
    """What a claim may take: holding, not dead, not parked, past any retry backoff, unclaimed
    or its claim's lease lapsed."""
    at = now(dialect)
    return [
        *in_claim_index(table, dialect),
        table.c.run_at <= at,
        or_(table.c.retry_at.is_(None), table.c.retry_at <= at),
        or_(table.c.claimed_at.is_(None), table.c.claimed_at < lease_cutoff(dialect)),
    ]


def charged(table: Any) -> ColumnElement[bool]:
    """A row some publish of which failed: ``attempts > 0``, the predicate of
    ``ix_outbox_failing`` (with ``published_at IS NULL``).

    The ``0`` is written into the SQL, not bound: a generic plan cannot prove ``attempts > $1``
    implies the index's ``attempts > 0``.
    """
    result: ColumnElement[bool] = table.c.attempts > literal_column("0")
    return result


def stuck(table: Any, dialect: str) -> ColumnElement[bool]:
    """A row that will not be published within a pass: a dead letter, or waiting out a retry
    backoff. Both have been charged (``attempts > 0``): only a failed publish sets ``dead_at``
    or ``retry_at``, and ``retry_dead`` clears both when it resets the count."""
    result: ColumnElement[bool] = or_(table.c.dead_at.is_not(None), table.c.retry_at > now(dialect))
    return result


def stuck_for_a_while(table: Any, dialect: str) -> ColumnElement[bool]:
    """A dead letter, or a row whose retry backoff ends later than ``:stuck_ahead`` from now
    (``:stuck_after`` but on PostgreSQL): a row worth parking what waits for it behind
    (:data:`sqla_outbox.plan.PARK_AFTER`)."""
    result: ColumnElement[bool] = or_(
        table.c.dead_at.is_not(None),
        table.c.retry_at > from_now(dialect, "stuck_ahead", "stuck_after"),
    )
    return result


def parked_until_due(table: Any) -> ColumnElement[bool]:
    """A parked row parked until it is due (:mod:`sqla_outbox.waiting`), not behind a holder:
    it has a ``wake_at``. Only the sweep's wake unparks it."""
    result: ColumnElement[bool] = table.c.wake_at.is_not(None)
    return result


def later_of(first: Any, second: Any) -> ColumnElement[dt.datetime]:
    """The later of two instants, ``second`` when ``first`` is NULL (one spelling for every
    dialect: SQLite has no ``GREATEST``)."""
    later: ColumnElement[dt.datetime] = case((first > second, first), else_=second)
    return later


def due_at(table: Any) -> ColumnElement[dt.datetime]:
    """When a row comes due: the later of ``run_at`` and its retry backoff's end."""
    return later_of(table.c.retry_at, table.c.run_at)


def fenced(token: str = "token") -> ColumnElement[bool]:
    """The fence: only the claim that stamped ``:token`` may change these rows. A relay that
    stalled past its lease finds another claim's token there, and its update touches nothing."""
    return and_(outbox_table.c.claimed_by == bindparam(token), unpublished())
