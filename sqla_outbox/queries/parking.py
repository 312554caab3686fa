"""Parking and unparking: the statements that move rows out of the claim's index and back.

A row leaves ``ix_outbox_claimable`` (``parked``) in two ways:

* **behind a holder**: a claim found it waiting for a stuck row (a dead letter, a row in retry
  backoff) and parked it naming that row in ``parked_behind`` (:mod:`sqla_outbox.plan`). What
  frees it is that row going: the mark that publishes it (:func:`unpark_marked`), the discard of
  a dead letter (:func:`unpark_behind_stmt`), or, for a row that went another way (retried out
  of its backoff, or published by a statement that ran as the row was parked), the sweep
  (:func:`free_parked_stmt`). Each finds the rows through ``ix_outbox_parked_behind``: freeing a
  holder reads exactly the rows parked behind it, however many others are parked;
* **until due**: the sweep parks the rows at the head of the claim's index that come due much
  later, recording when in ``wake_at``, and wakes them before they are
  (:mod:`sqla_outbox.waiting`). Only the sweep's wake unparks those.

Unparking is always safe for order: a row unparked that still has to wait is parked again by
the next claim that meets it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.schema import DDL

from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.model import UTCDateTime
from sqla_outbox.queries.terms import (
    due_at,
    from_now,
    ids_param,
    in_claim_index,
    inline,
    now,
    outbox_table,
    unpublished,
)

__all__ = [
    "analyze_stmt",
    "free_parked_stmt",
    "idle_stmt",
    "park_waiting_stmt",
    "parked_window",
    "some_parked",
    "sweep_parked_stmt",
    "sweep_stmt",
    "unpark_behind_stmt",
    "unpark_marked",
    "unpark_rows_stmt",
    "waiting_head_stmt",
    "wake_stmt",
    "window_end_stmt",
]

_UNPARK = {"parked": false(), "parked_behind": null()}


def some_parked() -> ColumnElement[bool]:
    """Whether any row is parked: the first entry of ``ix_outbox_parked_group``.

    Not ``EXISTS (... WHERE parked)``: once the statistics count many parked rows, PostgreSQL
    plans that as a sequential scan that stops at the first parked row, and reads everything
    stored before it first.
    """
    some = outbox_table.alias("some_parked")
    first: ColumnElement[bool] = (
        select(some.c.staged_at)
        .where(some.c.parked)
        .order_by(some.c.staged_at)
        .limit(literal_column("1"))
        .scalar_subquery()
        .is_not(None)
    )
    return first


def _some_parked_behind() -> ColumnElement[bool]:
    """Whether any row is parked behind a holder: the first entry of
    ``ix_outbox_parked_behind`` (one empty index read while none is)."""
    some = outbox_table.alias("some_parked_behind")
    first: ColumnElement[bool] = (
        select(some.c.parked_behind)
        .where(some.c.parked_behind.is_not(None))
        .limit(literal_column("1"))
        .scalar_subquery()
        .is_not(None)
    )
    return first


def unpark_marked(marked: Any) -> Any:
    """PostgreSQL: the rows parked behind the rows of ``marked`` (a CTE of the ids a mark just
    published), unparked, as a data-modifying CTE returning their ids. ``= ANY(ARRAY(...))``
    probes ``ix_outbox_parked_behind`` once per marked row."""
    t = outbox_table
    behind = func.array(select(marked.c.id).scalar_subquery())
    return (
        update(t)
        .where(_some_parked_behind(), t.c.parked_behind == any_(behind))
        .values(**_UNPARK)
        .returning(t.c.id)
        .cte("unparked")
    )


def unpark_behind_stmt(dialect: str, *, dead: bool = False) -> Update:
    """Unpark the rows parked behind the rows ``:ids`` (or behind every dead letter).

    Run after the holders were published (a mark) or before they are discarded, so the rows
    they held back are claimable again. ``dead=True`` is for PostgreSQL and SQLite: MySQL
    refuses a subquery on the table an UPDATE changes (error 1093), so there the dead letters'
    ids are read first and passed as ``:ids``.
    """
    t = outbox_table
    if dead:
        holder = t.alias("holder")
        dead_letters = select(holder.c.id).where(holder.c.dead_at.is_not(None), unpublished(holder))
        chosen: ColumnElement[bool] = t.c.parked_behind.in_(dead_letters)
    else:
        chosen = ids_param(dialect, column=t.c.parked_behind)
    return update(t).where(chosen).values(**_UNPARK)


def unpark_rows_stmt(dialect: str) -> Update:
    """Unpark the rows ``:ids`` still parked behind a holder (no ``wake_at``): rows a claim
    found parked behind a row already published (:attr:`sqla_outbox.plan.ClaimPlan.unpark`),
    and on MySQL/MariaDB the second step of a sweep, which reads the free rows first (see
    ``stores.mysql``)."""
    t = outbox_table
    return update(t).where(ids_param(dialect), t.c.parked, t.c.wake_at.is_(None)).values(**_UNPARK)


def parked_window() -> Select[Any]:
    """The parked rows one sweep reads (see :func:`free_parked_stmt`): up to ``:limit`` of them
    in claim order after the sweep's cursor, the row ``(:after_staged_at, :after_id)``, read
    from ``ix_outbox_parked_group``, rows parked until due included.

    Bounded, because rows parked until they are due share the index. The relay moves the cursor
    on by each sweep's window and starts again from the first parked row once a window comes
    back short (:class:`~sqla_outbox.sweeping.ParkedCursor`), so every parked row is read within
    ``parked / limit`` sweeps.
    """
    row = outbox_table.alias("parked_row")
    after_at = bindparam("after_staged_at", type_=outbox_table.c.staged_at.type)
    after_id = bindparam("after_id", type_=outbox_table.c.id.type)
    return (
        select(row.c.id, row.c.staged_at, row.c.parked_behind, row.c.wake_at)
        .where(
            row.c.parked,
            row.c.staged_at >= after_at,
            or_(row.c.staged_at > after_at, row.c.id > after_id),
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
    it) parked behind a holder that holds nothing back any more: what
    :func:`sweep_parked_stmt` unparks.

    The safety net under parking: a holder published by a statement that ran as the row was
    parked (and so did not see it parked) frees nothing by itself. A row is free when the row it
    names is published or gone, or when it names none (parked by an older release). A holder
    that is merely out of its backoff frees nothing yet: the rows behind it must still wait
    for it, and its mark frees them once it is published.
    """
    row = parked_window().subquery("parked_row") if window is None else window
    holder = outbox_table.alias("holder")
    free = or_(holder.c.id.is_(None), holder.c.published_at.is_not(None))
    return (
        select(row.c.id)
        .select_from(row.outerjoin(holder, holder.c.id == row.c.parked_behind))
        .where(row.c.wake_at.is_(None), free)
    )


