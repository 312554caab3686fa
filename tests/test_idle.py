"""An idle relay costs almost nothing while LISTEN is up, and still comes back in time.

While its LISTEN connection is up every commit wakes the relay, so the idle loop only has to
come back for what no commit announces: a scheduled ``run_at`` or a retry backoff coming due, a
claim's lease lapsing, parked rows to sweep. These tests ask the loop how long it would wait
(``_idle_wait``) in each situation; none of them waits for it.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from support import MakeRelay, ManualClock, wait_until

import sqla_outbox as outbox
from sqla_outbox.relay import IDLE_MAX
from sqla_outbox.sweeping import SWEEP_INTERVAL, SweepClock


def _listening(make_relay: MakeRelay, engine: Engine, **options: object) -> outbox.Relay:
    """A relay whose LISTEN connection is up (a real one: its loop runs)."""
    relay = make_relay(engine, lambda message: None, **options)
    relay.start()
    listener = relay._listener
    assert listener is not None
    wait_until(listener.listening.is_set, "the relay to LISTEN")
    return relay


def _as_if_listening(make_relay: MakeRelay, engine: Engine, **options: object) -> outbox.Relay:
    """A relay that is not running but believes its LISTEN connection is up: the rows a test
    arranges then stay as arranged (a running loop would claim and publish them)."""
    relay = make_relay(engine, lambda message: None, **options)
    listener = relay._listener
    assert listener is not None
    listener.listening.set()
    return relay


def test_an_idle_relay_with_listen_up_waits_long(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """Nothing pending and LISTEN up: the loop waits IDLE_MAX (or half its liveness bound),
    not poll_interval: one claim every 20-30 s instead of five a second."""
    relay = _listening(make_relay, pg_engine)
    expected = min(IDLE_MAX, relay.liveness_bound / 2)
    assert relay._idle_wait() == expected
    assert expected >= 20 * relay.poll_interval


def test_the_wait_ends_when_a_scheduled_row_comes_due(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A row scheduled 5 s ahead (no commit will announce it coming due): the idle loop comes
    back in 5 s at most."""
    relay = _as_if_listening(make_relay, pg_engine)
    with Session(pg_engine) as session:
        outbox.enqueue(session, "later", run_at=dt.timedelta(seconds=5))
        session.commit()
    assert 3.0 < relay._idle_wait() <= 5.0


