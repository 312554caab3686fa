"""Every statement sqla-outbox runs, built with SQLAlchemy Core from the mapped table.

One named function per statement, so the SQL can be read in one place, pinned by unit tests
(compile a claim for PostgreSQL and look for ``FOR UPDATE SKIP LOCKED``), and honours the
table's schema. Nothing here executes anything.

Statements that take a set of rows take their ids as one parameter (``= ANY(:ids)`` on
PostgreSQL, an expanding ``IN`` on SQLite): every row is found through the primary key, however
the claim's published, failed and handed-back rows interleave. Every statement a relay runs after
its claim is **fenced**: it touches only rows still stamped with that claim's token and
unpublished, so a relay that stalled past its lease cannot change rows another relay holds now.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

from sqlalchemy import (
    ARRAY,
    Boolean,
    ColumnElement,
    CompoundSelect,
    Delete,
    Insert,
    Integer,
    Interval,
    Select,
    Table,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    type_coerce,
    union,
    union_all,
    update,
)
from sqlalchemy.schema import DDL
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BindParameter, Label, UnaryExpression

from sqla_outbox.coltypes import MYSQL_DIALECTS, InputText
from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import OutboxRow, UTCDateTime

__all__ = [
    "CLAIM_FIELDS",
    "MESSAGE_FIELDS",
    "ORDERS",
    "analyze_stmt",
    "backlog_stmt",
    "claim_stmt",
    "claims_stmt",
    "dead_letters_stmt",
    "delete_dead_stmt",
    "fail_stmt",
    "free_parked_stmt",
    "holding_stmt",
    "idle_stmt",
    "lock_stmt",
    "mark_and_claim_stmt",
    "mark_published_stmt",
    "park_rows_stmt",
    "park_stmt",
    "park_waiting_stmt",
    "parked_behind_stmt",
    "parked_window",
    "pending_stmt",
    "plan_stmt",
    "purge_stmt",
    "release_stmt",
    "renew_stmt",
    "retry_dead_stmt",
    "settle_stmt",
    "stage_rows",
    "stage_stmt",
    "stamp_stmt",
    "status_stmt",
    "sweep_parked_stmt",
    "sweep_stmt",
    "unclaim_stmt",
    "unpark_behind_stmt",
    "unpark_rows_stmt",
    "waiting_head_stmt",
    "wake_stmt",
    "window_end_stmt",
]

outbox_table: Table = OutboxRow.__table__  # type: ignore[assignment]

_STAGE = insert(outbox_table)


def stage_stmt() -> Insert:
    """The INSERT that writes staged messages; executed with a list of rows (executemany)."""
    return _STAGE


def stage_rows(messages: list[OutboxMessage]) -> list[dict[str, Any]]:
    """Parameter rows for :func:`stage_stmt`, one per message, in the messages' order.

    A message's fields are the table's columns of the same names, so each row is the message
    as a dict; the rest of the columns (the lease, ``attempts``) take their defaults.
    """
    return [message._asdict() for message in messages]


# --- the relay's statements --------------------------------------------------------------------
#
# Each takes the dialect name because "now" differs: on PostgreSQL it is the database's clock
# (``now()``), so every relay host compares leases and backoffs against one clock whatever its
# own drifts; SQLite has no server and a single host, so the relay passes its own UTC time as
# ``:now`` (and the instants it derives from it).

_JSONB_MESSAGE_COLUMNS = tuple(outbox_table.c[name] for name in OutboxMessage._fields)
"""A message's columns in :class:`OutboxMessage` field order, as PostgreSQL's claims select
them: ``input`` as ``jsonb``, which the relay's psycopg store decodes (see ``stores.psycopg``
for a value Python cannot decode)."""
_MESSAGE_COLUMNS = tuple(
    type_coerce(cast(column, Text), InputText()).label("input")
    if column.name == "input"
    else column
    for column in _JSONB_MESSAGE_COLUMNS
)
"""The same as every other claim and the operator's reads select them: ``input`` as its text,
decoded row by row (:class:`~sqla_outbox.coltypes.InputText`), so that a stored value Python
cannot decode is that row's problem, not every read's. (The column, and its DDL, keep their
JSON type.)"""
MESSAGE_FIELDS = tuple(column.name for column in _MESSAGE_COLUMNS)
"""The columns a claim returns first, in :class:`OutboxMessage` field order."""

CLAIM_FIELDS = (*MESSAGE_FIELDS, "attempts")
"""Every column a claimed row has: the message, then how many of its publishes failed before."""

ORDERS = ("key", "strict")
"""The relay's ordering modes; see :func:`claim_stmt`."""


def _now(dialect: str) -> ColumnElement[dt.datetime]:
    if dialect == "postgresql":
        return func.now()
    return bindparam("now", type_=UTCDateTime())


def _lease_cutoff(dialect: str) -> ColumnElement[dt.datetime]:
    # A claim taken before this instant has lapsed. SQLite cannot subtract an interval from
    # its text timestamps, so there the relay computes the instant itself.
    if dialect == "postgresql":
        return func.now() - bindparam("lease", type_=Interval())
    return bindparam("cutoff", type_=UTCDateTime())


def _ids(dialect: str, name: str = "ids") -> ColumnElement[bool]:
    """``id`` is one of the ids in parameter ``name`` (a list of UUIDs)."""
    if dialect == "postgresql":
        ids: BindParameter[Any] = bindparam(name, type_=ARRAY(outbox_table.c.id.type))
        matches: ColumnElement[bool] = outbox_table.c.id == any_(ids)
        return matches
    expanding: ColumnElement[bool] = outbox_table.c.id.in_(bindparam(name, expanding=True))
    return expanding


def _few(name: str, item_type: Any = None) -> ColumnElement[Any]:
    """PostgreSQL: array parameter ``name`` (of ids unless ``item_type``), its length hidden from
    the planner.

    A failed pass's write-back names a handful of rows (failed, held back, released). A
    custom plan reads the arrays' lengths and prices those parts far below the generic plan,
    which assumes ten elements each, so PostgreSQL kept planning the prepared claim afresh:
    1.7 ms of a 5 ms pass, on a third of them. Read through a one-row subquery, the arrays
    have no known length in either plan, and the claim keeps its generic plan. The claim's own
    ids, a batch long, stay plain parameters: there the custom plan is the dearer one.
    """
    array = ARRAY(outbox_table.c.id.type if item_type is None else item_type)
    return cast(select(bindparam(name, type_=array)).scalar_subquery(), array)


def _inline(name: str) -> BindParameter[int]:
    """A row count rendered into the SQL text, not sent as a parameter.

    The claim's row limits are few distinct values per relay (its batch size and a handful of
    windows), and a plan for a known limit is what PostgreSQL can keep: with a ``LIMIT $n`` it
    must assume a tenth of the table, prices the generic plan far above the custom one, and
    plans the large claim afresh on every pass (half a millisecond, a fifth of a pass at
    batch 100). With the limits in the text, a prepared claim settles on one generic plan.
    """
    return bindparam(name, type_=Integer(), literal_execute=True)


def _unpublished(table: Any = outbox_table) -> ColumnElement[bool]:
    unpublished: ColumnElement[bool] = table.c.published_at.is_(None)
    return unpublished


def _not_parked(table: Any, dialect: str) -> ColumnElement[bool]:
    """``NOT parked`` in the words of ``ix_outbox_claimable``'s predicate, where that matters.

    Where booleans are integers SQLAlchemy writes ``~parked`` as ``parked = 0``, and SQLite's
    planner uses a partial index only for a query that repeats each term of its predicate as
    written: with ``parked = 0`` every SQLite claim read ``ix_outbox_unpublished``, parked and
    dead rows included. PostgreSQL writes ``NOT parked`` either way; MySQL keeps ``parked = 0``,
    the comparison its index (``parked`` as a column, no predicate) can seek on.
    """
    if dialect == "sqlite":
        return UnaryExpression(table.c.parked, operator=operators.inv, type_=Boolean())
    not_parked: ColumnElement[bool] = ~table.c.parked
    return not_parked


def _claimable(table: Any, dialect: str) -> list[ColumnElement[bool]]:
    """The rows a claim may ever take, in the words of ``ix_outbox_claimable``'s predicate:
    unpublished, not dead, not parked. A query restricted to these reads that index, never the
    dead letters or the parked rows, however many there are."""
    return [_unpublished(table), table.c.dead_at.is_(None), _not_parked(table, dialect)]


def _held_parked(table: Any) -> ColumnElement[bool]:
    """A parked row is parked behind a holder, not until it is due (:mod:`sqla_outbox.waiting`):
    no ``wake_at``. Only :func:`wake_stmt` unparks the others."""
    held: ColumnElement[bool] = table.c.wake_at.is_(None)
    return held


def _later(first: Any, second: Any) -> ColumnElement[dt.datetime]:
    """The later of two instants, ``second`` when ``first`` is NULL (one spelling for every
    dialect: SQLite has no ``GREATEST``)."""
    later: ColumnElement[dt.datetime] = case((first > second, first), else_=second)
    return later


def _due_at(table: Any) -> ColumnElement[dt.datetime]:
    """When a row comes due: the later of ``run_at`` and its retry backoff's end."""
    return _later(table.c.retry_at, table.c.run_at)


