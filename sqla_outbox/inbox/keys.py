"""``key_of``: a message's idempotency key, read from what each bundled broker's client hands
a consumer.

Each broker carries the key under the name its publisher gives it, and that name is read here
from the publisher's own table of wire fields (``WIRE_FIELDS`` in each publisher module, built
by :func:`sqla_outbox.message.wire_fields`): renaming a field on the publishing side renames it
here, and a consumer cannot silently read a name nobody sends.

What each client delivers, and where the key is in it:

* Celery: the task's ``self.request`` (a ``celery.app.task.Context``): the task id, which the
  Celery publisher sets to the key;
* Redis Streams: an entry's fields (``xreadgroup``'s dict, ``str`` or ``bytes``);
* RabbitMQ (pika): the ``BasicProperties`` of a delivery: its headers, else ``message_id``;
* NATS JetStream: a ``nats.aio.msg.Msg``: its headers;
* Kafka (confluent-kafka): a ``confluent_kafka.Message``: its headers;
* an HTTP webhook: the request's headers (any mapping; looked up without regard to case).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.message import wire_name
from sqla_outbox.publishers import (
    http_webhook,
    kafka,
    nats_jetstream,
    rabbitmq,
    redis_streams,
)

__all__ = ["key_of"]

_FIELD = "idempotency_key"
_KAFKA = wire_name(kafka.WIRE_FIELDS, _FIELD)
_NATS = wire_name(nats_jetstream.WIRE_FIELDS, _FIELD)
_RABBITMQ = wire_name(rabbitmq.WIRE_FIELDS, _FIELD)
_REDIS = wire_name(redis_streams.WIRE_FIELDS, _FIELD)
_WEBHOOK = wire_name(http_webhook.WIRE_FIELDS, _FIELD)


def key_of(message: object) -> str:
    """The idempotency key of ``message`` as one of the bundled brokers' clients delivers it
    (see the module docs); ``ValueError`` naming what was looked for when it has none."""
    module = type(message).__module__
    if module.startswith("confluent_kafka"):
        found: Any = dict(message.headers() or ()).get(_KAFKA)  # type: ignore[attr-defined]
        where = f"Kafka header {_KAFKA!r}"
    elif module.startswith("nats"):
        found = (getattr(message, "headers", None) or {}).get(_NATS)
        where = f"NATS header {_NATS!r}"
    elif module.startswith("pika"):
        headers = getattr(message, "headers", None) or {}
        found = headers.get(_RABBITMQ) or getattr(message, "message_id", None)
        where = f"AMQP header {_RABBITMQ!r} or message_id"
    elif module.startswith("celery"):
        found = getattr(message, "id", None)
        where = "the Celery task id"
    elif isinstance(message, Mapping):
        found, where = _from_mapping(message)
    else:
        raise ArgumentTypeError(
            f"key_of reads a Celery task request, a Redis Streams entry's fields, pika "
            f"BasicProperties, a NATS Msg, a Kafka Message or HTTP headers, got "
            f"{type(message).__name__}."
        )
    if isinstance(found, bytes):
        found = found.decode()
    if not isinstance(found, str) or not found:
        raise ConfigurationError(
            f"the message has no idempotency key in the {where} (got {found!r}): it was not "
            "published by sqla-outbox, or through a publisher of another version."
        )
    return found


def _from_mapping(fields: Mapping[Any, Any]) -> tuple[Any, str]:
    """A Redis Streams entry's fields (by the Redis publisher's name, ``str`` or ``bytes``), or
    HTTP headers (by the webhook's header name, in any case)."""
    for name in (_REDIS, _REDIS.encode()):
        if name in fields:
            return fields[name], f"Redis Streams field {_REDIS!r}"
    wanted = _WEBHOOK.lower()
    for name, value in fields.items():
        if isinstance(name, str) and name.lower() == wanted:
            return value, f"HTTP header {_WEBHOOK!r}"
    return None, f"Redis Streams field {_REDIS!r} or HTTP header {_WEBHOOK!r}"
