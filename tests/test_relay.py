"""The relay: leased claims, fenced updates, ordered publishing, graceful stop.

Every test runs on PostgreSQL and on SQLite through real connections. Concurrency is arranged
with events and barriers: each relay runs in its own thread with its own connections, and the
tests decide who is where by blocking publishers, never by sleeping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import logging
import signal
import threading
import traceback
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine, event, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from support import (
    MakeRelay,
    ReturnsCoroutines,
    assert_charged,
    assert_uncharged,
    expire_backoffs,
    never_awaited,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox.engines import create_engine
from sqla_outbox.liveness import Liveness
from sqla_outbox.message import OutboxMessage

Row = outbox.OutboxRow
WAIT = 30.0  # seconds; a bound on waits that should take milliseconds


def stage(
    engine: Engine, count: int, job: str = "job", per_transaction: int | None = None
) -> list[uuid.UUID]:
    """Commit ``count`` messages, all in one transaction or ``per_transaction`` at a time."""
    ids: list[uuid.UUID] = []
    step = per_transaction or count
    with Session(engine) as session:
        for start in range(0, count, step):
            for n in range(start, min(start + step, count)):
                ids.append(outbox.enqueue(session, job, {"n": n}).id)
            session.commit()
    return ids


def published_ids(engine: Engine) -> set[uuid.UUID]:
    with Session(engine) as session:
        return set(session.scalars(select(Row.id).where(Row.published_at.is_not(None))))


def age_live_claims(engine: Engine) -> None:
    """Move every live claim an hour into the past, as if its relay had stalled that long."""
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    with engine.begin() as conn:
        conn.execute(update(Row).where(Row.claimed_at.is_not(None)).values(claimed_at=past))


class Gate:
    """A publisher that records messages and can be told to block or fail at one of them."""

    def __init__(
        self,
        *,
        block_at: int | None = None,
        fail_at: int | None = None,
        after_block: Callable[[], None] | None = None,
    ) -> None:
        self.published: list[OutboxMessage] = []
        self.block_at = block_at
        self.fail_at = fail_at
        self.after_block = after_block
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.calls = 0

    def publish(self, message: OutboxMessage) -> None:
        index = self.calls
        self.calls += 1
        if index == self.block_at:
            self.entered.set()
            assert self.proceed.wait(WAIT), "test never released the publisher"
            if self.after_block:
                self.after_block()
        if index == self.fail_at:
            raise RuntimeError(f"broker refused message {index}")
        self.published.append(message)


def statement_kinds(engine: Engine) -> list[str]:
    """A list that fills with the first word of every statement ``engine`` sends from now on,
    leaving out session settings (``set_config``: the relay's held connection turns JIT off and
    runs in UTC from when it is opened until it returns to the pool)."""
    kinds: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(_c: object, _cur: object, statement: str, *_a: object) -> None:
        if "set_config(" not in statement:
            kinds.append(statement.split(maxsplit=1)[0].upper())

    return kinds


def run_in_thread(fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_claim_lease_is_validated_by_the_constructor(engine: Engine, make_relay: MakeRelay) -> None:
    """claim_lease must be positive and finite; the error names it, the value and the fix."""
    for bad in (0, -1, float("inf"), float("nan"), dt.timedelta(0), "30", True):
        with pytest.raises(ValueError, match=r"claim_lease .*got") as info:
            outbox.Relay(engine, print, claim_lease=bad)  # raises: no engine made  # type: ignore[arg-type]
        assert "claim_lease=30" in str(info.value)
    assert make_relay(engine, print, claim_lease=dt.timedelta(seconds=5)).claim_lease == (
        dt.timedelta(seconds=5)
    )


def test_relay_id_defaults_to_a_unique_readable_id(engine: Engine, make_relay: MakeRelay) -> None:
    """Each relay gets relay-<uuid4> unless told otherwise."""
    a, b = make_relay(engine, print), make_relay(engine, print)
    assert a.relay_id.startswith("relay-") and a.relay_id != b.relay_id
    uuid.UUID(a.relay_id.removeprefix("relay-"))


def test_claim_stamps_a_per_claim_fence_token(engine: Engine, make_relay: MakeRelay) -> None:
    """claimed_by is '<relay_id>:<token>', new for every claim, even of the same relay."""
    stage(engine, 2)
    tokens: list[str | None] = []

    def look(message: OutboxMessage) -> None:
        with Session(engine) as session:
            tokens.append(session.get(Row, message.id).claimed_by)  # type: ignore[union-attr]

    relay = make_relay(engine, look, batch_size=1, relay_id="relay-A")
    assert relay.tick() == 1 and relay.tick() == 1
    assert all(t and t.startswith("relay-A:") for t in tokens)
    assert tokens[0] != tokens[1]


def test_publishes_in_claim_order_and_marks_once_per_pass(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A pass publishes due rows in enqueue order and marks them with one statement; a claim
    that finds nothing is one claim, not a retry loop."""
    ids = stage(engine, 25)
    gate = Gate()
    relay = make_relay(engine, gate, batch_size=10)
    statements = statement_kinds(relay.engine)

    assert [relay.tick() for _ in range(4)] == [10, 10, 5, 0]
    assert [m.id for m in gate.published] == ids
    # Four claims (the last finds nothing) and one mark per non-empty pass. On PostgreSQL a
    # claim is one WITH statement, and the mark a WITH that also unparks. On SQLite a claim is a
    # transaction of one window read (SELECT) and, when it takes rows, their stamp (UPDATE); a
    # mark is an UPDATE followed by the unparking of what waited for its rows.
    expected = (
        {"WITH": 7} if engine.dialect.name == "postgresql" else {"SELECT": 4, "UPDATE": 3 + 6}
    )
    assert Counter(s for s in statements if s != "BEGIN") == expected


def test_not_due_rows_wait_for_run_at(engine: Engine, make_relay: MakeRelay) -> None:
    """A row with run_at in the future is not claimed before then."""
    with Session(engine) as session:
        outbox.enqueue(session, "later", run_at=dt.timedelta(hours=1))
        now_id = outbox.enqueue(session, "now").id
        session.commit()
    gate = Gate()
    assert make_relay(engine, gate.publish).tick() == 1
    assert [m.id for m in gate.published] == [now_id]
    assert make_relay(engine, print).pending() == 1