def _from_now(dialect: str, ahead: str, instant: str) -> ColumnElement[dt.datetime]:
    """An instant some time from now: ``now() + :ahead`` (an interval) on PostgreSQL, the
    relay's ``:instant`` elsewhere (as :func:`_lease_cutoff`)."""
    if dialect == "postgresql":
        return func.now() + bindparam(ahead, type_=Interval())
    return bindparam(instant, type_=UTCDateTime())


def _position(table: Any) -> Any:
    """A row's place in claim order."""
    return tuple_(table.c.staged_at, table.c.id)


def _fenced(token: str = "token") -> ColumnElement[bool]:
    # The fence: only the claim that stamped ``token`` may change these rows. A relay that stalled
    # past its lease finds another claim's token there, and its update touches nothing.
    return and_(outbox_table.c.claimed_by == bindparam(token), _unpublished())


@dataclass(frozen=True)
class _Previous:
    """The previous claim, whose write-back travels in the claim's statement.

    All parts of one statement see one snapshot, in which the previous claim's rows are still
    stamped with its token and unpublished. ``kept`` (an array of ids, or None) names those
    of its rows the write-back leaves unpublished: charged, handed back or held back.
    """

    token: BindParameter[Any]
    kept: ColumnElement[Any] | None = None

    def excludes(self, table: Any) -> ColumnElement[bool]:
        """Not a row of the previous claim: the only rows this statement may claim (one
        statement must not update a row twice)."""
        mine: ColumnElement[bool] = table.c.claimed_by.is_distinct_from(self.token)
        return mine

    def holds(self, table: Any) -> ColumnElement[bool]:
        """Not published by the write-back: every row but the previous claim's published ones."""
        if self.kept is None:
            return self.excludes(table)
        return or_(self.excludes(table), table.c.id == any_(self.kept))

    def kept_transaction(self, table: Any) -> ColumnElement[bool]:
        """A row of the transaction of a kept row (``kept`` must be set).

        The write-back parks the unclaimed rows after a charged or held-back row of its
        transaction (:func:`_write_back`), which this statement's snapshot does not show yet:
        the claim leaves such rows alone and counts them as stuck, not in flight.
        """
        kept: ColumnElement[bool] = table.c.staged_at.in_(
            select(self._kept_transactions.c.staged_at)
        )
        return kept

    @cached_property
    def _kept_transactions(self) -> Any:
        """The kept rows' transactions, read once per statement for every part that asks."""
        assert self.kept is not None
        kept_row = outbox_table.alias("kept_row")
        return (
            select(kept_row.c.staged_at)
            .where(kept_row.c.id == any_(self.kept))
            .cte("kept_transactions")
        )


def _holding(table: Any, dialect: str, previous: _Previous | None) -> list[ColumnElement[bool]]:
    """Rows that hold back the later rows of their transaction and key: due and unpublished.

    A row not yet due (``run_at`` in the future) holds nothing back: a scheduled message joins
    the order when its time comes. Rows this very statement marks published (see
    :func:`mark_and_claim_stmt`) count as published.
    """
    conditions = [_unpublished(table), table.c.run_at <= _now(dialect)]
    if previous is not None:
        conditions.append(previous.holds(table))
    return conditions


def _charged(table: Any) -> ColumnElement[bool]:
    """A row some publish of which failed: ``attempts > 0``, the predicate of
    ``ix_outbox_failing`` (with ``published_at IS NULL``).

    The ``0`` is written into the SQL, not bound: the relay's prepared statements run on
    generic plans, and a generic plan cannot prove ``attempts > $1`` implies the index's
    ``attempts > 0``, so a probe for a transaction's failed rows read every unpublished row of
    the transaction through ``ix_outbox_unpublished`` instead of the few failed ones.
    """
    charged: ColumnElement[bool] = table.c.attempts > literal_column("0")
    return charged


def _stuck(table: Any, dialect: str) -> ColumnElement[bool]:
    """A holder that will not go away by itself within a pass: dead, backing off, or parked.

    A dead or backing-off row has been charged (``attempts > 0``): only a failed publish sets
    ``dead_at`` or ``retry_at``, and ``retry_dead`` clears both when it resets the count.
    """
    return or_(table.c.dead_at.is_not(None), table.c.retry_at > _now(dialect), table.c.parked)


def _related(later: Any, earlier: Any) -> ColumnElement[bool]:
    """``earlier`` holds back ``later``: same transaction or same ordering key, and before it."""
    return and_(
        or_(
            later.c.staged_at == earlier.c.staged_at,
            later.c.ordering_key == earlier.c.ordering_key,
        ),
        _position(later) > _position(earlier),
    )


def _candidates(dialect: str, order: str, previous: _Previous | None, size: str) -> Any:
    """Up to ``:size`` claimable rows in claim order, locked ``FOR UPDATE SKIP LOCKED``."""
    t = outbox_table
    columns = (t.c.id, t.c.staged_at, t.c.ordering_key)
    return _locking_read(dialect, order, previous, size, *columns).cte("candidates")


def _locking_read(
    dialect: str, order: str, previous: _Previous | None, size: str, *columns: Any
) -> Select[Any]:
    """``columns`` of up to ``:size`` claimable rows in claim order, ``FOR UPDATE SKIP LOCKED``.

    Claimable: unpublished, not dead, not parked, due, past any retry backoff, unclaimed or
    lapsed. With ``order="strict"`` the first failed, unpublished row (whichever relay is
    retrying it) also bounds them: nothing after it is claimed before it is published.
    """
    t = outbox_table
    now = _now(dialect)
    claimable = [
        *_claimable(t, dialect),
        t.c.run_at <= now,
        or_(t.c.retry_at.is_(None), t.c.retry_at <= now),
        or_(t.c.claimed_at.is_(None), t.c.claimed_at < _lease_cutoff(dialect)),
    ]
    if previous is not None:
        claimable.append(previous.excludes(t))
        if previous.kept is not None:
            claimable.append(~previous.kept_transaction(t))
    if order == "strict":
        failing = t.alias("failing")
        first_failing = (
            select(failing.c.staged_at, failing.c.id)
            .where(*_holding(failing, dialect, previous), _charged(failing))
            .order_by(failing.c.staged_at, failing.c.id)
            .limit(literal_column("1"))
        )
        claimable.append(
            or_(~exists(first_failing), _position(t) <= first_failing.scalar_subquery())
        )
    read = (
        select(*columns)
        .where(*claimable)
        .order_by(t.c.staged_at, t.c.id)
        .limit(_inline(size))
        .with_for_update(skip_locked=True)
    )
    # MySQL has no partial indexes: ix_outbox_parked_group is (parked, staged_at) over every
    # row, and with `parked = 0` in the WHERE its optimizer may pick it on a young table and
    # read every published row. The claim index, led by the claimable columns, serves the
    # range in claim order.
    for name in MYSQL_DIALECTS:
        read = read.with_hint(t, "USE INDEX (ix_outbox_claimable)", dialect_name=name)
    return read


def _ends(candidates: Any, name: str, prefix: str) -> Any:
    """Per transaction (``name="staged_at"``) or ordering key of the candidates: its last
    candidate (``end_staged_at``, ``end_id``) and how many candidates it has (``size``)."""
    part = candidates.c[name]
    ranked = select(
        part,
        candidates.c.staged_at.label("end_staged_at"),
        candidates.c.id.label("end_id"),
        func.row_number()
        .over(partition_by=part, order_by=(candidates.c.staged_at.desc(), candidates.c.id.desc()))
        .label("rn"),
        func.count().over(partition_by=part).label("size"),
    )
    if name == "ordering_key":
        ranked = ranked.where(part.is_not(None))
    ranked_rows = ranked.subquery(f"{prefix}_{name}_ranked")
    return select(ranked_rows).where(ranked_rows.c.rn == 1).subquery(f"{prefix}_{name}_ends")


