"""``inbox.key_of``: the idempotency key read from each bundled broker's client objects, under
the names the publishers themselves use (their ``WIRE_FIELDS``)."""

from __future__ import annotations

import confluent_kafka
import pika
import pytest
from celery.app.task import Context
from nats.aio.msg import Msg

from sqla_outbox import inbox
from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.message import wire_name
from sqla_outbox.publishers import kafka, nats_jetstream


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
    with pytest.raises(ConfigurationError, match="no idempotency key in the Kafka header"):
        inbox.key_of(confluent_kafka.Message(topic="t", headers=[]))
    with pytest.raises(ArgumentTypeError, match="got int"):
        inbox.key_of(42)
