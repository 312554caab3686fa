"""Effectively once, end to end: 20,000 messages through Redis Streams, and through Kafka
(Tansu), while relays are killed with SIGKILL mid-batch, consumed through the inbox.

Relays publish at least once: a relay killed between the broker's confirm and its mark leaves
its claim to be published again after the lease. Duplicates on the stream are expected and
counted; the consumer, reading the stream through a consumer group and applying each message's
effect with ``inbox.handler``, must apply every effect exactly once, and absorb exactly as many
duplicates as it was delivered.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker
from support import REPO, WAIT, cli_env, reachable_redis, transaction, url_of, wait_until

import sqla_outbox as outbox
from sqla_outbox import inbox

from .tansu import Tansu, tansu_fixture  # noqa: F401 - importing registers the fixture

pytestmark = pytest.mark.slow

REDIS_URL = "redis://127.0.0.1:6379/0"
MESSAGES = 20_000
PER_TRANSACTION = 100
GROUP = "consumers"
KILLS = 6
CONSUMERS = 4
"""Consumer threads in the group: duplicates of one key may reach two of them at once."""

effects = MetaData()
applied = Table(
    "applied", effects, Column("n", Integer, primary_key=True), Column("times", Integer)
)


@dataclass
class Tally:
    """What the consumers saw: entries delivered, and duplicates the inbox absorbed."""

    delivered: int = 0
    absorbed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, *, absorbed: bool) -> None:
        with self.lock:
            self.delivered += 1
            self.absorbed += absorbed


def _stage(engine: Engine) -> None:
    """The effects' counters at 0, and one message per effect, 100 to a transaction."""
    inbox.metadata.create_all(engine)
    effects.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(applied), [{"n": n, "times": 0} for n in range(MESSAGES)])
    for start in range(0, MESSAGES, PER_TRANSACTION):
        with transaction(engine) as session:
            for n in range(start, start + PER_TRANSACTION):
                outbox.enqueue(session, "apply", {"n": n})


def _relay(engine: Engine, publisher: str, name: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "sqla_outbox.cli", "relay", "--claim-lease", "2",
        "--batch-size", "200", "--poll-interval", "0.05", "--relay-id", name,
        "--publisher", publisher,
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=cli_env(url=url_of(engine)), cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _consume(
    client: Any, stream: str, engine: Engine, tally: Tally, stop: threading.Event, *, name: str
) -> None:
    """Read the stream through a consumer group; apply each entry once per key; ack after the
    commit."""

    @inbox.handler(sessionmaker(engine), consumer="e2e")
    def apply(session: Session, fields: dict[str, str]) -> None:
        n = json.loads(fields["input"])["n"]
        session.execute(update(applied).where(applied.c.n == n).values(times=applied.c.times + 1))

    while not stop.is_set():
        reply = client.xreadgroup(GROUP, name, {stream: ">"}, count=100, block=100)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                tally.count(absorbed=not apply(fields))
                client.xack(stream, GROUP, entry_id)


def _kill_relays_until_published(engine: Engine, publisher: str) -> int:
    """Two relays at a time; every second the older one is killed with SIGKILL (mid-batch: a
    relay publishes a claim of 200 in well under a second) and replaced, :data:`KILLS` times or
    until nothing is pending. How many were killed."""
    relays = [_relay(engine, publisher, f"relay-{n}") for n in range(2)]
    kills = 0
    try:
        while outbox.status(engine).pending and kills < KILLS:
            time.sleep(1.0)  # pacing the faults, not waiting for anything
            doomed = relays.pop(0)
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(WAIT)
            kills += 1
            relays.append(_relay(engine, publisher, f"relay-{kills + 2}"))
        wait_until(lambda: outbox.status(engine).pending == 0, "every row published")
    finally:
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
            relay.wait(WAIT)
    return kills


def test_every_effect_applies_once_while_relays_are_killed(pg_engine: Engine) -> None:
    _stage(pg_engine)
    stream = f"e2e:{uuid.uuid4().hex}"
    tally = Tally()
    with reachable_redis(REDIS_URL, decode_responses=True) as client:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        stop = threading.Event()
        consumers = [
            threading.Thread(
                target=_consume,
                args=(client, stream, pg_engine, tally, stop),
                kwargs={"name": f"c{n}"},
                daemon=True,
            )
            for n in range(CONSUMERS)
        ]
        for consumer in consumers:
            consumer.start()
        try:
            kills = _kill_relays_until_published(pg_engine, f"{REDIS_URL}?stream={stream}")
            on_stream = client.xlen(stream)
            wait_until(lambda: tally.delivered == on_stream, "every entry consumed", 120)
        finally:
            stop.set()
            for consumer in consumers:
                consumer.join(WAIT)
            client.delete(stream)

    _assert_each_effect_once(pg_engine)
    assert kills >= 3
    assert on_stream >= MESSAGES
    assert tally.absorbed == on_stream - MESSAGES  # every duplicate delivered was absorbed


def _assert_each_effect_once(engine: Engine) -> None:
    with engine.connect() as conn:
        times = conn.execute(select(applied.c.times, func.count()).group_by(applied.c.times))
        recorded = conn.execute(select(func.count()).select_from(inbox.InboxRow)).scalar_one()
        counts = dict(times.all())
    assert counts == {1: MESSAGES}, "an effect applied twice, or not at all"
    assert recorded == MESSAGES


def test_every_effect_applies_once_through_kafka(pg_engine: Engine, tansu: Tansu) -> None:
    """The same through Kafka (Tansu): relays killed with SIGKILL while they produce to a topic
    of three partitions; every record, duplicates included, read back by a consumer with
    partition assignment and applied through the inbox, each key found with ``key_of`` on a
    ``confluent_kafka.Message``."""
    _stage(pg_engine)
    topic = f"e2e-{uuid.uuid4().hex[:12]}"
    tansu.create_topic(topic, 3)
    kills = _kill_relays_until_published(pg_engine, tansu.url(topic=topic))
    records = tansu.read(topic)

    @inbox.handler(sessionmaker(pg_engine), consumer="e2e-kafka")
    def apply(session: Session, record: confluent_kafka.Message) -> None:
        n = json.loads(record.value())["n"]
        session.execute(update(applied).where(applied.c.n == n).values(times=applied.c.times + 1))

    absorbed = 0
    for record in records:
        headers = [(name, value.encode()) for name, value in record.headers.items()]
        value = json.dumps(record.value).encode()
        absorbed += not apply(confluent_kafka.Message(topic=topic, value=value, headers=headers))

    _assert_each_effect_once(pg_engine)
    assert kills >= 3
    assert len(records) >= MESSAGES
    assert absorbed == len(records) - MESSAGES