def _crowded(candidates: Any, end: Any, dialect: str, previous: _Previous | None, size: str) -> Any:
    """Whether anything may hold a candidate back, as a one-row CTE (column ``crowded``).

    A candidate is held by a due, unpublished row of its transaction or key before it that is
    not a candidate. Not crowded when neither kind of holder can be there:

    * **In flight**: a row in another claim, or locked by one this instant. None when the due,
      unpublished rows of the claim index up to the last candidate, backoffs aside, are exactly
      the candidates: one range scan, stopped one row past the ``:size`` candidates.
    * **Stuck** (:func:`_stuck`): a dead letter, a row in retry backoff, a parked row. They stay
      for a while and hold only their own transaction and key: none may share a transaction
      or key with a candidate, wherever it is. A relay passing dead letters or a retrying
      message thus keeps the fast claim for everything they do not hold.

    The previous claim's rows that its write-back (travelling in this statement) leaves
    unpublished count as stuck: charged or held back, they hold only their own transactions and
    keys, which the claim after a pass with a failure rarely meets again.

    Conservative: a row a concurrent claim locked, stamped or published after this statement's
    snapshot, or a stuck row after the candidate it shares a key with, counts as crowding.
    """
    t = outbox_table
    now = _now(dialect)

    last = select(end.c.staged_at, end.c.id).scalar_subquery()  # end: _last_row(candidates)
    ahead_row = t.alias("ahead")
    # The range scan counts rows in flight elsewhere; the previous claim's kept rows, and the
    # rows of their transactions its write-back parks, are stuck.
    mine: list[ColumnElement[bool]] = []
    if previous is not None and previous.kept is not None:
        mine = [previous.excludes(ahead_row), ~previous.kept_transaction(ahead_row)]
    ahead = (
        select(literal_column("1"))
        .where(
            *_holding(ahead_row, dialect, previous),
            *mine,
            ahead_row.c.dead_at.is_(None),  # the claim index's rows: no dead or parked ones
            _not_parked(ahead_row, dialect),
            or_(ahead_row.c.retry_at.is_(None), ahead_row.c.retry_at <= now),
            _position(ahead_row) <= last,
        )
        .order_by(ahead_row.c.staged_at, ahead_row.c.id)
        .limit(_inline(size) + literal_column("1"))
        .subquery("ahead")
    )
    in_flight = (
        select(func.count()).select_from(ahead).scalar_subquery()
        > select(func.count()).select_from(candidates).scalar_subquery()
    )

    # Stuck rows can be many (dead letters kept for weeks, everything parked behind them): one
    # probe per distinct transaction and key of the candidates, through the indexes of
    # unpublished rows by transaction and by key (a handful of rows each). A scalar subquery
    # with LIMIT stays a per-row probe whatever the planner believes; as a join, with stale
    # statistics that made the parked rows look few, it checked each of 9,900 parked rows
    # against every candidate (90 ms a claim).
    def stuck_with(column: str) -> ColumnElement[bool]:
        # Only a stuck row before a candidate of its transaction (or key) holds one back: the
        # rows parked behind a retried first row of a transaction do not crowd its claim. (A
        # window function for each group's last candidate said the same, but made PostgreSQL
        # plan the claim afresh on every pass instead of keeping a generic plan.)
        # Two probes, one per kind of stuck row, each matching a small partial index (failed
        # rows: ix_outbox_failing; parked rows: ix_outbox_parked_*): with nothing failing a
        # probe finds an empty index at once, where one probe for either kind walked every
        # unpublished row of the transaction (2 ms of a 1,000-row claim).
        owners = (
            select(candidates.c[column])
            .where(candidates.c[column].is_not(None))
            .distinct()
            .subquery(f"candidate_{column}")
        )
        later = candidates.alias(f"later_{column}")

        def probe(kind: str, stuck: Callable[[Any], ColumnElement[bool]]) -> Any:
            row = t.alias(f"{kind}_{column}")
            return (
                select(literal_column("1"))
                .where(
                    row.c[column] == owners.c[column],
                    exists(
                        select(literal_column("1")).where(
                            later.c[column] == row.c[column], _position(later) > _position(row)
                        )
                    ),
                    *_holding(row, dialect, previous),
                    stuck(row),
                )
                .limit(literal_column("1"))
                .scalar_subquery()
            )

        charged = probe("charged", lambda row: and_(_charged(row), _stuck(row, dialect)))
        parked = probe("parked", lambda row: row.c.parked)
        probe_hit = or_(charged.is_not(None), parked.is_not(None))
        return exists(select(literal_column("1")).select_from(owners).where(probe_hit))

    stuck = [stuck_with("staged_at"), stuck_with("ordering_key")]
    if previous is not None and previous.kept is not None:
        # No candidate is of a kept row's transaction (_locking_read); one may share an
        # ordering key with a row of it: a kept row, or one the write-back parks.
        kept = t.alias("kept")
        shares = and_(
            candidates.c.ordering_key == kept.c.ordering_key,
            _position(candidates) > _position(kept),
        )
        stuck.append(
            exists(
                select(literal_column("1"))
                .select_from(kept)
                .join(candidates, shares)
                .where(_unpublished(kept), previous.kept_transaction(kept))
            )
        )
    return select(or_(in_flight, *stuck).label("crowded")).cte("gate")


def _claim_plan(
    dialect: str,
    order: str,
    previous: _Previous | None,
    *,
    locked: bool = False,
    whole: bool = False,
) -> tuple[Select[Any], Any, Any, Any]:
    """What a claim takes, parks and leaves: ``(claim ids, park ids, excluded CTE, gate CTE)``.

    ``locked``: the candidates are the rows ``:candidate_ids`` the claim's transaction has
    locked already (:func:`lock_stmt`); there is no gate (None) and the guard always runs.

    * **Candidates** (:func:`_candidates`): up to ``:window`` claimable rows (a relay widens the
      window while held-back rows fill it).
    * **Crowded** (:func:`_crowded`): unless something before the last candidate is not a
      candidate, nothing below runs and the claim takes the candidates in order.
    * A transaction (its ``staged_at`` group) or an ordering key is **held** when a due,
      unpublished row of it, up to its last candidate, is not a candidate: it is in another
      relay's claim, waiting out a retry backoff, dead, parked, or locked for an instant by a
      claim running at the same moment. One counting index scan per group and per key, against
      the candidate count.
    * **Excluded**: the held candidates and, transitively, every later candidate of their
      transactions and keys (a recursive CTE over the few candidates), so a claimed row never
      overtakes one that is not claimed with it.
    * **Park**: held candidates whose holder is stuck (:func:`_stuck`) and, on PostgreSQL, the
      candidates right behind one of those in their transaction or key (their holder is parked
      from now on). Parked rows leave the claim's index, so the next claims find due work past
      them instead of scanning them again; the mark that publishes their holder unparks them
      (:func:`mark_published_stmt`), and a periodic sweep (:func:`sweep_parked_stmt`) catches
      any whose holder went another way.
    * **Whole** (``whole=True``, PostgreSQL's claims): with the ``:whole`` parameter true, a
      claim that reaches ``:limit`` inside a transaction leaves that transaction for the next
      claim (:func:`_whole_transactions`).
    """
    t = outbox_table
    if locked:
        # The rows the claim's transaction locked already (lock_stmt): no gate, the guard runs.
        candidates = (
            select(t.c.id, t.c.staged_at, t.c.ordering_key)
            .where(_ids(dialect, "candidate_ids"))
            .cte("candidates")
        )
        gate = None
        guarded: list[ColumnElement[bool]] = []
    else:
        candidates = _candidates(dialect, order, previous, "window")
        gate = _crowded(candidates, _last_row(candidates), dialect, previous, "window")
        guarded = [select(gate.c.crowded).scalar_subquery()]

    def held(name: str, member: Callable[[Any, Any], ColumnElement[bool]]) -> Any:
        # Per group (or key) of the candidates: its last candidate and how many there are; held
        # when the due, unpublished rows up to that candidate are more; stuck when one is stuck.
        ends = _ends(candidates, name, "held")
        row = t.alias(f"{name}_row")
        upto = [
            member(row, ends),
            _position(row) <= tuple_(ends.c.end_staged_at, ends.c.end_id),
            *_holding(row, dialect, previous),
        ]
        due = select(func.count()).where(*upto).scalar_subquery()
        stuck = exists(select(literal_column("1")).where(*upto, _stuck(row, dialect)))
        return (
            select(ends.c[name], case((stuck, true()), else_=false()).label("stuck"))
            .where(*guarded, due != ends.c.size)
            .cte(f"held_{name}")
        )

    held_groups = held("staged_at", lambda row, ends: row.c.staged_at == ends.c.staged_at)
    held_keys = held("ordering_key", lambda row, ends: row.c.ordering_key == ends.c.ordering_key)

    # Joins rather than IN (...) OR IN (...): the planner estimates the (nearly always empty)
    # held rows from the held groups and keys, not as half the window, which would make the
    # recursion below look costly enough to switch on JIT compilation (0.8 s a claim).
    def in_group(held: Any, column: str) -> Select[Any]:
        return select(candidates.c.id, candidates.c.staged_at, candidates.c.ordering_key).join(
            held, candidates.c[column] == held.c[column]
        )

    held_rows = in_group(held_groups, "staged_at").union(in_group(held_keys, "ordering_key"))
    held_rows_cte = held_rows.cte("held_rows")
    excluded = select(held_rows_cte).cte("excluded", recursive=True)
    later = candidates.alias("later")
    excluded = excluded.union(
        select(later.c.id, later.c.staged_at, later.c.ordering_key).where(_related(later, excluded))
    )

    # Park a candidate only behind a stuck row of its own group or key *before* it. A group
    # whose stuck row sits between two candidates excludes both from this claim, but parks only
    # the later one: parking the earlier one too left it parked with nothing before it (and the
    # stuck row, once due, parked behind it in turn) until the sweep came by, seconds later.
    def stuck_before(column: str, stuck_groups: Select[Any]) -> ColumnElement[bool]:
        row = t.alias(f"parks_{column}")
        before = exists(
            select(literal_column("1")).where(
                row.c[column] == candidates.c[column],
                _position(row) < _position(candidates),
                *_holding(row, dialect, previous),
                _stuck(row, dialect),
            )
        )
        return and_(candidates.c[column].in_(stuck_groups), before)

    stuck_held = select(candidates.c.id).where(
        or_(
            stuck_before("staged_at", select(held_groups.c.staged_at).where(held_groups.c.stuck)),
            stuck_before("ordering_key", select(held_keys.c.ordering_key).where(held_keys.c.stuck)),
        )
    )
    park: Select[Any] | CompoundSelect[Any] = stuck_held
    if dialect == "postgresql":
        # And the candidates right behind one of those in their transaction or key: what this
        # claim parks is stuck from now on, so they wait for it as surely. Left unparked, they
        # counted as rows held by claims in flight and widened the next window, every claim,
        # while a dead letter held a key with a message in every transaction (windows of 1,600
        # rows, an exclusion comparing a million pairs, claims of 160-330 ms). (MariaDB failed
        # this form with a duplicate key in its temporary table; there the next claim parks
        # them, as before.)
        parks = stuck_held.add_columns(candidates.c.staged_at, candidates.c.ordering_key)
        parked_now = parks.cte("stuck_held")
        behind = candidates.alias("behind_stuck")
        park = union(
            select(parked_now.c.id),
            select(behind.c.id).join(parked_now, _related(behind, parked_now)),
        )
    claim = (
        select(candidates.c.id)
        .where(candidates.c.id.not_in(select(excluded.c.id)))
        .order_by(candidates.c.staged_at, candidates.c.id)
        .limit(_inline("limit"))
    )
    if whole:
        taken = claim.add_columns(candidates.c.staged_at).cte("taken")
        claim = select(taken.c.id).where(_whole_transactions(taken, _last_row(taken)))
    return claim, park, excluded, gate


