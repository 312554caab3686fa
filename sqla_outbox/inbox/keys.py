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

from collections.abc import Callable, Mapping
from typing import Any

from sqla_outbox.errors import ArgumentTypeError, ConfigurationError
from sqla_outbox.message import OutboxMessage, WireField, wire_name
from sqla_outbox.publishers import (
    celery_tasks,
    http_webhook,
    kafka,
    nats_jetstream,
    rabbitmq,
    redis_streams,
)

__all__ = ["fields_of", "key_of"]

_FIELD = "idempotency_key"
_KEY = OutboxMessage._fields.index(_FIELD)

Table = tuple[WireField, ...]
Lookup = Callable[[str], Any]


def key_of(message: object) -> str:
    """The idempotency key of ``message`` as one of the bundled brokers' clients delivers it
    (see the module docs); ``ValueError`` naming where it was looked for when it has none."""
    table, lookup, where = _reader(message)
    name = wire_name(table, _FIELD)
    found = _text(lookup(name))
    if found is None and type(message).__module__.startswith("pika"):
        found = _text(getattr(message, "message_id", None))  # the key is the AMQP message id too
    if found is None and type(message).__module__.startswith("celery"):
        found = _text(getattr(message, "id", None))  # and the Celery task id
    if not found:
        raise ConfigurationError(
            f"the message has no idempotency key in its {where} {name!r}: it was not "
            "published by sqla-outbox, or through a publisher of another version."
        )
    return found


def fields_of(message: object) -> dict[str, Any]:
    """The fields the relay sent with ``message``, by :class:`~sqla_outbox.OutboxMessage` field
    name, as the broker delivered them (text from brokers whose headers hold text, bytes
    decoded), read by the names in the publisher's ``WIRE_FIELDS``, as :func:`key_of` reads the
    key. Fields the broker carries elsewhere (the body, a Kafka record's key, the Celery task
    name and arguments) are not here: they are in the message itself. Unset optional fields are
    absent, as the publisher left them out."""
    table, lookup, _where = _reader(message)
    found: dict[str, Any] = {}
    for name, position, _spell, _optional in table:
        value = lookup(name)
        if value is not None:
            found[OutboxMessage._fields[position]] = (
                _text(value) if isinstance(value, bytes) else value
            )
    return found


def _reader(message: object) -> tuple[Table, Lookup, str]:
    """The wire table of the broker whose client delivered ``message``, how to look a name up in
    it, and what that place is called (for errors)."""
    module = type(message).__module__
    if module.startswith("confluent_kafka"):
        headers = dict(message.headers() or ())  # type: ignore[attr-defined]
        return kafka.WIRE_FIELDS, headers.get, "Kafka header"
    if module.startswith("nats"):
        headers = getattr(message, "headers", None) or {}
        return nats_jetstream.WIRE_FIELDS, headers.get, "NATS header"
    if module.startswith("pika"):
        headers = getattr(message, "headers", None) or {}
        return rabbitmq.WIRE_FIELDS, headers.get, "AMQP header"
    if module.startswith("celery"):
        return celery_tasks.WIRE_FIELDS, lambda name: getattr(message, name, None), "task request's"
    if isinstance(message, Mapping):
        key = wire_name(redis_streams.WIRE_FIELDS, _FIELD)
        if key in message or key.encode() in message:
            fields = message
            return (
                redis_streams.WIRE_FIELDS,
                lambda name: fields.get(name, fields.get(name.encode())),
                "Redis Streams field",
            )
        lowered = {str(name).lower(): value for name, value in message.items()}
        return (
            http_webhook.WIRE_FIELDS,
            lambda name: lowered.get(name.lower()),
            "HTTP header",
        )
    raise ArgumentTypeError(
        "key_of and fields_of read a Celery task request, a Redis Streams entry's fields, pika "
        f"BasicProperties, a NATS Msg, a Kafka Message or HTTP headers, got "
        f"{type(message).__name__}."
    )


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) and value else None
