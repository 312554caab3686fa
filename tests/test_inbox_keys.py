"""``inbox.key_of``: the idempotency key read from each bundled broker's client objects, under
the names the publishers themselves use (their ``WIRE_FIELDS``)."""

from __future__ import annotations

import datetime as dt
import uuid

import confluent_kafka
import pika
import pytest
from celery.app.task import Context
from nats.aio.msg import Msg

from sqla_outbox import inbox
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.message import OutboxMessage, wire_name
from sqla_outbox.publishers import http_webhook, kafka, nats_jetstream, redis_streams


def test_key_of_reads_each_brokers_delivery_by_its_publishers_own_names() -> None:
    """The key under the name each publisher gives it, in each client's own message object; a
    message without one is refused naming where the key was looked for."""
    kafka_header = wire_name(kafka.WIRE_FIELDS, "idempotency_key")
    nats_header = wire_name(nats_jetstream.WIRE_FIELDS, "idempotency_key")
    deliveries = {
        "kafka": confluent_kafka.Message(topic="t", headers=[(kafka_header, b"k-kafka")]),
        "nats": Msg(_client=None, subject="s", headers={nats_header: "k-nats"}),  # type: ignore[arg-type]
        "rabbitmq": pika.BasicProperties(message_id="k-rabbitmq"),
        "celery": Context(id="k-celery"),
        "redis": {b"idempotency_key": b"k-redis"},
        "webhook": {"idempotency-key": "k-webhook"},
    }
    assert {name: inbox.key_of(message) for name, message in deliveries.items()} == {
        name: f"k-{name}" for name in deliveries
    }
    with pytest.raises(
        ConfigurationError, match=r"no idempotency key in its Kafka header .idempotency-key."
    ):
        inbox.key_of(confluent_kafka.Message(topic="t", headers=[]))
    with pytest.raises(ArgumentTypeError, match="got int"):
        inbox.key_of(42)


def test_fields_of_reads_what_each_publisher_wrote() -> None:
    """What each bundled publisher builds for a message, delivered as its broker's client hands
    it over, gives back the fields it carries under its names: the same ids, keys and tenant."""
    now = dt.datetime.now(dt.timezone.utc)
    message = OutboxMessage(
        uuid.uuid4(), "send_receipt", "emails", {"n": 1}, "order-7", 3, now, now, "acme"
    )
    deliveries = {
        "kafka": confluent_kafka.Message(topic="t", headers=kafka.record_headers(message)),
        "nats": Msg(_client=None, subject="s", headers=nats_jetstream.message_headers(message)),  # type: ignore[arg-type]
        "redis": {
            name.encode(): value.encode()
            for name, value in redis_streams.entry_fields(message).items()
        },
        "webhook": http_webhook.message_headers(message),
    }
    for broker, delivered in deliveries.items():
        fields = inbox.fields_of(delivered)
        assert fields["idempotency_key"] == "order-7", broker
        assert fields["id"] == str(message.id), broker
        assert inbox.key_of(delivered) == "order-7", broker
    assert inbox.fields_of(deliveries["kafka"])["tenant_id"] == "acme"
    assert "tenant_id" not in inbox.fields_of(deliveries["webhook"])  # in the body, not a header