def _last_row(rows: Any) -> Any:
    """The last of ``rows`` (a CTE with ``staged_at`` and ``id``) in claim order, as a one-row
    CTE: every part of a statement that reads it shares one sort of the rows (the gate and the
    fast claim's whole-transaction test both need the last candidate)."""
    return (
        select(rows.c.staged_at, rows.c.id)
        .order_by(rows.c.staged_at.desc(), rows.c.id.desc())
        .limit(literal_column("1"))
        .cte(f"{rows.name}_end")
    )


def _whole_transactions(rows: Any, end: Any) -> ColumnElement[bool]:
    """For each of ``rows`` (a claim's, with ``id`` and ``staged_at``; ``end`` its
    :func:`_last_row`): keep it, unless ``:whole`` is true and the claim reached ``:limit``
    inside a transaction, when that last transaction's rows are left for the next claim (a
    claim of a single transaction keeps them: it must make progress). The relay sets ``:whole``
    while other claims are about (:mod:`sqla_outbox.trimming`).

    Two relays that each stop inside a transaction hand each other its rest: the other relay
    finds it held by rows in flight, takes a full claim around it, and ends inside another
    transaction in turn. Once one claim split a transaction (SKIP LOCKED meeting the other
    relay's claim half-locked), every later one did, and two relays drained at 0.6 of one.
    Claims that end on a transaction's last row keep the relays apart by whole transactions.
    """
    t = outbox_table
    tail = select(end.c.staged_at).scalar_subquery()
    last_position = select(end.c.staged_at, end.c.id).scalar_subquery()
    others = rows.alias("claim_others")
    later = t.alias("later_in_tail")
    split = and_(
        select(func.count()).select_from(rows.alias("claim_size")).scalar_subquery()
        >= _inline("limit"),
        exists(select(literal_column("1")).select_from(others).where(others.c.staged_at != tail)),
        exists(
            select(literal_column("1")).where(
                later.c.staged_at == tail, _position(later) > last_position, _unpublished(later)
            )
        ),
    )
    trim: ColumnElement[bool] = bindparam("whole", type_=Boolean())
    return or_(~trim, rows.c.staged_at != tail, ~split)


def _claim_update(dialect: str, claim: Select[Any]) -> Update:
    t = outbox_table
    if dialect == "postgresql":
        # ``= ANY(ARRAY(...))`` probes the primary key once per row; with ``IN (...)`` the planner
        # may hash the ids and scan the whole table once the batch is large.
        claimed_ids = t.c.id == any_(func.array(claim.scalar_subquery()))
    else:
        claimed_ids = t.c.id.in_(claim)
    return (
        update(t)
        .where(claimed_ids)
        .values(claimed_by=bindparam("token"), claimed_at=_now(dialect))
        .returning(
            *(_JSONB_MESSAGE_COLUMNS if dialect == "postgresql" else _MESSAGE_COLUMNS),
            t.c.attempts,
        )
    )


def _postgresql_claim(
    order: str, previous: _Previous | None, counts: list[Any], *, fast: bool
) -> Select[Any]:
    """The claim as one PostgreSQL statement: park, claim, and a leading row of counts.

    The first columns are ``counts``, then ``parked``, ``held`` and ``crowded``; the
    :data:`CLAIM_FIELDS` follow. There is always at least one row: with nothing claimed, one with
    the claim's columns NULL. Claimed rows come in claim order.

    ``fast``: the claim of an uncrowded outbox (see :func:`claim_stmt`): up to ``:limit``
    candidates, taken all together when :func:`_crowded` finds nothing before them, else none.
    """
    t = outbox_table
    if fast:
        candidates = _candidates("postgresql", order, previous, "limit")
        end = _last_row(candidates)
        gate = _crowded(candidates, end, "postgresql", previous, "limit")
        crowded = select(gate.c.crowded).scalar_subquery()
        claimed = _claim_update(
            "postgresql",
            select(candidates.c.id).where(~crowded, _whole_transactions(candidates, end)),
        ).cte("claimed")
        state: list[Any] = [literal_column("0").label("parked"), literal_column("0").label("held")]
    else:
        claim, park, excluded, gate = _claim_plan("postgresql", order, previous, whole=True)
        parked = (
            update(t).where(t.c.id.in_(park)).values(parked=True).returning(t.c.id).cte("parked")
        )
        claimed = _claim_update("postgresql", claim).cte("claimed")
        state = [
            select(func.count()).select_from(parked).scalar_subquery().label("parked"),
            select(func.count()).select_from(excluded).scalar_subquery().label("held"),
        ]
    header = select(
        *counts, *state, select(gate.c.crowded).scalar_subquery().label("crowded")
    ).subquery("header")
    return (
        select(*header.c, *claimed.c)
        .select_from(header.outerjoin(claimed, true()))
        .order_by(claimed.c.staged_at, claimed.c.id)
    )


@cache  # built once per process: a construct is immutable, and the claims take ~0.1 s to build
def claim_stmt(dialect: str, order: str = "key", *, fast: bool = False) -> Select[Any] | Update:
    """Lease up to ``:limit`` due rows in claim order, keeping every ordering promise.

    One statement locks, parks and stamps on PostgreSQL (see :func:`_claim_plan` for what is
    taken and why): its leading columns are ``parked`` and ``held`` (rows of the window the claim
    could not take) and ``crowded`` (see below), then the :data:`CLAIM_FIELDS`, in claim order.
    A SELECT that only locked would release its locks when its autocommit statement ended, and
    two relays polling a moment apart would both take the same rows.

    ``fast=True`` (PostgreSQL) is the claim for the common case, a relay alone on a backlog with
    nothing failing: it locks ``:limit`` candidates and takes them all, or, when anything before
    them is not among them (:func:`_crowded`: another relay's claim, a retry backoff, a dead
    letter, a parked row), takes nothing and answers ``crowded``, and the relay makes the full
    claim. It is the full claim's answer in that case without the per-group and per-key
    guard, the parking and the exclusion it never needs; a relay uses it while its last claim
    found the outbox uncrowded. Its ``parked`` and ``held`` are 0. Both claims end on a
    transaction's last row when they can and ``:whole`` asks (:func:`_whole_transactions`).

    On SQLite (no row locks; the relay runs the claim under ``BEGIN IMMEDIATE``, the
    database-wide write lock, after :func:`park_stmt`) it is the plain ``UPDATE ... RETURNING``
    of the claim fields, which the caller sorts.

    ``order="key"`` (default): a row waits only for its transaction's and its ordering key's
    earlier rows. ``order="strict"``: also for the first failed row before it, whatever its key.

    Parameters: ``limit``, ``window`` (at least ``limit``; both written into the SQL text, see
    :func:`_inline`), ``token``; ``lease`` (a ``timedelta``) and ``whole`` (end on a
    transaction boundary, see :func:`_whole_transactions`) on PostgreSQL, ``now`` and
    ``cutoff`` (``now - lease``) on SQLite.
    """
    if dialect == "postgresql":
        return _postgresql_claim(order, None, [], fast=fast)
    if fast:
        raise ValueError("the fast claim is PostgreSQL's; SQLite claims under its write lock")
    claim, _park, _excluded, _gate = _claim_plan(dialect, order, None)
    return _claim_update(dialect, claim)


def park_stmt(dialect: str, order: str = "key") -> Update:
    """SQLite: park the candidates a claim would find stuck (see :func:`_claim_plan`).

    PostgreSQL does this inside :func:`claim_stmt`; SQLite allows no UPDATE inside WITH, so the
    relay runs this first, in the claim's transaction, with the claim's parameters.
    """
    _claim, park, _excluded, _gate = _claim_plan(dialect, order, None)
    # RETURNING, not rowcount: pysqlite reports -1 for an UPDATE that starts with WITH.
    return (
        update(outbox_table)
        .where(outbox_table.c.id.in_(park))
        .values(parked=True)
        .returning(outbox_table.c.id)
    )


