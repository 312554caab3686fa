"""The claim's statements: read a window of candidates with their links, read the holders,
stamp and park by id; and PostgreSQL's one-statement claim for an uncrowded outbox.

What a claim may take is decided in Python by :func:`sqla_outbox.plan.plan` (the rule and its
argument are written there, once). The statements here only read what the plan needs and write
what it decided:

1. :func:`window_stmt` locks a window of candidates in claim order (``FOR UPDATE SKIP LOCKED``;
   SQLite holds its database-wide write lock instead) and reads, for each, the head and its
   successor of its transaction and of its key: four index probes (``ix_outbox_unpublished``,
   ``ix_outbox_key``), from which :func:`sqla_outbox.plan.predecessors` finds what each
   candidate waits for.
2. :func:`holders_stmt` reads the predecessors that are not candidates, by primary key.
3. :func:`stamp_stmt` stamps the rows taken with the claim's token, :func:`park_rows_stmt` parks
   the rows that wait for a stuck row, naming it. Both by primary key, on rows the claim's
   transaction has locked since step 1: no fence is needed.

:func:`fast_claim_stmt` is the whole claim as one autocommit statement, for PostgreSQL while
nothing holds its candidates back: it takes up to ``:limit`` candidates when each group's
candidates are its first holding rows (the plan would take them all), and otherwise takes
nothing and answers ``crowded``; the relay then makes the claim above.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Select,
    Update,
    and_,
    any_,
    bindparam,
    case,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.sql.elements import BindParameter

from sqla_outbox.coltypes import MYSQL_DIALECTS
from sqla_outbox.model import UTCDateTime
from sqla_outbox.queries.terms import (
    JSONB_MESSAGE_COLUMNS,
    MESSAGE_COLUMNS,
    charged,
    claimable,
    holding,
    ids_param,
    in_claim_index,
    inline,
    now,
    outbox_table,
    position,
    stuck,
    stuck_for_a_while,
)
from sqla_outbox.queries.write_back import mark_ctes

__all__ = [
    "fast_claim_stmt",
    "holders_stmt",
    "links_stmt",
    "park_rows_stmt",
    "stamp_stmt",
    "window_stmt",
]


def _done() -> BindParameter[Any]:
    """``:done``: the token of a claim whose rows count as published (the claim whose mark
    this statement carries, or one being published as this one is taken); the new claim's own
    token when there is none, which no row carries yet."""
    return bindparam("done", type_=outbox_table.c.claimed_by.type)


def _after(table: Any, *, opaque: bool = False) -> Any:
    """``table``'s rows after ``(:after_staged_at, :after_id)`` in claim order: the condition
    spelled out, each term an index bound (a row comparison is one only on PostgreSQL).

    ``opaque``: each parameter read through a subquery, whose value the planner does not look
    at. PostgreSQL then estimates the same rows for every value, and keeps the prepared
    statement's generic plan: a custom plan for the bound of a claim from the front would look
    cheaper than the generic one, and be planned afresh on every pass.
    """
    after_at: Any = bindparam("after_staged_at", type_=UTCDateTime())
    after_id: Any = bindparam("after_id", type_=outbox_table.c.id.type)
    if opaque:
        after_at, after_id = (select(value).scalar_subquery() for value in (after_at, after_id))
    return and_(
        table.c.staged_at >= after_at,
        or_(table.c.staged_at > after_at, table.c.id > after_id),
    )


def _message_columns(dialect: str) -> tuple[Any, ...]:
    """A claimed row's columns: the message (``input`` as ``jsonb`` on PostgreSQL, decoded by
    the driver; as text elsewhere), then ``attempts``."""
    columns = JSONB_MESSAGE_COLUMNS if dialect == "postgresql" else MESSAGE_COLUMNS
    return (*columns, outbox_table.c.attempts)


def first_holding(row: Any, column: str, dialect: str, *, after: bool, upto: Any = None) -> Any:
    """The id of the first holding row of ``row``'s transaction (``column`` is ``staged_at``) or
    ordering key (``ordering_key``; NULL for a row without one), rows of the ``:done`` claim
    aside: its head, or with ``after`` its successor, the first one after ``row``; with
    ``upto`` (a position) only one at or before it.

    One probe of ``ix_outbox_unpublished`` or ``ix_outbox_key``, read forward from the group's
    start: on MySQL and MariaDB, whose probe of a correlated group reads the whole group from
    the end it starts at, forward is the end where a claim's candidates are (a probe back from a
    candidate would read every later row of a hot key, hundreds per candidate).
    """
    t = outbox_table.alias(f"{column}_{'next' if after else 'head'}")
    same = [t.c[column] == row.c[column]]
    if after and column == "staged_at":
        # The transaction is one ``staged_at``, so both terms are index bounds: the probe
        # starts at the row after ``row`` and reads no earlier row of the transaction, however
        # large it is.
        same.append(t.c.id > row.c.id)
    elif after:
        # Spelled out rather than as a row comparison: MySQL and MariaDB seek an index on the
        # first term and filter the second. What is filtered is the rest of ``row``'s
        # transaction on the key, a few rows.
        same += [
            t.c.staged_at >= row.c.staged_at,
            or_(t.c.staged_at > row.c.staged_at, t.c.id > row.c.id),
        ]
    if upto is not None:
        same.append(position(t) <= upto)
    index = "ix_outbox_unpublished" if column == "staged_at" else "ix_outbox_key"
    probe = (
        select(t.c.id)
        .where(*same, *holding(t, dialect, _done()))
        .order_by(t.c.staged_at, t.c.id)
        .limit(literal_column("1"))
    )
    for name in MYSQL_DIALECTS:
        probe = probe.with_hint(t, f"USE INDEX ({index})", dialect_name=name)
    return probe.scalar_subquery()


LINKS = ("transaction_head", "key_head", "transaction_successor", "key_successor")
"""The columns of a candidate's links (:class:`sqla_outbox.plan.Links`), in order."""


