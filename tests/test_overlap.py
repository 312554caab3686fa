"""Claiming ahead (``Relay(overlap=True)``): the next claim travels while a pass publishes.

On PostgreSQL through real connections. What must hold is what holds without it: every message
once, each transaction and ordering key in order, nothing after a failed message in strict
order, and a failed, stopped or broken-down pass hands the claim taken ahead back uncharged.
The two-relay, stalled-claimant and SIGKILL cases run in ``test_failure_isolation.py`` with
``overlap`` on and off.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session
from support import MakeRelay
from test_failure_isolation import Broker, expire_backoffs, rows, stage_each

import sqla_outbox as outbox
from sqla_outbox.message import OutboxMessage

Row = outbox.OutboxRow


class AheadClaims:
    """Counts the claim statements sent from the relay's claim-ahead worker thread."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        self._engine = engine
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "candidates AS" in statement and "-ahead" in threading.current_thread().name:
            self.count += 1

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


def test_claiming_ahead_keeps_every_transaction_and_key_in_order(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Transactions of 4 and two interleaved keys, batches of 3 (so claims split transactions):
    each message once, in claim order (a claim taken ahead continues where the pass in flight
    ends, the rest of a transaction it split included), and the claims after the first were
    taken ahead."""
    specs = [(f"m{n}", "ab"[n % 2] if n % 3 else None) for n in range(48)]
    staged = stage_each(pg_engine, specs, per_transaction=4)
    ahead = AheadClaims(pg_engine)
    broker = Broker()
    make_relay(pg_engine, broker, batch_size=3, overlap=True).drain()
    ahead.close()
    assert broker.published == [job for job, _ in specs]
    position = {job: index for index, job in enumerate(broker.published)}
    for group in range(0, 48, 4):
        jobs = [staged[n].job for n in range(group, group + 4)]
        assert [position[j] for j in jobs] == sorted(position[j] for j in jobs)
    for key in "ab":
        jobs = [m.job for m in staged if m.ordering_key == key]
        assert [position[j] for j in jobs] == sorted(position[j] for j in jobs)
    assert ahead.count >= 5
    assert all(row.published_at for row in rows(pg_engine).values())


def test_a_failed_pass_hands_the_claim_taken_ahead_back_uncharged(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Strict order, one message refused once: nothing after it is published before it, and the
    rows claimed ahead while its pass ran are back, unclaimed and uncharged."""
    stage_each(pg_engine, ((f"m{n}", None) for n in range(20)))
    broker = Broker(refuse={"m2"})
    relay = make_relay(pg_engine, broker, batch_size=4, overlap=True, order="strict", retry_base=30)
    relay.drain()
    assert broker.published == ["m0", "m1"]
    state = rows(pg_engine)
    assert state["m2"].attempts == 1
    for n in range(3, 20):
        assert state[f"m{n}"].attempts == 0
        assert state[f"m{n}"].claimed_by is None, f"m{n} is still claimed"
    broker.refuse.clear()
    expire_backoffs(pg_engine)
    relay.drain()
    assert broker.published == [f"m{n}" for n in range(20)]


def test_a_broker_outage_hands_the_claim_taken_ahead_back(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """An outage mid-pass: nobody is charged, no row stays claimed, and all is published after."""
    stage_each(pg_engine, ((f"m{n}", None) for n in range(12)))
    down = threading.Event()
    broker = Broker(outage=down.is_set)

    def publish(message: OutboxMessage) -> None:
        if message.job == "m5" and not broker.attempts["m5"]:
            down.set()  # the broker goes down as m5 is first sent
        broker(message)

    relay = make_relay(pg_engine, publish, batch_size=4, overlap=True)
    assert relay.drain().outage
    with Session(pg_engine) as session:
        claimed = session.scalars(
            select(Row.job).where(Row.published_at.is_(None), Row.claimed_by.is_not(None))
        ).all()
        assert claimed == []
        assert session.scalars(select(Row.attempts).where(Row.attempts > 0)).all() == []
    down.clear()
    relay.drain()
    assert sorted(set(broker.published), key=lambda job: int(job[1:])) == [
        f"m{n}" for n in range(12)
    ]


def test_stop_hands_the_claim_taken_ahead_back(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """stop() during a pass: the pass hands back what it did not publish, and so does the claim
    taken ahead; no row stays claimed after stop() returns."""
    stage_each(pg_engine, ((f"m{n}", None) for n in range(20)))
    publishing = threading.Event()
    release = threading.Event()
    published: list[str] = []

    def blocking(message: OutboxMessage) -> None:
        published.append(message.job)
        if message.job == "m1":
            publishing.set()
            release.wait(10)

    relay = make_relay(pg_engine, blocking, batch_size=4, overlap=True)
    relay.start()
    assert publishing.wait(10)
    stopper = threading.Thread(target=relay.stop)
    stopper.start()
    release.set()
    stopper.join(10)
    with Session(pg_engine) as session:
        assert (
            session.scalars(
                select(Row.job).where(Row.published_at.is_(None), Row.claimed_by.is_not(None))
            ).all()
            == []
        )
        assert session.scalars(select(Row.job).where(Row.published_at.is_not(None))).all()
    assert published[:2] == ["m0", "m1"]


@pytest.mark.parametrize(("overlap", "expected"), [(None, False), (True, True), (False, False)])
def test_publishers_choose_unless_the_relay_is_told(
    pg_engine: Engine, make_relay: MakeRelay, overlap: bool | None, expected: bool
) -> None:
    """A plain function does not claim ahead by default; ``overlap`` decides when given."""
    relay = make_relay(pg_engine, lambda message: None, overlap=overlap)
    assert (relay._ahead is not None) is expected

    class Declares:
        overlap = True

        def publish(self, message: OutboxMessage) -> None:
            return None

    assert make_relay(pg_engine, Declares())._ahead is not None