def lock_stmt(dialect: str, order: str = "key") -> Select[Any]:
    """MySQL/MariaDB: lock up to ``:window`` claimable rows in claim order and read them.

    The first statement of a claim's transaction on a database without ``UPDATE ...
    RETURNING`` (lock and read, guard, stamp, commit): ``SELECT`` of the :data:`CLAIM_FIELDS`
    ``FOR UPDATE SKIP LOCKED``, so concurrent relays lock disjoint rows and never wait for each
    other. The locks last until the transaction ends; :func:`plan_stmt` then says which of the
    rows the claim may take. Parameters: ``window`` (written into the SQL), ``now``, ``cutoff``.
    """
    t = outbox_table
    return _locking_read(dialect, order, None, "window", *_MESSAGE_COLUMNS, t.c.attempts)


def plan_stmt(dialect: str, order: str = "key") -> Select[Any]:
    """MySQL/MariaDB: which of the locked rows ``:candidate_ids`` a claim must leave.

    The ordering guard of :func:`_claim_plan` over rows :func:`lock_stmt` locked in the same
    transaction: every row it must leave (``id``), and whether to park it (``park``, its holder
    is stuck). The claim takes the other candidates, in claim order, up to its batch size.
    Parameters: ``candidate_ids``, ``now``.
    """
    _claim, park, excluded, _gate = _claim_plan(dialect, order, None, locked=True)
    parked = case((excluded.c.id.in_(park), true()), else_=false()).label("park")
    return select(excluded.c.id, parked)


def stamp_stmt(dialect: str) -> Update:
    """MySQL/MariaDB: stamp the locked rows ``:ids`` with the claim's ``:token`` and ``:now``.

    No fence: the claim's own transaction holds their locks since :func:`lock_stmt` read them.
    """
    return (
        update(outbox_table)
        .where(_ids(dialect))
        .values(claimed_by=bindparam("token"), claimed_at=_now(dialect))
    )


def park_rows_stmt(dialect: str) -> Update:
    """MySQL/MariaDB: park the locked rows ``:ids`` (their holders are stuck, see
    :func:`_claim_plan`), in the claim's transaction."""
    return update(outbox_table).where(_ids(dialect)).values(parked=True)


@cache  # as claim_stmt
def mark_and_claim_stmt(
    order: str = "key", *, fast: bool = False, settle: bool = False
) -> Select[Any]:
    """PostgreSQL: write back the previous claim and take the next one, in one statement.

    A relay working through a backlog publishes a whole claim and claims again at once; sending
    the previous claim's fenced mark (on ``:previous_token`` and ``:previous_ids``) inside the
    next claim saves a round trip per pass. The parts are data-modifying CTEs of one autocommit
    statement: they commit together, or neither does and the relay still holds the mark to write.
    The mark also unparks the rows its rows held back (see :func:`mark_published_stmt`).

    ``settle=True`` (``order="key"`` only) carries a whole write-back instead: the mark, the
    failed rows charged and the rows they held back parked, as :func:`settle_stmt` (same
    parameters, fenced on ``:previous_token``); its ``:handed_ids`` are the previous claim's
    rows it leaves unpublished. A pass with a failure then costs no statement of its own.

    All parts see the same snapshot, in which the previous claim's rows are still stamped
    ``:previous_token`` and unpublished. So the claim skips them (a lease that lapsed would
    otherwise make them candidates, and one statement must not update a row twice), and the
    ordering guard counts the ones being marked as published, or a transaction whose first rows
    ended the previous claim would wait a pass while the rest of the backlog overtook it; the
    kept ones go on holding back their transactions and keys. (In strict order a failure must
    also hold back every later row; the charge that says so is not in the snapshot, so a strict
    relay settles a failed pass on its own.)

    The leading columns are ``marked`` (rows the mark touched), ``unparked`` (with ``settle``
    also ``charged``, ``released``, ``held_back``), then those of :func:`claim_stmt` (``fast``
    as there). Parameters: those of :func:`claim_stmt` on PostgreSQL, plus ``previous_token``
    and ``previous_ids`` (and those of ``settle``).
    """
    if settle and order != "key":
        raise ValueError("a failed pass in strict order is settled on its own")
    token: BindParameter[Any] = bindparam("previous_token")
    if settle:
        counts = _write_back("previous_token", "previous_ids")
        return _postgresql_claim(order, _Previous(token, _few("handed_ids")), counts, fast=fast)
    marked, unparked = _mark_ctes("postgresql", "previous_token", "previous_ids")
    counts = [
        select(func.count()).select_from(marked).scalar_subquery().label("marked"),
        select(func.count()).select_from(unparked).scalar_subquery().label("unparked"),
    ]
    return _postgresql_claim(order, _Previous(token), counts, fast=fast)


def _mark_ctes(dialect: str, token: str, ids: str) -> tuple[Any, Any]:
    t = outbox_table
    marked = (
        update(t)
        .where(_fenced(token), _ids(dialect, ids))
        .values(published_at=_now(dialect))
        .returning(t.c.id, t.c.staged_at, t.c.ordering_key)
        .cte("marked")
    )
    unparked = (
        update(t)
        .where(
            _some_parked(),  # while no row is parked: one empty index read, nothing else
            t.c.id.in_(_parked_behind(marked, dialect)),
        )
        .values(parked=False)
        .returning(t.c.id)
        .cte("unparked")
    )
    return marked, unparked


def _some_parked() -> ColumnElement[bool]:
    """Whether any row is parked: the first entry of ``ix_outbox_parked_group``.

    Not ``EXISTS (... WHERE parked)``: once the statistics count many parked rows, PostgreSQL
    plans that as a sequential scan that stops at the first parked row, and reads everything
    stored before it first (the published history, or the whole backlog when the parked rows
    were written last): 8 ms of every mark while a sweep's 10,000 rows parked until due sat
    at the end of the table, a drain of the others at 0.3 of its speed.
    """
    some_parked = outbox_table.alias("some_parked")
    first: ColumnElement[bool] = (
        select(some_parked.c.staged_at)
        .where(some_parked.c.parked)
        .order_by(some_parked.c.staged_at)
        .limit(literal_column("1"))
        .scalar_subquery()
        .is_not(None)
    )
    return first


def _parked_behind(holders: Any, dialect: str) -> CompoundSelect[Any]:
    """The ids of the parked rows in the transactions and keys of ``holders`` (a CTE or
    subquery with ``staged_at`` and ``ordering_key``): what publishing or discarding them frees.
    Not the rows parked until they are due (:func:`_held_parked`): only the sweep wakes those.

    Found from the holders, one probe of ``ix_outbox_parked_group`` per distinct transaction and
    of ``ix_outbox_parked_key`` per distinct key. ``parked AND (staged_at IN (...) OR
    ordering_key IN (...))`` cannot become a join (an OR of two subqueries is a filter) and read
    every parked row on every mark: with 10,000 rows parked behind dead letters, 4 ms a pass on
    PostgreSQL (the drain of every other row at 60-70% of its speed) and 25-75 ms on MariaDB.
    On PostgreSQL each probe is a ``LATERAL`` subquery kept from being flattened into a join by
    ``OFFSET 0``: planned as a join from statistics that rarely saw a parked row, it scanned
    every parked row to join it. (SQLite and MariaDB have no ``LATERAL``; their join is planned
    from the holders there.)
    """
    t = outbox_table
    parked = t.alias("parked_row")
    held = [parked.c.parked, _held_parked(parked)]

    def behind(column: str) -> Select[Any]:
        if dialect != "postgresql":  # a row listed once per holder is still updated once
            return (
                select(parked.c.id)
                .join(holders, parked.c[column] == holders.c[column])
                .where(*held)
            )
        values = holders.c[column]
        groups = select(values).where(values.is_not(None)).distinct().subquery(f"by_{column}")
        probe = (
            select(parked.c.id)
            .where(*held, parked.c[column] == groups.c[column])
            .offset(literal_column("0"))
            .lateral(f"parked_by_{column}")
        )
        return select(probe.c.id).select_from(groups).join(probe, true())

    return union_all(behind("staged_at"), behind("ordering_key"))


def mark_published_stmt(dialect: str) -> Select[Any] | Update:
    """Mark the claim's rows ``:ids`` published (fenced on ``:token``).

    Publishing a row may free the rows it held back: on PostgreSQL the same statement unparks
    the parked rows of its transactions and keys, and returns ``marked`` and ``unparked``
    counts; on SQLite it is the plain UPDATE (its ``rowcount`` is the marked count) and the
    relay runs :func:`unpark_behind_stmt` after it, in the same transaction. A marked count
    below the number published means part of the claim was lost to another relay, whose work
    then stands.
    """
    if dialect != "postgresql":
        return (
            update(outbox_table).where(_fenced(), _ids(dialect)).values(published_at=_now(dialect))
        )
    marked, unparked = _mark_ctes(dialect, "token", "ids")
    return select(
        select(func.count()).select_from(marked).scalar_subquery().label("marked"),
        select(func.count()).select_from(unparked).scalar_subquery().label("unparked"),
    )


def unpark_behind_stmt(dialect: str, *, dead: bool = False) -> Update:
    """Unpark the rows parked behind some holders: the rows ``:ids`` (or every dead letter).

    Run after the holders were published (SQLite's and MySQL's mark) or before they are
    discarded, so the rows they held back are claimable again. A row still held back by another
    holder is parked again by the next claim that meets it.

    The rows are found from the holders (:func:`_parked_behind`). On MySQL and MariaDB they are
    a derived table joined to the table updated (a multiple-table UPDATE): MySQL refuses a
    subquery on the table being updated (error 1093), and a derived table built from a ``UNION``
    is materialized first.
    """
    t = outbox_table
    rows = parked_behind_stmt(dialect, dead=dead)
    if dialect in MYSQL_DIALECTS:
        freed = rows.subquery("behind")
        return update(t).where(t.c.id == freed.c.id).values(parked=False)
    return update(t).where(t.c.id.in_(rows)).values(parked=False)