def _links(dialect: str) -> tuple[Any, ...]:
    t = outbox_table
    return (
        first_holding(t, "staged_at", dialect, after=False).label(LINKS[0]),
        first_holding(t, "ordering_key", dialect, after=False).label(LINKS[1]),
        first_holding(t, "staged_at", dialect, after=True).label(LINKS[2]),
        first_holding(t, "ordering_key", dialect, after=True).label(LINKS[3]),
    )


def _candidates_read(dialect: str, order: str, size: str, *columns: Any) -> Select[Any]:
    """``columns`` of up to ``:<size>`` claimable rows in claim order, ``FOR UPDATE SKIP
    LOCKED``, the ``:done`` claim's rows aside (one statement must not update a row twice).

    With ``order="strict"`` the first failed, holding row (whichever relay is retrying it) also
    bounds them: nothing after it is a candidate before it is published.
    """
    t = outbox_table
    conditions = [*claimable(t, dialect), t.c.claimed_by.is_distinct_from(_done())]
    if order == "strict":
        failing = t.alias("failing")
        first_failing = (
            select(failing.c.staged_at, failing.c.id)
            .where(*holding(failing, dialect, _done()), charged(failing))
            .order_by(failing.c.staged_at, failing.c.id)
            .limit(literal_column("1"))
        )
        conditions.append(
            or_(~exists(first_failing), position(t) <= first_failing.scalar_subquery())
        )
    read = (
        select(*columns)
        .where(*conditions)
        .order_by(t.c.staged_at, t.c.id)
        .limit(inline(size))
        .with_for_update(skip_locked=True)
    )
    # MySQL has no partial indexes; led by the claimable columns, the claim index serves the
    # range in claim order where another index might look cheaper on a young table.
    for name in MYSQL_DIALECTS:
        read = read.with_hint(t, "USE INDEX (ix_outbox_claimable)", dialect_name=name)
    return read


@cache  # built once per process: a construct is immutable
def window_stmt(dialect: str, order: str = "key") -> Select[Any]:
    """Lock and read up to ``:window`` candidates after ``(:after_staged_at, :after_id)`` in
    claim order: each row's message and ``attempts``, then its :data:`LINKS` (the heads and
    successors of its transaction and key, :func:`first_holding`).

    On MySQL and MariaDB without the links, which :func:`links_stmt` reads next, without locks:
    there a locking read locks the rows its subqueries read too (and with ``SKIP LOCKED`` would
    skip a row another claim has locked for an instant).

    Parameters: ``window`` (written into the SQL), ``after_staged_at``, ``after_id``, ``done``;
    ``lease`` on PostgreSQL, ``now`` and ``cutoff`` elsewhere.
    """
    columns = _message_columns(dialect)
    if dialect not in MYSQL_DIALECTS:
        columns = (*columns, *_links(dialect))
    return _candidates_read(dialect, order, "window", *columns).where(_after(outbox_table))


def links_stmt(dialect: str) -> Select[Any]:
    """MySQL/MariaDB: the :data:`LINKS` of the rows ``:ids`` (after their ``id``), read
    without locks once :func:`window_stmt` locked them: every row as last committed, locked or
    not."""
    t = outbox_table
    return select(t.c.id, *_links(dialect)).where(ids_param(dialect))


