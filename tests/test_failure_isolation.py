"""One bad message never stops the world: keys, per-row retries, dead letters, outages, renewal.

Every test runs on PostgreSQL and on SQLite through real connections unless it needs row locks
(two relays at once). Backoffs are expired by writing ``retry_at`` into the past, and relays
are held mid-pass by publishers that wait on events: no test sleeps to synchronise.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, event, literal_column, select, update
from sqlalchemy.orm import Session
from support import (
    REPO,
    MakeRelay,
    TextlessError,
    cli_env,
    expire_backoffs,
    pg_rows_read,
    recorded_ids,
    run_cli,
    url_of,
    wait_until,
)

import sqla_outbox as outbox
from sqla_outbox import queries
from sqla_outbox.claims import WriteBack
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishing import PassOutcome
from sqla_outbox.sweeping import ParkedCursor

Row = outbox.OutboxRow
WAIT = 30.0


# --- staging and reading ---------------------------------------------------------------------


def stage_each(
    engine: Engine, specs: Iterable[tuple[str, str | None]], *, per_transaction: int = 1
) -> list[OutboxMessage]:
    """Commit one message per ``(job, ordering_key)``, ``per_transaction`` to a transaction."""
    specs = list(specs)
    messages: list[OutboxMessage] = []
    for start in range(0, len(specs), per_transaction):
        with Session(engine) as session:
            for job, key in specs[start : start + per_transaction]:
                messages.append(outbox.enqueue(session, job, {"job": job}, ordering_key=key))
            session.commit()
    return messages


def rows(engine: Engine) -> dict[str, Any]:
    """Every row by job name, as it is now."""
    with Session(engine) as session:
        return {row.job: row for row in session.scalars(select(Row))}


class Broker:
    """Records what was published, in order; refuses the jobs in ``refuse`` (until removed),
    counting every attempt per job."""

    def __init__(self, refuse: Iterable[str] = (), *, outage: Callable[[], bool] | None = None):
        self.refuse = set(refuse)
        self.outage = outage
        self.published: list[str] = []
        self.attempts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, message: OutboxMessage) -> None:
        with self.lock:
            self.attempts[message.job] += 1
            if self.outage is not None and self.outage():
                raise outbox.BrokerUnavailableError("connection refused")
            if message.job in self.refuse:
                raise RuntimeError(f"broker refused {message.job}")
            self.published.append(message.job)


def drain_until(relay: outbox.Relay, engine: Engine, done: Callable[[], bool]) -> None:
    """Drain, expiring backoffs between drains, until ``done`` (bounded)."""
    for _ in range(100):
        relay.drain()
        if done():
            return
        expire_backoffs(engine)
    raise AssertionError("the relay never got there")


# --- poison messages and dead letters ----------------------------------------------------------


def test_a_poison_message_is_tried_max_attempts_then_dead_while_199_flow(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """200 single-message transactions, message 50 always refused: the other 199 are published
    (most in the first drain), message 50 is tried exactly max_publish_attempts times, and it
    ends as a dead letter that no relay claims again."""
    stage_each(engine, ((f"m{n}", None) for n in range(200)))
    broker = Broker(refuse={"m50"})
    relay = make_relay(engine, broker, batch_size=20, max_publish_attempts=3)

    first = relay.drain()
    assert first.published == 199 and first.failed
    drain_until(relay, engine, lambda: rows(engine)["m50"].dead_at is not None)
    for _ in range(3):  # a dead letter is never claimed again, backoff or not
        expire_backoffs(engine)
        relay.drain()

    assert broker.attempts["m50"] == 3
    assert sorted(broker.published) == sorted(f"m{n}" for n in range(200) if n != 50)
    dead = rows(engine)["m50"]
    assert (dead.attempts, dead.published_at) == (3, None)
    assert dead.last_error == "RuntimeError: broker refused m50"
    assert [letter.message.job for letter in outbox.dead_letters(engine)] == ["m50"]


@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (RuntimeError("refused: \x00 in the reply"), "RuntimeError: refused: \\x00 in the reply"),
        (RuntimeError("reply b'\udcff' undecodable"), "RuntimeError: reply b'\\udcff' undecodable"),
        (TextlessError(), "TextlessError (its str() raised)"),
    ],
    ids=["nul", "lone-surrogate", "str-raises"],
)
def test_a_refusal_of_any_text_is_charged_to_its_row(
    engine: Engine, make_relay: MakeRelay, error: Exception, recorded: str
) -> None:
    """Refusals whose message no database stores as it is (a NUL: PostgreSQL's text refuses
    it; a lone surrogate: UTF-8 cannot encode it) or that have no text at all (``str()``
    raises): charged to their row like any other, tried max_publish_attempts times, then dead,
    escaped in ``last_error``; the rows around it published once. The pass's write-back failed
    on such an error: the row was never charged nor dead-lettered, the rows the pass had
    published stayed unmarked, and every claim that met the row published them again."""
    stage_each(engine, [("before", None), ("bad", None), ("after", None)])
    published: list[str] = []
    attempts = Counter[str]()

    def publish(message: OutboxMessage) -> None:
        attempts[message.job] += 1
        if message.job == "bad":
            raise error
        published.append(message.job)

    relay = make_relay(engine, publish, max_publish_attempts=2)
    relay.drain()
    drain_until(relay, engine, lambda: rows(engine)["bad"].dead_at is not None)
    assert published == ["before", "after"]
    assert attempts["bad"] == 2
    dead = rows(engine)["bad"]
    assert (dead.attempts, dead.last_error) == (2, recorded)


class _BatchBroker:
    """Publishes whole batches, recording each batch's jobs."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def publish(self, message: OutboxMessage) -> None:
        raise AssertionError("the relay uses publish_batch")

    def publish_batch(self, messages: Sequence[OutboxMessage]) -> None:
        self.batches.append([message.job for message in messages])


_UNDECODABLE = {
    # SQLite's JSON is text nothing checks.
    "sqlite": ("'{not json'", "{not json", "JSONDecodeError"),
    # Valid jsonb, nested deeper than Python's recursion limit lets json.loads go.
    "postgresql": (
        "(repeat('[', 3000) || repeat(']', 3000))::jsonb",
        "[" * 3000 + "]" * 3000,
        "RecursionError",
    ),
}
"""Per dialect: SQL for a stored ``input`` Python cannot decode, its text, and why not."""