def parked_behind_stmt(dialect: str, *, dead: bool = False) -> CompoundSelect[Any]:
    """The ids of the rows parked behind the rows ``:ids`` (or behind every dead letter): what
    :func:`unpark_behind_stmt` unparks.

    MySQL/MariaDB run it as a plain read of its own: a mark there unparks what it freed in two
    steps, this read and :func:`unpark_rows_stmt`, as :func:`unpark_behind_stmt`'s derived table
    is read with shared locks on the rows it joins, and two relays marking at once deadlocked on
    them (InnoDB rolled one mark back, the relay retried it). A row parked again between the two
    steps stays parked: the UPDATE tests ``parked`` and ``wake_at`` on the row as it is then.
    """
    t = outbox_table
    holder = t.alias("holder")
    chosen: ColumnElement[bool]
    if dead:
        chosen = and_(holder.c.dead_at.is_not(None), _unpublished(holder))
    elif dialect == "postgresql":
        chosen = holder.c.id == any_(bindparam("ids", type_=ARRAY(t.c.id.type)))
    else:
        chosen = holder.c.id.in_(bindparam("ids", expanding=True))
    holders = select(holder.c.staged_at, holder.c.ordering_key).where(chosen).subquery("holders")
    return _parked_behind(holders, dialect)


def unpark_rows_stmt(dialect: str) -> Update:
    """MySQL/MariaDB: unpark the rows ``:ids`` still parked behind a holder (no ``wake_at``)."""
    t = outbox_table
    return update(t).where(_ids(dialect), t.c.parked, _held_parked(t)).values(parked=False)


def parked_window() -> Select[Any]:
    """The parked rows one sweep reads (see :func:`free_parked_stmt`): up to ``:limit`` of them
    in claim order after the sweep's cursor, the row ``(:after_staged_at, :after_id)``, read
    from ``ix_outbox_parked_group``, rows parked until due included.

    Bounded, because rows parked until they are due (:mod:`sqla_outbox.waiting`) share the
    index: a sweep that read every parked row to find the few parked behind a holder read all
    of them every few seconds, 13 ms with 100,000 scheduled a day ahead, growing with them.
    The relay moves the cursor on by each sweep's window and starts again from the first
    parked row once a window comes back short (:class:`~sqla_outbox.sweeping.ParkedCursor`), so
    every parked row is read within ``parked / limit`` sweeps.
    """
    row = outbox_table.alias("parked_row")
    after = bindparam("after_staged_at", type_=outbox_table.c.staged_at.type)
    after_id = bindparam("after_id", type_=outbox_table.c.id.type)
    return (
        select(row.c.id, row.c.staged_at, row.c.ordering_key, row.c.wake_at)
        .where(
            row.c.parked,
            row.c.staged_at >= after,
            or_(row.c.staged_at > after, row.c.id > after_id),
        )
        .order_by(row.c.staged_at, row.c.id)
        .limit(bindparam("limit"))
    )


def window_end_stmt(window: Any) -> Select[Any]:
    """One row: the last row of a sweep's :func:`parked_window` (``last_staged_at``,
    ``last_id``; NULL when it is empty) and how many rows it holds (``read``), to move the
    relay's cursor on (:class:`~sqla_outbox.sweeping.ParkedCursor`)."""
    last = (
        select(window.c.staged_at, window.c.id)
        .order_by(window.c.staged_at.desc(), window.c.id.desc())
        .limit(literal_column("1"))
        .subquery("window_last")
    )
    read = select(func.count()).select_from(window).scalar_subquery()
    one = select(literal_column("1").label("one")).subquery("one")
    return select(
        last.c.staged_at.label("last_staged_at"), last.c.id.label("last_id"), read.label("read")
    ).select_from(one.outerjoin(last, true()))


def free_parked_stmt(dialect: str, window: Any = None) -> Select[Any]:
    """The ids of the rows of the sweep's window (:func:`parked_window`, or ``window``, a CTE of
    it) that nothing stuck holds back any more: what :func:`sweep_parked_stmt` unparks (not the
    rows parked until they are due: :func:`wake_stmt` wakes them).

    The safety net under parking. A claim parks a row behind a holder it sees stuck; if that
    holder is published by a statement that ran at the same moment (and so did not see the row
    parked yet), nothing else would unpark it. The relay sweeps every few seconds: a row parked
    that way waits for the sweep whose window reaches it, never for ever. Unparking is always
    safe for order: a row unparked that something does hold back is parked again by the next
    claim that meets it, which decides.

    A parked row is free when the row just before it in its transaction, and the one just
    before it in its ordering key, are not stuck (or there is none): each is one step back
    along an index in claim order (``ix_outbox_unpublished``, ``ix_outbox_key``), whatever the
    planner believes about parked rows (its statistics rarely saw any). Parked rows form
    chains behind their holder, each held by the one before it, so the row just before is
    where a stuck holder shows; a row it misses (a due, unparked row between it and the holder)
    is parked again by the next claim that meets it, which decides the order. One ``EXISTS``
    for any stuck row before it (``staged_at = ... OR ordering_key = ...``) read the
    transaction's and the whole key's rows for every parked row, so a sweep grew with the
    square of a held key's depth: 0.35 s for 10,000 rows parked behind 12 dead letters, every
    few seconds, under the relay's pass lock.
    """
    t = outbox_table
    row = parked_window().subquery("parked_row") if window is None else window

    def predecessor_stuck(column: str) -> ColumnElement[bool]:
        """Whether the due, unpublished row just before ``row`` in its group is stuck."""
        before = t.alias(f"before_in_{column}")
        last = (
            select(_stuck(before, dialect))
            .where(
                before.c[column] == row.c[column],
                _position(before) < _position(row),
                *_holding(before, dialect, None),
            )
            .order_by(before.c.staged_at.desc(), before.c.id.desc())
            .limit(literal_column("1"))
            .scalar_subquery()
        )
        return func.coalesce(last, false())

    held = or_(predecessor_stuck("staged_at"), predecessor_stuck("ordering_key"))
    return select(row.c.id).where(_held_parked(row), ~held)


def sweep_parked_stmt(dialect: str, window: Any = None) -> Update:
    """PostgreSQL and SQLite: unpark the rows :func:`free_parked_stmt` names, in one statement.

    MySQL and MariaDB read those ids first and unpark them by primary key
    (:func:`unpark_rows_stmt`; ``stores.mysql``): in the UPDATE, MySQL refuses a subquery on
    the table it changes (error 1093), and InnoDB reads a derived table there with shared
    locks, on which two relays' sweeps and marks deadlocked.
    """
    t = outbox_table
    free = free_parked_stmt(dialect, window)
    return update(t).where(t.c.id.in_(free)).values(parked=False)


def _not_due_for_a_while(row: Any, dialect: str) -> list[ColumnElement[bool]]:
    """``row`` is claimable, unclaimed, and comes due after ``:park_ahead`` from now
    (``:park_after`` but on PostgreSQL): what a sweep parks until then."""
    later = _from_now(dialect, "park_ahead", "park_after")
    return [*_claimable(row, dialect), row.c.claimed_by.is_(None), _due_at(row) > later]


def waiting_head_stmt(dialect: str) -> Select[Any]:
    """The ids of the rows among the first ``:head`` of the claim's index, read in claim order
    as a claim reads it, that are unclaimed and come due after ``:park_ahead`` from now
    (``:park_after`` but on PostgreSQL): the rows :func:`park_waiting_stmt` parks.

    The head is read first, with each row's due time, and only then filtered: the statement
    reads ``:head`` entries of the index at most, whatever the backlog and the history. Joining
    the head to the rows not due let PostgreSQL read every unpublished row instead (a sequential
    scan of the table, or a bitmap scan of the whole claim index once published rows
    outnumbered them), 11 ms every sweep behind 50,000 due rows, and as much after a drain had
    published them all. A plain read: on MySQL and MariaDB the sweep runs it on its own and
    parks the ids it returns, as a derived table in the UPDATE would take shared locks on ten
    thousand entries of the claim index, on which the relays' marks then deadlock."""
    row = outbox_table.alias("head_row")
    head = (
        select(row.c.id, row.c.run_at, row.c.retry_at, row.c.claimed_by)
        .where(*_claimable(row, dialect))
        .order_by(row.c.staged_at, row.c.id)
    )
    for name in MYSQL_DIALECTS:
        head = head.with_hint(row, "USE INDEX (ix_outbox_claimable)", dialect_name=name)
    heads = head.limit(_inline("head")).subquery("head")
    later = _from_now(dialect, "park_ahead", "park_after")
    return select(heads.c.id).where(heads.c.claimed_by.is_(None), _due_at(heads) > later)


