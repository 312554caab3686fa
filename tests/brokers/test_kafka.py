"""The Kafka publisher against a real Kafka-protocol broker (Tansu) and a real PostgreSQL.

One Tansu per module (``tests/brokers/tansu.py``); each test uses topics of its own. Relays run
on a fresh PostgreSQL database per test. What arrives is read back partition by partition with
an assigned consumer (no consumer group). The unreachable-cluster tests point at a closed port.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import Engine
from support import (
    MakeRelay,
    assert_uncharged,
    free_port,
    logged,
    publisher_error,
    row,
    run_cli,
    stage_inputs,
    transaction,
    url_of,
    without_client,
)

import sqla_outbox as outbox
from sqla_outbox.errors import PublisherError, PublishError
from sqla_outbox.message import OutboxMessage
from sqla_outbox.publishers import kafka
from sqla_outbox.publishers.kafka import (
    KafkaPublisher,
    KafkaUnavailableError,
    from_url,
    kafka_unavailable,
)
from sqla_outbox.publishers.loader import resolve_publisher

from .outage import confirmed, is_outage
from .tansu import (
    Record,
    Tansu,
    start_tansu,
    tansu_fixture,  # noqa: F401 - importing registers the ``tansu`` fixture
)

confluent_kafka = pytest.importorskip("confluent_kafka")

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STRICT = {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]}
"""A value schema the broker enforces: a record whose input lacks ``"ok": true`` is refused."""


def fresh(name: str) -> str:
    """A topic (and queue) name no other test uses."""
    return f"{name}-{uuid.uuid4().hex[:10]}"


def numbers(records: list[Record]) -> list[int]:
    return [record.value["n"] for record in records]


def message_for(queue: str, n: int, *, key: str | None = "k", **input_: object) -> OutboxMessage:
    now = dt.datetime.now(dt.timezone.utc)
    return OutboxMessage(
        uuid.uuid4(), "job", queue, {"n": n, **input_}, f"ik-{n}", 3, now, now, ordering_key=key
    )


def one_sentence(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text.endswith("."), text
    return text


# --- delivery ----------------------------------------------------------------------------------


def test_cli_relay_once_delivers_exactly_the_committed_messages_keyed_and_in_key_order(
    pg_engine: Engine, tansu: Tansu
) -> None:
    """30 committed messages over 3 ordering keys, and one rolled-back enqueue: `sqla-outbox
    relay --once --publisher kafka://...?topic={queue}` delivers exactly the 30, each with its
    idempotency-key header and the ordering key as the record key, so each key's messages sit
    in one partition in staging order."""
    queue = fresh("cli")
    tansu.create_topic(queue, partitions=3)
    committed: list[OutboxMessage] = []
    for batch in range(10):  # ten transactions, each enqueuing once per key
        with transaction(pg_engine) as session:
            committed += [
                outbox.enqueue(session, "send", {"n": batch, "key": key}, queue=queue,
                               ordering_key=key)
                for key in ("alpha", "beta", "gamma")
            ]  # fmt: skip
    stage_inputs(pg_engine, "send", [{"n": -1}], commit=False, queue=queue, ordering_key="beta")

    result = run_cli(
        "relay", "--once", "--url", url_of(pg_engine), "--publisher", tansu.url(topic="{queue}")
    )

    assert result.returncode == 0, result.stderr
    records = tansu.read(queue)
    assert sorted(r.headers["idempotency-key"] for r in records) == sorted(
        m.idempotency_key for m in committed
    )
    by_key: dict[str, list[Record]] = defaultdict(list)
    for record in records:  # partition by partition, each in offset order
        assert record.key == record.value["key"]
        by_key[record.key].append(record)
    for key, mine in by_key.items():
        assert len({record.partition for record in mine}) == 1, key
        assert [r.headers["idempotency-key"] for r in mine] == [
            m.idempotency_key for m in committed if m.ordering_key == key
        ]
    assert len({mine[0].partition for mine in by_key.values()}) > 1  # the keys were spread


def test_a_record_carries_the_input_as_json_and_every_field_as_a_header(
    pg_engine: Engine, tansu: Tansu, make_relay: MakeRelay
) -> None:
    """The value is the input as compact JSON; headers hold idempotency-key, content-type, id,
    job, queue, max-attempts, run-at, staged-at, and tenant-id, enqueued-by and traceparent only
    when set. A message without an ordering key has no record key."""
    queue = fresh("fields")
    tansu.create_topic(queue, partitions=1)
    [full] = stage_inputs(pg_engine, "receipt", [{"to": "ünïcode@example.com"}], queue=queue,
                          tenant_id="acme", enqueued_by="user:7", traceparent=TRACEPARENT,
                          ordering_key="order-1")  # fmt: skip
    [bare] = stage_inputs(pg_engine, "receipt", [[1, 2]], queue=queue)

    relay = make_relay(pg_engine, from_url(tansu.url()))
    assert relay.drain().published == 2

    first, second = tansu.read(queue)
    assert first.value == {"to": "ünïcode@example.com"} and first.key == "order-1"
    assert first.headers == {
        "idempotency-key": full.idempotency_key,
        "content-type": "application/json",
        "id": str(full.id),
        "job": "receipt",
        "queue": queue,
        "max-attempts": str(full.max_attempts),
        "run-at": full.run_at.isoformat(),
        "staged-at": full.staged_at.isoformat(),
        "tenant-id": "acme",
        "enqueued-by": "user:7",
        "traceparent": TRACEPARENT,
    }
    assert second.key is None and second.value == [1, 2]
    assert "tenant-id" not in second.headers and "traceparent" not in second.headers
    assert second.headers["idempotency-key"] == bare.idempotency_key


# --- outages -----------------------------------------------------------------------------------


def test_an_unreachable_cluster_fails_the_cli_pass_in_seconds_and_charges_nothing(
    pg_engine: Engine,
) -> None:
    """Nothing listens on the port: with the default delivery_timeout (10 s, not librdkafka's
    300 s) `relay --once` gives up within a bound, exits 1 after logging the outage, publishes
    and marks nothing, and charges no message an attempt."""
    queue = fresh("down")
    messages = stage_inputs(pg_engine, "send", [{"n": n} for n in range(3)], queue=queue)
    publisher = f"kafka://127.0.0.1:{free_port()}?topic={{queue}}"

    started = time.monotonic()
    result = run_cli("relay", "--once", "--url", url_of(pg_engine), "--publisher", publisher)
    elapsed = time.monotonic() - started

    assert elapsed < 30, elapsed
    assert result.returncode == 1, result.stderr
    assert "relay.broker_unavailable" in result.stderr
    assert "no broker confirmed it within delivery_timeout=10 s" in result.stderr
    assert_uncharged(pg_engine, messages)
    assert all(row(pg_engine, message).attempts == 0 for message in messages)


def test_an_unreachable_cluster_is_an_outage_in_one_sentence(
    pg_engine: Engine, make_relay: MakeRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """publish_batch to a closed port raises KafkaUnavailableError(published=0), an outage, in
    one sentence naming the message, the timeout and the client's connection error; the relay
    marks nothing, charges nothing, and logs that sentence."""
    publisher = from_url(f"kafka://127.0.0.1:{free_port()}?delivery_timeout=1")
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as info:
        publisher.publish_batch([message_for("q", 1), message_for("q", 2)])
    assert time.monotonic() - started < 5
    assert is_outage(info.value) and confirmed(info.value) == 0
    text = one_sentence(info.value)
    assert "delivery_timeout=1 s" in text and "Connection refused" in text

    messages = stage_inputs(pg_engine, "send", [{"n": 1}, {"n": 2}], queue=fresh("down"))
    relay = make_relay(pg_engine, publisher)
    with caplog.at_level(logging.WARNING, logger="sqla_outbox"):
        result = relay.run_pass()
    assert (result.published, result.failed, result.outage) == (0, True, True)
    assert_uncharged(pg_engine, messages)
    [line] = logged(caplog, "relay.broker_unavailable")
    assert "did not confirm message" in line


def test_the_same_publisher_delivers_again_once_a_stopped_broker_is_back(
    tmp_path: Path,
) -> None:
    """The broker stops between two publishes: the publish while it is down is an outage within
    delivery_timeout, and once the broker is back on the same port the same publisher delivers
    the next message, with no failure in between."""
    broker = start_tansu(tmp_path)
    publisher = from_url(broker.url(delivery_timeout="2"))
    try:
        publisher.publish(message_for("restart", 1))
        broker.stop()
        started = time.monotonic()
        with pytest.raises(KafkaUnavailableError) as info:
            publisher.publish(message_for("restart", 2))
        assert time.monotonic() - started < 5
        broker.start()
        publisher.publish(message_for("restart", 3))
        assert numbers(broker.read("restart")) == [3]  # in-memory storage: 1 went with it
    finally:
        publisher.close()
        broker.stop()
    assert is_outage(info.value) and confirmed(info.value) == 0


@pytest.mark.parametrize(
    ("code", "outage"),
    [
        ("_MSG_TIMED_OUT", True),
        ("_TRANSPORT", True),
        ("_ALL_BROKERS_DOWN", True),
        ("_AUTHENTICATION", True),
        ("NOT_ENOUGH_REPLICAS", True),
        ("LEADER_NOT_AVAILABLE", True),
        ("PRODUCER_FENCED", True),
        ("CLUSTER_AUTHORIZATION_FAILED", True),
        ("MSG_SIZE_TOO_LARGE", False),
        ("INVALID_RECORD", False),
        ("UNKNOWN_TOPIC_OR_PART", False),
        ("TOPIC_AUTHORIZATION_FAILED", False),
        ("POLICY_VIOLATION", False),
    ],
)
def test_what_the_client_reports_decides_between_outage_and_message_failure(
    code: str, outage: bool
) -> None:
    """Errors that no other message would have escaped (timeouts, transport, missing leaders or
    replicas, a fenced producer, a cluster refusing idempotent writes) are outages; a refusal of
    the record or its topic is a message failure."""
    assert kafka_unavailable(None)  # no report at all: nothing was confirmed
    error = confluent_kafka.KafkaError(getattr(confluent_kafka.KafkaError, code))
    assert kafka_unavailable(error) is outage


# --- order under partial failure ---------------------------------------------------------------


def test_a_record_the_client_refuses_stops_the_pass_before_anything_behind_it(
    pg_engine: Engine, tansu: Tansu, make_relay: MakeRelay
) -> None:
    """Messages 1, 2, 3 of one key, 1 larger than message_max_bytes: the client refuses 1 before
    sending it, so the pass produces neither 2 nor 3. Once 1 is a dead letter and discarded, 2
    and 3 arrive, in order."""
    queue = fresh("too-large")
    tansu.create_topic(queue, partitions=3)
    inputs = [{"n": 1, "pad": "x" * 20_000}, {"n": 2}, {"n": 3}]
    big, *rest = stage_inputs(pg_engine, "send", inputs, queue=queue, ordering_key="k")
    publisher = from_url(tansu.url(message_max_bytes="10000"))
    relay = make_relay(pg_engine, publisher, max_publish_attempts=1)

    result = relay.run_pass()

    assert (result.claimed, result.published, result.failed) == (3, 0, True)
    assert tansu.read(queue) == []
    dead = row(pg_engine, big)
    assert dead.dead_at is not None and "MSG_SIZE_TOO_LARGE" in dead.last_error
    assert "nothing after it was produced" in dead.last_error
    assert_uncharged(pg_engine, rest)

    assert outbox.discard_dead(pg_engine) == 1
    assert relay.drain().published == 2
    assert numbers(tansu.read(queue)) == [2, 3]


def test_a_header_that_cannot_be_encoded_is_refused_before_the_records_behind_it(
    tansu: Tansu,
) -> None:
    """A tenant id holding a lone surrogate cannot be a UTF-8 header: the second of three
    messages is refused before it is produced, the first is flushed and confirmed
    (PublishError(published=1)), and the third is never produced."""
    topic = fresh("unencodable")
    tansu.create_topic(topic, partitions=1)
    good, bad, behind = (message_for(topic, n) for n in (1, 2, 3))
    bad = bad._replace(tenant_id="acme\ud800")
    publisher = from_url(tansu.url())
    try:
        with pytest.raises(PublishError, match="UnicodeEncodeError") as info:
            publisher.publish_batch([good, bad, behind])
    finally:
        publisher.close()
    assert confirmed(info.value) == 1 and not is_outage(info.value)
    assert "lone surrogate" in one_sentence(info.value)
    assert numbers(tansu.read(topic)) == [1]


def test_a_broker_refusal_blames_the_record_at_fault_and_keeps_the_rest_back(
    pg_engine: Engine, tansu: Tansu, make_relay: MakeRelay
) -> None:
    """The broker refuses record 3 of 6 (one key, one batch) by its schema; it refuses the whole
    batch, so the publisher sends the records again one at a time and blames 3: 1 and 2 are
    confirmed, 3 is charged, 4-6 wait behind it and are not in the partition. Once 3 is
    discarded, 4-6 follow, in order."""
    queue = fresh("schema")
    tansu.require_schema(queue, STRICT)
    tansu.create_topic(queue, partitions=3)
    inputs = [{"n": n, "ok": n != 3} for n in range(1, 7)]
    messages = stage_inputs(pg_engine, "send", inputs, queue=queue, ordering_key="k")
    relay = make_relay(pg_engine, from_url(tansu.url()), max_publish_attempts=1)

    result = relay.run_pass()

    assert (result.claimed, result.published, result.failed) == (6, 2, True)
    assert numbers(tansu.read(queue)) == [1, 2]
    refused = row(pg_engine, messages[2])
    assert refused.dead_at is not None and "INVALID_RECORD" in refused.last_error
    assert "sent on its own" in refused.last_error
    assert_uncharged(pg_engine, messages[3:])

    assert outbox.discard_dead(pg_engine) == 1
    assert relay.drain().published == 3
    assert numbers(tansu.read(queue)) == [1, 2, 4, 5, 6]


def test_finding_the_refused_record_resends_only_what_the_refusal_touched(tansu: Tansu) -> None:
    """Twelve messages over three topics, the eighth (topic b) refused by b's schema: the broker
    refuses b's whole batch, the publisher sends b's records again one at a time up to the bad
    one and reports PublishError(published=7). Records of a and c that were confirmed in order
    are not sent again: each is in its topic exactly once."""
    base = fresh("isolate")
    tansu.require_schema(f"{base}-b", STRICT)
    for name in ("a", "b", "c"):
        tansu.create_topic(f"{base}-{name}", partitions=1)
    messages = [message_for(f"{base}-{'abc'[n % 3]}", n, key=None, ok=n != 7) for n in range(12)]
    publisher = from_url(tansu.url())
    try:
        with pytest.raises(PublishError, match="sent on its own") as info:
            publisher.publish_batch(messages)
    finally:
        publisher.close()

    assert confirmed(info.value) == 7 and str(messages[7].id) in one_sentence(info.value)
    assert numbers(tansu.read(f"{base}-b")) == [1, 4]
    assert numbers(tansu.read(f"{base}-a")) == [0, 3, 6, 9]
    assert numbers(tansu.read(f"{base}-c")) == [2, 5, 8, 11]


def test_a_broker_refusal_in_a_split_batch_confirms_the_prefix_only(tansu: Tansu) -> None:
    """With every record in a batch of its own (batch.num.messages=1) the broker refuses only
    record 3; the publisher reports PublishError(published=2) naming it. Records behind it that
    were already in flight may still be written after the refusal (the measurement in
    docs/brokers/kafka.md: 4 and 5 were, each time), but only in their own order, and never 3."""
    topic = fresh("split")
    tansu.require_schema(topic, STRICT)
    tansu.create_topic(topic, partitions=1)
    messages = [message_for(topic, n, ok=n != 3) for n in range(1, 7)]
    publisher = KafkaPublisher(tansu.bootstrap, config={"batch.num.messages": 1})
    try:
        with pytest.raises(PublishError, match="INVALID_RECORD") as info:
            publisher.publish_batch(messages)
    finally:
        publisher.close()

    assert confirmed(info.value) == 2 and not is_outage(info.value)
    assert str(messages[2].id) in one_sentence(info.value)
    written = numbers(tansu.read(topic))
    assert written[:2] == [1, 2] and 3 not in written
    assert written[2:] == sorted(written[2:]) and set(written[2:]) <= {4, 5, 6}


def test_an_unknown_topic_is_a_message_failure_within_the_delivery_timeout(tansu: Tansu) -> None:
    """Where topics are not auto-created, a record for a missing topic fails as
    UNKNOWN_TOPIC_OR_PART, a message failure, before delivery_timeout turns it into a timeout
    (which would read as an outage)."""
    publisher = from_url(tansu.url(auto_create_topics="false", delivery_timeout="6"))
    topic = fresh("missing")
    started = time.monotonic()
    try:
        with pytest.raises(PublishError, match="UNKNOWN_TOPIC_OR_PART") as info:
            publisher.publish(message_for(topic, 1))
    finally:
        publisher.close()
    assert time.monotonic() - started < 6
    assert not is_outage(info.value) and confirmed(info.value) == 0
    assert f"create topic {topic!r}" in one_sentence(info.value)


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("kafka://h?lingr_ms=5", r"unknown option 'lingr_ms'; the options are topic, "),
        ("kafka://h?linger_ms=-1", r"linger_ms='-1'; use a whole number from 0"),
        ("kafka://h?compression=brotli", r"compression='brotli'; use one of none, gzip"),
        ("kafka://h?delivery_timeout=0", r"delivery_timeout must be a positive.*got 0\.0"),
        ("kafka://h?delivery_timeout=soon", r"delivery_timeout='soon'"),
        ("kafka://h?message_max_bytes=10", r"message_max_bytes='10'; use a whole number"),
        ("kafka://h?auto_create_topics=maybe", r"auto_create_topics='maybe'; use true or false"),
        ("kafka://h?topic={q}", r"braces other than \{queue\}"),
        ("kafka://h?topic=a&topic=b", r"sets option 'topic' twice"),
        ("kafka://h:port", r"port is not a number"),
        ("kafka://h:1,:2", r"broker address ':2' with no host"),
        ("kafka://h/jobs", r"has a path or fragment"),
        ("kafka://h?security_protocol=sasl_ssl", r"no credentials"),
        ("kafka://h?security_protocol=tls", r"use one of plaintext, ssl, sasl_plaintext"),
        ("kafka://h?ssl_ca_location=/ca.pem", r"TLS option, with security_protocol=plaintext"),
        ("kafka://u:pw@h?security_protocol=plaintext", r"would not send them"),
        ("kafka://u:pw@h?sasl_mechanism=GSSAPI", r"sasl_mechanism='GSSAPI'; use one of PLAIN"),
        ("kafka://u@h", r"without both a user and a password"),
        ("redis://h", r"scheme 'redis'; use kafka://host:9092"),
    ],
)
def test_from_url_rejects_a_bad_url_in_one_sentence(url: str, expected: str) -> None:
    """A malformed URL or a bad option is a PublisherError: one sentence with the value and the
    fix (unknown options list the valid ones), raised before anything connects."""
    publisher_error(from_url, url, match=expected)


def test_the_password_is_hidden_everywhere_and_options_reach_the_producer() -> None:
    """A SASL password from the URL never shows in an error, the repr or the settings; the
    options become librdkafka settings, with idempotence and acks=all fixed, and several brokers
    (default port 9092) become the bootstrap list."""
    text = publisher_error(from_url, "kafka://app:s3cret@h1?compression=brotli")
    assert "s3cret" not in text and "app:***@h1" in text

    publisher = from_url(
        "kafka://app:s3cret@h1,h2:9093?topic=jobs.{queue}&linger_ms=20&compression=zstd"
        "&sasl_mechanism=scram-sha-512&delivery_timeout=4&client_id=billing"
        "&auto_create_topics=false"
    )
    try:
        settings = publisher.client_settings
        assert "s3cret" not in repr(publisher) and "s3cret" not in repr(settings)
        assert publisher.topic_for(message_for("emails", 1)) == "jobs.emails"
        assert settings["bootstrap.servers"] == "h1:9092,h2:9093"
        assert (settings["enable.idempotence"], settings["acks"]) == (True, "all")
        assert settings["message.timeout.ms"] == 4000
        assert settings["linger.ms"] == 20 and settings["compression.type"] == "zstd"
        assert settings["security.protocol"] == "sasl_ssl"
        assert (settings["sasl.mechanism"], settings["sasl.username"]) == ("SCRAM-SHA-512", "app")
        assert settings["sasl.password"] == "***"
        assert settings["client.id"] == "billing"
        assert settings["allow.auto.create.topics"] is False
    finally:
        publisher.close()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"acks": "1"}, r"needs acks='all'"),
        ({"enable.idempotence": False}, r"needs enable.idempotence=True"),
        ({"message.timeout.ms": 300000}, r"manages itself; pass bootstrap_servers or delivery"),
        ({"no.such.setting": 1}, r"cannot be built: .*no.such.setting"),
        (
            {"security.protocol": "ssl", "ssl.ca.location": "/nonexistent/ca.pem"},
            r"cannot be built: .*ssl.ca.location",
        ),
    ],
)
def test_config_cannot_weaken_what_a_delivery_report_means(
    config: dict[str, object], expected: str
) -> None:
    """A config that would make a delivery report mean less (acks, idempotence), that overrides
    what the publisher manages, or that librdkafka rejects (an unknown setting, a CA file that
    is not there) fails at construction, not on the first message."""
    with pytest.raises(PublisherError, match=expected):
        KafkaPublisher("localhost:9092", config=config)


def test_the_cli_spec_builds_the_kafka_publisher() -> None:
    """--publisher kafka://... resolves to a KafkaPublisher through the scheme registry."""
    publisher = resolve_publisher("kafka://localhost:9092?topic=outbox.{queue}")
    assert isinstance(publisher, KafkaPublisher)
    publisher.close()