def test_the_wait_ends_when_a_backoff_or_a_lease_ends(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A row backing off for 8 s, and another claimed by a relay that stopped 2 s before its
    6 s lease ends: the idle loop comes back for the earlier, the lease, at most 4 s away."""
    relay = _as_if_listening(make_relay, pg_engine, claim_lease=6)
    with Session(pg_engine) as session:
        backing_off = outbox.enqueue(session, "backing-off")
        claimed = outbox.enqueue(session, "claimed")
        session.commit()
    now = dt.datetime.now(dt.timezone.utc)
    with pg_engine.begin() as conn:
        row = outbox.OutboxRow
        conn.execute(
            update(row)
            .where(row.id == backing_off.id)
            .values(attempts=1, retry_at=now + dt.timedelta(seconds=8))
        )
        conn.execute(
            update(row)
            .where(row.id == claimed.id)
            .values(claimed_by="gone:0", claimed_at=now - dt.timedelta(seconds=2))
        )
    assert 2.0 < relay._idle_wait() <= 4.0


def test_parked_rows_bring_the_sweep_back(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """Parked rows are swept every SWEEP_INTERVAL even while LISTEN is up."""
    relay = _as_if_listening(make_relay, pg_engine)
    with Session(pg_engine) as session:
        head = outbox.enqueue(session, "head", ordering_key="k")
        outbox.enqueue(session, "behind", ordering_key="k")
        session.commit()
    with pg_engine.begin() as conn:
        row = outbox.OutboxRow
        conn.execute(
            update(row)
            .where(row.id == head.id)
            .values(attempts=1, dead_at=dt.datetime.now(dt.timezone.utc))
        )
        conn.execute(
            update(row).where(row.id != head.id).values(parked=True, parked_behind=head.id)
        )
    relay._sweep()  # nothing to unpark: the head is dead; resets the sweep clock
    assert relay._idle_wait() == SWEEP_INTERVAL


def test_a_row_due_much_later_brings_a_sweep_that_parks_it(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """The only pending row is scheduled a day ahead: the idle loop does not sleep until it is
    due (or IDLE_MAX) with the row in every claim's way; it sweeps once its sweep is due, which
    parks the row until shortly before its time (sqla_outbox.waiting), and then waits as it does
    while rows are parked."""
    clock = ManualClock()
    relay = _as_if_listening(make_relay, pg_engine)
    relay._sweeps = SweepClock(clock)
    relay._sweep()  # the sweep a relay makes when it first finds nothing, before the commit
    with Session(pg_engine) as session:
        outbox.enqueue(session, "tomorrow", run_at=dt.timedelta(days=1))
        session.commit()
    assert relay._idle_wait() == SWEEP_INTERVAL  # its next sweep is not due yet: it comes back
    with Session(pg_engine) as session:
        assert not session.scalars(select(outbox.OutboxRow.parked)).one()
    clock.now += SWEEP_INTERVAL
    assert relay._idle_wait() == SWEEP_INTERVAL  # swept: parked until due
    with Session(pg_engine) as session:
        assert session.scalars(select(outbox.OutboxRow.parked)).one()


def test_polling_relays_wait_poll_interval(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """Without LISTEN (poll_only, PgBouncer) the idle loop polls every poll_interval."""
    relay = make_relay(pg_engine, lambda message: None, poll_only=True, poll_interval=0.3)
    relay._sweep()
    assert relay._idle_wait() == 0.3


def test_a_backoff_that_ended_before_the_plan_means_claim_now(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A failed row whose backoff ended after the relay's last claim but before its idle plan
    is due now: the loop claims again after ``poll_interval``, rather than sleeping until a
    notification or IDLE_MAX while the row waits (as it did when the plan counted only
    backoffs still in the future)."""
    relay = _as_if_listening(make_relay, pg_engine)
    with Session(pg_engine) as session:
        failed = outbox.enqueue(session, "failed-once")
        session.commit()
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(milliseconds=5)
    with pg_engine.begin() as conn:
        row = outbox.OutboxRow
        conn.execute(update(row).where(row.id == failed.id).values(attempts=1, retry_at=past))
    assert relay._idle_wait() == relay.poll_interval


def test_a_backoff_ending_sooner_than_a_poll_is_waited_for_exactly(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A failed row whose backoff ends well before ``poll_interval`` (3 s against 10 s here): the
    loop comes back when the backoff ends, not a poll later (it used to wait ``poll_interval``,
    so a short backoff cost a whole poll while LISTEN was up). The second of margin is for a
    slow machine between the UPDATE and the plan (a 50 ms backoff once ended in between)."""
    relay = _as_if_listening(make_relay, pg_engine, poll_interval=10.0)
    with Session(pg_engine) as session:
        failed = outbox.enqueue(session, "failed-once")
        session.commit()
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)
    with pg_engine.begin() as conn:
        row = outbox.OutboxRow
        conn.execute(update(row).where(row.id == failed.id).values(attempts=1, retry_at=soon))
    assert 2.0 < relay._idle_wait() <= 3.0


def test_the_idle_plan_holds_the_pass_lock(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """The idle plan runs on the connection a relay keeps between passes, so it holds the pass
    lock as a pass does: a ``tick()`` from another thread while the loop plans its wait must not
    share that connection mid-statement (on psycopg a pass switches its cursor type for its
    statement, and a plan sent meanwhile failed with "raw queries require a sequence of
    parameters")."""
    relay = _as_if_listening(make_relay, pg_engine)
    plan = relay._statements.idle_plan
    held_during_plan: list[bool] = []

    def observed_plan() -> tuple[float | None, bool]:
        held_during_plan.append(relay._pass_lock.locked())
        return plan()

    relay._statements.idle_plan = observed_plan  # type: ignore[method-assign]
    relay._idle_wait()
    assert held_during_plan == [True]