def park_waiting_stmt(dialect: str) -> Update:
    """Park the rows :func:`waiting_head_stmt` names, each until it is due (``wake_at``).

    Out of ``ix_outbox_claimable``, they cost the claims nothing until :func:`wake_stmt` brings
    them back (see :mod:`sqla_outbox.waiting`). Unclaimed rows only, and on PostgreSQL only those
    no other statement has locked (``SKIP LOCKED``), their conditions checked again on the row
    as locked: a sweep never touches a claim's rows, and two relays sweeping at once part the
    rows between them. The head may hold due rows, which stay where they are.

    On MySQL and MariaDB it parks the rows ``:ids`` (read by :func:`waiting_head_stmt` first)
    whose conditions still hold on the row as InnoDB reads it, current and locked.
    """
    t = outbox_table
    chosen: ColumnElement[bool]
    if dialect in MYSQL_DIALECTS:
        chosen = and_(_ids(dialect), *_not_due_for_a_while(t, dialect))
    elif dialect == "postgresql":
        named = func.array(waiting_head_stmt(dialect).scalar_subquery())
        waiting = t.alias("waiting_row")
        locked = (
            select(waiting.c.id)
            .where(waiting.c.id == any_(named), *_not_due_for_a_while(waiting, dialect))
            .with_for_update(of=waiting, skip_locked=True)
        )
        chosen = t.c.id == any_(func.array(locked.scalar_subquery()))
    else:
        chosen = t.c.id.in_(waiting_head_stmt(dialect))
    return update(t).where(chosen).values(parked=True, wake_at=_due_at(t))


def wake_stmt(dialect: str) -> Update:
    """Unpark the rows parked until due (:func:`park_waiting_stmt`) that come due before
    ``:wake_ahead`` from now (``:wake_before`` but on PostgreSQL), whether or not their time
    has come, so each is back in the claim's index before it is due.

    Read through ``ix_outbox_waking`` alone. A woken row that something stuck holds back is
    parked behind it by the next claim that meets it, as any row. On PostgreSQL ``SKIP LOCKED``
    as :func:`park_waiting_stmt`.
    """
    t = outbox_table
    soon = _from_now(dialect, "wake_ahead", "wake_before")

    def waking(row: Any) -> list[ColumnElement[bool]]:
        # IS NOT NULL as the index's predicate says it: SQLite then reads the partial index.
        return [row.c.wake_at.is_not(None), row.c.wake_at <= soon]

    chosen: list[ColumnElement[bool]]
    if dialect == "postgresql":
        row = t.alias("waking_row")
        locked = select(row.c.id).where(*waking(row)).with_for_update(skip_locked=True)
        chosen = [t.c.id == any_(func.array(locked.scalar_subquery()))]
    else:
        chosen = waking(t)
    return update(t).where(*chosen).values(parked=False, wake_at=null())


def sweep_stmt() -> Select[Any]:
    """PostgreSQL: a whole sweep in one autocommit statement: :func:`sweep_parked_stmt`,
    :func:`wake_stmt` and :func:`park_waiting_stmt` as data-modifying CTEs, and how many rows
    each changed (``unparked``, ``woken``, ``parked``), with their parameters; then the end of
    the parked rows' window (:func:`window_end_stmt`), read once, as a CTE, by the unparking and
    by the end.

    The three never meet a row twice in the one snapshot they share: the first changes parked
    rows without a ``wake_at``, the second rows with one, the third rows not parked.
    """
    window = parked_window().cte("parked_row")
    parts = {
        "unparked": sweep_parked_stmt("postgresql", window),
        "woken": wake_stmt("postgresql"),
        "parked": park_waiting_stmt("postgresql"),
    }
    counts = []
    for name, statement in parts.items():
        changed = statement.returning(outbox_table.c.id).cte(f"{name}_rows")
        counts.append(select(func.count()).select_from(changed).scalar_subquery().label(name))
    end = window_end_stmt(window).subquery("window_end")
    return select(*counts, end.c.last_staged_at, end.c.last_id, end.c.read)


def analyze_stmt() -> DDL:
    """PostgreSQL: ``ANALYZE`` the outbox table (its name as every statement here has it,
    ``schema_translate_map`` honoured), so the planner counts the rows parked and woken
    (:mod:`sqla_outbox.analyzing`)."""
    statement = DDL("ANALYZE %(fullname)s")  # type: ignore[no-untyped-call]
    return statement.against(outbox_table)


def release_stmt(dialect: str) -> Update:
    """Hand the claim's rows ``:ids`` back at once (fenced on ``:token``), charging nothing.

    Without it the rows a pass did not publish would wait out the whole lease: those after a
    failure in strict order, everything after a broker outage or a graceful stop, and, with
    ``:park`` true, those held back by a row that failed in this pass: parked, so the next claims
    do not fill every batch with rows that must wait for it anyway.
    """
    return (
        update(outbox_table)
        .where(_fenced(), _ids(dialect))
        .values(claimed_by=null(), claimed_at=null(), parked=bindparam("park", type_=Boolean()))
    )


def unclaim_stmt() -> Update:
    """Hand back every row still claimed by ``:token``, when the claim's rows never reached the
    relay (their ``input`` could not be decoded, see ``stores.psycopg``), so a second claim can
    take them at once instead of after the lease. A rare path: nothing indexes ``claimed_by``,
    so it reads the unpublished rows."""
    return update(outbox_table).where(_fenced()).values(claimed_by=null(), claimed_at=null())


def _retry_at(dialect: str) -> ColumnElement[dt.datetime]:
    if dialect == "postgresql":
        return func.now() + bindparam("delay", type_=Interval())
    return bindparam("retry_at", type_=UTCDateTime())


def fail_stmt(dialect: str) -> Update:
    """Charge a failed publish to row ``:failed_id`` and hand it back (fenced on ``:token``).

    ``attempts`` goes up by one and ``last_error`` is ``:error``. With ``:dead`` the row becomes
    a dead letter (``dead_at``: never claimed again, still holding back its transaction's and
    key's later rows, until an operator retries or discards it); otherwise it may be claimed
    again once its backoff ends: ``now() + :delay`` on PostgreSQL, ``:retry_at`` on SQLite.
    Run as an executemany, one parameter set per failed row.
    """
    t = outbox_table
    now = _now(dialect)
    dead = bindparam("dead", type_=Boolean())
    return (
        update(t)
        .where(t.c.id == bindparam("failed_id", type_=t.c.id.type), _fenced())
        .values(
            claimed_by=null(),
            claimed_at=null(),
            attempts=t.c.attempts + 1,
            last_error=bindparam("error", type_=Text()),
            retry_at=case((dead, null()), else_=_retry_at(dialect)),
            dead_at=case((dead, now), else_=null()),
        )
    )


def settle_stmt() -> Select[Any]:
    """PostgreSQL: write back a whole pass in one autocommit statement, fenced on ``:token``.

    Marks ``:ids`` published (unparking what they held back, as :func:`mark_published_stmt`)
    and hands back the rest of the claim, ``:handed_ids``, with one UPDATE: a row with an
    ``:errors`` entry is charged (with its ``:delays`` and ``:deads`` entries, as
    :func:`fail_stmt`), the others are released, parked where ``:parks`` says so (held back
    by a failure, as :func:`release_stmt`). The unclaimed rows after a charged or parked row
    of its transaction are parked too (:func:`_behind`). One round trip instead of a
    transaction of four statements for every pass with a failure. Returns the counts
    ``marked``, ``unparked``, ``charged``, ``released``, ``held_back``, ``parked_behind``.
    """
    return select(*_write_back("token", "ids"))


def _write_back(token: str, ids: str) -> list[Any]:
    """The counts of a pass's write-back (:func:`settle_stmt`) done by data-modifying CTEs.

    Everything the pass hands back is one UPDATE (and so one table modification in the plan,
    each of which costs the statement's start-up), from the claim's rows (fenced on the token)
    and the rows :func:`_behind` locked (unclaimed).
    """
    t = outbox_table
    now = func.now()
    marked, unparked = _mark_ctes("postgresql", token, ids)
    handed = (
        func.unnest(
            _few("handed_ids"),
            _few("errors", Text()),
            _few("delays", Interval()),
            _few("deads", Boolean()),
            _few("parks", Boolean()),
        )
        .table_valued("id", "error", "delay", "dead", "park")
        .render_derived(name="handed")
    )
    fence = bindparam(token, type_=t.c.claimed_by.type)
    behind = _behind(handed, fence)
    targets = union_all(
        select(*handed.c, fence.label("fence")),
        select(
            behind.c.id,
            null().label("error"),
            null().label("delay"),
            null().label("dead"),
            true().label("park"),
            null().label("fence"),
        ),
    ).subquery("target")
    charging = targets.c.error.is_not(None)
    written = (
        update(t)
        .where(
            t.c.id == targets.c.id,
            _unpublished(),
            t.c.claimed_by.is_not_distinct_from(targets.c.fence),
        )
        .values(
            claimed_by=null(),
            claimed_at=null(),
            attempts=t.c.attempts + case((charging, 1), else_=0),
            last_error=func.coalesce(targets.c.error, t.c.last_error),
            retry_at=case(
                (~charging, t.c.retry_at),
                (targets.c.dead, null()),
                else_=now + targets.c.delay,
            ),
            dead_at=case((~charging, t.c.dead_at), (targets.c.dead, now), else_=null()),
            parked=targets.c.park,
        )
        .returning(
            charging.label("charged"),
            targets.c.park,
            targets.c.fence.is_(None).label("behind"),
        )
        .cte("written")
    )

    def count(part: Any, *where: ColumnElement[bool]) -> Any:
        return select(func.count()).select_from(part).where(*where).scalar_subquery()

    return [
        count(marked).label("marked"),
        count(unparked).label("unparked"),
        count(written, written.c.charged).label("charged"),
        count(written, ~written.c.charged, ~written.c.park).label("released"),
        count(written, written.c.park, ~written.c.behind).label("held_back"),
        count(written, written.c.behind).label("parked_behind"),
    ]