def holders_stmt(dialect: str) -> Select[Any]:
    """The predecessors ``:ids`` that are not candidates, as the plan needs them: ``id``,
    ``published``, ``stuck`` (a dead letter, or in a retry backoff that ends later than
    ``:stuck_ahead``: :func:`~sqla_outbox.queries.terms.stuck_for_a_while`), ``parked``,
    ``parked_behind``, ``stale`` (parked behind a row that is published or gone, or naming
    none) and ``behind_stuck`` (parked behind a stuck row): see
    :class:`sqla_outbox.plan.Holder`. By primary key; no lock."""
    t = outbox_table
    behind = outbox_table.alias("behind")
    stale = and_(
        t.c.parked,
        t.c.wake_at.is_(None),
        or_(behind.c.id.is_(None), behind.c.published_at.is_not(None)),
    )
    behind_stuck = and_(behind.c.published_at.is_(None), stuck_for_a_while(behind, dialect))
    return (
        select(
            t.c.id,
            t.c.published_at.is_not(None).label("published"),
            stuck_for_a_while(t, dialect).label("stuck"),
            t.c.parked,
            t.c.parked_behind,
            stale.label("stale"),
            behind_stuck.label("behind_stuck"),
        )
        .select_from(t.outerjoin(behind, behind.c.id == t.c.parked_behind))
        .where(ids_param(dialect))
    )


def stamp_stmt(dialect: str) -> Update:
    """Stamp the rows ``:ids`` with the claim's ``:token`` and the time: taken.

    No fence: the claim's own transaction holds their locks since :func:`window_stmt` read them.
    """
    return (
        update(outbox_table)
        .where(ids_param(dialect))
        .values(claimed_by=bindparam("token"), claimed_at=now(dialect))
    )


def park_rows_stmt(dialect: str) -> Update:
    """Park the rows ``:ids``, locked by the claim's transaction, behind the row ``:behind``
    they wait for."""
    return (
        update(outbox_table)
        .where(ids_param(dialect))
        .values(parked=True, parked_behind=bindparam("behind", type_=outbox_table.c.id.type))
    )


# --- PostgreSQL's one-statement claim ---------------------------------------------------------


def _last(candidates: Any) -> Any:
    """The position of the last of ``candidates``."""
    return (
        select(candidates.c.staged_at, candidates.c.id)
        .order_by(candidates.c.staged_at.desc(), candidates.c.id.desc())
        .limit(literal_column("1"))
        .scalar_subquery()
    )


def _nothing_ahead(candidates: Any) -> Any:
    """Whether the due rows of the claim index from the claim's bound to the last candidate,
    backoffs aside, are exactly the candidates: nothing there is in flight. One range scan,
    stopped a row past them."""
    ahead_row = outbox_table.alias("ahead")
    ahead = (
        select(literal_column("1"))
        .where(
            *holding(ahead_row, "postgresql", _done()),
            *in_claim_index(ahead_row, "postgresql")[1:],
            or_(ahead_row.c.retry_at.is_(None), ahead_row.c.retry_at <= now("postgresql")),
            _after(ahead_row, opaque=True),
            position(ahead_row) <= _last(candidates),
        )
        .order_by(ahead_row.c.staged_at, ahead_row.c.id)
        .limit(inline("limit") + literal_column("1"))
        .subquery("ahead")
    )
    return (
        select(func.count()).select_from(ahead).scalar_subquery()
        == select(func.count()).select_from(candidates).scalar_subquery()
    )