@pytest.mark.parametrize("form", ["publish", "publish_batch"])
def test_a_stored_input_python_cannot_decode_is_charged_to_its_row(
    engine: Engine, make_relay: MakeRelay, form: str
) -> None:
    """A row written without ``enqueue`` (by hand, by another program) can hold an ``input``
    Python cannot decode: text that is not JSON in SQLite's unchecked JSON, ``jsonb`` nested
    deeper than the recursion limit on PostgreSQL. That row's publish fails, with the reason
    and the fix in its ``last_error``, until it is a dead letter; the publisher never gets it,
    the rows around it are published once, and ``status`` and ``dead list`` show it as the
    text it is. Decoding it used to fail every claim that met it (the relay published nothing
    more), and ``status`` and ``dead list`` with it."""
    stored, text, reason = _UNDECODABLE[engine.dialect.name]
    _before, bad, _after = stage_each(engine, [("before", None), ("bad", None), ("after", None)])
    table = Row.__table__
    with engine.begin() as conn:
        conn.execute(update(table).where(table.c.id == bad.id).values(input=literal_column(stored)))
    broker = _BatchBroker()
    published: list[str] = []
    publisher: Any = broker if form == "publish_batch" else (lambda m: published.append(m.job))
    relay = make_relay(engine, publisher, max_publish_attempts=2)

    relay.drain()
    expire_backoffs(engine)
    relay.drain()

    if form == "publish_batch":
        assert broker.batches == [["before"], ["after"]]
    else:
        assert published == ["before", "after"]
    with engine.connect() as conn:
        charged = conn.execute(
            select(table.c.attempts, table.c.dead_at, table.c.last_error).where(
                table.c.id == bad.id
            )
        ).one()
    assert charged.attempts == 2 and charged.dead_at is not None
    assert charged.last_error.startswith(
        f"ValueError: message {bad.id}'s stored input cannot be decoded ({reason}"
    )
    assert f"sqla-outbox dead retry {bad.id}" in charged.last_error
    [letter] = outbox.dead_letters(engine)
    assert (letter.message.id, letter.message.input) == (bad.id, text)
    listed = run_cli("dead", "list", "--json", url=url_of(engine))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["input"] == text
    status = run_cli("status", url=url_of(engine))
    assert "Traceback" not in status.stderr, status.stderr
    assert str(bad.id) in status.stdout


def test_two_relays_meeting_an_undecodable_input_publish_every_other_message_once(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Two relays looping over 300 messages, three of whose ``jsonb`` inputs are nested past
    Python's recursion limit: each relay's first claim that meets one hands its rows back and
    claims again, decoding tolerantly. Every other message is published exactly once, in each
    transaction's order; the three are charged until they are dead letters, never published."""
    staged = stage_each(pg_engine, ((f"m{n}", None) for n in range(300)), per_transaction=3)
    deep = {staged[n].id for n in (10, 150, 299)}
    table = Row.__table__
    with pg_engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.id.in_(deep))
            .values(input=literal_column(_UNDECODABLE["postgresql"][0]))
        )
    seen: list[uuid.UUID] = []
    lock = threading.Lock()

    def publish(message: OutboxMessage) -> None:
        with lock:
            seen.append(message.id)

    relays = [
        make_relay(
            pg_engine,
            publish,
            batch_size=20,
            poll_interval=0.01,
            retry_base=0.01,
            retry_max=0.01,
            max_publish_attempts=2,
        )
        for _ in range(2)
    ]
    for relay in relays:
        relay.start()
    wait_until(lambda: len(outbox.dead_letters(pg_engine)) == 3, "three dead letters")
    wait_until(lambda: len(set(seen)) >= 294, "every message not dead nor held back")
    for relay in relays:
        relay.stop()
    # A dead letter holds back the later messages of its transaction: m11 behind m10, m151
    # and m152 behind m150; m299 is its transaction's last.
    held = {staged[n].id for n in (11, 151, 152)}
    assert Counter(seen) == Counter(m.id for m in staged if m.id not in deep | held)
    order = {message.id: n for n, message in enumerate(staged)}
    for start in range(0, 300, 3):
        group = [i for i in seen if start <= order[i] < start + 3]
        assert group == sorted(group, key=order.__getitem__)
    assert {letter.message.id for letter in outbox.dead_letters(pg_engine)} == deep


def test_a_failed_row_waits_out_its_backoff(engine: Engine, make_relay: MakeRelay) -> None:
    """A failed row is not retried before its backoff has passed, however often the relay
    claims; once it has, it is retried, and its attempts and error are on the row meanwhile."""
    stage_each(engine, [("bad", None), ("good", None)])
    broker = Broker(refuse={"bad"})
    relay = make_relay(engine, broker, retry_base=3600, retry_max=7200)

    relay.drain()
    before = dt.datetime.now(dt.timezone.utc)
    for _ in range(3):
        relay.drain()
    failed = rows(engine)["bad"]
    assert broker.attempts["bad"] == 1
    assert failed.attempts == 1 and failed.retry_at > before + dt.timedelta(minutes=59)
    assert broker.published == ["good"]

    broker.refuse.clear()
    expire_backoffs(engine)
    relay.drain()
    assert broker.published == ["good", "bad"]
    assert rows(engine)["bad"].published_at is not None


def test_backoff_doubles_and_is_capped(engine: Engine, make_relay: MakeRelay) -> None:
    """Each failure waits min(retry_base * 2 ** (attempts - 1), retry_max), on the row."""
    stage_each(engine, [("bad", None)])
    relay = make_relay(engine, Broker(refuse={"bad"}), retry_base=10, retry_max=35)
    waits = []
    for _ in range(4):
        before = dt.datetime.now(dt.timezone.utc)
        relay.drain()
        waits.append((rows(engine)["bad"].retry_at - before).total_seconds())
        expire_backoffs(engine)
    assert [round(w / 5) * 5 for w in waits] == [10, 20, 35, 35]


# --- ordering keys and transactions ------------------------------------------------------------


def test_a_failing_key_holds_back_only_itself(engine: Engine, make_relay: MakeRelay) -> None:
    """Keys A and B interleaved, A's third message failing: all of B is published meanwhile,
    A stops at its failed message; once it goes through, the rest of A follows in order."""
    specs = [(f"{key}{n}", key) for n in range(10) for key in "AB"]
    stage_each(engine, specs)
    broker = Broker(refuse={"A2"})
    relay = make_relay(engine, broker, batch_size=4)

    result = relay.drain()
    assert result.failed
    assert [job for job in broker.published if job[0] == "B"] == [f"B{n}" for n in range(10)]
    assert [job for job in broker.published if job[0] == "A"] == ["A0", "A1"]

    broker.refuse.clear()
    expire_backoffs(engine)
    relay.drain()
    assert [job for job in broker.published if job[0] == "A"] == [f"A{n}" for n in range(10)]