def test_a_missing_client_is_reported_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without confluent-kafka the module still imports, and from_url says which extra to
    install instead of raising ImportError."""
    done = without_client("confluent_kafka", "kafka", "kafka.from_url('kafka://localhost')")
    assert 'pip install "sqla-outbox[kafka]"' in done.stdout
    assert "confluent-kafka client" in done.stdout
    monkeypatch.setattr(kafka, "_CLIENT_INSTALLED", False)
    with pytest.raises(PublisherError, match=r'pip install "sqla-outbox\[kafka\]"'):
        KafkaPublisher()


def test_an_invalid_topic_name_names_the_topic_and_the_naming_rule(tansu: Tansu) -> None:
    """A queue whose topic is not a valid Kafka topic name is a message failure whose fix names
    the topic and Kafka's naming rule, not the record's schema."""
    publisher = from_url(tansu.url(delivery_timeout="6"))
    topic = "orders placed!"
    try:
        with pytest.raises(PublishError) as info:
            publisher.publish(message_for(topic, 1))
    finally:
        publisher.close()
    assert not is_outage(info.value)
    sentence = one_sentence(info.value)
    assert f"topic {topic!r} is not a valid Kafka topic name" in sentence, sentence
    assert "ASCII letter, digit, '.', '_' or '-'" in sentence