def sweep_parked_stmt(dialect: str, window: Any = None) -> Update:
    """PostgreSQL and SQLite: unpark the rows :func:`free_parked_stmt` names, in one statement.

    On PostgreSQL only the rows no other statement has locked (``SKIP LOCKED``), still parked:
    a sweep is the safety net and never waits, so it cannot deadlock with a mark unparking the
    same rows in another order; a row it skips is unparked by that mark or the next sweep.

    MySQL and MariaDB read those ids first and unpark them by primary key
    (:func:`unpark_rows_stmt`): in the UPDATE, MySQL refuses a subquery on the table it changes
    (error 1093), and InnoDB reads a derived table there with shared locks, on which two relays'
    sweeps and marks deadlock.
    """
    t = outbox_table
    free = free_parked_stmt(dialect, window)
    if dialect != "postgresql":
        return update(t).where(t.c.id.in_(free)).values(**_UNPARK)
    row = t.alias("free_row")
    # The free ids as an array, computed once: as an IN (...) semi-join the planner may read
    # the whole window again for every parked row when the statistics predate the parking.
    free_ids = func.array(free.scalar_subquery())
    locked = (
        select(row.c.id)
        .where(row.c.id == any_(free_ids), row.c.parked, row.c.wake_at.is_(None))
        .with_for_update(of=row, skip_locked=True)
    )
    return update(t).where(t.c.id == any_(func.array(locked.scalar_subquery()))).values(**_UNPARK)


# --- rows parked until due (sqla_outbox.waiting) ----------------------------------------------


def _not_due_for_a_while(row: Any, dialect: str) -> list[ColumnElement[bool]]:
    """``row`` is in the claim's index, unclaimed, and comes due after ``:park_ahead`` from now
    (``:park_after`` but on PostgreSQL): what a sweep parks until then."""
    later = from_now(dialect, "park_ahead", "park_after")
    return [*in_claim_index(row, dialect), row.c.claimed_by.is_(None), due_at(row) > later]


