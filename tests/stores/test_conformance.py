"""Store conformance: every store runs the same relay and staging behaviours.

Each test takes ``store_engine`` (``conftest.py``) and runs once per store: PostgreSQL through
psycopg 3 (``pg-psycopg``, the fast path) and through psycopg2 (``pg-core``, the Core path),
SQLite, and MariaDB. They use the public API only (``enqueue``, ``Relay``, the dead-letter
functions, ``OutboxRow``), so a new store passes exactly when it behaves as the others do.

Concurrency is arranged with events, barriers and joins: relays run in their own threads (or a
process), publishers block on events, and every wait polls real state (rows, logs, a record
file) with a bound and says what it waited for. Two things take real time, on purpose: a claim
lease lapsing (the point of two tests) and a publisher that outlasts its lease.
"""

from __future__ import annotations

import datetime as dt
import logging
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, func, select, update
from sqlalchemy.orm import Session
from support import (
    REPO,
    WAIT,
    MakeRelay,
    cli_command,
    cli_env,
    expire_backoffs,
    logged,
    recorded_ids,
    row,
    stage_inputs,
    transaction,
    url_of,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox import sweeping
from sqla_outbox.message import OutboxMessage
from sqla_outbox.stores import base

LEASE = 1.0
"""Seconds: the claim lease of the tests where a lease has to lapse, or to be outlived."""


# --- staging and checking order --------------------------------------------------------------


def mixed_key(t: int, n: int) -> str | None:
    """The key of message ``n`` of transaction ``t``: messages 0 and 3 of a transaction have
    the keys ``k<t mod 8>`` and ``k<t+3 mod 8>``, the others none. So a transaction holds two
    keys, a key's messages are spread over many transactions, and while one relay holds the
    first transactions' rows another still finds transactions whose keys nothing holds."""
    return None if n % 3 else f"k{(t + n) % 8}"


def commit_backlog(engine: Engine, transactions: int, size: int) -> list[list[OutboxMessage]]:
    """Commit ``transactions`` transactions of ``size`` messages each, keyed by
    :func:`mixed_key`; the messages of each transaction, in enqueue order."""
    committed = []
    for t in range(transactions):
        with transaction(engine) as session:
            committed.append(
                [
                    outbox.enqueue(session, "ship", {"t": t, "n": n}, ordering_key=mixed_key(t, n))
                    for n in range(size)
                ]
            )
    return committed


def assert_in_order(
    published: Sequence[uuid.UUID], transactions: Sequence[Sequence[OutboxMessage]]
) -> None:
    """Every staged message was published, and each one's first publication came after its
    predecessor's in its transaction and in its ordering key (repeats, at least once, are
    allowed: only first publications count)."""
    first: dict[uuid.UUID, int] = {}
    for position, message_id in enumerate(published):
        first.setdefault(message_id, position)
    staged = [message for messages in transactions for message in messages]
    lost = [m.id for m in staged if m.id not in first]
    assert not lost, f"{len(lost)} of {len(staged)} messages were never published: {lost[:3]}"
    sequences = {f"transaction {t}": list(messages) for t, messages in enumerate(transactions)}
    for message in staged:
        if message.ordering_key is not None:
            sequences.setdefault(f"ordering key {message.ordering_key}", []).append(message)
    for name, messages in sequences.items():
        positions = [first[m.id] for m in messages]
        assert positions == sorted(positions), f"{name} was published out of enqueue order"


def unpublished(engine: Engine) -> int:
    """How many rows of the table have no ``published_at``."""
    with Session(engine) as session:
        count = select(func.count()).select_from(outbox.OutboxRow)
        return session.execute(count.where(outbox.OutboxRow.published_at.is_(None))).scalar_one()


def outbox_jobs(engine: Engine) -> list[str]:
    """The job of every row in the table, in claim order."""
    with Session(engine) as session:
        order = (outbox.OutboxRow.staged_at, outbox.OutboxRow.id)
        return list(session.scalars(select(outbox.OutboxRow.job).order_by(*order)))


# --- a broker the relays of a test share ------------------------------------------------------


class Ledger:
    """The broker of a test: every publish by every relay, in the order they happened (appended
    under a lock, so concurrent relays interleave here as they really did). ``all_in`` is set
    once ``expected`` distinct messages have arrived."""

    def __init__(self, expected: int = 0) -> None:
        self.sent: list[tuple[str, OutboxMessage]] = []
        self.expected = expected
        self.all_in = threading.Event()
        self._distinct: set[uuid.UUID] = set()
        self._lock = threading.Lock()

    def record(self, relay: str, messages: Iterable[OutboxMessage]) -> None:
        with self._lock:
            for message in messages:
                self.sent.append((relay, message))
                self._distinct.add(message.id)
            if self.expected and len(self._distinct) >= self.expected:
                self.all_in.set()

    def ids(self, relay: str | None = None) -> list[uuid.UUID]:
        """What was published (by ``relay``, or by anyone), in order."""
        with self._lock:
            return [m.id for name, m in self.sent if relay in (None, name)]

    def jobs(self) -> list[str]:
        with self._lock:
            return [m.job for _, m in self.sent]

    def assert_each_once(self, messages: Iterable[OutboxMessage]) -> None:
        counts = Counter(self.ids())
        expected = {m.id for m in messages}
        assert set(counts) == expected, f"{len(expected - set(counts))} never published"
        repeated = {message_id: n for message_id, n in counts.items() if n > 1}
        assert not repeated, f"{len(repeated)} messages published more than once: {repeated}"


class Held:
    """A publisher into a :class:`Ledger` that holds its first call: it runs ``on_hold``, sets
    ``entered`` and waits (bounded) for ``proceed`` before publishing."""

    def __init__(
        self, ledger: Ledger, name: str, on_hold: Callable[[], object] | None = None
    ) -> None:
        self.ledger = ledger
        self.name = name
        self.on_hold = on_hold
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def __call__(self, message: OutboxMessage) -> None:
        if not self.entered.is_set():
            if self.on_hold is not None:
                self.on_hold()
            self.entered.set()
            assert self.proceed.wait(WAIT), "the test never let the held publisher go on"
        self.ledger.record(self.name, [message])


@contextmanager
def running(relays: Iterable[outbox.Relay]) -> Iterator[None]:
    """The relays started for the block, and stopped after it (each finishing its pass)."""
    started = []
    try:
        for relay in relays:
            relay.start()
            started.append(relay)
        yield
    finally:
        for relay in started:
            relay.stop()


def in_thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# --- 1. two relays at once ---------------------------------------------------------------------


def test_two_relays_draining_at_once_publish_each_message_once_in_order(
    store_engine: Engine, make_relay: MakeRelay
) -> None:
    """Two started relays over 60 transactions of 5 messages (ordering keys spread across
    transactions): both take part, holding claims at the same time, every message is
    published exactly once, and each transaction's and each key's messages go out in enqueue
    order, whichever relay published which."""
    transactions = commit_backlog(store_engine, 60, 5)
    staged = [m for messages in transactions for m in messages]
    ledger = Ledger(expected=len(staged))
    both_claimed = threading.Barrier(2, timeout=WAIT / 3)
    broken: list[str] = []

    def publisher(name: str) -> Callable[[OutboxMessage], None]:
        waiting = [True]

        def publish(message: OutboxMessage) -> None:
            if waiting[0]:
                waiting[0] = False
                try:
                    both_claimed.wait()  # neither goes on until both hold a claim
                except threading.BrokenBarrierError:
                    broken.append(name)
                    raise
            ledger.record(name, [message])

        return publish

    relays = [
        make_relay(store_engine, publisher(name), batch_size=7, poll_interval=0.01, relay_id=name)
        for name in ("relay-1", "relay-2")
    ]
    with running(relays):
        wait_until(lambda: ledger.all_in.is_set() or bool(broken), "every message published")
    assert not broken, f"{broken} never saw the other relay hold a claim at the same time"
    assert {name for name, _ in ledger.sent} == {"relay-1", "relay-2"}
    ledger.assert_each_once(staged)
    assert_in_order(ledger.ids(), transactions)
    assert unpublished(store_engine) == 0


# --- 2. a stale claimant is fenced off ---------------------------------------------------------


class UnreachableError(Exception):
    """What relay A's statements meet while the test keeps A away from the database."""


def test_a_stale_claimant_is_fenced_off_and_publishes_nothing_more(
    store_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """Relay A claims three messages and stalls in its publisher on the first, cut off from
    the database so its lease cannot be renewed. Once the lease lapses relay B reclaims the
    rows and stalls in turn, before publishing anything. When A's renewal gets through again
    it finds the claim lost; A, let go, publishes nothing more from that claim, and its mark
    and hand-back touch none of B's rows (``relay.claim_lost``, touched=0): nothing is marked
    and a third relay finds nothing to claim. B then publishes all three and marks them."""
    caplog.set_level(logging.WARNING, logger="sqla_outbox")
    [staged] = commit_backlog(store_engine, 1, 3)
    ledger = Ledger()
    cut_off = threading.Event()
    a_publisher = Held(ledger, "A", on_hold=cut_off.set)
    # A has an engine of its own (given the URL), so only A is cut off. While A's pass waits
    # in the publisher, its only statements are lease renewals.
    a = make_relay(url_of(store_engine), a_publisher, claim_lease=LEASE, relay_id="A")

    @event.listens_for(a.engine, "before_cursor_execute")
    def cut(*_args: object) -> None:
        if cut_off.is_set():
            raise UnreachableError("relay A cannot reach the database (test)")

    b_publisher = Held(ledger, "B")
    b = make_relay(store_engine, b_publisher, claim_lease=LEASE, relay_id="B")
    test_over = threading.Event()

    def reclaim() -> None:
        # B ticks until the lapse lets it claim; that tick then waits in B's publisher.
        while not b.tick() and not test_over.wait(0.02):
            pass

    a_thread = in_thread(a.tick)
    threads = [a_thread]
    try:
        assert a_publisher.entered.wait(WAIT), "relay A never started publishing its claim"
        b_thread = in_thread(reclaim)
        threads.append(b_thread)
        assert b_publisher.entered.wait(WAIT), "relay B never reclaimed A's lapsed claim"
        assert logged(caplog, "relay.renew_failed"), "A's renewals were not the ones cut off"

        cut_off.clear()
        wait_until(
            lambda: any(
                "action=renew" in line and "claim=A:" in line
                for line in logged(caplog, "relay.claim_lost")
            ),
            "relay A's renewal to find its claim lost",
        )
        a_publisher.proceed.set()
        a_thread.join(WAIT)
        assert not a_thread.is_alive(), "relay A's pass never ended"
        assert ledger.ids("A") == [staged[0].id], "A published more of a claim it had lost"
        lost = [line for line in logged(caplog, "relay.claim_lost") if "relay=A " in line]
        assert any("action=mark" in line and "touched=0" in line for line in lost), lost
        assert any("action=release" in line and "touched=0" in line for line in lost), lost
        assert unpublished(store_engine) == 3, "A's mark touched rows of B's claim"
        third = make_relay(store_engine, lambda m: ledger.record("C", [m]), claim_lease=LEASE)
        assert third.tick() == 0, "A's hand-back freed rows of B's claim"

        b_publisher.proceed.set()
        b_thread.join(WAIT)
        assert not b_thread.is_alive(), "relay B's pass never ended"
    finally:
        test_over.set()
        cut_off.clear()
        a_publisher.proceed.set()
        b_publisher.proceed.set()
        for thread in threads:
            thread.join(WAIT)
    assert ledger.ids("B") == [m.id for m in staged]
    assert unpublished(store_engine) == 0


# --- 3. SIGKILL mid-batch ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_relay_killed_mid_batch_loses_nothing_and_keeps_order(
    store_engine: Engine, make_relay: MakeRelay, tmp_path: Path
) -> None:
    """A ``sqla-outbox relay`` process (batches of 10, lease 2 s) is killed with SIGKILL in its
    second batch, between publish and mark. A second relay with the same lease takes the dead
    one's rows over once the lease lapses: every message reaches the broker at least once,
    no row is left unpublished, only the batch in flight goes out twice, and each transaction
    and key keeps its order."""
    batch, lease = 10, 2
    transactions = commit_backlog(store_engine, 10, 6)
    record = tmp_path / "published.txt"  # the broker: fsynced per message by slow_recorder
    command = cli_command(
        "relay", "--claim-lease", str(lease), "--batch-size", str(batch),
        "--poll-interval", "0.05", "--relay-id", "doomed",
        "--publisher", "tests.publishers_for_tests:slow_recorder",
    )  # fmt: skip
    env = cli_env(url=url_of(store_engine), test_record=str(record))
    with subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_until(
                lambda: proc.poll() is not None or len(recorded_ids(record)) >= batch + 3,
                "the relay process to be into its second batch",
            )
        finally:
            proc.kill()
            _, stderr = proc.communicate(timeout=WAIT)
    assert proc.returncode == -9, f"the relay process ended before the kill: {stderr}"
    first_life = recorded_ids(record)
    assert batch < len(first_life) < 60

    ledger = Ledger()
    survivor = make_relay(
        store_engine, lambda m: ledger.record("survivor", [m]), batch_size=batch, claim_lease=lease
    )

    def drained() -> bool:
        survivor.drain()
        return survivor.pending() == 0

    # The dead relay's claim holds its rows until the lease lapses: drain until none is left.
    wait_until(drained, "the survivor to take over the dead relay's rows")
    assert unpublished(store_engine) == 0
    published = first_life + ledger.ids()
    assert_in_order(published, transactions)
    repeated = {i for i, n in Counter(published).items() if n > 1}
    assert len(repeated) <= batch and repeated <= set(first_life), "more than the batch repeated"


# --- 4. savepoints -----------------------------------------------------------------------------


class UndoError(Exception):
    """Raised inside a savepoint to roll it back."""


def test_only_released_savepoints_stage_and_a_rolled_back_transaction_stages_none(
    store_engine: Engine, make_relay: MakeRelay
) -> None:
    """In one committed transaction: six savepoints, every other one rolled back by an
    exception; a savepoint released into an outer savepoint that is rolled back; one message
    outside any savepoint. A second transaction, whose savepoint is released, is rolled back.
    Only the released savepoints' messages and the bare one are committed, and the relay
    publishes exactly those, in enqueue order."""
    kept: list[OutboxMessage] = []
    with transaction(store_engine) as session:
        for n in range(6):
            try:
                with session.begin_nested():
                    message = outbox.enqueue(session, f"item-{n}", {"n": n})
                    if n % 2:
                        raise UndoError(n)
                kept.append(message)
            except UndoError:
                pass
        outer = session.begin_nested()
        with session.begin_nested():
            outbox.enqueue(session, "released-into-a-rolled-back-savepoint")
        outer.rollback()
        kept.append(outbox.enqueue(session, "outside-any-savepoint"))
        assert [m.id for m in outbox.staged(session)] == [m.id for m in kept]
    with transaction(store_engine, commit=False) as session:
        with session.begin_nested():
            outbox.enqueue(session, "released-in-a-rolled-back-transaction")
        assert len(outbox.staged(session)) == 1

    expected = ["item-0", "item-2", "item-4", "outside-any-savepoint"]
    assert outbox_jobs(store_engine) == expected
    ledger = Ledger()
    relay = make_relay(store_engine, lambda m: ledger.record("relay", [m]))
    assert relay.drain().published == len(expected)
    assert ledger.ids() == [m.id for m in kept]


# --- 5. dead letters ---------------------------------------------------------------------------


def test_a_poison_message_becomes_a_dead_letter_to_retry_or_discard(
    store_engine: Engine, make_relay: MakeRelay
) -> None:
    """A publisher refuses two messages every time, each first of its ordering key. After
    max_publish_attempts (3) tries each is a dead letter, listed by dead_letters(), and the
    messages of no key are published meanwhile while the keys' later messages wait.
    retry_dead publishes the first (the publisher takes it now), then what it held back;
    discard_dead deletes the second, never published, and frees what it held."""

    def stage(job: str, key: str | None = None) -> OutboxMessage:
        [message] = stage_inputs(store_engine, job, [{"job": job}], ordering_key=key)
        return message

    stage("first")
    poison = stage("poison", "K1")
    stage("second")
    stage("behind-poison", "K1")
    stuck = stage("stuck", "K2")
    stage("behind-stuck", "K2")
    stage("third")
    refused = {"poison", "stuck"}
    tries: Counter[str] = Counter()
    ledger = Ledger()

    def publish(message: OutboxMessage) -> None:
        tries[message.job] += 1
        if message.job in refused:
            raise RuntimeError(f"broker refused {message.job}")
        ledger.record("relay", [message])

    relay = make_relay(store_engine, publish, max_publish_attempts=3)
    for _ in range(4):  # three failures each, then a pass that must not try them again
        relay.drain()
        expire_backoffs(store_engine)
    assert (tries["poison"], tries["stuck"]) == (3, 3)
    assert ledger.jobs() == ["first", "second", "third"]
    letters = outbox.dead_letters(store_engine)
    assert [letter.message.id for letter in letters] == [poison.id, stuck.id]
    assert all(letter.attempts == 3 for letter in letters)
    assert letters[0].last_error == "RuntimeError: broker refused poison"

    refused.discard("poison")
    assert outbox.retry_dead(store_engine, [poison.id]) == 1
    relay.drain()
    assert ledger.jobs()[3:] == ["poison", "behind-poison"]
    assert [letter.message.id for letter in outbox.dead_letters(store_engine)] == [stuck.id]

    assert outbox.discard_dead(store_engine, [stuck.id]) == 1
    relay.drain()
    assert ledger.jobs()[5:] == ["behind-stuck"]
    assert tries["stuck"] == 3
    assert outbox.dead_letters(store_engine) == []
    assert "stuck" not in outbox_jobs(store_engine)
    assert unpublished(store_engine) == 0


# --- 6. lease renewal --------------------------------------------------------------------------


class OutlastsTheLease:
    """A batch publisher slower than the lease: each batch is published only once its rows
    show the claim renewed to 1.5 leases past its ``claimed_at`` at the start of the pass, by
    the same claim (``claimed_by`` unchanged). Its pass thus outlives the lease it started
    with by half a lease while the other relay keeps trying to claim."""

    def __init__(self, engine: Engine, ledger: Ledger, name: str) -> None:
        self.engine = engine
        self.ledger = ledger
        self.name = name
        self.failed = threading.Event()

    def publish(self, message: OutboxMessage) -> None:
        self.publish_batch([message])

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        start = row(self.engine, messages[0])
        renewed_to = start.claimed_at + dt.timedelta(seconds=1.5 * LEASE)

        def renewed() -> bool:
            now = row(self.engine, messages[0])
            assert now.claimed_by == start.claimed_by, f"{self.name}'s claim was taken over"
            return bool(now.claimed_at >= renewed_to)

        try:
            wait_until(renewed, f"{self.name}'s claim to be renewed past its lease", WAIT / 3)
        except AssertionError:
            self.failed.set()
            raise
        self.ledger.record(self.name, messages)


@pytest.mark.slow
def test_renewal_keeps_a_claim_slower_than_its_lease_from_a_second_relay(
    store_engine: Engine, make_relay: MakeRelay
) -> None:
    """claim_lease=1 s and a publisher that takes more than 1.5 s a pass (it waits for the
    renewals): two started relays over 12 messages, four a claim. Renewal keeps every claim
    its relay's, so each message is published exactly once, and all are marked."""
    staged = [m for messages in commit_backlog(store_engine, 12, 1) for m in messages]
    ledger = Ledger(expected=len(staged))
    publishers = [OutlastsTheLease(store_engine, ledger, name) for name in ("R1", "R2")]
    relays = [
        make_relay(
            store_engine, p, batch_size=4, claim_lease=LEASE, poll_interval=0.05, relay_id=p.name
        )
        for p in publishers
    ]
    with running(relays):
        wait_until(
            lambda: ledger.all_in.is_set() or any(p.failed.is_set() for p in publishers),
            "every message to be published",
        )
        assert not any(p.failed.is_set() for p in publishers), "a claim was lost or not renewed"
        wait_until(lambda: unpublished(store_engine) == 0, "every message to be marked")
    ledger.assert_each_once(staged)


# --- 7. failures under concurrency ----------------------------------------------------------------


def test_two_relays_with_messages_failing_once_keep_every_order(
    store_engine: Engine, make_relay: MakeRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two started relays over 40 transactions of 5 messages, every seventh message refused on
    its first attempt (a short backoff, so it comes back within the test): each message is
    published once, and no message of a transaction or key goes out before a failed one ahead
    of it, whichever relay charged it and whichever retried it. This is the path where a failed
    pass's charges and parking ride on that relay's next claim while the other relay claims.

    With two relays some rows stay parked after their holder went out (a claim parks a whole
    transaction or key held by a stuck row, and the claims of two relays interleave) until a
    sweep frees them; the sweep runs every 0.2 s here instead of 5 s, since this test is about
    order, not about how long such a row waits."""
    monkeypatch.setattr(sweeping, "SWEEP_INTERVAL", 0.2)
    transactions = commit_backlog(store_engine, 40, 5)
    staged = [m for messages in transactions for m in messages]
    failing = {m.id for m in staged[::7]}
    ledger = Ledger(expected=len(staged))
    refused: set[uuid.UUID] = set()
    lock = threading.Lock()

    def publisher(name: str) -> Callable[[OutboxMessage], None]:
        def publish(message: OutboxMessage) -> None:
            with lock:
                first_attempt = message.id in failing and message.id not in refused
                refused.add(message.id)
            if first_attempt:
                raise RuntimeError(f"{name} refused {message.job} once")
            ledger.record(name, [message])

        return publish

    relays = [
        make_relay(
            store_engine,
            publisher(name),
            batch_size=7,
            poll_interval=0.01,
            retry_base=0.02,
            retry_max=0.02,
            relay_id=name,
        )
        for name in ("relay-1", "relay-2")
    ]
    with running(relays):
        wait_until(ledger.all_in.is_set, "every message published after its retries")
    assert refused >= failing
    ledger.assert_each_once(staged)
    assert_in_order(ledger.ids(), transactions)
    assert unpublished(store_engine) == 0


# --- 8. parked rows under steady load ---------------------------------------------------------


class Refilling:
    """A publisher into a :class:`Ledger` that, for each message it publishes, commits one new
    single-message transaction before it returns, until :attr:`stop` is set: the backlog then
    never shrinks while relays work on it, so they never find it empty and never go idle."""

    def __init__(self, engine: Engine, ledger: Ledger, name: str, stop: threading.Event) -> None:
        self.engine = engine
        self.ledger = ledger
        self.name = name
        self.stop = stop
        self.refills: list[OutboxMessage] = []

    def __call__(self, message: OutboxMessage) -> None:
        self.ledger.record(self.name, [message])
        if not self.stop.is_set():
            with transaction(self.engine) as session:
                self.refills.append(outbox.enqueue(session, "refill", {"by": self.name}))


def test_relays_that_never_go_idle_still_sweep_a_parked_row(
    store_engine: Engine, make_relay: MakeRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head of key P is parked with nothing stuck before it, which is what a claim leaves
    when it parks a row at the moment its holder is published: only a sweep frees it, and the
    two rows of P after it wait behind it. Two started relays over 30 more transactions whose
    publisher commits a new one for each message it publishes never find the backlog empty, so
    they never reach the idle loop; they must sweep between passes. The head is published while
    the refilling goes on (it used to wait for the first idle moment, under steady load never),
    then P's other rows after it, and every message once, each transaction and key in order."""
    monkeypatch.setattr(sweeping, "SWEEP_INTERVAL", 0.2)
    keyed = [stage_inputs(store_engine, "p", [n], ordering_key="P") for n in range(3)]
    head = keyed[0][0]
    with store_engine.begin() as conn:
        conn.execute(
            update(outbox.OutboxRow).where(outbox.OutboxRow.id == head.id).values(parked=True)
        )
    backlog = commit_backlog(store_engine, 30, 1)
    ledger = Ledger()
    stop = threading.Event()
    publishers = [Refilling(store_engine, ledger, name, stop) for name in ("R1", "R2")]
    relays = [
        make_relay(store_engine, p, batch_size=3, poll_interval=0.01, relay_id=p.name)
        for p in publishers
    ]
    with running(relays):
        try:
            # Until stop is set the refilling keeps both relays off the idle loop: only a sweep
            # between passes can free the head.
            wait_until(lambda: head.id in ledger.ids(), "the parked head to be swept and published")
        finally:
            stop.set()
        wait_until(lambda: unpublished(store_engine) == 0, "the backlog to drain once not refilled")
    refills = [[m] for p in publishers for m in p.refills]
    transactions = [*keyed, *backlog, *refills]
    ledger.assert_each_once(m for messages in transactions for m in messages)
    assert_in_order(ledger.ids(), transactions)
    published = ledger.ids()
    assert (
        published.index(head.id) < published.index(keyed[1][0].id) < published.index(keyed[2][0].id)
    )


# --- rows not due yet (sqla_outbox.waiting) ------------------------------------------------------


@pytest.mark.parametrize("window", [base.SWEEP_LIMIT, 4], ids=["window", "small-window"])
def test_two_relays_park_rows_not_due_and_publish_each_once_when_its_time_comes(
    store_engine: Engine,
    make_relay: MakeRelay,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    window: int,
) -> None:
    """Two started relays sweeping every 20 ms over 60 transactions of three (keys spread as
    :func:`mixed_key`), the middle message of each scheduled a day ahead, and five keys headed
    by a row in a day's retry backoff with a due row behind it. Their sweeps park the scheduled
    and backing-off rows; they publish every due message once and in order, and none of the
    rest. Then the day passes while they run: their sweeps wake the rest, and every message is
    published exactly once, the scheduled ones after their transactions' earlier rows, each
    row behind a backoff after it. No statement fails on the way: on MariaDB the marks of two
    relays deadlocked on the shared locks of the rows they unparked, until those were read
    apart from the UPDATE. With a sweep window of 4 parked rows, the relays' cursors move over
    the parked rows (:func:`sqla_outbox.queries.parked_window`) while all this goes on."""
    caplog.set_level(logging.WARNING, logger="sqla_outbox")
    monkeypatch.setattr(sweeping, "SWEEP_INTERVAL", 0.02)
    monkeypatch.setattr(base, "SWEEP_LIMIT", window)
    day = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    transactions = []
    for t in range(60):
        with transaction(store_engine) as session:
            transactions.append(
                [
                    outbox.enqueue(
                        session,
                        "ship",
                        {"t": t, "n": n},
                        ordering_key=mixed_key(t, n),
                        run_at=day if n == 1 else None,
                    )
                    for n in range(3)
                ]
            )
    heads = [stage_inputs(store_engine, "head", [n], ordering_key=f"b{n}")[0] for n in range(5)]
    behind = [stage_inputs(store_engine, "behind", [n], ordering_key=f"b{n}")[0] for n in range(5)]
    table = outbox.OutboxRow
    with store_engine.begin() as conn:  # each head failed once and waits a day
        conn.execute(
            update(table)
            .where(table.id.in_([m.id for m in heads]))
            .values(attempts=1, last_error="refused", retry_at=day)
        )
    later = {messages[1].id for messages in transactions} | {m.id for m in heads}
    due = [m for messages in transactions for m in messages if m.id not in later]

    def parked_until_due() -> bool:
        with Session(store_engine) as session:
            waiting = select(func.count()).where(table.wake_at.is_not(None), table.parked)
            return session.execute(waiting.select_from(table)).scalar_one() == len(later)

    ledger = Ledger(expected=len(due))
    relays = [
        make_relay(store_engine, ledger_publisher(ledger, name), batch_size=7, poll_interval=0.01)
        for name in ("relay-1", "relay-2")
    ]
    with running(relays):
        wait_until(ledger.all_in.is_set, "every due message")
        wait_until(parked_until_due, "the rows not due parked until their time")
        assert set(ledger.ids()) == {m.id for m in due}
        past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
        with store_engine.begin() as conn:  # the day passes
            chosen = table.id.in_(later)
            conn.execute(update(table).where(chosen).values(run_at=past, wake_at=past))
            conn.execute(
                update(table).where(chosen, table.retry_at.is_not(None)).values(retry_at=past)
            )
        everything = len(due) + len(later) + len(behind)
        wait_until(lambda: len(set(ledger.ids())) >= everything, "every message")
    ledger.assert_each_once(
        [*due, *(m for m in [*heads, *behind]), *(messages[1] for messages in transactions)]
    )
    published = ledger.ids()
    # Each transaction's due rows and each key's rows in order; a scheduled row joins the order
    # when its time comes, after its transaction's first row.
    due_sequences = [[messages[0], messages[2]] for messages in transactions]
    assert_in_order(published, [*due_sequences, *map(list, zip(heads, behind, strict=True))])
    for messages in transactions:
        assert published.index(messages[0].id) < published.index(messages[1].id)
    assert unpublished(store_engine) == 0
    assert logged(caplog, "relay.database_error") == []


def ledger_publisher(ledger: Ledger, name: str) -> Callable[[OutboxMessage], None]:
    """A publisher recording into ``ledger`` as ``name``."""
    return lambda message: ledger.record(name, [message])


def test_a_predecessor_locked_by_a_claim_this_instant_holds_back_what_follows_it(
    store_engine: Engine, make_relay: MakeRelay
) -> None:
    """Two claims can read the same rows at once: ``SKIP LOCKED`` then hands each the rows the
    other has not locked yet, so a claim may find row 1 of a transaction (and of key K) locked
    by the other's statement for an instant, and rows 0 and 2 free. Row 2 must wait for row 1
    (by transaction and by key, in a later transaction); row 0 and the unrelated transaction
    go. The other claim's lock is reproduced by a transaction that holds it open. (On MySQL
    and MariaDB a locking read skips locked rows in its subqueries too: the predecessors are
    read without locks.) SQLite claims under its write lock: no row is ever locked alone."""
    if store_engine.dialect.name == "sqlite":
        pytest.skip("SQLite locks the whole database, never one row")
    first = stage_inputs(store_engine, "tx", [0, 1, 2])
    keyed = stage_inputs(store_engine, "keyed", [1], ordering_key="K")
    later = stage_inputs(store_engine, "keyed", [2], ordering_key="K")
    other = stage_inputs(store_engine, "other", [0, 1])
    with transaction(store_engine) as session:  # K on row 1 of the first transaction too
        session.execute(
            update(outbox.OutboxRow)
            .where(outbox.OutboxRow.id == first[1].id)
            .values(ordering_key="K")
        )
    published: list[OutboxMessage] = []
    relay = make_relay(store_engine, published.append, batch_size=10)
    row = outbox.OutboxRow
    with store_engine.connect() as holder:
        holder.execute(select(row.id).where(row.id == first[1].id).with_for_update())
        relay.tick()
        holder.rollback()
    assert [m.id for m in published] == [first[0].id, *(m.id for m in other)]
    relay.tick()
    relay.tick()
    expected = [first[0], *other, first[1], first[2], *keyed, *later]
    assert [m.id for m in published] == [m.id for m in expected]


@pytest.mark.parametrize(("transactions", "rows"), [(20, 1_000), (2, 10_000)])
def test_a_second_relay_claims_another_transaction_while_the_first_holds_one(
    store_engine: Engine, make_relay: MakeRelay, transactions: int, rows: int
) -> None:
    """Scale-out on large transactions: relay A holds the first 100 rows of the first
    transaction. Relay B's first claim passes the rest of that transaction by (it waits for A)
    and takes the first 100 rows of the next one, in order, however long the held one is."""
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    table = outbox.OutboxRow.__table__
    staged: list[list[uuid.UUID]] = []
    with store_engine.begin() as conn:
        for number in range(transactions):
            at = start + dt.timedelta(seconds=number)
            ids = [uuid.UUID(int=(number << 64) + n + 1) for n in range(rows)]
            staged.append(ids)
            conn.execute(
                table.insert(),
                [
                    {
                        "id": row_id,
                        "job": "big",
                        "input": {},
                        "idempotency_key": str(row_id),
                        "run_at": at,
                        "staged_at": at,
                    }
                    for row_id in ids
                ],
            )
    a = make_relay(store_engine, lambda message: None, batch_size=100, relay_id="A")
    b = make_relay(store_engine, lambda message: None, batch_size=100, relay_id="B")
    held = a._statements.claim("A:1", None)
    assert [m.id for m in held.messages] == staged[0][:100]
    taken = b._statements.claim("B:1", None)
    assert [m.id for m in taken.messages] == staged[1][:100]
    a._statements.drop_connection()
    b._statements.drop_connection()