@pytest.mark.parametrize("order", ["key", "strict"])
def test_a_transaction_never_overtakes_its_failed_message(
    engine: Engine, make_relay: MakeRelay, order: str
) -> None:
    """One transaction's later messages wait for its failed one, in both orders; an unrelated
    transaction after it flows in key order and waits in strict order."""
    stage_each(engine, [("t1", None), ("t2", None), ("t3", None)], per_transaction=3)
    stage_each(engine, [("other", None)])
    broker = Broker(refuse={"t2"})
    relay = make_relay(engine, broker, order=order)

    for _ in range(2):
        relay.drain()
    expected = ["t1", "other"] if order == "key" else ["t1"]
    assert broker.published == expected

    broker.refuse.clear()
    expire_backoffs(engine)
    relay.drain()
    assert broker.published == [*expected, "t2", "t3", *(["other"] if order == "strict" else [])]


def test_strict_order_lets_nothing_overtake_a_failed_message(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """order="strict": after a failure nothing later is published, whatever its key or
    transaction, until the failed message is (the seed's total order)."""
    stage_each(engine, [("a", "k1"), ("b", "k2"), ("c", None), ("d", "k1")])
    broker = Broker(refuse={"b"})
    relay = make_relay(engine, broker, order="strict")

    for _ in range(3):
        relay.drain()
    assert broker.published == ["a"]
    broker.refuse.clear()
    expire_backoffs(engine)
    relay.drain()
    assert broker.published == ["a", "b", "c", "d"]


def test_a_failing_head_does_not_crowd_other_keys_out(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """Key A's head always fails and 40 more A messages wait behind it, ahead of 40 B
    messages; with a backoff that is always over, every claim could fill up with A. B is
    published all the same, within a handful of passes, and A behind its head is not tried."""
    specs = [("A-head", "A")] + [(f"A{n}", "A") for n in range(40)]
    specs += [(f"B{n}", "B") for n in range(40)]
    stage_each(engine, specs)
    broker = Broker(refuse={"A-head"})
    relay = make_relay(engine, broker, batch_size=10, max_publish_attempts=None)

    for _ in range(12):
        relay.run_pass()
        expire_backoffs(engine)
    assert broker.published == [f"B{n}" for n in range(40)]
    assert set(broker.attempts) == {"A-head", *(f"B{n}" for n in range(40))}


# --- outages -----------------------------------------------------------------------------------


def test_a_broker_outage_charges_nobody(engine: Engine, make_relay: MakeRelay) -> None:
    """While the broker is unreachable no row is charged or dead-lettered, however many passes
    fail (max_publish_attempts=1); once it is back, everything is published, in order."""
    stage_each(engine, ((f"m{n}", None) for n in range(5)))
    down = True
    broker = Broker(outage=lambda: down)
    relay = make_relay(engine, broker, max_publish_attempts=1)

    for _ in range(5):
        result = relay.run_pass()
        assert result.outage and result.published == 0
    assert all(
        (row.attempts, row.dead_at, row.claimed_by, row.last_error) == (0, None, None, None)
        for row in rows(engine).values()
    )
    down = False
    assert relay.drain().published == 5
    assert broker.published == [f"m{n}" for n in range(5)]


def test_the_loop_backs_off_during_an_outage_and_publishes_after(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """A running relay meets an outage: it backs off as a whole, charges nobody, and publishes
    everything once the broker answers again."""
    stage_each(engine, ((f"m{n}", None) for n in range(5)))
    outage = threading.Event()
    outage.set()
    broker = Broker(outage=outage.is_set)
    relay = make_relay(engine, broker, poll_interval=0.05, max_publish_attempts=1)
    relay.max_backoff = 0.1
    relay.start()
    wait_until(lambda: broker.attempts["m0"] >= 3, "three passes into the outage")
    outage.clear()
    wait_until(lambda: len(broker.published) == 5, "everything published after the outage")
    relay.stop()
    assert all(row.attempts == 0 for row in rows(engine).values())


# --- several relays ----------------------------------------------------------------------------


def test_a_second_relay_finds_work_behind_a_transaction_the_first_is_publishing(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Relay A is publishing the first 50 rows of a 100-row transaction (blocked mid-publish);
    20 single-message transactions come after it. Relay B's next pass takes all 20, instead of
    finding only rows that must wait for A."""
    stage_each(pg_engine, ((f"big{n}", None) for n in range(100)), per_transaction=100)
    stage_each(pg_engine, ((f"later{n}", None) for n in range(20)))
    inside, release = threading.Event(), threading.Event()

    def blocked(message: OutboxMessage) -> None:
        inside.set()
        assert release.wait(WAIT)

    relay_a = make_relay(pg_engine, blocked, batch_size=50, relay_id="A")
    worker = threading.Thread(target=relay_a.tick)
    worker.start()
    try:
        assert inside.wait(WAIT)
        broker = Broker()
        relay_b = make_relay(pg_engine, broker, batch_size=50, relay_id="B")
        assert relay_b.tick() == 20
        assert broker.published == [f"later{n}" for n in range(20)]
    finally:
        release.set()
        worker.join(WAIT)


@pytest.mark.parametrize("overlap", [False, True])
def test_two_relays_with_a_lease_shorter_than_a_pass_publish_each_message_once(
    pg_engine: Engine, make_relay: MakeRelay, overlap: bool
) -> None:
    """claim_lease=1 and a publisher taking 0.35 s a message (2.1 s a pass of 6): renewal keeps
    each claim alive, so two relays publish each of 12 messages exactly once. Claiming ahead,
    the next claim waits a whole pass, twice its lease, before it is published: it is renewed
    first, or handed back if another relay took its rows meanwhile."""
    stage_each(pg_engine, ((f"m{n}", None) for n in range(12)))
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def slow(message: OutboxMessage) -> None:
        time.sleep(0.35)  # the workload: a slow broker, not synchronisation
        with lock:
            seen[message.job] += 1

    relays = [
        make_relay(
            pg_engine, slow, batch_size=6, claim_lease=1, poll_interval=0.05, overlap=overlap
        )
        for _ in range(2)
    ]
    for relay in relays:
        relay.start()
    wait_until(lambda: sum(seen.values()) >= 12, "12 publishes")
    wait_until(lambda: all(r.published_at for r in rows(pg_engine).values()), "12 marks")
    for relay in relays:
        relay.stop()
    assert seen == Counter({f"m{n}": 1 for n in range(12)})


def test_a_claim_lost_mid_pass_publishes_nothing_more(
    engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """When renewal finds the claim taken over (its lease lapsed and another relay holds the
    rows), the pass publishes nothing more from it."""
    stage_each(engine, ((f"m{n}", None) for n in range(3)), per_transaction=3)
    lost = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            fields = getattr(record, "outbox_fields", {})
            event = getattr(record, "outbox_event", "")
            if event == "relay.claim_lost" and fields.get("action") == "renew":
                lost.set()

    published: list[str] = []

    def publish(message: OutboxMessage) -> None:
        if not published:
            # Another relay takes the rows over while this one is publishing the first.
            with engine.begin() as conn:
                conn.execute(update(Row).values(claimed_by="other:0000000000000000"))
            assert lost.wait(WAIT), "renewal did not notice the lost claim"
        published.append(message.job)

    handler = Watch()
    caplog.set_level(logging.WARNING, logger="sqla_outbox.relay")  # whatever earlier tests set
    logging.getLogger("sqla_outbox.relay").addHandler(handler)
    try:
        relay = make_relay(engine, publish, claim_lease=0.3)
        relay.tick()
    finally:
        logging.getLogger("sqla_outbox.relay").removeHandler(handler)
    assert published == ["m0"]
    assert all(row.published_at is None for row in rows(engine).values())


def test_renewal_ends_with_the_pass(engine: Engine, make_relay: MakeRelay) -> None:
    """A finished pass is never renewed: after it settles, its rows' claimed_at stays put."""
    stage_each(engine, [("only", None)])
    relay = make_relay(
        engine, Broker(refuse={"only"}), claim_lease=0.3, retry_base=3600, retry_max=3600
    )
    relay.tick()
    failed = rows(engine)["only"]
    assert (failed.claimed_by, failed.claimed_at) == (None, None)
    # The renewal thread has nothing left to renew.
    assert relay._renewal._claim is None


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_a_drain_does_not_wake_the_renewal_thread_on_every_pass(
    engine: Engine, make_relay: MakeRelay
) -> None:
    """Passes shorter than the renewal interval leave the renewal thread asleep: each new
    claim is due later than the thread looks anyway (waking it twice a pass cost a drain of
    100-row claims 2-6%). Every claim is still renewed on time: see the slow-publisher tests."""
    stage_each(engine, [(f"m{i}", None) for i in range(40)])
    published: list[str] = []
    relay = make_relay(engine, lambda m: published.append(m.job), batch_size=2)
    counting = relay._renewal._cond = _CountingCondition()
    relay.drain()
    assert len(published) == 40
    assert counting.notified <= 1, f"{counting.notified} wake-ups in 20 passes"


def test_dead_letters_are_listed_with_their_message(engine: Engine, make_relay: MakeRelay) -> None:
    """outbox.dead_letters lists each dead letter's message, attempts, error and time."""
    (message,) = stage_each(engine, [("poison", "k")])
    relay = make_relay(engine, Broker(refuse={"poison"}), max_publish_attempts=1)
    relay.drain()
    [letter] = outbox.dead_letters(engine)
    assert letter.message.id == message.id and letter.message.ordering_key == "k"
    assert letter.attempts == 1 and "broker refused poison" in str(letter.last_error)
    assert letter.dead_at is not None


def _ids(messages: list[OutboxMessage]) -> list[uuid.UUID]:
    return [m.id for m in messages]


# --- a relay killed mid-batch while another runs -----------------------------------------------


@pytest.mark.parametrize("overlap", [False, True])
def test_sigkill_with_two_relays_keeps_every_key_in_order(
    pg_engine: Engine, make_relay: MakeRelay, tmp_path: Any, overlap: bool
) -> None:
    """Three ordering keys, 20 single-message transactions each, interleaved. A relay process and
    an in-process relay publish them at once, into one append-only record; the process is
    killed with SIGKILL mid-batch. Every message is published, and within each key the first
    publication of every message follows its predecessor's: neither the second relay nor the
    takeover after the lease lapsed let a message overtake an earlier one of its key."""
    specs = [(f"{key}{n}", key) for n in range(20) for key in "xyz"]
    staged = stage_each(pg_engine, specs)
    record = tmp_path / "published.txt"

    def append(message: OutboxMessage) -> None:
        with open(record, "a", encoding="utf-8") as out:
            out.write(f"{message.id}\n")
            out.flush()
            os.fsync(out.fileno())
        time.sleep(0.02)  # a broker call's duration, so passes overlap; not synchronisation

    env = cli_env(url=url_of(pg_engine), test_record=str(record))
    command = [
        sys.executable, "-m", "sqla_outbox.cli", "relay", "--claim-lease", "2",
        "--batch-size", "5", "--poll-interval", "0.05", "--relay-id", "doomed",
        "--publisher", "tests.publishers_for_tests:slow_recorder",
        "--overlap" if overlap else "--no-overlap",
    ]  # fmt: skip
    survivor = make_relay(
        pg_engine, append, batch_size=5, claim_lease=2, poll_interval=0.05, overlap=overlap
    )
    with subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as proc:
        survivor.start()
        try:
            wait_until(lambda: len(recorded_ids(record)) >= 15, "both relays to publish")
        finally:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == -9
    wait_until(lambda: survivor.pending() == 0, "the survivor to finish the dead relay's rows")
    survivor.stop()

    order = recorded_ids(record)
    assert set(order) == {m.id for m in staged}
    first = {}
    for position, message_id in enumerate(order):
        first.setdefault(message_id, position)
    for key in "xyz":
        keyed = [m.id for m in staged if m.ordering_key == key]
        positions = [first[message_id] for message_id in keyed]
        assert positions == sorted(positions), f"key {key} published out of order"


@pytest.mark.parametrize("batch", [False, True])
def test_a_held_back_message_holds_back_its_own_transaction(
    engine: Engine, make_relay: MakeRelay, batch: bool
) -> None:
    """D (key K) is refused; a later transaction commits L (key K), then M (no key). L waits for
    D, and M waits for L, its transaction's earlier message: nothing of that transaction is
    published in the pass, through publish and through publish_batch alike."""
    stage_each(engine, [("D", "K")])
    stage_each(engine, [("L", "K"), ("M", None)], per_transaction=2)
    broker = Broker(refuse={"D"})

    class Batches:
        def publish(self, message: OutboxMessage) -> None:
            broker(message)

        def publish_batch(self, messages: list[OutboxMessage]) -> None:
            for done, message in enumerate(messages):
                try:
                    broker(message)
                except RuntimeError as error:
                    raise outbox.PublishError(str(error), published=done) from error

    relay = make_relay(engine, Batches() if batch else broker, retry_base=60, retry_max=60)
    relay.tick()
    assert broker.published == []
    broker.refuse.clear()
    expire_backoffs(engine)
    relay.drain()
    assert broker.published == ["D", "L", "M"]


# --- the fast claim and the full one (PostgreSQL) --------------------------------------------


class ClaimKinds:
    """Which statements a relay sends to claim and write back, in order: ``fast`` (the
    one-statement claim), ``window`` (a window read of the planned claim), ``settle``."""

    def __init__(self, engine: Engine) -> None:
        self.sent: list[str] = []
        self._engine = engine
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "candidates AS" in statement:
            self.sent.append("fast")
        elif "AS transaction_head" in statement:
            self.sent.append("window")
        elif "written AS" in statement:
            self.sent.append("settle")

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


def test_a_relay_alone_on_a_backlog_sends_only_the_fast_claim(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Nothing held anywhere: every claim, with its mark riding along, is the fast one."""
    stage_each(pg_engine, ((f"m{n}", None) for n in range(30)), per_transaction=3)
    kinds = ClaimKinds(pg_engine)
    broker = Broker()
    make_relay(pg_engine, broker, batch_size=4).drain()
    kinds.close()
    assert broker.published == [f"m{n}" for n in range(30)]
    assert kinds.sent and set(kinds.sent) == {"fast"}


def test_a_crowded_fast_claim_goes_past_a_transaction_in_flight_then_to_the_planned_claim(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Another claim holds the first transaction, whose last message has key K; the next two
    transactions are one message of K each. The one-statement claim finds K's first message
    held by a row in flight and goes once more, past its transaction; K's second message is
    held there too, so the planned claim decides in the same pass and takes the later
    transactions (never the K ones). The claims after it are one statement again, past what
    it left; once the other relay has published, K's messages follow in order."""
    stage_each(pg_engine, [("held0", None), ("held1", None), ("held2", "K")], per_transaction=3)
    stage_each(pg_engine, [("k0", "K"), ("k1", "K")])
    stage_each(pg_engine, ((f"free{n}", None) for n in range(4)), per_transaction=2)
    with pg_engine.begin() as conn:  # a live claim of another relay on the first transaction
        conn.execute(
            update(Row)
            .where(Row.job.like("held%"))
            .values(claimed_by="other:1", claimed_at=dt.datetime.now(dt.timezone.utc))
        )
    kinds = ClaimKinds(pg_engine)
    broker = Broker()
    relay = make_relay(pg_engine, broker, batch_size=2)
    assert relay.tick() == 2
    assert kinds.sent == ["fast", "fast", "window", "window"]  # k0 and k1 left, then free0-1
    assert broker.published == ["free0", "free1"]
    relay.tick()
    assert kinds.sent[4:] == ["fast"]  # past what the planned claim left
    assert broker.published == ["free0", "free1", "free2", "free3"]
    with pg_engine.begin() as conn:  # the other relay publishes its claim
        conn.execute(
            update(Row)
            .where(Row.job.like("held%"))
            .values(published_at=dt.datetime.now(dt.timezone.utc))
        )
    sent = len(kinds.sent)
    relay.drain()
    kinds.close()
    assert broker.published == ["free0", "free1", "free2", "free3", "k0", "k1"]
    assert set(kinds.sent[sent:]) == {"fast"}


def test_a_relay_past_a_stalled_claim_comes_back_for_its_transaction_in_order(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Another relay holds the first two messages of the first transaction, then stalls. The
    relay goes past that transaction and publishes the later ones; once the stalled claim's
    lease has lapsed, it comes back to the front and publishes the whole first transaction, in
    order; the stalled claim's rows are fenced from it."""
    stage_each(pg_engine, ((f"first{n}", None) for n in range(5)), per_transaction=5)
    stage_each(pg_engine, ((f"later{n}", None) for n in range(6)), per_transaction=2)
    with pg_engine.begin() as conn:  # the other relay's claim, live
        conn.execute(
            update(Row)
            .where(Row.job.in_(["first0", "first1"]))
            .values(claimed_by="stalled:1", claimed_at=dt.datetime.now(dt.timezone.utc))
        )
    broker = Broker()
    relay = make_relay(pg_engine, broker, batch_size=2)
    relay.drain()
    assert broker.published == [f"later{n}" for n in range(6)]
    with pg_engine.begin() as conn:  # the stalled claim's lease lapses
        conn.execute(
            update(Row)
            .where(Row.claimed_by == "stalled:1")
            .values(claimed_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1))
        )
    relay.drain()
    assert broker.published[6:] == [f"first{n}" for n in range(5)]
    assert all(row.published_at is not None for row in rows(pg_engine).values())
    assert "stalled:1" not in {row.claimed_by for row in rows(pg_engine).values()}


def test_the_fast_claim_passes_dead_letters_by_but_never_what_they_hold(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A dead letter of key K, then later messages: one of K (enqueued after K's head died, so
    nothing parked it yet), others of no key. The claims take the others and never K's; once
    the K message is parked, the relay claims with the fast claim again though the dead letter
    is still there (it holds nothing the candidates need)."""
    stage_each(pg_engine, [("dead", "K")])
    make_relay(pg_engine, Broker(refuse={"dead"}), max_publish_attempts=1).drain()
    assert rows(pg_engine)["dead"].dead_at is not None
    stage_each(pg_engine, [("behind", "K"), *((f"free{n}", None) for n in range(6))])
    kinds = ClaimKinds(pg_engine)
    broker = Broker()
    relay = make_relay(pg_engine, broker, batch_size=2)
    relay.drain()
    assert broker.published == [f"free{n}" for n in range(6)]
    assert rows(pg_engine)["behind"].parked
    stage_each(pg_engine, ((f"late{n}", None) for n in range(4)))
    kinds.sent.clear()
    relay.drain()
    kinds.close()
    assert broker.published[6:] == [f"late{n}" for n in range(4)]
    assert set(kinds.sent) == {"fast"}
    outbox.discard_dead(pg_engine, [rows(pg_engine)["dead"].id])
    relay.drain()
    assert broker.published[-1] == "behind"


def test_a_failed_pass_writes_back_and_the_next_claim_takes_nothing_it_holds(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Key order: the charge of a failed message and the parking of what it held back are one
    statement. The next claim must take neither the rest of the failed transaction nor a later
    message of the failed message's key; it takes what they do not hold, and parks the later
    message of the key behind the failed one."""
    stage_each(pg_engine, [("a0", "K"), ("a1", None), ("a2", None)], per_transaction=3)
    stage_each(pg_engine, [("k", "K"), ("free", None)])
    broker = Broker(refuse={"a0"})
    kinds = ClaimKinds(pg_engine)
    # A backoff longer than PARK_AFTER: the claim parks behind it instead of leaving rows.
    relay = make_relay(pg_engine, broker, batch_size=3, retry_base=30)
    relay.drain()
    kinds.close()
    assert broker.published == ["free"]
    # The one-statement claim finds the failed row holding k (key K): crowded, so the planned
    # claim follows in the same pass. It parked the only row it left (k, behind the failed
    # row): nothing crowds any more, and the next claim is the one-statement one again.
    assert kinds.sent[:5] == ["fast", "settle", "fast", "window", "fast"]
    state = rows(pg_engine)
    assert state["a0"].attempts == 1 and state["a0"].retry_at is not None
    for waiting in ("a1", "a2", "k"):
        assert state[waiting].parked and state[waiting].parked_behind == state["a0"].id
    assert state["k"].published_at is None

    broker.refuse.clear()
    expire_backoffs(pg_engine)
    relay.drain()
    assert broker.published == ["free", "a0", "a1", "a2", "k"]


def test_a_failed_pass_parks_the_rest_of_its_transaction_beyond_the_claim(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A claim ends inside a transaction whose first message fails. The write-back parks that
    transaction's rows past the claim too, so the next claim takes the later transactions at
    once, with the one-statement claim (it would meet the failed transaction's rows, hand over
    to the planned claim and park them there). The parked rows follow the failed message, in
    order, once it goes through."""
    stage_each(pg_engine, ((f"t{n}", None) for n in range(4)), per_transaction=4)
    stage_each(pg_engine, ((f"free{n}", None) for n in range(4)))
    broker = Broker(refuse={"t0"})
    kinds = ClaimKinds(pg_engine)
    relay = make_relay(pg_engine, broker, batch_size=2)
    relay.drain()
    kinds.close()
    assert broker.published == ["free0", "free1", "free2", "free3"]
    assert kinds.sent[:3] == ["fast", "settle", "fast"]
    assert "window" not in kinds.sent
    state = rows(pg_engine)
    assert state["t0"].attempts == 1
    assert [state[f"t{n}"].parked for n in (1, 2, 3)] == [True, True, True]

    broker.refuse.clear()
    expire_backoffs(pg_engine)
    relay.drain()
    assert broker.published[4:] == ["t0", "t1", "t2", "t3"]


def test_the_write_back_skips_a_row_another_claim_has_locked(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """The parking of a failed transaction's later rows never waits for a lock: a row another
    relay's claim holds locked at that instant (here an open transaction) is left as it is, and
    the claims that meet it later park it behind the failed message. Order is kept."""
    stage_each(pg_engine, ((f"t{n}", None) for n in range(4)), per_transaction=4)
    stage_each(pg_engine, ((f"free{n}", None) for n in range(4)))
    locked = rows(pg_engine)["t3"].id
    broker = Broker(refuse={"t0"})
    relay = make_relay(pg_engine, broker, batch_size=2, retry_base=30)
    with pg_engine.connect() as other, other.begin():
        other.execute(select(Row.id).where(Row.id == locked).with_for_update())
        draining = threading.Thread(target=relay.drain)
        draining.start()
        draining.join(WAIT)
        assert not draining.is_alive(), "the write-back waited for the locked row"
        state = rows(pg_engine)
        assert state["t2"].parked and not state["t3"].parked
    assert broker.published == ["free0", "free1", "free2", "free3"]
    relay.drain()  # t3 is claimable again: the claim that meets it parks it
    assert rows(pg_engine)["t3"].parked
    broker.refuse.clear()
    expire_backoffs(pg_engine)
    relay.drain()
    assert broker.published[4:] == ["t0", "t1", "t2", "t3"]


def test_a_lost_claims_failed_pass_writes_nothing(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """A stalled claimant: relay A claims the first two rows of a transaction, its lease lapses
    and relay B takes them. A's write-back for a pass that failed the first and held back the
    second is fenced off whole: nothing charged, nothing handed back, and none of the
    transaction's later rows parked (the parking follows only a failure still in the claim)."""
    caplog.set_level(logging.WARNING, logger="sqla_outbox")
    stage_each(pg_engine, ((f"t{n}", None) for n in range(4)), per_transaction=4)
    relay = make_relay(pg_engine, Broker(), batch_size=2, relay_id="A")
    store = relay._statements
    claimed = store.claim("A:1", None)
    first, second = claimed.messages
    with pg_engine.begin() as conn:  # the lease lapsed and relay B claimed the rows
        conn.execute(
            update(Row)
            .where(Row.id.in_([first.id, second.id]))
            .values(claimed_by="B:1", claimed_at=dt.datetime.now(dt.timezone.utc))
        )
    outcome = PassOutcome(
        failed=[(first, RuntimeError("refused"))],
        held_back=[second],
        waits_for={second.id: first.id},
    )
    write_back, _dead = store.write_back(claimed, outcome)
    store.write(write_back)
    store.drop_connection()
    state = rows(pg_engine)
    assert state["t0"].attempts == 0 and state["t0"].claimed_by == "B:1"
    assert state["t1"].claimed_by == "B:1" and not state["t1"].parked
    assert not state["t2"].parked and not state["t3"].parked
    lost = [r.getMessage() for r in caplog.records if "relay.claim_lost" in r.getMessage()]
    assert any("action=charge" in line and "touched=0" in line for line in lost), lost


def test_a_strict_relay_settles_a_failed_pass_on_its_own(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """Strict order: a failed pass is written back by a statement of its own before the next
    claim, which then sees the charge that holds every later row back."""
    stage_each(pg_engine, [("a0", None), ("a1", None)], per_transaction=2)
    stage_each(pg_engine, [("later", None)])
    broker = Broker(refuse={"a0"})
    kinds = ClaimKinds(pg_engine)
    make_relay(pg_engine, broker, batch_size=2, order="strict").drain()
    kinds.close()
    assert broker.published == []
    assert "settle" in kinds.sent


def _claims_with_plans(
    engine: Engine,
    make_relay: MakeRelay,
    write_back: Callable[[Any, outbox.Relay], WriteBack],
    statement_like: str,
) -> tuple[int, int]:
    """Twenty claims over a 3,000-row backlog, each pass written back as
    ``write_back(claimed, relay)`` says (a mark rides on the next claim, anything more is
    written on its own): how many generic and custom plans the prepared statements that match
    ``statement_like`` had. (Reads the store's held connection.)"""
    stage_each(engine, ((f"m{n}", None) for n in range(3000)), per_transaction=10)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE outbox")
    relay = make_relay(engine, Broker(), batch_size=100)
    store = relay._statements
    carried = None
    for n in range(20):
        claimed = store.claim(f"{relay.relay_id}:{n}", carried)
        carried = write_back(claimed, relay)
        if not store.can_carry(carried):
            store.write(carried)
            carried = None
    assert store._held is not None
    plans = store._held.exec_driver_sql(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
        (statement_like,),
    ).all()
    store.drop_connection()
    assert plans, "the claim was not prepared"
    generic, custom = (sum(column) for column in zip(*plans, strict=True))
    return generic, custom


def test_the_claim_keeps_a_generic_plan(pg_engine: Engine, make_relay: MakeRelay) -> None:
    """PostgreSQL plans a prepared claim once and keeps that generic plan, rather than planning
    it afresh on every pass (half a millisecond, a fifth of a pass at batch 100): a change to
    the claim's SQL that makes the server prefer custom plans is a regression the drain
    benchmark sees, and this catches it first."""

    def mark(claimed: Any, _relay: outbox.Relay) -> WriteBack:
        return WriteBack(claimed.token, [m.id for m in claimed.messages])

    generic, custom = _claims_with_plans(pg_engine, make_relay, mark, "%candidates AS%")
    assert generic > custom, f"{generic} generic and {custom} custom plans"


def test_the_write_back_of_a_failed_pass_keeps_a_generic_plan(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """The same for the write-back of a failed pass: one failure per pass, the rest of its
    transaction in the claim held back. Its few ids once made the custom plans look cheaper
    than the generic one, and PostgreSQL planned the statement afresh (1.7 ms) on a third of
    the passes of the 2%-failures benchmark."""

    def one_failure(claimed: Any, relay: outbox.Relay) -> WriteBack:
        messages = claimed.messages
        at = len(claimed.token) % 7 + 3  # somewhere in the claim, varying from pass to pass
        failed = messages[at]
        held = [m for m in messages[at + 1 :] if m.staged_at == failed.staged_at]
        outcome = PassOutcome(
            published=[m for m in messages if m is not failed and m not in held],
            failed=[(failed, RuntimeError("refused"))],
            held_back=held,
            waits_for={m.id: failed.id for m in held},
        )
        write_back, _dead = relay._statements.write_back(claimed, outcome)
        return write_back

    generic, custom = _claims_with_plans(pg_engine, make_relay, one_failure, "%written AS%")
    assert generic > custom, f"{generic} generic and {custom} custom plans"


@pytest.mark.parametrize("order", ["key", "strict"])
def test_the_claims_probes_for_failed_rows_read_the_failing_index_on_a_generic_plan(
    pg_engine: Engine, make_relay: MakeRelay, order: str
) -> None:
    """The claim's probes for failed rows (the gate's per transaction and key; in strict order,
    the first failed row) are meant to read ``ix_outbox_failing``, which holds only the failed,
    unpublished rows. The relay's claims run on generic plans (the tests above), and a generic
    plan cannot use that partial index for ``attempts > $1``: the ``0`` must be in the SQL.
    With it bound, each probe read its transaction's unpublished rows instead, and strict
    order's first-failed-row search walked the backlog. Plans read through ``auto_explain``."""
    stage_each(pg_engine, ((f"m{n}", None) for n in range(300)), per_transaction=10)
    relay = make_relay(pg_engine, Broker(), batch_size=100, order=order)
    store = relay._statements
    held = store._held_connection()
    try:
        held.exec_driver_sql("LOAD 'auto_explain'")
    except Exception as error:  # contrib missing, or not allowed to LOAD it
        pytest.skip(f"auto_explain cannot be loaded here: {error}")
    for setting in (
        "auto_explain.log_min_duration = 0",
        "plan_cache_mode = force_generic_plan",
        "client_min_messages = log",
    ):
        held.exec_driver_sql(f"SET {setting}")
    plans: list[str] = []
    driver = held.connection.driver_connection
    driver.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    for n in range(7):  # past psycopg's prepare threshold: the prepared, generic plan
        store.claim(f"{relay.relay_id}:{n}", None)
    store.drop_connection()
    claims = [plan for plan in plans if "candidates AS" in plan]
    assert claims, plans
    assert "using ix_outbox_failing" in claims[-1], claims[-1]  # (no query names an index)


def _park_behind_dead_letters(pg_engine: Engine, keys: int, per_key: int) -> int:
    """``keys`` ordering keys of ``per_key`` one-message transactions each, every key's first
    message a dead letter and the rest parked behind it (after the table was last analysed, as
    a relay parks); how many rows are parked."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (id, job, queue, input, idempotency_key, run_at, staged_at, "
            "ordering_key) SELECT gen_random_uuid(), 'job', 'default', '{}', 'k' || n, "
            "now() - interval '1 hour', now() - interval '1 hour' + n * interval '1 ms', "
            f"'key-' || n %% {keys} FROM generate_series(0, {keys * per_key - 1}) AS n"
        )
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox")
    with pg_engine.begin() as conn:
        heads = (
            "id IN (SELECT DISTINCT ON (ordering_key) id FROM outbox "
            "ORDER BY ordering_key, staged_at, id)"
        )
        conn.exec_driver_sql(f"UPDATE outbox SET attempts = 3, dead_at = now() WHERE {heads}")
        conn.exec_driver_sql(
            "UPDATE outbox AS waiting SET parked = true, parked_behind = dead.id "
            "FROM outbox AS dead WHERE dead.dead_at IS NOT NULL "
            "AND dead.ordering_key = waiting.ordering_key AND waiting.dead_at IS NULL"
        )
    return keys * (per_key - 1)


def test_a_sweep_reads_a_few_rows_per_parked_row(pg_engine: Engine) -> None:
    """40 ordering keys, 25 one-message transactions each, every key's first message a dead
    letter and the rest parked behind it. The sweep frees none of them and reads two rows for
    each: the parked row, and the row it names, by primary key. (Reading a key's earlier rows
    for every parked row grows with the square of a key's depth, every few seconds while
    anything is parked.)"""
    parked = _park_behind_dead_letters(pg_engine, keys=40, per_key=25)
    sweep = queries.sweep_parked_stmt("postgresql").compile(dialect=pg_engine.dialect)
    with pg_engine.connect() as conn:
        explained = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {sweep}",
            {**sweep.params, "limit": 1000, **ParkedCursor().params()},
        ).scalar_one()
        conn.rollback()
        still_parked = conn.exec_driver_sql("SELECT count(*) FROM outbox WHERE parked").scalar()
    assert still_parked == parked
    freeing = explained[0]["Plan"]["Plans"][0]  # what the UPDATE changes: the rows it frees
    assert freeing["Actual Rows"] == 0
    assert parked <= pg_rows_read(freeing) <= 4 * parked, pg_rows_read(freeing)


@pytest.mark.parametrize("plan", ["auto", "force_generic_plan"])
def test_a_mark_reads_only_the_parked_rows_of_its_own_transactions_and_keys(
    pg_engine: Engine, plan: str
) -> None:
    """960 rows parked behind 40 dead letters, and 50 other messages (five transactions of ten,
    no key) claimed and being marked. The mark unparks what its rows held back, which is
    nothing here, reading one index entry per transaction of its rows, whatever plan it gets
    (the relay's statements are prepared: generic plans). It read all 960 parked rows on
    every mark, 4 ms a pass with 10,000 parked: the drain of every other message ran at 60%
    of its speed while dead letters waited for an operator."""
    _park_behind_dead_letters(pg_engine, keys=40, per_key=25)
    stage_each(pg_engine, [(f"m{n}", None) for n in range(50)], per_transaction=10)
    with pg_engine.begin() as conn:
        claimed = (
            conn.execute(
                update(Row)
                .where(Row.job.like("m%"))
                .values(claimed_by="relay:1", claimed_at=dt.datetime.now(dt.timezone.utc))
                .returning(Row.id)
            )
            .scalars()
            .all()
        )
    mark = queries.mark_published_stmt("postgresql").compile(dialect=pg_engine.dialect)
    with pg_engine.connect() as conn:
        conn.exec_driver_sql(f"SET plan_cache_mode = {plan}")
        explained = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {mark}",
            {**mark.params, "token": "relay:1", "ids": list(claimed)},
        ).scalar_one()
        conn.rollback()
    ctes = {node.get("Subplan Name"): node for node in explained[0]["Plan"]["Plans"]}
    assert ctes["CTE marked"]["Actual Rows"] == 50
    unparking = ctes["CTE unparked"]
    assert unparking["Actual Rows"] == 0
    assert pg_rows_read(unparking) <= 20, pg_rows_read(unparking)


def test_an_idle_plan_reads_none_of_the_dead_letters_or_parked_rows(pg_engine: Engine) -> None:
    """960 rows parked behind 40 dead letters, and one message scheduled an hour ahead. The
    plan an idle relay makes of its wait still finds the scheduled message and that rows are
    parked, reading only the claimable rows and one parked row's index entry: the dead letters
    and parked rows cannot come due on their own. It read every unpublished row on every idle
    transition, 4.4 ms with 10,000 held rows against 0.3 ms without."""
    _park_behind_dead_letters(pg_engine, keys=40, per_key=25)
    (scheduled,) = stage_each(pg_engine, [("scheduled", None)])
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    with pg_engine.begin() as conn:
        conn.execute(update(Row).where(Row.id == scheduled.id).values(run_at=later))
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox")  # as autovacuum leaves them, in time
    plan, read = _idle_plan(pg_engine)
    assert plan == ((later, None, None), True)
    assert read <= 5, read


def test_an_idle_plan_after_a_drain_reads_no_published_row(pg_engine: Engine) -> None:
    """20,000 messages analysed while pending, then all published: until autovacuum analyses
    the table again, its statistics still count them as pending. The idle plan walks an index
    of unpublished rows anyway (and finds nothing), where it read the whole table, published
    history included, on every idle transition meanwhile (7 ms over 50,000 rows). On a table
    of a few thousand rows reading it is cheaper, and the planner does."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (id, job, queue, input, idempotency_key, run_at, staged_at) "
            "SELECT gen_random_uuid(), 'job', 'default', '{}', 'm' || n, now(), "
            "now() + n * interval '1 us' FROM generate_series(1, 20000) AS n"
        )
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE outbox")
    with pg_engine.begin() as conn:
        conn.execute(update(Row).values(published_at=dt.datetime.now(dt.timezone.utc)))
    plan, read = _idle_plan(pg_engine)
    assert plan == ((None, None, None), False)
    assert read <= 5, read


def _idle_plan(pg_engine: Engine) -> tuple[tuple[tuple[Any, ...], bool], int]:
    """The idle relay's plan of its wait (the next ``run_at``, retry and claim to lapse, and
    whether any row is parked), and the table and index rows it read."""
    statement = queries.idle_stmt("postgresql")
    with pg_engine.connect() as conn:
        row = conn.execute(statement).one()
        explained = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {statement.compile(dialect=pg_engine.dialect)}"
        ).scalar_one()
    plan = ((row.next_run_at, row.next_retry_at, row.oldest_claim), bool(row.parked))
    return plan, pg_rows_read(explained[0]["Plan"])


def test_a_claim_parks_what_waits_behind_a_row_it_parks(
    pg_engine: Engine, make_relay: MakeRelay
) -> None:
    """A dead letter on key K, and ten transactions of five messages whose third is K's: each
    K message waits for the dead letter, and the last two of its transaction wait for it. One
    claim takes the first two of every transaction and parks the other thirty behind the dead
    letter, the K messages and what is behind them alike: none is left for the next claims to
    read again while the dead letter stays."""
    (dead,) = stage_each(pg_engine, [("dead", "K")])
    with pg_engine.begin() as conn:
        conn.execute(
            update(Row)
            .where(Row.id == dead.id)
            .values(attempts=3, dead_at=dt.datetime.now(dt.timezone.utc))
        )
    specs = [(f"t{t}m{m}", "K" if m == 2 else None) for t in range(10) for m in range(5)]
    stage_each(pg_engine, specs, per_transaction=5)
    relay = make_relay(pg_engine, Broker(), batch_size=50)
    store = relay._statements
    claimed = store.claim(f"{relay.relay_id}:1", None)
    store.drop_connection()
    assert sorted(m.job for m in claimed.messages) == sorted(
        f"t{t}m{m}" for t in range(10) for m in range(2)
    )
    assert (claimed.held, claimed.parked) == (0, 30)
    state = rows(pg_engine)
    for waiting in (f"t{t}m{m}" for t in range(10) for m in range(2, 5)):
        assert state[waiting].parked and state[waiting].parked_behind == dead.id


def test_a_stuck_row_parks_only_what_comes_after_it(engine: Engine, make_relay: MakeRelay) -> None:
    """Key K: a due message, a dead letter, another due message. The claim meets both due ones
    with the dead letter between them: it parks only the later one and publishes the earlier,
    which nothing holds back. (It used to park both, leaving the first parked with nothing
    before it until the periodic sweep.)"""
    _first, dead, _last = stage_each(engine, [("first", "K"), ("dead", "K"), ("last", "K")])
    with engine.begin() as conn:
        conn.execute(
            update(Row)
            .where(Row.id == dead.id)
            .values(attempts=3, dead_at=dt.datetime.now(dt.timezone.utc))
        )
    broker = Broker()
    relay = make_relay(engine, broker, batch_size=10)
    # One pass, which runs no sweep (a drain sweeps when it finds nothing, which hid this).
    assert relay.tick() == 1
    assert broker.published == ["first"]
    assert relay.tick() == 0  # the last one still waits for the dead letter
    assert rows(engine)["last"].published_at is None
