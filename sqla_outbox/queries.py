"""Every statement sqla-outbox runs, built with SQLAlchemy Core from the mapped table.

One named function per statement, so the SQL can be read in one place, pinned by unit tests
(compile a claim for PostgreSQL and look for ``FOR UPDATE SKIP LOCKED``), and honours the
table's schema. Nothing here executes anything.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Insert,
    Interval,
    Select,
    Table,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    update,
)

from sqla_outbox.message import OutboxMessage
from sqla_outbox.model import OutboxRow, UTCDateTime

__all__ = [
    "MESSAGE_FIELDS",
    "claim_stmt",
    "claims_stmt",
    "mark_and_claim_stmt",
    "mark_published_stmt",
    "pending_stmt",
    "release_stmt",
    "stage_rows",
    "stage_stmt",
    "status_stmt",
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
# (``now()``), so every relay host compares leases against one clock whatever its own drifts;
# SQLite has no server and a single host, so the relay passes its own UTC time as ``:now``.

_MESSAGE_COLUMNS = (
    outbox_table.c.id,
    outbox_table.c.job,
    outbox_table.c.queue,
    outbox_table.c.input,
    outbox_table.c.idempotency_key,
    outbox_table.c.max_attempts,
    outbox_table.c.run_at,
    outbox_table.c.staged_at,
    outbox_table.c.tenant_id,
    outbox_table.c.traceparent,
    outbox_table.c.enqueued_by,
)
MESSAGE_FIELDS = tuple(column.name for column in _MESSAGE_COLUMNS)
"""The columns a claim returns, in :class:`OutboxMessage` field order."""


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


def _unpublished() -> ColumnElement[bool]:
    return outbox_table.c.published_at.is_(None)


def claim_stmt(dialect: str) -> Update | Select[Any]:
    """Lease up to ``:limit`` due, unpublished, unclaimed-or-lapsed rows, in claim order.

    One statement locks and stamps: ``UPDATE ... WHERE id = ANY(ARRAY(SELECT ... FOR UPDATE
    SKIP LOCKED))`` (``IN`` on SQLite). A SELECT that only locked would release its locks when
    its autocommit statement ended, and two relays polling a moment apart would both take the
    same rows. ``SKIP LOCKED`` keeps concurrent relays from queueing behind each other. SQLite
    has no row locks; there the relay runs this under ``BEGIN IMMEDIATE``, the database-wide
    write lock.

    Enqueue order inside a transaction must hold across relays too, and ``SKIP LOCKED`` alone
    would split a transaction's rows (its ``staged_at`` group) between two claims: the second
    relay could publish row 3 while the first is still on row 2. Worse, two claims scanning at
    the same instant each skip the rows the other has just locked, so a claim's candidates can
    have holes in the middle of a group. So a group is claimed only when its candidates are
    every due, unpublished row of the group up to the claim's last candidate; otherwise (a row
    held by another claim, handed back after a failure, or locked for an instant by a concurrent
    claim) the whole group waits for a later claim. One counting index scan per group.

    RETURNING order is not guaranteed. On PostgreSQL the UPDATE is wrapped in a data-modifying
    CTE and the outer SELECT returns the rows in claim order; on SQLite the caller sorts them.

    Parameters: ``limit``, ``token``; ``lease`` (a ``timedelta``) on PostgreSQL, ``now`` and
    ``cutoff`` (``now - lease``) on SQLite.
    """
    claim = _claim(dialect, previous_claim=None)
    if dialect != "postgresql":
        return claim  # SQLite allows no UPDATE inside WITH; the relay sorts these rows itself
    claimed = claim.cte("claimed")
    return select(*claimed.c).order_by(claimed.c.staged_at, claimed.c.id)


def mark_and_claim_stmt() -> Select[Any]:
    """PostgreSQL: mark the previous claim published and take the next one, in one statement.

    A relay working through a backlog publishes a whole claim and claims again at once; sending
    the previous claim's fenced mark (:func:`mark_published_stmt`, on ``:previous_token`` and the
    ``:previous_*`` bounds) inside the next claim saves a round trip per pass. The two parts are
    data-modifying CTEs of one autocommit statement: they commit together, or neither does and
    the relay still holds the mark to write.

    Both parts see the same snapshot, in which the rows being marked still look unpublished. So
    the claim skips rows stamped ``:previous_token`` (a lease that lapsed would otherwise make
    them candidates, and one statement must not update a row twice), and the ordering guard
    counts them as published, or a transaction whose first rows ended the previous claim would
    wait a pass while the rest of the backlog overtook it.

    The first column, ``marked``, is how many rows the mark touched; the message columns follow.
    There is always at least one row: when nothing was claimed, one with the message columns
    NULL. Parameters: those of :func:`claim_stmt` on PostgreSQL, plus ``previous_token``,
    ``previous_first_staged_at``, ``previous_first_id``, ``previous_last_staged_at`` and
    ``previous_last_id``.
    """
    previous = "previous_"
    marked = (
        update(outbox_table)
        .where(_fenced(f"{previous}token"), _claim_slice(previous))
        .values(published_at=_now("postgresql"))
        .returning(outbox_table.c.id)
        .cte("marked")
    )
    marked_count = select(func.count().label("marked")).select_from(marked).subquery("marks")
    claimed = _claim("postgresql", previous_claim=bindparam(f"{previous}token")).cte("claimed")
    return (
        select(marked_count.c.marked, *claimed.c)
        .select_from(marked_count.outerjoin(claimed, true()))
        .order_by(claimed.c.staged_at, claimed.c.id)
    )


def _claim(dialect: str, previous_claim: ColumnElement[str] | None) -> Update:
    """The claim's ``UPDATE ... RETURNING``, for :func:`claim_stmt` and its callers.

    ``previous_claim`` is the token of a claim marked published in the same statement (see
    :func:`mark_and_claim_stmt`), whose rows the claim must neither take nor wait for.
    """
    now = _now(dialect)
    lapsed = outbox_table.c.claimed_at < _lease_cutoff(dialect)
    eligible = [
        _unpublished(),
        outbox_table.c.run_at <= now,
        or_(outbox_table.c.claimed_at.is_(None), lapsed),
    ]
    if previous_claim is not None:
        eligible.append(outbox_table.c.claimed_by.is_distinct_from(previous_claim))
    candidates = (
        select(outbox_table.c.id, outbox_table.c.staged_at)
        .where(*eligible)
        .order_by(outbox_table.c.staged_at, outbox_table.c.id)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
        .cte("candidates")
    )
    # The claim's last row in claim order; every group is checked up to it.
    claim_end = (
        select(candidates.c.staged_at, candidates.c.id)
        .order_by(candidates.c.staged_at.desc(), candidates.c.id.desc())
        .limit(literal_column("1"))
        .cte("claim_end")
    )
    groups = (
        select(candidates.c.staged_at, func.count().label("size"))
        .group_by(candidates.c.staged_at)
        .cte("groups")
    )
    group_row = outbox_table.alias("group_row")
    due = [
        group_row.c.staged_at == groups.c.staged_at,
        tuple_(group_row.c.staged_at, group_row.c.id)
        <= select(claim_end.c.staged_at, claim_end.c.id).scalar_subquery(),
        group_row.c.published_at.is_(None),
        group_row.c.run_at <= now,
    ]
    if previous_claim is not None:
        due.append(group_row.c.claimed_by.is_distinct_from(previous_claim))
    due_up_to_last = select(func.count()).where(*due).scalar_subquery()
    held_back = select(groups.c.staged_at).where(due_up_to_last != groups.c.size)
    claimable = select(candidates.c.id).where(candidates.c.staged_at.not_in(held_back))
    if dialect == "postgresql":
        # ``= ANY(ARRAY(...))`` probes the primary key once per row; with ``IN (...)`` the planner
        # may hash the ids and scan the whole table once the batch is large.
        claimed_ids = outbox_table.c.id == any_(func.array(claimable.scalar_subquery()))
    else:
        claimed_ids = outbox_table.c.id.in_(claimable)
    return (
        update(outbox_table)
        .where(claimed_ids)
        .values(claimed_by=bindparam("token"), claimed_at=now)
        .returning(*_MESSAGE_COLUMNS)
    )


def _fenced(token: str = "token") -> ColumnElement[bool]:
    # The fence: only the claim that stamped ``token`` may change these rows. A relay that stalled
    # past its lease finds another claim's token there, and its update touches nothing.
    return and_(outbox_table.c.claimed_by == bindparam(token), _unpublished())


def _claim_slice(prefix: str = "") -> ColumnElement[bool]:
    # Rows are published in claim order, so "the published ones" and "the rest" are both
    # contiguous slices of the claim in (staged_at, id) order. Bounding the slice on both sides
    # keeps the update on the partial index; a bound on one side only (or the token alone, which
    # is not indexed) turns it into a scan of every unpublished row once the backlog is large.
    key = tuple_(outbox_table.c.staged_at, outbox_table.c.id)
    return and_(
        key
        >= tuple_(
            bindparam(f"{prefix}first_staged_at", type_=UTCDateTime()),
            bindparam(f"{prefix}first_id", type_=outbox_table.c.id.type),
        ),
        key
        <= tuple_(
            bindparam(f"{prefix}last_staged_at", type_=UTCDateTime()),
            bindparam(f"{prefix}last_id", type_=outbox_table.c.id.type),
        ),
    )


def mark_published_stmt(dialect: str) -> Update:
    """Mark the claim's rows between ``:first_*`` and ``:last_*`` (inclusive) published.

    Used for the published prefix of a claim. ``rowcount`` below the number published means part
    of the claim was lost to another relay, whose work then stands.
    """
    return update(outbox_table).where(_fenced(), _claim_slice()).values(published_at=_now(dialect))


def release_stmt() -> Update:
    """Hand the claim's unpublished rows between ``:first_*`` and ``:last_*`` back at once.

    Without it the rows a failed pass held would wait out the whole lease. A failure is recorded
    (``attempts + 1``, ``last_error``) on ``:failed_id``, which may be ``None`` (a graceful stop
    mid-pass records nothing).
    """
    failed = outbox_table.c.id == bindparam("failed_id", type_=outbox_table.c.id.type)
    return (
        update(outbox_table)
        .where(_fenced(), _claim_slice())
        .values(
            claimed_by=null(),
            claimed_at=null(),
            attempts=outbox_table.c.attempts + case((failed, 1), else_=0),
            last_error=case(
                (failed, bindparam("error", type_=Text())), else_=outbox_table.c.last_error
            ),
        )
    )


def pending_stmt() -> Select[int]:
    """How many committed rows are not yet published."""
    return select(func.count()).select_from(outbox_table).where(_unpublished())


def status_stmt(dialect: str) -> Select[int, int, Any, int]:
    """Pending, due, oldest pending ``staged_at`` and rows with failed attempts, in one query."""
    now = _now(dialect)
    unpublished = _unpublished()
    return select(
        func.count().filter(unpublished).label("pending"),
        func.count().filter(and_(unpublished, outbox_table.c.run_at <= now)).label("due"),
        func.min(outbox_table.c.staged_at).filter(unpublished).label("oldest_staged_at"),
        func.count().filter(and_(unpublished, outbox_table.c.attempts > 0)).label("failing"),
    ).select_from(outbox_table)


def claims_stmt() -> Select[str | None, int, Any]:
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