def _gate(candidates: Any) -> Any:
    """Whether anything holds a candidate back (a one-row CTE, column ``crowded``): some
    group's candidates are not its first holding rows, that is, a group's head is not a
    candidate, or a candidate's successor in its group is not one while it comes before the
    last candidate.

    Two ways to tell, the first only where it suffices:

    * While nothing is in flight from the claim's bound to the last candidate
      (:func:`_nothing_ahead`; the bound is a transaction's start or end, so every row of a
      candidate's transaction before it is in that range) and no stuck or parked row of a
      candidate's transaction lies before a later candidate of it (one probe per transaction,
      into the small ``ix_outbox_failing`` and ``ix_outbox_parked_group``), only a key can be
      held: two probes per keyed candidate. A relay alone on a backlog thus never probes its
      unkeyed rows one by one.
    * Otherwise every candidate's heads and successors (:func:`first_holding`).

    ``CASE`` evaluates the second only when the first does not hold.
    """
    t = outbox_table
    last = _last(candidates)
    nothing_ahead = _nothing_ahead(candidates)

    transactions = select(candidates.c.staged_at).distinct().subquery("candidate_transactions")
    later = candidates.alias("later_candidate")

    def stuck_in_transaction(kind: str, condition: Any) -> Any:
        row = t.alias(f"{kind}_in_transaction")
        return (
            select(literal_column("1"))
            .where(
                row.c.staged_at == transactions.c.staged_at,
                condition(row),
                *holding(row, "postgresql", _done()),
                exists(
                    select(literal_column("1")).where(
                        later.c.staged_at == row.c.staged_at, later.c.id > row.c.id
                    )
                ),
            )
            .limit(literal_column("1"))
            .scalar_subquery()
        )

    charged_stuck = stuck_in_transaction(
        "charged", lambda row: and_(charged(row), stuck(row, "postgresql"))
    )
    parked = stuck_in_transaction("parked", lambda row: row.c.parked)
    transactions_clear = ~exists(
        select(literal_column("1"))
        .select_from(transactions)
        .where(or_(charged_stuck.is_not(None), parked.is_not(None)))
    )

    def held(*columns: str) -> Any:
        row = candidates.alias(f"probed_{len(columns)}")
        window = select(candidates.c.id)
        missing = []
        for column in columns:
            head = first_holding(row, column, "postgresql", after=False)
            successor = first_holding(row, column, "postgresql", after=True, upto=last)
            missing.append(or_(head.not_in(window), successor.not_in(window)))
        if columns == ("ordering_key",):
            # A candidate without a key has no key to be held by: no probe.
            missing = [and_(row.c.ordering_key.is_not(None), *missing)]
        return exists(select(literal_column("1")).select_from(row).where(or_(*missing)))

    crowded = case(
        (and_(nothing_ahead, transactions_clear), held("ordering_key")),
        else_=held("staged_at", "ordering_key"),
    )
    return select(crowded.label("crowded")).cte("gate")


@cache  # as window_stmt
def fast_claim_stmt(order: str = "key", *, mark: bool = False) -> Select[Any]:
    """PostgreSQL: lease up to ``:limit`` candidates in one autocommit statement, all of them
    or none (see the module docs).

    Its columns are ``crowded`` (true: it took nothing, something holds a candidate back),
    ``skip_to`` (when crowded while a row before the last candidate is in flight, the first
    candidate's ``staged_at``: its transaction is likely the one another relay is publishing),
    then the claimed rows' message and ``attempts``, in claim order; always at least one row
    (with nothing claimed, one with those NULL).

    ``mark=True``: the statement also marks the previous claim's rows published
    (``:previous_ids``, fenced on ``:done``, its token) and unparks what waited for them; its
    leading columns are then ``marked`` and ``unparked``. All parts of one statement see one
    snapshot, in which the previous claim's rows are still unpublished: every part counts the
    ``:done`` claim's rows as published. A relay working through a backlog thus claims and
    marks in one round trip.

    Candidates come after ``(:after_staged_at, :after_id)``, a transaction's start or end:
    a relay whose outbox's front is held (another relay publishing a large transaction, rows
    waiting for a failed row's retry) claims past it in one statement. The rule needs nothing of
    the bound: each candidate's heads are probed wherever they are, and one before the bound is
    no candidate, so the claim is crowded. How far a relay goes past the front, and for how
    long, is :class:`~sqla_outbox.stores.postgresql.PostgresStore`'s choice.

    Parameters: ``limit`` (written into the SQL), ``token``, ``done``, ``lease``,
    ``after_staged_at``, ``after_id``; with ``mark``, ``previous_ids``.
    """
    t = outbox_table
    candidates = (
        _candidates_read("postgresql", order, "limit", t.c.id, t.c.staged_at, t.c.ordering_key)
        .where(_after(t, opaque=True))
        .cte("candidates")
    )
    gate = _gate(candidates)
    crowded = select(gate.c.crowded).scalar_subquery()
    taken = select(candidates.c.id).where(~crowded).scalar_subquery()
    claimed = (
        update(t)
        .where(t.c.id == any_(func.array(taken)))
        .values(claimed_by=bindparam("token"), claimed_at=now("postgresql"))
        .returning(*_message_columns("postgresql"))
        .cte("claimed")
    )
    counts: list[Any] = []
    if mark:
        marked, unparked = mark_ctes("postgresql", "done", "previous_ids")
        counts = [
            select(func.count()).select_from(marked).scalar_subquery().label("marked"),
            select(func.count()).select_from(unparked).scalar_subquery().label("unparked"),
        ]
    first = select(func.min(candidates.c.staged_at)).scalar_subquery()
    # Read only when crowded: CASE evaluates a branch only when it is taken.
    skip_to = case((crowded, case((~_nothing_ahead(candidates), first))))
    header = select(*counts, crowded.label("crowded"), skip_to.label("skip_to")).subquery("header")
    return (
        select(*header.c, *claimed.c)
        .select_from(header.outerjoin(claimed, true()))
        .order_by(claimed.c.staged_at, claimed.c.id)
    )