def waiting_head_stmt(dialect: str) -> Select[Any]:
    """The ids of the rows among the first ``:head`` of the claim's index, read in claim order
    as a claim reads it, that are unclaimed and come due after ``:park_ahead`` from now
    (``:park_after`` but on PostgreSQL): the rows :func:`park_waiting_stmt` parks.

    The head is read first, with each row's due time, and only then filtered: the statement
    reads ``:head`` entries of the index at most, whatever the backlog and the history (joined
    to the rows not due first, PostgreSQL may read every unpublished row instead). A plain
    read: on MySQL and MariaDB the sweep runs it on its own and parks the ids it returns, as a
    derived table in the UPDATE would take shared locks on which the relays' marks then
    deadlock."""
    row = outbox_table.alias("head_row")
    head = (
        select(row.c.id, row.c.run_at, row.c.retry_at, row.c.claimed_by)
        .where(*in_claim_index(row, dialect))
        .order_by(row.c.staged_at, row.c.id)
    )
    for name in MYSQL_DIALECTS:
        head = head.with_hint(row, "USE INDEX (ix_outbox_claimable)", dialect_name=name)
    heads = head.limit(inline("head")).subquery("head")
    later = from_now(dialect, "park_ahead", "park_after")
    return select(heads.c.id).where(heads.c.claimed_by.is_(None), due_at(heads) > later)


def park_waiting_stmt(dialect: str) -> Update:
    """Park the rows :func:`waiting_head_stmt` names, each until it is due (``wake_at``).

    Out of ``ix_outbox_claimable``, they cost the claims nothing until :func:`wake_stmt` brings
    them back. Unclaimed rows only, and on PostgreSQL only those no other statement has locked
    (``SKIP LOCKED``), their conditions checked again on the row as locked: a sweep never
    touches a claim's rows, and two relays sweeping at once part the rows between them.

    On MySQL and MariaDB it parks the rows ``:ids`` (read by :func:`waiting_head_stmt` first)
    whose conditions still hold on the row as InnoDB reads it, current and locked.
    """
    t = outbox_table
    chosen: ColumnElement[bool]
    if dialect in MYSQL_DIALECTS:
        chosen = and_(ids_param(dialect), *_not_due_for_a_while(t, dialect))
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
    return update(t).where(chosen).values(parked=True, wake_at=due_at(t))


def wake_stmt(dialect: str) -> Update:
    """Unpark the rows parked until due (:func:`park_waiting_stmt`) that come due before
    ``:wake_ahead`` from now (``:wake_before`` but on PostgreSQL), whether or not their time
    has come, so each is back in the claim's index before it is due.

    Read through ``ix_outbox_waking`` alone. A woken row that something stuck holds back is
    parked behind it by the next claim that meets it, as any row. On PostgreSQL ``SKIP LOCKED``
    as :func:`park_waiting_stmt`.
    """
    t = outbox_table
    soon = from_now(dialect, "wake_ahead", "wake_before")

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
    each changed (``unparked``, ``woken``, ``parked``); then the end of the parked rows' window
    (:func:`window_end_stmt`), read once, as a CTE, by the unparking and by the end.

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


def idle_stmt(dialect: str) -> Select[Any, Any, Any, bool, dt.datetime]:
    """What an idle relay must come back for: ``next_run_at`` (the earliest still in the
    future), ``next_retry_at`` (the earliest backoff end of a row no claim holds: in the past
    when one is due now), ``oldest_claim`` (lapses ``claim_lease`` later), ``parked`` (whether
    any row is) and the database's ``now``.

    Only rows a claim may take can bring a relay back: a dead letter comes due only when an
    operator retries it, a parked row only when its holder's mark or a sweep unparks it. So the
    aggregates read ``ix_outbox_claimable`` and ``parked`` is the first entry of
    ``ix_outbox_parked_group``: an idle relay's plan costs the same with ten thousand dead
    letters or parked rows as with none.

    Aggregates over some of the rows are ``min(CASE WHEN ... THEN x END)`` rather than
    ``FILTER (WHERE ...)``, which MySQL and MariaDB lack. There ``now`` is cast to
    ``DATETIME(6)``: a parameter selected back comes back as text.
    """
    t = outbox_table
    at = now(dialect)
    # In the claim's order: PostgreSQL then reads the claim index even when its statistics
    # still count a backlog just drained as unpublished (autovacuum analyses later).
    rows = (
        select(t.c.run_at, t.c.retry_at, t.c.claimed_at)
        .where(*in_claim_index(t, dialect))
        .order_by(t.c.staged_at, t.c.id)
        .subquery("claimable")
    )
    shown = cast(at, UTCDateTime()) if dialect in MYSQL_DIALECTS else at
    return select(
        func.min(case((rows.c.run_at > at, rows.c.run_at))).label("next_run_at"),
        # Past ones too, of rows no claim holds: a backoff that ended after the relay's last
        # claim is work due now, not "nothing pending".
        func.min(case((rows.c.claimed_at.is_(None), rows.c.retry_at))).label("next_retry_at"),
        func.min(rows.c.claimed_at).label("oldest_claim"),  # min() skips NULLs: unclaimed rows
        some_parked().label("parked"),
        shown.label("now"),
    )
