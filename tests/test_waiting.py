"""Rows not due yet leave the claim's index until shortly before they are (sqla_outbox.waiting).

A sweep parks the rows at the head of the claim index that come due more than ``PARK_AHEAD``
from now (scheduled later, or waiting out a long retry backoff), with ``wake_at`` saying when,
and wakes them ``WAKE_AHEAD`` before. These tests check what is parked and what is not, that
parking changes no promise (a scheduled row holds nothing back, a failed one holds its
transaction and key), that only the sweep wakes such a row, and that a sweep never touches a
claim's rows. Two relays sweeping and claiming at once, on every store, are in
``tests/stores/test_conformance.py``; a relay killed mid-batch with rows parked until due, in
``tests/test_relay_sigkill.py``.

Time passing is simulated by moving ``run_at``, ``retry_at`` and ``wake_at`` into the past
(:func:`arrive`), as :func:`support.expire_backoffs` does for backoffs.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from support import WAIT, MakeRelay, ManualClock, pg_rows_read

import sqla_outbox as outbox
from sqla_outbox import analyzing, queries, waiting
from sqla_outbox.message import OutboxMessage
from sqla_outbox.stores import psycopg_sql
from sqla_outbox.sweeping import ParkedCursor, SweepClock, Swept

Row = outbox.OutboxRow
DAY = dt.timedelta(days=1)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def enqueue_each(
    engine: Engine, specs: Iterable[tuple[str, str | None, dt.timedelta | None]], per: int = 1
) -> list[OutboxMessage]:
    """Commit one message per ``(job, ordering_key, run_in)``, ``per`` to a transaction;
    ``run_in`` None: due now."""
    specs = list(specs)
    messages: list[OutboxMessage] = []
    for start in range(0, len(specs), per):
        with Session(engine) as session, session.begin():
            for job, key, run_in in specs[start : start + per]:
                run_at = None if run_in is None else now() + run_in
                messages.append(
                    outbox.enqueue(session, job, {"job": job}, ordering_key=key, run_at=run_at)
                )
    return messages


def state(engine: Engine) -> dict[str, Any]:
    """Every row by job, as it is now."""
    with Session(engine) as session:
        return {row.job: row for row in session.scalars(select(Row))}


def arrive(engine: Engine, ids: Iterable[uuid.UUID]) -> None:
    """Time passes for rows ``ids``: due now (``run_at``, any backoff), and a ``wake_at`` of
    theirs past, so the next sweep wakes them (it is a sweep's to do)."""
    past = now() - dt.timedelta(seconds=1)
    with engine.begin() as conn:
        chosen = Row.id.in_(list(ids))
        conn.execute(update(Row).where(chosen).values(run_at=past))
        conn.execute(update(Row).where(chosen, Row.retry_at.is_not(None)).values(retry_at=past))
        conn.execute(update(Row).where(chosen, Row.wake_at.is_not(None)).values(wake_at=past))


def fail_row(engine: Engine, message: OutboxMessage, backoff: dt.timedelta) -> None:
    """Charge ``message`` a failed publish with ``backoff`` to wait, as the relay does."""
    with engine.begin() as conn:
        conn.execute(
            update(Row)
            .where(Row.id == message.id)
            .values(attempts=1, last_error="refused", retry_at=now() + backoff)
        )


class Published:
    """A publisher recording ids in order, from any number of relays."""

    def __init__(self) -> None:
        self.ids: list[uuid.UUID] = []
        self.lock = threading.Lock()

    def __call__(self, message: OutboxMessage) -> None:
        with self.lock:
            self.ids.append(message.id)


def test_a_sweep_parks_rows_due_much_later_and_wakes_them_before_they_are_due(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """Scheduled a day ahead: parked until then (``wake_at`` its ``run_at``), out of every
    claim. Due in less than PARK_AHEAD, or due now: left in the claim's index. Within
    WAKE_AHEAD of its time: woken, and still not claimed before it is due."""
    later, soon, _due = enqueue_each(
        engine, [("later", None, DAY), ("soon", None, waiting.PARK_AHEAD / 2), ("due", None, None)]
    )
    relay = make_relay(engine, Published(), batch_size=10)

    assert relay._statements.sweep() == Swept(unparked=0, woken=0, parked=1)
    rows = state(engine)
    assert rows["later"].parked and rows["later"].wake_at == rows["later"].run_at
    assert not rows["soon"].parked and rows["soon"].wake_at is None
    assert not rows["due"].parked
    assert relay._statements.sweep() == Swept(0, 0, 0)  # nothing new: nothing changes

    soon_enough = now() + waiting.WAKE_AHEAD / 2  # the day has nearly passed
    with engine.begin() as conn:
        conn.execute(
            update(Row).where(Row.id == later.id).values(run_at=soon_enough, wake_at=soon_enough)
        )
    assert relay._statements.sweep() == Swept(unparked=0, woken=1, parked=0)
    rows = state(engine)
    assert not rows["later"].parked and rows["later"].wake_at is None
    assert relay.drain().published == 1  # "due"; "later" and "soon" are not due yet
    arrive(engine, [later.id, soon.id])
    assert relay.drain().published == 2
    assert relay.pending() == 0


def test_a_failed_row_in_a_long_backoff_is_parked_and_still_holds_back_its_rows(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A row failed with an hour's backoff is parked until its backoff ends: it still holds
    back its transaction's later row and its key's later row, and ``status`` counts it as
    backing off, not as held back. When its time comes it is woken and published first."""
    first, second, keyed = enqueue_each(
        engine, [("first", "k", None), ("second", None, None), ("keyed", "k", None)], per=2
    )
    refused = {"first"}
    published: list[str] = []

    def publish(message: OutboxMessage) -> None:
        if message.job in refused:
            raise RuntimeError("refused")
        published.append(message.job)

    relay = make_relay(engine, publish, batch_size=10, retry_base=3600, retry_max=3600)
    relay.drain()  # fails "first"; its drain-ending sweep parks it until its backoff ends
    rows = state(engine)
    assert rows["first"].attempts == 1 and rows["first"].parked
    assert rows["first"].wake_at == rows["first"].retry_at
    relay.drain()
    assert published == []
    with engine.connect() as conn:
        counts = conn.execute(queries.status_stmt(engine.dialect.name), {"now": now()}).one()
    assert (counts.backing_off, counts.parked, counts.due) == (1, 2, 0)  # parked: held back

    refused.clear()
    arrive(engine, [first.id])
    relay.drain()
    assert published == ["first", "second", "keyed"]
    assert _published_ids(engine) == {first.id, second.id, keyed.id}


def _published_ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.scalars(select(Row.id).where(Row.published_at.is_not(None))))


def test_a_scheduled_row_holds_nothing_back_and_only_the_sweep_wakes_it(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A transaction and key with a row scheduled a day ahead between two due ones: parked,
    the scheduled row holds back neither its transaction's nor its key's later row, and the
    marks that publish them (which unpark what they held back) and the sweep for held-back rows
    leave it parked: only its ``wake_at`` brings it back."""
    first, scheduled, last = enqueue_each(
        engine, [("first", "k", None), ("scheduled", "k", DAY), ("last", "k", None)], per=3
    )
    published = Published()
    relay = make_relay(engine, published, batch_size=10)
    assert relay._statements.sweep().parked == 1
    assert relay.drain().published == 2
    assert published.ids == [first.id, last.id]
    assert relay._statements.sweep() == Swept(0, 0, 0)
    rows = state(engine)
    assert rows["scheduled"].parked and rows["scheduled"].wake_at is not None
    arrive(engine, [scheduled.id])
    relay.drain()
    assert published.ids == [first.id, last.id, scheduled.id]


def test_a_row_that_came_due_while_no_relay_ran_goes_out_when_a_relay_starts(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A row parked until due whose time came while no relay ran: the next relay to start
    publishes the due row, finds nothing more to claim, sweeps at once and publishes it. Its
    sweep clock never moves here, so a relay that waited an interval before its first sweep (as
    relays did) would never publish it."""
    later, due = enqueue_each(engine, [("later", None, DAY), ("due", None, None)])
    with engine.begin() as conn:  # parked until due, as the last relay's sweep left it
        conn.execute(
            update(Row).where(Row.id == later.id).values(parked=True, wake_at=later.run_at)
        )
    arrive(engine, [later.id])  # the day passed with no relay running
    published = Published()
    everything = threading.Event()

    def publish(message: OutboxMessage) -> None:
        published(message)
        if len(published.ids) == 2:
            everything.set()

    relay = make_relay(engine, publish, batch_size=10)
    relay._sweeps = SweepClock(ManualClock())  # stands still: no interval ever passes
    relay.start()
    try:
        assert everything.wait(WAIT), f"published only {published.ids} of {[due.id, later.id]}"
    finally:
        relay.stop()
    assert sorted(published.ids) == sorted([due.id, later.id])


def test_the_sweep_parks_only_the_head_of_the_claim_index(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A sweep looks at the first HEAD_ROWS rows of the claim's index: a row not due behind
    them is parked by a later sweep, once the rows ahead have gone."""
    enqueue_each(pg_engine, [("due", None, None)] * 3)
    enqueue_each(pg_engine, [("later", None, DAY)])
    relay = make_relay(pg_engine, Published(), batch_size=10)
    store = relay._statements
    store._sweep_params = lambda: {  # type: ignore[method-assign]
        **type(store)._sweep_params(store),
        "head": 3,
    }
    assert store.sweep().parked == 0
    relay.drain()  # publishes the three; its sweep now sees the scheduled row at the head
    assert state(pg_engine)["later"].parked


def test_a_sweep_reads_no_more_than_the_head_of_the_claim_index(pg_engine: Engine) -> None:
    """The rows to park are looked for among the first ``:head`` entries of the claim's index
    only, however many rows are due behind them: joined to the rows not due, the head let
    PostgreSQL read every unpublished row (a sequential scan, or a bitmap scan of the whole
    index), 11 ms every sweep behind 50,000 due rows. Every scan of the table here reads at
    most the head (EXPLAIN ANALYZE, rolled back)."""
    head = 100
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (id, job, queue, input, idempotency_key, run_at, staged_at) "
            "SELECT gen_random_uuid(), 'due', 'default', '{}', n::text, now(), "
            "now() - interval '1 hour' + n * interval '1 ms' FROM generate_series(1, 3000) AS n"
        )
        conn.exec_driver_sql("ANALYZE outbox")
    park = psycopg_sql.precompile(queries.park_waiting_stmt("postgresql"), pg_engine.dialect)
    params = park.params({"head": head, "park_ahead": waiting.PARK_AHEAD})
    with pg_engine.connect() as conn:
        (plan,) = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {park.text(params)}", params
        ).scalar_one()
        conn.rollback()

    assert pg_rows_read(plan["Plan"]) <= 2 * head, plan


@pytest.mark.parametrize("store", ["pg_engine", "sqlite_engine", "mariadb_engine"])
def test_the_sweep_for_held_rows_reads_a_moving_window_of_the_parked_rows(
    store: str, request: pytest.FixtureRequest
) -> None:
    """On PostgreSQL, SQLite and MariaDB, a sweep reads at most ``limit`` parked rows (rows parked
    until due included), after where the relay's previous sweep stopped, and starts again from
    the first parked row after a short window: a row parked behind a holder that is gone (set
    by hand here) is unparked by the sweep whose window reaches it, and again at the next
    cycle's first sweep when it is parked at the front."""
    engine: Engine = request.getfixturevalue(store)
    # After the engine, so that its relays are closed (their held connection given back) before
    # the engine is disposed of: fixtures are torn down in the reverse order of their setup.
    make_relay: MakeRelay = request.getfixturevalue("make_relay")
    scheduled = enqueue_each(engine, [(f"later{n}", None, DAY) for n in range(5)])
    (orphan,) = enqueue_each(engine, [("orphan", None, None)])
    sweeper = make_relay(engine, Published())._statements
    sweeper._sweep_params = lambda: {  # type: ignore[method-assign]
        **type(sweeper)._sweep_params(sweeper),
        "limit": 2,
    }
    assert sweeper.sweep().parked == 5  # parked until due; the window had none to read yet
    with engine.begin() as conn:
        conn.execute(update(Row).where(Row.id == orphan.id).values(parked=True))

    unparked = [sweeper.sweep().unparked for _ in range(4)]
    # The window: later0-1 (from the first parked row), later2-3, later4 + the orphan, then
    # nothing after it (short: back to the first parked row).
    assert unparked == [0, 0, 1, 0]
    assert not state(engine)["orphan"].parked

    with engine.begin() as conn:  # the front of the parked rows, now: the next cycle's first
        conn.execute(update(Row).where(Row.id == orphan.id).values(parked=True))
        conn.execute(
            update(Row)
            .where(Row.id == orphan.id)
            .values(staged_at=min(m.staged_at for m in scheduled) - dt.timedelta(seconds=1))
        )
    assert sweeper.sweep().unparked == 1
    assert all(state(engine)[f"later{n}"].parked for n in range(5))


def test_a_sweep_reads_a_window_of_the_parked_rows_not_all(pg_engine: Engine) -> None:
    """3,000 rows parked until due (scheduled a day ahead): the sweep for rows parked behind a
    holder reads ``limit`` of them (and a step back from each), not all. It read every parked
    row, rows parked until due included, on every sweep: 13 ms with 100,000 of them, every
    5 s, under the relay's pass lock (EXPLAIN ANALYZE, rolled back)."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (id, job, queue, input, idempotency_key, run_at, staged_at, "
            "parked, wake_at) SELECT gen_random_uuid(), 'later', 'default', '{}', n::text, "
            "now() + interval '1 day', now() - interval '1 hour' + n * interval '1 ms', true, "
            "now() + interval '1 day' FROM generate_series(1, 3000) AS n"
        )
        conn.exec_driver_sql("ANALYZE outbox")
    sweep = psycopg_sql.precompile(queries.sweep_parked_stmt("postgresql"), pg_engine.dialect)
    params = sweep.params({"limit": 100, **ParkedCursor().params()})
    with pg_engine.connect() as conn:
        (plan,) = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {sweep.text(params)}", params
        ).scalar_one()
        conn.rollback()

    assert 100 <= pg_rows_read(plan["Plan"]) <= 300, plan


def test_a_sweep_leaves_a_stalled_claimants_rows_alone(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A sweep parks only unclaimed rows: a stalled claimant's rows whose backoff would have
    them parked (moved by hand here, as no claim takes a row not due) stay claimed, and the
    claimant's fenced mark still lands; an unclaimed row in the same state is parked."""
    mine, other = enqueue_each(pg_engine, [("mine", None, None), ("other", None, None)])
    relay = make_relay(pg_engine, Published(), batch_size=1, relay_id="A")
    store = relay._statements
    claimed = store.claim("A:1", None)
    assert [m.id for m in claimed.messages] == [mine.id]
    fail_row(pg_engine, mine, DAY)  # its row now looks like a backoff's, yet it is claimed
    fail_row(pg_engine, other, DAY)
    sweeper = make_relay(pg_engine, Published(), relay_id="B")
    assert sweeper._statements.sweep().parked == 1
    rows = state(pg_engine)
    assert rows["mine"].claimed_by == "A:1" and not rows["mine"].parked
    assert rows["other"].parked


def test_a_sweep_that_parks_rows_in_thousands_analyses_the_table(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Until the statistics count the rows a sweep parked, PostgreSQL may read them through an
    index that still holds them on every claim (sqla_outbox.analyzing): a sweep that parks
    ANALYZE_ROWS rows runs ANALYZE on the table; the next one, with nothing moved, does not."""
    with pg_engine.begin() as conn:  # rows scheduled a day ahead, in one statement
        conn.exec_driver_sql(
            "INSERT INTO outbox (id, job, queue, input, idempotency_key, run_at, staged_at) "
            "SELECT gen_random_uuid(), 'later', 'default', '{}', n::text, "
            "now() + interval '1 day', now() FROM generate_series(1, %(rows)s) AS n",
            {"rows": analyzing.ANALYZE_ROWS},
        )
    relay = make_relay(pg_engine, Published())

    def analyses() -> int:
        with pg_engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT pg_stat_get_analyze_count('outbox'::regclass)"
            ).scalar_one()

    before = analyses()
    assert relay._statements.sweep().parked == analyzing.ANALYZE_ROWS
    assert analyses() == before + 1
    assert relay._statements.sweep() == Swept(0, 0, 0)
    assert analyses() == before + 1


def test_a_mark_learns_whether_rows_are_parked_from_an_index(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A mark unparks what its rows held back only while some row is parked behind another.
    With thousands parked (here by a sweep, until due, stored after the due rows) and the
    statistics saying so, an EXISTS over parked rows is planned as a sequential scan that reads
    every due row first. The mark reads the first entry of ix_outbox_parked_behind, which rows
    parked until due are not in."""
    with pg_engine.begin() as conn:
        for job, run_at, rows in (
            ("due", "now()", 2000),
            ("later", "now() + interval '1 day'", 3000),
        ):
            conn.exec_driver_sql(
                "INSERT INTO outbox (id, job, queue, input, idempotency_key, run_at, staged_at) "
                f"SELECT gen_random_uuid(), '{job}', 'default', '{{}}', '{job}' || n, {run_at}, "
                f"now() - interval '1 hour' + n * interval '1 ms' * (CASE WHEN '{job}' = 'due' "
                "THEN 2 ELSE 1 END) FROM generate_series(1, %(rows)s) AS n",
                {"rows": rows},
            )
    relay = make_relay(pg_engine, Published(), batch_size=100)
    store = relay._statements
    assert store.sweep().parked == 3000  # and analyses the table: 3,000 moved
    claimed = store.claim("probe:1", None)
    mark = queries.mark_published_stmt("postgresql").compile(dialect=pg_engine.dialect)
    ids = [message.id for message in claimed.messages]
    with pg_engine.connect() as conn:
        plan = (
            conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, COSTS OFF) {mark}",
                {**mark.params, "token": "probe:1", "ids": ids},
            )
            .scalars()
            .all()
        )
        conn.rollback()
    parked_probe = [line for line in plan if " on outbox some_parked" in line]
    assert parked_probe and "ix_outbox_parked_behind" in parked_probe[0], "\n".join(plan)