def test_failure_stops_the_pass_and_hands_back_the_rest_at_once(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """order="strict": a publisher failing on row 3 of 10 ends the pass. 0-2 go out; row 3 is
    charged and backs off; 4-9 and a later transaction are handed back at once, uncharged,
    despite the hour-long lease. Nothing after row 3 is claimed while it backs off; once its
    backoff ends, the rest goes out in order, row 3 first."""
    ids = stage(engine, 10)
    later = stage(engine, 2, job="later-transaction")
    failing = Gate(fail_at=3)
    first = make_relay(engine, failing, claim_lease=3600, order="strict", retry_base=60)
    assert first.run_pass() == outbox.PassResult(claimed=12, published=3, failed=True)
    assert [m.id for m in failing.published] == ids[:3]
    assert published_ids(engine) == set(ids[:3])
    assert_charged(engine, ids[3], "broker refused message 3")
    assert_uncharged(engine, ids[4:] + later)

    second = Gate()
    relay = make_relay(engine, second, claim_lease=3600, order="strict", retry_base=60)
    assert relay.tick() == 0  # row 3 backs off, and nothing overtakes it
    expire_backoffs(engine)
    assert relay.drain().published == 9
    assert [m.id for m in second.published] == ids[3:] + later


def test_publish_failure_is_logged_with_counts(
    engine: Engine, caplog: pytest.LogCaptureFixture, make_relay: MakeRelay
) -> None:
    """The failure log line carries the job, the row, its failed attempts so far, when it is
    retried, and the error."""
    ids = stage(engine, 5, job="send_receipt")
    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        make_relay(engine, Gate(fail_at=2), retry_base=4).tick()
    [record] = [r for r in caplog.records if "relay.publish_failed" in r.getMessage()]
    line = record.getMessage()
    assert "job=send_receipt" in line and f"id={ids[2]}" in line
    assert "attempts=1" in line and "retry_in=4.0" in line
    assert "broker refused message 2" in line


@pytest.mark.parametrize(
    ("per_transaction", "batch_size"),
    [(10, 100), (3, 5)],
    ids=["batches-of-whole-transactions", "batches-ending-inside-transactions"],
)
@pytest.mark.slow
def test_two_relays_publish_every_row_exactly_once(
    engine: Engine, make_relay: MakeRelay, per_transaction: int, batch_size: int
) -> None:
    """Two relays (threads, own connections) over 3,000 rows: each row once, both took part.

    The rows come from transactions of ten (batches of 100) or of three (batches of 5, which
    a claim reaches inside a transaction and then leaves whole for the next claim); every
    transaction's rows go out in enqueue order even though the two relays interleave.
    """
    ids = stage(engine, 3000 - 3000 % per_transaction, per_transaction=per_transaction)
    both_claimed = threading.Barrier(2, timeout=WAIT)
    lock = threading.Lock()
    seen: list[tuple[str, uuid.UUID]] = []
    done = threading.Event()

    def publisher(name: str) -> Callable[[OutboxMessage], None]:
        first = [True]

        def publish(message: OutboxMessage) -> None:
            if first[0]:
                first[0] = False
                both_claimed.wait()  # neither proceeds until both hold a claim
            with lock:
                seen.append((name, message.id))
                if len(seen) >= len(ids):
                    done.set()

        return publish

    relays = [
        make_relay(
            engine, publisher(name), batch_size=batch_size, poll_interval=0.01, relay_id=name
        )
        for name in ("relay-1", "relay-2")
    ]
    for relay in relays:
        relay.start()
    try:
        assert done.wait(WAIT)
    finally:
        for relay in relays:
            relay.stop()
    counts = Counter(message_id for _, message_id in seen)
    assert set(counts) == set(ids) and max(counts.values()) == 1
    assert {name for name, _ in seen} == {"relay-1", "relay-2"}
    assert published_ids(engine) == set(ids)
    # Publication order (the shared list is appended under a lock) keeps each transaction's
    # enqueue order, whichever relay published which row.
    position = {message_id: index for index, (_, message_id) in enumerate(seen)}
    for start in range(0, len(ids), per_transaction):
        transaction = ids[start : start + per_transaction]
        assert sorted(transaction, key=position.__getitem__) == transaction


def test_a_relay_alone_takes_full_batches_across_transactions(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Transactions of three, batches of five, no other claim about: each claim takes a full
    batch (five rows, then four). A relay alone loses nothing by ending a claim inside a
    transaction: its next claim starts with the rest."""
    ids = stage(pg_engine, 9, per_transaction=3)
    gate = Gate()
    relay = make_relay(pg_engine, gate, batch_size=5)
    assert [relay.tick() for _ in range(3)] == [5, 4, 0]
    assert [m.id for m in gate.published] == ids


@pytest.mark.parametrize(
    ("count", "per_transaction", "claims"),
    [
        pytest.param(9, 3, [5, 4, 0], id="transactions-of-three"),
        pytest.param(7, None, [5, 2, 0], id="one-transaction-of-seven"),
    ],
)
def test_a_claim_passes_a_transaction_another_relay_holds_and_takes_full_batches(
    pg_engine: Engine,
    make_relay: MakeRelay,
    count: int,
    per_transaction: int | None,
    claims: list[int],
) -> None:
    """Relay B holds an earlier transaction mid-publish. It holds back only its own rows: A's
    claims pass it by and take full batches, ending inside a transaction where the batch ends
    (its next claim starts with the rest)."""
    first = stage(pg_engine, 1)
    b_gate = Gate(block_at=0)
    b = make_relay(pg_engine, b_gate, relay_id="B")
    b_thread = run_in_thread(b.tick)
    assert b_gate.entered.wait(WAIT)  # B holds the first transaction
    ids = stage(pg_engine, count, per_transaction=per_transaction)
    gate = Gate()
    a = make_relay(pg_engine, gate, batch_size=5, relay_id="A")
    try:
        assert [a.tick() for _ in range(len(claims))] == claims
    finally:
        b_gate.proceed.set()
        b_thread.join(WAIT)
    assert [m.id for m in gate.published] == ids
    assert [m.id for m in b_gate.published] == first


def test_stale_claimant_cannot_release_another_relays_claim(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A stalls past its lease; B reclaims; A's failure-release is fenced off; C gets nothing."""
    ids = stage(engine, 10)
    a_gate = Gate(block_at=0, fail_at=0)
    a = make_relay(engine, a_gate, claim_lease=60, relay_id="A")
    a_thread = run_in_thread(a.tick)
    assert a_gate.entered.wait(WAIT)

    age_live_claims(engine)
    b_gate = Gate(block_at=4)
    b = make_relay(engine, b_gate, claim_lease=60, relay_id="B")
    b_result: list[int] = []
    b_thread = run_in_thread(lambda: b_result.append(b.tick()))
    assert b_gate.entered.wait(WAIT)  # B holds all ten, mid-batch

    a_gate.proceed.set()  # A now fails and tries to hand its (lost) claim back
    a_thread.join(WAIT)
    assert not a_thread.is_alive()

    c_gate = Gate()
    assert make_relay(engine, c_gate, claim_lease=60, relay_id="C").tick() == 0
    assert c_gate.published == []

    b_gate.proceed.set()
    b_thread.join(WAIT)
    assert b_result == [10]
    assert [m.id for m in b_gate.published] == ids
    assert published_ids(engine) == set(ids)


def test_stale_claimant_cannot_mark_another_relays_claim(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A publishes late and marks after B reclaimed; B then fails the first row, which stays
    unpublished and is charged to B's claim, with the rest of its transaction handed back."""
    ids = stage(engine, 3)
    a_gate = Gate(block_at=0)
    a = make_relay(engine, a_gate, claim_lease=60, relay_id="A")
    a_thread = run_in_thread(a.tick)
    assert a_gate.entered.wait(WAIT)

    age_live_claims(engine)
    b_gate = Gate(block_at=0, fail_at=0)
    b = make_relay(engine, b_gate, claim_lease=60, relay_id="B", retry_base=60)
    b_thread = run_in_thread(b.tick)
    assert b_gate.entered.wait(WAIT)

    a_gate.proceed.set()  # A "publishes" all three and marks: fenced, touches nothing
    a_thread.join(WAIT)
    assert [m.id for m in a_gate.published] == ids
    assert published_ids(engine) == set()

    b_gate.proceed.set()  # B fails the first row and hands the other two back
    b_thread.join(WAIT)
    assert published_ids(engine) == set()
    assert_charged(engine, ids[0], "broker refused message 0")
    assert_uncharged(engine, ids[1:])

    expire_backoffs(engine)
    later = Gate()
    assert make_relay(engine, later, claim_lease=60).drain().published == 3
    assert [m.id for m in later.published] == ids
    assert published_ids(engine) == set(ids)


def test_lapsed_claim_is_reclaimed(engine: Engine, make_relay: MakeRelay) -> None:
    """Rows of a relay that stopped mid-claim are claimable once its lease lapses, not before."""
    ids = stage(engine, 4)
    dead = Gate(block_at=0)
    dead_relay = make_relay(engine, dead, claim_lease=60)
    thread = run_in_thread(dead_relay.tick)
    assert dead.entered.wait(WAIT)
    assert make_relay(engine, Gate(), claim_lease=60).tick() == 0  # lease still live
    age_live_claims(engine)
    survivor = Gate()
    assert make_relay(engine, survivor, claim_lease=60).tick() == 4
    assert [m.id for m in survivor.published] == ids
    dead.proceed.set()
    thread.join(WAIT)


def test_stop_waits_for_the_pass_and_its_marks(engine: Engine, make_relay: MakeRelay) -> None:
    """stop() returns after the pass in flight marked what it published; nothing after that."""
    ids = stage(engine, 10)
    gate = Gate(block_at=3)
    relay = make_relay(engine, gate, batch_size=10, poll_interval=0.01)
    relay.start()
    assert gate.entered.wait(WAIT)

    stop_returned = threading.Event()
    stopper = run_in_thread(lambda: (relay.stop(), stop_returned.set()))
    assert relay._stopping.wait(WAIT)  # stop() has been called and is waiting for the pass
    assert not stop_returned.is_set()
    gate.proceed.set()
    stopper.join(WAIT)
    assert stop_returned.is_set()

    published = [m.id for m in gate.published]
    assert published == ids[:4]  # the message in flight completed; no further one started
    assert published_ids(engine) == set(published)
    with Session(engine) as session:  # the rest was handed back, not left leased
        assert (
            session.scalar(
                select(Row.id).where(Row.claimed_by.is_not(None), Row.published_at.is_(None))
            )
            is None
        )
    assert relay.pending() == 6


def test_pending_counts_committed_unpublished_rows(engine: Engine, make_relay: MakeRelay) -> None:
    """pending() counts committed rows not yet published; rolled-back ones never exist."""
    stage(engine, 3)
    with Session(engine) as session:
        outbox.enqueue(session, "rolled-back")
        session.rollback()
    relay = make_relay(engine, Gate())
    assert relay.pending() == 3
    relay.tick()
    assert relay.pending() == 0


def test_database_errors_are_retried_not_fatal(
    pg_engine: Engine, caplog: pytest.LogCaptureFixture, make_relay: MakeRelay
) -> None:
    """Connections killed under a running relay: it logs, reconnects and keeps publishing.

    The kill lands while the relay publishes its first claim (the publisher waits for it), so
    the statement that meets the dead connection is the relay's next claim, whatever the timing.
    """
    stage(pg_engine, 5)
    lock = threading.Lock()
    seen: list[uuid.UUID] = []
    first_five, killed, all_ten = threading.Event(), threading.Event(), threading.Event()

    def publish(message: OutboxMessage) -> None:
        with lock:
            seen.append(message.id)
            if len(seen) == 5:
                first_five.set()
                assert killed.wait(WAIT), "test never killed the connections"
            if len(set(seen)) == 10:
                all_ten.set()

    url = pg_engine.url.render_as_string(hide_password=False)
    relay = make_relay(url, publish, poll_interval=0.02)  # its own pool, killed below
    with caplog.at_level(logging.INFO, logger="sqla_outbox"):
        relay.start()
        try:
            assert first_five.wait(WAIT)
            with pg_engine.connect() as conn:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            stage(pg_engine, 5)
            killed.set()
            assert all_ten.wait(WAIT)
        finally:
            killed.set()
            relay.stop()
    assert relay._thread is None
    assert any("relay.database_error" in r.getMessage() for r in caplog.records)


class BatchRecorder:
    """A publish_batch publisher that confirms a prefix, then fails, as told."""

    def __init__(self, confirm: int | None = None, error: Exception | None = None) -> None:
        self.batches: list[list[uuid.UUID]] = []
        self.confirm = confirm
        self.error = error

    def publish(self, message: OutboxMessage) -> None:  # pragma: no cover - batch is preferred
        raise AssertionError("the relay must use publish_batch when a publisher has it")

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        self.batches.append([m.id for m in messages])
        if self.error is not None:
            raise self.error


def test_batch_publisher_gets_the_whole_pass_in_order(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A publisher with publish_batch receives each claim whole, in claim order."""
    ids = stage(engine, 25)
    recorder = BatchRecorder()
    relay = make_relay(engine, recorder, batch_size=10)
    assert [relay.tick() for _ in range(3)] == [10, 10, 5]
    assert recorder.batches == [ids[:10], ids[10:20], ids[20:]]
    assert published_ids(engine) == set(ids)


def test_batch_partial_confirmation_marks_exactly_the_prefix(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """PublishError(published=3): rows 0-2 marked, the failure charged to row 3, and the rest
    of its transaction handed back at once, uncharged; they follow row 3 once its backoff
    ends."""
    ids = stage(engine, 10)
    error = outbox.PublishError("broker nacked message 3", published=3)
    relay = make_relay(engine, BatchRecorder(error=error), claim_lease=3600, retry_base=60)
    assert relay.tick() == 3
    assert published_ids(engine) == set(ids[:3])
    assert_charged(engine, ids[3], "nacked")
    assert_uncharged(engine, ids[4:])
    expire_backoffs(engine)
    recorder = BatchRecorder()
    assert make_relay(engine, recorder, claim_lease=3600).drain().published == 7
    assert [i for batch in recorder.batches for i in batch] == ids[3:]


def test_batch_failure_without_count_confirms_nothing(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """Any other exception from publish_batch counts as nothing confirmed: nothing is marked.

    It is a message failure, charged to the batch's first row, even a builtin ConnectionError:
    only a BrokerUnavailableError (or one as its cause) says the broker is down.
    """
    ids = stage(engine, 4)
    relay = make_relay(engine, BatchRecorder(error=ConnectionError("broker down")), retry_base=60)
    result = relay.run_pass()
    assert (result.published, result.failed, result.outage) == (0, True, False)
    assert published_ids(engine) == set()
    assert_charged(engine, ids[0], "ConnectionError: broker down")
    assert_uncharged(engine, ids[1:])
    expire_backoffs(engine)
    recorder = BatchRecorder()
    assert make_relay(engine, recorder).drain().published == len(ids)
    assert [i for batch in recorder.batches for i in batch] == ids


def test_a_transactions_rows_are_never_split_across_concurrent_claims(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """While relay A holds rows 0-4 of a transaction, relay B claims none of its rows 5-9.

    B gets them only once A has published 0-4, so enqueue order holds across relays.
    """
    ids = stage(engine, 10)
    other = stage(engine, 3, job="other-transaction")
    a_gate = Gate(block_at=0)
    a = make_relay(engine, a_gate, batch_size=5)
    a_thread = run_in_thread(a.tick)
    assert a_gate.entered.wait(WAIT)  # A holds rows 0-4 and is publishing

    b_gate = Gate()
    b = make_relay(engine, b_gate, batch_size=100)
    assert b.tick() == 3  # only the other transaction's rows
    assert [m.id for m in b_gate.published] == other

    a_gate.proceed.set()
    a_thread.join(WAIT)
    assert [m.id for m in a_gate.published] == ids[:5]
    assert b.tick() == 5
    assert [m.id for m in b_gate.published] == other + ids[5:]


def test_a_row_locked_mid_claim_holds_back_its_whole_transaction(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A row another claim has locked for an instant is a gap, not a row to step over.

    Two claims can scan the same rows at once: ``SKIP LOCKED`` then hands each one the rows
    the other has not locked yet, so relay A may get rows 0 and 2-9 of a transaction while
    relay B's statement holds row 1 for the instant before it gives up. Were A to publish
    2-9, row 1 would go out last: A finds row 1 in flight, goes past its transaction and takes
    the other one, and takes the first transaction, in order, once row 1 is free. The row
    lock of a concurrent claim is reproduced here by a transaction that holds it open.
    """
    ids = stage(pg_engine, 10)
    other = stage(pg_engine, 3, job="other-transaction")
    gate = Gate()
    relay = make_relay(pg_engine, gate)
    with pg_engine.connect() as holder:
        holder.execute(select(Row.id).where(Row.id == ids[1]).with_for_update())
        assert relay.tick() == 3  # the other transaction
        holder.rollback()
    assert relay.tick() == 10
    assert [m.id for m in gate.published] == [*other, *ids]


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_messages_carry_utc_datetimes_whatever_the_session_zone(
    pg_url: URL, pg_engine: Engine, make_relay: MakeRelay, zone: str
) -> None:
    """A relay in a UTC session takes psycopg's values as they are; in any other zone it
    converts them. Either way the publisher gets the same instants, in ``timezone.utc``."""
    run_at = dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    staged = []
    for _ in range(2):  # two transactions: a drain of one per claim merges the second's mark
        with Session(pg_engine) as session:
            staged.append(outbox.enqueue(session, "job", {}, run_at=run_at))
            session.commit()
    zoned = create_engine(pg_url, connect_args={"options": f"-c TimeZone={zone}"})
    try:
        with zoned.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == zone
        gate = Gate()
        assert make_relay(zoned, gate, batch_size=1).drain().published == 2
    finally:
        zoned.dispose()
    assert len(gate.published) == 2
    for message, sent in zip(gate.published, staged, strict=True):
        assert message.run_at == run_at and message.staged_at == sent.staged_at
        assert message.run_at.tzinfo is dt.timezone.utc
        assert message.staged_at.tzinfo is dt.timezone.utc


def test_a_failed_row_holds_back_the_rest_of_its_transaction_only(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """After a failure, the failed row's transaction waits for it; other transactions go on,
    in the same pass and while it backs off. Its held-back rows are handed back uncharged and
    follow it, in order, once it is published."""
    ids = stage(engine, 4)
    other = stage(engine, 2, job="other-transaction")
    failing = Gate(fail_at=1)
    relay = make_relay(engine, failing, retry_base=60)
    assert relay.run_pass() == outbox.PassResult(claimed=6, published=3, failed=True)
    assert [m.id for m in failing.published] == [ids[0], *other]  # row 1 failed
    assert_charged(engine, ids[1], "broker refused message 1")
    assert_uncharged(engine, ids[2:])

    later = Gate()
    relay = make_relay(engine, later, retry_base=60)
    assert relay.tick() == 0  # rows 2-3 wait for row 1, which backs off
    expire_backoffs(engine)
    assert relay.drain().published == 3  # the retry starts at the failed row, in order
    assert [m.id for m in later.published] == ids[1:]


def test_a_drain_marks_each_claim_with_the_next_one(engine: Engine, make_relay: MakeRelay) -> None:
    """drain() sends a claim's mark with the next claim: one statement per pass on
    PostgreSQL, one transaction per pass on SQLite; the last, empty claim marks the last pass,
    and one sweep (parked rows, rows parked until due) ends the drain."""
    ids = stage(engine, 25)
    gate = Gate()
    relay = make_relay(engine, gate, batch_size=10)
    statements = statement_kinds(relay.engine)

    assert relay.drain() == outbox.PassResult(claimed=25, published=25)
    sent = Counter(statements)
    assert [m.id for m in gate.published] == ids
    assert published_ids(engine) == set(ids)
    if engine.dialect.name == "postgresql":
        # A claim, then three mark-and-claims; then the sweep (one statement of three UPDATEs
        # in a WITH) finds nothing to unpark, wake or park.
        assert sent == {"WITH": 5}
    else:
        # Four transactions: a claim, then a mark and its unpark (two UPDATEs) and a claim in
        # each of the others, a claim being a window read (SELECT) and, while it takes rows,
        # their stamp (UPDATE); then the sweep's transaction (where its window of parked rows
        # ends, then three UPDATEs: unpark, wake, park until due).
        assert sent == {"BEGIN": 5, "SELECT": 4 + 1, "UPDATE": 3 + 6 + 3}


def test_a_transaction_cut_by_the_batch_size_goes_on_in_the_next_claim(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """The rows of a transaction that ended the previous claim are being marked published in
    the same statement as the next claim: the ordering guard must count them as published, or
    the rest of their transaction would wait while later ones overtake it."""
    ids = stage(engine, 30, per_transaction=10)
    gate = Gate()
    assert make_relay(engine, gate, batch_size=4).drain().published == 30
    assert [m.id for m in gate.published] == ids


def test_a_deferred_mark_of_a_lost_claim_is_fenced_off(
    engine: Engine, caplog: pytest.LogCaptureFixture, make_relay: MakeRelay
) -> None:
    """A stalls past its lease on its first claim, B reclaims those rows; A's mark, sent with
    its next claim, touches none of them and is logged; A goes on with the rows after them.
    B's claim stands: its failure is charged to row 0 alone (one transaction per row), and
    the rows after it, of other transactions, are still published."""
    ids = stage(engine, 6, per_transaction=1)
    a_gate = Gate(block_at=2)
    a = make_relay(engine, a_gate, batch_size=3, claim_lease=60, relay_id="A")
    a_result: list[outbox.PassResult] = []
    a_thread = run_in_thread(lambda: a_result.append(a.drain()))
    assert a_gate.entered.wait(WAIT)  # A is publishing the last row of its first claim

    age_live_claims(engine)
    b_gate = Gate(block_at=0, fail_at=0)
    b = make_relay(engine, b_gate, batch_size=3, claim_lease=60, relay_id="B", retry_base=60)
    b_thread = run_in_thread(b.tick)
    assert b_gate.entered.wait(WAIT)  # B holds rows 0-2

    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        a_gate.proceed.set()
        a_thread.join(WAIT)
    assert not a_thread.is_alive()
    assert a_result == [outbox.PassResult(claimed=6, published=6)]
    assert [m.id for m in a_gate.published] == ids
    [lost] = [r.getMessage() for r in caplog.records if "relay.claim_lost" in r.getMessage()]
    assert "action=mark" in lost and "expected=3" in lost and "touched=0" in lost
    assert published_ids(engine) == set(ids[3:])  # B's claim stands

    b_gate.proceed.set()  # B fails row 0 and publishes rows 1-2
    b_thread.join(WAIT)
    assert [m.id for m in b_gate.published] == ids[1:3]
    assert published_ids(engine) == set(ids[1:])
    assert_charged(engine, ids[0], "broker refused message 0")
    expire_backoffs(engine)
    assert make_relay(engine, Gate()).tick() == 1


def test_a_deferred_mark_of_a_lapsed_claim_nobody_took_still_marks_it(
    engine: Engine, caplog: pytest.LogCaptureFixture, make_relay: MakeRelay
) -> None:
    """A outlives its lease while publishing, and no other relay reclaims the rows. Its next
    claim must mark them, not take them again: a lapsed claim's rows are claimable, and one
    statement must not both mark and re-claim a row."""
    ids = stage(engine, 6, per_transaction=1)
    gate = Gate(block_at=2, after_block=lambda: age_live_claims(engine))
    relay = make_relay(engine, gate, batch_size=3, claim_lease=60)
    thread = run_in_thread(relay.drain)
    assert gate.entered.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        gate.proceed.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert [m.id for m in gate.published] == ids  # each once
    assert published_ids(engine) == set(ids)
    assert not [r for r in caplog.records if "relay.claim_lost" in r.getMessage()]


def test_a_deferred_mark_is_written_when_the_next_claim_fails(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """The connection dies after a pass published its whole claim: drain() raises the error,
    but first writes that pass's mark on a new connection, so nothing it published is left
    to be published again."""
    ids = stage(pg_engine, 10)
    published: list[uuid.UUID] = []
    relays: list[outbox.Relay] = []

    def publish(message: OutboxMessage) -> None:
        published.append(message.id)
        if len(published) == 5:  # the end of the first pass: kill the relay's connection
            held = relays[0]._statements._held
            assert held is not None
            pid = held.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
            with pg_engine.connect() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    relays.append(make_relay(pg_engine, publish, batch_size=5))
    with pytest.raises(OperationalError):
        relays[0].drain()
    assert published == ids[:5]
    assert published_ids(pg_engine) == set(ids[:5])
    assert make_relay(pg_engine, Gate()).tick() == 5


# --- a publisher that raises a BaseException ---------------------------------------------------


class Abort(BaseException):
    """A BaseException a client library may raise (gevent's Timeout and trio's Cancelled are)."""


class Interrupter:
    """Records what it publishes; the first attempt at ``fail_on`` raises ``error``.

    The retry of ``fail_on`` parks (``retrying`` set) until ``proceed``, so the test can look at
    the rows while the relay is back at work. ``alive_at_failure`` is ``relay.is_alive()`` at
    the moment of raising, once ``relay`` is set.
    """

    def __init__(self, error: BaseException, fail_on: uuid.UUID) -> None:
        self.error = error
        self.fail_on = fail_on
        self.relay: outbox.Relay | None = None
        self.published: list[uuid.UUID] = []
        self.raised = False
        self.alive_at_failure: bool | None = None
        self.retrying = threading.Event()
        self.proceed = threading.Event()

    def publish(self, message: OutboxMessage) -> None:
        self._deliver([message])

    def _deliver(self, messages: Sequence[OutboxMessage]) -> None:
        if any(m.id == self.fail_on for m in messages):
            if not self.raised:
                self.raised = True
                self.alive_at_failure = self.relay is not None and self.relay.is_alive()
                raise self.error
            self.retrying.set()
            assert self.proceed.wait(WAIT), "test never released the publisher"
        self.published.extend(m.id for m in messages)


class BatchInterrupter(Interrupter):
    """The same, as a publish_batch publisher (the relay then never calls publish)."""

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        self._deliver(messages)


class AliveWatch:
    """Samples ``relay.is_alive()`` in a thread until :meth:`stop`, counting the false answers
    that come after the first true one (a loop is not alive before its first statement)."""

    def __init__(self, relay: outbox.Relay) -> None:
        self.relay = relay
        self.samples = 0
        self.false = 0
        self._stop = threading.Event()
        self._thread = run_in_thread(self._sample)

    def _sample(self) -> None:
        while not self._stop.is_set():
            alive = self.relay.is_alive()
            if self.samples or alive:
                self.samples += 1
                self.false += not alive
            self._stop.wait(0.002)  # a sampling rate, not a synchronisation

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)


@pytest.mark.parametrize("form", ["publish", "publish_batch"])
@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (Abort("client torn down"), "Abort: client torn down"),
        (asyncio.CancelledError(), "CancelledError"),
    ],
    ids=["custom", "cancelled"],
)
def test_a_base_exception_from_a_publisher_is_a_failed_publish(
    engine: Engine, make_relay: MakeRelay, form: str, error: BaseException, recorded: str
) -> None:
    """A BaseException (a custom one, asyncio.CancelledError) from publish or publish_batch
    mid-pass fails that publish like any Exception: the prefix goes out once and is marked,
    the error is recorded on the failed row, and the started relay carries on: it retries the
    rest and publishes a message committed afterwards, is_alive() true all along."""
    ids = stage(engine, 5)
    batch = form == "publish_batch"
    publisher = (BatchInterrupter if batch else Interrupter)(error, fail_on=ids[2])
    # In batch form the prefix is the first claim of two; per message, the first two of five.
    relay = make_relay(engine, publisher, batch_size=2 if batch else 100, poll_interval=0.01)
    publisher.relay = relay
    relay.start()
    watch = AliveWatch(relay)
    try:
        assert publisher.retrying.wait(WAIT)  # survived, and back at the failed message
        assert publisher.alive_at_failure is True and relay.is_alive()
        assert publisher.published == ids[:2]
        assert published_ids(engine) == set(ids[:2])
        with Session(engine) as session:
            failed = session.get(Row, ids[2])
            assert failed is not None and failed.published_at is None
            assert failed.attempts == 1 and failed.last_error == recorded
        publisher.proceed.set()
        wait_until(lambda: published_ids(engine) == set(ids), "the rest to be published")
        later = stage(engine, 1, job="committed-afterwards")
        wait_until(lambda: later[0] in published_ids(engine), "the later commit")
        assert relay.is_alive()
    finally:
        publisher.proceed.set()
        watch.stop()
    assert publisher.published == ids + later  # each exactly once, in order
    assert watch.samples > 0 and watch.false == 0


class _AsyncPublisher:
    async def publish(self, message: OutboxMessage) -> None:
        raise AssertionError("an async publisher never runs")


class _AsyncCallable:
    async def __call__(self, message: OutboxMessage) -> None:
        raise AssertionError("an async publisher never runs")


class _AsyncBatchPublisher:
    def publish(self, message: OutboxMessage) -> None:
        raise AssertionError("the relay uses publish_batch")

    async def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        raise AssertionError("an async publisher never runs")


class _AsyncClose:
    def publish(self, message: OutboxMessage) -> None:
        raise AssertionError("never built")

    async def close(self) -> None:
        raise AssertionError("an async close never runs")


@pytest.mark.parametrize(
    ("publisher", "name"),
    [
        (never_awaited, "publisher"),
        (_AsyncPublisher(), "publisher.publish"),
        (_AsyncCallable(), "publisher"),
        (_AsyncBatchPublisher(), "publisher.publish_batch"),
        (_AsyncClose(), "publisher.close"),
    ],
    ids=["async-def", "async-method", "async-call", "async-batch", "async-close"],
)
def test_an_async_publisher_is_refused_when_the_relay_is_built(
    sqlite_engine: Engine, publisher: object, name: str
) -> None:
    """An ``async def`` publisher (a function, a ``publish`` or ``publish_batch`` method, an
    async ``__call__``): the relay would call it in its thread and get a coroutine back that
    never runs, so it is refused at ``Relay(...)``, saying how to run it instead. It used to be
    accepted, and every message was marked published with nothing sent. An ``async def close``
    likewise never ran: the client was never flushed nor closed."""
    with pytest.raises(TypeError, match=f"^{name} must be synchronous.*run_coroutine_threadsafe"):
        outbox.Relay(sqlite_engine, publisher)  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["publish", "publish_batch"])
def test_a_publisher_returning_a_coroutine_has_published_nothing(
    engine: Engine, make_relay: MakeRelay, form: str, recwarn: pytest.WarningsRecorder
) -> None:
    """A plain callable returning a coroutine (a ``lambda`` around an async client's
    ``publish``, which no check at ``Relay(...)`` can see through): the relay never awaits it,
    so nothing was sent. Each message is charged as a failed publish, its ``last_error`` saying
    why, instead of being marked published and lost; the coroutines are closed, so none is
    reported as never awaited."""
    ids = stage(engine, 3, per_transaction=1)
    wrapped = ReturnsCoroutines()
    publisher: Any = wrapped if form == "publish_batch" else wrapped.publish
    result = make_relay(engine, publisher).drain()

    assert (result.published, result.failed) == (0, True)
    assert published_ids(engine) == set()
    for message_id in ids:
        assert_charged(engine, message_id, "TypeError: the publisher returned coroutine")
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_a_failed_publish_leaves_no_reference_cycle_behind_its_pass(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A failed publish's traceback references the frame that caught it, whose locals held the
    pass's outcome (its messages, their payloads, the error itself), and through the frames'
    ``f_back`` the relay's own frames: reference cycles that kept every failing pass alive
    until a garbage collection. With the collector off, the pass is freed when it ends, even
    though the publisher keeps the error and an observer read the frames' locals (as an error
    reporter capturing them does); observers get the traceback whole, and it still formats
    afterwards."""
    stage(engine, 2)
    errors: list[BaseException] = []

    def refuse(message: OutboxMessage) -> None:
        error = RuntimeError(f"refused {message.job}")
        errors.append(error)
        raise error

    during: list[bool] = []
    outcomes: list[weakref.ref[Any]] = []

    class Observer:
        def pass_done(self, report: Any) -> None:
            (_message, error), *_ = report.outcome.failed
            during.append("in refuse" in "".join(traceback.format_exception(error)))
            # An error reporter that captures local variables reads them here.
            during.append(all(frame.f_locals for frame in _frames(error)))
            outcomes.append(weakref.ref(report.outcome))

    relay = make_relay(engine, refuse)
    relay.observe(Observer())
    gc.collect()
    gc.disable()
    try:
        relay.run_pass()
        assert outcomes and outcomes[0]() is None  # freed by reference counting alone
    finally:
        gc.enable()
    assert len(errors) == 1  # the second message waits for the first, its transaction's
    assert during == [True, True]
    frames = _frames(errors[0])
    assert len(frames) >= 2  # the frame that caught it, down to the publisher's
    assert [frame.f_locals for frame in frames] == [{}] * len(frames)
    assert "in refuse" in "".join(traceback.format_exception(errors[0]))


def _frames(error: BaseException) -> list[Any]:
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


class Raiser:
    """Publishes per message (``publish``) or per claim (``publish_batch``, with ``batch``)
    and raises ``error`` at call number ``raise_at``."""

    def __init__(self, error: type[BaseException], raise_at: int, *, batch: bool) -> None:
        self.error = error
        self.raise_at = raise_at
        self.calls = 0
        self.published: list[uuid.UUID] = []
        if batch:
            self.publish_batch = self._deliver

    def publish(self, message: OutboxMessage) -> None:
        self._deliver([message])

    def _deliver(self, messages: Sequence[OutboxMessage]) -> None:
        self.calls += 1
        if self.calls == self.raise_at:
            raise self.error("stop now")
        self.published.extend(m.id for m in messages)


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("form", ["publish", "publish_batch"])
def test_keyboard_interrupt_and_system_exit_from_a_publisher_propagate(
    engine: Engine, make_relay: MakeRelay, form: str, error: type[BaseException]
) -> None:
    """KeyboardInterrupt and SystemExit are not failed publishes: tick()/drain() raise them,
    after marking the published prefix and handing the rest back with nothing recorded (the
    message in flight is not to blame). The next pass publishes the rest."""
    ids = stage(engine, 5)
    batch = form == "publish_batch"
    publisher = Raiser(error, raise_at=2 if batch else 3, batch=batch)
    relay = make_relay(engine, publisher, batch_size=2 if batch else 100)
    with pytest.raises(error):
        relay.drain() if batch else relay.tick()
    assert publisher.published == ids[:2]
    assert published_ids(engine) == set(ids[:2])
    assert_uncharged(engine, ids[2:])
    assert make_relay(engine, Gate()).tick() == 3


def test_keyboard_interrupt_from_a_publisher_ends_the_background_loop(
    pg_engine: Engine,
    make_relay: MakeRelay,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under start(), a publisher's KeyboardInterrupt settles the pass (prefix marked, rest
    handed back) and ends the loop: it reaches the thread's excepthook, is logged as
    relay.aborted, the LISTEN connection is closed, and is_alive() turns false. start() again
    resumes where it left off."""
    ids = stage(pg_engine, 5)
    uncaught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    publisher = Raiser(KeyboardInterrupt, raise_at=3, batch=False)
    relay = make_relay(pg_engine, publisher, poll_interval=60)
    with caplog.at_level(logging.ERROR, logger="sqla_outbox"):
        relay.start()
        thread = relay._thread
        assert thread is not None
        thread.join(WAIT)
    assert not thread.is_alive() and not relay.is_alive()
    assert [args.exc_type for args in uncaught] == [KeyboardInterrupt]
    assert any("relay.aborted" in r.getMessage() for r in caplog.records)
    assert publisher.published == ids[:2]
    assert published_ids(pg_engine) == set(ids[:2])
    assert_uncharged(pg_engine, ids[2:])
    # The listener closed its connection; the server process behind it exits a moment later.
    wait_until(lambda: not listen_connections(pg_engine), "the LISTEN session to end")

    relay.start()
    wait_until(lambda: published_ids(pg_engine) == set(ids), "the restarted relay")
    assert publisher.published == ids


def listen_connections(engine: Engine) -> int:
    """How many sessions of this database sit in LISTEN."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            ).scalar_one()
        )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_stops_gracefully_on_sigint_and_sigterm(
    engine: Engine, make_relay: MakeRelay, signum: signal.Signals
) -> None:
    """run() in the main thread turns SIGINT/SIGTERM into a graceful stop, not an exception
    (and not a failed publish): the message in flight completes, the pass marks it and hands
    the rest back unblamed, and run() returns."""
    ids = stage(engine, 5)
    published: list[uuid.UUID] = []
    relays: list[outbox.Relay] = []
    handler_missing: list[object] = []

    def publish(message: OutboxMessage) -> None:
        published.append(message.id)
        if len(published) == 2:
            handler = signal.getsignal(signum)
            if handler in (signal.SIG_DFL, signal.default_int_handler):
                handler_missing.append(handler)  # raising it would end the test run itself
                relays[0].stop()
            else:
                signal.raise_signal(signum)

    relays.append(make_relay(engine, publish, poll_interval=60))
    assert relays[0].run() == outbox.PassResult()
    assert not handler_missing, "run() did not install its signal handler"
    assert published == ids[:2]
    assert published_ids(engine) == set(ids[:2])
    assert_uncharged(engine, ids[2:])
    assert not relays[0].is_alive()


@pytest.mark.slow
def test_the_loop_outlives_an_unexpected_error_outside_publishing(
    engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """A BaseException raised outside the publisher (here by an engine event hook during a
    claim) is logged as relay.unexpected_error with its traceback, and the loop goes on after
    backoff: the next commit is published."""
    publisher = Gate()
    relay = make_relay(engine, publisher, poll_interval=0.01)
    armed = threading.Event()

    @event.listens_for(relay.engine, "before_cursor_execute")
    def explode(_c: object, _cur: object, statement: str, *_a: object) -> None:
        claim = "AS transaction_head" in statement or statement.lstrip().startswith("WITH")
        if armed.is_set() and claim:
            armed.clear()
            raise Abort("hook blew up")

    with caplog.at_level(logging.ERROR, logger="sqla_outbox"):
        relay.start()
        wait_until(relay.is_alive, "the relay to reach the database")
        armed.set()
        wait_until(
            lambda: any("relay.unexpected_error" in r.getMessage() for r in caplog.records),
            "the error to be logged",
        )
    [record] = [r for r in caplog.records if "relay.unexpected_error" in r.getMessage()]
    assert "Abort: hook blew up" in record.getMessage() and record.exc_info is not None
    ids = stage(engine, 2)
    wait_until(lambda: published_ids(engine) == set(ids), "the next commit")
    assert [m.id for m in publisher.published] == ids
    assert relay.is_alive()


# --- liveness ----------------------------------------------------------------------------------


def test_liveness_bound_covers_a_healthy_relays_longest_silence(
    sqlite_engine: Engine, make_relay: MakeRelay
) -> None:
    """The bound is claim_lease + max(poll_interval, max_backoff): 40 s by default; Liveness
    says alive up to the bound after the last contact, not after, and never before the first
    contact or outside a loop."""
    assert make_relay(sqlite_engine, print).liveness_bound == 30 + 10
    relay = make_relay(sqlite_engine, print, poll_interval=60, claim_lease=5)
    assert relay.liveness_bound == 5 + 60
    now = [100.0]
    liveness = Liveness(clock=lambda: now[0])
    assert not liveness.alive(1.0)
    liveness.loop_started()
    assert not liveness.alive(1.0)  # running, but not reached the database yet
    liveness.reached_database()
    now[0] += 1.0
    assert liveness.alive(1.0)
    now[0] += 0.001
    assert not liveness.alive(1.0)
    liveness.reached_database()
    assert liveness.alive(1.0)
    liveness.loop_ended()
    assert not liveness.alive(1.0)


def test_is_alive_follows_the_loop_of_start_and_of_run(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """is_alive() is false before start(), true once the loop has reached the database, false
    after stop(); the same for run() in the foreground. A tick() is not a loop."""
    relay = make_relay(engine, print, poll_interval=0.01)
    assert not relay.is_alive()
    relay.tick()
    assert not relay.is_alive()
    relay.start()
    wait_until(relay.is_alive, "the started relay to be alive")
    relay.stop()
    assert not relay.is_alive()

    foreground = make_relay(engine, print, poll_interval=0.01)
    runner = run_in_thread(foreground.run)  # not the main thread: no signal handlers
    wait_until(foreground.is_alive, "run() to be alive")
    foreground.stop()
    runner.join(WAIT)
    assert not runner.is_alive() and not foreground.is_alive()


class Switch:
    """An engine ``creator`` that connects (as application ``switched``) until the test says
    the database is down."""

    def __init__(self, url: URL) -> None:
        self.dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.down = threading.Event()
        self.refused = 0

    def connect(self) -> psycopg.Connection[Any]:
        if self.down.is_set():
            self.refused += 1
            raise psycopg.OperationalError("the database is down (test switch)")
        return psycopg.connect(self.dsn, application_name="switched")

    def cut(self, admin: Engine) -> bool:
        """Terminate every connection this switch made; False, to poll with wait_until."""
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'switched'"
                )
            )
        return False


def test_is_alive_turns_false_while_the_database_is_unreachable_and_back_after(
    pg_url: URL, pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A running relay that cannot reach its database for longer than liveness_bound is not
    alive (its thread still runs, retrying); once the database answers again it is alive and
    publishes."""
    switch = Switch(pg_url)
    engine = create_engine("postgresql+psycopg://", creator=switch.connect)
    try:
        relay = make_relay(engine, Gate(), poll_interval=0.05, claim_lease=0.5, poll_only=True)
        relay.max_backoff = 0.2
        assert relay.liveness_bound == pytest.approx(0.7)
        relay.start()
        wait_until(relay.is_alive, "the relay to reach the database")

        switch.down.set()
        # Cut again on every poll: a connection made just before the switch went down dies too.
        wait_until(
            lambda: switch.cut(pg_engine) or not relay.is_alive(), "is_alive() to turn false"
        )
        assert relay._thread is not None and relay._thread.is_alive()
        assert switch.refused > 0

        switch.down.clear()
        wait_until(relay.is_alive, "is_alive() to turn true again")
        ids = stage(pg_engine, 1)
        wait_until(lambda: published_ids(pg_engine) == set(ids), "a publish after recovery")
        relay.stop()
        assert not relay.is_alive()
    finally:
        engine.dispose()