def _behind(handed: Any, fence: BindParameter[Any]) -> Any:
    """The unclaimed rows after a charged or held-back row (of ``handed``) of its transaction,
    locked: the write-back parks them. Only while that row is still in the claim (``fence``):
    a relay that lost its claim writes nothing, here as everywhere.

    They wait for it whichever claim meets them, and a claim that met them would find a stuck
    row before its candidates and hand over to the full claim only to park them (a pass ends
    inside a transaction whenever held-back rows shifted the batches). Rows locked by a claim
    at this instant are skipped, as are lapsed claims' rows: the claim that meets them parks
    them. A transaction's rows are as many as one commit staged; an ordering key's later rows
    are left to the claims, a key may have thousands.
    """
    t = outbox_table
    stuck, row = t.alias("stuck_row"), t.alias("later_row")
    return (
        select(row.c.id)
        .join(stuck, and_(row.c.staged_at == stuck.c.staged_at, row.c.id > stuck.c.id))
        .join(handed, stuck.c.id == handed.c.id)
        .where(
            or_(handed.c.error.is_not(None), handed.c.park),
            stuck.c.claimed_by == fence,
            _unpublished(stuck),
            _unpublished(row),
            row.c.claimed_by.is_(None),
            row.c.dead_at.is_(None),
            ~row.c.parked,
        )
        .with_for_update(of=row, skip_locked=True)
        .cte("behind")
    )


def renew_stmt(dialect: str) -> Update:
    """Renew the lease of the claim's rows ``:ids`` (fenced on ``:token``): ``claimed_at = now``.

    ``rowcount`` below the number still held means the claim was lost: its lease lapsed and
    another relay took the rows, so this pass must publish nothing more of it.
    """
    return update(outbox_table).where(_fenced(), _ids(dialect)).values(claimed_at=_now(dialect))


def idle_stmt(dialect: str) -> Select[Any, Any, Any, bool, dt.datetime]:
    """What an idle relay must come back for: ``next_run_at`` (the earliest still in the
    future), ``next_retry_at`` (the earliest backoff end of a row no claim holds: in the past
    when one is due now), ``oldest_claim`` (lapses ``claim_lease`` later), ``parked`` (whether
    any row is) and the database's ``now``.

    Only rows a claim may take can bring a relay back (:func:`_claimable`): a dead letter comes
    due only when an operator retries it, a parked row only when its holder's mark or a sweep
    unparks it. So the aggregates read ``ix_outbox_claimable``, ``parked`` is the first entry
    of ``ix_outbox_parked_group``, and an idle relay's plan costs the same with ten thousand
    dead letters or parked rows as with none (reading every unpublished row, it cost 14 times
    as much with 10,000 of them, on every idle transition).

    Aggregates over some of the rows are ``min(CASE WHEN ... THEN x END)`` rather than
    ``FILTER (WHERE ...)``, which MySQL and MariaDB lack. There ``now`` is cast to
    ``DATETIME(6)``: a parameter selected back comes back as text.
    """
    t = outbox_table
    now = _now(dialect)
    # In the claim's order: PostgreSQL then reads the claim index even when its statistics
    # still count a backlog just drained as unpublished (autovacuum analyses a minute or so
    # later), where it read the whole table, published history included, on every idle
    # transition meanwhile (7 ms over 50,000 rows). Elsewhere the order changes nothing.
    rows = (
        select(t.c.run_at, t.c.retry_at, t.c.claimed_at)
        .where(*_claimable(t, dialect))
        .order_by(t.c.staged_at, t.c.id)
        .subquery("claimable")
    )
    shown = cast(now, UTCDateTime()) if dialect in MYSQL_DIALECTS else now
    return select(
        func.min(case((rows.c.run_at > now, rows.c.run_at))).label("next_run_at"),
        # Past ones too, of rows no claim holds: a backoff that ended after the relay's last
        # claim and before this plan is work due now, not "nothing pending" (which would let
        # the relay sleep until IDLE_MAX while the retried row waits).
        func.min(case((rows.c.claimed_at.is_(None), rows.c.retry_at))).label("next_retry_at"),
        func.min(rows.c.claimed_at).label("oldest_claim"),  # min() skips NULLs: unclaimed rows
        _some_parked().label("parked"),
        shown.label("now"),
    )


# --- inspection and operators ------------------------------------------------------------------


def pending_stmt() -> Select[int]:
    """How many committed rows are not yet published (dead letters included)."""
    return select(func.count()).select_from(outbox_table).where(_unpublished())


# --- dead letters and status (operator statements) ---------------------------------------------
#
# What ``sqla-outbox status`` and the dead-letter operations (:mod:`sqla_outbox.dead_letters`,
# ``sqla-outbox dead``) run. None of them is fenced: they run outside any claim, and a dead letter
# is never claimed, so no relay holds the rows they change.


def _oldest_due(table: Any, now: ColumnElement[dt.datetime]) -> Label[dt.datetime]:
    """``oldest_due_at``: when the longest-waiting unpublished row came due, the later of its
    ``staged_at`` and ``run_at``, among the rows due by ``now`` (dead letters and rows in a
    retry backoff included: they are late too); NULL when none is.

    What an age alert measures. From ``staged_at`` alone, a message scheduled an hour ahead was
    "older" than ``status --max-age`` the moment it was staged, and a probe paged for it until it
    was due and published.
    """
    came_due = _later(table.c.run_at, table.c.staged_at)
    return func.min(case((table.c.run_at <= now, came_due))).label("oldest_due_at")


def status_stmt(dialect: str) -> Select[int, int, Any, int, int, int, int]:
    """The backlog in one query: ``pending``, ``due``, ``oldest_due_at`` (:func:`_oldest_due`),
    ``failing`` (rows with failed attempts), ``dead``, ``backing_off`` (waiting out a retry
    backoff) and ``parked`` (held back behind a failed or dead row; not the rows parked until
    they are due, which are scheduled or backing off).

    Every figure is about unpublished rows, so that is the WHERE clause, which the partial index
    ``ix_outbox_unpublished`` covers: the cost follows the backlog, not the published history
    (on PostgreSQL 1.7 ms instead of 27 ms over 300,000 rows with 1% unpublished, and no slower
    with none published). The counts are ``count(CASE WHEN ... THEN 1 END)``: MySQL and MariaDB
    have no ``FILTER (WHERE ...)``, and over the unpublished rows alone this one spelling is as
    fast on PostgreSQL as ``FILTER`` over the whole table was.
    """
    t = outbox_table
    now = _now(dialect)
    alive = t.c.dead_at.is_(None)

    def rows(*conditions: ColumnElement[bool]) -> ColumnElement[int]:
        return func.count(case((and_(*conditions), literal_column("1"))))

    due = rows(
        alive, t.c.run_at <= now, ~t.c.parked, or_(t.c.retry_at.is_(None), t.c.retry_at <= now)
    )
    return (
        select(
            func.count().label("pending"),
            due.label("due"),
            _oldest_due(t, now),
            rows(_charged(t)).label("failing"),
            rows(t.c.dead_at.is_not(None)).label("dead"),
            rows(alive, t.c.retry_at > now).label("backing_off"),
            rows(alive, t.c.parked, _held_parked(t)).label("parked"),
        )
        .select_from(t)
        .where(_unpublished())
    )


def claims_stmt() -> Select[Any]:
    """Claims holding unpublished rows, per fence token: token, rows ``held``, ``claimed_at``."""
    return (
        select(
            outbox_table.c.claimed_by,
            func.count().label("held"),
            func.min(outbox_table.c.claimed_at).label("claimed_at"),
        )
        .where(_unpublished(), outbox_table.c.claimed_by.is_not(None))
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
        select(*_MESSAGE_COLUMNS, *_FAILURE_COLUMNS)
        .where(_unpublished(), _charged(t))
        .order_by(t.c.staged_at, t.c.id)
        .limit(bindparam("limit"))
    )


def _dead(ids: bool, dialect: str) -> list[ColumnElement[bool]]:
    conditions = [_unpublished(), outbox_table.c.dead_at.is_not(None)]
    if ids:
        conditions.append(_ids(dialect))
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
        select(*_MESSAGE_COLUMNS, *_FAILURE_COLUMNS)
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
    :func:`unpark_behind_stmt` for the same rows, in the same transaction: once a holder is
    gone, nothing names the rows it parked."""
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
    ``count(CASE ...)`` as there; ``now`` is cast on MySQL and MariaDB as in :func:`idle_stmt`.
    """
    t = outbox_table
    now = _now(dialect)
    return (
        select(
            func.count().label("pending"),
            func.count(case((t.c.dead_at.is_not(None), literal_column("1")))).label("dead"),
            _oldest_due(t, now),
            (cast(now, UTCDateTime()) if dialect in MYSQL_DIALECTS else now).label("now"),
        )
        .select_from(t)
        .where(_unpublished())
    )


# --- retention (operator statement) ------------------------------------------------------------


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
