"""What a relay writes after publishing: marks, charges, hand-backs, lease renewals.

Every statement here is **fenced** on the claim's token (``:token``): it touches only rows still
stamped with that token and unpublished, so a relay that stalled past its lease cannot change
rows another relay holds now. A count of rows touched below the number named means the claim
was lost; the store logs it and the other relay's work stands.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Interval,
    Select,
    Text,
    Update,
    bindparam,
    case,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.elements import BindParameter

from sqla_outbox.model import UTCDateTime
from sqla_outbox.queries.parking import unpark_marked
from sqla_outbox.queries.terms import (
    fenced,
    few,
    ids_param,
    now,
    outbox_table,
    unpublished,
)

__all__ = [
    "fail_stmt",
    "mark_ctes",
    "mark_published_stmt",
    "release_stmt",
    "renew_stmt",
    "settle_stmt",
    "unclaim_stmt",
]


def mark_ctes(dialect: str, token: str, ids: str) -> tuple[Any, Any]:
    """PostgreSQL: the mark of the rows ``:<ids>`` (fenced on ``:<token>``) and the unparking of
    the rows parked behind them, as two data-modifying CTEs returning ids."""
    t = outbox_table
    marked = (
        update(t)
        .where(fenced(token), ids_param(dialect, ids))
        .values(published_at=now(dialect))
        .returning(t.c.id)
        .cte("marked")
    )
    return marked, unpark_marked(marked)


def mark_published_stmt(dialect: str) -> Select[Any] | Update:
    """Mark the claim's rows ``:ids`` published (fenced on ``:token``).

    Publishing a row frees the rows parked behind it: on PostgreSQL the same statement unparks
    them and returns ``marked`` and ``unparked`` counts; elsewhere it is the plain UPDATE (its
    ``rowcount`` is the marked count) and the store runs
    :func:`~sqla_outbox.queries.parking.unpark_behind_stmt` after it, in the same transaction.
    """
    if dialect != "postgresql":
        return (
            update(outbox_table)
            .where(fenced(), ids_param(dialect))
            .values(published_at=now(dialect))
        )
    marked, unparked = mark_ctes(dialect, "token", "ids")
    return select(
        select(func.count()).select_from(marked).scalar_subquery().label("marked"),
        select(func.count()).select_from(unparked).scalar_subquery().label("unparked"),
    )


def release_stmt(dialect: str) -> Update:
    """Hand the claim's rows ``:ids`` back at once (fenced on ``:token``), charging nothing.

    Without it the rows a pass did not publish would wait out the whole lease: those after a
    failure in strict order, everything after a broker outage or a graceful stop. With ``:park``
    true and ``:behind`` a failed row's id, the rows are held back by that failure: parked
    behind it, so the next claims do not fill every batch with rows that must wait anyway.
    """
    return (
        update(outbox_table)
        .where(fenced(), ids_param(dialect))
        .values(
            claimed_by=null(),
            claimed_at=null(),
            parked=bindparam("park", type_=Boolean()),
            parked_behind=bindparam("behind", type_=outbox_table.c.id.type),
        )
    )


def unclaim_stmt() -> Update:
    """Hand back every row still claimed by ``:token``, when the claim's rows never reached the
    relay (their ``input`` could not be decoded, see ``stores.psycopg``), so a second claim can
    take them at once instead of after the lease. A rare path: nothing indexes ``claimed_by``,
    so it reads the unpublished rows."""
    return update(outbox_table).where(fenced()).values(claimed_by=null(), claimed_at=null())


def _retry_at(dialect: str) -> ColumnElement[dt.datetime]:
    if dialect == "postgresql":
        return func.now() + bindparam("delay", type_=Interval())
    return bindparam("retry_at", type_=UTCDateTime())


def fail_stmt(dialect: str) -> Update:
    """Charge a failed publish to row ``:failed_id`` and hand it back (fenced on ``:token``).

    ``attempts`` goes up by one and ``last_error`` is ``:error``. With ``:dead`` the row becomes
    a dead letter (``dead_at``: never claimed again, still holding back its transaction's and
    key's later rows, until an operator retries or discards it); otherwise it may be claimed
    again once its backoff ends: ``now() + :delay`` on PostgreSQL, ``:retry_at`` elsewhere.
    Run as an executemany, one parameter set per failed row.
    """
    t = outbox_table
    dead = bindparam("dead", type_=Boolean())
    return (
        update(t)
        .where(t.c.id == bindparam("failed_id", type_=t.c.id.type), fenced())
        .values(
            claimed_by=null(),
            claimed_at=null(),
            attempts=t.c.attempts + 1,
            last_error=bindparam("error", type_=Text()),
            retry_at=case((dead, null()), else_=_retry_at(dialect)),
            dead_at=case((dead, now(dialect)), else_=null()),
        )
    )


def settle_stmt() -> Select[Any]:
    """PostgreSQL: write back a whole pass in one autocommit statement, fenced on ``:token``.

    Marks ``:ids`` published (unparking what waited for them, as :func:`mark_published_stmt`)
    and hands back the rest of the claim, ``:handed_ids``, with one UPDATE: a row with an
    ``:errors`` entry is charged (with its ``:delays`` and ``:deads`` entries, as
    :func:`fail_stmt`), the others are released, parked behind their ``:behinds`` entry where
    ``:parks`` says so (held back by a failure, as :func:`release_stmt`). The unclaimed rows
    after a charged or parked row of its transaction are parked too, behind the same failure
    (:func:`_behind`). One round trip instead of a transaction of four statements for every
    pass with a failure. Returns the counts ``marked``, ``unparked``, ``charged``,
    ``released``, ``held_back``, ``parked_behind``.
    """
    t = outbox_table
    at = func.now()
    marked, unparked = mark_ctes("postgresql", "token", "ids")
    handed = (
        func.unnest(
            few("handed_ids"),
            few("errors", Text()),
            few("delays", Interval()),
            few("deads", Boolean()),
            few("parks", Boolean()),
            few("behinds"),
        )
        .table_valued("id", "error", "delay", "dead", "park", "behind")
        .render_derived(name="handed")
    )
    fence = bindparam("token", type_=t.c.claimed_by.type)
    behind = _behind(handed, fence)
    targets = union_all(
        select(*handed.c, fence.label("fence")),
        select(
            behind.c.id,
            null().label("error"),
            null().label("delay"),
            null().label("dead"),
            true().label("park"),
            behind.c.behind,
            null().label("fence"),
        ),
    ).subquery("target")
    charging = targets.c.error.is_not(None)
    written = (
        update(t)
        .where(
            t.c.id == targets.c.id,
            unpublished(),
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
                else_=at + targets.c.delay,
            ),
            dead_at=case((~charging, t.c.dead_at), (targets.c.dead, at), else_=null()),
            parked=targets.c.park,
            parked_behind=case((targets.c.park, targets.c.behind), else_=null()),
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

    return select(
        count(marked).label("marked"),
        count(unparked).label("unparked"),
        count(written, written.c.charged).label("charged"),
        count(written, ~written.c.charged, ~written.c.park).label("released"),
        count(written, written.c.park, ~written.c.behind).label("held_back"),
        count(written, written.c.behind).label("parked_behind"),
    )


def _behind(handed: Any, fence: BindParameter[Any]) -> Any:
    """The unclaimed rows after a charged or held-back row (of ``handed``) of its transaction,
    locked, with the failed row each waits for (``behind``): the write-back parks them. Only
    while that row is still in the claim (``fence``): a relay that lost its claim writes
    nothing, here as everywhere.

    They wait for the failure whichever claim meets them; parked now, the next claims pass them
    by instead of reading them only to park them. Rows locked by a claim at this instant are
    skipped, as are lapsed claims' rows: the claim that meets them parks them. A transaction's
    rows are as many as one commit staged; an ordering key's later rows are left to the
    claims, a key may have thousands.
    """
    t = outbox_table
    stuck, row = t.alias("stuck_row"), t.alias("later_row")
    # From the few handed rows, by primary key, then one index range per transaction: a
    # LATERAL subquery kept whole by OFFSET 0, so that no plan (a generic one made while the
    # table looked empty, say) can join every unpublished row to every other instead.
    later = (
        select(row.c.id)
        .where(
            row.c.staged_at == stuck.c.staged_at,
            row.c.id > stuck.c.id,
            unpublished(row),
            row.c.claimed_by.is_(None),
            row.c.dead_at.is_(None),
            ~row.c.parked,
        )
        .offset(literal_column("0"))
        .with_for_update(skip_locked=True)
        .lateral("later")
    )
    return (
        select(later.c.id, func.coalesce(handed.c.behind, handed.c.id).label("behind"))
        .select_from(handed)
        .join(stuck, stuck.c.id == handed.c.id)
        .join(later, true())
        .where(
            or_(handed.c.error.is_not(None), handed.c.park),
            stuck.c.claimed_by == fence,
            unpublished(stuck),
        )
        .cte("behind")
    )


def renew_stmt(dialect: str) -> Update:
    """Renew the lease of the claim's rows ``:ids`` (fenced on ``:token``): ``claimed_at = now``.

    ``rowcount`` below the number still held means the claim was lost: its lease lapsed and
    another relay took the rows, so this pass must publish nothing more of it.
    """
    return update(outbox_table).where(fenced(), ids_param(dialect)).values(claimed_at=now(dialect))
